//! BPF_PROG_RUN tests of NAT in stateful mode (`bpf/lib/nat.h` wired into
//! the conntrack gate and `bpf/xdp_fwd.bpf.c`), against real conntrack
//! entries made with `conntrack -I --src-nat/--dst-nat` in the test's own
//! namespace, in the style of stateful.rs.
//!
//! A NATed established entry forwards with the rewrite applied (expected
//! bytes built here with full checksums); the route is looked up for the
//! post-DNAT destination (a port forward to the router's own address is
//! routed to its target, not punted as local); the reply direction undoes
//! the manip; a cache hit applies the cached rewrite; a new entry for the
//! same tuple with another NAT is never sent along the old route.
//! (Byte-exactness against the kernel's own nf_nat: tests/nat.rs.)
//!
//!   cargo test --release -p fastpath-bpf --test stateful_nat

#[allow(dead_code)] // each test binary uses its own part of the support code
mod support;

use fastpath_bpf::intf::fp_flow_event::*;
use fastpath_bpf::intf::fp_reason::*;
use fastpath_bpf::intf::*;

use support::conntrack;
use support::ct_icmp::*;
use support::netns::{require_root, Lab};
use support::packet::*;
use support::runner::*;
use support::world::*;

const TCP: u8 = 6;
const UDP: u8 = 17;
const ACK: u8 = 0x10;

const EST: &str = "--state ESTABLISHED --timeout 100 --status ASSURED,SEEN_REPLY --mark 3";

/// Client 192.0.2.10:1000 to 203.0.113.20:80, leaving as 198.51.100.254:40000.
fn snat_tcp() -> String {
    format!("-p tcp -s 192.0.2.10 -d 203.0.113.20 --sport 1000 --dport 80 {EST} --src-nat 198.51.100.254:40000")
}
fn snat_udp() -> String {
    "-p udp -s 192.0.2.10 -d 203.0.113.20 --sport 1000 --dport 53 --timeout 100 --status ASSURED,SEEN_REPLY \
     --mark 3 --src-nat 198.51.100.254:40000"
        .into()
}
/// Port forward: the client talks to the router (192.0.2.1:8080, a local
/// address in the world's FIB), the entry sends it to 203.0.113.20:80.
fn dnat_tcp(to: &str) -> String {
    format!("-p tcp -s 192.0.2.10 -d 192.0.2.1 --sport 1000 --dport 8080 {EST} --dst-nat {to}")
}
/// A connection opened from outside to 198.51.100.77:5555, forwarded to the
/// client: the client's packets are its reply direction (source restored).
fn dnat_inbound() -> String {
    format!("-p tcp -s 203.0.113.20 -d 198.51.100.77 --sport 80 --dport 5555 {EST} --dst-nat 192.0.2.10:1000")
}
fn snat6_tcp() -> String {
    format!("-p tcp -s 2001:db8:a::10 -d 2001:db8:2::20 --sport 1000 --dport 80 {EST} --src-nat [2001:db8:b::99]:40000")
}

/// L4 header and payload with a correct checksum for these addresses.
fn l4(proto: u8, src: &[u8], dst: &[u8], sport: u16, dport: u16) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    if proto == TCP {
        h.extend_from_slice(&0x1000_0000u32.to_be_bytes());
        h.extend_from_slice(&0x2000_0000u32.to_be_bytes());
        h.extend_from_slice(&[0x50, ACK, 0x01, 0x00, 0, 0, 0, 0]);
    } else {
        h.extend_from_slice(&[0, 0, 0, 0]);
    }
    h.extend_from_slice(b"fastpath nat!");
    if proto == UDP {
        let len = h.len() as u16;
        h[4..6].copy_from_slice(&len.to_be_bytes());
    }
    let mut pseudo = [src, dst].concat();
    if src.len() == 4 {
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(h.len() as u16).to_be_bytes());
    } else {
        pseudo.extend_from_slice(&(h.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, proto]);
    }
    let mut c = csum(&[pseudo, h.clone()].concat());
    if proto == UDP && c == 0 {
        c = 0xFFFF;
    }
    let at = if proto == TCP { 16 } else { 6 };
    h[at..at + 2].copy_from_slice(&c.to_be_bytes());
    h
}

