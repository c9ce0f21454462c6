//! zebra's routes and next-hop objects into the state `desired` computes
//! from, in place of the kernel's (the mirror keeps only the local table,
//! `RouteScope::LocalTable`). `overlay_all` replaces them wholesale (at
//! start, and whenever the state was rebuilt from a dump); `overlay_changes`
//! takes in only what changed since and says which route keys and
//! objects changed, so that the daemon can treat them as it treats the
//! kernel's route messages (route_delta).

use std::collections::HashMap;

use fastpath_core::mirror::Touched;
use fastpath_core::model::{Family, KernelState, Route, RouteKey, RT_TABLE_LOCAL};

use super::table::Table;

/// Replaces every route but the local table's, every next-hop object and
/// every bucket table in `state` with what zebra sent.
pub(super) fn overlay_all(t: &mut Table, state: &mut KernelState) {
    state.routes.retain(|(_, k), _| k.table == RT_TABLE_LOCAL);
    for s in t.routes.values() {
        // The local table follows the addresses, and the kernel owns those.
        if s.route.key.table != RT_TABLE_LOCAL {
            state.routes.insert((s.fam, s.route.key.clone()), s.route.clone());
        }
    }
    state.nexthops = t.nexthops.iter().map(|(id, (nh, _))| (*id, nh.clone())).collect();
    // zebra's groups carry no bucket table: resilient ones punt.
    state.res_buckets.clear();
    t.dirty = Default::default();
}

