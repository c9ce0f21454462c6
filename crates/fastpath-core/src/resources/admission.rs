//! A reservation model in the daemon's route path (paper 000, Figure 4):
//! every FIB prefix the reconciler would install is first answered by the
//! model, and only a route the target holds is written to the BPF maps.
//!
//! Where the device access falls is the model's: lockstep writes inline
//! (the answer is the write), prefetch reserves N inline every N routes,
//! credit draws on a bucket a thread refills, predictive counts. On the
//! simulated ASIC the admitted routes are then written by a work queue (a
//! thread paying the per-write latency), and a prefix reaches the BPF maps
//! only once its ASIC write has landed: the maps stand in for the ASIC's
//! tables, so the data plane sees the ASIC's latency.
//!
//! Correctness rides on the overflow trim (`overflow::trim_gated`): a
//! refused prefix, and one whose write is still queued, is left out of the
//! map like a prefix beyond capacity, and its nearest installed cover punts,
//! so nothing is ever forwarded by a shorter route meanwhile.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::models::Stats;
use super::{new_model, AsicConfig, BpfTarget, BpfUsage, Entry, Model, ModelKind, SimAsic, Target};
use crate::desired::Prefix;
use crate::model::Family;
use crate::tables::{Capacities, Desired};

/// Which tables a route must find room in before it reaches the maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetKind {
    /// fastpath's BPF maps, exact accounting.
    #[default]
    Bpf,
    /// A simulated offload ASIC with real per-access latency.
    SimAsic,
}

impl FromStr for TargetKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bpf" => Ok(TargetKind::Bpf),
            "sim-asic" => Ok(TargetKind::SimAsic),
            _ => Err(format!("unknown resource target {s:?} (bpf, sim-asic)")),
        }
    }
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Bpf => "bpf",
            TargetKind::SimAsic => "sim-asic",
        }
    }
}

/// What `status` reports about admissions (key `"admission"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionStatus {
    pub target: String,
    pub model: String,
    /// Routes answered yes since the start.
    pub admitted: u64,
    /// Routes answered no since the start.
    pub refusals: u64,
    /// Routes refused now (their traffic goes to the kernel).
    pub refused: u64,
    /// Admitted, their target write not landed yet (not in the maps).
    pub pending: u64,
    /// Admitted and written: in the maps.
    pub installed: u64,
    pub inline_accesses: u64,
    pub stalls: u64,
    pub refills: u64,
    /// Wall clock (µs since the epoch) of the last answer, and of the last
    /// target write that landed; 0 = none yet.
    pub last_answer_unix_us: u64,
    pub last_landed_unix_us: u64,
}

type Key = (Family, Prefix);

/// One prefix's way through the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// In the target: may be in the maps.
    Installed,
    /// Admitted, write queued: not in the maps yet.
    Pending,
    /// Refused: not in the maps, reported offload failed.
    Refused,
}

enum Op {
    Commit { key: Key, entry: Entry, seq: u64 },
    Remove { entry: Entry },
}

/// What the work queue did since the last look.
enum Landed {
    /// (prefix, sequence, written).
    Commit(Key, u64, bool),
    /// An entry left the target: room for a refused one, maybe.
    Freed,
}

/// The driver's work queue: writes admitted entries to the target in order.
struct Queue {
    tx: Option<Sender<Op>>,
    landed: Arc<Mutex<Vec<Landed>>>,
    thread: Option<JoinHandle<()>>,
}

impl Queue {
    fn start(model: Arc<dyn Model>) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::channel::<Op>();
        let landed: Arc<Mutex<Vec<Landed>>> = Arc::default();
        let out = Arc::clone(&landed);
        let thread = std::thread::Builder::new().name("asic-writer".into()).spawn(move || {
            for op in rx {
                match op {
                    Op::Commit { key, entry, seq } => {
                        let ok = match model.commit(&entry) {
                            Ok(()) => true,
                            Err(e) => {
                                log::warn!("resource target: an admitted {entry} could not be written: {e}");
                                false
                            }
                        };
                        super::models::lock(&out).push(Landed::Commit(key, seq, ok));
                    }
                    Op::Remove { entry } => {
                        model.remove(&entry);
                        super::models::lock(&out).push(Landed::Freed);
                    }
                }
            }
        })?;
        Ok(Queue { tx: Some(tx), landed, thread: Some(thread) })
    }

    fn send(&self, op: Op) -> bool {
        self.tx.as_ref().is_some_and(|t| t.send(op).is_ok())
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::warn!("asic-writer thread panicked");
            }
        }
    }
}

