//! BPF_PROG_RUN tests of stateful mode (`bpf/lib/ct.h`): the program runs
//! against real conntrack entries, made with `conntrack -I` in the test's own
//! network namespace (the namespace the kfunc looks up, the ingress veth's).
//!
//! Table cases (each from a fresh program, flow cache off and on): an
//! established, marked entry forwards with the exact bytes; every other
//! entry, flag or protocol punts with its reason. Sequences: a cached verdict
//! holds until ct_generation moves or ct_revalidate_ms passes, then the
//! next packet sees the deletion; without a flow cache every packet looks
//! conntrack up; a validation refreshes the entry's timeout; per-flow bytes.
//!
//! The tests share one loaded program and namespace (`shared_lab`), reset
//! to a fresh load's state at each start, and so run one after the other.
//!
//! Needs root and conntrack-tools, like prog_run.rs.
//!
//!   cargo test --release -p fastpath-bpf --test stateful

#[allow(dead_code)] // each test binary uses its own part of the support code
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use fastpath_bpf::intf::fp_flow_event::*;
use fastpath_bpf::intf::fp_reason::{self, *};
use fastpath_bpf::intf::*;
use libbpf_rs::{MapCore, MapFlags};

use support::conntrack;
use support::ct_icmp::*;
use support::netns::{require_root, Lab};
use support::packet::*;
use support::runner::*;
use support::world::*;

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// Timeouts the runtime asks for, distinct from the kernel defaults and the
/// entries' own, so a refresh is visible.
const TCP_TIMEOUT: u32 = 5000;
const UDP_TIMEOUT: u32 = 33;
const UDP_STREAM_TIMEOUT: u32 = 777;

/// The client's flows to 203.0.113.20 (v4) and 2001:db8:2::20 (v6).
const TCP_EST: &str = "-p tcp -s 192.0.2.10 -d 203.0.113.20 --sport 1000 --dport 80 --state ESTABLISHED \
                       --timeout 100 --status ASSURED,SEEN_REPLY --mark 1";
const UDP_EST: &str = "-p udp -s 192.0.2.10 -d 203.0.113.20 --sport 1000 --dport 53 --timeout 100 \
                       --status ASSURED,SEEN_REPLY --mark 1";
const TCP6_EST: &str = "-p tcp -s 2001:db8:a::10 -d 2001:db8:2::20 --sport 1000 --dport 80 --state ESTABLISHED \
                        --timeout 100 --status ASSURED,SEEN_REPLY --mark 1";
const UDP6_EST: &str = "-p udp -s 2001:db8:a::10 -d 2001:db8:2::20 --sport 1000 --dport 53 --timeout 100 \
                        --status ASSURED,SEEN_REPLY --mark 1";
/// An entry the server opened: the client's packets (t4) are its replies.
const TCP_EST_FROM_SERVER: &str = "-p tcp -s 203.0.113.20 -d 192.0.2.10 --sport 80 --dport 1000 --state ESTABLISHED \
                                   --timeout 100 --status ASSURED,SEEN_REPLY --mark 2";
const TCP_FILTER: &str = "-p tcp -s 192.0.2.10 -d 203.0.113.20 --sport 1000 --dport 80";
const UDP_FILTER: &str = "-p udp -s 192.0.2.10 -d 203.0.113.20 --sport 1000 --dport 53";
const UDP6_FILTER: &str = "-p udp -s 2001:db8:a::10 -d 2001:db8:2::20 --sport 1000 --dport 53";

/// A 20-byte TCP header (and a few bytes of data); the program never
/// checks the L4 checksum.
fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut h = Vec::with_capacity(28);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&0x1000_0000u32.to_be_bytes());
    h.extend_from_slice(&0x2000_0000u32.to_be_bytes());
    h.extend_from_slice(&[0x50, flags, 0x01, 0x00, 0, 0, 0, 0]);
    h.extend_from_slice(b"fastpath");
    h
}

fn udp_ports(sport: u16, dport: u16) -> Vec<u8> {
    let mut u = udp(12);
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u
}

fn t4(flags: u8) -> Ip4 {
    let mut p = Ip4::new(v4("192.0.2.10"), v4("203.0.113.20"));
    p.proto = TCP;
    p.payload = tcp(1000, 80, flags);
    p
}

fn u4() -> Ip4 {
    let mut p = Ip4::new(v4("192.0.2.10"), v4("203.0.113.20"));
    p.proto = UDP;
    p.payload = udp_ports(1000, 53);
    p
}

fn t6(flags: u8) -> Ip6 {
    let mut p = Ip6::new(v6("2001:db8:a::10"), v6("2001:db8:2::20"));
    p.nexthdr = TCP;
    p.payload = tcp(1000, 80, flags);
    p
}

fn u6() -> Ip6 {
    let mut p = Ip6::new(v6("2001:db8:a::10"), v6("2001:db8:2::20"));
    p.nexthdr = UDP;
    p.payload = udp_ports(1000, 53);
    p
}

fn f6(p: &Ip6) -> Vec<u8> {
    p.frame(MAC_A, MAC_CLIENT)
}

fn f4(p: &Ip4) -> Vec<u8> {
    p.frame(MAC_A, MAC_CLIENT)
}

fn out4(p: &Ip4) -> Vec<u8> {
    let mut o = p.clone();
    o.ttl -= 1;
    o.frame(MAC_GW4, MAC_B)
}

fn out6(p: &Ip6) -> Vec<u8> {
    let mut o = p.clone();
    o.hop -= 1;
    o.frame(MAC_GW6, MAC_B)
}

