//! Local-table routes written ahead of a full recompute. An address added to
//! the router (a VRRP/keepalived virtual address taken over, an anycast
//! service address) comes with its local-table routes, and a local-table
//! change is never a route-only delta: the daemon recomputes every table,
//! about a second with a full table, during which the data path would go on
//! forwarding packets for the new address to wherever the old route pointed
//! (the previous owner of a virtual address, typically). The recompute cannot
//! forward anything to or under a local or broadcast route, so making the
//! data path punt there first is always safe: `local_ahead` gives the FIB
//! entries that do it (the route's own prefix, and what the maps hold
//! inside it) and the source-deny entries of new own IPv4 addresses, as a
//! `FibDelta` the reconciler writes like any other. Removals (the address
//! gone) wait for the recompute: until then its traffic is still punted.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::desired::{reason, Prefix};
use crate::model::{Family, KernelState, RouteKey, RouteKind, RT_TABLE_LOCAL};
use crate::route_delta::FibDelta;
use crate::tables::{Capacities, Desired, RouteAction, RouteEntry};

/// A local route covering more FIB entries than this is left to the
/// recompute (an AnyIP `local 0.0.0.0/0` would rewrite the whole table).
const MAX_COVERED: usize = 4096;

/// The punting entries that the touched local-table routes of `state` make
/// necessary before the recompute (`touched`: the mirror's route keys since
/// the last reconcile), and with `addresses` (they may have changed) the
/// source-deny entries of own IPv4 addresses the maps do not deny yet.
/// Empty when nothing is missing. New entries that would not fit their map
/// are left to the recompute.
pub fn local_ahead(
    applied: &Desired,
    state: &KernelState,
    touched: &[(Family, RouteKey)],
    addresses: bool,
    caps: &Capacities,
) -> FibDelta {
    let mut d = FibDelta::default();
    for (fam, key) in touched {
        if key.table != RT_TABLE_LOCAL || applied.switches.table_full & fam.bit() != 0 {
            continue;
        }
        let Some(route) = state.routes.get(&(*fam, key.clone())) else { continue };
        let action = match route.kind {
            RouteKind::Local | RouteKind::Anycast => RouteAction::Local,
            RouteKind::Broadcast | RouteKind::Multicast => RouteAction::Punt { reason: reason::MULTICAST },
            _ => continue,
        };
        let entry = RouteEntry { action, mtu: 0 };
        let Some(p) = Prefix::new(*fam, &key.dst, key.prefix_len) else { continue };
        let last = p.last(*fam);
        match fam {
            Family::V4 => cover(&applied.fib4, &mut d.v4, (p.v4(), (p.v4().0, 0), last.v4()), entry),
            Family::V6 => cover(&applied.fib6, &mut d.v6, (p.v6(), (p.v6().0, 0), last.v6()), entry),
        }
    }
    if applied.fib4.len() + new_entries(&applied.fib4, &d.v4) > caps.fib4 as usize {
        d.v4.retain(|k, _| applied.fib4.contains_key(k));
    }
    if applied.fib6.len() + new_entries(&applied.fib6, &d.v6) > caps.fib6 as usize {
        d.v6.retain(|k, _| applied.fib6.contains_key(k));
    }
    // With LPM source checks (src_lpm) the local FIB entry refuses the source
    // itself; otherwise the deny set does, sized like fib4.
    if addresses && applied.switches.src_lpm & Family::V4.bit() == 0 {
        for a in state.addrs.keys() {
            if let IpAddr::V4(v4) = a.addr {
                if applied.src_deny4.get(&v4) != Some(&reason::MARTIAN) {
                    d.deny4.insert(v4, Some(reason::MARTIAN));
                }
            }
        }
        let new = d.deny4.keys().filter(|a| !applied.src_deny4.contains_key(a)).count();
        if applied.src_deny4.len() + new > caps.fib4 as usize {
            d.deny4.retain(|a, _| applied.src_deny4.contains_key(a));
        }
    }
    d
}

/// The prefix and every FIB key inside it, from the first to the last.
type Range<A> = ((A, u8), (A, u8), (A, u8));

