//! `fastpath bench`: forwarding rate of the kernel, a bpf_fib_lookup XDP
//! forwarder (the reference), fastpath with and without its flow cache and
//! with NIC-style hints, and a raw XDP redirect (the limit), measured in one
//! run on one lab built for the purpose; then the ns per packet of parsing
//! vs hints vs no work (`fastpath bench hints` alone).
//! Method and reasoning: bench/README.md. A benchmark prints; it never passes
//! or fails on a number — but it does fail when fastpath did not actually
//! forward the traffic, because then its figure would be the kernel's, and
//! when the hint mode's hints did not reach fastpath.

mod afxdp_tx;
mod crr;
mod ct_ab;
mod ct_ref;
mod ctlab;
pub mod dns;
pub mod dns_records;
mod dns_wire;
mod ecmp_changes;
mod fpm_client;
mod fpm_table;
pub mod fulltable;
mod fullrate;
mod hints;
mod points;
mod report;
mod rounds;
mod router;
mod stateful;
mod stateful_crr;
mod table1;
mod table1_frr;
mod table1_watch;
mod failover;
mod tablesync;
mod topo;
mod traffic;
mod wire;

use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use report::{Rep, Report, Target};
use router::{Daemon, FpStats, Mode, Verdicts};
use topo::Topology;
use traffic::{Generator, Placement, Sink};

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// Demo run: 64 B, 1 flow, 2 repetitions of 1 s per mode (overrides the options below).
    #[arg(long)]
    pub quick: bool,
    /// Repetitions per mode, size and flow count; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Seconds per repetition.
    #[arg(long, default_value_t = 1.5)]
    pub duration: f64,
    /// IP version of the traffic: 4, or 6 (the router routes IPv6 between the same hosts).
    #[arg(long, value_enum, default_value_t = topo::Family::V4)]
    pub family: topo::Family,
    /// Ethernet frame sizes in bytes, FCS included (comma-separated; 1518 works too). Default: 64,512 for IPv4,
    /// 84,532 for IPv6 (the same UDP payload: an IPv6 header is 20 B longer; 66 B is the least it fits in).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Numbers of flows (UDP port pairs; see bench/README.md), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 10_000, 1_000_000])]
    pub flows: Vec<u32>,
    /// Modes to measure; ratios are taken to kernel, raw and fib-fwd when measured. Default:
    /// kernel,fib-fwd,fastpath-nocache,fastpath,fastpath-hint,raw, fastpath-hint left out (and said so)
    /// where the kernel refuses bpf_xdp_adjust_meta to XDP programs, which its generator needs.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Option<Vec<Mode>>,
    /// Flow-cache capacity per CPU for the fastpath modes (`fastpath run --flow-entries`; default: the daemon's).
    #[arg(long, value_name = "N")]
    pub flow_entries: Option<u32>,
    /// One more option for the fastpath modes' daemons (`fastpath run`), repeatable:
    /// `--daemon-arg=--fib4-index --daemon-arg=dir24` compares a setting with the default in one
    /// run of each build. Recorded in forward.json.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub daemon_arg: Vec<String>,
    /// Skip the XDP1 / XDP_HINTS / XDP3 ns-per-packet section.
    #[arg(long)]
    pub no_hints: bool,
    /// Directory for forward.json and forward.png.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// The one CPU that generator, router and sink share.
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
    /// Run the generator with normal scheduling instead of SCHED_FIFO (see bench/README.md).
    #[arg(long)]
    pub no_rt: bool,
    /// fastpath binary to run in the router namespace (default: this one).
    #[arg(long, hide = true, global = true)]
    pub fastpath_bin: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum BenchCmd {
    /// Full routing table: mirror time, map memory per route, single-change latency.
    Fulltable(tablesync::FulltableArgs),
    /// Full routing table delivered over FPM (zebra's dplane_fpm_nl): load, status replies, single-change latency, churn CPU, replay.
    Fpm(fpm_table::FpmArgs),
    /// Forwarding rate with a full routing table vs one route, flows to random destinations in it.
    Fullrate(fullrate::FullrateArgs),
    /// ns per packet of parse+hash (XDP1) vs hint (XDP_HINTS) vs no work (XDP3), by BPF_PROG_RUN.
    Hints(HintsArgs),
    /// Stateful firewall: kernel + conntrack ruleset vs conntrack-lookup XDP vs fastpath --mode stateful vs raw; TCP connections/s.
    Stateful(stateful::StatefulArgs),
    /// Execution-point study (paper 003): drop, N checksums, map updates and CPU split at native XDP, generic XDP, TC, AF_XDP.
    Points(points::PointsArgs),
    /// DNS responders at XDP (native, generic) vs a UDP socket server: answers/s and response time (issue #6 c, d).
    Dns(dns::DnsArgs),
    /// Run one DNS responder in this network namespace until SIGTERM (for tests and demos).
    DnsServe(dns::DnsServeArgs),
    /// Paper 000's Table 1: 10k routes (ip -batch, BGP) under each reservation model, BPF maps vs simulated ASIC: control latency, data-plane outage.
    Table1(table1::Table1Args),
}

