//! The connection-rate part of `fastpath bench stateful`, interleaved:
//! every round runs one repetition of each stateful mode against the same
//! server, in an order that rotates from round to round. Run mode by mode
//! (all of kernel-ct's repetitions, then ct-ref's, then fastpath-stateful's
//! minutes later), the VM's drift over those minutes was as large as the
//! difference the rows exist to show; interleaved, it falls on every mode
//! alike. The price is a daemon start per fastpath-stateful repetition.
//! The `--ab` variants (ct_ab.rs) take their turns in the same rounds: run
//! after the main rows, they had the drift the rotation removes from those
//! (kernel-ct measured again came out at 0.95-0.98x of itself).

use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Result;

use super::crr::{self, CrrRep, Server};
use super::ct_ab::{self, Variant};
use super::ct_ref::{self, CtFwd, CtVerdicts};
use super::ctlab;
use super::router::{self, Daemon, FpStats, Verdicts};
use super::stateful::{crr_row, CrrRow, StMode, StatefulArgs, DAEMON_READY};
use super::topo::Topology;
use super::traffic::Placement;
use super::wire::{Ingress, Wire};

/// Connections before each measured repetition: the server's accept queue,
/// conntrack and (fastpath) the daemon's event socket reach steady state.
const WARM_UP: Duration = Duration::from_millis(300);

/// One row of the table: a stateful mode or an A/B variant of one.
#[derive(Clone, Copy)]
enum Arm {
    Mode(StMode),
    Ab(Variant),
}

impl Arm {
    fn name(self) -> String {
        match self {
            Arm::Mode(m) => m.mode().name().to_string(),
            Arm::Ab(v) => format!("A/B {}", v.name()),
        }
    }

    /// The mode whose row this is (a variant is one of kernel-ct or fastpath-stateful).
    fn mode(self) -> StMode {
        match self {
            Arm::Mode(m) => m,
            Arm::Ab(v) if v.daemon_args().is_some() => StMode::FastpathStateful,
            Arm::Ab(_) => StMode::KernelCt,
        }
    }
}

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
/// that order, then one per variant in `ab`.
pub fn interleaved(run: &CrrRun<'_>, modes: &[StMode], ab: &[Variant]) -> Result<Vec<CrrRow>> {
    let arms: Vec<Arm> = modes
        .iter()
        .copied()
        .filter(|m| *m != StMode::Raw)
        .map(Arm::Mode)
        .chain(ab.iter().copied().map(Arm::Ab))
        .collect();
    let mut acc: Vec<Acc> = arms.iter().map(|_| Acc::default()).collect();
    if arms.is_empty() {
        return Ok(Vec::new());
    }
    let (mut gen_obj, mut sink_obj) = (MaybeUninit::uninit(), MaybeUninit::uninit());
    let _wire = match run.args.crr_ingress {
        Ingress::Frames => Some(Wire::attach(&mut gen_obj, &mut sink_obj, run.topo)?),
        Ingress::Skbs => None,
    };
    let server = Server::start(run.topo, run.place)?;
    for round in 0..run.args.crr_reps {
        let order: Vec<usize> = (0..arms.len()).map(|k| (k + round) % arms.len()).collect();
        println!(
            "-- TCP connections/s, round {} of {}: {}",
            round + 1,
            run.args.crr_reps,
            order.iter().map(|&i| arms[i].name()).collect::<Vec<_>>().join(", ")
        );
        for i in order {
            one_rep(run, arms[i], &mut acc[i])?;
        }
    }
    drop(server);
    Ok(arms
        .iter()
        .zip(acc)
        .map(|(arm, a)| {
            let completed = a.reps.iter().map(|r| r.completed).sum();
            let st = arm.mode();
            let mut row = crr_row(st.mode(), run.args.crr_clients, a.reps, a.fastpath, a.ct_ref);
            let cpu = (st.mode() == super::router::Mode::FastpathStateful && !a.daemon_cpu_unknown).then_some(a.daemon_cpu);
            row.daemon_cpu_ms_per_conn = ct_ab::cpu_ms_per_conn(cpu, completed);
            if let Arm::Ab(v) = arm {
                row.variant = Some(*v);
            }
            row
        })
        .collect())
}

fn one_rep(run: &CrrRun<'_>, arm: Arm, acc: &mut Acc) -> Result<()> {
    let clients = |d| crr::run_clients(run.topo, run.place, run.args.crr_clients, d, run.stop);
    let mut obj = MaybeUninit::uninit();
    // A variant is kernel-ct with something added, or the daemon with a part left out.
    let (st, ab) = match arm {
        Arm::Mode(m) => (m, None),
        Arm::Ab(v) => (arm.mode(), Some(v)),
    };
    // Every repetition starts from the same conntrack table. Left to grow,
    // the earlier repetitions' TIME_WAIT entries filled it (262144 here
    // within ~40 s): from then on each new connection made conntrack evict
    // one, and each daemon start had that many marks to clear, work a
    // router starting its daemon once never repeats.
    ctlab::flush_tcp(run.topo)?;
    match st {
        StMode::KernelCt => {
            let listener = (ab == Some(Variant::KernelListener)).then(|| ct_ab::Listener::start(run.topo)).transpose()?;
            let pass = (ab == Some(Variant::XdpPass)).then(|| ct_ab::PassAll::attach(&mut obj, run.topo)).transpose()?;
            clients(WARM_UP)?;
            acc.reps.push(clients(run.duration)?);
            drop(pass);
            if let Some(l) = listener {
                println!("   listener read {} event datagrams", l.finish());
            }
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
            let mut extra: Vec<String> =
                vec!["--mode".into(), "stateful".into(), "--ct-mark".into(), format!("{:#x}", run.args.ct_mark),
                     "--ct-mark-reply".into(), format!("{:#x}", run.args.ct_mark_reply)];
            if let Some(args) = ab.and_then(Variant::daemon_args) {
                extra.extend(args.iter().map(|a| a.to_string()));
            }
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
    println!("   {}: {rep:.0} connections/s", arm.name());
    Ok(())
}
