//! `fastpath bench`: forwarding rate of the kernel, fastpath and a raw XDP
//! redirect (the limit), measured in one run on one lab built for the purpose.
//! Method and reasoning: bench/README.md. A benchmark prints; it never passes
//! or fails on a number — but it does fail when fastpath did not actually
//! forward the traffic, because then its figure would be the kernel's.

pub mod fulltable;
mod report;
mod router;
mod tablesync;
mod topo;
mod traffic;

use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use report::{Cell, Rep, Report, Target};
use router::{Daemon, FpStats, Mode, RawFwd, Verdicts};
use topo::Topology;
use traffic::{Generator, Placement, Sink};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    /// Demo run: 64 B, 1 flow, 2 repetitions of 1 s per mode (overrides the options below).
    #[arg(long)]
    pub quick: bool,
    /// Repetitions per mode, size and flow count; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Seconds per repetition.
    #[arg(long, default_value_t = 1.5)]
    pub duration: f64,
    /// Ethernet frame sizes in bytes, FCS included (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![64usize, 512])]
    pub sizes: Vec<usize>,
    /// Numbers of flows (distinct UDP source ports), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 10000])]
    pub flows: Vec<u32>,
    /// Modes to measure; the kernel is the reference for the ratios.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Mode::Kernel, Mode::Fastpath, Mode::Raw])]
    pub modes: Vec<Mode>,
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
    #[arg(long, hide = true)]
    pub fastpath_bin: Option<PathBuf>,
}

/// Benchmarks other than forwarding rate.
#[derive(Debug, clap::Subcommand)]
pub enum BenchWhat {
    /// Full routing table: mirror time, map memory per route, single-change latency.
    Fulltable(tablesync::FulltableArgs),
}

struct Plan {
    reps: usize,
    duration: Duration,
    warmup: Duration,
    sizes: Vec<usize>,
    flows: Vec<u32>,
    modes: Vec<Mode>,
    place: Placement,
}

impl Plan {
    fn from_args(a: &BenchArgs) -> Result<Self> {
        let mut p = Plan {
            reps: a.reps,
            duration: Duration::try_from_secs_f64(a.duration).context("--duration")?,
            warmup: Duration::from_millis(300),
            sizes: a.sizes.clone(),
            flows: a.flows.clone(),
            modes: a.modes.clone(),
            place: Placement::check(a.cpu, !a.no_rt)?,
        };
        if a.quick {
            p.reps = 2;
            p.duration = Duration::from_secs(1);
            p.warmup = Duration::from_millis(200);
            p.sizes = vec![64];
            p.flows = vec![1];
        }
        p.modes.sort();
        p.modes.dedup();
        if p.reps == 0 || p.duration.is_zero() || p.sizes.is_empty() || p.flows.is_empty() || p.modes.is_empty() {
            bail!("nothing to measure: --reps, --duration, --sizes, --flows and --modes must be non-empty");
        }
        for &s in &p.sizes {
            traffic::frame(s)?;
        }
        Ok(p)
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    if let Some(BenchWhat::Fulltable(ft)) = &args.what {
        if let Some(path) = &ft.emit {
            return tablesync::emit(ft, path);
        }
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("fastpath bench needs root (network namespaces, XDP, BPF_PROG_RUN)");
    }
    if let Some(BenchWhat::Fulltable(ft)) = &args.what {
        let stop = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
        }
        let exe = match &args.fastpath_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe().context("locating the fastpath binary")?,
        };
        let work = WorkDir::create()?;
        return tablesync::run(ft, &exe, work.path(), &stop);
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

    println!(
        "fastpath bench: modes {}, sizes {:?} B, flows {:?}, {} x {:.1} s each, all on CPU {}{}",
        plan.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(","),
        plan.sizes,
        plan.flows,
        plan.reps,
        plan.duration.as_secs_f64(),
        plan.place.cpu,
        if plan.place.fifo { " (SCHED_FIFO)" } else { "" }
    );

    let topo = Topology::create()?;
    let mut sink_obj = MaybeUninit::uninit();
    let sink = Sink::attach(&mut sink_obj, &topo)?;
    let bench = Bench {
        plan: &plan,
        topo: &topo,
        sink: &sink,
        stop: &stop,
        g0: topo.ifindex(&topo.gen, topo::G0)?,
    };

    let mut cells = Vec::new();
    let mut fp_verdicts: Option<Verdicts> = None;
    for &mode in &plan.modes {
        println!("-- {}", mode.name());
        match mode {
            Mode::Kernel => bench.measure_mode(mode, &mut cells, None)?,
            Mode::Raw => {
                let mut obj = MaybeUninit::uninit();
                let _raw = RawFwd::attach(&mut obj, &topo)?;
                bench.measure_mode(mode, &mut cells, None)?;
            }
            Mode::Fastpath => {
                let mut daemon = Daemon::spawn(&topo, &exe, work.path())?;
                daemon.wait_ready(Duration::from_secs(20), &stop)?;
                let stats = bench.wait_fast_path(&daemon)?;
                let before = stats.read()?;
                bench.measure_mode(mode, &mut cells, Some(&stats))?;
                let v = router::verdicts(&before, &stats.read()?);
                daemon.stop()?;
                fp_verdicts = Some(v);
            }
        }
    }
    drop(sink);
    drop(topo);

