//! `fastpath bench stateful`: a firewalling router (issue #4). In one run on
//! one lab, with the same nftables forward ruleset loaded throughout:
//! Linux forwarding through conntrack (`kernel-ct`), a reference XDP
//! forwarder that asks conntrack on every packet (`ct-ref`, the paper's
//! design), `fastpath run --mode stateful` (`fastpath-stateful`) and the raw
//! redirect (`raw`, the limit); 64 B, 1 and 10k established flows, the
//! modes interleaved in rounds (rounds.rs); then short TCP connections per
//! second through each stateful router, interleaved too (stateful_crr.rs).
//!
//! Before every mode's turn the generator's flows are checked (and if needed made)
//! to be established, assured and marked in the router's conntrack, so each
//! mode forwards the same established traffic; each XDP mode's own counters
//! must show it forwarded the traffic itself, or the bench fails.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::crr::CrrRep;
use super::ct_ab::Variant;
use super::ct_ref::{self, CtFwd, CtVerdicts};
use super::ctlab;
use super::report::{self, pct, ratio, Cell};
use super::router::{Daemon, FpStats, Mode, RawFwd, Verdicts};
use super::topo::{self, Topology};
use super::traffic::{self, Placement, Sink};
use super::{repo_root, rounds, stateful_crr, Bench, Plan};

/// Issue #4: fastpath stateful >= 4.5x kernel with conntrack at 64 B (reported, never asserted).
const TARGET_RATIO: f64 = 4.5;
/// Loading the stateful program (the verifier) takes half a minute on a
/// busy shared machine.
pub(super) const DAEMON_READY: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum StMode {
    KernelCt,
    CtRef,
    FastpathStateful,
    Raw,
}

