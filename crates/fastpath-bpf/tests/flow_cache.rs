//! BPF_PROG_RUN tests of the flow cache in `bpf/xdp_fwd.bpf.c`: a second
//! packet of a flow is served from the cache with the same bytes; a table
//! change (with the generation bump the daemon always makes) is seen by the
//! very next packet; idle entries are recomputed; per-packet checks (TTL,
//! length) still apply on a hit; hints in the metadata area pick the set.
//!
//! Needs root, like prog_run.rs. The tests share one private netns with a
//! veth pair and one loaded program, reset at each test's start, and so run
//! one after the other.
//!
//!   cargo test --release -p fastpath-bpf --test flow_cache

#[allow(dead_code)] // each test binary uses its own part of the support code
mod support;

use fastpath_bpf::intf::fp_flow_event::*;
use fastpath_bpf::intf::fp_hash_src::*;
use fastpath_bpf::intf::fp_reason::*;
use fastpath_bpf::intf::*;
use libbpf_rs::{MapCore, MapFlags};

use support::netns::require_root;
use support::packet::*;
use support::runner::*;
use support::world::*;

const TIMEOUT: u32 = 30;

/// The namespace and program the tests of this file share (`SharedLab`: one
/// verifier run instead of one per test), with this file's world.
fn lab(test: &str) -> Option<(SharedLab, World)> {
    if !require_root(test) {
        return None;
    }
    let (lab, a, b) = SharedLab::take_pinned().expect("shared netns with a veth pair");
    let mut world = World::new(a, b);
    world.rt.flow_timeout = TIMEOUT;
    world.rt.neigh_clock = 100;
    Some((lab, world))
}

fn p4(sport: u16) -> Ip4 {
    let mut p = Ip4::new(v4("192.0.2.10"), v4("203.0.113.20"));
    p.payload = udp_ports(sport, 53);
    p
}

/// An 8-byte UDP header with these ports and a zero checksum (fine for IPv4).
fn udp_ports(sport: u16, dport: u16) -> Vec<u8> {
    let mut u = udp(8);
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u
}

fn out4(p: &Ip4, dmac: Mac) -> Vec<u8> {
    let mut o = p.clone();
    o.ttl -= 1;
    o.frame(dmac, MAC_B)
}

/// The IPv6 flow of these tests, ports 7 -> 9.
fn p6() -> Ip6 {
    let mut p = Ip6::new(v6("2001:db8:a::10"), v6("2001:db8:2::20"));
    p.payload = udp_ports(7, 9);
    p
}

fn out6(p: &Ip6) -> Vec<u8> {
    let mut o = p.clone();
    o.hop -= 1;
    o.frame(MAC_GW6, MAC_B)
}

fn hint(hash: u32) -> Vec<u8> {
    let h = fp_rx_hint { hash, flags: FP_HINT_L4 as u16, magic: FP_HINT_MAGIC as u16 };
    raw(&h).to_vec()
}

/// Cache counters of the ingress slot, summed over CPUs.
fn flow(l: &Loaded) -> [u64; FP_FC__COUNT as usize] {
    l.stats(SLOT_A).expect("stats").flow
}

fn hash_src(l: &Loaded) -> [u64; FP_HS__COUNT as usize] {
    l.stats(SLOT_A).expect("stats").hash_src
}

fn forwards(l: &Loaded, w: &World, pkt: &[u8], want: &[u8]) {
    let (verdict, out) = l.run(w.a, pkt).expect("run");
    assert_eq!(verdict, XDP_REDIRECT, "not forwarded");
    assert_eq!(out, want, "output bytes");
}

fn punts(l: &Loaded, w: &World, pkt: &[u8], reason: fp_reason) {
    let (verdict, out) = l.run(w.a, pkt).expect("run");
    assert_eq!(verdict, XDP_PASS, "not punted");
    assert_eq!(out, pkt, "a punt must not modify the frame");
    let s = l.stats(SLOT_A).expect("stats");
    assert!(s.packets[reason as usize] > 0, "not counted as {}: {:?}", reason_name(reason as usize), s.packets.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (reason_name(i), *n)).collect::<Vec<_>>());
}

fn bump(l: &Loaded, w: &mut World) {
    w.rt.generation += 1;
    l.set_rt(&w.rt).expect("bss");
}

fn set_neigh4(l: &Loaded, ifindex: u32, addr: &str, mac: Mac) {
    let NeighKey::V4(k) = neigh_key(ifindex, AF_INET, &v4(addr)) else { unreachable!() };
    l.skel.maps.fp_neigh4.update(raw(&k), raw(&neigh(mac)), MapFlags::ANY).expect("fp_neigh4");
}

#[test]
fn second_packet_is_a_hit_with_the_same_bytes() {
    let Some((mut lab, w)) = lab("second_packet_is_a_hit_with_the_same_bytes") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(&p, MAC_GW4));
    assert_eq!(flow(l)[FP_FC_MISS as usize], 1);
    assert_eq!(flow(l)[FP_FC_HIT as usize], 0);
    forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(&p, MAC_GW4));
    assert_eq!(flow(l)[FP_FC_HIT as usize], 1, "second packet of the flow missed");
    // Another source port is another flow.
    let q = p4(1001);
    forwards(l, &w, &q.frame(MAC_A, MAC_CLIENT), &out4(&q, MAC_GW4));
    assert_eq!(flow(l)[FP_FC_MISS as usize], 2);
    assert_eq!(hash_src(l)[FP_HS_SOFTWARE as usize], 3);

    // IPv6 the same way.
    let p6 = p6();
    let want6 = out6(&p6);
    forwards(l, &w, &p6.frame(MAC_A, MAC_CLIENT), &want6);
    forwards(l, &w, &p6.frame(MAC_A, MAC_CLIENT), &want6);
    assert_eq!(flow(l)[FP_FC_HIT as usize], 2);
}

/// The data path trusts a cached result until the generation moves (the
/// daemon bumps it after every table change), then recomputes at once.
#[test]
fn neighbour_change_is_seen_after_the_generation_bump() {
    let Some((mut lab, mut w)) = lab("neighbour_change_is_seen_after_the_generation_bump") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    let new_mac: Mac = [0x02, 0, 0, 0, 0, 0x99];
    set_neigh4(l, w.b, "198.51.100.1", new_mac);
    // Without a bump the cache still answers: this is what the generation is for.
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    bump(l, &mut w);
    forwards(l, &w, &f, &out4(&p, new_mac));
    assert_eq!(flow(l)[FP_FC_STALE as usize], 1);
    forwards(l, &w, &f, &out4(&p, new_mac));
    assert_eq!(flow(l)[FP_FC_HIT as usize], 2);
}

