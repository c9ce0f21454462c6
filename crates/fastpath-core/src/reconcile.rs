//! Desired tables vs written tables -> ordered map writes.
//!
//! The data plane reads the maps while we write them, one entry at a time,
//! so the order of the writes is what keeps a half-written state from
//! forwarding anything the kernel would not:
//!
//! 1. families that become punted are switched off before anything else;
//! 2. interfaces, next hops and neighbours are added before any route can
//!    point at them, then ECMP groups (whose paths name next hops) and the
//!    buckets of resilient groups; a group id is only ever written while
//!    absent (a changed group is a new id), a bucket changes in place as the
//!    kernel's do, one at a time;
//! 3. routes change, longest prefixes first, then deletes shortest first:
//!    at every step each address resolves either as before or as after
//!    (see `fib_ops`); IPv4 source deny entries are written before the
//!    routes change and deleted after, so the deny set always covers the
//!    old and the new FIB (an extra entry only punts); `src_lpm` is set
//!    first and cleared last like the punt switches;
//! 4. buckets, groups, neighbours, next hops and interfaces nobody needs any
//!    more go last (reverse order of creation): a group only once no written
//!    route references it, a next hop only once no written route or group
//!    does; the multipath hash settings change first when the new ones are
//!    usable, last when multipath routes are being punted because of them;
//! 5. families that become un-punted are switched on after their tables
//!    are complete;
//! 6. the generation is bumped so cached results computed from the old
//!    tables are not trusted; not when all a plan writes is entries for
//!    neighbours the maps did not hold (`adds_neighbours_only`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::tables::{Capacities, Desired, IfaceEntry, Op, RouteAction, RouteEntry, Switches, TableWriter};

const V4: u32 = 1;
const V6: u32 = 2;

#[derive(Debug, thiserror::Error)]
#[error("applying {op:?}: {source}")]
pub struct ReconcileError<E: std::error::Error + 'static> {
    pub op: Op,
    #[source]
    pub source: E,
}

/// Holds the shadow of what is in the maps.
#[derive(Debug, Default)]
pub struct Reconciler {
    applied: Desired,
    generation: u64,
    /// A table op was applied since the last generation bump (a plan that
    /// failed before its bump must still bump on the retry).
    dirty: bool,
    caps: Option<Capacities>,
}

impl Reconciler {
    pub fn new() -> Self {
        Self::default()
    }

    /// A reconciler that knows the map sizes: when the old and new contents
    /// of a FIB together would not fit, it punts that family while it
    /// rewrites it (deleting first), and it deletes stale neighbours before
    /// adding new ones.
    pub fn with_capacities(caps: Capacities) -> Self {
        Reconciler {
            caps: Some(caps),
            ..Self::default()
        }
    }

    /// Takes over maps another reconciler wrote (a daemon restarting on
    /// pinned maps): `applied` is what they hold, read back from them, and
    /// `generation` the count it had reached. The next plan is then the
    /// minimal diff to the new desired state in the usual safe order
    /// (entries left from the dead daemon's time are deleted like any other
    /// stale entry), and it ends with a generation bump even when empty, so
    /// the flow cache never trusts a result from before the take-over.
    pub fn adopt(&mut self, applied: Desired, generation: u64) {
        self.applied = applied;
        self.generation = generation;
        self.dirty = true;
    }

    /// The next plan ends with a generation bump even if it writes
    /// nothing: entries changed outside the plan (a reload re-slotting the
    /// next hops of interfaces it added or removed).
    pub fn force_bump(&mut self) {
        self.dirty = true;
    }

    /// The ops that take the maps from `applied()` to `desired`, safely ordered.
    pub fn plan(&self, desired: &Desired) -> Vec<Op> {
        let old = &self.applied;
        let new_sw = desired.switches;
        // A family in table_full is punted; its FIB could not be written in
        // full, so it is left alone until it fits.
        let skip4 = new_sw.table_full & V4 != 0;
        let skip6 = new_sw.table_full & V6 != 0;
        // Both families punted is how `desired` reports an overflowing
        // next-hop or neighbour table; with nothing forwarded, those tables
        // wait too.
        let skip_l2 = skip4 && skip6;

        // More managed interfaces than the map holds (`desired` punts both
        // families then): leave the interface map alone rather than fail
        // every apply on a full hash map.
        let iface_over = self
            .caps
            .is_some_and(|c| desired.ifaces.len() > c.ifaces as usize);
        let mut transient = 0;
        let mut neigh_tight = false;
        let mut bucket_tight = false;
        // Old and new deny sets together would not fit (the map is sized
        // like fib4): check sources by LPM while the set is rewritten.
        let mut deny_tight = false;
        if let Some(c) = &self.caps {
            deny_tight = !skip4 && union_len(&old.src_deny4, &desired.src_deny4) > c.fib4 as usize;
            if !skip4 && union_len(&old.fib4, &desired.fib4) > c.fib4 as usize {
                transient |= V4;
            }
            if !skip6 && union_len(&old.fib6, &desired.fib6) > c.fib6 as usize {
                transient |= V6;
            }
            neigh_tight = union_len(&old.neigh, &desired.neigh) > c.neigh as usize;
            // A missing bucket only punts its flows, like a missing neighbour.
            bucket_tight = union_len(&old.res_buckets, &desired.res_buckets) > c.buckets as usize;
        }

        let mut ops = Vec::new();
        // New hash settings the data plane can use go in before the routes
        // change; settings it cannot use only once the routes they would
        // concern are punted.
        let mp_usable = new_sw.mp_seed != 0
            && crate::mphash::reproduced(new_sw.mp_policy4)
            && crate::mphash::reproduced(new_sw.mp_policy6);
        let mp_src = if mp_usable { &new_sw } else { &old.switches };
        let first = Switches {
            table_full: old.switches.table_full | new_sw.table_full | transient,
            policy_punt: old.switches.policy_punt | new_sw.policy_punt,
            src_lpm: old.switches.src_lpm | new_sw.src_lpm | if deny_tight { V4 } else { 0 },
            mp_policy4: mp_src.mp_policy4,
            mp_policy6: mp_src.mp_policy6,
            mp_fields4: mp_src.mp_fields4,
            mp_fields6: mp_src.mp_fields6,
            mp_seed: mp_src.mp_seed,
        };
        let mut written = old.switches;
        if first != written {
            ops.push(Op::SetSwitches(first));
            written = first;
        }

        if !iface_over {
            upserts(&old.ifaces, &desired.ifaces, &mut ops, |k, v| {
                Op::UpsertIface(*k, v.clone())
            });
        }
        if !skip_l2 {
            upserts(&old.nexthops, &desired.nexthops, &mut ops, |k, v| {
                Op::UpsertNexthop(*k, v.clone())
            });
            // A missing neighbour only punts, so deleting early is safe and
            // makes room in a full hash map.
            if neigh_tight {
                deletes(&old.neigh, &desired.neigh, &mut ops, |k| {
                    Op::DeleteNeigh(*k)
                });
            }
            upserts(&old.neigh, &desired.neigh, &mut ops, |k, v| {
                Op::UpsertNeigh(*k, *v)
            });
            upserts(&old.groups, &desired.groups, &mut ops, |k, v| {
                Op::UpsertGroup(*k, v.clone())
            });
            if bucket_tight {
                deletes(&old.res_buckets, &desired.res_buckets, &mut ops, |k| {
                    Op::DeleteBucket(*k)
                });
            }
            upserts(&old.res_buckets, &desired.res_buckets, &mut ops, |k, v| {
                Op::UpsertBucket(*k, *v)
            });
        }

        // A skipped family's FIB stays as it is, and so does its deny set.
        if !skip4 {
            if deny_tight {
                deletes(&old.src_deny4, &desired.src_deny4, &mut ops, |k| Op::DeleteSrcDeny4(*k));
            }
            upserts(&old.src_deny4, &desired.src_deny4, &mut ops, |k, v| Op::UpsertSrcDeny4(*k, *v));
        }
        if !skip4 {
            fib_ops(
                &old.fib4,
                &desired.fib4,
                transient & V4 != 0,
                &mut ops,
                Op::UpsertRoute4,
                Op::DeleteRoute4,
            );
        }
        if !skip6 {
            fib_ops(
                &old.fib6,
                &desired.fib6,
                transient & V6 != 0,
                &mut ops,
                Op::UpsertRoute6,
                Op::DeleteRoute6,
            );
        }

        if !skip4 && !deny_tight {
            deletes(&old.src_deny4, &desired.src_deny4, &mut ops, |k| Op::DeleteSrcDeny4(*k));
        }

        if !skip_l2 {
            if !neigh_tight {
                deletes(&old.neigh, &desired.neigh, &mut ops, |k| {
                    Op::DeleteNeigh(*k)
                });
            }
            if !bucket_tight {
                deletes(&old.res_buckets, &desired.res_buckets, &mut ops, |k| {
                    Op::DeleteBucket(*k)
                });
            }
            // Routes of a skipped family stay as they are in the maps and
            // keep their groups and next hops alive.
            let fib4 = if skip4 { &old.fib4 } else { &desired.fib4 };
            let fib6 = if skip6 { &old.fib6 } else { &desired.fib6 };
            let used_groups: BTreeSet<u32> = group_refs(fib4.values())
                .into_iter()
                .chain(group_refs(fib6.values()))
                .collect();
            let mut kept_groups = Vec::new();
            for (id, g) in &old.groups {
                if desired.groups.contains_key(id) {
                    continue;
                }
                if used_groups.contains(id) {
                    kept_groups.push(g);
                } else {
                    ops.push(Op::DeleteGroup(*id));
                }
            }
            let mut used: HashSet<u32> = HashSet::new();
            used.extend(nh_refs(fib4.values()));
            used.extend(nh_refs(fib6.values()));
            for g in desired.groups.values().chain(kept_groups) {
                used.extend(g.paths.iter().map(|p| p.nh_id));
            }
            used.extend(desired.res_buckets.values().copied());
            for id in old.nexthops.keys() {
                if !desired.nexthops.contains_key(id) && !used.contains(id) {
                    ops.push(Op::DeleteNexthop(*id));
                }
            }
        }
        if !iface_over {
            deletes(&old.ifaces, &desired.ifaces, &mut ops, |k| {
                Op::DeleteIface(*k)
            });
        }

        if new_sw != written {
            ops.push(Op::SetSwitches(new_sw));
        }
        if (!ops.is_empty() && !adds_neighbours_only(old, &ops)) || self.dirty {
            ops.push(Op::BumpGeneration);
        }
        ops
    }