#[derive(Debug, clap::Args)]
pub struct HintsArgs {
    /// Runs per BPF_PROG_RUN call.
    #[arg(long, default_value_t = HINTS_REPEAT)]
    pub repeat: u32,
    /// Calls per program; the median is reported.
    #[arg(long, default_value_t = HINTS_REPS)]
    pub reps: usize,
    /// Directory for hints.json.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// The CPU to run on.
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
    /// Normal scheduling instead of SCHED_FIFO.
    #[arg(long)]
    pub no_rt: bool,
}

/// ~0.15 s per call at a few tens of ns per run; calls interleave the three
/// programs, so 9 of each take ~5 s in all.
const HINTS_REPEAT: u32 = 5_000_000;
const HINTS_REPS: usize = 9;

struct Plan {
    reps: usize,
    duration: Duration,
    warmup: Duration,
    sizes: Vec<usize>,
    flows: Vec<u32>,
    modes: Vec<Mode>,
    flow_entries: Option<u32>,
    /// `--daemon-arg`s, after the mode's own options.
    daemon_args: Vec<String>,
    hints: bool,
    place: Placement,
}

/// The frame sizes `fastpath bench` measures by default: 64 and 512 B for
/// IPv4, and for IPv6 the frames with the same UDP payload.
fn default_sizes(family: topo::Family) -> Vec<usize> {
    let grow = family_overhead(family);
    vec![64 + grow, 512 + grow]
}

/// How much longer `family`'s headers are than IPv4's.
fn family_overhead(family: topo::Family) -> usize {
    match family {
        topo::Family::V4 => 0,
        topo::Family::V6 => 20,
    }
}

impl Plan {
    fn from_args(a: &BenchArgs) -> Result<Self> {
        let hint_ok = traffic::hint_supported()?;
        let mut p = Plan {
            reps: a.reps,
            duration: Duration::try_from_secs_f64(a.duration).context("--duration")?,
            warmup: Duration::from_millis(300),
            sizes: a.sizes.clone().unwrap_or_else(|| default_sizes(a.family)),
            flows: a.flows.clone(),
            modes: match &a.modes {
                Some(m) => m.clone(),
                None => default_modes(hint_ok),
            },
            flow_entries: a.flow_entries,
            daemon_args: a.daemon_arg.clone(),
            hints: !a.no_hints,
            place: Placement::check(a.cpu, !a.no_rt)?,
        };
        if a.quick {
            p.reps = 2;
            p.duration = Duration::from_secs(1);
            p.warmup = Duration::from_millis(200);
            p.sizes = vec![report::TARGET_SIZE + family_overhead(a.family)];
            p.flows = vec![1];
        }
        p.modes.sort();
        p.modes.dedup();
        if p.modes.contains(&Mode::FastpathHint) && !hint_ok {
            bail!("{}", HINT_REFUSED);
        }
        if p.reps == 0 || p.duration.is_zero() || p.sizes.is_empty() || p.flows.is_empty() || p.modes.is_empty() {
            bail!("nothing to measure: --reps, --duration, --sizes, --flows and --modes must be non-empty");
        }
        for &s in &p.sizes {
            traffic::frame_for(s, a.family)?;
        }
        if a.family == topo::Family::V6 && p.modes.iter().any(|m| m.afxdp()) {
            bail!("--family 6: the AF_XDP modes are measured with IPv4 traffic only");
        }
        if let Some(&f) = p.flows.iter().find(|&&f| f == 0 || f > traffic::MAX_FLOWS) {
            bail!("--flows {f}: must be 1..={}", traffic::MAX_FLOWS);
        }
        Ok(p)
    }
}

