//! What `route_delta::fib_delta` keeps from one route change to the next.
//! With a full table in the kernel, three of its questions were each a pass
//! over every route (a million: ~60 ms per change, and a daemon busy on one
//! core under steady BGP churn): which other main-table routes a touched
//! prefix has, what the local tables say, and whether a next hop still
//! carries any prefix. `DeltaBase` answers them from an index built once
//! (one pass) and carried along by every delta, so a change costs time in
//! the prefixes it touches. Built after a full compute, dropped by the next
//! one: a local-table change, like anything but plain main-table routes, is
//! never a delta.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use crate::desired::{self, Intent, Prefix};
use crate::model::{Family, KernelState, Route, RouteKey, RT_TABLE_LOCAL, RT_TABLE_MAIN};
use crate::route_delta::FibDelta;
use crate::tables::{Desired, RouteAction};

/// Probing costs one hash lookup per (prefix, shape); past this share of
/// the table's size (plus a floor under which both are quick) one pass over
/// every route is cheaper.
const PROBE_SHARE: usize = 8;
const PROBE_FLOOR: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub struct DeltaBase {
    /// Per family (V4, V6): the local table as `desired` merges it over main.
    local: [Local; 2],
    /// Per family: the (tos, priority) pairs of main-table routes. A
    /// prefix's main routes are found by probing the route map with each
    /// (routes differ from one another only there and in the table). Pairs
    /// of deleted routes stay: a superset only costs probes.
    shapes: [BTreeSet<(u8, u32)>; 2],
    /// A main-table route's destination has host bits set (the kernel
    /// refuses those; hand-built states may not): probing by the masked
    /// prefix would miss it, so every lookup takes the pass.
    uncanonical: bool,
    /// FIB entries of both families that forward through each next hop id,
    /// and that use each ECMP group.
    fwd_uses: HashMap<u32, u64>,
    group_uses: HashMap<u32, u64>,
}

impl DeltaBase {
    /// One pass over `state`'s routes and `applied`'s FIB, which must be
    /// what a full compute made of `state`.
    pub fn new(state: &KernelState, applied: &Desired) -> DeltaBase {
        let mut local: [Vec<(Prefix, &Route)>; 2] = [Vec::new(), Vec::new()];
        let mut shapes: [BTreeSet<(u8, u32)>; 2] = [BTreeSet::new(), BTreeSet::new()];
        let mut uncanonical = false;
        for ((fam, key), route) in &state.routes {
            match key.table {
                RT_TABLE_LOCAL => {
                    if let Some(p) = Prefix::new(*fam, &key.dst, key.prefix_len) {
                        local[fam_index(*fam)].push((p, route));
                    }
                }
                RT_TABLE_MAIN => {
                    shapes[fam_index(*fam)].insert((key.tos, key.priority));
                    uncanonical |= !canonical(*fam, key);
                }
                _ => {}
            }
        }
        let mut fwd_uses: HashMap<u32, u64> = HashMap::new();
        let mut group_uses: HashMap<u32, u64> = HashMap::new();
        for e in applied.fib4.values().chain(applied.fib6.values()) {
            match e.action {
                RouteAction::Forward { nh_id } => *fwd_uses.entry(nh_id).or_default() += 1,
                RouteAction::Multipath { group } => *group_uses.entry(group).or_default() += 1,
                _ => {}
            }
        }
        let [local4, local6] = local;
        DeltaBase {
            local: [Local::new(Family::V4, local4, state), Local::new(Family::V6, local6, state)],
            shapes,
            uncanonical,
            fwd_uses,
            group_uses,
        }
    }