/// Brings `state`, overlaid before, up to date with what changed in `t`
/// since, and returns the route keys whose route changed and the objects
/// replaced or deleted (a new object touches nothing: nothing used it).
pub(super) fn overlay_changes(t: &mut Table, state: &mut KernelState) -> Touched {
    let d = std::mem::take(&mut t.dirty);
    let mut touched = Touched::default();
    let mut before: HashMap<(Family, RouteKey), Route> = HashMap::new();
    for k in d.old_keys {
        if k.1.table == RT_TABLE_LOCAL {
            continue;
        }
        if let Some(r) = state.routes.swap_remove(&k) {
            before.insert(k, r);
        }
    }
    for id in &d.routes {
        let Some(s) = t.routes.get(id) else { continue };
        if s.route.key.table == RT_TABLE_LOCAL {
            continue;
        }
        let k = (s.fam, s.route.key.clone());
        let prev = state.routes.insert(k.clone(), s.route.clone());
        let prev = before.remove(&k).or(prev);
        if prev.as_ref() != Some(&s.route) {
            touched.routes.push(k);
        }
    }
    touched.routes.extend(before.into_keys());
    for id in d.nexthops {
        let now = t.nexthops.get(&id).map(|(nh, _)| nh);
        if state.nexthops.get(&id) == now {
            continue;
        }
        let old = match now {
            Some(nh) => state.nexthops.insert(id, nh.clone()),
            None => state.nexthops.remove(&id),
        };
        if old.is_some() {
            touched.nexthops.push(id);
        }
    }
    touched
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use fastpath_core::model::{RouteKind, RouteTarget, RT_TABLE_MAIN};
    use fastpath_core::parse::{RTM_DELNEXTHOP, RTM_DELROUTE, RTM_NEWROUTE};

    use super::super::table::apply;
    use super::super::table::tests::{nexthop_msg, route_msg};
    use super::*;

    fn key(table: u32, dst: [u8; 4], len: u8, metric: u32) -> (Family, RouteKey) {
        (Family::V4, RouteKey { table, dst: IpAddr::from(dst), prefix_len: len, tos: 0, priority: metric })
    }

    /// A state with a local-table route and a kernel main-table route, as
    /// a mirror without the local-table scope would leave it.
    fn kernel_state() -> KernelState {
        let mut st = KernelState::default();
        for k in [key(RT_TABLE_LOCAL, [192, 0, 2, 254], 32, 0), key(RT_TABLE_MAIN, [192, 0, 2, 254], 8, 0)] {
            let r = Route { key: k.1.clone(), kind: RouteKind::Local, target: RouteTarget::None, mtu: 0, mtu_locked: false, encap: false, prefsrc: None };
            st.routes.insert(k, r);
        }
        st
    }

    fn del_nexthop(id: u32) -> Vec<u8> {
        let mut p = vec![2, 0, 0, 0, 0, 0, 0, 0];
        fastpath_core::parse::push_attr(&mut p, 1, &id.to_ne_bytes());
        fastpath_core::parse::request(RTM_DELNEXTHOP, 0x1, 1, &p)
    }

    #[test]
    fn routes_and_nexthops_replace_the_kernels_but_not_the_local_table() {
        let mut t = Table::default();
        let mut frame = nexthop_msg(42, 1);
        frame.extend(route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, Some(42)));
        frame.extend(route_msg(RTM_NEWROUTE, [203, 0, 113, 0], 24, 20, None));
        assert!(apply(&mut t, &frame));
        // An update arrives as delete (new metric) + add in one frame.
        let mut upd = route_msg(RTM_DELROUTE, [203, 0, 113, 0], 24, 30, None);
        upd.extend(route_msg(RTM_NEWROUTE, [203, 0, 113, 0], 24, 30, None));
        assert!(apply(&mut t, &upd));
        assert_eq!(t.routes.len(), 2);

        let mut st = kernel_state();
        overlay_all(&mut t, &mut st);
        assert!(st.routes.contains_key(&key(RT_TABLE_LOCAL, [192, 0, 2, 254], 32, 0)));
        assert!(!st.routes.contains_key(&key(RT_TABLE_MAIN, [192, 0, 2, 254], 8, 0)));
        assert_eq!(st.routes.len(), 3);
        assert!(st.nexthops.contains_key(&42));
        assert_eq!(st.routes[&key(RT_TABLE_MAIN, [198, 51, 100, 0], 24, 20)].target, RouteTarget::Object(42));
        assert!(st.routes.contains_key(&key(RT_TABLE_MAIN, [203, 0, 113, 0], 24, 30)));
        assert!(t.dirty.routes.is_empty() && t.dirty.old_keys.is_empty() && t.dirty.nexthops.is_empty());
    }

    /// Whatever happens between two overlays, `overlay_changes` leaves the
    /// state `overlay_all` would, and names exactly the keys that differ.
    #[test]
    fn changes_leave_what_a_full_overlay_leaves_and_name_what_differs() {
        let mut t = Table::default();
        let mut first = nexthop_msg(42, 1);
        first.extend(nexthop_msg(43, 2));
        first.extend(nexthop_msg(44, 3));
        for (i, nh) in [(1u8, Some(42)), (2, Some(43)), (3, None), (4, None), (5, Some(44))] {
            first.extend(route_msg(RTM_NEWROUTE, [198, 51, 100, i * 16], 28, 20, nh));
        }
        apply(&mut t, &first);
        let mut st = kernel_state();
        overlay_all(&mut t, &mut st);

        let mut frame = route_msg(RTM_NEWROUTE, [198, 51, 100, 16], 28, 20, Some(42)); // unchanged
        frame.extend(route_msg(RTM_NEWROUTE, [198, 51, 100, 32], 28, 20, Some(42))); // other object
        frame.extend(route_msg(RTM_DELROUTE, [198, 51, 100, 48], 28, 20, None)); // metric change
        frame.extend(route_msg(RTM_NEWROUTE, [198, 51, 100, 48], 28, 30, None));
        frame.extend(route_msg(RTM_DELROUTE, [198, 51, 100, 64], 28, 20, None)); // gone
        frame.extend(route_msg(RTM_NEWROUTE, [203, 0, 113, 0], 24, 20, None)); // added
        frame.extend(route_msg(RTM_NEWROUTE, [203, 0, 113, 128], 25, 20, None)); // added and gone
        frame.extend(route_msg(RTM_DELROUTE, [203, 0, 113, 128], 25, 20, None));
        frame.extend(nexthop_msg(43, 9)); // replaced
        frame.extend(nexthop_msg(45, 4)); // new
        frame.extend(nexthop_msg(44, 3)); // unchanged
        frame.extend(del_nexthop(42)); // deleted
        apply(&mut t, &frame);

        let mut full = st.clone();
        let dirty = std::mem::take(&mut t.dirty);
        overlay_all(&mut t, &mut full);
        t.dirty = dirty;
        let got = overlay_changes(&mut t, &mut st);
        assert_eq!(st, full);

        let mut routes = got.routes.clone();
        routes.sort();
        let mut want = vec![
            key(RT_TABLE_MAIN, [198, 51, 100, 32], 28, 20),
            key(RT_TABLE_MAIN, [198, 51, 100, 48], 28, 20),
            key(RT_TABLE_MAIN, [198, 51, 100, 48], 28, 30),
            key(RT_TABLE_MAIN, [198, 51, 100, 64], 28, 20),
            key(RT_TABLE_MAIN, [203, 0, 113, 0], 24, 20),
        ];
        want.sort();
        assert_eq!(routes, want);
        let mut objects = got.nexthops.clone();
        objects.sort();
        assert_eq!(objects, vec![42, 43]);
        assert!(!got.other && !got.neighbours);
        // Nothing left to take in.
        assert_eq!(overlay_changes(&mut t, &mut st), Touched::default());
        assert_eq!(st.routes.get(&key(RT_TABLE_LOCAL, [192, 0, 2, 254], 32, 0)).map(|r| r.kind), Some(RouteKind::Local));
    }
}