impl StMode {
    pub(super) fn mode(self) -> Mode {
        match self {
            StMode::KernelCt => Mode::KernelCt,
            StMode::CtRef => Mode::CtRef,
            StMode::FastpathStateful => Mode::FastpathStateful,
            StMode::Raw => Mode::Raw,
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct StatefulArgs {
    /// Modes to measure; ratios are taken to kernel-ct, raw and ct-ref when measured.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![
        StMode::KernelCt, StMode::CtRef, StMode::FastpathStateful, StMode::Raw,
    ])]
    pub modes: Vec<StMode>,
    /// Numbers of established flows (UDP source ports), comma-separated, at most 32768.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 10_000])]
    pub flows: Vec<u32>,
    /// IP version of the generator's flows: 4, or 6 (an IPv6 lab; no --snat, and the TCP connection part, IPv4's, is left out).
    #[arg(long, value_enum, default_value_t = super::topo::Family::V4)]
    pub family: super::topo::Family,
    /// Ethernet frame sizes in bytes, FCS included. Default: 64 for IPv4, 84 for IPv6 (the same UDP payload).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Repetitions per mode, size and flow count; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Seconds per repetition.
    #[arg(long, default_value_t = 1.5)]
    pub duration: f64,
    /// The fast-path ct mark bit(s) of the original direction: the ruleset sets them, ct-ref and fastpath require them.
    #[arg(long, value_name = "MASK", default_value_t = fastpath_bpf::intf::FP_DEFAULT_CT_MARK,
          value_parser = crate::parse_u32_mask)]
    pub ct_mark: u32,
    /// The reply direction's bit(s), set by the ruleset for replies and required of them by fastpath.
    #[arg(long, value_name = "MASK", default_value_t = fastpath_bpf::intf::FP_DEFAULT_CT_MARK_REPLY,
          value_parser = crate::parse_u32_mask)]
    pub ct_mark_reply: u32,
    /// Keep conntrack's strict TCP window tracking in the router (default: nf_conntrack_tcp_be_liberal=1, see bench/README.md).
    #[arg(long)]
    pub strict_tcp: bool,
    /// Source-NAT everything leaving by r1 to the router's address there
    /// (the generator's flows and the TCP clients), as a masquerading
    /// router does; ct-ref, which does not translate, is left out.
    #[arg(long)]
    pub snat: bool,
    /// Skip the TCP connections-per-second part.
    #[arg(long)]
    pub no_crr: bool,
    /// Repetitions of the connection-rate part per mode (rounds). Nine: the
    /// paired sign-test interval needs six, and an odd count makes the
    /// median one round's ratio.
    #[arg(long, default_value_t = 9)]
    pub crr_reps: usize,
    /// Seconds per connection-rate repetition.
    #[arg(long, default_value_t = 2.0)]
    pub crr_duration: f64,
    /// How the hosts' TCP segments enter the router: as XDP frames, like a
    /// NIC's (wire.rs), or as the sockets' skbs straight from the host veths
    /// (each copied by veth for an XDP program on the router).
    #[arg(long, value_enum, default_value = "frames")]
    pub crr_ingress: super::wire::Ingress,
    /// Client threads opening connections back to back.
    #[arg(long, default_value_t = 2)]
    pub crr_clients: usize,
    /// The one CPU that generator, router and sink (and clients and server) share.
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
    /// Normal scheduling instead of SCHED_FIFO for the packet generator.
    #[arg(long)]
    pub no_rt: bool,
    /// A/B of the connection rate, in the same rounds as the main rows
    /// (ct_ab.rs): kernel, kernel-listener, xdp-pass, full, no-liberal,
    /// no-events, eager-liberal, no-cache, small-cache.
    #[arg(long, value_enum, value_delimiter = ',', hide = true)]
    pub ab: Vec<Variant>,
    /// Directory for stateful.json and stateful.png.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub(super) struct CrrRow {
    mode: Mode,
    /// An A/B row (`--ab`), measured in the same rounds as the main ones.
    pub(super) variant: Option<Variant>,
    /// The daemon's CPU time per connection (fastpath-stateful), in ms.
    pub(super) daemon_cpu_ms_per_conn: Option<f64>,
    clients: usize,
    reps: Vec<CrrRep>,
    median_conns_per_s: f64,
    min_conns_per_s: f64,
    max_conns_per_s: f64,
    failed: u64,
    ratio_to_kernel_ct: Option<f64>,
    /// The median over the rounds of this row's rate / kernel-ct's in the same round.
    paired_ratio_to_kernel_ct: Option<f64>,
    /// The 95 % interval of that median (report::paired_ratio_interval), as [low, high].
    paired_ratio_to_kernel_ct_95: Option<(f64, f64)>,
    /// fastpath's counters over this mode's connection runs (fastpath-stateful).
    fastpath_verdicts: Option<Verdicts>,
    /// ct_fwd's counters over this mode's connection runs (ct-ref).
    ct_ref_verdicts: Option<CtVerdicts>,
}

#[derive(Debug, Serialize)]
struct CtSetup {
    /// Entries created by `conntrack -R` for the generator's flows, and how long that took.
    created: usize,
    seconds: f64,
    /// Established, marked entries of the generator's flows found before each mode.
    before_mode: BTreeMap<&'static str, usize>,
}

#[derive(Serialize)]
struct StatefulReport<'a> {
    bench: &'static str,
    family: super::topo::Family,
    unix_time: u64,
    kernel_release: String,
    method: &'static str,
    cpu: usize,
    sched_fifo: bool,
    reps: usize,
    duration_s: f64,
    ct_mark: u32,
    /// --snat: the flows leave source-NATed to r1's address.
    snat: bool,
    ruleset: String,
    /// net.netfilter.nf_conntrack_tcp_be_liberal in the router namespace.
    tcp_be_liberal: bool,
    conntrack: &'a CtSetup,
    results: &'a [Cell],
    tcp_crr: &'a [CrrRow],
    fastpath_verdicts: BTreeMap<&'static str, Verdicts>,
    ct_ref_verdicts: Option<CtVerdicts>,
    /// Modes that could not run, with the reason.
    not_measured: BTreeMap<&'static str, String>,
    target_ratio_to_kernel_ct: f64,
    crr_ingress: super::wire::Ingress,
}