struct Flow4 {
    proto: u8,
    src: &'static str,
    dst: &'static str,
    sport: u16,
    dport: u16,
}

impl Flow4 {
    fn ip(&self, ttl: u8) -> Ip4 {
        let (s, d) = (v4(self.src), v4(self.dst));
        let mut p = Ip4::new(s, d);
        p.proto = self.proto;
        p.ttl = ttl;
        p.payload = l4(self.proto, &s, &d, self.sport, self.dport);
        p
    }

    /// As the client sends it on port a.
    fn input(&self) -> Vec<u8> {
        self.ip(64).frame(MAC_A, MAC_CLIENT)
    }

    /// As it must leave port b towards the 203.0.113.0/24 gateway.
    fn output(&self) -> Vec<u8> {
        self.ip(63).frame(MAC_GW4, MAC_B)
    }
}

fn lab(test: &str) -> Option<(Lab, World)> {
    if !require_root(test) {
        return None;
    }
    let lab = Lab::new().expect("private netns with a veth pair");
    support::cpu::pin_here().expect("pin the test thread");
    let mut w = World::new(lab.a, lab.b);
    w.stateful = true;
    w.rt.ct_mark = 1;
    // Both directions of the translated flows are sent: each has its own bit.
    w.rt.ct_mark_reply = 2;
    w.rt.ct_revalidate_ms = FP_DEFAULT_CT_REVALIDATE_MS;
    w.rt.ct_timeout_tcp = 5000;
    w.rt.ct_timeout_udp = 33;
    w.rt.ct_timeout_udp_stream = 777;
    Some((lab, w))
}

fn entries(list: Vec<String>) -> impl Fn(&mut World) + 'static {
    move |w: &mut World| w.conntrack = list.clone()
}

#[test]
fn nated_entries_forward_rewritten() {
    let Some((_lab, world)) = lab("nated_entries_forward_rewritten") else { return };
    let client = |proto, dst, dport| Flow4 { proto, src: "192.0.2.10", dst, sport: 1000, dport };
    let snat_out = |proto, dport| Flow4 { proto, src: "198.51.100.254", dst: "203.0.113.20", sport: 40000, dport };

    let t6_in = {
        let (s, d) = (v6("2001:db8:a::10"), v6("2001:db8:2::20"));
        let mut p = Ip6::new(s, d);
        p.nexthdr = TCP;
        p.payload = l4(TCP, &s, &d, 1000, 80);
        p
    };
    let t6_out = {
        let (s, d) = (v6("2001:db8:b::99"), v6("2001:db8:2::20"));
        let mut p = Ip6::new(s, d);
        p.nexthdr = TCP;
        p.hop = 63;
        p.payload = l4(TCP, &s, &d, 40000, 80);
        p
    };

    let cases = vec![
        Case::forward(
            "snat tcp, original direction",
            entries(vec![snat_tcp()]),
            client(TCP, "203.0.113.20", 80).input(),
            snat_out(TCP, 80).output(),
        ),
        Case::forward(
            "snat udp, original direction",
            entries(vec![snat_udp()]),
            client(UDP, "203.0.113.20", 53).input(),
            snat_out(UDP, 53).output(),
        ),
        Case::forward(
            "port forward to the router's address: routed for the new destination",
            entries(vec![dnat_tcp("203.0.113.20:80")]),
            client(TCP, "192.0.2.1", 8080).input(),
            Flow4 { proto: TCP, src: "192.0.2.10", dst: "203.0.113.20", sport: 1000, dport: 80 }.output(),
        ),
        Case::forward(
            "dnat, reply direction: the source is restored",
            entries(vec![dnat_inbound()]),
            client(TCP, "203.0.113.20", 80).input(),
            Flow4 { proto: TCP, src: "198.51.100.77", dst: "203.0.113.20", sport: 5555, dport: 80 }.output(),
        ),
        Case::forward(
            "ipv6 snat tcp",
            entries(vec![snat6_tcp()]),
            t6_in.frame(MAC_A, MAC_CLIENT),
            t6_out.frame(MAC_GW6, MAC_B),
        ),
        // Without the entry the same packet is local to the router.
        Case::punt("no entry: the router's own address", entries(vec![]), client(TCP, "192.0.2.1", 8080).input(), FP_R_CT_NEW),
        // A port forward back out of the ingress interface is the kernel's (redirect).
        Case::punt(
            "dnat to the ingress side",
            entries(vec![dnat_tcp("192.0.2.10:80")]),
            client(TCP, "192.0.2.1", 8080).input(),
            FP_R_SAME_IFACE,
        ),
    ];
    run_all(&world, &cases);
}