/// An ICMP message from the client (type, code, echo id) with its checksum.
fn echo4(ty: u8, code: u8, id: u16) -> Ip4 {
    let mut p = Ip4::new(v4("192.0.2.10"), v4("203.0.113.20"));
    p.proto = ICMP;
    p.payload = icmp_msg(ty, code, id, b"fastpath echo", None);
    p
}

fn echo6(ty: u8, id: u16) -> Ip6 {
    let (s, d) = (v6("2001:db8:a::10"), v6("2001:db8:2::20"));
    let mut p = Ip6::new(s, d);
    p.nexthdr = ICMPV6;
    p.payload = icmp_msg(ty, 0, id, b"fastpath echo", Some((&s, &d)));
    p
}

fn stateful_world(a: u32, b: u32) -> World {
    let mut w = World::new(a, b);
    w.stateful = true;
    w.rt.ct_mark = 1;
    w.rt.ct_mark_reply = 2;
    w.rt.ct_revalidate_ms = FP_DEFAULT_CT_REVALIDATE_MS;
    w.rt.ct_timeout_tcp = TCP_TIMEOUT;
    w.rt.ct_timeout_udp = UDP_TIMEOUT;
    w.rt.ct_timeout_udp_stream = UDP_STREAM_TIMEOUT;
    // `conntrack -I` cannot set an entry's per-direction "be liberal" TCP
    // flags (the daemon sets them over ctnetlink): these tests stand for a
    // netns with nf_conntrack_tcp_be_liberal=1 unless they say otherwise.
    w.rt.ct_tcp_liberal = 1;
    w
}

fn lab(test: &str) -> Option<(Lab, World)> {
    if !require_root(test) {
        return None;
    }
    let lab = Lab::new().expect("private netns with a veth pair");
    // Sequences below rely on the per-CPU flow cache keeping their flow.
    support::cpu::pin_here().expect("pin the test thread");
    let w = stateful_world(lab.a, lab.b);
    Some((lab, w))
}

/// As `lab`, on the programs and namespace the tests of this file share
/// (`SharedLab`: one load of the stateful program instead of one per test).
fn shared_lab(test: &str) -> Option<(SharedLab, World)> {
    if !require_root(test) {
        return None;
    }
    let (lab, a, b) = SharedLab::take_pinned().expect("shared netns with a veth pair");
    Some((lab, stateful_world(a, b)))
}

fn entries(list: &[&str]) -> impl Fn(&mut World) + 'static {
    let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    move |w: &mut World| w.conntrack = list.clone()
}

/// `entry` with one option's value replaced (or the option added).
fn with_opt(entry: &str, opt: &str, value: &str) -> String {
    let mut words: Vec<String> = entry.split_whitespace().map(String::from).collect();
    match words.iter().position(|w| w == opt) {
        Some(i) => words[i + 1] = value.to_string(),
        None => words.extend([opt.to_string(), value.to_string()]),
    }
    words.join(" ")
}

fn without_opt(entry: &str, opt: &str) -> String {
    let words: Vec<&str> = entry.split_whitespace().collect();
    let i = words.iter().position(|w| *w == opt).expect("option in entry");
    words[..i].iter().chain(&words[i + 2..]).copied().collect::<Vec<_>>().join(" ")
}

#[test]
fn established_marked_flows_forward() {
    let Some((mut lab, world)) = shared_lab("established_marked_flows_forward") else { return };
    let data = t4(ACK | PSH);
    let udp = u4();
    let data6 = t6(ACK);
    let reply_dir = "-p tcp -s 203.0.113.20 -d 192.0.2.10 --sport 80 --dport 1000 --state ESTABLISHED \
                     --timeout 100 --status ASSURED,SEEN_REPLY --mark 3";
    let cases = vec![
        Case::forward("tcp established, marked", entries(&[TCP_EST]), f4(&data), out4(&data)),
        Case::forward("tcp, packet in the reply direction", entries(&[reply_dir]), f4(&data), out4(&data)),
        Case::forward("udp assured, marked", entries(&[UDP_EST]), f4(&udp), out4(&udp)),
        Case::forward("ipv6 tcp established, marked", entries(&[TCP6_EST]), data6.frame(MAC_A, MAC_CLIENT), out6(&data6)),
        Case::forward(
            "reply direction, carrying the reply bit",
            entries(&[TCP_EST_FROM_SERVER]),
            f4(&data),
            out4(&data),
        ),
        Case::forward(
            "mark carries more bits than the mask",
            entries(&[&with_opt(TCP_EST, "--mark", "0x101")]),
            f4(&data),
            out4(&data),
        ),
        Case::forward(
            "mask of two bits, both set",
            {
                let e = entries(&[&with_opt(TCP_EST, "--mark", "0x3")]);
                move |w: &mut World| {
                    e(w);
                    w.rt.ct_mark = 0x3;
                }
            },
            f4(&data),
            out4(&data),
        ),
    ];
    lab.run_all(&world, &cases);
}

