//! Root-only: the mirror against a real kernel, inside a network namespace the
//! test thread unshares for itself (plus, for neigh_use, a named peer netns).
//! Without root these skip with a message; under CI=true they fail instead.

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use support::{have_root, in_new_netns, sh};

use fastpath_core::mirror::{neigh_use, Mirror, MirrorError, PollOutcome, RouteScope};
use fastpath_core::model::{
    Family, KernelState, NextHop, RouteKey, RouteKind, RouteTarget, NUD_DELAY, NUD_REACHABLE,
    NUD_STALE, RT_TABLE_LOCAL, RT_TABLE_MAIN,
};




fn ip(s: &str) -> IpAddr {
    s.parse().expect("address literal")
}

fn ifindex(st: &KernelState, name: &str) -> u32 {
    st.links
        .values()
        .find(|l| l.name == name)
        .map(|l| l.ifindex)
        .unwrap_or_else(|| panic!("no link {name}"))
}

fn key(table: u32, dst: &str, prefix_len: u8, priority: u32) -> RouteKey {
    RouteKey {
        table,
        dst: ip(dst),
        prefix_len,
        tos: 0,
        priority,
    }
}

/// Keys of `a` whose entry `b` lacks or holds otherwise (at most five).
fn differing<'a, K: std::fmt::Debug + 'a, V: PartialEq + 'a>(
    a: impl Iterator<Item = (&'a K, &'a V)>,
    in_b: impl Fn(&K) -> Option<&'a V>,
) -> Vec<String> {
    a.filter(|(k, v)| in_b(k) != Some(*v)).map(|(k, _)| format!("{k:?}")).take(5).collect()
}

/// What differs between the followed state and a fresh dump, by table.
fn drift(st: &KernelState, fresh: &KernelState) -> String {
    let mut out = Vec::new();
    let mut table = |name: &str, followed: Vec<String>, kernel: Vec<String>| {
        if !followed.is_empty() || !kernel.is_empty() {
            out.push(format!("{name}: followed only or otherwise {followed:?}, kernel only or otherwise {kernel:?}"));
        }
    };
    table("links", differing(st.links.iter(), |k| fresh.links.get(k)), differing(fresh.links.iter(), |k| st.links.get(k)));
    table("addrs", differing(st.addrs.iter(), |k| fresh.addrs.get(k)), differing(fresh.addrs.iter(), |k| st.addrs.get(k)));
    table("routes", differing(st.routes.iter(), |k| fresh.routes.get(k)), differing(fresh.routes.iter(), |k| st.routes.get(k)));
    table("nexthops", differing(st.nexthops.iter(), |k| fresh.nexthops.get(k)), differing(fresh.nexthops.iter(), |k| st.nexthops.get(k)));
    table(
        "neighbours",
        differing(st.neighbours.iter(), |k| fresh.neighbours.get(k)),
        differing(fresh.neighbours.iter(), |k| st.neighbours.get(k)),
    );
    table("if_sysctl", differing(st.if_sysctl.iter(), |k| fresh.if_sysctl.get(k)), differing(fresh.if_sysctl.iter(), |k| st.if_sysctl.get(k)));
    if st.res_buckets != fresh.res_buckets {
        out.push("res_buckets differ".into());
    }
    if st.rules != fresh.rules {
        out.push("rules differ".into());
    }
    if st.sysctl != fresh.sysctl {
        out.push(format!("sysctl: followed {:?}, kernel {:?}", st.sysctl, fresh.sysctl));
    }
    out.join("; ")
}

/// The followed state catches up with a fresh dump (`same` says what must
/// agree) within two seconds. A veth's peer keeps the kernel busy on its
/// own (router solicitations, MLD reports, the neighbour entries they
/// create), so a dump taken the moment a predicate first holds may show an
/// event the mirror has not read yet; what a missed silent change leaves
/// behind stays, and fails with the difference.
fn assert_in_step(m: &mut Mirror, st: &mut KernelState, what: &str, same: impl Fn(&KernelState, &KernelState) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let fresh = m.dump().expect("dump");
        if same(st, &fresh) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {}", drift(st, &fresh));
        m.poll(st, Duration::from_millis(100), &mut |_, _| {}).expect("poll");
    }
}