fn hits(l: &Loaded) -> u64 {
    l.stats(SLOT_A).expect("stats").flow[FP_FC_HIT as usize]
}

/// The rewrite lives in the per-flow verdict cache: a hit applies it without
/// a lookup. A new entry for the same tuple that NATs elsewhere is never
/// sent along the route cached for the old one: that packet goes to the
/// kernel, the next one is routed afresh.
#[test]
fn cached_nat_and_a_moved_target() {
    let Some((_lab, mut w)) = lab("cached_nat_and_a_moved_target") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 600_000;
    w.conntrack = vec![dnat_tcp("203.0.113.20:80")];
    let l = Loaded::new(&w).expect("load");
    let pkt = Flow4 { proto: TCP, src: "192.0.2.10", dst: "192.0.2.1", sport: 1000, dport: 8080 }.input();
    let to_far = Flow4 { proto: TCP, src: "192.0.2.10", dst: "203.0.113.20", sport: 1000, dport: 80 }.output();
    forwards(&l, &w, &pkt, &to_far);
    forwards(&l, &w, &pkt, &to_far);
    assert_eq!(hits(&l), 1, "the second packet is a cache hit");
    conntrack::delete("-p tcp -s 192.0.2.10 -d 192.0.2.1 --sport 1000 --dport 8080").expect("conntrack -D");
    conntrack::insert(&dnat_tcp("198.51.100.7:80")).expect("conntrack -I");
    w.rt.ct_generation += 1;
    l.set_rt(&w.rt).expect(".bss");
    // The cached route (via the 203.0.113.0/24 gateway) is not the new target's.
    punts(&l, &w, &pkt, FP_R_CT_NAT);
    // Routed afresh: a host on port b's link.
    let to_host = Flow4 { proto: TCP, src: "192.0.2.10", dst: "198.51.100.7", sport: 1000, dport: 80 }.ip(63);
    forwards(&l, &w, &pkt, &to_host.frame(MAC_HOST_B, MAC_B));
    forwards(&l, &w, &pkt, &to_host.frame(MAC_HOST_B, MAC_B));
}

fn echo4(src: &str, dst: &str, ty: u8, id: u16, ttl: u8) -> Ip4 {
    let mut p = Ip4::new(v4(src), v4(dst));
    p.proto = 1;
    p.ttl = ttl;
    p.payload = icmp_msg(ty, 0, id, b"fastpath nat echo", None);
    p
}

fn echo6(src: &str, dst: &str, ty: u8, id: u16, hop: u8) -> Ip6 {
    let (s, d) = (v6(src), v6(dst));
    let mut p = Ip6::new(s, d);
    p.nexthdr = 58;
    p.hop = hop;
    p.payload = icmp_msg(ty, 0, id, b"fastpath nat echo", Some((&s, &d)));
    p
}

