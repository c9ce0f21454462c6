//! Property-based fuzzing of the forwarding program through BPF_PROG_RUN.
//!
//! Inputs: arbitrary bytes behind an Ethernet header for the ingress port,
//! and structure-aware frames (valid IPv4/IPv6 towards the test topology's
//! routes, then mutated: bytes overwritten, truncated, extended). Properties,
//! for every frame:
//! - the verdict is XDP_PASS or XDP_REDIRECT (the design has no other);
//! - PASS leaves the frame byte-identical and is not counted as forwarded;
//! - REDIRECT's output equals a plain Rust model of the forward: the frame is
//!   one the model deems forwardable, destination MAC from the model's FIB /
//!   next hop / neighbour lookup, source MAC of the egress, TTL or hop limit
//!   minus one, IPv4 header checksum valid and equal to a full recompute,
//!   Ethernet padding trimmed, every other byte unchanged;
//! - exactly one reason counter of the ingress slot moves, by one packet and
//!   the output's byte count.
//!
//! One program serves all cases (loading per case would cost a verifier run
//! each), with the flow cache on, so cache hits are fuzzed too: the model
//! does not depend on them. `FASTPATH_PROPTEST_CASES` sets the cases per
//! strategy (default 2000). Needs root.
//!
//!   CARGO_TARGET_DIR=/work/tgt-hard cargo test --release -p fastpath-bpf --test parser_props

#[allow(dead_code)]
mod support;

use std::cell::Cell;
use std::net::{Ipv4Addr, Ipv6Addr};

use fastpath_bpf::intf::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use support::netns::{require_root, Lab};
use support::packet::*;
use support::runner::{Loaded, XDP_PASS, XDP_REDIRECT};
use support::world::*;

