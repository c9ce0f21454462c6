//! The connection-rate part of `fastpath bench stateful`, interleaved:
//! every round runs one repetition of each stateful mode against the same
//! server, in an order that rotates from round to round. Run mode by mode
//! (all of kernel-ct's repetitions, then ct-ref's, then fastpath-stateful's
//! minutes later), the VM's drift over those minutes was as large as the
//! difference the rows exist to show; interleaved, it falls on every mode
//! alike. The price is a daemon start per fastpath-stateful repetition.

use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Result;

use super::crr::{self, CrrRep, Server};
use super::ct_ab;
use super::ct_ref::{self, CtFwd, CtVerdicts};
use super::ctlab;
use super::router::{self, Daemon, FpStats, Verdicts};
use super::stateful::{crr_row, CrrRow, StMode, StatefulArgs, DAEMON_READY};
use super::topo::Topology;
use super::traffic::Placement;

/// Connections before each measured repetition: the server's accept queue,
/// conntrack and (fastpath) the daemon's event socket reach steady state.
const WARM_UP: Duration = Duration::from_millis(300);

/// What one mode's repetitions add up to.
#[derive(Default)]
struct Acc {
    reps: Vec<CrrRep>,
    fastpath: Option<Verdicts>,
    ct_ref: Option<CtVerdicts>,
    daemon_cpu: Duration,
    /// A repetition whose daemon CPU time could not be read.
    daemon_cpu_unknown: bool,
}

/// Where the repetitions run: lab, binary, CPU placement, duration.
pub struct CrrRun<'a> {
    pub topo: &'a Topology,
    pub exe: &'a Path,
    pub work: &'a Path,
    pub args: &'a StatefulArgs,
    pub place: Placement,
    pub duration: Duration,
    pub stop: &'a AtomicBool,
}

/// One row per stateful mode in `modes` (raw has no connection rate), in
/// that order.
pub fn interleaved(run: &CrrRun<'_>, modes: &[StMode]) -> Result<Vec<CrrRow>> {
    let modes: Vec<StMode> = modes.iter().copied().filter(|m| *m != StMode::Raw).collect();
    let mut acc: Vec<Acc> = modes.iter().map(|_| Acc::default()).collect();
    if modes.is_empty() {
        return Ok(Vec::new());
    }
    ctlab::flush_tcp(run.topo)?;
    let server = Server::start(run.topo, run.place)?;
    for round in 0..run.args.crr_reps {
        let order: Vec<usize> = (0..modes.len()).map(|k| (k + round) % modes.len()).collect();
        println!(
            "-- TCP connections/s, round {} of {}: {}",
            round + 1,
            run.args.crr_reps,
            order.iter().map(|&i| modes[i].mode().name()).collect::<Vec<_>>().join(", ")
        );
        for i in order {
            one_rep(run, modes[i], &mut acc[i])?;
        }
    }
    drop(server);
    Ok(modes
        .iter()
        .zip(acc)
        .map(|(st, a)| {
            let completed = a.reps.iter().map(|r| r.completed).sum();
            let mut row = crr_row(st.mode(), run.args.crr_clients, a.reps, a.fastpath, a.ct_ref);
            let cpu = (st.mode() == super::router::Mode::FastpathStateful && !a.daemon_cpu_unknown).then_some(a.daemon_cpu);
            row.daemon_cpu_ms_per_conn = ct_ab::cpu_ms_per_conn(cpu, completed);
            row
        })
        .collect())
}

fn one_rep(run: &CrrRun<'_>, st: StMode, acc: &mut Acc) -> Result<()> {
    let clients = |d| crr::run_clients(run.topo, run.place, run.args.crr_clients, d, run.stop);
    let mut obj = MaybeUninit::uninit();
    match st {
        StMode::KernelCt => {
            clients(WARM_UP)?;
            acc.reps.push(clients(run.duration)?);
        }
        StMode::CtRef => {
            let fwd = CtFwd::attach(&mut obj, run.topo, run.args.ct_mark)?;
            clients(WARM_UP)?;
            let before = fwd.read()?;
            acc.reps.push(clients(run.duration)?);
            let v = ct_ref::verdicts(&before, &fwd.read()?);
            match &mut acc.ct_ref {
                Some(sum) => sum.add(&v),
                None => acc.ct_ref = Some(v),
            }
        }
        StMode::FastpathStateful => {
            let extra: Vec<String> =
                vec!["--mode".into(), "stateful".into(), "--ct-mark".into(), format!("{:#x}", run.args.ct_mark)];
            let mut daemon = Daemon::spawn_with(run.topo, run.exe, run.work, &extra)?;
            daemon.wait_ready(DAEMON_READY, run.stop)?;
            let stats = FpStats::find(run.topo)?;
            clients(WARM_UP)?;
            let before = stats.read()?;
            let cpu_before = daemon.cpu_time();
            acc.reps.push(clients(run.duration)?);
            let cpu = daemon.cpu_time().zip(cpu_before).map(|(b, a)| b.saturating_sub(a));
            let v = router::verdicts(&before, &stats.read()?);
            daemon.stop()?;
            match cpu {
                Some(c) => acc.daemon_cpu += c,
                None => acc.daemon_cpu_unknown = true,
            }
            match &mut acc.fastpath {
                Some(sum) => sum.add(&v),
                None => acc.fastpath = Some(v),
            }
        }
        StMode::Raw => {}
    }
    let rep = acc.reps.last().map_or(0.0, |r| r.conns_per_s);
    println!("   {}: {rep:.0} connections/s", st.mode().name());
    Ok(())
}