/// How many times one `measure_reps` call (one repetition, in the rounds)
/// measures again, at most, because the loop did not keep its frames on the
/// bench CPU. On 2026-12-07 the first kernel
/// repetition of a run went round the other CPU (all 192 frames, bench CPU
/// idle) in about half the runs, later ones never; why is not known (a
/// veth's NAPI polled there when the frames arrived would take the loop
/// with it, as every hop schedules the next on the CPU it runs on).
const LOOP_RETRIES: usize = 3;

/// What the full-table benches share: a stop flag set by SIGINT/SIGTERM,
/// the fastpath binary to run, and a scratch directory.
fn table_bench_setup(args: &BenchArgs) -> Result<(Arc<AtomicBool>, PathBuf, WorkDir)> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    let exe = match &args.fastpath_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the fastpath binary")?,
    };
    Ok((stop, exe, WorkDir::create()?))
}

/// Why `fastpath-hint` cannot run here: the generator's frames go round a
/// loop of XDP programs (traffic.rs), and the one that gives them their
/// hint needs bpf_xdp_adjust_meta, which some kernels refuse.
pub const HINT_REFUSED: &str = "--modes fastpath-hint: the generator cannot give frames an XDP metadata hint on this \
     kernel (it refuses bpf_xdp_adjust_meta to XDP programs); `fastpath bench hints` measures the hint path by \
     BPF_PROG_RUN instead";

/// The forward bench's modes when --modes is not given: all but the AF_XDP
/// ones, fastpath-hint only where the kernel lets its generator work.
fn default_modes(hint_supported: bool) -> Vec<Mode> {
    let mut m = vec![Mode::Kernel, Mode::FibFwd, Mode::FastpathNocache, Mode::Fastpath, Mode::Raw];
    if hint_supported {
        m.insert(4, Mode::FastpathHint);
    } else {
        println!("fastpath-hint left out: {}", HINT_REFUSED.trim_start_matches("--modes fastpath-hint: "));
    }
    m
}