/// Polls until `pred` holds (or panics after a few seconds).
fn poll_until(m: &mut Mirror, st: &mut KernelState, what: &str, pred: impl Fn(&KernelState) -> bool) {
    poll_until_ahead(m, st, what, pred, &mut |_| {});
}

/// `poll_until`, handing every state `poll`'s `ahead` hook sees to `seen`.
fn poll_until_ahead(
    m: &mut Mirror,
    st: &mut KernelState,
    what: &str,
    pred: impl Fn(&KernelState) -> bool,
    seen: &mut dyn FnMut(&KernelState),
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pred(st) {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        m.poll(st, Duration::from_millis(100), &mut |s, _| seen(s)).expect("poll");
    }
}

#[test]
fn dump_and_follow() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        sh("ip link add fpt0 type veth peer name fpt1 && ip link set fpt0 up && ip link set fpt1 up \
            && ip addr add 192.0.2.1/24 dev fpt0 && ip -6 addr add 2001:db8:1::1/64 dev fpt0 nodad \
            && ip route add 198.51.100.0/24 via 192.0.2.2 \
            && ip -6 route add 2001:db8:2::/64 via 2001:db8:1::2");
        let mut m = Mirror::open(4 << 20).expect("open");
        let mut st = m.dump().expect("dump");
        let t0 = ifindex(&st, "fpt0");
        let link = &st.links[&t0];
        assert_eq!(link.kind.as_deref(), Some("veth"));
        assert!(link.admin_up && link.mac.is_some() && link.mtu == 1500 && link.arphrd == 1);
        assert!(st
            .addrs
            .keys()
            .any(|a| a.ifindex == t0 && a.addr == ip("192.0.2.1") && a.prefix_len == 24));
        let r = &st.routes[&(Family::V4, key(RT_TABLE_MAIN, "198.51.100.0", 24, 0))];
        assert_eq!(r.kind, RouteKind::Unicast);
        assert_eq!(
            r.target,
            RouteTarget::Single(NextHop {
                ifindex: t0,
                gateway: Some(ip("192.0.2.2")),
                flags: 0,
                weight: 1
            })
        );
        assert_eq!(
            st.routes[&(Family::V4, key(RT_TABLE_LOCAL, "192.0.2.1", 32, 0))].kind,
            RouteKind::Local
        );
        assert!(st
            .routes
            .contains_key(&(Family::V6, key(RT_TABLE_MAIN, "2001:db8:2::", 64, 1024))));
        // The three default rules per family.
        assert_eq!(
            st.rules
                .iter()
                .filter(|r| r.family == Family::V4 && !r.has_selectors)
                .count(),
            3
        );
        assert!(!st.if_sysctl[&t0].forwarding4);

        // Plain add / delete.
        sh("ip route add 203.0.113.0/25 via 192.0.2.2 metric 7");
        let k = (Family::V4, key(RT_TABLE_MAIN, "203.0.113.0", 25, 7));
        poll_until(&mut m, &mut st, "route add", |s| s.routes.contains_key(&k));
        sh("ip route del 203.0.113.0/25 via 192.0.2.2 metric 7");
        poll_until(&mut m, &mut st, "route del", |s| !s.routes.contains_key(&k));

        // IPv4 aliases: `append` keeps both routes under one key and the kernel uses the first.
        // We punt the prefix while both exist, and follow the survivor.
        sh("ip route add 203.0.113.0/25 via 192.0.2.2 && ip route append 203.0.113.0/25 via 192.0.2.3");
        let k = (Family::V4, key(RT_TABLE_MAIN, "203.0.113.0", 25, 0));
        poll_until(&mut m, &mut st, "v4 alias punted", |s| {
            s.routes
                .get(&k)
                .is_some_and(|r| r.kind == RouteKind::Other(1))
        });
        sh("ip route del 203.0.113.0/25 via 192.0.2.2");
        poll_until(&mut m, &mut st, "v4 alias survivor", |s| {
            matches!(&s.routes.get(&k).map(|r| &r.target),
                Some(RouteTarget::Single(h)) if h.gateway == Some(ip("192.0.2.3")))
        });
        sh("ip route del 203.0.113.0/25");
        poll_until(&mut m, &mut st, "v4 alias gone", |s| {
            !s.routes.contains_key(&k)
        });

        // IPv4 route via an IPv6 gateway (RTA_VIA).
        sh("ip route add 203.0.113.128/25 via inet6 2001:db8:1::2 dev fpt0");
        let k = (Family::V4, key(RT_TABLE_MAIN, "203.0.113.128", 25, 0));
        poll_until(&mut m, &mut st, "v4 via v6", |s| {
            matches!(&s.routes.get(&k).map(|r| &r.target),
                Some(RouteTarget::Single(h)) if h.gateway == Some(ip("2001:db8:1::2")))
        });

        // IPv6 multipath, then one member deleted (the kernel announces only that member).
        sh("ip -6 route add 2001:db8:3::/64 nexthop via 2001:db8:1::2 dev fpt0 nexthop via 2001:db8:1::3 dev fpt0");
        let k = (Family::V6, key(RT_TABLE_MAIN, "2001:db8:3::", 64, 1024));
        poll_until(
            &mut m,
            &mut st,
            "v6 multipath",
            |s| matches!(&s.routes.get(&k).map(|r| &r.target), Some(RouteTarget::Multipath(v)) if v.len() == 2),
        );
        sh("ip -6 route del 2001:db8:3::/64 via 2001:db8:1::3 dev fpt0");
        poll_until(&mut m, &mut st, "v6 multipath member delete", |s| {
            matches!(&s.routes.get(&k).map(|r| &r.target),
                Some(RouteTarget::Single(h)) if h.gateway == Some(ip("2001:db8:1::2")))
        });

        // Appending to an IPv6 route makes it multipath; the event carries the whole set.
        sh("ip -6 route append 2001:db8:3::/64 via 2001:db8:1::4 dev fpt0");
        poll_until(
            &mut m,
            &mut st,
            "v6 append",
            |s| matches!(&s.routes.get(&k).map(|r| &r.target), Some(RouteTarget::Multipath(v)) if v.len() == 2),
        );

        // Next-hop objects and a route using a group; deleting the group takes the route.
        sh("ip nexthop add id 10 via 192.0.2.2 dev fpt0 && ip nexthop add id 11 via 192.0.2.3 dev fpt0 \
            && ip nexthop add id 20 group 10/11,3 && ip route add 198.51.100.128/25 nhid 20");
        let k = (Family::V4, key(RT_TABLE_MAIN, "198.51.100.128", 25, 0));
        poll_until(&mut m, &mut st, "nexthop group route", |s| {
            s.routes.get(&k).map(|r| &r.target) == Some(&RouteTarget::Object(20))
                && s.nexthops.get(&20).map(|n| n.group.clone()) == Some(vec![(10, 1), (11, 3)])
                && s.nexthops
                    .get(&10)
                    .and_then(|n| n.hop.as_ref())
                    .map(|h| h.gateway)
                    == Some(Some(ip("192.0.2.2")))
        });
        sh("ip nexthop del id 20");
        poll_until(&mut m, &mut st, "nexthop delete", |s| {
            !s.routes.contains_key(&k) && !s.nexthops.contains_key(&20)
        });

        // Netconf: forwarding switched on for the device.
        sh("sysctl -qw net.ipv4.conf.fpt0.forwarding=1");
        poll_until(&mut m, &mut st, "netconf", |s| {
            s.if_sysctl.get(&t0).is_some_and(|c| c.forwarding4)
        });
        sh("sysctl -qw net.ipv4.conf.all.rp_filter=2");
        assert!(m.refresh_sysctls(&mut st).unwrap());
        assert_eq!(st.if_sysctl[&t0].rp_filter, 2);
        assert!(!m.refresh_sysctls(&mut st).unwrap());

        // Link down: IPv4 flushes its routes via fpt0 without a message per route.
        let k = (Family::V4, key(RT_TABLE_MAIN, "198.51.100.0", 24, 0));
        sh("ip link set fpt0 down");
        poll_until(&mut m, &mut st, "link down flush", |s| {
            !s.routes.contains_key(&k) && s.links.get(&t0).is_some_and(|l| !l.admin_up)
        });

        // Address removed: the connected routes go with it.
        sh("ip link set fpt0 up && ip route add 198.51.100.0/24 via 192.0.2.2");
        poll_until(&mut m, &mut st, "route back", |s| s.routes.contains_key(&k));
        sh("ip addr del 192.0.2.1/24 dev fpt0");
        poll_until(&mut m, &mut st, "addr del flush", |s| {
            !s.routes.contains_key(&k) && !s.addrs.keys().any(|a| a.addr == ip("192.0.2.1"))
        });

        // Link deleted: everything of it goes.
        sh("ip link del fpt0");
        poll_until(&mut m, &mut st, "link del", |s| {
            !s.links.contains_key(&t0)
                && !s.addrs.keys().any(|a| a.ifindex == t0)
                && !s.if_sysctl.contains_key(&t0)
        });
        assert_eq!(m.resyncs(), 0);
        // The followed state equals a fresh dump.
        assert_in_step(&mut m, &mut st, "followed state drifted from the kernel", |a, b| a == b);
    });
}

