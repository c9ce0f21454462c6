//! Desired tables vs written tables -> ordered map writes.
//!
//! The data plane reads the maps while we write them, one entry at a time,
//! so the order of the writes is what keeps a half-written state from
//! forwarding anything the kernel would not:
//!
//! 1. families that become punted are switched off before anything else;
//! 2. interfaces, next hops and neighbours are added before any route can
//!    point at them;
//! 3. routes change, longest prefixes first, then deletes shortest first:
//!    at every step each address resolves either as before or as after
//!    (see `fib_ops`);
//! 4. neighbours, next hops and interfaces nobody needs any more go last,
//!    and a next hop only once no written route references it;
//! 5. families that become un-punted are switched on after their tables
//!    are complete;
//! 6. the generation is bumped so cached results computed from the old
//!    tables are not trusted.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use crate::tables::{Capacities, Desired, Op, RouteAction, RouteEntry, Switches, TableWriter};

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

        let mut transient = 0;
        let mut neigh_tight = false;
        if let Some(c) = &self.caps {
            if !skip4 && union_len(&old.fib4, &desired.fib4) > c.fib4 as usize {
                transient |= V4;
            }
            if !skip6 && union_len(&old.fib6, &desired.fib6) > c.fib6 as usize {
                transient |= V6;
            }
            neigh_tight = union_len(&old.neigh, &desired.neigh) > c.neigh as usize;
        }

        let mut ops = Vec::new();
        let first = Switches {
            table_full: old.switches.table_full | new_sw.table_full | transient,
            policy_punt: old.switches.policy_punt | new_sw.policy_punt,
        };
        let mut written = old.switches;
        if first != written {
            ops.push(Op::SetSwitches(first));
            written = first;
        }

        upserts(&old.ifaces, &desired.ifaces, &mut ops, |k, v| {
            Op::UpsertIface(*k, v.clone())
        });
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

        if !skip_l2 {
            if !neigh_tight {
                deletes(&old.neigh, &desired.neigh, &mut ops, |k| {
                    Op::DeleteNeigh(*k)
                });
            }
            // Routes of a skipped family stay as they are in the maps and
            // keep their next hops alive.
            let mut used: BTreeSet<u32> = BTreeSet::new();
            used.extend(nh_refs(if skip4 {
                old.fib4.values()
            } else {
                desired.fib4.values()
            }));
            used.extend(nh_refs(if skip6 {
                old.fib6.values()
            } else {
                desired.fib6.values()
            }));
            for id in old.nexthops.keys() {
                if !desired.nexthops.contains_key(id) && !used.contains(id) {
                    ops.push(Op::DeleteNexthop(*id));
                }
            }
        }
        deletes(&old.ifaces, &desired.ifaces, &mut ops, |k| {
            Op::DeleteIface(*k)
        });

        if new_sw != written {
            ops.push(Op::SetSwitches(new_sw));
        }
        if !ops.is_empty() || self.dirty {
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
        for (n, op) in ops.iter().enumerate() {
            if let Err(source) = w.apply(op) {
                log::debug!("reconcile stopped after {n} of {} ops", ops.len());
                return Err(ReconcileError {
                    op: op.clone(),
                    source,
                });
            }
            self.record(op);
        }
        Ok(ops.len())
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
                a.neigh.insert(*k, *v);
            }
            Op::DeleteNeigh(k) => {
                a.neigh.remove(k);
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
            Op::BumpGeneration => {
                self.generation += 1;
                self.dirty = false;
                return;
            }
        }
        self.dirty = true;
    }
}

fn union_len<K: Ord, V>(a: &BTreeMap<K, V>, b: &BTreeMap<K, V>) -> usize {
    a.len() + b.keys().filter(|k| !a.contains_key(k)).count()
}

fn upserts<K: Ord, V: PartialEq>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
    ops: &mut Vec<Op>,
    op: impl Fn(&K, &V) -> Op,
) {
    for (k, v) in new {
        if old.get(k) != Some(v) {
            ops.push(op(k, v));
        }
    }
}

fn deletes<K: Ord, V>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
    ops: &mut Vec<Op>,
    op: impl Fn(&K) -> Op,
) {
    for k in old.keys() {
        if !new.contains_key(k) {
            ops.push(op(k));
        }
    }
}

fn nh_refs<'a>(routes: impl Iterator<Item = &'a RouteEntry>) -> Vec<u32> {
    routes
        .filter_map(|r| match r.action {
            RouteAction::Forward { nh_id } => Some(nh_id),
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
    let mut ups: Vec<(&(A, u8), &RouteEntry)> =
        new.iter().filter(|(k, v)| old.get(k) != Some(*v)).collect();
    ups.sort_by_key(|((a, len), _)| (Reverse(*len), *a));
    let mut dels: Vec<&(A, u8)> = old.keys().filter(|k| !new.contains_key(k)).collect();
    dels.sort_by_key(|(a, len)| (*len, *a));
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
