//! Route changes with a full table in the kernel. `desired::compute`
//! recomputes every prefix, about a second at a million routes, so each BGP
//! update would reach the fast path a second late (and until then it
//! forwards by the old route). When only plain main-table routes changed and
//! nothing else did, only those prefixes' FIB entries can differ, plus the
//! next hops and ECMP groups they bring or leave unused; when it is also
//! certain that nothing else derived from the FIB moves — punts whose only
//! other trace is an IPv4 /32 source-deny entry (computed here: remotely
//! triggered blackholes are /32 routes), no resilient group's buckets to
//! write or retire, nothing left out for lack of room and nothing that
//! will be — `fib_delta` computes just those entries, with the functions
//! `compute` uses, and new next hops and groups get the ids `compute` would
//! give them. Any doubt answers None and the caller recomputes everything.
//! What it needs of the untouched routes (the local tables, a touched
//! prefix's other routes, how many entries use each next hop and group)
//! comes from a `DeltaBase` the caller carries from change to change, so a
//! change costs time in the prefixes it touches. A property test holds the
//! result to `compute`'s over chains of changes, and the carried base to a
//! fresh one.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::delta_base::DeltaBase;
use crate::desired::{self, reason, GroupIntent, Ids, Intent, Prefix};
use crate::model::{Family, KernelState, RouteKey, RouteTarget, RT_TABLE_MAIN};
use crate::overflow::Offload;
use crate::tables::{
    bucket_key, Capacities, Desired, GroupEntry, IfaceEntry, NeighEntry, NeighKey, NexthopEntry, RouteAction, RouteEntry,
};

/// FIB entries to write (Some) or delete (None), and the IPv4 source-deny
/// entries that go with them, or neighbour entries (`neigh_delta`); only
/// entries that change.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FibDelta {
    pub v4: BTreeMap<(Ipv4Addr, u8), Option<RouteEntry>>,
    pub v6: BTreeMap<(Ipv6Addr, u8), Option<RouteEntry>>,
    pub deny4: BTreeMap<Ipv4Addr, Option<u8>>,
    /// Next hops and ECMP groups to write (Some: new to the maps) or delete
    /// (None: nothing uses them any more).
    pub nexthops: BTreeMap<u32, Option<NexthopEntry>>,
    pub groups: BTreeMap<u32, Option<GroupEntry>>,
    /// Net change of FIB entries forwarding through each next hop id, and
    /// of those using each group (none 0), for `DeltaBase::advance`.
    pub nh_uses: BTreeMap<u32, i64>,
    pub group_uses: BTreeMap<u32, i64>,
    /// Neighbour entries to write or delete (`neigh_delta`).
    pub neigh: BTreeMap<NeighKey, Option<NeighEntry>>,
    /// Interface entries to write (`iface_restrict::carrier_back`).
    pub ifaces: BTreeMap<u32, IfaceEntry>,
}

impl FibDelta {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len() + self.deny4.len() + self.neigh.len() + self.nexthops.len() + self.groups.len() + self.ifaces.len()
    }

    /// `d` as it is once the delta is written.
    pub fn apply_to(&self, d: &mut Desired) {
        for (k, e) in &self.ifaces {
            d.ifaces.insert(*k, e.clone());
        }
        patch(&mut d.src_deny4, &self.deny4);
        patch(&mut d.fib4, &self.v4);
        patch(&mut d.fib6, &self.v6);
        patch(&mut d.neigh, &self.neigh);
        patch(&mut d.nexthops, &self.nexthops);
        patch(&mut d.groups, &self.groups);
    }
}

/// Writes (Some) or removes (None) each entry of `delta` in `m`.
fn patch<K: Ord + Copy, V: Clone>(m: &mut BTreeMap<K, V>, delta: &BTreeMap<K, Option<V>>) {
    for (k, e) in delta {
        match e {
            Some(e) => m.insert(*k, e.clone()),
            None => m.remove(k),
        };
    }
}