fn cases() -> u32 {
    std::env::var("FASTPATH_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

// ------------------------------------------------------------------ model

fn lpm<K, const N: usize>(table: &[(K, fp_route)], dst: &[u8; N], key: impl Fn(&K) -> (u32, [u8; N])) -> Option<fp_route> {
    let mut best: Option<(u32, fp_route)> = None;
    for (k, r) in table {
        let (len, addr) = key(k);
        let bits = len as usize;
        let covers = (0..bits).all(|i| (addr[i / 8] >> (7 - i % 8)) & 1 == (dst[i / 8] >> (7 - i % 8)) & 1);
        if covers && best.is_none_or(|(l, _)| len > l) {
            best = Some((len, *r));
        }
    }
    best.map(|(_, r)| r)
}

/// The next hop and neighbour MAC a forwardable destination leaves by, on
/// port b only (a forward back out of a is `same_iface`, a punt).
fn resolve(w: &World, route: Option<fp_route>, dst: &[u8], dst_family: u8) -> Option<(Mac, u32)> {
    let r = route?;
    if r.type_ != fp_route_type::FP_RT_FORWARD as u8 {
        return None;
    }
    let nh = w.nexthops.iter().find(|(id, _)| *id == r.nh_id)?.1;
    if nh.ifindex != w.b {
        return None;
    }
    let key = match nh.gw_family {
        0 => neigh_key(w.b, dst_family, dst),
        f if f == AF_INET => neigh_key(w.b, AF_INET, &nh.gw[..4]),
        _ => neigh_key(w.b, AF_INET6, &nh.gw[..16]),
    };
    let mac = w.neigh.iter().find(|(k, _)| *k == key)?.1.mac;
    Some((mac, r.mtu))
}

fn martian4(s: Ipv4Addr, d: Ipv4Addr) -> bool {
    let bad = |a: Ipv4Addr| a.is_multicast() || a.is_broadcast() || a.octets()[0] == 0 || a.is_loopback() || a.is_link_local();
    bad(s) || bad(d) || s.is_multicast()
}

fn martian6(s: Ipv6Addr, d: Ipv6Addr) -> bool {
    let odd = |a: Ipv6Addr| a.is_unspecified() || a.is_loopback() || a.is_multicast() || (a.segments()[0] & 0xffc0) == 0xfe80;
    odd(s) || odd(d)
}

const EXT_HDRS: [u8; 10] = [0, 43, 44, 51, 60, 135, 139, 140, 253, 254];

/// What the kernel would send for `f` arriving on port a, if it is a plain
/// forward the fast path may do; None for anything else.
fn model_forward(w: &World, f: &[u8]) -> Option<Vec<u8>> {
    if f.len() < 14 || f[..6] != MAC_A {
        return None;
    }
    let et = u16::from_be_bytes([f[12], f[13]]);
    let l3 = &f[14..];
    let (hdr_len, total, ttl_at, dst_mac, mtu) = match et {
        ETH_P_IP => {
            if l3.len() < 20 || l3[0] != 0x45 || csum(&l3[..20]) != 0 {
                return None;
            }
            let tot = usize::from(u16::from_be_bytes([l3[2], l3[3]]));
            let frag = u16::from_be_bytes([l3[6], l3[7]]) & 0x3fff;
            if tot < 20 || tot > l3.len() || frag != 0 || l3[8] <= 1 {
                return None;
            }
            let s: [u8; 4] = l3[12..16].try_into().ok()?;
            let d: [u8; 4] = l3[16..20].try_into().ok()?;
            if martian4(s.into(), d.into()) || w.src_deny4.iter().any(|(a, _)| *a == s) {
                return None;
            }
            let route = lpm(&w.fib4, &d, |k| (k.prefixlen, k.addr.to_ne_bytes()));
            let (mac, rmtu) = resolve(w, route, &d, AF_INET)?;
            let mtu = if rmtu != 0 { rmtu } else { w.ifaces.iter().find(|(i, _)| *i == w.b)?.1.mtu };
            (20, tot, 8, mac, mtu)
        }
        ETH_P_IPV6 => {
            if l3.len() < 40 || l3[0] >> 4 != 6 {
                return None;
            }
            let tot = 40 + usize::from(u16::from_be_bytes([l3[4], l3[5]]));
            if tot > l3.len() || EXT_HDRS.contains(&l3[6]) || l3[7] <= 1 {
                return None;
            }
            let s: [u8; 16] = l3[8..24].try_into().ok()?;
            let d: [u8; 16] = l3[24..40].try_into().ok()?;
            if martian6(s.into(), d.into()) {
                return None;
            }
            let route = lpm(&w.fib6, &d, |k| (k.prefixlen, k.addr));
            let (mac, rmtu) = resolve(w, route, &d, AF_INET6)?;
            let mtu = if rmtu != 0 { rmtu } else { w.ifaces.iter().find(|(i, _)| *i == w.b)?.1.mtu6 };
            (40, tot, 7, mac, mtu)
        }
        _ => return None,
    };
    if total as u32 > mtu {
        return None;
    }
    let mut out = Vec::with_capacity(14 + total);
    out.extend_from_slice(&dst_mac);
    out.extend_from_slice(&MAC_B);
    out.extend_from_slice(&f[12..14]);
    out.extend_from_slice(&l3[..total]);
    out[14 + ttl_at] -= 1;
    if et == ETH_P_IP {
        out[24..26].copy_from_slice(&[0, 0]);
        let c = csum(&out[14..14 + hdr_len]);
        out[24..26].copy_from_slice(&c.to_be_bytes());
    }
    Some(out)
}

// ------------------------------------------------------------------ inputs

const DST4: [[u8; 4]; 8] = [
    [203, 0, 113, 20],
    [203, 0, 113, 200],
    [198, 51, 100, 7],
    [198, 51, 100, 9],
    [192, 0, 2, 10],
    [192, 0, 2, 1],
    [198, 51, 100, 254],
    [10, 1, 2, 3],
];
const SRC4: [[u8; 4]; 4] = [[192, 0, 2, 10], [192, 0, 2, 11], [198, 51, 100, 254], [169, 254, 0, 1]];

fn v6s(s: &str) -> [u8; 16] {
    v6(s)
}

fn dst6() -> impl Strategy<Value = [u8; 16]> {
    prop_oneof![
        Just(v6s("2001:db8:2::20")),
        Just(v6s("2001:db8:b::1")),
        Just(v6s("2001:db8:b::99")),
        Just(v6s("2001:db8:a::10")),
        Just(v6s("2001:db8:a::1")),
        Just(v6s("ff02::1")),
        Just(v6s("fe80::1")),
        any::<[u8; 16]>(),
    ]
}

fn src6() -> impl Strategy<Value = [u8; 16]> {
    prop_oneof![4 => Just(v6s("2001:db8:a::10")), 1 => Just(v6s("fe80::10")), 1 => any::<[u8; 16]>()]
}

fn ttl() -> impl Strategy<Value = u8> {
    prop_oneof![4 => Just(64u8), 1 => 0u8..3, 1 => any::<u8>()]
}

fn l4_proto() -> impl Strategy<Value = u8> {
    prop_oneof![3 => Just(17u8), 2 => Just(6u8), 1 => Just(1u8), 1 => Just(58u8), 1 => any::<u8>()]
}

fn ip4() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![6 => prop::sample::select(DST4.to_vec()), 1 => any::<[u8; 4]>()],
        prop_oneof![6 => prop::sample::select(SRC4.to_vec()), 1 => any::<[u8; 4]>()],
        ttl(),
        l4_proto(),
        any::<u8>(),
        prop_oneof![4 => Just(0x4000u16), 2 => Just(0u16), 1 => any::<u16>()],
        prop_oneof![6 => Just(0usize), 1 => 1usize..11],
        prop_oneof![3 => 0usize..64, 1 => 64usize..1600],
    )
        .prop_map(|(dst, src, ttl, proto, tos, frag, opt_words, len)| {
            let mut p = Ip4::new(src, dst);
            p.ttl = ttl;
            p.proto = proto;
            p.tos = tos;
            p.frag = frag;
            p.options = vec![1; opt_words * 4];
            p.payload = (0..len).map(|i| (i * 13 + 5) as u8).collect();
            p.frame(MAC_A, MAC_CLIENT)
        })
}