/// `entry` at the prefix and over every applied entry inside it that differs.
fn cover<A: Ord + Copy>(
    fib: &BTreeMap<(A, u8), RouteEntry>,
    out: &mut BTreeMap<(A, u8), Option<RouteEntry>>,
    (prefix, lo, hi): Range<A>,
    entry: RouteEntry,
) {
    let inside: Vec<(A, u8)> = fib
        .range(lo..=hi)
        .filter(|(k, e)| k.1 > prefix.1 && **e != entry)
        .map(|(k, _)| *k)
        .take(MAX_COVERED + 1)
        .collect();
    if inside.len() > MAX_COVERED {
        return;
    }
    if fib.get(&prefix) != Some(&entry) {
        out.insert(prefix, Some(entry));
    }
    for k in inside {
        out.insert(k, Some(entry));
    }
}

fn new_entries<K: Ord>(fib: &BTreeMap<K, RouteEntry>, d: &BTreeMap<K, Option<RouteEntry>>) -> usize {
    d.iter().filter(|(k, e)| e.is_some() && !fib.contains_key(k)).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{compute, Ids};
    use crate::fixtures::{default_rules, ip, main_route, veth};
    use crate::model::{Addr, IfSysctl, NextHop, Route, RouteTarget};

    const ROOMY: Capacities = Capacities { fib4: 1024, fib6: 1024, nexthops: 64, neigh: 64, ifaces: 8, groups: 8, buckets: 64 };

    fn via(gw: &str) -> RouteTarget {
        RouteTarget::Single(NextHop { ifindex: 3, gateway: Some(ip(gw)), flags: 0, weight: 1 })
    }

    fn local(dst: &str, len: u8, kind: RouteKind) -> Route {
        let mut r = main_route(dst, len, RouteTarget::Single(NextHop { ifindex: 2, gateway: None, flags: 0, weight: 1 }));
        r.key.table = RT_TABLE_LOCAL;
        r.kind = kind;
        r
    }

    fn base() -> KernelState {
        let mut st = KernelState { rules: default_rules(), ..Default::default() };
        for (i, n) in [(2, "r0"), (3, "r1")] {
            st.links.insert(i, veth(i, n));
            st.if_sysctl.insert(i, IfSysctl { forwarding4: true, forwarding6: true, ..Default::default() });
        }
        st.sysctl.forwarding6_all = true;
        for r in [
            main_route("198.51.100.0", 24, via("203.0.113.1")),
            main_route("198.51.100.7", 32, via("203.0.113.1")),
            main_route("2001:db8:5::", 48, via("2001:db8::1")),
        ] {
            st.routes.insert((Family::of(&r.key.dst), r.key.clone()), r);
        }
        st
    }

    fn applied(st: &KernelState) -> Desired {
        applied_with(st, &ROOMY)
    }

    fn applied_with(st: &KernelState, caps: &Capacities) -> Desired {
        let managed: BTreeMap<u32, u32> = [(2, 1), (3, 2)].into();
        compute(st, &managed, caps, &mut Ids::default())
    }

    fn add(st: &mut KernelState, r: Route) -> (Family, RouteKey) {
        let k = (Family::of(&r.key.dst), r.key.clone());
        st.routes.insert(k.clone(), r);
        k
    }

    #[test]
    fn a_new_address_punts_at_once_and_the_recompute_agrees() {
        let before = base();
        let a = applied(&before);
        let mut st = before.clone();
        st.addrs.insert(Addr { ifindex: 2, addr: ip("198.51.100.7"), prefix_len: 32 }, ());
        let touched = vec![
            add(&mut st, local("198.51.100.7", 32, RouteKind::Local)),
            add(&mut st, local("2001:db8:5::1", 128, RouteKind::Local)),
        ];
        let d = local_ahead(&a, &st, &touched, true, &ROOMY);
        let loc = Some(RouteEntry { action: RouteAction::Local, mtu: 0 });
        assert_eq!(d.v4.get(&("198.51.100.7".parse().unwrap(), 32)), Some(&loc));
        assert_eq!(d.v6.get(&("2001:db8:5::1".parse().unwrap(), 128)), Some(&loc));
        // This table makes source checks LPM (a punted /24): the FIB entry refuses the source.
        assert_ne!(a.switches.src_lpm, 0);
        assert!(d.deny4.is_empty());
        // What the recompute then writes for these keys is what was written ahead.
        let full = applied(&st);
        for (k, e) in &d.v4 {
            assert_eq!(full.fib4.get(k), e.as_ref(), "{k:?}");
        }
        for (k, e) in &d.v6 {
            assert_eq!(full.fib6.get(k), e.as_ref(), "{k:?}");
        }
        // Once written, nothing is missing any more.
        let mut after = a.clone();
        d.apply_to(&mut after);
        assert!(local_ahead(&after, &st, &touched, true, &ROOMY).is_empty());
    }

    #[test]
    fn without_lpm_source_checks_a_new_address_is_denied_as_a_source() {
        let mut a = applied(&base());
        a.switches.src_lpm = 0;
        let mut st = base();
        st.addrs.insert(Addr { ifindex: 2, addr: ip("198.51.100.7"), prefix_len: 32 }, ());
        st.addrs.insert(Addr { ifindex: 2, addr: ip("2001:db8:5::1"), prefix_len: 128 }, ());
        // Only route messages since the last reconcile: addresses are not looked at.
        assert!(local_ahead(&a, &st, &[], false, &ROOMY).is_empty());
        let d = local_ahead(&a, &st, &[], true, &ROOMY);
        assert_eq!(d.deny4.into_iter().collect::<Vec<_>>(), vec![("198.51.100.7".parse().unwrap(), Some(reason::MARTIAN))]);
        a.src_deny4.insert("198.51.100.7".parse().unwrap(), reason::MARTIAN);
        assert!(local_ahead(&a, &st, &[], true, &ROOMY).is_empty());
        // A full deny set takes nothing new.
        a.src_deny4.remove(&"198.51.100.7".parse().unwrap());
        let none = Capacities { fib4: a.src_deny4.len() as u32, ..ROOMY };
        assert!(local_ahead(&a, &st, &[], true, &none).deny4.is_empty());
    }

    #[test]
    fn a_local_prefix_covers_what_the_maps_hold_inside_it() {
        let before = base();
        let a = applied(&before);
        let mut st = before.clone();
        let touched = vec![
            add(&mut st, local("198.51.100.0", 25, RouteKind::Local)),
            add(&mut st, local("198.51.100.255", 32, RouteKind::Broadcast)),
            // Not local-table, or not a punting kind: nothing ahead.
            add(&mut st, main_route("203.0.113.0", 25, via("203.0.113.1"))),
        ];
        let d = local_ahead(&a, &st, &touched, true, &ROOMY);
        let keys: Vec<_> = d.v4.keys().map(|(a, l)| format!("{a}/{l}")).collect();
        assert_eq!(keys, ["198.51.100.0/25", "198.51.100.7/32", "198.51.100.255/32"]);
        assert_eq!(d.v4[&("198.51.100.255".parse().unwrap(), 32)].unwrap().action, RouteAction::Punt { reason: reason::MULTICAST });
        assert!(d.v4.values().all(|e| !matches!(e.unwrap().action, RouteAction::Forward { .. } | RouteAction::Multipath { .. })));
    }

    #[test]
    fn new_entries_that_do_not_fit_wait_for_the_recompute() {
        let before = base();
        let a = applied(&before);
        let mut st = before.clone();
        let touched = vec![
            add(&mut st, local("198.51.100.7", 32, RouteKind::Local)),
            add(&mut st, local("192.0.2.1", 32, RouteKind::Local)),
        ];
        let tight = Capacities { fib4: a.fib4.len() as u32, ..ROOMY };
        let d = local_ahead(&a, &st, &touched, true, &tight);
        // The existing /32 is rewritten in place; the new one would not fit.
        let keys: Vec<_> = d.v4.keys().map(|(a, l)| format!("{a}/{l}")).collect();
        assert_eq!(keys, ["198.51.100.7/32"]);
        // A family already punted as a whole gets nothing.
        let mut full = a.clone();
        full.switches.table_full = Family::V4.bit();
        assert!(local_ahead(&full, &st, &touched, true, &ROOMY).v4.is_empty());
    }

    #[test]
    fn a_huge_local_prefix_is_left_to_the_recompute() {
        let mut before = base();
        for i in 0..=MAX_COVERED as u32 {
            add(&mut before, main_route(&std::net::Ipv4Addr::from(0x0a00_0000 + (i << 8)).to_string(), 24, via("203.0.113.1")));
        }
        let caps = Capacities { fib4: 1 << 16, ..ROOMY };
        let a = applied_with(&before, &caps);
        let mut st = before.clone();
        let touched = vec![add(&mut st, local("10.0.0.0", 8, RouteKind::Local))];
        assert!(local_ahead(&a, &st, &touched, true, &caps).v4.is_empty());
        // One fewer inside: all of them, and the prefix.
        let mut fewer = a.clone();
        fewer.fib4.remove(&("10.0.0.0".parse().unwrap(), 24));
        assert_eq!(local_ahead(&fewer, &st, &touched, true, &caps).v4.len(), MAX_COVERED + 1);
    }
}