pub fn run(args: BenchArgs) -> Result<()> {
    if let Some(BenchCmd::Fulltable(ft)) = &args.cmd {
        if let Some(path) = &ft.emit {
            return tablesync::emit(ft, path);
        }
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("fastpath bench needs root (network namespaces, XDP, BPF_PROG_RUN)");
    }
    if let Some(BenchCmd::Fulltable(ft)) = &args.cmd {
        let (stop, exe, work) = table_bench_setup(&args)?;
        return tablesync::run(ft, &exe, work.path(), &stop);
    }
    if let Some(BenchCmd::Fpm(f)) = &args.cmd {
        let (stop, exe, work) = table_bench_setup(&args)?;
        return fpm_table::run(f, &exe, work.path(), &stop);
    }
    if let Some(BenchCmd::Fullrate(fr)) = &args.cmd {
        let (stop, exe, work) = table_bench_setup(&args)?;
        return fullrate::run(fr, &exe, work.path(), &stop);
    }
    if let Some(BenchCmd::Stateful(st)) = &args.cmd {
        let (stop, exe, work) = table_bench_setup(&args)?;
        return stateful::run(st, &exe, work.path(), &stop);
    }
    if let Some(BenchCmd::Table1(t)) = &args.cmd {
        let (stop, exe, work) = table_bench_setup(&args)?;
        return table1::run(t, &exe, work.path(), &stop);
    }
    if let Some(BenchCmd::Points(p)) = &args.cmd {
        return points::run(p);
    }
    if let Some(BenchCmd::Dns(d)) = &args.cmd {
        return dns::run(d);
    }
    if let Some(BenchCmd::DnsServe(d)) = &args.cmd {
        return dns::serve(d);
    }
    if let Some(BenchCmd::Hints(h)) = &args.cmd {
        let place = Placement::check(h.cpu, !h.no_rt)?;
        return hints::run(place, h.repeat, h.reps, &h.out);
    }
    let plan = Plan::from_args(&args)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    let exe = match &args.fastpath_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the fastpath binary")?,
    };
    let work = WorkDir::create()?;

    let family = args.family;
    let target_size = report::TARGET_SIZE + family_overhead(family);
    println!(
        "fastpath bench: {} traffic, modes {}, sizes {:?} B, flows {:?}, {} x {:.1} s each, all on CPU {}{}",
        family.name(),
        plan.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(","),
        plan.sizes,
        plan.flows,
        plan.reps,
        plan.duration.as_secs_f64(),
        plan.place.cpu,
        if plan.place.fifo { " (SCHED_FIFO)" } else { "" }
    );
    if !plan.daemon_args.is_empty() {
        println!("fastpath daemons run with: {}", plan.daemon_args.join(" "));
    }

    let topo = Topology::create_for(family)?;
    let mut sink_obj = MaybeUninit::uninit();
    let sink = Sink::attach(&mut sink_obj, &topo)?;
    let bench = Bench {
        plan: &plan,
        topo: &topo,
        sink: &sink,
        stop: &stop,
        dsts: None,
    };

    let (mut cells, fp_verdicts) = rounds::forward(&bench, &exe, work.path())?;
    drop(sink);
    drop(topo);

    let hints = if plan.hints && family == topo::Family::V6 {
        println!("-- hints (BPF_PROG_RUN): left out, its programs parse IPv4 (run it without --family 6)");
        None
    } else if plan.hints {
        println!("-- hints (BPF_PROG_RUN)");
        Some(hints::measure(plan.place, HINTS_REPEAT, HINTS_REPS)?)
    } else {
        None
    };

    report::add_ratios(&mut cells);
    report::add_paired_ratios(&mut cells, [Mode::Kernel, Mode::Raw, Mode::FibFwd]);
    report::print_table(&cells, target_size);
    let mut problems = Vec::new();
    for (mode, v) in &fp_verdicts {
        println!("{mode} counters over its runs: {}", v.summary());
        problems.extend(fastpath_problems(mode, v));
    }
    if let Some(h) = &hints {
        hints::print_table(h);
    }

    let rep = Report {
        bench: "forward",
        family,
        unix_time: report::unix_time(),
        kernel_release: report::kernel_release(),
        method: report::METHOD,
        cpu: plan.place.cpu,
        sched_fifo: plan.place.fifo,
        reps: plan.reps,
        duration_s: plan.duration.as_secs_f64(),
        results: &cells,
        fastpath_verdicts: fp_verdicts,
        hints: hints.as_ref(),
        flow_entries: plan.flow_entries,
        daemon_args: &plan.daemon_args,
        target: Target {
            modes: [Mode::Fastpath.name(), Mode::FastpathHint.name()],
            size: target_size,
            min_ratio_to_kernel: report::TARGET_RATIO,
            min_share_of_raw: report::TARGET_SHARE_OF_RAW,
            min_ratio_to_reference: report::TARGET_RATIO_TO_REFERENCE,
            max_hint_to_parse: hints::TARGET_HINT_TO_PARSE,
        },
    };
    let json = report::write_json(&rep, &args.out)?;
    println!("wrote {}", json.display());
    if !problems.is_empty() {
        bail!(
            "the fastpath figures do not measure what their mode names: {}",
            problems.join("; ")
        );
    }
    if let Some(png) = report::plot(&repo_root(), &json) {
        println!("wrote {}", png.display());
    }
    Ok(())
}