const METHOD: &str = "the main bench's generator -> router -> sink on one pinned CPU (the loop of frames: \
    generator on g1 -> router -> sink -> back to g1; UDP flow i = source port 10000 + i); the router holds an nftables forward ruleset (policy drop, new only \
    r0 -> r1, established accepted and ct-marked) in every mode, and conntrack entries for every flow, made \
    established, assured and marked with `conntrack -R` before the first mode and checked before each; \
    Mpps = frames at the sink / generator run time, median of the repetitions; ratios to kernel-ct. \
    TCP connections/s: clients in the generator namespace (connect, 26 B request, read the 64 B response \
    until the server closes), server in the sink namespace, all threads on the same CPU; by default their \
    segments reach the router as XDP frames, as from a NIC (crr_ingress, wire.rs)";

pub fn run(a: &StatefulArgs, exe: &Path, work: &Path, stop: &AtomicBool) -> Result<()> {
    let family = a.family;
    let v6 = family == super::topo::Family::V6;
    if v6 && a.snat {
        bail!("--family 6: the bench's source NAT (--snat) is IPv4's");
    }
    let mut modes = a.modes.clone();
    modes.sort();
    modes.dedup();
    if a.snat && modes.contains(&StMode::CtRef) {
        println!("--snat: ct-ref forwards without translating addresses, so it is left out");
        modes.retain(|m| *m != StMode::CtRef);
    }
    let mut flows = a.flows.clone();
    flows.sort_unstable();
    flows.dedup();
    let plan = Plan {
        reps: a.reps,
        duration: Duration::try_from_secs_f64(a.duration).context("--duration")?,
        warmup: Duration::from_millis(300),
        sizes: a.sizes.clone().unwrap_or_else(|| vec![if v6 { 84 } else { 64 }]),
        flows: flows.clone(),
        modes: modes.iter().map(|m| m.mode()).collect(),
        flow_entries: None,
        daemon_args: Vec::new(),
        hints: false,
        place: Placement::check(a.cpu, !a.no_rt)?,
    };
    if plan.reps == 0 || plan.duration.is_zero() || plan.sizes.is_empty() || flows.is_empty() || modes.is_empty() {
        bail!("nothing to measure: --reps, --duration, --sizes, --flows and --modes must be non-empty");
    }
    // One conntrack entry per source port: the generator varies only the
    // source port up to this many flows.
    let max_flows = *flows.last().unwrap_or(&1);
    if flows[0] == 0 || max_flows > traffic::SPORTS {
        bail!("--flows must be 1..={}", traffic::SPORTS);
    }
    for &s in &plan.sizes {
        traffic::frame_for(s, family)?;
    }
    let crr_duration = Duration::try_from_secs_f64(a.crr_duration).context("--crr-duration")?;
    let crr = !a.no_crr && a.crr_reps > 0 && a.crr_clients > 0 && !crr_duration.is_zero();
    if crr && v6 {
        println!("--family 6: the TCP connections/s part runs IPv4 clients and server, so it is left out");
    }
    let crr = crr && !v6;
    // Clients and server as the generator: the bench CPU, SCHED_FIFO unless
    // --no-rt, so other work on a shared box waits instead of taking a
    // different share of each mode's time. They block on every round trip,
    // so softirq work deferred to ksoftirqd still gets its turn.
    let crr_place = plan.place;

    println!(
        "fastpath bench stateful: {} traffic, modes {}, sizes {:?} B, established flows {:?}, {} x {:.1} s each, all on CPU {}{}; \
         ct mark {:#x}{}{}",
        family.name(),
        plan.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(","),
        plan.sizes,
        flows,
        plan.reps,
        plan.duration.as_secs_f64(),
        plan.place.cpu,
        if plan.place.fifo { " (SCHED_FIFO)" } else { "" },
        a.ct_mark,
        if a.snat { format!("; source NAT to {} on r1", ctlab::SNAT_TO) } else { String::new() },
        if crr {
            format!(
                "; TCP connections/s: {} clients, {} x {:.1} s, router ingress {}",
                a.crr_clients,
                a.crr_reps,
                a.crr_duration,
                match a.crr_ingress {
                    super::wire::Ingress::Frames => "frames (NIC-like, wire.rs)",
                    super::wire::Ingress::Skbs => "the sockets' skbs",
                }
            )
        } else {
            String::new()
        }
    );

    let topo = Topology::create_for(family)?;
    ctlab::load_ruleset(&topo, a.ct_mark, a.ct_mark_reply, a.snat, a.strict_tcp, work)?;
    ctlab::prepare_tcp_hosts(&topo)?;
    let t0 = Instant::now();
    let (created, took) = ctlab::ensure_entries(&topo, max_flows, a.ct_mark, a.snat, work)?;
    println!(
        "conntrack: {created} established+assured+marked entries created with conntrack -R in {:.2} s \
         ({:.2} s with the checks); router table holds {}",
        took.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        ctlab::count(&topo)?
    );
    let mut setup = CtSetup {
        created,
        seconds: took.as_secs_f64(),
        before_mode: BTreeMap::new(),
    };

    let mut crr_rows = Vec::new();
    let mut not_measured = BTreeMap::new();
    let mut problems = Vec::new();
    let mut ct_verdicts = None;
    // Packet rates, in rounds (rounds.rs), with the sink counting (and
    // dropping) at s0 throughout.
    let (mut cells, fp_verdicts) = {
        let mut sink_obj = MaybeUninit::uninit();
        // Every frame must come from the generator, or with --snat from
        // the translated address: a router that forwarded without
        // translating would otherwise be measured as if it had.
        let expect = if v6 { None } else { Some(sink_source(a.snat)?) };
        let sink = Sink::attach_expecting(&mut sink_obj, &topo, expect)?;
        let bench = Bench { plan: &plan, topo: &topo, sink: &sink, stop, dsts: None };
        let mut ctx = PacketCtx {
            exe,
            work,
            args: a,
            max_flows,
            setup: &mut setup,
            ct_verdicts: &mut ct_verdicts,
            not_measured: &mut not_measured,
        };
        rounds::run(&bench, &mut |mode, f| {
            let strays = bench.sink.strays()?;
            let v = packet_side(&bench, mode, f, &mut ctx)?;
            check_sources(mode, a.snat, bench.sink.strays()? - strays)?;
            Ok(v)
        })?
    };
    for (m, v) in &fp_verdicts {
        if !v.mostly_forwarded() {
            problems.push(format!("{m}: fastpath punted the traffic: {}", v.summary()));
        }
    }
    if let Some(v) = &ct_verdicts {
        println!("ct-ref counters over its packet-rate runs: {}", v.summary());
        if !v.mostly_forwarded() {
            problems.push(format!("ct-ref passed the traffic to the kernel instead of forwarding it: {}", v.summary()));
        }
    }

    // Connections per second, the sink program gone so TCP reaches the server.
    if crr {
        // Modes whose router side could not be set up are not measured.
        let measured: Vec<StMode> = modes.iter().copied().filter(|m| !not_measured.contains_key(m.mode().name())).collect();
        let run = stateful_crr::CrrRun { topo: &topo, exe, work, args: a, place: crr_place, duration: crr_duration, stop };
        crr_rows = stateful_crr::interleaved(&run, &measured, &a.ab)?;
        for row in crr_rows.iter().filter(|r| r.variant.is_none()) {
            crr_checks(row, &mut problems);
        }
    }
    let (good, _) = ctlab::flow_entries(&topo, a.ct_mark)?;
    // Informational: each packet-rate mode re-creates the entries it needs,
    // and a fastpath daemon clears its mark bit on every entry at start.
    println!(
        "conntrack after the last mode: {} of the generator's flows still established and marked (a fastpath daemon clears its mark bit at start; each mode re-creates what it needs)",
        good.len()
    );
    drop(topo);

    report::add_ratios_against(&mut cells, [Mode::KernelCt, Mode::Raw, Mode::CtRef]);
    report::add_paired_ratios(&mut cells, [Mode::KernelCt, Mode::Raw, Mode::CtRef]);
    let rates = |r: &CrrRow| r.reps.iter().map(|x| x.conns_per_s).collect::<Vec<f64>>();
    let base = crr_rows.iter().find(|r| r.mode == Mode::KernelCt && r.variant.is_none()).map(|r| (r.median_conns_per_s, rates(r)));
    for r in &mut crr_rows {
        r.ratio_to_kernel_ct = base.as_ref().filter(|b| b.0 > 0.0).map(|b| r.median_conns_per_s / b.0);
        r.paired_ratio_to_kernel_ct = base.as_ref().and_then(|b| report::paired_ratio(&rates(r), &b.1));
        r.paired_ratio_to_kernel_ct_95 =
            base.as_ref().and_then(|b| report::paired_ratio_interval(&rates(r), &b.1, 0.95));
    }
    // The target's size: 64 B, for IPv6 the frame with the same payload.
    print_table(&cells, &crr_rows, &not_measured, if v6 { 84 } else { 64 });
    for (m, v) in &fp_verdicts {
        println!("{m} counters over its packet-rate runs: {}", v.summary());
    }

    let rep = StatefulReport {
        bench: "stateful",
        family,
        unix_time: report::unix_time(),
        kernel_release: report::kernel_release(),
        method: METHOD,
        cpu: plan.place.cpu,
        sched_fifo: plan.place.fifo,
        reps: plan.reps,
        duration_s: plan.duration.as_secs_f64(),
        ct_mark: a.ct_mark,
        snat: a.snat,
        ruleset: ctlab::ruleset(a.ct_mark, a.ct_mark_reply, a.snat),
        tcp_be_liberal: !a.strict_tcp,
        conntrack: &setup,
        results: &cells,
        tcp_crr: &crr_rows,
        fastpath_verdicts: fp_verdicts,
        ct_ref_verdicts: ct_verdicts,
        not_measured,
        target_ratio_to_kernel_ct: TARGET_RATIO,
        crr_ingress: a.crr_ingress,
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let json = a.out.join("stateful.json");
    let text = serde_json::to_string_pretty(&rep).context("serialising the report")?;
    std::fs::write(&json, text + "\n").with_context(|| format!("writing {}", json.display()))?;
    println!("wrote {}", json.display());
    if let Some(png) = report::plot(&repo_root(), &json) {
        println!("wrote {}", png.display());
    }
    if !problems.is_empty() {
        bail!("the figures do not measure what their mode names: {}", problems.join("; "));
    }
    Ok(())
}

/// What the packet-rate set-ups need besides the bench, and what they report.
struct PacketCtx<'a> {
    exe: &'a Path,
    work: &'a Path,
    args: &'a StatefulArgs,
    /// The generator's flows, each needing an established, marked entry.
    max_flows: u32,
    setup: &'a mut CtSetup,
    ct_verdicts: &'a mut Option<CtVerdicts>,
    not_measured: &'a mut BTreeMap<&'static str, String>,
}