#[test]
fn route_change_is_seen_by_the_next_packet() {
    let Some((mut lab, mut w)) = lab("route_change_is_seen_by_the_next_packet") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    // 203.0.113.0/24 now goes via the IPv6 link-local gateway.
    let k = lpm4("203.0.113.0", 24);
    let r = route(fp_route_type::FP_RT_FORWARD, NH_V4_VIA_V6);
    l.skel.maps.fp_fib4.update(raw(&k), raw(&r), MapFlags::ANY).expect("fib4");
    bump(l, &mut w);
    forwards(l, &w, &f, &out4(&p, MAC_GW6LL));
    // And then is deleted: no route, the kernel answers.
    l.skel.maps.fp_fib4.delete(raw(&k)).expect("fib4 delete");
    bump(l, &mut w);
    punts(l, &w, &f, FP_R_NO_ROUTE);
}

#[test]
fn link_down_is_seen_by_the_next_packet() {
    let Some((mut lab, mut w)) = lab("link_down_is_seen_by_the_next_packet") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    let down = fp_iface {
        mac: MAC_B,
        flags: (FP_IF_PRESENT | FP_IF_FWD4 | FP_IF_FWD6) as u16,
        mtu: 1500,
        mtu6: 1500,
        ifindex: w.b,
    };
    l.skel.maps.fp_ifaces.update(&SLOT_B.to_ne_bytes(), raw(&down), MapFlags::ANY).expect("ifaces");
    bump(l, &mut w);
    punts(l, &w, &f, FP_R_EGRESS_DOWN);
}

/// An egress that lost its last IPv4 address (the kernel flushing its
/// IPv4 routes, the daemon re-dumping them) stops cached IPv4 flows at the
/// generation bump and leaves IPv6 ones alone.
#[test]
fn a_flushed_egress_stops_cached_ipv4_flows_only() {
    let Some((mut lab, mut w)) = lab("a_flushed_egress_stops_cached_ipv4_flows_only") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    let q = p6();
    let g = q.frame(MAC_A, MAC_CLIENT);
    for _ in 0..2 {
        forwards(l, &w, &f, &out4(&p, MAC_GW4));
        forwards(l, &w, &g, &out6(&q));
    }
    assert_eq!(flow(l)[FP_FC_HIT as usize], 2);
    let mut flushed = *w.iface_mut(w.b);
    flushed.flags |= (FP_IF_PRESENT | FP_IF_V4_FLUSH) as u16;
    l.skel.maps.fp_ifaces.update(&SLOT_B.to_ne_bytes(), raw(&flushed), MapFlags::ANY).expect("ifaces");
    bump(l, &mut w);
    punts(l, &w, &f, FP_R_EGRESS_DOWN);
    forwards(l, &w, &g, &out6(&q));
}

/// TTL and length are per packet, not per flow: a hit still punts them.
#[test]
fn per_packet_checks_apply_on_a_hit() {
    let Some((mut lab, mut w)) = lab("per_packet_checks_apply_on_a_hit") else { return };
    w.iface_mut(w.b).mtu = 1000;
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(&p, MAC_GW4));
    let mut ttl1 = p.clone();
    ttl1.ttl = 1;
    punts(l, &w, &ttl1.frame(MAC_A, MAC_CLIENT), FP_R_TTL_EXCEEDED);
    let mut big = p.clone();
    big.payload = udp_ports(1000, 53);
    big.payload.resize(1100, 0xab);
    punts(l, &w, &big.frame(MAC_A, MAC_CLIENT), FP_R_MTU);
    // The flow itself is still cached and forwarded.
    forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(&p, MAC_GW4));
    assert!(flow(l)[FP_FC_HIT as usize] >= 2);
}

#[test]
fn idle_flows_are_recomputed() {
    let Some((mut lab, mut w)) = lab("idle_flows_are_recomputed") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    w.rt.neigh_clock += TIMEOUT;
    l.set_rt(&w.rt).expect("bss");
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    assert_eq!(flow(l)[FP_FC_HIT as usize], 1, "idle for exactly the timeout is still live");
    w.rt.neigh_clock += TIMEOUT + 1;
    l.set_rt(&w.rt).expect("bss");
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    assert_eq!(flow(l)[FP_FC_EXPIRED as usize], 1);
    assert_eq!(flow(l)[FP_FC_MISS as usize], 2);
}

/// A cached flow's packets still face every check the full path makes in
/// front of the cache (express.h repeats them on its own): with the flow
/// cached and hitting, each variant below is punted for the reason the full
/// path gives, without a generation bump, and the flow hits again after.
#[test]
fn a_cached_flow_still_gets_every_check() {
    let Some((mut lab, mut w)) = lab("a_cached_flow_still_gets_every_check") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    let hit = |l: &Loaded, w: &World| {
        let before = flow(l)[FP_FC_HIT as usize];
        forwards(l, w, &f, &out4(&p, MAC_GW4));
        assert_eq!(flow(l)[FP_FC_HIT as usize], before + 1, "the flow no longer hits");
    };
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    hit(l, &w);

    let with = |edit: &dyn Fn(&mut Ip4)| {
        let mut q = p.clone();
        edit(&mut q);
        q.frame(MAC_A, MAC_CLIENT)
    };
    let mut vlan = eth(MAC_A, MAC_CLIENT, 0x8100);
    vlan.extend_from_slice(&[0x00, 0x07, 0x08, 0x00]);
    vlan.extend(p.bytes());
    let mut short = f.clone();
    short.truncate(f.len() - 1);
    let variants: Vec<(&str, Vec<u8>, fp_reason)> = vec![
        ("bad header checksum", patch(f.clone(), 14 + 10, &[0xde, 0xad]), FP_R_MALFORMED),
        ("truncated datagram", short, FP_R_MALFORMED),
        ("fragment", with(&|q| q.frag = 0x2000), FP_R_FRAGMENT),
        ("IP options", with(&|q| q.options = vec![1, 1, 1, 0]), FP_R_IP_OPTIONS),
        ("TTL 1", with(&|q| q.ttl = 1), FP_R_TTL_EXCEEDED),
        ("another host's MAC", p.frame(MAC_B, MAC_CLIENT), FP_R_L2_OTHER_HOST),
        ("group MAC", p.frame([0x01, 0x00, 0x5e, 0, 0, 1], MAC_CLIENT), FP_R_MULTICAST),
        ("VLAN tag", vlan, FP_R_VLAN),
    ];
    for (name, pkt, reason) in &variants {
        punts_case(l, &w, name, pkt, *reason);
    }
    hit(l, &w);

    // Ingress state the daemon changes (a generation bump would follow; the
    // cache must not depend on it).
    let tc = w.iface_mut(w.a).flags;
    w.iface_mut(w.a).flags = tc | FP_IF_TC_INGRESS as u16;
    w.apply(&l.skel).expect("apply");
    punts(l, &w, &f, FP_R_TC_INGRESS);
    w.iface_mut(w.a).flags = tc;
    w.apply(&l.skel).expect("apply");
    hit(l, &w);

    // The daemon silent past the grace: at once, within the jiffy the
    // watchdog last found it alive in.
    w.rt.orphan_grace = 5;
    l.set_rt(&w.rt).expect("bss");
    punts(l, &w, &f, FP_R_ORPHANED);
    w.rt.orphan_grace = 0;
    l.set_rt(&w.rt).expect("bss");
    hit(l, &w);
}

