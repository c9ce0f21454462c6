//! Neighbour changes with a full table in the kernel. A neighbour that
//! appears, goes, fails or changes its MAC used to recompute the whole
//! desired state: about a second with a million routes, for what is one
//! entry of fp_neigh4/fp_neigh6. A router facing many hosts sees such
//! changes all the time (an idle host's entry is garbage-collected, then
//! resolved again), so with a full table the daemon would never rest.
//! Nothing but the neighbour entries depends on neighbours
//! (`desired::neigh_entries`), so when they fit their capacity `neigh_delta`
//! computes them alone; when they do not, `compute` decides which are left
//! out and None sends the caller there. A property test holds the result
//! to `compute`'s.

use std::collections::BTreeMap;

use crate::desired;
use crate::model::KernelState;
use crate::route_delta::FibDelta;
use crate::tables::{Capacities, Desired};

/// The neighbour entries that differ between `applied` and what `state`
/// asks for (`managed`: ifindex -> slot, as for `compute`), or None when
/// only a full `compute` is exact. O(neighbours), not O(routes).
pub fn neigh_delta(
    applied: &Desired,
    state: &KernelState,
    managed: &BTreeMap<u32, u32>,
    caps: &Capacities,
) -> Option<FibDelta> {
    let want = desired::neigh_entries(state, managed);
    // More than fit: `compute` picks which are left out and says so. At
    // capacity before: some may have been left out, and the problem it
    // reported may be over now.
    if want.len() > caps.neigh as usize || applied.neigh.len() >= caps.neigh as usize {
        return None;
    }
    let mut d = FibDelta::default();
    for (k, e) in &want {
        if applied.neigh.get(k) != Some(e) {
            d.neigh.insert(*k, Some(*e));
        }
    }
    for k in applied.neigh.keys() {
        if !want.contains_key(k) {
            d.neigh.insert(*k, None);
        }
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use proptest::prelude::*;

    use super::*;
    use crate::desired::{compute, Ids};
    use crate::fixtures::{default_rules, delta_ops, ip, main_route, veth};
    use crate::model::{IfSysctl, NextHop, Neighbour, Route, RouteTarget, NUD_FAILED, NUD_INCOMPLETE, NUD_REACHABLE, NUD_STALE};
    use crate::tables::Op;

    fn caps(neigh: u32) -> Capacities {
        Capacities { fib4: 64, fib6: 64, nexthops: 32, neigh, ifaces: 16, groups: 8, buckets: 64 }
    }

    /// eth0 (2) and eth1 (3) managed, eth2 (4) not; a route via a gateway on
    /// each, so next hops and routes are there too.
    fn managed() -> BTreeMap<u32, u32> {
        [(2, 1), (3, 2)].into_iter().collect()
    }

    fn base() -> KernelState {
        let mut st = KernelState::default();
        for l in [veth(2, "eth0"), veth(3, "eth1"), veth(4, "eth2")] {
            st.if_sysctl.insert(l.ifindex, IfSysctl { forwarding4: true, forwarding6: true, mtu6: 1500, ..Default::default() });
            st.links.insert(l.ifindex, l);
        }
        st.sysctl.forwarding6_all = true;
        st.rules = default_rules();
        for (dst, ifindex, gw) in [("203.0.113.0", 2, "192.0.2.2"), ("198.18.0.0", 3, "198.51.100.2")] {
            let r: Route = main_route(dst, 24, RouteTarget::Single(NextHop { ifindex, gateway: Some(ip(gw)), flags: 0, weight: 1 }));
            st.routes.insert((crate::model::Family::of(&r.key.dst), r.key.clone()), r);
        }
        st
    }

    const ADDRS: [&str; 6] = ["192.0.2.2", "192.0.2.3", "198.51.100.2", "198.51.100.3", "2001:db8::2", "2001:db8:1::2"];
    const STATES: [u16; 4] = [NUD_REACHABLE, NUD_STALE, NUD_INCOMPLETE, NUD_FAILED];

    fn neighbour(ifindex: u32, addr: IpAddr, state: u16, mac: Option<u8>) -> Neighbour {
        Neighbour { ifindex, addr, mac: mac.map(|m| [2, 0, 0, 0, 9, m]), state, flags: 0 }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whenever a delta is given it is exactly `compute`'s tables and
        /// the reconciler writes what `plan` would, over random neighbour
        /// churn (states, MACs, unmanaged interfaces, a tight capacity).
        #[test]
        fn delta_is_compute(cap in 2u32..8,
                            steps in proptest::collection::vec(proptest::collection::vec(
                                (0usize..6, 2u32..5, 0usize..5, proptest::option::of(0u8..3)), 1..4), 1..30)) {
            let (caps, managed) = (caps(cap), managed());
            let mut st = base();
            let mut ids = Ids::new(caps.nexthops, caps.groups);
            let mut applied = compute(&st, &managed, &caps, &mut ids);
            // A few changes per step, as a debounced burst delivers them
            // (a swap at capacity needs its deletes first).
            for burst in steps {
                for (a, ifindex, s, mac) in burst {
                    let addr = ip(ADDRS[a]);
                    match STATES.get(s) {
                        Some(state) => drop(st.neighbours.insert((ifindex, addr), neighbour(ifindex, addr, *state, mac))),
                        None => drop(st.neighbours.remove(&(ifindex, addr))),
                    }
                }
                let d = neigh_delta(&applied, &st, &managed, &caps);
                let full = compute(&st, &managed, &caps, &mut ids);
                if let Some(d) = &d {
                    let mut inc = applied.clone();
                    d.apply_to(&mut inc);
                    prop_assert_eq!(&inc, &full, "delta {:?}", d);
                    let (want, got, r) = delta_ops(caps, &applied, &full, d);
                    prop_assert_eq!(got, want);
                    prop_assert_eq!(r.applied(), &full);
                } else {
                    prop_assert!(applied.neigh.len() == cap as usize || full.neigh.len() == cap as usize,
                                 "declined below capacity");
                }
                applied = full;
            }
        }
    }

    #[test]
    fn a_mac_change_is_one_entry_and_a_new_generation() {
        let (caps, managed) = (caps(8), managed());
        let mut st = base();
        let addr = ip("192.0.2.2");
        st.neighbours.insert((2, addr), neighbour(2, addr, NUD_REACHABLE, Some(1)));
        let mut ids = Ids::new(caps.nexthops, caps.groups);
        let applied = compute(&st, &managed, &caps, &mut ids);
        st.neighbours.insert((2, addr), neighbour(2, addr, NUD_REACHABLE, Some(2)));
        let d = neigh_delta(&applied, &st, &managed, &caps).expect("fits");
        assert_eq!(d.len(), 1);
        let full = compute(&st, &managed, &caps, &mut ids);
        let (_, got, r) = delta_ops(caps, &applied, &full, &d);
        assert!(matches!(got.as_slice(), [Op::UpsertNeigh(..), Op::BumpGeneration]), "{got:?}");
        // A move among usable states is no change at all.
        st.neighbours.insert((2, addr), neighbour(2, addr, NUD_STALE, Some(2)));
        assert!(neigh_delta(r.applied(), &st, &managed, &caps).expect("fits").is_empty());
    }

    #[test]
    fn a_swap_that_would_not_fit_deletes_first() {
        let (caps, managed) = (caps(2), managed());
        let mut st = base();
        let a = ip("192.0.2.2");
        st.neighbours.insert((2, a), neighbour(2, a, NUD_REACHABLE, Some(1)));
        let mut ids = Ids::new(caps.nexthops, caps.groups);
        let applied = compute(&st, &managed, &caps, &mut ids);
        st.neighbours.remove(&(2, a));
        for b in ["192.0.2.3", "198.51.100.2"] {
            let (i, b) = (if b.starts_with("192") { 2 } else { 3 }, ip(b));
            st.neighbours.insert((i, b), neighbour(i, b, NUD_REACHABLE, Some(1)));
        }
        let d = neigh_delta(&applied, &st, &managed, &caps).expect("two fit");
        let full = compute(&st, &managed, &caps, &mut ids);
        let (want, got, _) = delta_ops(caps, &applied, &full, &d);
        assert_eq!(got, want);
        assert!(matches!(got.as_slice(), [Op::DeleteNeigh(..), Op::UpsertNeigh(..), Op::UpsertNeigh(..), Op::BumpGeneration]), "{got:?}");
    }

    #[test]
    fn more_neighbours_than_fit_or_a_full_table_take_the_full_compute() {
        let (caps, managed) = (caps(1), managed());
        let mut st = base();
        let mut ids = Ids::new(caps.nexthops, caps.groups);
        let applied = compute(&st, &managed, &caps, &mut ids);
        for a in ["192.0.2.2", "192.0.2.3"] {
            st.neighbours.insert((2, ip(a)), neighbour(2, ip(a), NUD_REACHABLE, Some(1)));
        }
        assert!(neigh_delta(&applied, &st, &managed, &caps).is_none());
        // One fits, but the table was full: it may have left one out.
        st.neighbours.remove(&(2, ip("192.0.2.3")));
        let applied = compute(&st, &managed, &caps, &mut ids);
        assert_eq!(applied.neigh.len(), 1);
        st.neighbours.remove(&(2, ip("192.0.2.2")));
        assert!(neigh_delta(&applied, &st, &managed, &caps).is_none());
    }
}