/// One round's set-up of `mode` for the packet-rate part (rounds::InMode),
/// the generator's flows checked (and if gone, made again) to be
/// established and marked in conntrack first, so every mode forwards the
/// same established traffic. A daemon that never gets ready leaves its
/// mode not measured, in this round and the next ones.
fn packet_side(
    bench: &Bench<'_>,
    mode: Mode,
    f: &mut dyn FnMut(Option<&FpStats>) -> Result<()>,
    c: &mut PacketCtx<'_>,
) -> Result<Option<Verdicts>> {
    if c.not_measured.contains_key(mode.name()) {
        return Ok(None);
    }
    let topo = bench.topo;
    let (recreated, _) = ctlab::ensure_entries(topo, c.max_flows, c.args.ct_mark, c.args.snat, c.work)?;
    if recreated > 0 {
        println!("   conntrack: {recreated} entries had gone and were made again");
    }
    let (good, _) = ctlab::flow_entries(topo, c.args.ct_mark)?;
    let seen = c.setup.before_mode.entry(mode.name()).or_insert(good.len());
    *seen = (*seen).min(good.len());
    let mut obj = MaybeUninit::uninit();
    match mode {
        Mode::KernelCt => f(None).map(|()| None),
        Mode::Raw => {
            let _raw = RawFwd::attach(&mut obj, topo)?;
            f(None).map(|()| None)
        }
        Mode::CtRef => {
            let fwd = CtFwd::attach(&mut obj, topo, c.args.ct_mark)?;
            let before = fwd.read()?;
            f(None)?;
            let v = ct_ref::verdicts(&before, &fwd.read()?);
            match c.ct_verdicts {
                Some(sum) => sum.add(&v),
                None => *c.ct_verdicts = Some(v),
            }
            Ok(None)
        }
        Mode::FastpathStateful => {
            let extra: Vec<String> =
                vec!["--mode".into(), "stateful".into(), "--ct-mark".into(), format!("{:#x}", c.args.ct_mark),
                     "--ct-mark-reply".into(), format!("{:#x}", c.args.ct_mark_reply)];
            let mut daemon = Daemon::spawn_with(topo, c.exe, c.work, &extra)?;
            if let Err(e) = daemon.wait_ready(DAEMON_READY, bench.stop) {
                let why = format!("{e:#}");
                println!("   not measured: {}", why.lines().collect::<Vec<_>>().join(" | "));
                c.not_measured.insert(mode.name(), why);
                return Ok(None);
            }
            rounds::under_daemon(bench, daemon, mode, f).map(Some)
        }
        _ => bail!("{}: not a mode of `fastpath bench stateful`", mode.name()),
    }
}

