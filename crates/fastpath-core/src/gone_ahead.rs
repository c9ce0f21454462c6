//! Routes through deleted next-hop objects, punted ahead of the re-dump.
//! `ip nexthop del` (or FRR retiring an object still in use) makes the
//! kernel drop every route using the object without a message for each;
//! the mirror learns that only from a route re-dump, and the recompute
//! after it: 1-3 s with a full table, during which the data path would go
//! on forwarding those prefixes by the deleted next hop. Punting them is
//! always safe (the kernel then decides, by whatever route is left);
//! `gone_ahead` gives those entries, and the recompute writes the exact
//! result after the re-dump.

use crate::desired::{reason, Prefix};
use crate::model::{Family, RouteKey, RT_TABLE_MAIN};
use crate::route_delta::FibDelta;
use crate::tables::{Desired, RouteAction, RouteEntry};

/// Punting entries for the prefixes of `users` (the routes that used the
/// deleted objects, `route_delta::object_users`) that the maps forward.
pub fn gone_ahead(applied: &Desired, users: &[(Family, RouteKey)]) -> FibDelta {
    let punt = RouteEntry { action: RouteAction::Punt { reason: reason::ROUTE_UNSUPPORTED }, mtu: 0 };
    let forwards =
        |e: Option<&RouteEntry>| matches!(e.map(|e| e.action), Some(RouteAction::Forward { .. } | RouteAction::Multipath { .. }));
    let mut d = FibDelta::default();
    for (fam, key) in users {
        if key.table != RT_TABLE_MAIN {
            continue;
        }
        let Some(p) = Prefix::new(*fam, &key.dst, key.prefix_len) else { continue };
        match fam {
            Family::V4 if forwards(applied.fib4.get(&p.v4())) => {
                d.v4.insert(p.v4(), Some(punt));
            }
            Family::V6 if forwards(applied.fib6.get(&p.v6())) => {
                d.v6.insert(p.v6(), Some(punt));
            }
            _ => {}
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::main_route;
    use crate::model::RouteTarget;
    use std::net::Ipv4Addr;

    #[test]
    fn forwarding_prefixes_of_the_users_are_punted() {
        let mut applied = Desired::default();
        let fwd = RouteEntry { action: RouteAction::Forward { nh_id: 1 }, mtu: 0 };
        let mp = RouteEntry { action: RouteAction::Multipath { group: 1 }, mtu: 0 };
        let black = RouteEntry { action: RouteAction::Blackhole, mtu: 0 };
        applied.fib4.insert((Ipv4Addr::new(203, 0, 113, 0), 24), fwd);
        applied.fib4.insert((Ipv4Addr::new(198, 51, 100, 0), 24), mp);
        applied.fib4.insert((Ipv4Addr::new(198, 18, 0, 0), 15), black);
        applied.fib6.insert(("2001:db8::".parse().unwrap(), 32), fwd);
        let key = |dst: &str, len| {
            let r = main_route(dst, len, RouteTarget::Object(7));
            (Family::of(&r.key.dst), r.key)
        };
        let mut local = key("203.0.113.0", 24);
        local.1.table = crate::model::RT_TABLE_LOCAL;
        let users = [key("203.0.113.0", 24), key("198.51.100.0", 24), key("198.18.0.0", 15), key("2001:db8::", 32), key("192.0.2.0", 24), local];
        let d = gone_ahead(&applied, &users);
        let punt = Some(RouteEntry { action: RouteAction::Punt { reason: reason::ROUTE_UNSUPPORTED }, mtu: 0 });
        assert_eq!(d.v4.len(), 2, "the two forwarding IPv4 prefixes, nothing else: {d:?}");
        assert_eq!(d.v4.get(&(Ipv4Addr::new(203, 0, 113, 0), 24)), Some(&punt));
        assert_eq!(d.v4.get(&(Ipv4Addr::new(198, 51, 100, 0), 24)), Some(&punt));
        assert_eq!(d.v6.len(), 1);
        assert!(d.nexthops.is_empty() && d.groups.is_empty() && d.deny4.is_empty());
    }
}