/// Why a fastpath mode's figures would not be what the mode claims: traffic
/// punted (the kernel's figure), hints not taken in the hint mode (or taken
/// in another), a cache in use in the cache-off mode.
fn fastpath_problems(mode: &str, v: &Verdicts) -> Vec<String> {
    let mut p = Vec::new();
    if !v.mostly_forwarded() {
        p.push(format!("{mode}: fastpath punted the traffic instead of forwarding it"));
    }
    let lookups = v.cache_hits + v.cache_misses;
    if mode == Mode::FastpathHint.name() && v.meta_share() < 0.99 {
        p.push(format!(
            "{mode}: only {:.1}% of flow hashes came from the metadata hint",
            v.meta_share() * 100.0
        ));
    }
    if mode != Mode::FastpathHint.name() && v.hash_meta > 0 {
        p.push(format!("{mode}: {} hashes came from a metadata hint that should have been ignored", v.hash_meta));
    }
    if mode == Mode::FastpathNocache.name() && lookups > 0 {
        p.push(format!("{mode}: the flow cache was used ({lookups} lookups)"));
    }
    if mode != Mode::FastpathNocache.name() && lookups == 0 {
        p.push(format!("{mode}: the flow cache was never looked up"));
    }
    p
}

struct Bench<'a> {
    plan: &'a Plan,
    topo: &'a Topology,
    sink: &'a Sink<'a>,
    stop: &'a AtomicBool,
    /// Flow i goes to dsts[i] (`fastpath bench fullrate`); otherwise every
    /// flow goes to the sink's address and `plan.flows` says how many.
    dsts: Option<traffic::Dsts<'a>>,
}