fn nat_to(flags: u32, saddr: &[u8], daddr: &[u8], id: u16) -> fp_nat {
    let mut n = fp_nat { flags, sport: id.to_be(), dport: id.to_be(), ..Default::default() };
    n.saddr[..saddr.len()].copy_from_slice(saddr);
    n.daddr[..daddr.len()].copy_from_slice(daddr);
    n
}

/// ICMP echo NAT from the daemon's copy of the entry: the echo id is
/// rewritten with the addresses, the ICMPv4 checksum follows the id only,
/// ICMPv6's the addresses too (expected bytes summed from scratch); the
/// reply direction of an inbound DNAT restores the source. (The copy's
/// fp_nat from a real entry: cticmp.rs; bytes against the kernel's NAT:
/// tests/test_nat.py.)
#[test]
fn icmp_echo_nat_from_the_daemons_copy() {
    let Some((_lab, mut w)) = lab("icmp_echo_nat_from_the_daemons_copy") else { return };
    w.rt.flow_timeout = 30;
    let l = Loaded::new(&w).expect("load");
    let (c4, s4, nat4) = (v4("192.0.2.10"), v4("203.0.113.20"), v4("198.51.100.254"));
    let (c6, s6, nat6) = (v6("2001:db8:a::10"), v6("2001:db8:2::20"), v6("2001:db8:b::99"));

    // SNAT with a new id (another client held 0x1234 on the NAT address).
    put_copy(&l, &echo_key(2, 1, (&c4, &s4), 8, 0x1234), FP_R_FORWARDED, nat_to(FP_NAT_SRC, &nat4, &s4, 0xbeef), 0);
    let want = echo4("198.51.100.254", "203.0.113.20", 8, 0xbeef, 63).frame(MAC_GW4, MAC_B);
    for _ in 0..2 {
        forwards(&l, &w, &echo4("192.0.2.10", "203.0.113.20", 8, 0x1234, 64).frame(MAC_A, MAC_CLIENT), &want);
    }
    // Address only: the id stays, and so does the ICMPv4 checksum.
    put_copy(&l, &echo_key(2, 1, (&c4, &s4), 8, 0x1111), FP_R_FORWARDED, nat_to(FP_NAT_SRC, &nat4, &s4, 0x1111), 0);
    forwards(
        &l,
        &w,
        &echo4("192.0.2.10", "203.0.113.20", 8, 0x1111, 64).frame(MAC_A, MAC_CLIENT),
        &echo4("198.51.100.254", "203.0.113.20", 8, 0x1111, 63).frame(MAC_GW4, MAC_B),
    );
    // Inbound DNAT (203.0.113.20 pinged 198.51.100.77, sent on to the
    // client): the client's echo reply gets the public source back.
    let public = v4("198.51.100.77");
    put_copy(&l, &echo_key(2, 1, (&c4, &s4), 0, 7), FP_R_FORWARDED, nat_to(FP_NAT_SRC, &public, &s4, 7), 0);
    forwards(
        &l,
        &w,
        &echo4("192.0.2.10", "203.0.113.20", 0, 7, 64).frame(MAC_A, MAC_CLIENT),
        &echo4("198.51.100.77", "203.0.113.20", 0, 7, 63).frame(MAC_GW4, MAC_B),
    );
    // IPv6 SNAT, new id and address both in the checksum.
    put_copy(&l, &echo_key(10, 58, (&c6, &s6), 128, 0x1234), FP_R_FORWARDED, nat_to(FP_NAT_SRC, &nat6, &s6, 0x4321), 0);
    let want6 = echo6("2001:db8:b::99", "2001:db8:2::20", 128, 0x4321, 63).frame(MAC_GW6, MAC_B);
    for _ in 0..2 {
        forwards(&l, &w, &echo6("2001:db8:a::10", "2001:db8:2::20", 128, 0x1234, 64).frame(MAC_A, MAC_CLIENT), &want6);
    }
    assert!(hits(&l) >= 2, "the repeats were cache hits");
}