fn ip6() -> impl Strategy<Value = Vec<u8>> {
    (dst6(), src6(), ttl(), l4_proto(), prop_oneof![3 => 0usize..64, 1 => 64usize..1600]).prop_map(
        |(dst, src, hop, nh, len)| {
            let mut p = Ip6::new(src, dst);
            p.hop = hop;
            p.nexthdr = nh;
            p.payload = (0..len).map(|i| (i * 11 + 3) as u8).collect();
            p.frame(MAC_A, MAC_CLIENT)
        },
    )
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Truncate(usize),
    Extend(Vec<u8>),
    Ethertype(u16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        // mostly in the headers, where the parser looks
        4 => (0usize..80, any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => (0usize..1600, any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        // BPF_PROG_RUN refuses frames shorter than an Ethernet header (as no NIC delivers them)
        2 => (14usize..120).prop_map(Mutation::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..40).prop_map(Mutation::Extend),
        1 => prop_oneof![
            Just(ETH_P_8021Q),
            Just(ETH_P_8021AD),
            Just(ETH_P_ARP),
            Just(ETH_P_IP),
            Just(ETH_P_IPV6),
            any::<u16>()
        ]
        .prop_map(Mutation::Ethertype),
    ]
}

fn mutate(mut f: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        match m {
            Mutation::Set(i, b) => {
                if let Some(x) = f.get_mut(*i) {
                    *x = *b;
                }
            }
            Mutation::Truncate(n) => f.truncate(*n),
            Mutation::Extend(v) => f.extend_from_slice(v),
            Mutation::Ethertype(t) => {
                if f.len() >= 14 {
                    f[12..14].copy_from_slice(&t.to_be_bytes());
                }
            }
        }
    }
    f.truncate(1514 + 8);
    f
}

/// Valid frames, a third of them left alone, the rest mutated; half of the
/// mutated IPv4 ones get a correct header checksum again so that the
/// mutation, not the checksum, decides.
fn structured() -> impl Strategy<Value = Vec<u8>> {
    (prop_oneof![ip4(), ip6()], prop_oneof![1 => Just(vec![]), 2 => prop::collection::vec(mutation(), 1..4)], any::<bool>())
        .prop_map(|(f, ms, fix)| {
            let mut f = mutate(f, &ms);
            if fix && f.len() >= 34 && f[12..14] == ETH_P_IP.to_be_bytes() {
                let hl = (usize::from(f[14] & 0xf) * 4).max(20);
                if 14 + hl <= f.len() {
                    f[24..26].copy_from_slice(&[0, 0]);
                    let c = csum(&f[14..14 + hl]);
                    f[24..26].copy_from_slice(&c.to_be_bytes());
                }
            }
            f
        })
}

/// Any bytes, behind our MAC and one of the interesting ethertypes or none.
fn arbitrary() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![4 => Just(MAC_A), 1 => any::<[u8; 6]>()],
        prop_oneof![Just(ETH_P_IP), Just(ETH_P_IPV6), Just(ETH_P_8021Q), any::<u16>()],
        prop::collection::vec(any::<u8>(), 0..200),
        any::<bool>(),
    )
        .prop_map(|(dst, et, body, raw)| {
            if raw && body.len() >= 14 {
                return body; // any 14+ bytes, sometimes
            }
            let mut f = eth(dst, MAC_CLIENT, et);
            f.extend(body);
            f
        })
}