    report::add_ratios(&mut cells);
    report::print_table(&cells);
    let fast_ok = match &fp_verdicts {
        Some(v) => {
            println!("fastpath counters over its runs: {}", v.summary());
            v.mostly_forwarded()
        }
        None => true,
    };

    let rep = Report {
        bench: "forward",
        unix_time: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        kernel_release: report::kernel_release(),
        method: report::METHOD,
        cpu: plan.place.cpu,
        sched_fifo: plan.place.fifo,
        reps: plan.reps,
        duration_s: plan.duration.as_secs_f64(),
        results: &cells,
        fastpath_verdicts: fp_verdicts.as_ref(),
        target: Target {
            mode: "fastpath",
            size: report::TARGET_SIZE,
            min_ratio_to_kernel: report::TARGET_RATIO,
        },
    };
    let json = report::write_json(&rep, &args.out)?;
    println!("wrote {}", json.display());
    if !fast_ok {
        bail!("fastpath punted the bench traffic instead of forwarding it: its numbers are the kernel's, not fastpath's (see counters above)");
    }
    if let Some(png) = report::plot(&repo_root(), &json) {
        println!("wrote {}", png.display());
    }
    Ok(())
}

struct Bench<'a> {
    plan: &'a Plan,
    topo: &'a Topology,
    sink: &'a Sink<'a>,
    stop: &'a AtomicBool,
    g0: u32,
}

impl Bench<'_> {
    fn check_stop(&self) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    fn measure_mode(&self, mode: Mode, cells: &mut Vec<Cell>, fp: Option<&FpStats>) -> Result<()> {
        for &size in &self.plan.sizes {
            for &flows in &self.plan.flows {
                let before = fp.map(|s| s.read()).transpose()?;
                let mut cell = self.measure(mode, size, flows)?;
                if let (Some(stats), Some(before)) = (fp, before) {
                    cell.fastpath_verdicts = Some(router::verdicts(&before, &stats.read()?));
                }
                println!(
                    "   {:>4} B {:>6} flows: {} Mpps",
                    size,
                    flows,
                    cell.reps
                        .iter()
                        .map(|r| format!("{:.3} ({:.0}% cpu)", r.mpps, r.cpu_share * 100.0))
                        .collect::<Vec<_>>()
                        .join("  ")
                );
                if let Some(v) = &cell.fastpath_verdicts {
                    println!("   {:>4} B {:>6} flows: fastpath {}", size, flows, v.summary());
                }
                cells.push(cell);
            }
        }
        Ok(())
    }

    fn measure(&self, mode: Mode, size: usize, flows: u32) -> Result<Cell> {
        let mut obj = MaybeUninit::uninit();
        let gen = Generator::load(&mut obj, self.topo, size, flows)?;
        let (gen_ns, cpu) = (self.topo.gen.as_str(), self.plan.place);
        // Warm caches, the page pool and (for fastpath) its flow state first.
        gen.run(gen_ns, self.g0, cpu, self.plan.warmup, self.stop)?;
        let mut reps = Vec::new();
        for _ in 0..self.plan.reps {
            self.check_stop()?;
            self.sink.zero()?;
            let run = gen.run(gen_ns, self.g0, cpu, self.plan.duration, self.stop)?;
            // Frames still in the veth rings are processed on the same CPU
            // right after the generator's last batch; a short pause covers it.
            std::thread::sleep(Duration::from_millis(20));
            let (pkts, _) = self.sink.read()?;
            self.check_stop()?;
            let secs = run.elapsed.as_secs_f64();
            if pkts == 0 {
                bail!(
                    "{} mode, {size} B, {flows} flows: nothing reached the sink (generator sent {})",
                    mode.name(),
                    run.sent
                );
            }
            let cpu = run.cpu_time.as_secs_f64().max(1e-9);
            reps.push(Rep {
                mpps: pkts as f64 / secs / 1e6,
                offered_mpps: run.sent as f64 / secs / 1e6,
                mpps_per_cpu_s: pkts as f64 / cpu / 1e6,
                cpu_share: cpu / secs,
            });
        }
        Ok(Cell::new(mode, size, flows, reps))
    }

    /// After `status` answers, the daemon may still be filling its tables;
    /// wait until a short burst is really forwarded by XDP, so no repetition
    /// measures a half-programmed router. Gives up loudly with the reasons.
    fn wait_fast_path(&self, daemon: &Daemon) -> Result<FpStats> {
        let start = Instant::now();
        let mut obj = MaybeUninit::uninit();
        let gen = Generator::load(&mut obj, self.topo, self.plan.sizes[0], 1)?;
        let mut last = String::from("no XDP program on r0 yet");
        while start.elapsed() < Duration::from_secs(15) {
            self.check_stop()?;
            match FpStats::find(self.topo) {
                Ok(stats) => {
                    let before = stats.read()?;
                    gen.run(
                        &self.topo.gen,
                        self.g0,
                        self.plan.place,
                        Duration::from_millis(50),
                        self.stop,
                    )?;
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