fn punt_cases() -> Vec<Case> {
    let data = t4(ACK);
    let data6 = t6(ACK);
    let udp = u4();
    let echo = echo4(8, 0, 1);
    let unreachable = echo4(3, 1, 0);
    let echo_code1 = echo4(8, 1, 1);
    let mut short_echo = echo4(8, 0, 1);
    short_echo.payload.truncate(6);
    let mut gre = echo.clone();
    gre.proto = 47;
    gre.payload = vec![0, 0, 0x08, 0x00];
    let mut short_tcp = t4(ACK);
    short_tcp.payload.truncate(16);
    let mut short_udp = u4();
    short_udp.payload.truncate(6);
    let flags = |name, f| Case::punt(name, entries(&[TCP_EST]), f4(&t4(f)), FP_R_CT_TCP_FLAGS);
    vec![
        Case::punt("no entry", entries(&[]), f4(&data), FP_R_CT_NEW),
        Case::punt("ipv6, no entry", entries(&[]), data6.frame(MAC_A, MAC_CLIENT), FP_R_CT_NEW),
        Case::punt("other port's entry", entries(&[&with_opt(TCP_EST, "--sport", "1001")]), f4(&data), FP_R_CT_NEW),
        Case::punt("entry in zone 5", entries(&[&format!("{TCP_EST} --zone 5")]), f4(&data), FP_R_CT_NEW),
        Case::punt(
            "no reply seen",
            entries(&[&without_opt(TCP_EST, "--status")]),
            f4(&data),
            FP_R_CT_NOT_ESTABLISHED,
        ),
        Case::punt(
            "tcp SYN_RECV (the handshake's last ACK)",
            entries(&[&with_opt(TCP_EST, "--state", "SYN_RECV")]),
            f4(&data),
            FP_R_CT_NOT_ESTABLISHED,
        ),
        Case::punt(
            "tcp FIN_WAIT",
            entries(&[&with_opt(TCP_EST, "--state", "FIN_WAIT")]),
            f4(&data),
            FP_R_CT_NOT_ESTABLISHED,
        ),
        Case::punt(
            "udp replied, not yet assured",
            entries(&[&with_opt(UDP_EST, "--status", "SEEN_REPLY")]),
            f4(&udp),
            FP_R_CT_NOT_ESTABLISHED,
        ),
        Case::punt("unmarked", entries(&[&with_opt(TCP_EST, "--mark", "0")]), f4(&data), FP_R_CT_UNMARKED),
        Case::punt("wrong mark", entries(&[&with_opt(TCP_EST, "--mark", "4")]), f4(&data), FP_R_CT_UNMARKED),
        // A ruleset that accepted the replies marked only their direction:
        // the other direction's packets, which it may drop, go to the kernel.
        Case::punt("original direction, only the reply bit", entries(&[&with_opt(TCP_EST, "--mark", "2")]), f4(&data), FP_R_CT_UNMARKED),
        Case::punt(
            "reply direction, only the original bit",
            entries(&[&with_opt(TCP_EST_FROM_SERVER, "--mark", "1")]),
            f4(&data),
            FP_R_CT_UNMARKED,
        ),
        Case::punt(
            "one of two mask bits",
            {
                let e = entries(&[TCP_EST]);
                move |w: &mut World| {
                    e(w);
                    w.rt.ct_mark = 0x3;
                }
            },
            f4(&data),
            FP_R_CT_UNMARKED,
        ),
        Case::punt(
            "ipv6 unmarked",
            entries(&[&with_opt(TCP6_EST, "--mark", "0")]),
            data6.frame(MAC_A, MAC_CLIENT),
            FP_R_CT_UNMARKED,
        ),
        flags("SYN", SYN),
        flags("SYN+ACK", SYN | ACK),
        flags("FIN+ACK", FIN | ACK),
        flags("RST", RST),
        flags("RST+ACK", RST | ACK),
        // ICMP goes by the daemon's copy of its entry (icmp_echo_* below).
        Case::punt("icmp echo, no copy of its entry", entries(&[TCP_EST]), f4(&echo), FP_R_CT_NEW),
        Case::punt("icmp error (related traffic)", entries(&[]), f4(&unreachable), FP_R_CT_UNSUPPORTED),
        Case::punt("icmp echo with a code", entries(&[]), f4(&echo_code1), FP_R_CT_UNSUPPORTED),
        Case::punt("icmp echo header cut short", entries(&[]), f4(&short_echo), FP_R_CT_UNSUPPORTED),
        Case::punt("gre", entries(&[]), f4(&gre), FP_R_CT_UNSUPPORTED),
        Case::punt("tcp header cut short", entries(&[TCP_EST]), f4(&short_tcp), FP_R_CT_UNSUPPORTED),
        Case::punt("udp header cut short", entries(&[UDP_EST]), f4(&short_udp), FP_R_CT_UNSUPPORTED),
        // NAT that forwards: stateful_nat.rs. ECMP would hash the rewritten header.
        Case::punt(
            "dnat onto a multipath route",
            {
                let e = entries(&[&format!("{TCP_EST} --dst-nat 203.0.113.7")]);
                move |w: &mut World| {
                    e(w);
                    for (k, r) in w.fib4.iter_mut() {
                        if k.prefixlen == 24 && k.addr == u32::from_ne_bytes(v4("203.0.113.0")) {
                            *r = route(fp_route_type::FP_RT_MULTIPATH, 1);
                        }
                    }
                }
            },
            f4(&data),
            FP_R_CT_NAT,
        ),
    ]
}

/// Every stateful reason has a case here (prog_run.rs leaves them to this file).
#[test]
fn stateful_punt_reasons() {
    let Some((mut lab, world)) = shared_lab("stateful_punt_reasons") else { return };
    let cases = punt_cases();
    let covered: BTreeSet<usize> = cases
        .iter()
        .filter_map(|c| match c.expect {
            Expect::Punt(r) => Some(r as usize),
            Expect::Forward(_) => None,
        })
        .collect();
    let missing: Vec<&str> =
        STATEFUL_REASONS.iter().map(|r| *r as usize).filter(|r| !covered.contains(r)).map(reason_name).collect();
    assert!(missing.is_empty(), "stateful punt reasons without a case: {missing:?}");
    lab.run_all(&world, &cases);
}

/// The stateless program never asks conntrack: no entry, still forwarded.
#[test]
fn stateless_ignores_conntrack() {
    let Some((mut lab, mut world)) = shared_lab("stateless_ignores_conntrack") else { return };
    world.stateful = false;
    let data = t4(SYN);
    lab.run_all(&world, &[Case::forward("syn, no entry", entries(&[]), f4(&data), out4(&data))]);
}