/// IPv6 switched off on a link takes its IPv6 routes with it, and on again
/// brings its link-local route back; with skip_notify_on_dev_down neither
/// is announced, and only the addresses' messages tell. The mirror re-reads
/// the link's sysctls on those and re-dumps the routes when disable_ipv6
/// changed: it follows the kernel either way.
#[test]
fn ipv6_switched_off_and_on_without_route_messages() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        sh("sysctl -qw net.ipv6.route.skip_notify_on_dev_down=1 \
            && ip link add fpt0 type veth peer name fpt1 && ip link set fpt0 up && ip link set fpt1 up \
            && ip addr add 2001:db8:1::1/64 dev fpt0 nodad \
            && ip -6 route add 2001:db8:2::/64 via 2001:db8:1::2");
        let mut m = Mirror::open(4 << 20).expect("open");
        let mut st = m.dump().expect("dump");
        let t0 = ifindex(&st, "fpt0");
        let k = (Family::V6, key(RT_TABLE_MAIN, "2001:db8:2::", 64, 1024));
        assert!(st.routes.contains_key(&k), "{:?}", st.routes.keys().collect::<Vec<_>>());
        let ll = |s: &KernelState| s.routes.keys().any(|(f, r)| *f == Family::V6 && r.table == RT_TABLE_MAIN && r.dst == ip("fe80::"));

        sh("sysctl -qw net.ipv6.conf.fpt0.disable_ipv6=1");
        poll_until(&mut m, &mut st, "IPv6 off: its routes gone", |s| {
            s.if_sysctl.get(&t0).is_some_and(|c| c.disable_ipv6) && !s.routes.contains_key(&k)
        });
        assert_in_step(&mut m, &mut st, "state drifted from the kernel after IPv6 went off", |a, b| a == b);

        sh("sysctl -qw net.ipv6.conf.fpt0.disable_ipv6=0");
        poll_until(&mut m, &mut st, "IPv6 on: the link-local route back", |s| {
            s.if_sysctl.get(&t0).is_some_and(|c| !c.disable_ipv6) && ll(s)
        });
        // The link-local address may still be tentative (DAD); the routes are what matters.
        assert_in_step(&mut m, &mut st, "routes drifted from the kernel after IPv6 came back", |a, b| {
            a.routes == b.routes
        });
        assert_eq!(m.resyncs(), 0);
    });
}