/// The same for IPv6 (express.h's IPv6 path): each variant of a cached,
/// hitting flow punts for the general path's reason, and the flow hits again
/// after it.
#[test]
fn a_cached_ipv6_flow_still_gets_every_check() {
    let Some((mut lab, w)) = lab("a_cached_ipv6_flow_still_gets_every_check") else { return };
    let l = lab.program(&w).expect("load");
    let p = p6();
    let f = p.frame(MAC_A, MAC_CLIENT);
    let want = out6(&p);
    let hit = |l: &Loaded, w: &World| {
        let before = flow(l)[FP_FC_HIT as usize];
        forwards(l, w, &f, &want);
        assert_eq!(flow(l)[FP_FC_HIT as usize], before + 1, "the flow no longer hits");
    };
    forwards(l, &w, &f, &want);
    hit(l, &w);
    hit(l, &w);

    let with = |edit: &dyn Fn(&mut Ip6)| {
        let mut q = p.clone();
        edit(&mut q);
        q.frame(MAC_A, MAC_CLIENT)
    };
    let mut short = f.clone();
    short.truncate(f.len() - 1);
    let variants: Vec<(&str, Vec<u8>, fp_reason)> = vec![
        ("truncated datagram", short, FP_R_MALFORMED),
        ("version 4 in an IPv6 frame", patch(f.clone(), 14, &[0x45]), FP_R_MALFORMED),
        ("hop limit 1", with(&|q| q.hop = 1), FP_R_TTL_EXCEEDED),
        ("another host's MAC", p.frame(MAC_B, MAC_CLIENT), FP_R_L2_OTHER_HOST),
        ("group MAC", p.frame([0x33, 0x33, 0, 0, 0, 1], MAC_CLIENT), FP_R_MULTICAST),
    ];
    for (name, pkt, reason) in &variants {
        punts_case(l, &w, name, pkt, *reason);
        hit(l, &w);
    }
}

/// An IPv6 flow that differs from a cached one in any single part of its
/// key (a port, the flow label, a byte of either address in each of the
/// words the express path reads from the headers) is a flow of its own: its
/// first packet misses and is filled, its second hits. A key read wrongly
/// from the headers would hit the cached flow's entry instead.
#[test]
fn ipv6_flows_that_differ_in_one_key_byte_are_not_the_same_flow() {
    let Some((mut lab, w)) = lab("ipv6_flows_that_differ_in_one_key_byte_are_not_the_same_flow") else { return };
    let l = lab.program(&w).expect("load");
    let p = p6();
    let f = p.frame(MAC_A, MAC_CLIENT);
    forwards(l, &w, &f, &out6(&p));
    forwards(l, &w, &f, &out6(&p));
    assert_eq!(flow(l)[FP_FC_HIT as usize], 1);
    let with = |edit: &dyn Fn(&mut Ip6)| {
        let mut q = p.clone();
        edit(&mut q);
        q
    };
    let mut variants: Vec<(String, Ip6)> = vec![
        ("source port".into(), with(&|q| q.payload = udp_ports(8, 9))),
        ("destination port".into(), with(&|q| q.payload = udp_ports(7, 10))),
    ];
    // Bytes in every word: the source's first, middle and last (2001:db8:a::/64
    // is routed from a), the destination's past its /48.
    for i in [3usize, 7, 11, 13, 15] {
        variants.push((format!("source byte {i}"), with(&|q| q.src[i] ^= 0x40)));
    }
    for i in [6usize, 9, 12, 15] {
        variants.push((format!("destination byte {i}"), with(&|q| q.dst[i] ^= 0x40)));
    }
    for (name, q) in &variants {
        let before = flow(l);
        forwards(l, &w, &q.frame(MAC_A, MAC_CLIENT), &out6(q));
        let after = flow(l);
        assert_eq!(after[FP_FC_MISS as usize], before[FP_FC_MISS as usize] + 1, "{name}: not a flow of its own");
        assert_eq!(after[FP_FC_HIT as usize], before[FP_FC_HIT as usize], "{name}: hit another flow's entry");
        forwards(l, &w, &q.frame(MAC_A, MAC_CLIENT), &out6(q));
        assert_eq!(flow(l)[FP_FC_HIT as usize], after[FP_FC_HIT as usize] + 1, "{name}: its own entry does not hit");
    }
    // The flow label: bytes 1-3 of the IPv6 header (its low 20 bits).
    let mut labelled = f.clone();
    labelled[17] ^= 0x01;
    let mut want = out6(&p);
    want[17] ^= 0x01;
    let before = flow(l);
    forwards(l, &w, &labelled, &want);
    assert_eq!(flow(l)[FP_FC_MISS as usize], before[FP_FC_MISS as usize] + 1, "flow label: not a flow of its own");
    forwards(l, &w, &labelled, &want);
    assert_eq!(flow(l)[FP_FC_HIT as usize], before[FP_FC_HIT as usize] + 1);
    // And the first flow still hits its own entry.
    let before = flow(l)[FP_FC_HIT as usize];
    forwards(l, &w, &f, &out6(&p));
    assert_eq!(flow(l)[FP_FC_HIT as usize], before + 1);
}

/// A hit keeps the neighbour alive once per keep-alive tick, as the full
/// path does for every packet.
#[test]
fn hits_keep_the_neighbour_alive() {
    let Some((mut lab, mut w)) = lab("hits_keep_the_neighbour_alive") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    w.rt.neigh_clock += 3;
    l.set_rt(&w.rt).expect("bss");
    forwards(l, &w, &f, &out4(&p, MAC_GW4));
    assert_eq!(flow(l)[FP_FC_HIT as usize], 1);
    let NeighKey::V4(k) = neigh_key(w.b, AF_INET, &v4("198.51.100.1")) else { unreachable!() };
    let n: fp_neigh = from_raw(&l.skel.maps.fp_neigh4.lookup(raw(&k), MapFlags::ANY).expect("lookup").expect("neigh"));
    assert_eq!(n.used, w.rt.neigh_clock);
}