/// The records the data path posts on a ring buffer map, read on demand.
struct RingRecords<'a> {
    ring: libbpf_rs::RingBuffer<'a>,
    got: std::rc::Rc<std::cell::RefCell<Vec<Vec<u8>>>>,
}

impl<'a> RingRecords<'a> {
    fn open(map: &'a dyn MapCore) -> Self {
        let got = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let sink = std::rc::Rc::clone(&got);
        let mut b = libbpf_rs::RingBufferBuilder::new();
        b.add(map, move |d: &[u8]| {
            sink.borrow_mut().push(d.to_vec());
            0
        })
        .expect("ring");
        RingRecords { ring: b.build().expect("ring"), got }
    }

    /// What was posted since the last call.
    fn take(&self) -> Vec<Vec<u8>> {
        self.ring.consume().expect("consume");
        self.got.borrow_mut().drain(..).collect()
    }
}

fn set_rt(l: &Loaded, w: &World) {
    l.set_rt(&w.rt).expect(".bss");
}

fn hits(l: &Loaded) -> u64 {
    l.stats(SLOT_A).expect("stats").flow[FP_FC_HIT as usize]
}

/// A cached verdict is trusted without a lookup until ct_generation moves;
/// then the next packet looks conntrack up and sees the deletion. A failed
/// revalidation drops the verdict; a new entry is picked up again.
#[test]
fn cached_verdict_rechecked_after_generation_bump() {
    let Some((mut lab, mut w)) = shared_lab("cached_verdict_rechecked_after_generation_bump") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 600_000;
    w.conntrack = vec![TCP_EST.into()];
    let l = lab.program(&w).expect("load");
    let p = t4(ACK);
    forwards(l, &w, &f4(&p), &out4(&p));
    forwards(l, &w, &f4(&p), &out4(&p));
    assert_eq!(hits(l), 1);
    conntrack::delete(TCP_FILTER).expect("conntrack -D");
    // No event yet: the cached verdict stands (this is what the bump is for).
    forwards(l, &w, &f4(&p), &out4(&p));
    w.rt.ct_generation += 1;
    set_rt(l, &w);
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    // The flow itself is still cached (a hit), its verdict is not.
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    conntrack::insert(&with_opt(TCP_EST, "--mark", "0")).expect("conntrack -I");
    punts(l, &w, &f4(&p), FP_R_CT_UNMARKED);
    conntrack::delete(TCP_FILTER).expect("conntrack -D");
    conntrack::insert(TCP_EST).expect("conntrack -I");
    let hits_before = hits(l);
    forwards(l, &w, &f4(&p), &out4(&p));
    assert_eq!(hits(l), hits_before + 1, "the route stayed cached through the punts");
}

/// Conntrack never sees the segments the fast path carries, so a TCP entry
/// goes fast only when its window tracking is liberal in both directions
/// (the daemon sets that per entry) or the whole netns is liberal. Entries
/// from `conntrack -I` are liberal from the start: conntrack-tools sends
/// SACK_PERM|BE_LIBERAL for both directions with every TCP entry it creates
/// (the kernel's ctnetlink applies the flags it is given, nothing more), so
/// the strict entry is made by clearing them over ctnetlink.
#[test]
fn tcp_entry_not_liberal_punts() {
    let Some((mut lab, mut w)) = shared_lab("tcp_entry_not_liberal_punts") else { return };
    w.rt.ct_tcp_liberal = 0;
    // Every packet looks conntrack up: the flags change under one cached flow.
    w.rt.ct_revalidate_ms = 0;
    w.conntrack = vec![TCP_EST.into()];
    let l = lab.program(&w).expect("load");
    let p = t4(ACK);
    let liberal = |dirs| {
        conntrack::set_tcp_liberal(v4("192.0.2.10"), v4("203.0.113.20"), 1000, 80, dirs).expect("ctnetlink update")
    };
    forwards(l, &w, &f4(&p), &out4(&p));
    for dirs in [[false, true], [true, false], [false, false]] {
        liberal(dirs);
        punts(l, &w, &f4(&p), FP_R_CT_NOT_ESTABLISHED);
    }
    // nf_conntrack_tcp_be_liberal=1 speaks for every entry.
    w.rt.ct_tcp_liberal = 1;
    set_rt(l, &w);
    forwards(l, &w, &f4(&p), &out4(&p));
    // Back to a strict netns: what the daemon's update does makes it fast again.
    w.rt.ct_tcp_liberal = 0;
    set_rt(l, &w);
    punts(l, &w, &f4(&p), FP_R_CT_NOT_ESTABLISHED);
    liberal([true, true]);
    forwards(l, &w, &f4(&p), &out4(&p));
}