    /// Plans and applies; returns how many ops were applied.
    pub fn apply<W: TableWriter>(
        &mut self,
        desired: &Desired,
        w: &mut W,
    ) -> Result<usize, ReconcileError<W::Error>> {
        let ops = self.plan(desired);
        self.run(ops, w)
    }

    fn run<W: TableWriter>(&mut self, ops: Vec<Op>, w: &mut W) -> Result<usize, ReconcileError<W::Error>> {
        let (n, res) = w.apply_many(&ops);
        let n = n.min(ops.len());
        for op in &ops[..n] {
            self.record(op);
        }
        if let Err(source) = res {
            log::debug!("reconcile stopped after {n} of {} ops", ops.len());
            // A writer that failed without a failing op broke the contract;
            // report the last op rather than panic.
            let op = ops.get(n).or(ops.last()).cloned().unwrap_or(Op::BumpGeneration);
            return Err(ReconcileError { op, source });
        }
        Ok(ops.len())
    }

    /// Writes FIB changes with the next hops, groups and source-deny
    /// entries they bring or retire, or neighbour or interface entries, alone
    /// (`route_delta::fib_delta`, `neigh_delta::neigh_delta`, which checked
    /// that nothing else moves),
    /// in the order `plan` would write them, then
    /// bumps the generation: the same ops as `apply` with the desired state
    /// the delta stands for, without walking a million-route table.
    pub fn apply_fib_delta<W: TableWriter>(
        &mut self,
        delta: &crate::route_delta::FibDelta,
        w: &mut W,
    ) -> Result<usize, ReconcileError<W::Error>> {
        let (old4, new4) = sides(&self.applied.fib4, &delta.v4);
        let (old6, new6) = sides(&self.applied.fib6, &delta.v6);
        let (old_deny, new_deny) = sides(&self.applied.src_deny4, &delta.deny4);
        let (old_neigh, new_neigh) = sides(&self.applied.neigh, &delta.neigh);
        let (old_nh, new_nh) = sides(&self.applied.nexthops, &delta.nexthops);
        let (old_groups, new_groups) = sides(&self.applied.groups, &delta.groups);
        let old_ifaces = held(&self.applied.ifaces, delta.ifaces.keys());
        // As `plan` orders them: neighbours in before routes, out after,
        // or out first when old and new together would not fit.
        let added = new_neigh.keys().filter(|k| !self.applied.neigh.contains_key(k)).count();
        let neigh_tight = self.caps.as_ref().is_some_and(|c| self.applied.neigh.len() + added > c.neigh as usize);
        let mut ops = Vec::new();
        // As `plan`: interfaces, next hops, neighbours, then groups in before
        // any route can point at them; out again in reverse after the routes.
        upserts(&old_ifaces, &delta.ifaces, &mut ops, |k, v| Op::UpsertIface(*k, v.clone()));
        upserts(&old_nh, &new_nh, &mut ops, |k, v| Op::UpsertNexthop(*k, v.clone()));
        if neigh_tight {
            deletes(&old_neigh, &new_neigh, &mut ops, |k| Op::DeleteNeigh(*k));
        }
        upserts(&old_neigh, &new_neigh, &mut ops, |k, v| Op::UpsertNeigh(*k, *v));
        upserts(&old_groups, &new_groups, &mut ops, |k, v| Op::UpsertGroup(*k, v.clone()));
        upserts(&old_deny, &new_deny, &mut ops, |k, v| Op::UpsertSrcDeny4(*k, *v));
        fib_ops(&old4, &new4, false, &mut ops, Op::UpsertRoute4, Op::DeleteRoute4);
        fib_ops(&old6, &new6, false, &mut ops, Op::UpsertRoute6, Op::DeleteRoute6);
        deletes(&old_deny, &new_deny, &mut ops, |k| Op::DeleteSrcDeny4(*k));
        if !neigh_tight {
            deletes(&old_neigh, &new_neigh, &mut ops, |k| Op::DeleteNeigh(*k));
        }
        deletes(&old_groups, &new_groups, &mut ops, |k| Op::DeleteGroup(*k));
        deletes(&old_nh, &new_nh, &mut ops, |k| Op::DeleteNexthop(*k));
        if (!ops.is_empty() && !adds_neighbours_only(&self.applied, &ops)) || self.dirty {
            ops.push(Op::BumpGeneration);
        }
        self.run(ops, w)
    }

    /// Writes switches and interface entries that only take permission
    /// away (`iface_restrict`), ahead of the full recompute a link or rule
    /// change needs, then bumps the generation so cached flows go back
    /// through the checks. The shadow follows, so the recompute's plan
    /// writes them again if the change was undone meanwhile.
    pub fn apply_restrictions<W: TableWriter>(
        &mut self,
        switches: Option<Switches>,
        entries: &[(u32, IfaceEntry)],
        w: &mut W,
    ) -> Result<usize, ReconcileError<W::Error>> {
        let mut ops: Vec<Op> = switches.filter(|s| *s != self.applied.switches).map(Op::SetSwitches).into_iter().collect();
        ops.extend(
            entries
                .iter()
                .filter(|(k, v)| self.applied.ifaces.get(k).is_some_and(|old| old != v))
                .map(|(k, v)| Op::UpsertIface(*k, v.clone())),
        );
        if ops.is_empty() {
            return Ok(0);
        }
        ops.push(Op::BumpGeneration);
        self.run(ops, w)
    }

    /// What the maps hold now. `problems` is not part of the maps and stays empty.
    pub fn applied(&self) -> &Desired {
        &self.applied
    }

    /// Number of BumpGeneration ops applied so far.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Updates the shadow after `op` reached the maps.
    fn record(&mut self, op: &Op) {
        let a = &mut self.applied;
        match op {
            Op::SetSwitches(s) => a.switches = *s,
            Op::UpsertIface(k, v) => {
                a.ifaces.insert(*k, v.clone());
            }
            Op::DeleteIface(k) => {
                a.ifaces.remove(k);
            }
            Op::UpsertNexthop(k, v) => {
                a.nexthops.insert(*k, v.clone());
            }
            Op::DeleteNexthop(k) => {
                a.nexthops.remove(k);
            }
            Op::UpsertNeigh(k, v) => {
                // A new neighbour changes no cached result (adds_neighbours_only).
                if a.neigh.insert(*k, *v).is_none() {
                    return;
                }
            }
            Op::DeleteNeigh(k) => {
                a.neigh.remove(k);
            }
            Op::UpsertGroup(k, v) => {
                a.groups.insert(*k, v.clone());
            }
            Op::DeleteGroup(k) => {
                a.groups.remove(k);
            }
            Op::UpsertBucket(k, v) => {
                a.res_buckets.insert(*k, *v);
            }
            Op::DeleteBucket(k) => {
                a.res_buckets.remove(k);
            }
            Op::UpsertRoute4(addr, len, e) => {
                a.fib4.insert((*addr, *len), *e);
            }
            Op::DeleteRoute4(addr, len) => {
                a.fib4.remove(&(*addr, *len));
            }
            Op::UpsertRoute6(addr, len, e) => {
                a.fib6.insert((*addr, *len), *e);
            }
            Op::DeleteRoute6(addr, len) => {
                a.fib6.remove(&(*addr, *len));
            }
            Op::UpsertSrcDeny4(addr, reason) => {
                a.src_deny4.insert(*addr, *reason);
            }
            Op::DeleteSrcDeny4(addr) => {
                a.src_deny4.remove(addr);
            }
            Op::BumpGeneration => {
                self.generation += 1;
                self.dirty = false;
                return;
            }
        }
        self.dirty = true;
    }
}

/// Whether all `ops` write is entries for neighbours `applied` does not
/// hold: no cached flow can depend on them (the data path caches a forward
/// only with the neighbour it found; a packet that found none was punted),
/// so the flow caches stay valid. A router facing many hosts re-resolves
/// some all the time (an idle host's entry is garbage-collected, its next
/// packet resolves it again, an IPv6 host's link-local address appears),
/// and each bump would send every cached flow of every CPU back through
/// the full lookup. A changed MAC or a removed entry still bumps.
fn adds_neighbours_only(applied: &Desired, ops: &[Op]) -> bool {
    ops.iter().all(|op| matches!(op, Op::UpsertNeigh(k, _) if !applied.neigh.contains_key(k)))
}