/// The model and target the daemon admits routes through.
pub struct Admission {
    kind: TargetKind,
    model: Arc<dyn Model>,
    target: Arc<dyn Target>,
    /// Entries of prefixes in the target.
    installed: HashMap<Key, Entry>,
    /// Admitted, write queued, by sequence number of the queued commit.
    pending: HashMap<Key, (Entry, u64)>,
    refused: HashSet<Key>,
    /// Something left the target since the last try: ask again for the refused.
    retry_refused: bool,
    queue: Option<Queue>,
    seq: u64,
    admitted: u64,
    refusals: u64,
    last_answer: Option<SystemTime>,
    last_landed: Option<SystemTime>,
}

impl Admission {
    /// `caps` sizes the BPF target; `asic` configures the simulated one.
    pub fn new(kind: TargetKind, model: &ModelKind, caps: &Capacities, asic: AsicConfig) -> std::io::Result<Admission> {
        let target: Arc<dyn Target> = match kind {
            TargetKind::Bpf => Arc::new(BpfTarget::new(BpfUsage::of(caps, &Desired::default()))),
            TargetKind::SimAsic => Arc::new(SimAsic::new(asic)),
        };
        let model: Arc<dyn Model> = Arc::from(new_model(model, Arc::clone(&target)));
        // BPF writes cost nothing and the maps are written in the same
        // reconcile; a lockstep admission is the write itself.
        let deferred = kind == TargetKind::SimAsic && model.name() != "lockstep";
        let queue = if deferred { Some(Queue::start(Arc::clone(&model))?) } else { None };
        Ok(Admission {
            kind,
            model,
            target,
            installed: HashMap::new(),
            pending: HashMap::new(),
            refused: HashSet::new(),
            retry_refused: false,
            queue,
            seq: 0,
            admitted: 0,
            refusals: 0,
            last_answer: None,
            last_landed: None,
        })
    }

    pub fn target(&self) -> &Arc<dyn Target> {
        &self.target
    }

    pub fn model(&self) -> &Arc<dyn Model> {
        &self.model
    }

    pub fn kind(&self) -> TargetKind {
        self.kind
    }