    /// Carries the base over a delta that was written: `touched` are its
    /// route keys, `delta` what it wrote (its net change of entries per next
    /// hop and per group).
    pub fn advance(&mut self, touched: &[(Family, RouteKey)], delta: &FibDelta) {
        for (fam, key) in touched {
            if key.table == RT_TABLE_MAIN {
                self.shapes[fam_index(*fam)].insert((key.tos, key.priority));
                self.uncanonical |= !canonical(*fam, key);
            }
        }
        for (uses, changes) in [(&mut self.fwd_uses, &delta.nh_uses), (&mut self.group_uses, &delta.group_uses)] {
            for (id, n) in changes {
                let e = uses.entry(*id).or_default();
                *e = e.saturating_add_signed(*n);
                if *e == 0 {
                    uses.remove(id);
                }
            }
        }
    }

    /// FIB entries forwarding through next hop `id`.
    pub(crate) fn fwd_uses(&self, id: u32) -> u64 {
        self.fwd_uses.get(&id).copied().unwrap_or(0)
    }

    /// FIB entries using ECMP group `id`.
    pub(crate) fn group_uses(&self, id: u32) -> u64 {
        self.group_uses.get(&id).copied().unwrap_or(0)
    }

    pub(crate) fn local(&self, fam: Family) -> &Local {
        &self.local[fam_index(fam)]
    }

    /// The main-table routes of each prefix in `want` (`touched` the route
    /// keys it came from; their pairs may be new to the base), as a pass
    /// over every route would collect them.
    pub(crate) fn main_routes<'a>(
        &self,
        state: &'a KernelState,
        want: &HashSet<(Family, Prefix)>,
        touched: &[(Family, RouteKey)],
    ) -> HashMap<(Family, Prefix), Vec<&'a Route>> {
        let mut shapes = self.shapes.clone();
        let mut uncanonical = self.uncanonical;
        for (fam, key) in touched {
            shapes[fam_index(*fam)].insert((key.tos, key.priority));
            uncanonical |= !canonical(*fam, key);
        }
        let probes: usize = want.iter().map(|(f, _)| shapes[fam_index(*f)].len()).sum();
        if uncanonical || probes > state.routes.len() / PROBE_SHARE + PROBE_FLOOR {
            return scan_main(state, want);
        }
        probe_main(state, want, &shapes)
    }

    /// This base holds everything `fresh` (built from the same state and
    /// tables) does: the carried base may only have more pairs to probe.
    #[cfg(test)]
    pub(crate) fn covers(&self, fresh: &DeltaBase) -> bool {
        self.local == fresh.local
            && self.fwd_uses == fresh.fwd_uses
            && self.group_uses == fresh.group_uses
            && self.shapes.iter().zip(&fresh.shapes).all(|(a, b)| a.is_superset(b))
            && (self.uncanonical || !fresh.uncanonical)
    }
}

/// The main-table routes of the prefixes in `want` by probing the route map
/// with each (tos, priority) pair of `shapes`.
pub(crate) fn probe_main<'a>(
    state: &'a KernelState,
    want: &HashSet<(Family, Prefix)>,
    shapes: &[BTreeSet<(u8, u32)>; 2],
) -> HashMap<(Family, Prefix), Vec<&'a Route>> {
    let mut out: HashMap<(Family, Prefix), Vec<&Route>> = HashMap::new();
    for (fam, p) in want {
        let dst = prefix_addr(*fam, *p);
        for (tos, priority) in &shapes[fam_index(*fam)] {
            let key = RouteKey { table: RT_TABLE_MAIN, dst, prefix_len: p.len, tos: *tos, priority: *priority };
            if let Some(r) = state.routes.get(&(*fam, key)) {
                out.entry((*fam, *p)).or_default().push(r);
            }
        }
    }
    out
}

