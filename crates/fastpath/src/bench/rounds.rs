//! The packet-rate benches (forward, stateful) in rounds: each repetition is
//! one round in which every mode is set up, measured once in every cell
//! (size x flows, each after its warm-up) and torn down, the modes' order
//! rotating from round to round. Measured mode after mode, a mode met the machine minutes after
//! another did, and on this VM the ratios between modes swung by a third
//! from one run to the next (fastpath at 64 B, 1 flow: 3.83x the kernel in
//! one session, 2.88x in the next). Interleaved, the drift falls on every
//! mode alike. The price: a daemon start per fastpath mode and round.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use super::report::{Cell, Rep};
use super::router::{self, Daemon, FibFwd, FpStats, Mode, RawFwd, Verdicts};
use super::Bench;

/// One cell's repetitions so far, and fastpath's counters over them.
#[derive(Default)]
struct Acc {
    reps: Vec<Rep>,
    verdicts: Option<Verdicts>,
}

fn add(sum: &mut Option<Verdicts>, v: Verdicts) {
    match sum {
        Some(s) => s.add(&v),
        None => *sum = Some(v),
    }
}

/// Sets the router up for a mode, runs the closure it is given (with
/// fastpath's counters in the fastpath modes), tears the set-up down, and
/// returns fastpath's counters over the closure. Ok(None) without running
/// the closure: the mode could not be set up this round (the caller says why).
pub(super) type InMode<'s> = dyn FnMut(Mode, &mut dyn FnMut(Option<&FpStats>) -> Result<()>) -> Result<Option<Verdicts>> + 's;

/// The forward bench's rounds.
pub(super) fn forward(bench: &Bench<'_>, exe: &Path, work: &Path) -> Result<(Vec<Cell>, BTreeMap<&'static str, Verdicts>)> {
    run(bench, &mut |mode, f| in_mode(bench, mode, exe, work, f))
}

/// The cells in plan order (mode, size, flows; a cell never measured is
/// left out), and each fastpath mode's counters over all its runs.
pub(super) fn run(bench: &Bench<'_>, in_mode: &mut InMode<'_>) -> Result<(Vec<Cell>, BTreeMap<&'static str, Verdicts>)> {
    let plan = bench.plan;
    let modes = &plan.modes;
    let mut acc: BTreeMap<(usize, usize, u32), Acc> = BTreeMap::new();
    let mut totals: BTreeMap<&'static str, Option<Verdicts>> = BTreeMap::new();
    for round in 0..plan.reps {
        let order: Vec<usize> = (0..modes.len()).map(|k| (k + round) % modes.len()).collect();
        println!(
            "-- round {} of {}: {}",
            round + 1,
            plan.reps,
            order.iter().map(|&i| modes[i].name()).collect::<Vec<_>>().join(", ")
        );
        for i in order {
            let mode = modes[i];
            let v = in_mode(mode, &mut |fp| {
                for &size in &plan.sizes {
                    for &flows in &plan.flows {
                        let before = fp.map(|s| s.read()).transpose()?;
                        let reps = bench.measure_reps(mode, size, flows, 1)?;
                        let a = acc.entry((i, size, flows)).or_default();
                        if let (Some(stats), Some(before)) = (fp, before) {
                            add(&mut a.verdicts, router::verdicts(&before, &stats.read()?));
                        }
                        for r in &reps {
                            println!(
                                "   {:<16} {:>4} B {:>7} flows: {:.3} Mpps ({:.0}% cpu)",
                                mode.name(),
                                size,
                                flows,
                                r.mpps,
                                r.cpu_share * 100.0
                            );
                        }
                        a.reps.extend(reps);
                    }
                }
                Ok(())
            })?;
            if let Some(v) = v {
                add(totals.entry(mode.name()).or_default(), v);
            }
        }
    }
    let mut cells = Vec::new();
    for (i, &mode) in modes.iter().enumerate() {
        for &size in &plan.sizes {
            for &flows in &plan.flows {
                let Some(a) = acc.remove(&(i, size, flows)).filter(|a| !a.reps.is_empty()) else { continue };
                let mut cell = Cell::new(mode, size, flows, a.reps);
                cell.fastpath_verdicts = a.verdicts;
                if let Some(v) = &cell.fastpath_verdicts {
                    println!("   {:<16} {:>4} B {:>7} flows: fastpath {}", mode.name(), size, flows, v.summary());
                }
                cells.push(cell);
            }
        }
    }
    Ok((cells, totals.into_iter().filter_map(|(m, v)| v.map(|v| (m, v))).collect()))
}

/// Sets the router up for `mode`, runs `f` (with fastpath's counters in
/// the fastpath modes) and tears the set-up down again; fastpath's
/// counters over `f`.
fn in_mode(
    bench: &Bench<'_>,
    mode: Mode,
    exe: &Path,
    work: &Path,
    f: &mut dyn FnMut(Option<&FpStats>) -> Result<()>,
) -> Result<Option<Verdicts>> {
    let topo = bench.topo;
    match mode {
        // afxdp-tx: its own socket per cell is the traffic (Bench::measure_reps).
        Mode::Kernel | Mode::AfxdpTx => f(None).map(|()| None),
        Mode::FibFwd => {
            let mut obj = MaybeUninit::uninit();
            let _fib = FibFwd::attach(&mut obj, topo)?;
            f(None).map(|()| None)
        }
        Mode::Raw => {
            let mut obj = MaybeUninit::uninit();
            let _raw = RawFwd::attach(&mut obj, topo)?;
            f(None).map(|()| None)
        }
        Mode::FastpathNocache | Mode::Fastpath | Mode::FastpathHint | Mode::Afxdp | Mode::AfxdpNoprefetch => {
            let mut extra = mode.daemon_args();
            if let Some(n) = bench.plan.flow_entries {
                extra.extend(["--flow-entries".to_string(), n.to_string()]);
            }
            extra.extend(bench.plan.daemon_args.iter().cloned());
            let mut daemon = Daemon::spawn_with(topo, exe, work, &extra)?;
            daemon.wait_ready(Duration::from_secs(20), bench.stop)?;
            under_daemon(bench, daemon, mode, f).map(Some)
        }
        Mode::KernelCt | Mode::CtRef | Mode::FastpathStateful => {
            bail!("{}: only in `fastpath bench stateful`", mode.name())
        }
    }
}

/// With a ready daemon: once it really forwards the bench traffic, runs `f`
/// with its counters, stops it, and returns its counters over `f`.
pub(super) fn under_daemon(
    bench: &Bench<'_>,
    mut daemon: Daemon,
    mode: Mode,
    f: &mut dyn FnMut(Option<&FpStats>) -> Result<()>,
) -> Result<Verdicts> {
    let stats = bench.wait_fast_path(&daemon, mode)?;
    let before = stats.read()?;
    let ran = f(Some(&stats));
    let v = stats.read().map(|after| router::verdicts(&before, &after));
    daemon.stop()?;
    ran?;
    v
}