// ------------------------------------------------------------------ properties

struct Fixture {
    world: World,
    prog: Loaded,
    forwarded: Cell<u64>,
}

fn check(fx: &Fixture, f: &[u8]) -> Result<(), TestCaseError> {
    let before = fx.prog.counted().map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
    let (verdict, out) = fx.prog.run(fx.world.a, f).map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
    let after = fx.prog.counted().map_err(|e| TestCaseError::fail(format!("{e:#}")))?;

    // Exactly one (slot, reason) moved, by one packet and the output's bytes.
    let mut moved = Vec::new();
    for &(slot, reason, p, b) in &after {
        let (p0, b0) = before.iter().find(|x| x.0 == slot && x.1 == reason).map(|x| (x.2, x.3)).unwrap_or((0, 0));
        if (p, b) != (p0, b0) {
            moved.push((slot, reason, p - p0, b - b0));
        }
    }
    prop_assert_eq!(moved.len(), 1, "counters moved: {:?}", moved);
    let (slot, reason, dp, db) = moved[0];
    prop_assert_eq!((slot, dp, db), (SLOT_A, 1, out.len() as u64), "reason {}", reason_name(reason));

    match verdict {
        XDP_PASS => {
            prop_assert_ne!(reason, fp_reason::FP_R_FORWARDED as usize);
            prop_assert!(out == f, "PASS modified the frame");
        }
        XDP_REDIRECT => {
            prop_assert_eq!(reason, fp_reason::FP_R_FORWARDED as usize);
            let want = model_forward(&fx.world, f);
            prop_assert!(want.is_some(), "forwarded a frame the model would not forward: {:02x?}", f);
            prop_assert!(Some(&out) == want.as_ref(), "forward differs from the model\n got  {:02x?}\n want {:02x?}", out, want);
            fx.forwarded.set(fx.forwarded.get() + 1);
        }
        v => prop_assert!(false, "verdict {} is neither PASS nor REDIRECT", v),
    }
    Ok(())
}

fn fixture(test: &str) -> Option<(Lab, Fixture)> {
    if !require_root(test) {
        return None;
    }
    let lab = Lab::new().expect("private netns with a veth pair");
    let mut world = World::new(lab.a, lab.b);
    world.rt.flow_timeout = 30;
    let prog = Loaded::new(&world).expect("load xdp_fwd");
    Some((lab, Fixture { world, prog, forwarded: Cell::new(0) }))
}

fn run(test: &str, strategy: impl Strategy<Value = Vec<u8>>) -> Option<u64> {
    let (_lab, fx) = fixture(test)?;
    // No failure files in the source tree; a failure prints its minimal input.
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    if let Err(e) = runner.run(&strategy, |f| check(&fx, &f)) {
        panic!("{test}: {e}");
    }
    Some(fx.forwarded.get())
}

#[test]
fn structure_aware_frames() {
    if let Some(fwd) = run("structure_aware_frames", structured()) {
        // The test says nothing if nothing is ever forwarded.
        assert!(fwd as f64 > f64::from(cases()) * 0.05, "only {fwd} of {} frames forwarded", cases());
    }
}

#[test]
fn arbitrary_frames() {
    run("arbitrary_frames", arbitrary());
}

#[test]
fn model_agrees_with_the_table_tests() {
    // The model itself, on the plain case the table tests pin down exactly.
    let w = World::new(1, 2);
    let p = Ip4::new(v4("192.0.2.10"), v4("203.0.113.20"));
    let mut o = p.clone();
    o.ttl -= 1;
    assert_eq!(model_forward(&w, &p.frame(MAC_A, MAC_CLIENT)), Some(o.frame(MAC_GW4, MAC_B)));
    let q = Ip6::new(v6("2001:db8:a::10"), v6("2001:db8:2::20"));
    let mut o6 = q.clone();
    o6.hop -= 1;
    assert_eq!(model_forward(&w, &q.frame(MAC_A, MAC_CLIENT)), Some(o6.frame(MAC_GW6, MAC_B)));
    assert_eq!(model_forward(&w, &pad_to(p.frame(MAC_B, MAC_CLIENT), 60, 0)), None);
}