/// A strict, marked TCP entry asks the daemon to make it liberal (ring
/// fp_ct_liberal_req), but only once the data path has met it strict for
/// 10 ms, then at most once per ct_revalidate_ms (a lost request is asked
/// again): connections shorter than that never cost a ctnetlink update.
/// The request is the entry's original tuple as a struct fp_flow_key.
#[test]
fn strict_tcp_entry_asks_for_liberal_after_a_while() {
    let Some((mut lab, mut w)) = shared_lab("strict_tcp_entry_asks_for_liberal_after_a_while") else { return };
    w.rt.ct_tcp_liberal = 0;
    w.rt.ct_revalidate_ms = 400;
    w.conntrack = vec![TCP_EST.into()];
    let l = lab.program(&w).expect("load");
    conntrack::set_tcp_liberal(v4("192.0.2.10"), v4("203.0.113.20"), 1000, 80, [false, false]).expect("ctnetlink update");
    let ring = RingRecords::open(&l.skel.maps.fp_ct_liberal_req);
    let asked = || ring.take();
    let p = t4(ACK | PSH);

    // Met strict now: remembered, not asked (a short connection ends here).
    punts(l, &w, &f4(&p), FP_R_CT_NOT_ESTABLISHED);
    punts(l, &w, &f4(&p), FP_R_CT_NOT_ESTABLISHED);
    assert_eq!(asked().len(), 0, "asked before the connection lived 10 ms");
    std::thread::sleep(Duration::from_millis(30));
    punts(l, &w, &f4(&p), FP_R_CT_NOT_ESTABLISHED);
    punts(l, &w, &f4(&p), FP_R_CT_NOT_ESTABLISHED);
    let reqs = asked();
    assert_eq!(reqs.len(), 1, "one request per revalidation interval");
    let mut want = fp_flow_key { family: 2, proto: TCP, sport: 1000u16.to_be(), dport: 80u16.to_be(), ..Default::default() };
    want.saddr[..4].copy_from_slice(&v4("192.0.2.10"));
    want.daddr[..4].copy_from_slice(&v4("203.0.113.20"));
    // SAFETY: fp_flow_key is plain old data (bindgen, no padding holes read).
    let want_bytes = unsafe {
        std::slice::from_raw_parts((&want as *const fp_flow_key).cast::<u8>(), std::mem::size_of::<fp_flow_key>())
    };
    assert_eq!(&reqs[0][..], want_bytes);
    // Not made liberal (the request was lost): asked again after the interval.
    std::thread::sleep(Duration::from_millis(450));
    punts(l, &w, &f4(&p), FP_R_CT_NOT_ESTABLISHED);
    assert_eq!(asked().len(), 1, "asked again once the interval passed");
    // What the daemon's update does: fast from then on, nothing more asked.
    conntrack::set_tcp_liberal(v4("192.0.2.10"), v4("203.0.113.20"), 1000, 80, [true, true]).expect("ctnetlink update");
    forwards(l, &w, &f4(&p), &out4(&p));
    assert_eq!(asked().len(), 0);
}

/// Without an event, a verdict older than ct_revalidate_ms is re-checked.
#[test]
fn cached_verdict_rechecked_after_revalidate_interval() {
    let Some((mut lab, mut w)) = shared_lab("cached_verdict_rechecked_after_revalidate_interval") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 300;
    w.conntrack = vec![TCP_EST.into()];
    let l = lab.program(&w).expect("load");
    let p = t4(ACK);
    forwards(l, &w, &f4(&p), &out4(&p));
    conntrack::delete(TCP_FILTER).expect("conntrack -D");
    forwards(l, &w, &f4(&p), &out4(&p));
    std::thread::sleep(Duration::from_millis(400));
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
}

/// The interval as the express path judges it. The coarse clock moves once
/// a jiffy, and the first packet of a jiffy takes the general path (the
/// watchdog's memo), which judges its own flow's verdict against the fresh
/// clock; a second flow's packet right behind it, in the same jiffy, is
/// the express path's to judge against the memo. Its verdict, older than
/// the interval (2 ms), must be looked up again, which finds it deleted.
#[test]
fn a_verdict_past_the_interval_is_rechecked_right_behind_another_flow() {
    let Some((mut lab, mut w)) = shared_lab("a_verdict_past_the_interval_is_rechecked_right_behind_another_flow")
    else {
        return;
    };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 2;
    w.conntrack = vec![TCP_EST.into(), UDP_EST.into(), TCP6_EST.into(), UDP6_EST.into()];
    let l = lab.program(&w).expect("load");
    let (a4, b4, a6, b6) = (t4(ACK), u4(), t6(ACK), u6());
    // name, TCP frame and its output, UDP frame and its output, filter, entry
    type Case<'a> = (&'a str, Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>, &'a str, &'a str);
    let cases: [Case; 2] = [
        ("ipv4", f4(&a4), out4(&a4), f4(&b4), out4(&b4), UDP_FILTER, UDP_EST),
        ("ipv6", f6(&a6), out6(&a6), f6(&b6), out6(&b6), UDP6_FILTER, UDP6_EST),
    ];
    for (name, a, a_out, b, b_out, b_filter, b_entry) in &cases {
        forwards(l, &w, a, a_out);
        forwards(l, &w, b, b_out);
        forwards(l, &w, b, b_out);
        conntrack::delete(b_filter).expect("conntrack -D");
        std::thread::sleep(Duration::from_millis(10));
        forwards(l, &w, a, a_out);
        let (verdict, _) = l.run(w.a, b).expect("run");
        assert_eq!(verdict, XDP_PASS, "{name}: a verdict older than the interval was trusted");
        punts(l, &w, b, FP_R_CT_NEW);
        conntrack::insert(b_entry).expect("conntrack -I");
    }
}

/// ct_revalidate_ms 0: every packet is checked, even within one tick of
/// the coarse clock.
#[test]
fn revalidate_zero_looks_up_every_packet() {
    let Some((mut lab, mut w)) = shared_lab("revalidate_zero_looks_up_every_packet") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 0;
    w.conntrack = vec![TCP_EST.into()];
    let l = lab.program(&w).expect("load");
    let p = t4(ACK);
    forwards(l, &w, &f4(&p), &out4(&p));
    forwards(l, &w, &f4(&p), &out4(&p));
    conntrack::delete(TCP_FILTER).expect("conntrack -D");
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    assert!(hits(l) >= 2);
}