/// One key of two sorted maps walked side by side.
enum Side<'a, K, V> {
    Old(&'a K),
    New(&'a K, &'a V),
    Both(&'a K, &'a V, &'a V),
}

/// Visits the union of both maps' keys in order. A merge walk instead of a
/// lookup per key: linear, which matters at a million routes.
fn walk<'a, K: Ord, V>(old: &'a BTreeMap<K, V>, new: &'a BTreeMap<K, V>, mut f: impl FnMut(Side<'a, K, V>)) {
    let mut o = old.iter().peekable();
    let mut n = new.iter().peekable();
    loop {
        match (o.peek(), n.peek()) {
            (None, None) => return,
            (Some((ok, _)), None) => {
                f(Side::Old(ok));
                o.next();
            }
            (None, Some((nk, nv))) => {
                f(Side::New(nk, nv));
                n.next();
            }
            (Some((ok, ov)), Some((nk, nv))) => match ok.cmp(nk) {
                std::cmp::Ordering::Less => {
                    f(Side::Old(ok));
                    o.next();
                }
                std::cmp::Ordering::Greater => {
                    f(Side::New(nk, nv));
                    n.next();
                }
                std::cmp::Ordering::Equal => {
                    f(Side::Both(nk, ov, nv));
                    o.next();
                    n.next();
                }
            },
        }
    }
}

fn union_len<K: Ord, V>(a: &BTreeMap<K, V>, b: &BTreeMap<K, V>) -> usize {
    let mut n = 0;
    walk(a, b, |_| n += 1);
    n
}

/// What the maps hold under `keys`.
fn held<'a, K: Ord + Copy + 'a, V: Clone>(applied: &BTreeMap<K, V>, keys: impl Iterator<Item = &'a K>) -> BTreeMap<K, V> {
    keys.filter_map(|k| applied.get(k).map(|v| (*k, v.clone()))).collect()
}

/// What the maps hold under a delta's keys, and what the delta writes
/// there (None: deleted).
fn sides<K: Ord + Copy, V: Clone>(applied: &BTreeMap<K, V>, delta: &BTreeMap<K, Option<V>>) -> (BTreeMap<K, V>, BTreeMap<K, V>) {
    let new = delta.iter().filter_map(|(k, v)| v.clone().map(|v| (*k, v))).collect();
    (held(applied, delta.keys()), new)
}

fn upserts<K: Ord, V: PartialEq>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
    ops: &mut Vec<Op>,
    op: impl Fn(&K, &V) -> Op,
) {
    walk(old, new, |side| match side {
        Side::New(k, v) => ops.push(op(k, v)),
        Side::Both(k, o, v) if o != v => ops.push(op(k, v)),
        _ => {}
    });
}

fn deletes<K: Ord, V>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
    ops: &mut Vec<Op>,
    op: impl Fn(&K) -> Op,
) {
    walk(old, new, |side| {
        if let Side::Old(k) = side {
            ops.push(op(k));
        }
    });
}

fn nh_refs<'a>(routes: impl Iterator<Item = &'a RouteEntry>) -> HashSet<u32> {
    routes
        .filter_map(|r| match r.action {
            RouteAction::Forward { nh_id } => Some(nh_id),
            _ => None,
        })
        .collect()
}

fn group_refs<'a>(routes: impl Iterator<Item = &'a RouteEntry>) -> Vec<u32> {
    routes
        .filter_map(|r| match r.action {
            RouteAction::Multipath { group } => Some(group),
            _ => None,
        })
        .collect()
}