/// The state `poll` shows its `ahead` hook: link and sysctl changes are in,
/// the route re-dump they trigger is not yet (with a full table it takes
/// seconds, and what a link change takes away must not wait for it).
#[test]
fn ahead_sees_link_changes_before_the_route_redump() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        // fpt1 lives in a peer namespace: its own messages (down, its IPv6
        // addresses and routes gone) would make the mirror re-dump the
        // routes, and when linkwatch had already taken fpt0's carrier by
        // then, that re-dump caught the linkdown mark before fpt0's link
        // message arrived, so `ahead` never had a chance to see it first.
        let peer = PeerNs(format!("fpm-{}-ahead", std::process::id()));
        let p = &peer.0;
        sh(&format!(
            "ip netns add {p} && ip link add fpt0 type veth peer name fpt1 netns {p} \
             && ip link set fpt0 up && ip -n {p} link set fpt1 up \
             && ip addr add 192.0.2.1/24 dev fpt0 && ip route add 198.51.100.0/24 via 192.0.2.2 \
             && sysctl -qw net.ipv4.conf.fpt0.forwarding=1"
        ));
        let mut m = Mirror::open(4 << 20).expect("open");
        let mut st = m.dump().expect("dump");
        let t0 = ifindex(&st, "fpt0");
        let rk = (Family::V4, key(RT_TABLE_MAIN, "198.51.100.0", 24, 0));
        let linkdown = |st: &KernelState| match &st.routes[&rk].target {
            RouteTarget::Single(h) => h.flags & 16 != 0,
            t => panic!("unexpected target {t:?}"),
        };
        poll_until(&mut m, &mut st, "fpt0 to have carrier", |s| s.links[&t0].running);
        assert!(!linkdown(&st));

        // Carrier loss: the kernel re-marks the route (RTNH_F_LINKDOWN)
        // without a message; fpt0's link message (carrier off) comes when
        // linkwatch runs, up to a second later.
        sh(&format!("ip -n {p} link set fpt1 down"));
        let mut seen: Option<bool> = None;
        poll_until_ahead(&mut m, &mut st, "the route to show linkdown", linkdown, &mut |s| {
            if !s.links[&t0].running {
                seen.get_or_insert(linkdown(s));
            }
        });
        assert_eq!(seen, Some(false), "ahead saw fpt0 without carrier (Some) and the route not yet re-dumped (false)");

        // Carrier back: the kernel clears the marks, again without a
        // message; the mirror clears them itself instead of re-dumping, and
        // its routes are what a fresh dump finds (IPv4 multipath and
        // IPv6 too).
        sh("ip -6 addr add 2001:db8:1::1/64 dev fpt0 nodad && ip -6 route add 2001:db8:2::/64 via 2001:db8:1::2 \
            && ip route add 203.0.113.0/24 nexthop via 192.0.2.3 nexthop via 192.0.2.4");
        let has = |s: &KernelState, dst: &str| s.routes.keys().any(|(_, k)| k.dst.to_string() == dst);
        poll_until(&mut m, &mut st, "the new routes", |s| has(s, "203.0.113.0") && has(s, "2001:db8:2::"));
        sh(&format!("ip -n {p} link set fpt1 up"));
        let mut seen: Option<(bool, bool)> = None;
        poll_until_ahead(&mut m, &mut st, "carrier back", |s| s.links[&t0].running && !linkdown(s), &mut |s| {
            seen.get_or_insert((s.links[&t0].running, linkdown(s)));
        });
        assert_eq!(seen, Some((true, false)), "ahead, before any re-dump: (running, linkdown)");
        let fresh = Mirror::open(4 << 20).expect("open").dump().expect("dump");
        assert_eq!(st.routes, fresh.routes, "the routes after carrier came back");

        // MTU and forwarding sysctl: in the state ahead sees.
        sh("ip link set fpt0 mtu 1400 && sysctl -qw net.ipv4.conf.fpt0.forwarding=0");
        let mut got: Option<(u32, bool)> = None;
        let done = |s: &KernelState| s.links[&t0].mtu == 1400 && !s.if_sysctl[&t0].forwarding4;
        poll_until_ahead(&mut m, &mut st, "mtu 1400 and forwarding off", done, &mut |s| {
            got = Some((s.links[&t0].mtu, s.if_sysctl[&t0].forwarding4));
        });
        assert_eq!(got, Some((1400, false)), "ahead: (mtu, forwarding4)");

        // An ip rule: in the state ahead sees (a rule message is re-dumped, not applied).
        let before = st.rules.len();
        sh("ip rule add from 192.0.2.0/24 table 100 pref 100");
        let mut rules: Option<usize> = None;
        poll_until_ahead(&mut m, &mut st, "the new rule", |s| s.rules.len() == before + 1, &mut |s| {
            rules = Some(s.rules.len())
        });
        assert_eq!(rules, Some(before + 1), "ahead: rules");
    });
}