/// The entries of the main-table prefixes in `touched` (route keys whose
/// routes were added, replaced or deleted since `applied` was computed
/// from the same state otherwise), or None when only a full `compute` is
/// exact. `offload` is the last full compute's; `ids` the allocators it
/// used: a next hop or ECMP group new to the tables gets the id `compute`
/// would give it, and the caller reserves it (`Ids::reserve_delta`) once
/// the delta is written.
pub fn fib_delta(
    applied: &Desired,
    offload: &Offload,
    base: &DeltaBase,
    state: &KernelState,
    touched: &[(Family, RouteKey)],
    caps: &Capacities,
    ids: &Ids,
) -> Option<FibDelta> {
    // Something did not fit: trimming and its covers depend on every prefix.
    if applied.switches.table_full != 0 || !offload_empty(offload) {
        return None;
    }
    let mut want: HashSet<(Family, Prefix)> = HashSet::new();
    for (fam, key) in touched {
        if key.table != RT_TABLE_MAIN {
            return None;
        }
        want.insert((*fam, Prefix::new(*fam, &key.dst, key.prefix_len)?));
    }
    let mut delta = FibDelta::default();
    if want.is_empty() {
        return Some(delta);
    }
    let mut main = base.main_routes(state, &want, touched);

    let mut fresh = Fresh::new(applied, ids, caps);
    let (mut new4, mut new6) = (0usize, 0usize);
    for (fam, p) in &want {
        let m = main.get_mut(&(*fam, *p)).map(|routes| {
            // As `desired::pick` sees them: sorted by key.
            routes.sort_unstable_by(|a, b| a.key.cmp(&b.key));
            desired::select(*fam, routes, state)
        });
        let intent = base.local(*fam).intent(*fam, *p, m);
        let new = match intent {
            None => None,
            Some(Intent::Forward { hop, mtu }) => {
                Some(RouteEntry { action: RouteAction::Forward { nh_id: fresh.hop(&hop)? }, mtu })
            }
            Some(Intent::Multipath { group, mtu }) => {
                Some(RouteEntry { action: RouteAction::Multipath { group: fresh.group(&group)? }, mtu })
            }
            Some(Intent::Act(a)) if act_ok(*fam, *p, &a) => Some(RouteEntry { action: a, mtu: 0 }),
            Some(_) => return None,
        };
        let old = match fam {
            Family::V4 => applied.fib4.get(&p.v4()),
            Family::V6 => applied.fib6.get(&p.v6()),
        };
        match old.map(|e| e.action) {
            None | Some(RouteAction::Forward { .. } | RouteAction::Multipath { .. }) => {}
            Some(a) if act_ok(*fam, *p, &a) => {}
            Some(_) => return None,
        }
        if old == new.as_ref() {
            continue;
        }
        for (e, n) in [(old, -1), (new.as_ref(), 1)] {
            match e.map(|e| e.action) {
                Some(RouteAction::Forward { nh_id }) => *delta.nh_uses.entry(nh_id).or_default() += n,
                Some(RouteAction::Multipath { group }) => *delta.group_uses.entry(group).or_default() += n,
                _ => {}
            }
        }
        // desired::src_check4: a refused /32 is denied as a source by its
        // own entry (own addresses always, as martians).
        let refusal = |e: Option<&RouteEntry>| e.and_then(|e| desired::src_refusal(&e.action));
        if *fam == Family::V4 && (refusal(old).is_some() || refusal(new.as_ref()).is_some()) {
            // With LPM source checks the deny set is not kept at all.
            if applied.switches.src_lpm & Family::V4.bit() != 0 {
                return None;
            }
            let (a, _) = p.v4();
            let own = state.addrs.keys().any(|x| x.addr == IpAddr::V4(a));
            let deny = if own { Some(reason::MARTIAN) } else { refusal(new.as_ref()) };
            if applied.src_deny4.get(&a).copied() != deny {
                delta.deny4.insert(a, deny);
            }
        }
        match fam {
            Family::V4 => {
                new4 += usize::from(old.is_none());
                delta.v4.insert(p.v4(), new);
            }
            Family::V6 => {
                new6 += usize::from(old.is_none());
                delta.v6.insert(p.v6(), new);
            }
        }
    }
    // `compute` trims past the capacity, and the reconciler deletes first
    // when old and new together would not fit.
    // The deny set is sized like fib4 (beyond it: LPM source checks).
    let new_deny = delta.deny4.iter().filter(|(a, r)| r.is_some() && !applied.src_deny4.contains_key(a)).count();
    if applied.fib4.len() + new4 > caps.fib4 as usize
        || applied.fib6.len() + new6 > caps.fib6 as usize
        || applied.src_deny4.len() + new_deny > caps.fib4 as usize
    {
        return None;
    }
    delta.nh_uses.retain(|_, n| *n != 0);
    delta.group_uses.retain(|_, n| *n != 0);
    // What `compute` would no longer hold: groups no entry uses, then next
    // hops neither an entry nor a group uses.
    let uses = |base_n: u64, n: Option<&i64>| i128::from(base_n) + i128::from(n.copied().unwrap_or(0));
    let mut groups = fresh.groups;
    for (gid, n) in &delta.group_uses {
        if *n < 0 && uses(base.group_uses(*gid), Some(n)) <= 0 {
            let g = applied.groups.get(gid)?;
            // Its buckets would go too: left to the full compute.
            if applied.res_buckets.range(bucket_key(*gid, 0)..=bucket_key(*gid, u16::MAX)).next().is_some() {
                return None;
            }
            fresh.losing.extend(g.paths.iter().map(|p| p.nh_id).filter(|id| *id != 0));
            groups.insert(*gid, None);
        }
    }
    fresh.losing.extend(delta.nh_uses.iter().filter(|(_, n)| **n < 0).map(|(id, _)| *id));
    let mut nexthops = fresh.nexthops;
    for id in &fresh.losing {
        if uses(base.fwd_uses(*id), delta.nh_uses.get(id)) > 0 || nexthops.contains_key(id) {
            continue;
        }
        let in_group = |g: &GroupEntry| g.paths.iter().any(|p| p.nh_id == *id);
        let grouped = applied.groups.iter().any(|(gid, g)| !groups.contains_key(gid) && in_group(g))
            || groups.values().flatten().any(in_group)
            || applied.res_buckets.values().any(|v| v == id);
        if !grouped {
            nexthops.insert(*id, None);
        }
    }
    delta.nexthops = nexthops;
    delta.groups = groups;
    Some(delta)
}