/// A hint in the metadata area is taken as the flow hash; anything that is
/// not exactly one valid hint is ignored. Flows sharing a hash share a set:
/// the fifth evicts a live one, and every packet is still forwarded right.
#[test]
fn metadata_hints_and_eviction() {
    let Some((mut lab, w)) = lab("metadata_hints_and_eviction") else { return };
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    let f = p.frame(MAC_A, MAC_CLIENT);
    let (v, out) = l.run_meta(w.a, &hint(42), &f).expect("run");
    assert_eq!((v, out), (XDP_REDIRECT, out4(&p, MAC_GW4)));
    assert_eq!(hash_src(l)[FP_HS_META as usize], 1);
    let mut bad = hint(42);
    bad[6] ^= 1;
    let (v, _) = l.run_meta(w.a, &bad, &f).expect("run");
    assert_eq!(v, XDP_REDIRECT);
    assert_eq!(hash_src(l)[FP_HS_SOFTWARE as usize], 1, "a hint with a wrong magic was taken");

    // Fill one set (hash 7) with FP_FLOW_WAYS flows, then keep sending a
    // fifth: it is admitted (evicting one live flow) only on one miss in 8.
    let before = flow(l);
    for port in 2000..2000 + FP_FLOW_WAYS as u16 {
        let q = p4(port);
        let (v, out) = l.run_meta(w.a, &hint(7), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(&q, MAC_GW4)));
    }
    let fifth = p4(2100);
    let mut misses = 0;
    loop {
        let (v, out) = l.run_meta(w.a, &hint(7), &fifth.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(&fifth, MAC_GW4)), "not admitted is still forwarded");
        let now = flow(l);
        if now[FP_FC_HIT as usize] > before[FP_FC_HIT as usize] {
            break;
        }
        misses += 1;
        // By chance, one miss in 8: (7/8)^200 is 3e-12.
        assert!(misses <= 200, "the fifth flow was never admitted");
    }
    let after = flow(l);
    assert_eq!(after[FP_FC_EVICT as usize], 1, "admitting the fifth flow evicts exactly one");
}

/// Admission into a set of live flows is by chance, one miss in 8: a scan
/// of new flows into a full set evicts about one live flow per 8 of them,
/// within one window of the thrash guard (so it never starts bypassing).
#[test]
fn admission_into_a_full_set_is_one_miss_in_eight() {
    let Some((mut lab, w)) = lab("admission_into_a_full_set_is_one_miss_in_eight") else { return };
    let l = lab.program(&w).expect("load");
    for port in 2000..2000 + FP_FLOW_WAYS as u16 {
        let (v, _) = l.run_meta(w.a, &hint(7), &p4(port).frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!(v, XDP_REDIRECT);
    }
    let scan = 240u16;
    for port in 3000..3000 + scan {
        let q = p4(port);
        let (v, out) = l.run_meta(w.a, &hint(7), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(&q, MAC_GW4)), "not admitted is still forwarded");
    }
    let f = flow(l);
    assert_eq!(f[FP_FC_BYPASS as usize], 0, "the scan fits one window: {f:?}");
    // Binomial(240, 1/8): mean 30; 5 and 70 are over 5 deviations away.
    let evicted = f[FP_FC_EVICT as usize];
    assert!((5..=70).contains(&evicted), "{evicted} of {scan} misses into a full set evicted a live flow");
}

/// The thrash guard: new flows that keep missing into one set full of live
/// flows make the program send about 15 packets in 16 past the cache (still
/// forwarded, byte for byte, by the full lookup); once the flood's entries
/// have idled out, the sampled lookups fill free ways and hit, and the next
/// window turns the bypass off again. A cache warming up (misses into free
/// ways) never turns it on.
#[test]
fn thrashing_cache_is_bypassed_until_it_holds_again() {
    let Some((mut lab, mut w)) = lab("thrashing_cache_is_bypassed_until_it_holds_again") else { return };
    let l = lab.program(&w).expect("load");
    let window = FP_FLOW_GUARD_WINDOW as u64;
    let send = |l: &Loaded, q: &Ip4, hash: u32| {
        let (v, out) = l.run_meta(w.a, &hint(hash), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(q, MAC_GW4)), "port {}", u16::from_be_bytes([q.payload[0], q.payload[1]]));
    };

    // Warming up: 2 windows of new flows, each into free ways of its own set.
    for i in 0..2 * window as u32 {
        send(l, &p4(10_000 + i as u16), 1000 + i);
    }
    assert_eq!(flow(l)[FP_FC_BYPASS as usize], 0, "a cache warming up was bypassed");
    assert_eq!(flow(l)[FP_FC_MISS as usize], 2 * window);

    // A flood into one set: after a window of crowded misses, one packet in
    // FP_FLOW_GUARD_SAMPLE looks the cache up.
    let flood = 4 * window as u32;
    for i in 0..flood {
        send(l, &p4(20_000 + i as u16), 7);
    }
    assert_eq!(l.flow_guard(SLOT_A).expect("guard").bypass, 1, "a crowded cache is not bypassed");
    let f = flow(l);
    let bypassed = f[FP_FC_BYPASS as usize];
    let sample = FP_FLOW_GUARD_SAMPLE as u64;
    assert!(
        bypassed > (flood as u64 - 2 * window) * (sample - 1) / sample,
        "{bypassed} of {flood} flood packets went past the cache: {f:?}"
    );
    assert_eq!(
        f[FP_FC_HIT as usize] + f[FP_FC_MISS as usize] + bypassed,
        2 * window + flood as u64,
        "a packet is a hit, a miss or bypassed"
    );

    // The flood's entries idle out: one flow's sampled lookups now fill a
    // free way and hit, and a window of them ends the bypass.
    w.rt.neigh_clock += TIMEOUT + 1;
    l.set_rt(&w.rt).expect("bss");
    let q = p4(30_000);
    let mut sent = 0;
    let mut quiet = 0;
    while quiet < 2 * sample {
        let before = flow(l)[FP_FC_BYPASS as usize];
        send(l, &q, 7);
        quiet = if flow(l)[FP_FC_BYPASS as usize] == before { quiet + 1 } else { 0 };
        sent += 1;
        assert!(sent <= 3 * window * sample, "the bypass never ended: {:?}", flow(l));
    }
    assert_eq!(l.flow_guard(SLOT_A).expect("guard").bypass, 0);
    let before = flow(l);
    for _ in 0..sample {
        send(l, &q, 7);
    }
    let after = flow(l);
    assert_eq!(
        (after[FP_FC_HIT as usize] - before[FP_FC_HIT as usize], after[FP_FC_BYPASS as usize]),
        (sample, before[FP_FC_BYPASS as usize]),
        "once the bypass ended every packet of the flow hits: {after:?}"
    );
}