/// --route-source fpm: the kernel's main-table routes and next-hop objects
/// (zebra programs them too) never enter the state, neither by event nor by
/// dump; the routes another source put there survive a re-dump.
#[test]
fn local_table_scope_keeps_the_kernels_other_routes_out() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        sh("ip link add fps0 type veth peer name fps1 && ip link set fps0 up && ip link set fps1 up \
            && ip addr add 192.0.2.1/24 dev fps0 && ip route add 198.51.100.0/24 via 192.0.2.2 \
            && ip nexthop add id 7 via 192.0.2.3 dev fps0");
        let mut m = Mirror::open(4 << 20).expect("open");
        m.set_scope(RouteScope::LocalTable);
        let mut st = m.dump().expect("dump");
        assert!(st.routes.keys().all(|(_, k)| k.table == RT_TABLE_LOCAL), "{:?}", st.routes.keys());
        assert!(st.routes.contains_key(&(Family::V4, key(RT_TABLE_LOCAL, "192.0.2.1", 32, 0))));
        assert!(st.nexthops.is_empty());

        // What the other source put in.
        let other = (Family::V4, key(RT_TABLE_MAIN, "203.0.113.0", 24, 20));
        let r = st.routes[&(Family::V4, key(RT_TABLE_LOCAL, "192.0.2.1", 32, 0))].clone();
        st.routes.insert(other.clone(), fastpath_core::model::Route { key: other.1.clone(), ..r });

        sh("ip route add 198.51.100.128/25 nhid 7 && ip addr add 192.0.2.9/24 dev fps0");
        let k9 = (Family::V4, key(RT_TABLE_LOCAL, "192.0.2.9", 32, 0));
        poll_until(&mut m, &mut st, "the new address's local route", |s| s.routes.contains_key(&k9));
        // A link going down makes the mirror re-dump the routes.
        sh("ip link set fps1 down");
        poll_until(&mut m, &mut st, "carrier loss", |s| !s.links[&ifindex(s, "fps0")].running);
        m.poll(&mut st, Duration::from_millis(200), &mut |_, _| {}).expect("poll");
        assert!(st.routes.contains_key(&other), "a re-dump dropped the other source's route");
        assert!(st.routes.contains_key(&k9));
        assert!(st.routes.keys().all(|(_, k)| k.table == RT_TABLE_LOCAL || *k == other.1), "{:?}", st.routes.keys());
        assert!(st.nexthops.is_empty());
        assert_eq!(m.take_touched().routes.iter().filter(|(_, k)| k.table != RT_TABLE_LOCAL).count(), 0);
    });
}