/// Next hops and groups a delta's entries need that the tables lack, with
/// the ids `compute` would give them (the ones reserved for them, else the
/// lowest free), and next hops that may have lost their last user.
struct Fresh<'a> {
    applied: &'a Desired,
    ids: &'a Ids,
    caps: &'a Capacities,
    nexthops: BTreeMap<u32, Option<NexthopEntry>>,
    groups: BTreeMap<u32, Option<GroupEntry>>,
    taken_hops: BTreeMap<NexthopEntry, u32>,
    taken_groups: BTreeMap<GroupEntry, u32>,
    losing: BTreeSet<u32>,
}

impl<'a> Fresh<'a> {
    fn new(applied: &'a Desired, ids: &'a Ids, caps: &'a Capacities) -> Self {
        Fresh {
            applied,
            ids,
            caps,
            nexthops: BTreeMap::new(),
            groups: BTreeMap::new(),
            taken_hops: BTreeMap::new(),
            taken_groups: BTreeMap::new(),
            losing: BTreeSet::new(),
        }
    }

    /// The id of next hop `hop`, or None when it would need one `compute`
    /// might assign differently or report (no free id, a table near full).
    fn hop(&mut self, hop: &NexthopEntry) -> Option<u32> {
        if let Some(id) = self.taken_hops.get(hop) {
            return Some(*id);
        }
        let id = match self.ids.nexthops.id_of(hop) {
            Some(id) => id,
            None => {
                let after = self.nexthops.keys().max().copied().unwrap_or(0);
                self.ids.nexthops.free_after(after, self.caps.nexthops)?
            }
        };
        match self.applied.nexthops.get(&id) {
            Some(e) if e == hop => {}
            Some(_) => return None,
            None => {
                // `compute` reports a next-hop table it fills up.
                if self.applied.nexthops.len() + self.nexthops.len() + 2 > self.caps.nexthops as usize {
                    return None;
                }
                self.nexthops.insert(id, Some(hop.clone()));
            }
        }
        self.taken_hops.insert(hop.clone(), id);
        Some(id)
    }

    /// The id of the group `g` makes, likewise; a new resilient group (its
    /// buckets) is left to `compute`.
    fn group(&mut self, g: &GroupIntent) -> Option<u32> {
        let mut hops = BTreeMap::new();
        for h in g.hops() {
            hops.insert(h.clone(), self.hop(h)?);
        }
        let entry = g.entry(|h| hops.get(h).copied().unwrap_or(0));
        if let Some(id) = self.taken_groups.get(&entry) {
            return Some(*id);
        }
        let id = match self.ids.groups.id_of(&entry) {
            Some(id) => id,
            None => {
                let after = self.groups.keys().max().copied().unwrap_or(0);
                self.ids.groups.free_after(after, self.caps.groups)?
            }
        };
        match self.applied.groups.get(&id) {
            Some(e) if *e == entry => {}
            Some(_) => return None,
            None => {
                if g.has_buckets() || self.applied.groups.len() + self.groups.len() + 2 > self.caps.groups as usize {
                    return None;
                }
                self.groups.insert(id, Some(entry.clone()));
            }
        }
        self.taken_groups.insert(entry, id);
        Some(id)
    }
}