/// A flood that goes on samples ever more sparsely: each crowded window in
/// a row doubles the gap between sampled lookups, up to one packet in
/// FP_FLOW_GUARD_SAMPLE << FP_FLOW_GUARD_DEEPEN, never none; every packet is
/// still forwarded; and once the flood's entries idle out, one window of
/// sampled lookups that hit ends the bypass as before.
#[test]
fn a_lasting_flood_is_sampled_ever_more_sparsely() {
    let Some((mut lab, mut w)) = lab("a_lasting_flood_is_sampled_ever_more_sparsely") else { return };
    let l = lab.program(&w).expect("load");
    let deepest = FP_FLOW_GUARD_DEEPEN + 1;
    let gap = u64::from(FP_FLOW_GUARD_SAMPLE << FP_FLOW_GUARD_DEEPEN);
    let mut port = 20_000u16;
    let mut flood = |l: &Loaded| {
        port = port.wrapping_add(1).max(1024);
        let q = p4(port);
        let (v, out) = l.run_meta(w.a, &hint(7), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(&q, MAC_GW4)), "port {port}");
    };
    let mut sent = 0u64;
    let mut levels = vec![];
    while l.flow_guard(SLOT_A).expect("guard").bypass < deepest {
        flood(l);
        sent += 1;
        let b = l.flow_guard(SLOT_A).expect("guard").bypass;
        if levels.last() != Some(&b) {
            levels.push(b);
        }
        assert!(sent <= 4 * u64::from(FP_FLOW_GUARD_WINDOW) * gap, "the gap never reached its widest: {levels:?}");
    }
    assert_eq!(levels, (0..=deepest).collect::<Vec<_>>(), "one step per crowded window");

    let before = flow(l);
    let n = 40 * gap;
    for _ in 0..n {
        flood(l);
    }
    let after = flow(l);
    let looked = after[FP_FC_HIT as usize] + after[FP_FC_MISS as usize] - before[FP_FC_HIT as usize] - before[FP_FC_MISS as usize];
    // About 40 lookups (gaps uniform in 1..=2 * gap): 10 and 80 are far
    // outside its spread, and 0 would be a cache never looked at again.
    assert!((10..=80).contains(&looked), "{looked} of {n} flood packets looked the cache up: {after:?}");
    assert_eq!(after[FP_FC_BYPASS as usize] - before[FP_FC_BYPASS as usize], n - looked, "the others went past it");
    assert_eq!(l.flow_guard(SLOT_A).expect("guard").bypass, deepest, "the gap stops widening");

    // The flood's entries idle out: a flow that hits ends the bypass.
    w.rt.neigh_clock += TIMEOUT + 1;
    l.set_rt(&w.rt).expect("bss");
    let q = p4(30_000);
    let mut sent = 0;
    while l.flow_guard(SLOT_A).expect("guard").bypass != 0 {
        let (v, out) = l.run_meta(w.a, &hint(9), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(&q, MAC_GW4)));
        sent += 1;
        assert!(sent <= 3 * u64::from(FP_FLOW_GUARD_WINDOW) * gap, "the bypass never ended: {:?}", flow(l));
    }
    let before = flow(l);
    for _ in 0..FP_FLOW_GUARD_SAMPLE {
        let (v, _) = l.run_meta(w.a, &hint(9), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!(v, XDP_REDIRECT);
    }
    assert_eq!(
        flow(l)[FP_FC_HIT as usize] - before[FP_FC_HIT as usize],
        u64::from(FP_FLOW_GUARD_SAMPLE),
        "once the bypass ended every packet of the flow hits"
    );
}

/// A bypass that began in the clock second a flow was filled does not keep
/// the flow out of the cache afterwards: with no flow kept off the hash's
/// path (no flow kept its next hop across a group change, `guard.sticky` 0) the entry holds what the
/// full lookup gives, so it is hit. (The clock is in seconds: "last used
/// before the bypass began" cannot be told from "filled in its first
/// second", and refusing both kept a cache that a flood had filled from
/// ever being hit again while floods came and went each second.)
#[test]
fn flows_filled_as_a_bypass_begins_are_hit_after_it() {
    let Some((mut lab, w)) = lab("flows_filled_as_a_bypass_begins_are_hit_after_it") else { return };
    let l = lab.program(&w).expect("load");
    for i in 0..3 * FP_FLOW_GUARD_WINDOW {
        let (v, _) = l.run_meta(w.a, &hint(7), &p4(20_000 + i as u16).frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!(v, XDP_REDIRECT);
    }
    let g = l.flow_guard(SLOT_A).expect("guard");
    assert_eq!((g.bypass, g.since, g.sticky), (1, w.rt.neigh_clock, 0), "the flood began a bypass, now");
    // Same clock second: a new flow's sampled lookups fill a free way and
    // hit, and a window of them ends the bypass.
    let q = p4(30_000);
    let send = || {
        let (v, out) = l.run_meta(w.a, &hint(9), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(&q, MAC_GW4)));
    };
    let mut sent = 0;
    while l.flow_guard(SLOT_A).expect("guard").bypass != 0 {
        send();
        sent += 1;
        assert!(sent <= 3 * FP_FLOW_GUARD_WINDOW * FP_FLOW_GUARD_SAMPLE, "the bypass never ended: {:?}", flow(l));
    }
    let before = flow(l);
    for _ in 0..FP_FLOW_GUARD_SAMPLE {
        send();
    }
    let after = flow(l);
    assert_eq!(
        (after[FP_FC_HIT as usize] - before[FP_FC_HIT as usize], after[FP_FC_MISS as usize] - before[FP_FC_MISS as usize]),
        (u64::from(FP_FLOW_GUARD_SAMPLE), 0),
        "the flow filled in the bypass's first second is hit: {after:?}"
    );
}

/// Every live way of every set, as `fastpath flows` decodes it.
fn cached(l: &Loaded) -> Vec<fastpath_bpf::FlowWay> {
    let mut v = Vec::new();
    for idx in 0..l.skel.maps.fp_flows.max_entries() {
        let raw_set = l.skel.maps.fp_flows.lookup(&idx.to_ne_bytes(), MapFlags::ANY).expect("fp_flows").expect("set");
        let set: fp_flow_set = support::world::from_raw(&raw_set);
        v.extend((0..FP_FLOW_WAYS as usize).map(|w| fastpath_bpf::flow_way(&set, w)).filter(|f| f.generation != 0));
    }
    v
}