/// An IPv4 address deleted while its interface keeps another: the kernel
/// flushes, without a message, only the routes preferring it as source, so
/// the routes are re-dumped only when the state has such a route; the last
/// address takes every route through the interface (re-dumped). Each time
/// the routes equal a fresh dump.
#[test]
fn a_deleted_address_redumps_only_what_the_kernel_flushes_silently() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        sh("ip link add fpa0 type veth peer name fpa1 && ip link set fpa0 up && ip link set fpa1 up \
            && ip addr add 192.0.2.1/24 dev fpa0 && ip addr add 198.51.100.77/32 dev fpa0 \
            && ip route add 203.0.113.0/24 via 192.0.2.2 src 198.51.100.77 \
            && ip route add 198.51.100.128/25 via 192.0.2.2");
        let mut m = Mirror::open(4 << 20).expect("open");
        let mut st = m.dump().expect("dump");
        let src = (Family::V4, key(RT_TABLE_MAIN, "203.0.113.0", 24, 0));
        assert_eq!(st.routes[&src].prefsrc, Some(ip("198.51.100.77")));
        let fresh_routes = || Mirror::open(4 << 20).expect("open").dump().expect("dump").routes;
        let settled = |m: &mut Mirror, st: &mut KernelState, what: &str, gone: &str| {
            let a = ip(gone);
            poll_until(m, st, what, |s| !s.addrs.keys().any(|x| x.addr == a));
            // The rest of the burst (the address's own routes, announced).
            m.poll(st, Duration::from_millis(100), &mut |_, _| {}).expect("poll");
            m.settle_sources(st).expect("settle")
        };

        // No route prefers 198.51.100.78: no re-dump.
        sh("ip addr add 198.51.100.78/32 dev fpa0");
        let k78 = (Family::V4, key(RT_TABLE_LOCAL, "198.51.100.78", 32, 0));
        poll_until(&mut m, &mut st, "the .78 local route", |s| s.routes.contains_key(&k78));
        let before = m.redumps();
        sh("ip addr del 198.51.100.78/32 dev fpa0");
        settled(&mut m, &mut st, "the .78 address gone", "198.51.100.78");
        assert_eq!(m.redumps(), before, "re-dumped although nothing preferred the address");
        assert_eq!(st.routes, fresh_routes(), "after .78 went");

        // A route prefers .77: the kernel flushes it (6.18 announces that;
        // older kernels did not). One the state has but no message will
        // take away (planted here, standing for such a kernel's) is found
        // by the re-dump.
        let planted = (Family::V4, key(RT_TABLE_MAIN, "192.0.2.128", 25, 0));
        st.routes.insert(planted.clone(), fastpath_core::model::Route { key: planted.1.clone(), ..st.routes[&src].clone() });
        sh("ip addr del 198.51.100.77/32 dev fpa0");
        settled(&mut m, &mut st, "the .77 address gone", "198.51.100.77");
        assert_eq!(m.redumps(), before + 1, "no re-dump although a route preferred .77");
        assert!(!st.routes.contains_key(&src) && !st.routes.contains_key(&planted));
        assert_eq!(st.routes, fresh_routes(), "after .77 went");

        // IPv6 announces what an address takes with it (its local, anycast
        // and prefix routes) and only clears other routes' preferred source,
        // which is not kept: no re-dump, also for the last global address.
        sh("sysctl -qw net.ipv6.conf.all.forwarding=1 && ip -6 addr add 2001:db8:1::1/64 dev fpa0 nodad \
            && ip -6 route add 2001:db8:5::/48 via 2001:db8:1::2 src 2001:db8:1::1");
        let k5 = (Family::V6, key(RT_TABLE_MAIN, "2001:db8:5::", 48, 1024));
        poll_until(&mut m, &mut st, "the IPv6 route", |s| s.routes.contains_key(&k5));
        let before6 = m.redumps();
        sh("ip -6 addr del 2001:db8:1::1/64 dev fpa0");
        settled(&mut m, &mut st, "the IPv6 address gone", "2001:db8:1::1");
        assert_eq!(m.redumps(), before6, "re-dumped for an IPv6 address");
        assert!(st.routes.contains_key(&k5));
        assert_eq!(st.routes, fresh_routes(), "after the IPv6 address went");

        // The interface's last address: routes through it go too.
        sh("ip addr del 192.0.2.1/24 dev fpa0");
        poll_until(&mut m, &mut st, "the last address gone", |s| s.addrs.keys().all(|x| !x.addr.is_ipv4() || x.ifindex != ifindex(s, "fpa0")));
        m.poll(&mut st, Duration::from_millis(100), &mut |_, _| {}).expect("poll");
        assert!(m.redumps() > before + 1);
        assert_eq!(st.routes, fresh_routes(), "after the last address went");
    });
}