/// The keys of the routes that use next-hop objects `ids` (replaced or
/// deleted), directly or through a group they are members of: what a
/// change of the objects can change. None when they are so many that the
/// full compute is as cheap (one pass over the routes either way).
pub fn object_users(state: &KernelState, ids: &[u32]) -> Option<Vec<(Family, RouteKey)>> {
    let changed: HashSet<u32> = ids.iter().copied().collect();
    let mut hit = changed.clone();
    for (gid, o) in &state.nexthops {
        if o.group.iter().any(|(m, _)| changed.contains(m)) {
            hit.insert(*gid);
        }
    }
    let limit = state.routes.len() / 8 + 4096;
    let mut out = Vec::new();
    for ((fam, key), r) in &state.routes {
        if matches!(r.target, RouteTarget::Object(id) if hit.contains(&id)) {
            if out.len() == limit {
                return None;
            }
            out.push((*fam, key.clone()));
        }
    }
    Some(out)
}

/// An entry other than a forward whose only trace beyond the FIB is one
/// handled here: not an ECMP punt (counted for the multipath problems), not
/// a table-full one (overflow), and in IPv4 only a /32 (a shorter refused
/// prefix can switch the whole family to LPM source checks).
fn act_ok(fam: Family, p: Prefix, a: &RouteAction) -> bool {
    match a {
        RouteAction::Forward { .. } | RouteAction::Multipath { .. } => false,
        RouteAction::Punt { reason: r } if *r == reason::ECMP || *r == reason::TABLE_FULL => false,
        _ => fam == Family::V6 || p.len == 32 || desired::src_refusal(a).is_none(),
    }
}

