//! Route changes with a full table in the kernel. `desired::compute`
//! recomputes every prefix, about a second at a million routes, so each BGP
//! update would reach the fast path a second late (and until then it
//! forwards by the old route). When only plain main-table routes changed and
//! nothing else did, only those prefixes' FIB entries can differ; when it is
//! also certain that nothing else derived from the FIB moves — the entries
//! forward through next hops the tables already hold and that stay in use,
//! or are punts whose only other trace is an IPv4 /32 source-deny entry
//! (computed here: remotely triggered blackholes are /32 routes), no ECMP
//! entry is involved, nothing was left out for lack of room and nothing will
//! be — `fib_delta` computes just those entries, with the functions
//! `compute` uses. Any doubt answers None and the caller recomputes
//! everything. What it needs of the untouched routes (the local tables, a
//! touched prefix's other routes, next hops' other users) comes from a
//! `DeltaBase` the caller carries from change to change, so a change costs
//! time in the prefixes it touches. A property test holds the result to
//! `compute`'s over chains of changes, and the carried base to a fresh one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::delta_base::DeltaBase;
use crate::desired::{self, reason, Intent, Prefix};
use crate::model::{Family, KernelState, RouteKey, RT_TABLE_MAIN};
use crate::overflow::Offload;
use crate::tables::{Capacities, Desired, NeighEntry, NeighKey, NexthopEntry, RouteAction, RouteEntry};

/// FIB entries to write (Some) or delete (None), and the IPv4 source-deny
/// entries that go with them, or neighbour entries (`neigh_delta`); only
/// entries that change.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FibDelta {
    pub v4: BTreeMap<(Ipv4Addr, u8), Option<RouteEntry>>,
    pub v6: BTreeMap<(Ipv6Addr, u8), Option<RouteEntry>>,
    pub deny4: BTreeMap<Ipv4Addr, Option<u8>>,
    /// Net change of FIB entries forwarding through each next hop id (none 0),
    /// for `DeltaBase::advance`.
    pub nh_uses: BTreeMap<u32, i64>,
    /// Neighbour entries to write or delete (`neigh_delta`).
    pub neigh: BTreeMap<NeighKey, Option<NeighEntry>>,
}

impl FibDelta {
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty() && self.deny4.is_empty() && self.neigh.is_empty()
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len() + self.deny4.len() + self.neigh.len()
    }

    /// `d` as it is once the delta is written.
    pub fn apply_to(&self, d: &mut Desired) {
        for (a, r) in &self.deny4 {
            match r {
                Some(r) => d.src_deny4.insert(*a, *r),
                None => d.src_deny4.remove(a),
            };
        }
        for (k, e) in &self.v4 {
            match e {
                Some(e) => d.fib4.insert(*k, *e),
                None => d.fib4.remove(k),
            };
        }
        for (k, e) in &self.v6 {
            match e {
                Some(e) => d.fib6.insert(*k, *e),
                None => d.fib6.remove(k),
            };
        }
        for (k, e) in &self.neigh {
            match e {
                Some(e) => d.neigh.insert(*k, *e),
                None => d.neigh.remove(k),
            };
        }
    }
}