/// `n` frames of `mode` reached the sink from another source than they
/// should: a mode that translates (raw never does) forwarded untranslated.
fn check_sources(mode: Mode, snat: bool, n: u64) -> Result<()> {
    if n > 0 && !(snat && mode == Mode::Raw) {
        bail!(
            "{}: {n} frames reached the sink from another source than {}{}",
            mode.name(),
            sink_source(snat)?,
            if snat { ": forwarded without the source NAT" } else { "" }
        );
    }
    Ok(())
}

/// The source every frame at the sink carries: the generator's, or with
/// --snat the address the router translates it to.
fn sink_source(snat: bool) -> Result<std::net::Ipv4Addr> {
    if snat {
        ctlab::SNAT_TO.parse().context("SNAT_TO")
    } else {
        Ok(std::net::Ipv4Addr::from(topo::IP_G0))
    }
}

/// A fastpath-stateful row whose counters show no conntrack gate measured
/// stateless fastpath: SYN and FIN must reach conntrack.
fn crr_checks(row: &CrrRow, problems: &mut Vec<String>) {
    if let Some(v) = &row.ct_ref_verdicts {
        println!("   TCP connections: ct-ref {}", v.summary());
    }
    let Some(v) = &row.fastpath_verdicts else { return };
    println!("   TCP connections: fastpath {}", v.summary());
    let flags = v.punted_by_reason.iter().find(|(r, _)| r == "ct_tcp_flags").map_or(0, |r| r.1);
    let completed: u64 = row.reps.iter().map(|r| r.completed).sum();
    if completed > 0 && flags == 0 {
        problems.push(format!(
            "{}: no TCP SYN/FIN/RST punted to conntrack over {completed} connections: the conntrack gate is not in the data path",
            row.mode.name()
        ));
    }
}