fn offload_empty(o: &Offload) -> bool {
    o.failed4.is_empty() && o.failed6.is_empty() && o.covers4.is_empty() && o.covers6.is_empty()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::desired::{compute, Ids};
    use crate::fixtures::{default_rules, delta_ops, ip, main_route, veth};
    use crate::model::{
        Addr, IfSysctl, NexthopObject, NextHop, Neighbour, Route, RouteKind, RouteTarget, NUD_REACHABLE, RT_TABLE_LOCAL,
    };

    fn caps() -> Capacities {
        Capacities { fib4: 64, fib6: 64, nexthops: 32, neigh: 64, ifaces: 16, groups: 8, buckets: 64 }
    }

    fn managed() -> BTreeMap<u32, u32> {
        [(2, 1), (3, 2)].into_iter().collect()
    }

    /// eth0 (2) and eth1 (3) managed, eth2 (4) not; addresses on eth0, a
    /// local /16 covering main prefixes; a neighbour per gateway.
    fn base() -> KernelState {
        let mut st = KernelState::default();
        for l in [veth(2, "eth0"), veth(3, "eth1"), veth(4, "eth2")] {
            st.if_sysctl.insert(
                l.ifindex,
                IfSysctl { forwarding4: true, forwarding6: true, mtu6: 1500, ..Default::default() },
            );
            st.links.insert(l.ifindex, l);
        }
        st.sysctl.forwarding6_all = true;
        // A seed the data plane can reproduce: multipath routes forward.
        st.sysctl.mp_seed = 0x1234;
        st.rules = default_rules();
        // Next-hop objects: two plain ones, a group of both, a resilient
        // group with its buckets.
        for (id, ifindex, gw) in [(10, 2, "192.0.2.2"), (11, 3, "198.51.100.2"), (12, 3, "198.51.100.4")] {
            st.nexthops.insert(id, NexthopObject { hop: Some(hop(ifindex, Some(gw))), ..object(id) });
        }
        st.nexthops.insert(20, NexthopObject { group: vec![(10, 1), (11, 2)], ..object(20) });
        st.nexthops.insert(21, NexthopObject { group: vec![(10, 1), (12, 1)], ..object(21) });
        st.nexthops.insert(30, NexthopObject { group: vec![(10, 1), (11, 1)], resilient: true, n_buckets: 4, ..object(30) });
        st.res_buckets.insert(30, [(0, 10), (1, 11), (2, 10), (3, 11)].into_iter().collect());
        st.addrs.insert(Addr { ifindex: 2, addr: ip("192.0.2.1"), prefix_len: 24 }, ());
        // An address whose local route was deleted: still refused as a source.
        st.addrs.insert(Addr { ifindex: 2, addr: ip("192.0.2.77"), prefix_len: 24 }, ());
        let mut l = main_route("192.0.2.1", 32, RouteTarget::Single(hop(2, None)));
        l.key.table = RT_TABLE_LOCAL;
        l.kind = RouteKind::Local;
        add(&mut st, l);
        let mut l = main_route("10.9.0.0", 16, RouteTarget::Single(hop(2, None)));
        l.key.table = RT_TABLE_LOCAL;
        l.kind = RouteKind::Local;
        add(&mut st, l);
        for (ifindex, gw) in [(2, "192.0.2.2"), (3, "198.51.100.2"), (2, "2001:db8::2"), (3, "2001:db8:1::2")] {
            let addr = ip(gw);
            st.neighbours.insert(
                (ifindex, addr),
                Neighbour { ifindex, addr, mac: Some([2, 0, 0, 0, 9, ifindex as u8]), state: NUD_REACHABLE, flags: 0 },
            );
        }
        st
    }

    fn object(id: u32) -> NexthopObject {
        NexthopObject { id, blackhole: false, hop: None, group: vec![], resilient: false, n_buckets: 0, unsupported: false }
    }

    fn multipath(dst: &str, len: u8, hops: &[(u32, &str, u32)]) -> Route {
        let hops = hops.iter().map(|(i, gw, w)| NextHop { weight: *w, ..hop(*i, Some(gw)) }).collect();
        main_route(dst, len, RouteTarget::Multipath(hops))
    }

    fn nhid(dst: &str, len: u8, id: u32) -> Route {
        main_route(dst, len, RouteTarget::Object(id))
    }

    fn without_local_cover(mut st: KernelState) -> KernelState {
        st.routes.retain(|(_, k), _| !(k.table == RT_TABLE_LOCAL && k.prefix_len == 16));
        st
    }

    fn hop(ifindex: u32, gw: Option<&str>) -> NextHop {
        NextHop { ifindex, gateway: gw.map(ip), flags: 0, weight: 1 }
    }

    fn add(st: &mut KernelState, r: Route) {
        st.routes.insert((Family::of(&r.key.dst), r.key.clone()), r);
    }

    fn via(dst: &str, len: u8, ifindex: u32, gw: &str) -> Route {
        main_route(dst, len, RouteTarget::Single(hop(ifindex, Some(gw))))
    }

    fn key(r: &Route) -> (Family, RouteKey) {
        (Family::of(&r.key.dst), r.key.clone())
    }

    /// The daemon's cycle: a base built after a full compute, carried by
    /// every delta, rebuilt after the next full compute.
    struct World {
        st: KernelState,
        ids: Ids,
        applied: Desired,
        base: DeltaBase,
    }

    impl World {
        fn new(st: KernelState) -> World {
            let mut ids = Ids::new(caps().nexthops, caps().groups);
            let applied = compute(&st, &managed(), &caps(), &mut ids);
            let base = DeltaBase::new(&st, &applied);
            World { st, ids, applied, base }
        }

        fn delta(&self, touched: &[(Family, RouteKey)]) -> Option<FibDelta> {
            fib_delta(&self.applied, &self.applied.offload, &self.base, &self.st, touched, &caps(), &self.ids)
        }

        /// One change: the delta (if any) must give exactly `compute`'s
        /// tables, and the reconciler must write what `plan` would.
        fn change(&mut self, touched: &[(Family, RouteKey)]) -> bool {
            let d = self.delta(touched);
            if let Some(d) = &d {
                self.ids.reserve_delta(d);
            }
            let full = compute(&self.st, &managed(), &caps(), &mut self.ids);
            if let Some(d) = &d {
                let mut inc = self.applied.clone();
                d.apply_to(&mut inc);
                assert_eq!(inc, full, "delta {d:?}");
                let (want, got, _) = delta_ops(caps(), &self.applied, &full, d);
                assert_eq!(got, want);
                self.base.advance(touched, d);
            }
            self.applied = full;
            let fresh = DeltaBase::new(&self.st, &self.applied);
            if d.is_some() {
                assert!(self.base.covers(&fresh), "carried {:?}\nfresh {fresh:?}", self.base);
            } else {
                self.base = fresh;
            }
            d.is_some()
        }
    }

    #[test]
    fn a_route_via_a_next_hop_in_use_is_a_delta() {
        let mut st = base();
        for i in 0..4 {
            add(&mut st, via(&format!("203.0.{i}.0"), 24, 2, "192.0.2.2"));
        }
        add(&mut st, via("198.18.0.0", 15, 3, "198.51.100.2"));
        add(&mut st, via("198.18.0.0", 16, 3, "198.51.100.2"));
        let mut w = World::new(st);

        let r = via("203.0.113.0", 24, 2, "192.0.2.2");
        add(&mut w.st, r.clone());
        let d = w.delta(&[key(&r)]).expect("add via a used next hop");
        assert_eq!(d.len(), 1);
        assert!(w.change(&[key(&r)]));

        // Moved to the other used next hop, then deleted.
        let moved = via("203.0.113.0", 24, 3, "198.51.100.2");
        add(&mut w.st, moved.clone());
        assert!(w.change(&[key(&moved)]));
        w.st.routes.swap_remove(&key(&moved));
        assert!(w.change(&[key(&moved)]));
        // Touched but unchanged: an empty delta.
        assert_eq!(w.delta(&[key(&moved)]), Some(FibDelta::default()));
    }

    #[test]
    fn next_hops_come_and_go_with_their_routes() {
        let mut st = base();
        add(&mut st, via("203.0.0.0", 24, 2, "192.0.2.2"));
        let mut w = World::new(st);

        // A gateway the tables do not hold yet: its next hop comes first.
        let r = via("203.0.1.0", 24, 3, "198.51.100.3");
        add(&mut w.st, r.clone());
        let d = w.delta(&[key(&r)]).expect("a route via a new next hop");
        let want = NexthopEntry { ifindex: 3, gateway: Some(ip("198.51.100.3")) };
        let [(id, Some(e))] = d.nexthops.iter().collect::<Vec<_>>()[..] else { panic!("one new next hop: {d:?}") };
        assert_eq!(*e, want);
        assert_eq!(d.v4.values().next(), Some(&Some(RouteEntry { action: RouteAction::Forward { nh_id: *id }, mtu: 0 })));
        let id = *id;
        assert!(w.change(&[key(&r)]));
        assert_eq!(w.applied.nexthops.get(&id), Some(&want), "the full compute gives it the same id");

        // Its last route goes, and so does it.
        w.st.routes.swap_remove(&key(&r));
        let d = w.delta(&[key(&r)]).expect("the last route via a next hop");
        assert_eq!(d.nexthops, [(id, None)].into_iter().collect());
        assert!(w.change(&[key(&r)]));
    }

    #[test]
    fn multipath_routes_are_deltas() {
        let mut st = base();
        add(&mut st, via("203.0.0.0", 24, 2, "192.0.2.2"));
        add(&mut st, nhid("203.0.9.0", 24, 30));
        let mut w = World::new(st);

        // Classic multipath, one path via a next hop new to the tables.
        let r = multipath("203.0.1.0", 24, &[(2, "192.0.2.2", 1), (3, "198.51.100.3", 2)]);
        add(&mut w.st, r.clone());
        let d = w.delta(&[key(&r)]).expect("a multipath route");
        assert_eq!((d.nexthops.len(), d.groups.len()), (1, 1), "{d:?}");
        let gid = *d.groups.keys().next().unwrap();
        assert!(w.change(&[key(&r)]));
        // A second prefix on the same paths shares the group.
        let r2 = multipath("203.0.2.0", 24, &[(2, "192.0.2.2", 1), (3, "198.51.100.3", 2)]);
        add(&mut w.st, r2.clone());
        let d = w.delta(&[key(&r2)]).expect("the same group again");
        assert!(d.nexthops.is_empty() && d.groups.is_empty(), "{d:?}");
        assert_eq!(d.v4.values().next(), Some(&Some(RouteEntry { action: RouteAction::Multipath { group: gid }, mtu: 0 })));
        assert!(w.change(&[key(&r2)]));
        // Object groups, and the resilient group the tables already hold.
        for (i, id) in [20, 21, 30].into_iter().enumerate() {
            let o = nhid(&format!("203.0.{}.0", 3 + i), 24, id);
            add(&mut w.st, o.clone());
            assert!(w.change(&[key(&o)]), "route to nexthop object {id}");
        }
        // Both multipath routes go at once: the group and its new next hop too.
        w.st.routes.swap_remove(&key(&r));
        w.st.routes.swap_remove(&key(&r2));
        let d = w.delta(&[key(&r), key(&r2)]).expect("the group's last routes");
        assert_eq!(d.groups.get(&gid), Some(&None));
        assert_eq!(d.nexthops.values().filter(|e| e.is_none()).count(), 1, "{d:?}");
        assert!(w.change(&[key(&r), key(&r2)]));
    }

    #[test]
    fn a_changed_next_hop_object_is_a_delta_of_the_routes_using_it() {
        let mut st = base();
        add(&mut st, nhid("203.0.1.0", 24, 10));
        add(&mut st, nhid("203.0.2.0", 24, 20));
        add(&mut st, nhid("203.0.3.0", 24, 11));
        let mut w = World::new(st);
        // An object nothing uses yet (FRR makes them before the routes).
        w.st.nexthops.insert(40, NexthopObject { hop: Some(hop(3, Some("198.51.100.9"))), ..object(40) });
        assert_eq!(object_users(&w.st, &[40]), Some(vec![]));
        assert!(w.change(&[]));
        // Object 10 moves to another gateway: its route and its group's.
        w.st.nexthops.insert(10, NexthopObject { hop: Some(hop(2, Some("192.0.2.3"))), ..object(10) });
        let users = object_users(&w.st, &[10]).expect("two routes");
        let mut dsts: Vec<String> = users.iter().map(|(_, k)| k.dst.to_string()).collect();
        dsts.sort();
        assert_eq!(dsts, ["203.0.1.0", "203.0.2.0"]);
        let d = w.delta(&users).expect("a delta");
        assert_eq!((d.v4.len(), d.groups.len()), (2, 2), "both entries move, the group is a new one: {d:?}");
        assert!(w.change(&users));
        // A group's members change.
        w.st.nexthops.insert(20, NexthopObject { group: vec![(11, 1), (12, 1)], ..object(20) });
        let users = object_users(&w.st, &[20]).expect("one route");
        assert_eq!(users.len(), 1);
        assert!(w.change(&users));
    }

    #[test]
    fn a_blackholed_address_is_a_delta_with_its_source_deny_entry() {
        // Without the local /16, which makes source checks LPM (no deny set).
        let mut st = without_local_cover(base());
        add(&mut st, via("203.0.113.0", 24, 2, "192.0.2.2"));
        let mut w = World::new(st);
        // Remotely triggered blackhole: a /32 inside a forwarded /24.
        let mut b = main_route("203.0.113.9", 32, RouteTarget::None);
        b.kind = RouteKind::Blackhole;
        add(&mut w.st, b.clone());
        let d = w.delta(&[key(&b)]).expect("a /32 blackhole");
        let a = Ipv4Addr::new(203, 0, 113, 9);
        assert_eq!(d.v4.get(&(a, 32)), Some(&Some(RouteEntry { action: RouteAction::Blackhole, mtu: 0 })));
        assert_eq!(d.deny4.get(&a), Some(&Some(reason::RP_FILTER)));
        assert!(w.change(&[key(&b)]));
        w.st.routes.swap_remove(&key(&b));
        let d = w.delta(&[key(&b)]).expect("its removal");
        assert_eq!(d.deny4.get(&a), Some(&None));
        assert!(w.change(&[key(&b)]));
    }

    #[test]
    fn anything_else_takes_the_full_compute() {
        let mut st = base();
        add(&mut st, via("203.0.0.0", 24, 2, "192.0.2.2"));
        add(&mut st, via("198.18.0.0", 15, 3, "198.51.100.2"));
        let mut w = World::new(st);

        // A new resilient group (its buckets).
        let r = nhid("203.0.1.0", 24, 30);
        add(&mut w.st, r.clone());
        assert!(!w.change(&[key(&r)]));
        // The last route using it goes (so would they).
        w.st.routes.swap_remove(&key(&r));
        assert!(!w.change(&[key(&r)]));
        // A blackhole (the source check reads it).
        let mut b = main_route("203.0.2.0", 24, RouteTarget::None);
        b.kind = RouteKind::Blackhole;
        add(&mut w.st, b.clone());
        assert!(!w.change(&[key(&b)]));
        // A local-table route.
        let mut l = via("203.0.3.0", 24, 2, "192.0.2.2");
        l.key.table = RT_TABLE_LOCAL;
        assert!(w.delta(&[key(&l)]).is_none());
        // Something did not fit before.
        let mut o = w.applied.offload.clone();
        o.failed4.insert((Ipv4Addr::new(203, 0, 9, 0), 24));
        let r = via("203.0.4.0", 24, 2, "192.0.2.2");
        add(&mut w.st, r.clone());
        assert!(fib_delta(&w.applied, &o, &w.base, &w.st, &[key(&r)], &caps(), &w.ids).is_none());
    }

    #[test]
    fn a_full_table_takes_the_full_compute() {
        let mut st = base();
        for i in 0..caps().fib4 - 2 {
            add(&mut st, via(&format!("203.{}.{}.0", i / 256, i % 256), 24, 2, "192.0.2.2"));
        }
        let w = World::new(st);
        assert_eq!(w.applied.fib4.len() as u32, caps().fib4);
        let mut st = w.st.clone();
        let r = via("198.18.0.0", 24, 2, "192.0.2.2");
        add(&mut st, r.clone());
        assert!(fib_delta(&w.applied, &w.applied.offload, &w.base, &st, &[key(&r)], &caps(), &w.ids).is_none());
    }

    /// Candidate routes: plain ones via either gateway or an unmanaged
    /// interface, a new gateway, metrics, TOS, a blackhole, same-metric
    /// IPv6 siblings, prefixes inside the local /16, a default route.
    fn candidates() -> Vec<Route> {
        let mut v = Vec::new();
        // Via one gateway, via the other, and via the other at a higher metric.
        let three = |v: &mut Vec<Route>, dst: &str, len: u8, (g0, g1): (&str, &str), metric: u32| {
            v.push(via(dst, len, 2, g0));
            v.push(via(dst, len, 3, g1));
            let mut m = via(dst, len, 3, g1);
            m.key.priority = metric;
            v.push(m);
        };
        for dst in ["203.0.113.0", "203.0.114.0", "10.9.1.0", "198.18.0.0", "0.0.0.0"] {
            three(&mut v, dst, if dst == "0.0.0.0" { 0 } else { 24 }, ("192.0.2.2", "198.51.100.2"), 10);
        }
        v.push(via("203.0.115.0", 25, 4, "192.0.2.9"));
        v.push(via("203.0.116.0", 24, 3, "198.51.100.3"));
        let mut t = via("203.0.117.0", 24, 2, "192.0.2.2");
        t.key.tos = 4;
        v.push(t);
        let mut b = main_route("203.0.118.0", 24, RouteTarget::None);
        b.kind = RouteKind::Blackhole;
        v.push(b);
        // /32s: blackholed, unreachable or forwarded at one address; one of
        // our own addresses; one under the local /16.
        for (dst, kind) in [
            ("203.0.113.9", RouteKind::Blackhole),
            ("203.0.113.9", RouteKind::Unreachable),
            ("203.0.113.10", RouteKind::Blackhole),
            ("192.0.2.1", RouteKind::Blackhole),
            ("192.0.2.77", RouteKind::Blackhole),
            ("10.9.1.1", RouteKind::Prohibit),
        ] {
            let mut r = main_route(dst, 32, RouteTarget::None);
            r.kind = kind;
            v.push(r);
        }
        v.push(via("203.0.113.9", 32, 2, "192.0.2.2"));
        // Multipath: classic (one path new), weighted, object groups, the
        // resilient group, a plain object, on prefixes others use too.
        for dst in ["203.0.113.0", "203.0.120.0", "203.0.121.0"] {
            v.push(multipath(dst, 24, &[(2, "192.0.2.2", 1), (3, "198.51.100.2", 1)]));
            v.push(multipath(dst, 24, &[(2, "192.0.2.2", 1), (3, "198.51.100.5", 3)]));
        }
        for (dst, id) in [("203.0.120.0", 20), ("203.0.122.0", 21), ("203.0.122.0", 30), ("203.0.123.0", 12)] {
            let mut o = nhid(dst, 24, id);
            o.key.priority = id;
            v.push(o);
        }
        v.push(multipath("2001:db8:10::", 48, &[(2, "2001:db8::2", 1), (3, "2001:db8:1::2", 1)]));
        let mut b6 = main_route("2001:db8:12::", 64, RouteTarget::None);
        b6.kind = RouteKind::Blackhole;
        v.push(b6);
        for dst in ["2001:db8:10::", "2001:db8:11::", "::"] {
            three(&mut v, dst, if dst == "::" { 0 } else { 48 }, ("2001:db8::2", "2001:db8:1::2"), 1);
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whenever a delta is given it is exactly `compute`'s tables and
        /// the reconciler's ops for them, over random route churn.
        #[test]
        fn delta_is_compute(cover in any::<bool>(),
                            init in proptest::collection::vec(any::<bool>(), 96),
                            steps in proptest::collection::vec((0usize..96, any::<bool>(), 1usize..3), 1..25)) {
            let cands = candidates();
            assert!(cands.len() <= init.len());
            // The local /16 both covers main prefixes and turns source
            // checks to LPM; without it the deny set is kept.
            let mut st = if cover { base() } else { without_local_cover(base()) };
            for (r, on) in cands.iter().zip(&init) {
                if *on {
                    add(&mut st, r.clone());
                }
            }
            let mut w = World::new(st);
            for (i, on, n) in steps {
                // Now and then a next-hop object moves (a plain one and a
                // group): the routes using them are what changed.
                if i % 11 == 0 {
                    let gw = if on { "192.0.2.3" } else { "192.0.2.2" };
                    w.st.nexthops.insert(10, NexthopObject { hop: Some(hop(2, Some(gw))), ..object(10) });
                    let group = if on { vec![(10, 1), (12, 1)] } else { vec![(10, 1), (11, 2)] };
                    w.st.nexthops.insert(20, NexthopObject { group, ..object(20) });
                    let users = object_users(&w.st, &[10, 20]).expect("a few routes");
                    w.change(&users);
                    continue;
                }
                // n changes in one batch, as a debounced burst delivers them.
                let mut touched = Vec::new();
                for j in 0..n {
                    let r = &cands[(i + j * 7) % cands.len()];
                    if on ^ (j % 2 == 1) {
                        add(&mut w.st, r.clone());
                    } else {
                        w.st.routes.swap_remove(&key(r));
                    }
                    touched.push(key(r));
                }
                w.change(&touched);
            }
        }
    }
}