/// IPv4 ways keep their bookkeeping in their own line (one home way per
/// hash): flows that share a set and a home way, mixed with an IPv6 flow in
/// the same set, all hit from their second packet on, and each way decodes
/// to its own key (padding zero again) and packet count.
#[test]
fn ipv4_flows_away_from_home_and_ipv6_share_a_set() {
    let Some((mut lab, w)) = lab("ipv4_flows_away_from_home_and_ipv6_share_a_set") else { return };
    let l = lab.program(&w).expect("load");
    let p6 = p6();
    let v4s: Vec<Ip4> = (3000..3003).map(p4).collect();
    for round in 0..3u64 {
        for q in &v4s {
            let (v, out) = l.run_meta(w.a, &hint(9), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
            assert_eq!((v, out), (XDP_REDIRECT, out4(q, MAC_GW4)));
        }
        let (v, out) = l.run_meta(w.a, &hint(9), &p6.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out6(&p6)));
        assert_eq!(flow(l)[FP_FC_HIT as usize], 4 * round, "round {round}: every flow of the set hits");
    }
    assert_eq!(flow(l)[FP_FC_MISS as usize], 4);

    // family, source port, source, destination, packets, generation
    type Way = (u8, u16, Vec<u8>, Vec<u8>, u32, u32);
    let mut got: Vec<Way> = cached(l)
        .iter()
        .map(|f| {
            let k = &f.key;
            (k.family, u16::from_be(k.sport), k.saddr.to_vec(), k.daddr.to_vec(), f.packets, f.generation)
        })
        .collect();
    got.sort();
    let pad4 = |a: [u8; 4]| [a.to_vec(), vec![0; 12]].concat();
    let gen = w.rt.generation as u32;
    let mut want: Vec<_> = v4s
        .iter()
        .map(|q| (AF_INET, u16::from_be_bytes([q.payload[0], q.payload[1]]), pad4(q.src), pad4(q.dst), 3, gen))
        .collect();
    want.push((AF_INET6, 7, p6.src.to_vec(), p6.dst.to_vec(), 3, gen));
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn timeout_zero_turns_the_cache_off() {
    let Some((mut lab, mut w)) = lab("timeout_zero_turns_the_cache_off") else { return };
    w.rt.flow_timeout = 0;
    let l = lab.program(&w).expect("load");
    let p = p4(1000);
    for _ in 0..2 {
        forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(&p, MAC_GW4));
    }
    assert_eq!(flow(l), [0; FP_FC__COUNT as usize]);
}

/// A multipath route over two gateways with weights 1:3 (fp_groups entry
/// as the daemon writes it), policy 1 and a user seed.
fn ecmp_world(w: &mut World) -> [i32; 2] {
    let bounds = fastpath_core::mphash::upper_bounds(&[1, 3]);
    w.set_route4(lpm4("203.0.113.0", 24), route(fp_route_type::FP_RT_MULTIPATH, 1));
    w.rt.mp_policy4 = 1;
    w.rt.mp_seed = 0x5eed;
    [bounds[0], bounds[1]]
}

fn write_group(l: &Loaded, bounds: [i32; 2]) {
    let mut g = fp_group { kind: fp_group_kind::FP_GRP_HASH_THRESHOLD as u8, n_paths: 2, ..Default::default() };
    g.paths[0] = fp_group_path { upper_bound: bounds[0], nh_id: NH_GW4 };
    g.paths[1] = fp_group_path { upper_bound: bounds[1], nh_id: NH_V4_VIA_V6 };
    l.skel.maps.fp_groups.update(&1u32.to_ne_bytes(), raw(&g), MapFlags::ANY).expect("fp_groups");
}

/// The path the kernel would take for this flow (Rust reference of its hash).
fn kernel_path(p: &Ip4, bounds: [i32; 2]) -> Mac {
    policy_path(p, bounds, 1)
}

/// The same under hash policy `policy` (the reference ignores the ports for 0).
fn policy_path(p: &Ip4, bounds: [i32; 2], policy: u32) -> Mac {
    let sport = u16::from_be_bytes([p.payload[0], p.payload[1]]);
    let dport = u16::from_be_bytes([p.payload[2], p.payload[3]]);
    let h = fastpath_core::mphash::hash4(policy, 0x5eed, p.src.into(), p.dst.into(), 17, sport, dport).expect("policy 0 or 1");
    match fastpath_core::mphash::select(&bounds, h) {
        Some(0) => MAC_GW4,
        Some(1) => MAC_GW6LL,
        other => panic!("no path for hash {h}: {other:?}"),
    }
}

/// The flow hash only places flows in the cache: with or without a hint
/// (any value), misses and hits, every flow takes the kernel's path.
#[test]
fn ecmp_paths_do_not_depend_on_the_hint() {
    let Some((mut lab, mut w)) = lab("ecmp_paths_do_not_depend_on_the_hint") else { return };
    let bounds = ecmp_world(&mut w);
    let l = lab.program(&w).expect("load");
    write_group(l, bounds);
    let mut seen = [0u32; 2];
    for port in 3000..3200u16 {
        let p = p4(port);
        let want = out4(&p, kernel_path(&p, bounds));
        seen[usize::from(want[..6] == MAC_GW6LL)] += 1;
        let f = p.frame(MAC_A, MAC_CLIENT);
        forwards(l, &w, &f, &want);
        forwards(l, &w, &f, &want);
        let h = u32::from(port).wrapping_mul(0x9E37_79B1);
        for _ in 0..2 {
            let (v, out) = l.run_meta(w.a, &hint(h), &f).expect("run");
            assert_eq!((v, out), (XDP_REDIRECT, want.clone()), "flow {port} with a hint");
        }
    }
    assert!(seen[0] > 20 && seen[1] > 100, "weights 1:3 not reflected: {seen:?}");
    assert!(hash_src(l)[FP_HS_META as usize] >= 400);
}

/// 100 flows cached over a 1:3 group, then the group re-weighted 3:1: the
/// hash now maps many flows elsewhere, the cached ones stay on their paths.
/// Returns the flows and the group's bounds before and after.
fn sticky_ecmp_flows(l: &Loaded, w: &mut World, bounds: [i32; 2]) -> (Vec<Ip4>, [i32; 2]) {
    let flows = cache_ecmp_flows(l, w, bounds);
    let swapped = fastpath_core::mphash::upper_bounds(&[3, 1]);
    let swapped = [swapped[0], swapped[1]];
    change_group(l, w, swapped);
    for p in &flows {
        forwards(l, w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, kernel_path(p, bounds)));
    }
    (flows, swapped)
}

/// Group 1 with `bounds`, and 100 flows cached on the paths the hash picks.
fn cache_ecmp_flows(l: &Loaded, w: &World, bounds: [i32; 2]) -> Vec<Ip4> {
    write_group(l, bounds);
    let flows: Vec<Ip4> = (3000..3100u16).map(p4).collect();
    for p in &flows {
        forwards(l, w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, kernel_path(p, bounds)));
    }
    flows
}

/// A group change as the daemon writes it (maps.rs): group_generation
/// ahead of the group, then the generation bump.
fn change_group(l: &Loaded, w: &mut World, bounds: [i32; 2]) {
    w.rt.group_generation = (w.rt.generation + 1) as u32;
    l.set_rt(&w.rt).expect("bss");
    write_group(l, bounds);
    bump(l, w);
}