#[test]
fn overrun_resyncs() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        sh("ip link add fpo0 type veth peer name fpo1 && ip link set fpo0 up && ip link set fpo1 up \
            && ip addr add 192.0.2.1/24 dev fpo0");
        // A tiny buffer, then far more events than it holds.
        let mut m = Mirror::open(4096).expect("open");
        let mut st = m.dump().expect("dump");
        let batch: String = (0..2000)
            .map(|i| format!("route add 10.{}.{}.0/24 via 192.0.2.2\n", i / 256, i % 256))
            .collect();
        let path = std::env::temp_dir().join(format!("fp-overrun-{}.batch", std::process::id()));
        std::fs::write(&path, batch).expect("write batch");
        sh(&format!("ip -batch {}", path.display()));
        let _ = std::fs::remove_file(&path);
        let mut outcome = PollOutcome::Idle;
        let deadline = Instant::now() + Duration::from_secs(5);
        while outcome != PollOutcome::Resynced && Instant::now() < deadline {
            outcome = m.poll(&mut st, Duration::from_millis(100), &mut |_, _| {}).expect("poll");
        }
        assert_eq!(outcome, PollOutcome::Resynced);
        assert_eq!(m.resyncs(), 1);
        let n = st
            .routes
            .keys()
            .filter(|(f, k)| *f == Family::V4 && k.table == RT_TABLE_MAIN && k.prefix_len == 24)
            .count();
        assert!(n >= 2000, "only {n} routes after resync");
    });
}