pub(super) fn crr_row(
    mode: Mode,
    clients: usize,
    reps: Vec<CrrRep>,
    fastpath_verdicts: Option<Verdicts>,
    ct_ref_verdicts: Option<CtVerdicts>,
) -> CrrRow {
    let rates: Vec<f64> = reps.iter().map(|r| r.conns_per_s).collect();
    CrrRow {
        mode,
        variant: None,
        daemon_cpu_ms_per_conn: None,
        clients,
        median_conns_per_s: report::median(&rates),
        min_conns_per_s: rates.iter().copied().fold(f64::INFINITY, f64::min),
        max_conns_per_s: rates.iter().copied().fold(0.0, f64::max),
        failed: reps.iter().map(|r| r.failed).sum(),
        reps,
        ratio_to_kernel_ct: None,
        paired_ratio_to_kernel_ct: None,
        paired_ratio_to_kernel_ct_95: None,
        fastpath_verdicts,
        ct_ref_verdicts,
    }
}

fn interval(r: Option<(f64, f64)>) -> String {
    r.map(|(lo, hi)| format!("{lo:.2}-{hi:.2}x")).unwrap_or_else(|| "-".into())
}

fn print_table(cells: &[Cell], crr: &[CrrRow], not_measured: &BTreeMap<&'static str, String>, target_size: usize) {
    println!();
    println!(
        "{:<17} {:>4} {:>6} {:>7} {:>6} {:>6} {:>7} {:>5} {:>7} | {:>8} {:>7} {:>4}",
        "mode", "size", "flows", "Mpps", "min", "max", "xkernct", "%raw", "xctref", "Mpps/CPU", "xkernct", "cpu%"
    );
    for c in cells {
        println!(
            "{:<17} {:>4} {:>6} {:>7.3} {:>6.3} {:>6.3} {:>7} {:>5} {:>7} | {:>8.3} {:>7} {:>4.0}",
            c.mode.name(),
            c.size,
            c.flows,
            c.median_mpps,
            c.min_mpps,
            c.max_mpps,
            ratio(c.ratio_to_kernel),
            pct(c.share_of_raw),
            ratio(c.ratio_to_reference),
            c.median_mpps_per_cpu_s,
            ratio(c.ratio_to_kernel_per_cpu_s),
            c.median_cpu_share * 100.0
        );
    }
    println!("(established UDP flows through an nft forward ruleset with conntrack; Mpps: median of the repetitions,");
    println!(" sink frames / wall time; xkernct, %raw, xctref: against kernel-ct, raw and the conntrack-lookup");
    println!(" reference ct-ref at the same size and flows; right of |: per second of the CPU's time on the traffic)");
    if !crr.is_empty() {
        println!();
        println!(
            "{:<36} {:>7} {:>9} {:>8} {:>8} {:>7} {:>7} {:>11} {:>6} {:>10}",
            "TCP conn/s", "clients", "conn/s", "min", "max", "xkernct", "paired", "paired 95%", "failed", "daemon ms/conn"
        );
        for r in crr {
            let name = match r.variant {
                Some(v) => format!("{} [A/B {}]", r.mode.name(), v.name()),
                None => r.mode.name().to_string(),
            };
            println!(
                "{:<36} {:>7} {:>9.0} {:>8.0} {:>8.0} {:>7} {:>7} {:>11} {:>6} {:>10}",
                name,
                r.clients,
                r.median_conns_per_s,
                r.min_conns_per_s,
                r.max_conns_per_s,
                ratio(r.ratio_to_kernel_ct),
                ratio(r.paired_ratio_to_kernel_ct),
                interval(r.paired_ratio_to_kernel_ct_95),
                r.failed,
                r.daemon_cpu_ms_per_conn.map(|c| format!("{c:.3}")).unwrap_or_else(|| "-".into())
            );
        }
        println!("(connect, one request, response, close; median of the repetitions; paired: median over the rounds");
        println!(" of the rate / kernel-ct's in the same round; paired 95%: the sign-test interval of that median,");
        println!(" distribution-free; it needs >= 6 rounds)");
    }
    for (m, why) in not_measured {
        println!("{m}: not measured: {}", why.lines().collect::<Vec<_>>().join(" | "));
    }
    for c in cells.iter().filter(|c| c.mode == Mode::FastpathStateful && c.size == target_size) {
        println!(
            "fastpath-stateful {target_size} B {} flow(s): {} kernel-ct, {} of raw, {} ct-ref; paired by round {} / {} / {} (target >= {TARGET_RATIO}x kernel-ct)",
            c.flows,
            ratio(c.ratio_to_kernel),
            pct(c.share_of_raw),
            ratio(c.ratio_to_reference),
            ratio(c.paired_ratio_to_kernel),
            pct(c.paired_share_of_raw),
            ratio(c.paired_ratio_to_reference)
        );
    }
    if let Some(r) = crr.iter().find(|r| r.mode == Mode::FastpathStateful && r.variant.is_none()) {
        println!(
            "fastpath-stateful TCP connections/s: {} kernel-ct, paired by round {} (95% interval {}: {}; must not fall below 1.00x)",
            ratio(r.ratio_to_kernel_ct),
            ratio(r.paired_ratio_to_kernel_ct),
            interval(r.paired_ratio_to_kernel_ct_95),
            match r.paired_ratio_to_kernel_ct_95 {
                Some((lo, _)) if lo >= 1.0 => "not below kernel-ct",
                Some((_, hi)) if hi < 1.0 => "below kernel-ct",
                Some(_) => "not distinguishable from kernel-ct in this run",
                None => "too few rounds to tell",
            }
        );
    }
}