/// The thrash guard learns of flows that may be kept off the hash's path
/// only from a group change: after any other table change the stale ECMP
/// flows keep next hops the hash picks anyway.
#[test]
fn only_a_group_change_makes_kept_paths_sticky() {
    let Some((mut lab, mut w)) = lab("only_a_group_change_makes_kept_paths_sticky") else { return };
    let bounds = ecmp_world(&mut w);
    let l = lab.program(&w).expect("load");
    let flows = cache_ecmp_flows(l, &w, bounds);
    bump(l, &mut w);
    for p in &flows {
        forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, kernel_path(p, bounds)));
    }
    assert!(flow(l)[FP_FC_STALE as usize] >= flows.len() as u64, "the bump made no flow stale");
    assert_eq!(l.flow_guard(SLOT_A).expect("guard").sticky, 0, "a bump without a group change");
    let swapped = fastpath_core::mphash::upper_bounds(&[3, 1]);
    change_group(l, &mut w, [swapped[0], swapped[1]]);
    forwards(l, &w, &flows[0].frame(MAC_A, MAC_CLIENT), &out4(&flows[0], kernel_path(&flows[0], bounds)));
    assert_eq!(l.flow_guard(SLOT_A).expect("guard").sticky, 1, "a flow kept its path across a group change");
}

/// A stale ECMP flow keeps its path while it is still a member; when its
/// path leaves the group it moves to what the hash says.
#[test]
fn stale_ecmp_flows_keep_their_path() {
    let Some((mut lab, mut w)) = lab("stale_ecmp_flows_keep_their_path") else { return };
    let bounds = ecmp_world(&mut w);
    let l = lab.program(&w).expect("load");
    let (flows, _) = sticky_ecmp_flows(l, &mut w, bounds);
    // The second path leaves: its flows follow the hash, i.e. the first path.
    let mut g = fp_group { kind: fp_group_kind::FP_GRP_HASH_THRESHOLD as u8, n_paths: 1, ..Default::default() };
    g.paths[0] = fp_group_path { upper_bound: i32::MAX, nh_id: NH_GW4 };
    l.skel.maps.fp_groups.update(&1u32.to_ne_bytes(), raw(&g), MapFlags::ANY).expect("fp_groups");
    bump(l, &mut w);
    for p in &flows {
        forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, MAC_GW4));
    }
}

/// While the cache is bypassed, a flow kept on its old ECMP path takes the
/// path the hash picks with every packet, the sampled ones (which find its
/// entry) included: never alternating between the two. Once the bypass
/// ends it stays there, also when its entry is still live.
#[test]
fn bypassed_ecmp_flows_take_one_path() {
    let Some((mut lab, mut w)) = lab("bypassed_ecmp_flows_take_one_path") else { return };
    let bounds = ecmp_world(&mut w);
    let l = lab.program(&w).expect("load");
    let (flows, swapped) = sticky_ecmp_flows(l, &mut w, bounds);
    assert!(
        flows.iter().any(|p| kernel_path(p, bounds) != kernel_path(p, swapped)),
        "the test needs flows kept off the hash's path"
    );
    assert_eq!(l.flow_guard(SLOT_A).expect("guard").sticky, 1, "flows kept their next hop across a group change, unnoticed");
    // A flood into one set turns the bypass on.
    for i in 0..3 * FP_FLOW_GUARD_WINDOW {
        let (v, _) = l.run_meta(w.a, &hint(7), &p4(20_000 + i as u16).frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!(v, XDP_REDIRECT);
    }
    let before = flow(l);
    assert!(before[FP_FC_BYPASS as usize] > 0, "no bypass: {before:?}");
    assert_eq!(l.flow_guard(SLOT_A).expect("guard").bypass, 1);
    for _ in 0..2 {
        for p in &flows {
            forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, kernel_path(p, swapped)));
        }
    }
    let after = flow(l);
    assert!(
        after[FP_FC_MISS as usize] > before[FP_FC_MISS as usize],
        "no packet of the flows was sampled (their entries predate the bypass: misses): {after:?}"
    );
    // One flow that hits ends the bypass while the others' entries are
    // still live: those the bypass never sampled were last used before it
    // began, and must not take their flows back to the old path.
    let hitter = p4(40_000);
    let mut sent = 0;
    while l.flow_guard(SLOT_A).expect("guard").bypass != 0 {
        let (v, _) = l.run_meta(w.a, &hint(9), &hitter.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!(v, XDP_REDIRECT);
        sent += 1;
        assert!(sent <= 3 * FP_FLOW_GUARD_WINDOW * FP_FLOW_GUARD_SAMPLE, "the bypass did not end");
    }
    for _ in 0..2 {
        for p in &flows {
            forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, kernel_path(p, swapped)));
        }
    }
}

/// A new hash policy moves cached flows as it moves them in the kernel:
/// stickiness is for group changes, not for a changed hash.
#[test]
fn a_new_hash_policy_is_not_sticky() {
    let Some((mut lab, mut w)) = lab("a_new_hash_policy_is_not_sticky") else { return };
    let bounds = ecmp_world(&mut w);
    let l = lab.program(&w).expect("load");
    let flows = cache_ecmp_flows(l, &w, bounds);
    // Policy 0 (L3): one address pair, so one path for every flow, which
    // for some of them is not the path policy 1 gave. The daemon sets
    // mp_generation to the generation the change is bumped to.
    let p0 = |p: &Ip4| policy_path(p, bounds, 0);
    assert!(flows.iter().any(|p| kernel_path(p, bounds) != p0(p)), "the test needs flows that move");
    w.rt.mp_policy4 = 0;
    w.rt.mp_generation = (w.rt.generation + 1) as u32;
    bump(l, &mut w);
    for p in &flows {
        forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, p0(p)));
    }
}

/// ICMP errors over a multipath route are the kernel's (it hashes the
/// inner header); echo is forwarded.
#[test]
fn icmp_errors_over_ecmp_punt() {
    let Some((mut lab, mut w)) = lab("icmp_errors_over_ecmp_punt") else { return };
    let bounds = ecmp_world(&mut w);
    w.rt.mp_policy4 = 0;
    let l = lab.program(&w).expect("load");
    write_group(l, bounds);
    let mut err = Ip4::new(v4("192.0.2.10"), v4("203.0.113.20"));
    err.proto = 1;
    err.payload = vec![3, 1, 0, 0, 0, 0, 0, 0];
    punts(l, &w, &err.frame(MAC_A, MAC_CLIENT), FP_R_ICMP_ERROR_ECMP);
    let mut echo = err.clone();
    echo.payload = vec![8, 0, 0, 0, 0, 1, 0, 1];
    let (v, _) = l.run(w.a, &echo.frame(MAC_A, MAC_CLIENT)).expect("run");
    assert_eq!(v, XDP_REDIRECT);
}