/// Route writes for one family.
///
/// Upserts go longest prefix first, then deletes shortest prefix first.
/// With that order every address, at every step, resolves to the entry it
/// had before the plan or the one it has after it, never to a third one:
/// while upserting, any longer new prefix covering the address is already
/// written and any longer old one is still there; while deleting, every
/// longer old-only prefix is still there. (Upserting a /8 before the /16
/// inside it would briefly send the /16's traffic by the /8.)
///
/// `deletes_first`: old and new together would not fit the map, so the
/// family is punted during the rewrite and deletes make room first.
fn fib_ops<A: Ord + Copy>(
    old: &BTreeMap<(A, u8), RouteEntry>,
    new: &BTreeMap<(A, u8), RouteEntry>,
    deletes_first: bool,
    ops: &mut Vec<Op>,
    upsert: impl Fn(A, u8, RouteEntry) -> Op,
    delete: impl Fn(A, u8) -> Op,
) {
    let mut ups: Vec<(&(A, u8), &RouteEntry)> = Vec::new();
    let mut dels: Vec<&(A, u8)> = Vec::new();
    walk(old, new, |side| match side {
        Side::Old(k) => dels.push(k),
        Side::New(k, v) => ups.push((k, v)),
        Side::Both(k, o, v) if o != v => ups.push((k, v)),
        Side::Both(..) => {}
    });
    // Keys are unique, so an unstable sort gives the same order.
    ups.sort_unstable_by_key(|((a, len), _)| (Reverse(*len), *a));
    dels.sort_unstable_by_key(|(a, len)| (*len, *a));
    let ups = ups.into_iter().map(|((a, len), e)| upsert(*a, *len, *e));
    let dels = dels.into_iter().map(|(a, len)| delete(*a, *len));
    if deletes_first {
        ops.extend(dels);
        ops.extend(ups);
    } else {
        ops.extend(ups);
        ops.extend(dels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::plain_rule;
    use crate::desired::{compute, Ids};
    use crate::model::{
        Family, IfSysctl, KernelState, Link, Neighbour, NextHop, Route, RouteKey, RouteKind,
        RouteTarget, NUD_FAILED, NUD_REACHABLE,
    };
    use crate::tables::{IfaceEntry, NeighEntry, NeighKey, NexthopEntry};
    use std::collections::BTreeSet;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[derive(Debug, thiserror::Error)]
    #[error("injected failure")]
    struct Injected;

    /// The maps, in memory, checking every write against the invariants.
    #[derive(Default)]
    struct Mem {
        t: Desired,
        gen: u64,
        /// Fail the op with this index (counted over the Mem's life), once.
        fail_at: Option<usize>,
        n: usize,
        log: Vec<Op>,
        caps: Option<Capacities>,
        /// (before, after): every intermediate state must resolve each
        /// address like one of them, or punt.
        safety: Option<(Desired, Desired)>,
    }

    fn refs(t: &Desired, id: u32) -> bool {
        let f = |e: &RouteEntry| e.action == RouteAction::Forward { nh_id: id };
        t.fib4.values().any(f)
            || t.fib6.values().any(f)
            || t.groups.values().any(|g| g.paths.iter().any(|p| p.nh_id == id))
            || t.res_buckets.values().any(|n| *n == id)
    }

    fn group_refs(t: &Desired, id: u32) -> bool {
        let f = |e: &RouteEntry| e.action == RouteAction::Multipath { group: id };
        t.fib4.values().any(f) || t.fib6.values().any(f)
    }

    impl TableWriter for Mem {
        type Error = Injected;
        fn apply(&mut self, op: &Op) -> Result<(), Injected> {
            if self.fail_at == Some(self.n) {
                self.fail_at = None;
                self.n += 1;
                return Err(Injected);
            }
            self.n += 1;
            let t = &mut self.t;
            match op {
                Op::UpsertRoute4(_, _, e) | Op::UpsertRoute6(_, _, e) => {
                    if let RouteAction::Forward { nh_id } = e.action {
                        assert!(
                            t.nexthops.contains_key(&nh_id),
                            "{op:?} before its next hop"
                        );
                    }
                    if let RouteAction::Multipath { group } = e.action {
                        assert!(t.groups.contains_key(&group), "{op:?} before its group");
                        if let Some(after) = self.safety.as_ref().map(|s| &s.1) {
                            // A resilient group's buckets are complete before a route uses it.
                            for (k, v) in after.res_buckets.range(group << 16..(group + 1) << 16) {
                                assert_eq!(t.res_buckets.get(k), Some(v), "{op:?} before bucket {k:#x}");
                            }
                        }
                    }
                }
                Op::UpsertGroup(id, g) => {
                    if let Some(old) = t.groups.get(id) {
                        assert_eq!(old, g, "group {id} rewritten in place");
                    }
                    for p in &g.paths {
                        assert!(p.nh_id == 0 || t.nexthops.contains_key(&p.nh_id), "{op:?} before next hop {}", p.nh_id);
                    }
                    assert!(*id != 0);
                }
                Op::DeleteGroup(id) => assert!(!group_refs(t, *id), "{op:?} while a route uses it"),
                Op::UpsertBucket(k, nh) => {
                    assert!(t.groups.contains_key(&(k >> 16)), "{op:?} before its group");
                    assert!(t.nexthops.contains_key(nh), "{op:?} before its next hop");
                }
                Op::DeleteNexthop(id) => assert!(!refs(t, *id), "{op:?} while a route uses it"),
                Op::UpsertNexthop(id, e) => {
                    if let Some(old) = t.nexthops.get(id) {
                        assert_eq!(old, e, "next hop {id} re-pointed");
                    }
                    assert!(*id != 0);
                }
                _ => {}
            }
            // Same bookkeeping as the shadow, done independently.
            match op {
                Op::SetSwitches(s) => t.switches = *s,
                Op::UpsertIface(k, v) => drop(t.ifaces.insert(*k, v.clone())),
                Op::DeleteIface(k) => assert!(t.ifaces.remove(k).is_some(), "{op:?}: absent"),
                Op::UpsertNexthop(k, v) => drop(t.nexthops.insert(*k, v.clone())),
                Op::DeleteNexthop(k) => assert!(t.nexthops.remove(k).is_some(), "{op:?}: absent"),
                Op::UpsertNeigh(k, v) => drop(t.neigh.insert(*k, *v)),
                Op::DeleteNeigh(k) => assert!(t.neigh.remove(k).is_some(), "{op:?}: absent"),
                Op::UpsertGroup(k, v) => drop(t.groups.insert(*k, v.clone())),
                Op::DeleteGroup(k) => assert!(t.groups.remove(k).is_some(), "{op:?}: absent"),
                Op::UpsertBucket(k, v) => drop(t.res_buckets.insert(*k, *v)),
                Op::DeleteBucket(k) => assert!(t.res_buckets.remove(k).is_some(), "{op:?}: absent"),
                Op::UpsertRoute4(a, l, e) => drop(t.fib4.insert((*a, *l), *e)),
                Op::DeleteRoute4(a, l) => {
                    assert!(t.fib4.remove(&(*a, *l)).is_some(), "{op:?}: absent")
                }
                Op::UpsertRoute6(a, l, e) => drop(t.fib6.insert((*a, *l), *e)),
                Op::DeleteRoute6(a, l) => {
                    assert!(t.fib6.remove(&(*a, *l)).is_some(), "{op:?}: absent")
                }
                Op::UpsertSrcDeny4(a, r) => drop(t.src_deny4.insert(*a, *r)),
                Op::DeleteSrcDeny4(a) => {
                    assert!(t.src_deny4.remove(a).is_some(), "{op:?}: absent")
                }
                Op::BumpGeneration => self.gen += 1,
            }
            if let Some(c) = &self.caps {
                assert!(
                    t.fib4.len() <= c.fib4 as usize,
                    "fib4 over capacity after {op:?}"
                );
                assert!(
                    t.fib6.len() <= c.fib6 as usize,
                    "fib6 over capacity after {op:?}"
                );
                assert!(
                    t.neigh.len() <= c.neigh as usize,
                    "neigh over capacity after {op:?}"
                );
                assert!(
                    t.src_deny4.len() <= c.fib4 as usize,
                    "src_deny4 over capacity after {op:?}"
                );
                assert!(
                    t.res_buckets.len() <= c.buckets as usize,
                    "buckets over capacity after {op:?}"
                );
            }
            if let Some((before, after)) = &self.safety {
                check_safe(before, &self.t, after, op);
            }
            self.log.push(op.clone());
            Ok(())
        }
    }

    /// Where a packet may go: one next hop, or a group resolved to next
    /// hops (per path and per bucket; None = that path or bucket punts).
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Way {
        One(NexthopEntry),
        Group {
            paths: Vec<(i32, Option<NexthopEntry>)>,
            buckets: Vec<Option<NexthopEntry>>,
        },
    }

    /// What the data plane does with a packet to `addr`: None = punt.
    fn decide(t: &Desired, addr: IpAddr) -> Option<(Way, u32)> {
        let fam = Family::of(&addr);
        if (t.switches.table_full | t.switches.policy_punt) & fam.bit() != 0 {
            return None;
        }
        let entry = match addr {
            IpAddr::V4(a) => {
                let x = u32::from(a);
                (0..=32u8).rev().find_map(|l| {
                    let m = if l == 0 {
                        0
                    } else {
                        x & (u32::MAX << (32 - l))
                    };
                    t.fib4.get(&(Ipv4Addr::from(m), l))
                })
            }
            IpAddr::V6(a) => {
                let x = u128::from(a);
                (0..=128u8).rev().find_map(|l| {
                    let m = if l == 0 {
                        0
                    } else {
                        x & (u128::MAX << (128 - u32::from(l)))
                    };
                    t.fib6.get(&(Ipv6Addr::from(m), l))
                })
            }
        }?;
        let nh = |id: u32| {
            (id != 0).then(|| t.nexthops.get(&id).expect("dangling nh id").clone())
        };
        match entry.action {
            RouteAction::Forward { nh_id } => Some((Way::One(nh(nh_id)?), entry.mtu)),
            RouteAction::Multipath { group } => {
                let g = t.groups.get(&group).expect("dangling group id");
                let buckets = (0..g.n_buckets)
                    .map(|i| t.res_buckets.get(&crate::tables::bucket_key(group, i)).and_then(|id| nh(*id)))
                    .collect();
                let paths = g.paths.iter().map(|p| (p.upper_bound, nh(p.nh_id))).collect();
                Some((Way::Group { paths, buckets }, entry.mtu))
            }
            _ => None,
        }
    }

    /// `now` is what a packet might see mid-plan: old or new as a whole, or
    /// for resilient buckets, each bucket old or new (they change one by one
    /// in place, as the kernel's do), or punted.
    fn old_or_new(now: &(Way, u32), before: Option<&(Way, u32)>, after: Option<&(Way, u32)>) -> bool {
        if Some(now) == before || Some(now) == after {
            return true;
        }
        let (Way::Group { paths, buckets }, mtu) = now else { return false };
        [before, after].into_iter().flatten().any(|(w, m)| match w {
            Way::Group { paths: p, .. } if p == paths && m == mtu => buckets.iter().enumerate().all(|(i, b)| {
                let at = |x: Option<&(Way, u32)>| match x {
                    Some((Way::Group { paths: p, buckets: bs }, _)) if p == paths => bs.get(i).cloned().flatten(),
                    _ => None,
                };
                b.is_none() || *b == at(before) || *b == at(after)
            }),
            _ => false,
        })
    }

    /// What the data plane does with an IPv4 source on an ingress with
    /// rp_filter off (fp_ip4_rpf_reason): true = accepted.
    fn src_accepts(t: &Desired, a: Ipv4Addr) -> bool {
        if t.switches.src_lpm & V4 == 0 {
            return !t.src_deny4.contains_key(&a);
        }
        src_lpm_accepts(t, a)
    }

    /// The full check (fib_validate_source) against the FIB of `t`.
    fn src_lpm_accepts(t: &Desired, a: Ipv4Addr) -> bool {
        let x = u32::from(a);
        let hit = (0..=32u8).rev().find_map(|l| {
            let m = if l == 0 { 0 } else { x & (u32::MAX << (32 - l)) };
            t.fib4.get(&(Ipv4Addr::from(m), l))
        });
        match hit.map(|e| e.action) {
            None | Some(RouteAction::Forward { .. }) | Some(RouteAction::Multipath { .. }) => true,
            Some(RouteAction::Punt { reason }) => reason == crate::desired::reason::ECMP,
            Some(_) => false,
        }
    }

    fn lpm_hit_is_table_full(t: &Desired, a: Ipv4Addr) -> bool {
        let x = u32::from(a);
        let hit = (0..=32u8).rev().find_map(|l| {
            let m = if l == 0 { 0 } else { x & (u32::MAX << (32 - l)) };
            t.fib4.get(&(Ipv4Addr::from(m), l))
        });
        hit.map(|e| e.action) == Some(RouteAction::Punt { reason: crate::desired::reason::TABLE_FULL })
    }

    /// Addresses around every prefix of `t`: first, second, last, one past the last.
    fn probes(t: &Desired, out: &mut BTreeSet<IpAddr>) {
        for a in t.src_deny4.keys() {
            out.insert(IpAddr::V4(*a));
        }
        for (a, l) in t.fib4.keys() {
            let x = u32::from(*a);
            let last = if *l == 0 {
                u32::MAX
            } else {
                x | u32::MAX.checked_shr(u32::from(*l)).unwrap_or(0)
            };
            for y in [x, x.wrapping_add(1), last, last.wrapping_add(1)] {
                out.insert(IpAddr::V4(Ipv4Addr::from(y)));
            }
        }
        for (a, l) in t.fib6.keys() {
            let x = u128::from(*a);
            let last = if *l == 0 {
                u128::MAX
            } else {
                x | u128::MAX.checked_shr(u32::from(*l)).unwrap_or(0)
            };
            for y in [x, x.wrapping_add(1), last, last.wrapping_add(1)] {
                out.insert(IpAddr::V6(Ipv6Addr::from(y)));
            }
        }
    }

    fn check_safe(before: &Desired, now: &Desired, after: &Desired, op: &Op) {
        let mut addrs = BTreeSet::new();
        probes(before, &mut addrs);
        probes(after, &mut addrs);
        for a in addrs {
            let Some(d) = decide(now, a) else { continue };
            let ok = old_or_new(&d, decide(before, a).as_ref(), decide(after, a).as_ref());
            assert!(
                ok,
                "after {op:?}: {a} forwarded via {d:?}, neither before nor after"
            );
        }
        // Sources: in hash mode the deny set is written early and deleted
        // late, so it refuses whatever the FIB written at this moment
        // refuses, and like a destination each source is decided as before
        // or as after; in LPM mode the written FIB gives old-or-new per
        // address. Sources the data path punts by class
        // before any lookup are not probed.
        let mut srcs = BTreeSet::new();
        probes(before, &mut srcs);
        probes(after, &mut srcs);
        if (now.switches.table_full | now.switches.policy_punt) & V4 != 0 {
            return;
        }
        for a in srcs {
            let IpAddr::V4(a) = a else { continue };
            let o = a.octets();
            if o[0] == 0 || o[0] == 127 || o[0] >= 224 || (o[0] == 169 && o[1] == 254) {
                continue;
            }
            if !src_accepts(now, a) {
                continue;
            }
            let (b, f) = (src_accepts(before, a), src_accepts(after, a));
            if now.switches.src_lpm & V4 == 0 {
                // A table-full punt stands for routes the FIB could not
                // hold; the deny set follows the kernel's full FIB there.
                let w = src_lpm_accepts(now, a) || lpm_hit_is_table_full(now, a);
                assert!(w && (b || f), "after {op:?}: source {a} accepted by the deny set, refused by the written FIB ({w}) or before ({b}) and after ({f})");
            } else {
                assert!(b || f, "after {op:?}: source {a} accepted by LPM, refused before and after");
            }
        }
    }

    // ---- hand-made tables ----

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn fw(nh_id: u32) -> RouteEntry {
        RouteEntry {
            action: RouteAction::Forward { nh_id },
            mtu: 0,
        }
    }

    fn nhe(ifindex: u32) -> NexthopEntry {
        NexthopEntry {
            ifindex,
            gateway: None,
        }
    }

    fn iface(slot: u32) -> IfaceEntry {
        IfaceEntry {
            mac: [2, 0, 0, 0, 0, slot as u8],
            flags: 7,
            mtu: 1500,
            mtu6: 1500,
            slot,
        }
    }

    fn nk(ifindex: u32, a: &str) -> NeighKey {
        NeighKey {
            ifindex,
            addr: a.parse().unwrap(),
        }
    }

    fn full() -> Desired {
        let mut d = Desired::default();
        d.ifaces.insert(2, iface(1));
        d.ifaces.insert(3, iface(2));
        d.nexthops.insert(1, nhe(2));
        d.nexthops.insert(
            2,
            NexthopEntry {
                ifindex: 3,
                gateway: Some("203.0.113.1".parse().unwrap()),
            },
        );
        d.neigh.insert(
            nk(2, "192.0.2.5"),
            NeighEntry {
                mac: [2, 1, 1, 1, 1, 1],
            },
        );
        d.neigh.insert(
            nk(3, "203.0.113.1"),
            NeighEntry {
                mac: [2, 1, 1, 1, 1, 2],
            },
        );
        d.fib4.insert((v4("192.0.2.0"), 24), fw(1));
        d.fib4.insert((v4("0.0.0.0"), 0), fw(2));
        d.fib4.insert(
            (v4("192.0.2.1"), 32),
            RouteEntry {
                action: RouteAction::Local,
                mtu: 0,
            },
        );
        d.src_deny4
            .insert(v4("192.0.2.1"), crate::desired::reason::MARTIAN);
        d.fib6.insert((v6("2001:db8:1::"), 64), fw(1));
        d.fib6.insert((v6("::"), 0), fw(2));
        d
    }

    fn pos(ops: &[Op], f: impl Fn(&Op) -> bool) -> Vec<usize> {
        ops.iter()
            .enumerate()
            .filter(|(_, o)| f(o))
            .map(|(i, _)| i)
            .collect()
    }

    fn is_route(o: &Op) -> bool {
        matches!(
            o,
            Op::UpsertRoute4(..)
                | Op::UpsertRoute6(..)
                | Op::DeleteRoute4(..)
                | Op::DeleteRoute6(..)
        )
    }

    fn tables_eq(a: &Desired, b: &Desired) -> bool {
        a.ifaces == b.ifaces
            && a.fib4 == b.fib4
            && a.fib6 == b.fib6
            && a.nexthops == b.nexthops
            && a.neigh == b.neigh
            && a.src_deny4 == b.src_deny4
            && a.groups == b.groups
            && a.res_buckets == b.res_buckets
            && a.switches == b.switches
    }

    /// Applies `want` with every invariant checked; returns the ops.
    fn step(r: &mut Reconciler, m: &mut Mem, want: &Desired) -> Vec<Op> {
        m.log.clear();
        m.safety = Some((r.applied().clone(), want.clone()));
        let n = r.apply(want, m).expect("apply");
        assert_eq!(n, m.log.len());
        assert!(tables_eq(&m.t, r.applied()));
        assert_eq!(m.gen, r.generation());
        m.log.clone()
    }

    #[test]
    fn empty_to_full_to_empty() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let want = full();
        let ops = step(&mut r, &mut m, &want);
        assert!(tables_eq(r.applied(), &want));
        assert_eq!(r.generation(), 1);
        let last = |f: fn(&Op) -> bool| *pos(&ops, f).last().unwrap();
        let first = |f: fn(&Op) -> bool| pos(&ops, f)[0];
        assert!(
            last(|o| matches!(o, Op::UpsertIface(..)))
                < first(|o| matches!(o, Op::UpsertNexthop(..)))
        );
        assert!(
            last(|o| matches!(o, Op::UpsertNexthop(..)))
                < first(|o| matches!(o, Op::UpsertNeigh(..)))
        );
        assert!(last(|o| matches!(o, Op::UpsertNeigh(..))) < first(is_route));
        assert!(first(|o| matches!(o, Op::UpsertSrcDeny4(..))) < first(is_route));
        assert_eq!(ops.last(), Some(&Op::BumpGeneration));
        assert_eq!(ops.len(), 2 + 2 + 2 + 1 + 5 + 1);
        assert!(!ops.iter().any(|o| matches!(o, Op::SetSwitches(_))));

        assert!(
            r.plan(&want).is_empty(),
            "converged: nothing to do, no bump"
        );

        let ops = step(&mut r, &mut m, &Desired::default());
        assert!(tables_eq(r.applied(), &Desired::default()));
        assert_eq!(r.generation(), 2);
        let last_route = *pos(&ops, is_route).last().unwrap();
        for i in pos(&ops, |o| {
            matches!(
                o,
                Op::DeleteNexthop(_) | Op::DeleteNeigh(_) | Op::DeleteIface(_) | Op::DeleteSrcDeny4(_)
            )
        }) {
            assert!(i > last_route, "{:?} before the routes were gone", ops[i]);
        }
        assert_eq!(ops.last(), Some(&Op::BumpGeneration));
        assert!(r.plan(&Desired::default()).is_empty());
    }

    #[test]
    fn repointing_a_route() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let mut want = full();
        step(&mut r, &mut m, &want);
        // 192.0.2.0/24 moves to a new next hop 3; next hop 1 still used by v6
        want.nexthops.insert(3, nhe(3));
        want.fib4.insert((v4("192.0.2.0"), 24), fw(3));
        let ops = step(&mut r, &mut m, &want);
        assert_eq!(
            ops,
            vec![
                Op::UpsertNexthop(3, nhe(3)),
                Op::UpsertRoute4(v4("192.0.2.0"), 24, fw(3)),
                Op::BumpGeneration
            ]
        );
        // the v6 route follows; next hop 1 is then unused
        want.fib6.insert((v6("2001:db8:1::"), 64), fw(3));
        want.nexthops.remove(&1);
        let ops = step(&mut r, &mut m, &want);
        assert_eq!(
            ops,
            vec![
                Op::UpsertRoute6(v6("2001:db8:1::"), 64, fw(3)),
                Op::DeleteNexthop(1),
                Op::BumpGeneration
            ]
        );
        // a MAC change and an iface change are plain upserts
        want.neigh.insert(
            nk(2, "192.0.2.5"),
            NeighEntry {
                mac: [2, 9, 9, 9, 9, 9],
            },
        );
        want.ifaces.get_mut(&3).unwrap().flags = 0;
        let ops = step(&mut r, &mut m, &want);
        assert_eq!(ops.len(), 3);
        assert!(matches!(ops[0], Op::UpsertIface(3, _)));
        assert!(matches!(ops[1], Op::UpsertNeigh(..)));
    }

    #[test]
    fn a_new_neighbour_alone_keeps_the_generation() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let mut want = full();
        step(&mut r, &mut m, &want);
        let gen = r.generation();
        let mac = |b| NeighEntry { mac: [2, 0, 0, 0, 0, b] };

        // Full plan and delta alike: the entry is written, nothing bumps,
        // and nothing is left owed to the next plan.
        want.neigh.insert(nk(2, "192.0.2.77"), mac(1));
        assert_eq!(step(&mut r, &mut m, &want), vec![Op::UpsertNeigh(nk(2, "192.0.2.77"), mac(1))]);
        assert_eq!(r.generation(), gen);
        assert!(r.plan(&want).is_empty(), "no bump owed");
        let d = crate::route_delta::FibDelta { neigh: [(nk(2, "fe80::1"), Some(mac(2)))].into(), ..Default::default() };
        r.apply_fib_delta(&d, &mut m).unwrap();
        assert!(tables_eq(&m.t, r.applied()) && r.applied().neigh.contains_key(&nk(2, "fe80::1")));
        assert_eq!((r.generation(), m.gen), (gen, gen));
        want.neigh.insert(nk(2, "fe80::1"), mac(2));
        assert!(r.plan(&want).is_empty());

        // A cached flow may hold these: a MAC change and a removal bump.
        want.neigh.insert(nk(2, "192.0.2.77"), mac(3));
        assert_eq!(step(&mut r, &mut m, &want).last(), Some(&Op::BumpGeneration));
        assert_eq!(r.generation(), gen + 1);
        want.neigh.remove(&nk(2, "fe80::1"));
        assert_eq!(step(&mut r, &mut m, &want).last(), Some(&Op::BumpGeneration));
        assert_eq!(r.generation(), gen + 2);
        // So does a new neighbour that comes with anything else.
        want.neigh.insert(nk(2, "192.0.2.78"), mac(4));
        want.ifaces.get_mut(&3).unwrap().flags = 0;
        assert_eq!(step(&mut r, &mut m, &want).last(), Some(&Op::BumpGeneration));
        assert_eq!(r.generation(), gen + 3);
    }

    #[test]
    fn iface_restrictions_write_ahead_and_the_shadow_follows() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let want = full();
        step(&mut r, &mut m, &want);
        let gen = r.generation();
        let mut down = want.ifaces[&3].clone();
        down.flags &= !1;
        m.log.clear();
        // Unchanged entries and unknown interfaces write nothing, not even a bump.
        let same = [(2, want.ifaces[&2].clone()), (9, iface(9))];
        assert_eq!(r.apply_restrictions(None, &same, &mut m).expect("apply"), 0);
        assert!(m.log.is_empty() && r.generation() == gen);
        r.apply_restrictions(None, &[(3, down.clone())], &mut m).expect("apply");
        assert_eq!(m.log, vec![Op::UpsertIface(3, down.clone()), Op::BumpGeneration]);
        assert!(tables_eq(&m.t, r.applied()) && r.generation() == gen + 1);
        // The link came back before the recompute: its plan restores the entry.
        assert_eq!(step(&mut r, &mut m, &want), vec![Op::UpsertIface(3, want.ifaces[&3].clone()), Op::BumpGeneration]);
        // Switches first, so the family is punted before anything else moves.
        let sw = Switches { policy_punt: 1, ..want.switches };
        m.log.clear();
        r.apply_restrictions(Some(sw), &[(3, down.clone())], &mut m).expect("apply");
        assert_eq!(m.log, vec![Op::SetSwitches(sw), Op::UpsertIface(3, down), Op::BumpGeneration]);
        assert_eq!(r.applied().switches, sw);
        assert!(step(&mut r, &mut m, &want).contains(&Op::SetSwitches(want.switches)));
    }

    #[test]
    fn nested_prefixes_change_longest_first_delete_shortest_first() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let mut old = Desired::default();
        for i in 1..=4 {
            old.nexthops.insert(i, nhe(i));
        }
        old.fib4.insert((v4("0.0.0.0"), 0), fw(1));
        old.fib4.insert((v4("172.16.0.0"), 12), fw(2));
        old.fib4.insert((v4("172.16.5.0"), 24), fw(3));
        step(&mut r, &mut m, &old);
        let mut new = old.clone();
        new.fib4.insert((v4("10.0.0.0"), 8), fw(2));
        new.fib4.insert((v4("10.1.0.0"), 16), fw(3));
        new.fib4.insert((v4("10.1.2.0"), 24), fw(4));
        new.fib4.remove(&(v4("172.16.0.0"), 12));
        new.fib4.remove(&(v4("172.16.5.0"), 24));
        // the safety checker in Mem verifies every intermediate state
        let ops = step(&mut r, &mut m, &new);
        assert_eq!(
            ops,
            vec![
                Op::UpsertRoute4(v4("10.1.2.0"), 24, fw(4)),
                Op::UpsertRoute4(v4("10.1.0.0"), 16, fw(3)),
                Op::UpsertRoute4(v4("10.0.0.0"), 8, fw(2)),
                Op::DeleteRoute4(v4("172.16.0.0"), 12),
                Op::DeleteRoute4(v4("172.16.5.0"), 24),
                Op::BumpGeneration,
            ]
        );
    }

    #[test]
    fn switches_first_when_punting_last_when_unpunting() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let base = full();
        step(&mut r, &mut m, &base);

        let mut punt4 = base.clone();
        punt4.switches.policy_punt = 1;
        punt4.fib4.remove(&(v4("192.0.2.1"), 32));
        let ops = step(&mut r, &mut m, &punt4);
        assert_eq!(
            ops[0],
            Op::SetSwitches(Switches {
                table_full: 0,
                policy_punt: 1,
                src_lpm: 0,
                ..Default::default()
            })
        );
        assert_eq!(pos(&ops, |o| matches!(o, Op::SetSwitches(_))).len(), 1);
        assert_eq!(ops.last(), Some(&Op::BumpGeneration));

        // v4 un-punted, v6 punted at the same time: union first, final last
        let mut punt6 = base.clone();
        punt6.switches.policy_punt = 2;
        let ops = step(&mut r, &mut m, &punt6);
        assert_eq!(
            ops[0],
            Op::SetSwitches(Switches {
                table_full: 0,
                policy_punt: 3,
                src_lpm: 0,
                ..Default::default()
            })
        );
        assert_eq!(
            ops[ops.len() - 2],
            Op::SetSwitches(Switches {
                table_full: 0,
                policy_punt: 2,
                src_lpm: 0,
                ..Default::default()
            })
        );
        assert!(pos(&ops, is_route)[0] > 0);

        let ops = step(&mut r, &mut m, &base);
        assert_eq!(
            ops,
            vec![Op::SetSwitches(Switches::default()), Op::BumpGeneration]
        );
    }

    #[test]
    fn full_family_is_left_alone_until_it_fits() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let base = full();
        step(&mut r, &mut m, &base);

        // v4 overflows: its FIB is not touched, v6 and next hops are
        let mut big = base.clone();
        big.switches.table_full = 1;
        big.nexthops.insert(5, nhe(5));
        big.fib4.insert((v4("198.51.100.0"), 24), fw(5));
        big.fib4.insert((v4("203.0.113.0"), 24), fw(5));
        big.fib4.remove(&(v4("192.0.2.0"), 24));
        big.fib6.insert((v6("2001:db8:2::"), 64), fw(2));
        big.nexthops.remove(&1); // no longer wanted, but the stale v4 FIB still uses it
        big.fib6.remove(&(v6("2001:db8:1::"), 64));
        let ops = step(&mut r, &mut m, &big);
        assert_eq!(
            ops[0],
            Op::SetSwitches(Switches {
                table_full: 1,
                policy_punt: 0,
                src_lpm: 0,
                ..Default::default()
            })
        );
        assert!(!ops
            .iter()
            .any(|o| matches!(o, Op::UpsertRoute4(..) | Op::DeleteRoute4(..))));
        assert!(ops.contains(&Op::UpsertNexthop(5, nhe(5))));
        assert!(ops.contains(&Op::UpsertRoute6(v6("2001:db8:2::"), 64, fw(2))));
        assert!(
            !ops.contains(&Op::DeleteNexthop(1)),
            "still referenced by the written v4 FIB"
        );
        assert!(m.t.nexthops.contains_key(&1));
        // nothing changes while it stays full
        assert!(r.plan(&big).is_empty());

        // it fits again: all pending v4 ops, the stale next hop, the switch last
        let mut fits = big.clone();
        fits.switches.table_full = 0;
        let ops = step(&mut r, &mut m, &fits);
        assert!(tables_eq(r.applied(), &fits));
        assert_eq!(ops[ops.len() - 2], Op::SetSwitches(Switches::default()));
        let del1 = pos(&ops, |o| *o == Op::DeleteNexthop(1))[0];
        assert!(del1 > *pos(&ops, is_route).last().unwrap());
    }

    #[test]
    fn both_families_full_holds_l2_tables() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        step(&mut r, &mut m, &full());
        let mut over = full();
        over.switches.table_full = 3;
        over.nexthops.insert(9, nhe(9));
        over.neigh
            .insert(nk(2, "192.0.2.9"), NeighEntry { mac: [2; 6] });
        over.neigh.remove(&nk(3, "203.0.113.1"));
        over.ifaces.get_mut(&2).unwrap().mtu = 9000;
        let ops = step(&mut r, &mut m, &over);
        assert_eq!(
            ops,
            vec![
                Op::SetSwitches(Switches {
                    table_full: 3,
                    policy_punt: 0,
                    src_lpm: 0,
                    ..Default::default()
                }),
                Op::UpsertIface(2, over.ifaces[&2].clone()),
                Op::BumpGeneration
            ]
        );
        over.switches.table_full = 0;
        step(&mut r, &mut m, &over);
        assert!(tables_eq(r.applied(), &over));
    }

    #[test]
    fn failure_mid_apply_keeps_shadow_exact_and_retry_converges() {
        let before = full();
        let mut after = full();
        after.switches.policy_punt = 2;
        after.nexthops.remove(&1);
        after.nexthops.insert(4, nhe(4));
        after.fib4.insert((v4("192.0.2.0"), 24), fw(4));
        after.fib6.remove(&(v6("2001:db8:1::"), 64));
        after.neigh.remove(&nk(2, "192.0.2.5"));
        after.ifaces.remove(&3);
        let total = {
            let mut r = Reconciler::new();
            let mut m = Mem::default();
            step(&mut r, &mut m, &before);
            r.plan(&after).len()
        };
        assert!(total > 5);
        for k in 0..total {
            let mut r = Reconciler::new();
            let mut m = Mem::default();
            step(&mut r, &mut m, &before);
            m.fail_at = Some(m.n + k);
            m.safety = Some((before.clone(), after.clone()));
            let err = r.apply(&after, &mut m).unwrap_err();
            assert_eq!(
                err.op,
                r.plan(&after)[0],
                "the failed op is the next one to retry"
            );
            assert!(
                tables_eq(&m.t, r.applied()),
                "shadow differs from the maps after failing op {k}"
            );
            assert_eq!(r.generation(), 1);
            // retry converges with exactly one more bump
            step(&mut r, &mut m, &after);
            assert!(tables_eq(r.applied(), &after), "op {k}");
            assert_eq!(r.generation(), 2, "op {k}");
            assert!(r.plan(&after).is_empty());
        }
    }

    #[test]
    fn forced_bump_with_nothing_to_write() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let want = full();
        r.apply(&want, &mut m).expect("apply");
        assert!(r.plan(&want).is_empty());
        r.force_bump();
        assert_eq!(r.plan(&want), vec![Op::BumpGeneration]);
        r.apply(&want, &mut m).expect("apply");
        assert_eq!(r.generation(), 2);
        assert!(r.plan(&want).is_empty());
    }

    #[test]
    fn failed_bump_is_retried() {
        let mut r = Reconciler::new();
        let mut m = Mem::default();
        let want = full();
        let n = r.plan(&want).len();
        m.fail_at = Some(n - 1);
        assert!(matches!(
            r.apply(&want, &mut m),
            Err(ReconcileError {
                op: Op::BumpGeneration,
                ..
            })
        ));
        assert!(tables_eq(r.applied(), &want));
        assert_eq!(r.generation(), 0);
        assert_eq!(r.plan(&want), vec![Op::BumpGeneration]);
        assert_eq!(r.apply(&want, &mut m).unwrap(), 1);
        assert_eq!(r.generation(), 1);
        assert!(r.plan(&want).is_empty());
    }

    #[test]
    fn tight_capacity_punts_family_during_rewrite() {
        let caps = Capacities {
            fib4: 3,
            fib6: 3,
            nexthops: 8,
            neigh: 2,
            ifaces: 4,
            groups: 64,
            buckets: 1024,
        };
        let mut r = Reconciler::with_capacities(caps);
        let mut m = Mem {
            caps: Some(caps),
            ..Mem::default()
        };
        let mut a = Desired::default();
        a.nexthops.insert(1, nhe(2));
        for i in 0..3 {
            a.fib4.insert((Ipv4Addr::new(10, i, 0, 0), 16), fw(1));
        }
        a.neigh
            .insert(nk(2, "192.0.2.1"), NeighEntry { mac: [1; 6] });
        a.neigh
            .insert(nk(2, "192.0.2.2"), NeighEntry { mac: [1; 6] });
        step(&mut r, &mut m, &a);
        let mut b = a.clone();
        b.fib4.remove(&(Ipv4Addr::new(10, 0, 0, 0), 16));
        b.fib4.insert((Ipv4Addr::new(10, 9, 0, 0), 16), fw(1));
        b.neigh.remove(&nk(2, "192.0.2.1"));
        b.neigh
            .insert(nk(2, "192.0.2.3"), NeighEntry { mac: [1; 6] });
        let ops = step(&mut r, &mut m, &b);
        assert_eq!(
            ops,
            vec![
                Op::SetSwitches(Switches {
                    table_full: 1,
                    policy_punt: 0,
                    src_lpm: 0,
                    ..Default::default()
                }),
                Op::DeleteNeigh(nk(2, "192.0.2.1")),
                Op::UpsertNeigh(nk(2, "192.0.2.3"), NeighEntry { mac: [1; 6] }),
                Op::DeleteRoute4(Ipv4Addr::new(10, 0, 0, 0), 16),
                Op::UpsertRoute4(Ipv4Addr::new(10, 9, 0, 0), 16, fw(1)),
                Op::SetSwitches(Switches::default()),
                Op::BumpGeneration,
            ]
        );
        // without capacity pressure the normal order is kept
        let mut c = b.clone();
        c.fib4.remove(&(Ipv4Addr::new(10, 9, 0, 0), 16));
        let ops = step(&mut r, &mut m, &c);
        assert_eq!(
            ops,
            vec![
                Op::DeleteRoute4(Ipv4Addr::new(10, 9, 0, 0), 16),
                Op::BumpGeneration
            ]
        );
    }

    #[test]
    fn too_many_interfaces_leaves_the_interface_map_alone() {
        let caps = Capacities {
            fib4: 10,
            fib6: 10,
            nexthops: 8,
            neigh: 8,
            ifaces: 1,
            groups: 64,
            buckets: 1024,
        };
        let mut r = Reconciler::with_capacities(caps);
        let mut m = Mem::default();
        let mut want = Desired::default();
        want.ifaces.insert(2, iface(1));
        want.ifaces.insert(3, iface(2));
        want.switches.table_full = 3;
        let ops = step(&mut r, &mut m, &want);
        assert_eq!(
            ops,
            vec![Op::SetSwitches(want.switches), Op::BumpGeneration]
        );
        want.ifaces.remove(&3);
        want.switches.table_full = 0;
        let ops = step(&mut r, &mut m, &want);
        assert_eq!(
            ops,
            vec![
                Op::UpsertIface(2, iface(1)),
                Op::SetSwitches(Switches::default()),
                Op::BumpGeneration
            ]
        );
    }

    // ---- randomized: compute + reconcile over a stream of kernel states ----

    use crate::xorshift::XorShift as Rng;

    const P4: &[(&str, u8)] = &[
        ("0.0.0.0", 0),
        ("10.0.0.0", 8),
        ("10.1.0.0", 16),
        ("10.1.2.0", 24),
        ("10.1.2.128", 25),
        ("10.1.2.130", 32),
        ("10.2.0.0", 16),
        ("192.0.2.0", 24),
        ("192.0.2.1", 32),
        ("198.51.100.0", 24),
        ("198.51.100.0", 23),
        ("203.0.113.64", 26),
    ];
    const P6: &[(&str, u8)] = &[
        ("::", 0),
        ("2001:db8::", 32),
        ("2001:db8:1::", 48),
        ("2001:db8:1:2::", 64),
        ("2001:db8:1:2::1", 128),
        ("2001:db8:2::", 48),
        ("2001:db8:1:8000::", 49),
    ];
    const GW4: &[Option<&str>] = &[
        None,
        Some("192.0.2.1"),
        Some("192.0.2.2"),
        Some("198.51.100.1"),
    ];
    const GW6: &[Option<&str>] = &[None, Some("fe80::1"), Some("fe80::2"), Some("2001:db8::1")];

    fn random_state(rng: &mut Rng) -> KernelState {
        let mut st = KernelState::default();
        for i in 2..=4u32 {
            st.links.insert(
                i,
                Link {
                    ifindex: i,
                    name: format!("eth{i}"),
                    mac: Some([2, 0, 0, 0, 0, i as u8]),
                    mtu: if rng.chance(20) { 9000 } else { 1500 },
                    admin_up: true,
                    running: !rng.chance(10),
                    arphrd: 1,
                    kind: None,
                    master: None,
                },
            );
            st.if_sysctl.insert(
                i,
                IfSysctl {
                    forwarding4: true,
                    forwarding6: true,
                    ..Default::default()
                },
            );
        }
        st.sysctl.forwarding6_all = true;
        st.sysctl.mp_seed = if rng.chance(90) { 7 } else { 0 };
        // Mostly hashed policies (0 to 3), now and then one that is punted
        // (4, which no kernel has yet).
        st.sysctl.mp_policy6 = if rng.chance(10) { 4 } else { rng.below(4) as u8 };
        st.sysctl.mp_fields6 = if rng.chance(50) { crate::mphash::FIELDS_DEFAULT } else { rng.below(0x40) as u32 };
        // Next-hop objects: 10..13 plain (both families), 20 hash-threshold, 21 resilient.
        for (id, gw) in [(10u32, "192.0.2.1"), (11, "198.51.100.1"), (12, "2001:db8::1"), (13, "fe80::1")] {
            st.nexthops.insert(
                id,
                crate::model::NexthopObject {
                    id,
                    blackhole: false,
                    hop: Some(NextHop { ifindex: 2 + rng.below(3) as u32, gateway: Some(gw.parse().unwrap()), flags: 0, weight: 1 }),
                    group: vec![],
                    resilient: false,
                    n_buckets: 0,
                    unsupported: false,
                },
            );
        }
        let members = |rng: &mut Rng| -> Vec<(u32, u32)> {
            let mut out = Vec::new();
            for id in 10..14u32 {
                if rng.chance(70) {
                    out.push((id, 1 + rng.below(3) as u32));
                }
            }
            out
        };
        let g20 = members(rng);
        let g21 = members(rng);
        for (id, g, res) in [(20u32, g20, false), (21, g21, true)] {
            if g.is_empty() {
                continue;
            }
            if res {
                let n = 4 + rng.below(4) as u16;
                let mut b = BTreeMap::new();
                for i in 0..n {
                    if rng.chance(90) {
                        b.insert(i, g[rng.below(g.len() as u64) as usize].0);
                    }
                }
                st.res_buckets.insert(id, b);
            }
            st.nexthops.insert(
                id,
                crate::model::NexthopObject {
                    id,
                    blackhole: false,
                    hop: None,
                    n_buckets: if res { st.res_buckets[&id].keys().max().map_or(4, |m| m + 1) } else { 0 },
                    group: g,
                    resilient: res,
                    unsupported: false,
                },
            );
        }
        let r = plain_rule;
        st.rules = vec![
            r(Family::V4, 0, 255),
            r(Family::V4, 32766, 254),
            r(Family::V4, 32767, 253),
            r(Family::V6, 0, 255),
            r(Family::V6, 32766, 254),
        ];
        if rng.chance(10) {
            st.rules.push(r(Family::V4, 100, 10));
        }
        if rng.chance(10) {
            st.rules.push(r(Family::V6, 100, 10));
        }
        let add = |st: &mut KernelState, fam: Family, dst: &str, len: u8, rng: &mut Rng| {
            let gws = if fam == Family::V4 { GW4 } else { GW6 };
            let gw = gws[rng.below(gws.len() as u64) as usize].map(|g| g.parse().unwrap());
            let table = if rng.chance(15) { 255 } else { 254 };
            let kind = match rng.below(20) {
                0 => RouteKind::Local,
                1 => RouteKind::Blackhole,
                2 => RouteKind::Unreachable,
                3 => RouteKind::Broadcast,
                _ => RouteKind::Unicast,
            };
            let hop = |rng: &mut Rng| {
                let gw = gws[rng.below(gws.len() as u64) as usize].map(|g| g.parse().unwrap());
                NextHop {
                    ifindex: 2 + rng.below(3) as u32,
                    gateway: gw,
                    flags: if rng.chance(5) { 1 } else { 0 },
                    weight: 1 + rng.below(3) as u32,
                }
            };
            let target = match rng.below(10) {
                0 | 1 => RouteTarget::Multipath((0..2 + rng.below(2)).map(|_| hop(rng)).collect()),
                2 => RouteTarget::Object(if rng.chance(50) { 20 } else { 21 }),
                _ => {
                    let mut h = hop(rng);
                    h.gateway = gw;
                    h.weight = 1;
                    RouteTarget::Single(h)
                }
            };
            let route = Route {
                key: RouteKey {
                    table,
                    dst: dst.parse().unwrap(),
                    prefix_len: len,
                    tos: 0,
                    priority: rng.below(3) as u32,
                },
                kind,
                target,
                mtu: if rng.chance(20) { 1400 } else { 0 },
                mtu_locked: false,
                encap: false,
                prefsrc: None,
            };
            st.routes.insert((fam, route.key.clone()), route);
        };
        for (dst, len) in P4 {
            if rng.chance(60) {
                add(&mut st, Family::V4, dst, *len, rng);
            }
        }
        for (dst, len) in P6 {
            if rng.chance(60) {
                add(&mut st, Family::V6, dst, *len, rng);
            }
        }
        for gw in GW4.iter().chain(GW6).flatten() {
            let addr: IpAddr = gw.parse().unwrap();
            let ifindex = 2 + rng.below(3) as u32;
            if rng.chance(70) {
                st.neighbours.insert(
                    (ifindex, addr),
                    Neighbour {
                        ifindex,
                        addr,
                        mac: Some([2, 2, 2, 2, 2, rng.below(3) as u8]),
                        state: if rng.chance(80) {
                            NUD_REACHABLE
                        } else {
                            NUD_FAILED
                        },
                        flags: 0,
                    },
                );
            }
        }
        st
    }

    #[test]
    fn randomized_compute_and_reconcile_keep_every_invariant() {
        let managed: BTreeMap<u32, u32> = [(2, 1), (3, 2), (4, 3)].into_iter().collect();
        let (mut saw_groups, mut saw_buckets, mut saw_failed) = (0, 0, 0);
        for seed in 1..=20u64 {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
            // small next-hop and FIB capacities so that overflow and id reuse happen
            let nh_cap = if seed % 2 == 0 {
                64
            } else {
                6 + rng.below(8) as u32
            };
            let mut ids = Ids::new(nh_cap, if seed % 2 == 1 { 5 } else { 64 });
            // Odd seeds: fixed map sizes known to the reconciler and enforced
            // by the writer (tight rewrites); even seeds: sizes vary per round.
            let fixed = Capacities {
                fib4: 11,
                fib6: 6,
                nexthops: nh_cap,
                neigh: 6,
                ifaces: 8,
                groups: 5,
                buckets: 10,
            };
            let (mut r, mut m) = if seed % 2 == 1 {
                (
                    Reconciler::with_capacities(fixed),
                    Mem {
                        caps: Some(fixed),
                        ..Mem::default()
                    },
                )
            } else {
                (Reconciler::new(), Mem::default())
            };
            for round in 0..150 {
                let st = random_state(&mut rng);
                let caps = if seed % 2 == 1 {
                    fixed
                } else {
                    Capacities {
                        fib4: 8 + rng.below(8) as u32,
                        fib6: 5 + rng.below(5) as u32,
                        nexthops: nh_cap,
                        neigh: 8,
                        ifaces: 8,
                        groups: 64,
                        buckets: 1024,
                    }
                };
                let want = compute(&st, &managed, &caps, &mut ids);
                saw_failed += usize::from(want.offload.failed() > 0);
                no_blackhole(&st, &managed, &want, &format!("seed {seed} round {round}"));
                saw_groups += usize::from(!want.groups.is_empty());
                saw_buckets += usize::from(!want.res_buckets.is_empty());
                for (id, e) in &want.nexthops {
                    assert!(*id >= 1 && *id < nh_cap);
                    if let Some(old) = m.t.nexthops.get(id) {
                        assert_eq!(
                            old, e,
                            "seed {seed} round {round}: id {id} re-pointed while in the maps"
                        );
                    }
                }
                m.log.clear();
                m.safety = Some((m.t.clone(), want.clone()));
                if rng.chance(30) {
                    let n = r.plan(&want).len();
                    if n > 0 {
                        m.fail_at = Some(m.n + rng.below(n as u64) as usize);
                        assert!(r.apply(&want, &mut m).is_err());
                        assert!(tables_eq(&m.t, r.applied()), "seed {seed} round {round}");
                        ids.release_unused(r.applied());
                        if rng.chance(50) {
                            continue; // the next state comes before any retry
                        }
                        m.safety = Some((m.t.clone(), want.clone()));
                    }
                }
                r.apply(&want, &mut m)
                    .unwrap_or_else(|e| panic!("seed {seed} round {round}: {e}"));
                assert!(tables_eq(&m.t, r.applied()));
                assert_eq!(m.gen, r.generation());
                assert_eq!(r.applied().switches, want.switches);
                let sw = want.switches.table_full;
                if sw & 1 == 0 {
                    assert_eq!(r.applied().fib4, want.fib4, "seed {seed} round {round}");
                }
                if sw & 2 == 0 {
                    assert_eq!(r.applied().fib6, want.fib6, "seed {seed} round {round}");
                }
                if sw != 3 {
                    assert_eq!(r.applied().neigh, want.neigh);
                }
                if sw == 0 {
                    assert!(tables_eq(r.applied(), &want), "seed {seed} round {round}");
                }
                assert!(
                    r.plan(&want).is_empty(),
                    "seed {seed} round {round}: not converged"
                );
                ids.release_unused(r.applied());
            }
        }
        assert!(saw_groups > 100 && saw_buckets > 20, "{saw_groups} {saw_buckets}");
        assert!(saw_failed > 100, "{saw_failed}");
    }

    /// Whatever did not fit, `want` forwards no address differently from
    /// the tables computed with room for everything: it punts it, or (for a
    /// group) punts some of its paths.
    fn no_blackhole(st: &KernelState, managed: &BTreeMap<u32, u32>, want: &Desired, what: &str) {
        let roomy = Capacities { fib4: 1 << 16, fib6: 1 << 16, nexthops: 1 << 12, neigh: 1 << 12, ifaces: 64, groups: 1 << 12, buckets: 1 << 16 };
        let full = compute(st, managed, &roomy, &mut Ids::new(roomy.nexthops, roomy.groups));
        let mut addrs = BTreeSet::new();
        probes(&full, &mut addrs);
        for a in addrs {
            let Some((w, mtu)) = decide(want, a) else { continue };
            let f = decide(&full, a);
            let ok = match (&w, &f) {
                (_, Some((fw, fmtu))) if *fw == w => *fmtu == mtu,
                (Way::Group { paths, .. }, Some((Way::Group { paths: fp, .. }, fmtu))) => {
                    *fmtu == mtu
                        && paths.len() == fp.len()
                        && paths.iter().zip(fp).all(|(p, q)| p.0 == q.0 && (p.1.is_none() || p.1 == q.1))
                }
                _ => false,
            };
            assert!(ok, "{what}: {a} forwarded via {w:?}, the kernel's FIB says {f:?}");
        }
    }

    /// A daemon restarting on pinned maps: the new reconciler and id
    /// allocators start from what the maps hold (as read back: resilient
    /// groups lose their kernel origin, which is not in the map). From the
    /// first plan on, no next hop or group is re-pointed while in the maps,
    /// every intermediate state is safe, and entries only the dead daemon
    /// wanted are deleted.
    #[test]
    fn adopting_maps_of_a_dead_daemon_keeps_every_invariant() {
        let managed: BTreeMap<u32, u32> = [(2, 1), (3, 2), (4, 3)].into_iter().collect();
        let caps = Capacities { fib4: 64, fib6: 64, nexthops: 32, neigh: 64, ifaces: 8, groups: 16, buckets: 1024 };
        for seed in 1..=20u64 {
            let mut rng = Rng(0x51ED_2701_u64 ^ seed.wrapping_mul(0x9E37_79B9));
            let mut m = Mem { caps: Some(caps), ..Mem::default() };
            let mut ids = Ids::new(caps.nexthops, caps.groups);
            let mut r = Reconciler::with_capacities(caps);
            for _ in 0..5 {
                let want = compute(&random_state(&mut rng), &managed, &caps, &mut ids);
                step(&mut r, &mut m, &want);
                ids.release_unused(r.applied());
            }
            // The daemon dies; the maps keep what they hold, minus what
            // only the daemon knew.
            for g in m.t.groups.values_mut() {
                g.origin = 0;
            }
            let mut r = Reconciler::with_capacities(caps);
            r.adopt(m.t.clone(), m.gen);
            let mut ids = Ids::new(caps.nexthops, caps.groups);
            ids.release_unused(r.applied());
            for round in 0..5 {
                let want = compute(&random_state(&mut rng), &managed, &caps, &mut ids);
                let gen = m.gen;
                let ops = step(&mut r, &mut m, &want);
                if round == 0 {
                    assert_eq!(ops.last(), Some(&Op::BumpGeneration), "seed {seed}: no bump after adopt");
                    assert!(m.gen > gen);
                }
                if want.switches.table_full == 0 {
                    assert!(tables_eq(&m.t, &want), "seed {seed} round {round}: stale entries left");
                }
                ids.release_unused(r.applied());
            }
        }
    }
}