/// The main-table routes of the prefixes in `want`, by one pass over all.
pub(crate) fn scan_main<'a>(
    state: &'a KernelState,
    want: &HashSet<(Family, Prefix)>,
) -> HashMap<(Family, Prefix), Vec<&'a Route>> {
    // No hashing for the prefix lengths nobody wants.
    let mut lens = [[false; 129]; 2];
    for (f, p) in want {
        lens[fam_index(*f)][usize::from(p.len)] = true;
    }
    let mut out: HashMap<(Family, Prefix), Vec<&Route>> = HashMap::new();
    for ((fam, key), route) in &state.routes {
        if key.table != RT_TABLE_MAIN || lens[fam_index(*fam)].get(usize::from(key.prefix_len)) != Some(&true) {
            continue;
        }
        let Some(p) = Prefix::new(*fam, &key.dst, key.prefix_len) else { continue };
        if want.contains(&(*fam, p)) {
            out.entry((*fam, p)).or_default().push(route);
        }
    }
    out
}

fn prefix_addr(fam: Family, p: Prefix) -> IpAddr {
    match fam {
        Family::V4 => IpAddr::V4(p.v4().0),
        Family::V6 => IpAddr::V6(p.v6().0),
    }
}

/// `key.dst` has no bits past its prefix length (and fits its family).
fn canonical(fam: Family, key: &RouteKey) -> bool {
    Prefix::new(fam, &key.dst, key.prefix_len).is_some_and(|p| prefix_addr(fam, p) == key.dst)
}