fn hint_l3(hash: u32) -> Vec<u8> {
    let h = fp_rx_hint { hash, flags: 0, magic: FP_HINT_MAGIC as u16 };
    raw(&h).to_vec()
}

/// `--flow-key addresses`: connections between the same two hosts share
/// one entry (ports 0 in its key), IPv4 and IPv6, from the first packet of
/// the second connection on; their bytes are their own. A hint over the
/// ports would scatter them over sets, so only an L3 hint is taken.
#[test]
fn address_keys_give_one_entry_per_address_pair() {
    let Some((mut lab, mut w)) = lab("address_keys_give_one_entry_per_address_pair") else { return };
    w.flow_key_addrs = true;
    let l = lab.program(&w).expect("load");
    let v4s: Vec<Ip4> = (4000..4004).map(p4).collect();
    let mut v6s = Vec::new();
    for port in 5000..5004u16 {
        let mut p = p6();
        p.payload = udp_ports(port, 9);
        v6s.push(p);
    }
    for _ in 0..2 {
        for q in &v4s {
            forwards(l, &w, &q.frame(MAC_A, MAC_CLIENT), &out4(q, MAC_GW4));
        }
        for q in &v6s {
            forwards(l, &w, &q.frame(MAC_A, MAC_CLIENT), &out6(q));
        }
    }
    assert_eq!(flow(l)[FP_FC_MISS as usize], 2, "one miss per address pair");
    assert_eq!(flow(l)[FP_FC_HIT as usize], 14);
    let mut got: Vec<(u8, u16, u16, u32)> =
        cached(l).iter().map(|f| (f.key.family, f.key.sport, f.key.dport, f.packets)).collect();
    got.sort();
    assert_eq!(got, vec![(AF_INET, 0, 0, 8), (AF_INET6, 0, 0, 8)]);

    // L4 hints, a different one per connection: still the one entry, by
    // the software hash. An L3 hint is the pair's and is taken.
    let before = hash_src(l);
    for (i, q) in v4s.iter().enumerate() {
        let (v, out) = l.run_meta(w.a, &hint(0x1000 + i as u32), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(q, MAC_GW4)));
    }
    let after = hash_src(l);
    assert_eq!(after[FP_HS_SOFTWARE as usize] - before[FP_HS_SOFTWARE as usize], 4);
    assert_eq!(after[FP_HS_META as usize], before[FP_HS_META as usize]);
    assert_eq!(flow(l)[FP_FC_MISS as usize], 2, "the L4 hints found the pair's entry");
    for q in &v4s {
        let (v, out) = l.run_meta(w.a, &hint_l3(77), &q.frame(MAC_A, MAC_CLIENT)).expect("run");
        assert_eq!((v, out), (XDP_REDIRECT, out4(q, MAC_GW4)));
    }
    assert_eq!(hash_src(l)[FP_HS_META as usize] - after[FP_HS_META as usize], 4);
    assert_eq!(flow(l)[FP_FC_MISS as usize], 3, "an L3 hint places the pair once more, then hits");
    assert_eq!(cached(l).len(), 3);
}

/// With the default key every connection has an entry of its own.
#[test]
fn port_keys_give_one_entry_per_connection() {
    let Some((mut lab, w)) = lab("port_keys_give_one_entry_per_connection") else { return };
    let l = lab.program(&w).expect("load");
    for _ in 0..2 {
        for q in (4000..4004).map(p4) {
            forwards(l, &w, &q.frame(MAC_A, MAC_CLIENT), &out4(&q, MAC_GW4));
        }
    }
    assert_eq!(flow(l)[FP_FC_MISS as usize], 4);
    let mut ports: Vec<u16> = cached(l).iter().map(|f| u16::from_be(f.key.sport)).collect();
    ports.sort();
    assert_eq!(ports, vec![4000, 4001, 4002, 4003]);
}

/// `--flow-key addresses` under multipath hash policy 1: the kernel picks
/// the path by the ports, so the key keeps them and every connection takes
/// its own path, cached or not. Back to policy 0 (with the generation bump
/// the daemon makes), the pair's connections share one entry and one path.
#[test]
fn address_keys_keep_the_ports_under_l4_multipath_hashing() {
    let Some((mut lab, mut w)) = lab("address_keys_keep_the_ports_under_l4_multipath_hashing") else { return };
    w.flow_key_addrs = true;
    let bounds = ecmp_world(&mut w);
    let l = lab.program(&w).expect("load");
    let flows = cache_ecmp_flows(l, &w, bounds);
    for p in &flows {
        forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, kernel_path(p, bounds)));
    }
    assert_eq!(flow(l)[FP_FC_MISS as usize], 100);
    assert_eq!(flow(l)[FP_FC_HIT as usize], 100);
    assert!(flows.iter().any(|p| kernel_path(p, bounds) != kernel_path(&flows[0], bounds)), "the test needs both paths");

    w.rt.mp_policy4 = 0;
    w.rt.mp_generation = (w.rt.generation + 1) as u32;
    bump(l, &mut w);
    for p in &flows {
        forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(p, policy_path(p, bounds, 0)));
    }
    assert_eq!(flow(l)[FP_FC_MISS as usize], 101, "one more miss, for the pair");
    let live: Vec<_> = cached(l).into_iter().filter(|f| f.generation == w.rt.generation as u32).collect();
    assert_eq!(live.len(), 1);
    assert_eq!((live[0].key.sport, live[0].key.dport, live[0].packets), (0, 0, 100));
}

/// The software hash spreads the hosts of a subnet, which differ in the
/// last byte of the address: a ping sweep of a /24 from one source (one
/// key word for all, ICMP echo having no ports) is cached flow by flow,
/// no set overflowing, where the destination's byte once never reached a
/// set index and every echo fought over one set's four ways.
#[test]
fn a_sweep_of_a_subnet_spreads_over_sets() {
    let Some((mut lab, w)) = lab("a_sweep_of_a_subnet_spreads_over_sets") else { return };
    let l = lab.program(&w).expect("load");
    let echo = |host: u8| {
        let mut p = Ip4::new(v4("192.0.2.10"), [203, 0, 113, host]);
        p.proto = 1;
        p.payload = vec![8, 0, 0, 0, 0, 1, 0, 1];
        p
    };
    for _ in 0..2 {
        for host in 1..=254u8 {
            let p = echo(host);
            forwards(l, &w, &p.frame(MAC_A, MAC_CLIENT), &out4(&p, MAC_GW4));
        }
    }
    let f = flow(l);
    assert_eq!((f[FP_FC_MISS as usize], f[FP_FC_HIT as usize], f[FP_FC_EVICT as usize]), (254, 254, 0));
    assert_eq!(hash_src(l)[FP_HS_SOFTWARE as usize], 508);
}