/// Named peer namespace, deleted on drop (also when the test fails).
struct PeerNs(String);
impl Drop for PeerNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn neigh_state(m: &mut Mirror, ifindex: u32, addr: IpAddr) -> u16 {
    m.dump()
        .expect("dump")
        .neighbours
        .get(&(ifindex, addr))
        .map_or(0, |n| n.state)
}

fn wait_state(m: &mut Mirror, ifindex: u32, addr: IpAddr, want: u16, secs: u64) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = neigh_state(m, ifindex, addr);
        if s & want != 0 || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The manual check of the brief, automated: a STALE neighbour that we
/// "use" goes DELAY -> PROBE -> REACHABLE because the peer answers the probe.
#[test]
fn neigh_use_reprobes_stale_entry() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        let peer = PeerNs(format!("fpm-{}-peer", std::process::id()));
        sh(&format!(
            "ip netns add {p} && ip link add fpn0 type veth peer name fpn1 netns {p} \
             && ip addr add 192.0.2.1/24 dev fpn0 && ip -6 addr add 2001:db8::1/64 dev fpn0 nodad \
             && ip link set fpn0 up \
             && ip -n {p} addr add 192.0.2.2/24 dev fpn1 && ip -n {p} -6 addr add 2001:db8::2/64 dev fpn1 nodad \
             && ip -n {p} link set fpn1 up \
             && sysctl -qw net.ipv4.neigh.fpn0.base_reachable_time_ms=500 net.ipv6.neigh.fpn0.base_reachable_time_ms=500",
            p = peer.0
        ));
        let mut m = Mirror::open(1 << 20).expect("open");
        let idx = ifindex(&m.dump().expect("dump"), "fpn0");
        for (proto, addr, ping) in [
            ("ipv4", "192.0.2.2", "ping -c1 -W2 192.0.2.2"),
            ("ipv6", "2001:db8::2", "ping -6 -c1 -W2 2001:db8::2"),
        ] {
            let addr = ip(addr);
            // With no delay before the first probe, an unused REACHABLE entry goes STALE
            // (otherwise the kernel's own recent use sends it through DELAY instead).
            sh(&format!(
                "sysctl -qw net.{proto}.neigh.fpn0.delay_first_probe_time=0"
            ));
            sh(ping);
            let s = wait_state(&mut m, idx, addr, NUD_STALE, 10);
            assert_eq!(s, NUD_STALE, "{addr} did not go STALE (state {s:#x})");
            // Now a visible DELAY phase: STALE -> (use) -> DELAY for 1 s -> PROBE -> REACHABLE.
            sh(&format!(
                "sysctl -qw net.{proto}.neigh.fpn0.delay_first_probe_time=1"
            ));
            neigh_use(idx, addr).expect("neigh_use");
            let s = neigh_state(&mut m, idx, addr);
            assert_eq!(s, NUD_DELAY, "{addr}: after neigh_use state {s:#x}");
            let s = wait_state(&mut m, idx, addr, NUD_REACHABLE, 8);
            assert_eq!(
                s, NUD_REACHABLE,
                "{addr}: probe not answered (state {s:#x})"
            );
        }
        // No entry: the kernel says so, and does not create one.
        match neigh_use(idx, ip("192.0.2.99")) {
            Err(MirrorError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT)),
            other => panic!("neigh_use on a missing entry: {other:?}"),
        }
        assert_eq!(neigh_state(&mut m, idx, ip("192.0.2.99")), 0);
        drop(peer);
    });
}