pub(crate) fn fam_index(f: Family) -> usize {
    match f {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

/// A family's local table, as `desired::fib_intents` merges it over main.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Local {
    idx: HashMap<Prefix, Intent>,
    /// Prefix lengths present, longest first.
    lens: Vec<u8>,
}

impl Local {
    fn new(fam: Family, routes: Vec<(Prefix, &Route)>, state: &KernelState) -> Local {
        let picked = desired::pick(fam, routes, state);
        let mut lens: Vec<u8> = picked.iter().map(|(p, _)| p.len).collect();
        lens.sort_unstable_by(|a, b| b.cmp(a));
        lens.dedup();
        Local { idx: picked.into_iter().collect(), lens }
    }

    /// The intent of prefix `p` given its main-table intent `m`.
    pub(crate) fn intent(&self, fam: Family, p: Prefix, m: Option<Intent>) -> Option<Intent> {
        // A local route wins an identical prefix.
        if let Some(l) = self.idx.get(&p) {
            return Some(l.clone());
        }
        let m = m?;
        let cover = self.lens.iter().filter(|l| **l <= p.len).find_map(|l| self.idx.get(&p.truncate(*l)));
        Some(match cover {
            None => m,
            Some(l) => desired::merge_covered(fam, l, m),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fixtures::{ip, main_route};
    use crate::model::RouteTarget;

    fn sorted(mut m: HashMap<(Family, Prefix), Vec<&Route>>) -> Vec<((Family, Prefix), Vec<RouteKey>)> {
        let mut v: Vec<_> = m.drain().map(|(k, rs)| (k, rs.iter().map(|r| r.key.clone()).collect::<BTreeSet<_>>().into_iter().collect())).collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    fn add(st: &mut KernelState, r: Route) {
        st.routes.insert((Family::of(&r.key.dst), r.key.clone()), r);
    }

    fn want_of(prefixes: &[(&str, u8)]) -> HashSet<(Family, Prefix)> {
        prefixes
            .iter()
            .map(|(a, l)| {
                let a = ip(a);
                (Family::of(&a), Prefix::new(Family::of(&a), &a, *l).unwrap())
            })
            .collect()
    }

    const PREFIXES: [(&str, u8); 6] =
        [("203.0.113.0", 24), ("203.0.113.0", 25), ("0.0.0.0", 0), ("2001:db8:1::", 48), ("2001:db8::", 32), ("::", 0)];

    proptest! {
        /// Probing by (tos, priority) pairs finds exactly the routes one
        /// pass over all finds, whatever the tables, TOS and metrics.
        #[test]
        fn probing_finds_what_the_pass_finds(
            routes in proptest::collection::vec((0usize..6, 0usize..3, 0usize..2, 0usize..3), 0..40),
            want in proptest::collection::vec(0usize..6, 1..6),
        ) {
            let mut st = KernelState::default();
            for (p, table, tos, prio) in routes {
                let (dst, len) = PREFIXES[p];
                let mut r = main_route(dst, len, RouteTarget::None);
                r.key.table = [RT_TABLE_MAIN, RT_TABLE_LOCAL, 100][table];
                r.key.tos = [0, 4][tos];
                r.key.priority = [0, 20, 1024][prio];
                add(&mut st, r);
            }
            let want = want_of(&want.iter().map(|i| PREFIXES[*i]).collect::<Vec<_>>());
            let base = DeltaBase::new(&st, &Desired::default());
            prop_assert!(!base.uncanonical);
            prop_assert_eq!(sorted(probe_main(&st, &want, &base.shapes)), sorted(scan_main(&st, &want)));
            prop_assert_eq!(sorted(base.main_routes(&st, &want, &[])), sorted(scan_main(&st, &want)));
        }
    }

    #[test]
    fn a_touched_pair_new_to_the_base_is_probed() {
        let mut st = KernelState::default();
        add(&mut st, main_route("203.0.113.0", 24, RouteTarget::None));
        let base = DeltaBase::new(&st, &Desired::default());
        let mut r = main_route("203.0.113.0", 24, RouteTarget::None);
        r.key.priority = 20;
        r.key.tos = 4;
        add(&mut st, r.clone());
        let want = want_of(&[("203.0.113.0", 24)]);
        let touched = [(Family::V4, r.key.clone())];
        assert_eq!(sorted(base.main_routes(&st, &want, &touched)), sorted(scan_main(&st, &want)));
        assert_eq!(base.main_routes(&st, &want, &touched).values().map(Vec::len).sum::<usize>(), 2);
    }

    #[test]
    fn a_destination_with_host_bits_takes_the_pass() {
        let mut st = KernelState::default();
        add(&mut st, main_route("203.0.113.7", 24, RouteTarget::None));
        let base = DeltaBase::new(&st, &Desired::default());
        assert!(base.uncanonical);
        let want = want_of(&[("203.0.113.0", 24)]);
        assert_eq!(base.main_routes(&st, &want, &[]).values().map(Vec::len).sum::<usize>(), 1);
    }

    #[test]
    fn next_hop_and_group_uses_follow_the_deltas() {
        let mut d = Desired::default();
        let fwd = |nh_id| crate::tables::RouteEntry { action: RouteAction::Forward { nh_id }, mtu: 0 };
        let mp = |group| crate::tables::RouteEntry { action: RouteAction::Multipath { group }, mtu: 0 };
        d.fib4.insert((std::net::Ipv4Addr::new(203, 0, 113, 0), 24), fwd(1));
        d.fib4.insert((std::net::Ipv4Addr::new(198, 51, 100, 0), 24), fwd(1));
        d.fib4.insert((std::net::Ipv4Addr::new(198, 18, 0, 0), 15), mp(1));
        d.fib6.insert(("2001:db8::".parse().unwrap(), 32), fwd(2));
        let mut base = DeltaBase::new(&KernelState::default(), &d);
        assert_eq!((base.fwd_uses(1), base.fwd_uses(2), base.fwd_uses(3)), (2, 1, 0));
        assert_eq!((base.group_uses(1), base.group_uses(2)), (1, 0));
        let delta = FibDelta {
            nh_uses: [(1, -2), (3, 1)].into_iter().collect(),
            group_uses: [(1, -1), (2, 2)].into_iter().collect(),
            ..FibDelta::default()
        };
        base.advance(&[], &delta);
        assert_eq!((base.fwd_uses(1), base.fwd_uses(2), base.fwd_uses(3)), (0, 1, 1));
        assert_eq!((base.group_uses(1), base.group_uses(2)), (0, 2));
        assert!(!base.fwd_uses.contains_key(&1) && !base.group_uses.contains_key(&1));
    }
}