    pub fn model_name(&self) -> &'static str {
        self.model.name()
    }

    /// Admitted routes whose target write has not landed.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Moves the writes that landed into `installed`; true when the maps
    /// need a reconcile (a write landed, or room freed for a refused route).
    pub fn take_landed(&mut self) -> bool {
        let Some(q) = &self.queue else { return false };
        let landed = std::mem::take(&mut *super::models::lock(&q.landed));
        if landed.is_empty() {
            return false;
        }
        let mut wrote = false;
        for l in landed {
            let (key, seq, ok) = match l {
                Landed::Commit(key, seq, ok) => (key, seq, ok),
                Landed::Freed => {
                    // Refused routes may fit now; the reconcile asks again.
                    self.retry_refused = true;
                    wrote |= !self.refused.is_empty();
                    continue;
                }
            };
            wrote = true;
            self.last_landed = Some(SystemTime::now());
            // A prefix deleted (or deleted and re-added) while queued is not this commit's.
            match self.pending.get(&key) {
                Some((entry, s)) if *s == seq => {
                    let entry = *entry;
                    self.pending.remove(&key);
                    if ok {
                        self.installed.insert(key, entry);
                    } else {
                        self.refused.insert(key);
                    }
                }
                _ => {}
            }
        }
        wrote
    }

    /// Gives back the entries of `fam`'s prefixes that are no longer to be
    /// installed (deleted from the kernel, or beyond the maps' capacity).
    pub(crate) fn retain(&mut self, fam: Family, kept: &HashSet<Prefix>) {
        let gone = |k: &Key| k.0 == fam && !kept.contains(&k.1);
        let removed: Vec<Key> = self.installed.keys().filter(|k| gone(k)).copied().collect();
        for k in removed {
            if let Some(e) = self.installed.remove(&k) {
                self.remove(e);
            }
        }
        let removed: Vec<Key> = self.pending.keys().filter(|k| gone(k)).copied().collect();
        for k in removed {
            if let Some((e, _)) = self.pending.remove(&k) {
                // Queued behind its commit: the write lands, then goes.
                if !self.queue.as_ref().is_some_and(|q| q.send(Op::Remove { entry: e })) {
                    self.model.cancel(&e);
                }
                self.retry_refused = true;
            }
        }
        self.refused.retain(|k| !gone(k));
    }

    fn remove(&mut self, e: Entry) {
        match &self.queue {
            Some(q) if q.send(Op::Remove { entry: e }) => {}
            _ => self.model.remove(&e),
        }
        self.retry_refused = true;
    }

    /// The model's answer for a prefix the maps would hold.
    pub(crate) fn gate(&mut self, fam: Family, p: Prefix) -> Gate {
        let key = (fam, p);
        if self.installed.contains_key(&key) {
            return Gate::Installed;
        }
        if self.pending.contains_key(&key) {
            return Gate::Pending;
        }
        if self.refused.contains(&key) && !self.retry_refused {
            return Gate::Refused;
        }
        let entry = Entry::Route { family: fam, prefix_len: p.len };
        let answer = self.model.admit(&entry);
        self.last_answer = Some(SystemTime::now());
        if let Err(e) = answer {
            log::debug!("reservation model {}: refused: {e}", self.model.name());
            self.refusals += 1;
            self.refused.insert(key);
            return Gate::Refused;
        }
        self.admitted += 1;
        self.refused.remove(&key);
        if let Some(q) = &self.queue {
            self.seq += 1;
            if q.send(Op::Commit { key, entry, seq: self.seq }) {
                self.pending.insert(key, (entry, self.seq));
                return Gate::Pending;
            }
        }
        match self.model.commit(&entry) {
            Ok(()) => {
                self.installed.insert(key, entry);
                Gate::Installed
            }
            Err(e) => {
                log::warn!("resource target: an admitted {entry} could not be written: {e}");
                self.refused.insert(key);
                Gate::Refused
            }
        }
    }

    /// After a compute: refused prefixes were all asked again.
    pub(crate) fn end_pass(&mut self) {
        self.retry_refused = false;
    }

    pub fn status(&self) -> AdmissionStatus {
        let us = |t: Option<SystemTime>| {
            t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_micros() as u64).unwrap_or(0)
        };
        let Stats { inline_accesses, stalls, refills } = self.model.stats();
        AdmissionStatus {
            target: self.kind.name().into(),
            model: self.model.name().into(),
            admitted: self.admitted,
            refusals: self.refusals,
            refused: self.refused.len() as u64,
            pending: self.pending.len() as u64,
            installed: self.installed.len() as u64,
            inline_accesses,
            stalls,
            refills,
            last_answer_unix_us: us(self.last_answer),
            last_landed_unix_us: us(self.last_landed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::desired::{compute_gated, reason, Ids};
    use crate::fixtures::{default_rules, ip, main_route, veth};
    use crate::model::{IfSysctl, KernelState, NextHop, RouteTarget};
    use crate::tables::RouteAction;

    fn caps() -> Capacities {
        Capacities { fib4: 100, fib6: 100, nexthops: 16, neigh: 16, ifaces: 4, groups: 8, buckets: 64 }
    }

    fn state(routes: &[(&str, u8)]) -> KernelState {
        let mut st = KernelState::default();
        let link = veth(2, "eth0");
        st.links.insert(2, link);
        st.if_sysctl.insert(2, IfSysctl { forwarding4: true, forwarding6: true, mtu6: 1500, ..Default::default() });
        st.rules = default_rules();
        for (dst, len) in routes {
            let hop = NextHop { ifindex: 2, gateway: Some(ip("192.0.2.1")), flags: 0, weight: 1 };
            let r = main_route(dst, *len, RouteTarget::Single(hop));
            st.routes.insert((Family::V4, r.key.clone()), r);
        }
        st
    }

    fn run(st: &KernelState, adm: &mut Admission) -> Desired {
        let managed: BTreeMap<u32, u32> = [(2, 1)].into_iter().collect();
        compute_gated(st, &managed, &caps(), &mut Ids::new(16, 8), Some(adm))
    }

    fn action(d: &Desired, a: &str, len: u8) -> Option<RouteAction> {
        d.fib4.get(&(a.parse::<Ipv4Addr>().unwrap(), len)).map(|e| e.action)
    }

    fn asic(lpm_units: u64) -> AsicConfig {
        AsicConfig { lpm_units, ..AsicConfig::default() }.instant()
    }

    const NESTED: [(&str, u8); 3] = [("10.0.0.0", 8), ("10.1.0.0", 16), ("10.1.2.0", 24)];

    #[test]
    fn refused_route_punts_its_cover_and_comes_back_when_room_frees() {
        for model in ["lockstep", "prefetch:1", "credit:1", "predictive", "predictive-flat"] {
            let kind: ModelKind = model.parse().unwrap();
            // predictive-flat gives each of the LPM's three kinds a third.
            let units = if model == "predictive-flat" { 6 } else { 2 };
            let mut adm = Admission::new(TargetKind::SimAsic, &kind, &caps(), asic(units)).unwrap();
            let st = state(&NESTED);
            let mut d = run(&st, &mut adm);
            let deadline = Instant::now() + Duration::from_secs(5);
            while adm.has_pending() {
                assert!(Instant::now() < deadline, "{model}: writes never landed");
                std::thread::sleep(Duration::from_millis(1));
                if adm.take_landed() {
                    d = run(&st, &mut adm);
                }
            }
            // Shortest first: the /24 finds no room, and the /16 must not forward its traffic.
            assert!(matches!(action(&d, "10.0.0.0", 8), Some(RouteAction::Forward { .. })), "{model}");
            assert_eq!(action(&d, "10.1.0.0", 16), Some(RouteAction::Punt { reason: reason::TABLE_FULL }), "{model}");
            assert_eq!(action(&d, "10.1.2.0", 24), None, "{model}");
            assert_eq!(d.offload.failed4.len(), 1, "{model}");
            assert_eq!(adm.status().refused, 1, "{model}");

            // The /16 goes: its room serves the /24, nothing punts any more.
            let st = state(&[NESTED[0], NESTED[2]]);
            let mut d = run(&st, &mut adm);
            let deadline = Instant::now() + Duration::from_secs(5);
            while adm.has_pending() || action(&d, "10.1.2.0", 24).is_none() {
                assert!(Instant::now() < deadline, "{model}: the /24 never came back");
                std::thread::sleep(Duration::from_millis(1));
                adm.take_landed();
                d = run(&st, &mut adm);
            }
            assert!(matches!(action(&d, "10.1.2.0", 24), Some(RouteAction::Forward { .. })), "{model}");
            assert!(d.offload.failed4.is_empty() && d.offload.covers4.is_empty(), "{model}");
        }
    }

    #[test]
    fn queued_write_keeps_the_route_out_of_the_maps_and_its_cover_punting() {
        let kind = ModelKind::Predictive { flat: false };
        let mut cfg = asic(100);
        cfg.write_latency = Duration::from_millis(300);
        let mut adm = Admission::new(TargetKind::SimAsic, &kind, &caps(), cfg).unwrap();
        let d = run(&state(&NESTED[..1]), &mut adm);
        // Not written to the ASIC yet: not in the maps, but not failed either.
        assert_eq!(action(&d, "10.0.0.0", 8), None);
        assert!(d.offload.failed4.is_empty() && d.problems.is_empty(), "{:?}", d.problems);
        while !adm.take_landed() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let d = run(&state(&NESTED[..1]), &mut adm);
        assert!(matches!(action(&d, "10.0.0.0", 8), Some(RouteAction::Forward { .. })));
        let d = run(&state(&NESTED[..2]), &mut adm);
        // The /16 waits for its write; the /8 must not take its traffic meanwhile.
        assert_eq!(action(&d, "10.1.0.0", 16), None);
        assert_eq!(action(&d, "10.0.0.0", 8), Some(RouteAction::Punt { reason: reason::TABLE_FULL }));
        assert!(d.offload.covers4.contains(&("10.0.0.0".parse().unwrap(), 8)));
        assert!(d.offload.failed4.is_empty());
        let st = adm.status();
        assert_eq!((st.pending, st.installed, st.admitted), (1, 1, 2));
    }

    #[test]
    fn bpf_target_installs_in_the_same_pass() {
        for model in ["lockstep", "prefetch:4", "credit", "predictive-flat"] {
            let mut adm = Admission::new(TargetKind::Bpf, &model.parse().unwrap(), &caps(), AsicConfig::default()).unwrap();
            let d = run(&state(&NESTED), &mut adm);
            assert_eq!(d.fib4.len(), 3, "{model}");
            assert!(d.offload.failed4.is_empty(), "{model}");
            assert!(!adm.has_pending(), "{model}");
            assert_eq!(adm.status().installed, 3, "{model}");
        }
    }
}