/// With the flow cache off (--flow-timeout 0) stateful mode stays correct:
/// every packet looks conntrack up.
#[test]
fn no_flow_cache_looks_up_every_packet() {
    let Some((mut lab, mut w)) = shared_lab("no_flow_cache_looks_up_every_packet") else { return };
    w.rt.flow_timeout = 0;
    w.rt.ct_revalidate_ms = 600_000;
    w.conntrack = vec![TCP_EST.into()];
    let l = lab.program(&w).expect("load");
    let p = t4(ACK);
    forwards(l, &w, &f4(&p), &out4(&p));
    forwards(l, &w, &f4(&p), &out4(&p));
    conntrack::delete(TCP_FILTER).expect("conntrack -D");
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    assert_eq!(l.stats(SLOT_A).expect("stats").flow, [0; FP_FC__COUNT as usize]);
}

/// SYN/FIN/RST punt on every packet, also when the flow is cached; the
/// segments behind a FIN or RST punt too (the kernel may not have processed
/// it yet, so conntrack still says ESTABLISHED) until the daemon next bumps the
/// generation (on any revocation), when a lookup decides again. A SYN only
/// drops the cached verdict: the next segment is looked up at once.
#[test]
fn tcp_flags_punt_on_cache_hits() {
    let Some((mut lab, mut w)) = shared_lab("tcp_flags_punt_on_cache_hits") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 600_000;
    w.conntrack = vec![TCP_EST.into()];
    let l = lab.program(&w).expect("load");
    let data = t4(ACK);
    forwards(l, &w, &f4(&data), &out4(&data));
    for f in [FIN | ACK, RST] {
        punts(l, &w, &f4(&t4(f)), FP_R_CT_TCP_FLAGS);
        punts(l, &w, &f4(&data), FP_R_CT_NOT_ESTABLISHED);
        // The entry in this netns never sees the FIN: after the bump the
        // lookup finds it ESTABLISHED again.
        w.rt.ct_generation += 1;
        set_rt(l, &w);
        forwards(l, &w, &f4(&data), &out4(&data));
    }
    // A FIN's hold, then a SYN on the same ports (a new connection): no
    // bump needed, the next segment is looked up (without the entry it
    // would not go fast on the old verdict) and goes fast.
    punts(l, &w, &f4(&t4(FIN | ACK)), FP_R_CT_TCP_FLAGS);
    for f in [SYN, SYN | ACK] {
        punts(l, &w, &f4(&t4(f)), FP_R_CT_TCP_FLAGS);
        conntrack::delete(TCP_FILTER).expect("conntrack -D");
        punts(l, &w, &f4(&data), FP_R_CT_NEW);
        conntrack::insert(TCP_EST).expect("conntrack -I");
        forwards(l, &w, &f4(&data), &out4(&data));
    }
    assert!(hits(l) >= 9, "the flagged packets did not take the cache path");
}

/// A flow whose route and verdict are both cached (the express path's
/// case, express.h) still gets every check the general path makes: each
/// variant below punts for the general path's reason, and the flow hits
/// and forwards again after it. Headers exactly as long as conntrack needs
/// forward.
#[test]
fn a_cached_verdict_still_gets_every_check() {
    let Some((mut lab, mut w)) = shared_lab("a_cached_verdict_still_gets_every_check") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 600_000;
    w.conntrack = vec![TCP_EST.into(), UDP_EST.into()];
    let l = lab.program(&w).expect("load");
    let hit = |p: &Ip4| {
        let before = hits(l);
        forwards(l, &w, &f4(p), &out4(p));
        assert_eq!(hits(l), before + 1, "the flow no longer hits");
    };
    let data = t4(ACK);
    let udp = u4();
    forwards(l, &w, &f4(&data), &out4(&data));
    forwards(l, &w, &f4(&udp), &out4(&udp));
    hit(&data);
    hit(&udp);

    let mut bare_tcp = t4(ACK);
    bare_tcp.payload.truncate(20);
    let mut bare_udp = u4();
    bare_udp.payload.truncate(8);
    bare_udp.payload[4..6].copy_from_slice(&8u16.to_be_bytes());
    hit(&bare_tcp);
    hit(&bare_udp);

    let mut short_tcp = t4(ACK);
    short_tcp.payload.truncate(19);
    let mut short_udp = u4();
    short_udp.payload.truncate(7);
    let mut ttl1 = t4(ACK);
    ttl1.ttl = 1;
    let variants: Vec<(&str, Vec<u8>, fp_reason, &Ip4)> = vec![
        ("tcp header cut short", f4(&short_tcp), FP_R_CT_UNSUPPORTED, &data),
        ("udp header cut short", f4(&short_udp), FP_R_CT_UNSUPPORTED, &udp),
        ("TTL 1", f4(&ttl1), FP_R_TTL_EXCEEDED, &data),
        ("bad header checksum", patch(f4(&data), 14 + 10, &[0xde, 0xad]), FP_R_MALFORMED, &data),
        ("another host's MAC", data.frame(MAC_B, MAC_CLIENT), FP_R_L2_OTHER_HOST, &data),
        // Drops the verdict: the next segment is looked up, then cached again.
        ("SYN", f4(&t4(SYN)), FP_R_CT_TCP_FLAGS, &data),
    ];
    for (name, pkt, reason, flow) in &variants {
        punts_case(l, &w, name, pkt, *reason);
        hit(flow);
        hit(flow);
    }
}