/// The entries of the main-table prefixes in `touched` (route keys whose
/// routes were added, replaced or deleted since `applied` was computed
/// from the same state otherwise), or None when only a full `compute` is
/// exact. `offload` is the last full compute's.
pub fn fib_delta(
    applied: &Desired,
    offload: &Offload,
    base: &DeltaBase,
    state: &KernelState,
    touched: &[(Family, RouteKey)],
    caps: &Capacities,
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

    let ids: HashMap<&NexthopEntry, u32> = applied.nexthops.iter().map(|(id, hop)| (hop, *id)).collect();
    // Next hops that lose a user here, and those that gain one.
    let mut losing: HashSet<u32> = HashSet::new();
    let mut gaining: HashSet<u32> = HashSet::new();
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
                let id = *ids.get(&hop)?;
                gaining.insert(id);
                Some(RouteEntry { action: RouteAction::Forward { nh_id: id }, mtu })
            }
            Some(Intent::Act(a)) if act_ok(*fam, *p, &a) => Some(RouteEntry { action: a, mtu: 0 }),
            // Groups take group ids and buckets: not here.
            Some(_) => return None,
        };
        let old = match fam {
            Family::V4 => applied.fib4.get(&p.v4()),
            Family::V6 => applied.fib6.get(&p.v6()),
        };
        match old.map(|e| e.action) {
            None => {}
            Some(RouteAction::Forward { nh_id }) => {
                losing.insert(nh_id);
            }
            Some(a) if act_ok(*fam, *p, &a) => {}
            Some(_) => return None,
        }
        if old == new.as_ref() {
            continue;
        }
        for (e, n) in [(old, -1), (new.as_ref(), 1)] {
            if let Some(RouteEntry { action: RouteAction::Forward { nh_id }, .. }) = e {
                *delta.nh_uses.entry(*nh_id).or_default() += n;
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
    // A next hop nobody uses any more leaves `compute`'s tables.
    for id in losing.difference(&gaining) {
        if !still_used(applied, base, &delta, *id) {
            return None;
        }
    }
    delta.nh_uses.retain(|_, n| *n != 0);
    Some(delta)
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

/// Next hop `id` is referenced outside the prefixes `delta` changes (which
/// no longer forward through it).
fn still_used(applied: &Desired, base: &DeltaBase, delta: &FibDelta, id: u32) -> bool {
    let outside = i128::from(base.fwd_uses(id)) + i128::from(delta.nh_uses.get(&id).copied().unwrap_or(0));
    outside > 0
        || applied.groups.values().any(|g| g.paths.iter().any(|p| p.nh_id == id))
        || applied.res_buckets.values().any(|v| *v == id)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::desired::{compute, Ids};
    use crate::fixtures::{default_rules, delta_ops, ip, main_route, veth};
    use crate::model::{Addr, IfSysctl, NextHop, Neighbour, Route, RouteKind, RouteTarget, NUD_REACHABLE, RT_TABLE_LOCAL};

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
        st.rules = default_rules();
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
            fib_delta(&self.applied, &self.applied.offload, &self.base, &self.st, touched, &caps())
        }

        /// One change: the delta (if any) must give exactly `compute`'s
        /// tables, and the reconciler must write what `plan` would.
        fn change(&mut self, touched: &[(Family, RouteKey)]) -> bool {
            let d = self.delta(touched);
            let full = compute(&self.st, &managed(), &caps(), &mut self.ids);
            if let Some(d) = &d {
                let mut inc = self.applied.clone();
                d.apply_to(&mut inc);
                assert_eq!(inc, full, "delta {d:?}");
                let (want, got, _) = delta_ops(caps(), &self.applied, &full, d);
                assert_eq!(got, want);
                self.base.advance(touched, &d.nh_uses);
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
        w.st.routes.remove(&key(&moved));
        assert!(w.change(&[key(&moved)]));
        // Touched but unchanged: an empty delta.
        assert_eq!(w.delta(&[key(&moved)]), Some(FibDelta::default()));
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
        w.st.routes.remove(&key(&b));
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

        // A next hop the tables do not hold yet.
        let r = via("203.0.1.0", 24, 3, "198.51.100.3");
        add(&mut w.st, r.clone());
        assert!(!w.change(&[key(&r)]));
        // The last route via a next hop goes.
        let last = via("198.18.0.0", 15, 3, "198.51.100.2");
        w.st.routes.remove(&key(&last));
        assert!(w.delta(&[key(&last)]).is_none());
        w.change(&[key(&last)]);
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
        assert!(fib_delta(&w.applied, &o, &w.base, &w.st, &[key(&r)], &caps()).is_none());
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
        assert!(fib_delta(&w.applied, &w.applied.offload, &w.base, &st, &[key(&r)], &caps()).is_none());
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
                            init in proptest::collection::vec(any::<bool>(), 64),
                            steps in proptest::collection::vec((0usize..64, any::<bool>(), 1usize..3), 1..25)) {
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
                // n changes in one batch, as a debounced burst delivers them.
                let mut touched = Vec::new();
                for j in 0..n {
                    let r = &cands[(i + j * 7) % cands.len()];
                    if on ^ (j % 2 == 1) {
                        add(&mut w.st, r.clone());
                    } else {
                        w.st.routes.remove(&key(r));
                    }
                    touched.push(key(r));
                }
                w.change(&touched);
            }
        }
    }
}