impl Bench<'_> {
    fn check_stop(&self) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    fn generator<'o>(
        &self,
        obj: &'o mut MaybeUninit<libbpf_rs::OpenObject>,
        size: usize,
        flows: u32,
        mode: Mode,
    ) -> Result<Generator<'o>> {
        match self.dsts {
            Some(d) => Generator::load_dsts(obj, self.topo, size, d, mode.hint()),
            None => Generator::load(obj, self.topo, size, flows, mode.hint()),
        }
    }

    /// `n` repetitions of one cell after its warm-up. The AF_XDP modes'
    /// forwarder thread runs on the other CPU and the loop goes round with
    /// it (each hop runs on the CPU that sent to it): their frames and CPU
    /// time are every CPU's.
    fn measure_reps(&self, mode: Mode, size: usize, flows: u32, n: usize) -> Result<Vec<Rep>> {
        if mode == Mode::AfxdpTx {
            return afxdp_tx::measure_reps(self, size, flows, n);
        }
        let mut obj = MaybeUninit::uninit();
        let gen = self.generator(&mut obj, size, flows, mode)?;
        let cpu = self.plan.place;
        // Warm caches, the page pool and (for fastpath) its flow state first.
        gen.run(cpu, self.plan.warmup, self.stop)?;
        let mut reps = Vec::new();
        let mut retries = 0;
        while reps.len() < n {
            self.check_stop()?;
            self.sink.zero()?;
            let run = gen.run(cpu, self.plan.duration, self.stop)?;
            // Frames still in the veth rings are processed on the same CPU
            // right after the generator's last batch; a short pause covers it.
            std::thread::sleep(Duration::from_millis(20));
            let (pkts, _) = self.sink.read()?;
            self.check_stop()?;
            if pkts == 0 {
                bail!(
                    "{} mode, {size} B, {flows} flows: nothing reached the sink (generator sent {})",
                    mode.name(),
                    run.sent
                );
            }
            let mut rep = if mode.afxdp() {
                Rep::measured(pkts, run.sent_all, run.elapsed, run.busy_all)
            } else {
                Rep::measured(pkts, run.sent, run.elapsed, run.cpu_time)
            };
            rep.lost_frames = run.lost;
            rep.strayed_frames = run.strayed;
            if rep.loop_trouble(mode) > 0 {
                // Not the measurement the method names: run it again, a few
                // times at most (a mode that loses frames every time keeps
                // its note, and the table's summary line names it).
                let again = retries < LOOP_RETRIES;
                println!(
                    "   note: {} mode, {size} B, {flows} flows: {}; this repetition did not measure one CPU's loop{}",
                    mode.name(),
                    run.missing(cpu.cpu),
                    if again { ": measuring it again" } else { " (kept: no retries left)" }
                );
                if again {
                    retries += 1;
                    continue;
                }
            }
            reps.push(rep);
        }
        Ok(reps)
    }

    /// After `status` answers, the daemon may still be filling its tables;
    /// wait until a short burst is really forwarded by XDP, so no repetition
    /// measures a half-programmed router. Gives up loudly with the reasons.
    fn wait_fast_path(&self, daemon: &Daemon, mode: Mode) -> Result<FpStats> {
        let start = Instant::now();
        let mut obj = MaybeUninit::uninit();
        let gen = self.generator(&mut obj, self.plan.sizes[0], 1, mode)?;
        let mut last = String::from("no XDP program on r0 yet");
        while start.elapsed() < Duration::from_secs(15) {
            self.check_stop()?;
            match FpStats::find(self.topo) {
                Ok(stats) => {
                    let before = stats.read()?;
                    gen.run(self.plan.place, Duration::from_millis(50), self.stop)?;
                    let v = router::verdicts(&before, &stats.read()?);
                    if v.mostly_forwarded() {
                        return Ok(stats);
                    }
                    last = v.summary();
                }
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "fastpath never forwarded the bench traffic ({last}); `fastpath status`:\n{}\ndaemon log:\n{}",
            daemon.status_text(),
            daemon.log_tail()
        )
    }
}

/// The repository (for bench/plot.py and .venv): the working directory when
/// run as `make bench`, else where this binary was built from.
fn repo_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    if cwd.join("bench/plot.py").exists() {
        return cwd;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Private scratch directory (daemon socket and log), removed on drop.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> Result<Self> {
        // mkdtemp: a fresh 0700 directory with an unpredictable name, so no
        // other user can plant a symlink where root writes the daemon's log.
        let template = std::env::temp_dir().join("fpbench-XXXXXX");
        let p = nix::unistd::mkdtemp(&template).with_context(|| format!("creating {}", template.display()))?;
        Ok(WorkDir(p))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// For the bench modules' BPF_PROG_RUN tests, which need root: false (the
/// test then returns early) without it, except in CI, where a skip fails.
#[cfg(test)]
pub(crate) fn test_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{test}: needs root; CI=true makes a skip a failure");
    eprintln!("{test}: skipped, needs root");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without --modes: every forward mode but the AF_XDP ones, fastpath-hint only where its
    /// generator can work, in the order the table prints them.
    #[test]
    fn default_modes_leave_out_only_a_hint_mode_the_kernel_cannot_run() {
        let with = default_modes(true);
        assert_eq!(
            with,
            vec![Mode::Kernel, Mode::FibFwd, Mode::FastpathNocache, Mode::Fastpath, Mode::FastpathHint, Mode::Raw]
        );
        let without = default_modes(false);
        assert_eq!(without, with.into_iter().filter(|&m| m != Mode::FastpathHint).collect::<Vec<_>>());
    }
}