/// The same for IPv6 flows, whose verdict is in the way's fp_ct_flows
/// line: every check, and a FIN's hold until the next bump.
#[test]
fn a_cached_ipv6_verdict_still_gets_every_check() {
    let Some((mut lab, mut w)) = shared_lab("a_cached_ipv6_verdict_still_gets_every_check") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 600_000;
    w.conntrack = vec![TCP6_EST.into(), UDP6_EST.into()];
    let l = lab.program(&w).expect("load");
    let hit = |p: &Ip6| {
        let before = hits(l);
        forwards(l, &w, &f6(p), &out6(p));
        assert_eq!(hits(l), before + 1, "the flow no longer hits");
    };
    let data = t6(ACK);
    let udp = u6();
    forwards(l, &w, &f6(&data), &out6(&data));
    forwards(l, &w, &f6(&udp), &out6(&udp));
    hit(&data);
    hit(&udp);

    let mut bare_tcp = t6(ACK);
    bare_tcp.payload.truncate(20);
    let mut bare_udp = u6();
    bare_udp.payload.truncate(8);
    bare_udp.payload[4..6].copy_from_slice(&8u16.to_be_bytes());
    hit(&bare_tcp);
    hit(&bare_udp);

    let mut short_tcp = t6(ACK);
    short_tcp.payload.truncate(19);
    let mut short_udp = u6();
    short_udp.payload.truncate(7);
    let mut hop1 = t6(ACK);
    hop1.hop = 1;
    let variants: Vec<(&str, Vec<u8>, fp_reason, &Ip6)> = vec![
        ("tcp header cut short", f6(&short_tcp), FP_R_CT_UNSUPPORTED, &data),
        ("udp header cut short", f6(&short_udp), FP_R_CT_UNSUPPORTED, &udp),
        ("hop limit 1", f6(&hop1), FP_R_TTL_EXCEEDED, &data),
        ("another host's MAC", data.frame(MAC_B, MAC_CLIENT), FP_R_L2_OTHER_HOST, &data),
        ("SYN", f6(&t6(SYN)), FP_R_CT_TCP_FLAGS, &data),
    ];
    for (name, pkt, reason, flow) in &variants {
        punts_case(l, &w, name, pkt, *reason);
        hit(flow);
        hit(flow);
    }

    // A FIN holds the verdict: the segments behind it go to the kernel
    // until the next generation bump.
    punts(l, &w, &f6(&t6(FIN | ACK)), FP_R_CT_TCP_FLAGS);
    punts(l, &w, &f6(&data), FP_R_CT_NOT_ESTABLISHED);
    w.rt.ct_generation += 1;
    set_rt(l, &w);
    forwards(l, &w, &f6(&data), &out6(&data));
    let before = hits(l);
    forwards(l, &w, &f6(&data), &out6(&data));
    assert_eq!(hits(l), before + 1, "the flow hits again after the bump");
}

/// A (re)validation sets the entry's timeout to what the kernel's own
/// refresh would (TCP established; UDP stream for an assured, older entry);
/// cached hits in between leave it alone.
#[test]
fn validation_refreshes_the_conntrack_timeout() {
    let Some((mut lab, mut w)) = shared_lab("validation_refreshes_the_conntrack_timeout") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 600_000;
    w.conntrack = vec![TCP_EST.into(), UDP_EST.into()];
    let l = lab.program(&w).expect("load");
    assert!(conntrack::timeout(TCP_FILTER).expect("timeout") <= 100);
    let p = t4(ACK);
    forwards(l, &w, &f4(&p), &out4(&p));
    let t = conntrack::timeout(TCP_FILTER).expect("timeout");
    assert!((u64::from(TCP_TIMEOUT) - 2..=u64::from(TCP_TIMEOUT)).contains(&t), "tcp timeout {t}");

    // Entries made through ctnetlink have no stream_ts: "older than two seconds".
    let u = u4();
    forwards(l, &w, &f4(&u), &out4(&u));
    let t = conntrack::timeout(UDP_FILTER).expect("timeout");
    assert!((u64::from(UDP_STREAM_TIMEOUT) - 2..=u64::from(UDP_STREAM_TIMEOUT)).contains(&t), "udp timeout {t}");

    // A cache hit with a current verdict does not refresh...
    conntrack::delete(TCP_FILTER).expect("conntrack -D");
    conntrack::insert(TCP_EST).expect("conntrack -I");
    forwards(l, &w, &f4(&p), &out4(&p));
    assert!(conntrack::timeout(TCP_FILTER).expect("timeout") <= 100);
    // ... the revalidation after an event does.
    w.rt.ct_generation += 1;
    set_rt(l, &w);
    forwards(l, &w, &f4(&p), &out4(&p));
    assert!(conntrack::timeout(TCP_FILTER).expect("timeout") > 100);
}

/// Per-flow counters: packets in fp_flows, IP bytes in fp_ct_flows, same way.
#[test]
fn per_flow_packets_and_bytes() {
    let Some((_lab, mut w)) = lab("per_flow_packets_and_bytes") else { return };
    w.rt.flow_timeout = 30;
    w.conntrack = vec![TCP_EST.into(), UDP_EST.into(), TCP6_EST.into(), UDP6_EST.into()];
    let l = Loaded::new(&w).expect("load");
    let p = t4(ACK);
    let u = u4();
    let (p6, u6) = (t6(ACK), u6());
    for _ in 0..3 {
        forwards(&l, &w, &f4(&p), &out4(&p));
        forwards(&l, &w, &f6(&p6), &out6(&p6));
    }
    forwards(&l, &w, &f4(&u), &out4(&u));
    for _ in 0..2 {
        forwards(&l, &w, &f6(&u6), &out6(&u6));
    }
    // Punted packets are the kernel's to count.
    punts(&l, &w, &f4(&t4(FIN)), FP_R_CT_TCP_FLAGS);

    let mut got = Vec::new();
    // Every CPU's slice: the runs may have moved between CPUs.
    for idx in 0..l.skel.maps.fp_flows.max_entries() {
        let key = idx.to_ne_bytes();
        let f = l.skel.maps.fp_flows.lookup(&key, MapFlags::ANY).expect("fp_flows").expect("set");
        let c = l.skel.maps.fp_ct_flows.lookup(&key, MapFlags::ANY).expect("fp_ct_flows").expect("set");
        let f: fp_flow_set = from_raw(&f);
        let c: fp_ct_set = from_raw(&c);
        for i in 0..FP_FLOW_WAYS as usize {
            let way = fastpath_bpf::flow_way(&f, i);
            if way.generation != 0 {
                got.push((way.key.proto, way.packets, fastpath_bpf::flow_ct(&way, &c, i).bytes));
            }
        }
    }
    got.sort();
    let tcp_len = p.bytes().len() as u64;
    let udp_len = u.bytes().len() as u64;
    let (tcp6_len, udp6_len) = (p6.bytes().len() as u64, u6.bytes().len() as u64);
    assert_eq!(
        got,
        vec![(TCP, 3, 3 * tcp_len), (TCP, 3, 3 * tcp6_len), (UDP, 1, udp_len), (UDP, 2, 2 * udp6_len)]
    );
}

/// The reasons of stateful mode; prog_run.rs's completeness check leaves them here.
const STATEFUL_REASONS: &[fp_reason] =
    &[FP_R_CT_NEW, FP_R_CT_NOT_ESTABLISHED, FP_R_CT_UNMARKED, FP_R_CT_TCP_FLAGS, FP_R_CT_UNSUPPORTED, FP_R_CT_NAT];

/// The data path's side of ICMP echo, which the conntrack kfuncs cannot look
/// up: it goes by the daemon's copy of the entry (fp_ct_icmp), trusted for
/// ct_revalidate_ms after the daemon read it. No copy or an old one: punted
/// as new and asked for on fp_ct_icmp_req (the packet's own key); a copy
/// that says why the entry is slow punts for that reason; a current
/// forwarding copy forwards. Every look at a current copy records the
/// packet's time in `used` (what the daemon keeps reading the entry and
/// refreshes conntrack's timeout by). The verdict is cached per
/// echo id like any other and dropped by a generation bump.
#[test]
fn icmp_echo_goes_by_the_daemons_copy() {
    let Some((mut lab, mut w)) = shared_lab("icmp_echo_goes_by_the_daemons_copy") else { return };
    w.rt.flow_timeout = 30;
    w.rt.ct_revalidate_ms = 400;
    let l = lab.program(&w).expect("load");
    let ring = RingRecords::open(&l.skel.maps.fp_ct_icmp_req);
    let asked = || ring.take();
    let (c4, s4) = (v4("192.0.2.10"), v4("203.0.113.20"));
    let (c6, s6) = (v6("2001:db8:a::10"), v6("2001:db8:2::20"));
    let p = echo4(8, 0, 0x1234);
    let k = echo_key(2, ICMP, (&c4, &s4), 8, 0x1234);
    let p6 = echo6(128, 0x1234);
    let k6 = echo_key(10, ICMPV6, (&c6, &s6), 128, 0x1234);
    let none = fp_nat::default();

    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    assert_eq!(asked(), vec![raw(&k).to_vec()], "the daemon is asked for the packet's own tuple");
    put_copy(l, &k, FP_R_FORWARDED, none, 0);
    let before = now_coarse_ns();
    forwards(l, &w, &f4(&p), &out4(&p));
    assert!(copy_of(l, &k).expect("copy").used >= before - 10_000_000, "used not recorded");
    forwards(l, &w, &f4(&p), &out4(&p));
    assert!(asked().is_empty());

    // Another echo id is another entry.
    let other = echo4(8, 0, 0x1235);
    punts(l, &w, &f4(&other), FP_R_CT_NEW);
    assert_eq!(asked(), vec![raw(&echo_key(2, ICMP, (&c4, &s4), 8, 0x1235)).to_vec()]);

    // The daemon rewrote the copy after an event (unmarked) and bumped.
    put_copy(l, &k, FP_R_CT_UNMARKED, none, 0);
    forwards(l, &w, &f4(&p), &out4(&p));
    w.rt.ct_generation += 1;
    set_rt(l, &w);
    let before = now_coarse_ns();
    punts(l, &w, &f4(&p), FP_R_CT_UNMARKED);
    assert!(asked().is_empty(), "a current copy is not asked for again");
    // Looked at, if not forwarded on: the daemon reads such entries again.
    assert!(copy_of(l, &k).expect("copy").used >= before - 10_000_000, "a look not recorded");

    // A copy older than the interval is not trusted, cached or not.
    put_copy(l, &k, FP_R_FORWARDED, none, 0);
    w.rt.ct_generation += 1;
    set_rt(l, &w);
    forwards(l, &w, &f4(&p), &out4(&p));
    std::thread::sleep(Duration::from_millis(450));
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    assert_eq!(asked().len(), 1, "an old copy is asked for again");
    put_copy(l, &k, FP_R_FORWARDED, none, 500);
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    assert_eq!(asked().len(), 1);

    // IPv6 alike.
    punts(l, &w, &f6(&p6), FP_R_CT_NEW);
    assert_eq!(asked(), vec![raw(&k6).to_vec()]);
    put_copy(l, &k6, FP_R_FORWARDED, none, 0);
    forwards(l, &w, &f6(&p6), &out6(&p6));
    forwards(l, &w, &f6(&p6), &out6(&p6));

    // ct_revalidate_ms 0: nothing is current, nothing asked for.
    w.rt.ct_revalidate_ms = 0;
    set_rt(l, &w);
    put_copy(l, &k, FP_R_FORWARDED, none, 0);
    punts(l, &w, &f4(&p), FP_R_CT_NEW);
    assert!(asked().is_empty());
}
