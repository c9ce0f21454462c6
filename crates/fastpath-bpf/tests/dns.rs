//! The XDP DNS responders (`bpf/bench/dns_nxdomain.bpf.c`,
//! `bpf/bench/dns_map.bpf.c`, rules in `bpf/lib/dns.h`) by BPF_PROG_RUN:
//! exact answer bytes for IPv4 and IPv6, built here from scratch (checksums
//! included), the malformed-query table (FORMERR / NOTIMP / drop / pass),
//! case-insensitive map lookups, NODATA vs NXDOMAIN, and the outcome
//! counters.
//!
//! Needs root; skips without it unless CI=true.
//!
//!   cargo test --release -p fastpath-bpf --test dns

#[allow(dead_code)] // each test binary uses its own part of the support code
mod support;

use std::mem::MaybeUninit;

use fastpath_bpf::intf::{fp_dns_answer, fp_dns_key, FP_DNS_C_ANSWER, FP_DNS_C_DROP, FP_DNS_C_FORMERR,
    FP_DNS_C_NODATA, FP_DNS_C_NOTIMP, FP_DNS_C_NXDOMAIN, FP_DNS_C_PASS, FP_DNS_C_REFUSED, FP_DNS_C__COUNT,
    FP_DNS_KEY_NAME};
use fastpath_bpf::skel::dns_map::DnsMapSkelBuilder;
use fastpath_bpf::skel::dns_nxdomain::DnsNxdomainSkelBuilder;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, ProgramInput};

use support::netns::require_root;
use support::packet::{csum, eth, v4, v6, Ip4, Ip6, Mac, ETH_P_IP};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

const CLIENT_MAC: Mac = [0x02, 0, 0, 0, 0, 0x01];
const SERVER_MAC: Mac = [0x02, 0, 0, 0, 0, 0x02];
const CPORT: u16 = 40000;


fn wire_name(name: &str) -> Vec<u8> {
    let mut v = Vec::new();
    for l in name.trim_end_matches('.').split('.').filter(|l| !l.is_empty()) {
        v.push(l.len() as u8);
        v.extend_from_slice(l.as_bytes());
    }
    v.push(0);
    v
}

/// A DNS message: header fields as given, then `body` (question and more).
fn msg(id: u16, flags: u16, counts: [u16; 4], body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&flags.to_be_bytes());
    for c in counts {
        m.extend_from_slice(&c.to_be_bytes());
    }
    m.extend_from_slice(body);
    m
}

fn question(name: &str, qtype: u16, qclass: u16) -> Vec<u8> {
    let mut q = wire_name(name);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&qclass.to_be_bytes());
    q
}

/// A standard query (RD set) for name/qtype, class IN.
fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    msg(id, 0x0100, [1, 0, 0, 0], &question(name, qtype, 1))
}

/// EDNS OPT record as dig sends it (UDP size 1232, one cookie-sized option).
fn opt_rr() -> Vec<u8> {
    let mut o = vec![0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 12];
    o.extend_from_slice(&[0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
    o
}

enum Fam {
    V4,
    V6,
}

fn udp(sport: u16, dport: u16, payload: &[u8], pseudo: &[u8]) -> Vec<u8> {
    let len = 8 + payload.len();
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&(len as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    let mut all = pseudo.to_vec();
    all.extend_from_slice(&(len as u32).to_be_bytes());
    all.extend_from_slice(&[0, 0, 0, 17]);
    all.extend_from_slice(&u);
    let c = match csum(&all) {
        0 => 0xffff,
        c => c,
    };
    u[6..8].copy_from_slice(&c.to_be_bytes());
    u
}

const C4: &str = "192.0.2.2";
const S4: &str = "192.0.2.1";
const C6: &str = "2001:db8::2";
const S6: &str = "2001:db8::1";

/// A frame carrying `dns` in UDP from `sport` to `dport`, with a valid checksum.
fn frame(fam: &Fam, from_client: bool, sport: u16, dport: u16, dns: &[u8], ttl: u8) -> Vec<u8> {
    let (macd, macs) = if from_client { (SERVER_MAC, CLIENT_MAC) } else { (CLIENT_MAC, SERVER_MAC) };
    match fam {
        Fam::V4 => {
            let (s, d) = if from_client { (v4(C4), v4(S4)) } else { (v4(S4), v4(C4)) };
            let mut ip = Ip4::new(s, d);
            ip.ttl = ttl;
            ip.payload = udp(sport, dport, dns, &[s, d].concat());
            ip.frame(macd, macs)
        }
        Fam::V6 => {
            let (s, d) = if from_client { (v6(C6), v6(S6)) } else { (v6(S6), v6(C6)) };
            let mut ip = Ip6::new(s, d);
            ip.hop = ttl;
            ip.payload = udp(sport, dport, dns, &[s, d].concat());
            ip.frame(macd, macs)
        }
    }
}

fn q_frame(fam: &Fam, dns: &[u8]) -> Vec<u8> {
    frame(fam, true, CPORT, 53, dns, 57)
}

fn a_frame(fam: &Fam, dns: &[u8]) -> Vec<u8> {
    frame(fam, false, 53, CPORT, dns, 64)
}

/// The answer header for a query's id and RD bit.
fn ans_hdr(id: u16, rcode: u16, qd: u16, an: u16) -> Vec<u8> {
    msg(id, 0x8000 | 0x0100 | 0x0080 | rcode, [qd, an, 0, 0], &[])
}

fn run(prog: &libbpf_rs::ProgramMut, pkt: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; 4096];
    let res = prog
        .test_run(ProgramInput { data_in: Some(pkt), data_out: Some(&mut out), ..Default::default() })
        .expect("BPF_PROG_RUN");
    let (ret, n) = (res.return_value, res.data.map(|d| d.len()).expect("data out"));
    out.truncate(n);
    (ret, out)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
}

fn counters(map: &libbpf_rs::Map) -> Vec<u64> {
    (0..FP_DNS_C__COUNT)
        .map(|i| {
            map.lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)
                .expect("dns_stats")
                .expect("slot")
                .iter()
                .map(|v| u64::from_ne_bytes(v[..8].try_into().expect("u64")))
                .sum()
        })
        .collect()
}

/// (name, input frame, verdict, expected output: None = input unchanged)
type Case = (&'static str, Vec<u8>, u32, Option<Vec<u8>>);

/// Malformed or foreign input, the same for both responders.
fn malformed_cases(fam: Fam) -> Vec<Case> {
    let id = 0x4242;
    let good_q = question("example.com", 1, 1);
    let formerr = a_frame(&fam, &ans_hdr(id, 1, 0, 0));
    let mut long_name = String::new();
    for _ in 0..5 {
        long_name.push_str(&"a".repeat(60));
        long_name.push('.');
    }
    let mut label64 = wire_name("x.example");
    label64.splice(0..2, std::iter::once(64).chain(std::iter::repeat_n(b'y', 64)));
    label64.extend_from_slice(&[0, 1, 0, 1]);
    let mut ptr = vec![3, b'w', b'w', b'w', 0xc0, 12];
    ptr.extend_from_slice(&[0, 1, 0, 1]);
    let mut trailing = good_q.clone();
    trailing.extend_from_slice(&[0xde, 0xad]);
    let mut bad_opt = good_q.clone();
    let mut o = opt_rr();
    o[10] += 1; // RDLENGTH one more than what follows
    bad_opt.extend_from_slice(&o);
    let mut other_port = q_frame(&fam, &query(id, "example.com", 1));
    let l4 = match fam {
        Fam::V4 => 34,
        Fam::V6 => 54,
    };
    other_port[l4 + 2..l4 + 4].copy_from_slice(&54u16.to_be_bytes());
    vec![
        ("truncated header", q_frame(&fam, &[0x42, 0x42, 1, 0, 0]), XDP_DROP, None),
        ("QR set", q_frame(&fam, &msg(id, 0x8100, [1, 0, 0, 0], &good_q)), XDP_DROP, None),
        ("source port 0", frame(&fam, true, 0, 53, &query(id, "example.com", 1), 57), XDP_DROP, None),
        (
            "opcode STATUS",
            q_frame(&fam, &msg(id, 0x1100, [1, 0, 0, 0], &good_q)),
            XDP_TX,
            Some(a_frame(&fam, &msg(id, 0x8000 | 0x1000 | 0x0100 | 0x0080 | 4, [0; 4], &[]))),
        ),
        ("qdcount 2", q_frame(&fam, &msg(id, 0x0100, [2, 0, 0, 0], &[good_q.clone(), good_q.clone()].concat())), XDP_TX, Some(formerr.clone())),
        ("qdcount 0", q_frame(&fam, &msg(id, 0x0100, [0, 0, 0, 0], &[])), XDP_TX, Some(formerr.clone())),
        ("ancount 1", q_frame(&fam, &msg(id, 0x0100, [1, 1, 0, 0], &good_q)), XDP_TX, Some(formerr.clone())),
        ("label > 63", q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 0], &label64)), XDP_TX, Some(formerr.clone())),
        ("name > 255", q_frame(&fam, &query(id, &long_name, 1)), XDP_TX, Some(formerr.clone())),
        ("compression pointer", q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 0], &ptr)), XDP_TX, Some(formerr.clone())),
        ("question cut short", q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 0], &good_q[..good_q.len() - 2])), XDP_TX, Some(formerr.clone())),
        ("name runs past the end", q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 0], &[7, b'e', b'x'])), XDP_TX, Some(formerr.clone())),
        ("trailing garbage", q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 0], &trailing)), XDP_TX, Some(formerr.clone())),
        ("bad OPT length", q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 1], &bad_opt)), XDP_TX, Some(formerr.clone())),
        ("arcount 2", q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 2], &[good_q.clone(), opt_rr(), opt_rr()].concat())), XDP_TX, Some(formerr)),
        (
            "class CH: REFUSED",
            q_frame(&fam, &msg(id, 0x0100, [1, 0, 0, 0], &question("version.bind", 16, 3))),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(id, 5, 1, 0), question("version.bind", 16, 3)].concat())),
        ),
        ("UDP port 54: the kernel's", other_port, XDP_PASS, None),
    ]
}

fn check_cases(prog: &libbpf_rs::ProgramMut, cases: &[Case]) -> Vec<String> {
    let mut failed = Vec::new();
    for (name, pkt, verdict, want) in cases {
        let (v, out) = run(prog, pkt);
        let want = want.as_ref().unwrap_or(pkt);
        if v != *verdict {
            failed.push(format!("{name}: verdict {v}, want {verdict}"));
        } else if *verdict != XDP_DROP && out != *want {
            failed.push(format!("{name}: bytes differ\n got  {}\n want {}", hex(&out), hex(want)));
        }
    }
    failed
}

#[test]
fn nxdomain_answers_in_place_and_rejects_malformed() {
    if !require_root("nxdomain_answers_in_place_and_rejects_malformed") {
        return;
    }
    let mut obj = MaybeUninit::<OpenObject>::uninit();
    let skel = DnsNxdomainSkelBuilder::default().open(&mut obj).unwrap().load().expect("verifier");
    let prog = &skel.progs.fp_dns_nxdomain;
    let mut cases: Vec<Case> = Vec::new();
    for fam in [Fam::V4, Fam::V6] {
        let q = question("NoSuch.Example.COM", 1, 1);
        cases.push((
            "NXDOMAIN",
            q_frame(&fam, &msg(0xbeef, 0x0100, [1, 0, 0, 0], &q)),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0xbeef, 3, 1, 0), q.clone()].concat())),
        ));
        cases.push((
            "NXDOMAIN, the OPT record dropped",
            q_frame(&fam, &msg(0x0001, 0x0100, [1, 0, 0, 1], &[q.clone(), opt_rr()].concat())),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0x0001, 3, 1, 0), q.clone()].concat())),
        ));
        cases.extend(malformed_cases(fam));
    }
    // RD clear stays clear; Ethernet padding is not part of the answer.
    let q = question("a.example", 28, 1);
    let padded = support::packet::pad_to(q_frame(&Fam::V4, &msg(7, 0, [1, 0, 0, 0], &q)), 60, 0);
    let want = a_frame(&Fam::V4, &[msg(7, 0x8083, [1, 0, 0, 0], &[]), q].concat());
    cases.push(("padded frame, RD clear", padded, XDP_TX, Some(want)));
    let not_ip = eth(SERVER_MAC, CLIENT_MAC, 0x0806);
    cases.push(("ARP", [not_ip, vec![0; 28]].concat(), XDP_PASS, None));
    let failed = check_cases(prog, &cases);
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), cases.len(), failed.join("\n"));

    let c = counters(&skel.maps.dns_stats);
    assert_eq!(c[FP_DNS_C_NXDOMAIN as usize], 5);
    assert_eq!(c[FP_DNS_C_DROP as usize], 6);
    assert_eq!(c[FP_DNS_C_NOTIMP as usize], 2);
    assert_eq!(c[FP_DNS_C_REFUSED as usize], 2);
    assert_eq!(c[FP_DNS_C_FORMERR as usize], 22);
    assert_eq!(c[FP_DNS_C_PASS as usize], 3);
    let _ = ETH_P_IP;
}

fn key(name: &str, qtype: u16) -> fp_dns_key {
    let mut k = fp_dns_key::default();
    let w = wire_name(name);
    assert!(w.len() <= FP_DNS_KEY_NAME as usize);
    k.name[..w.len()].copy_from_slice(&w);
    k.qtype = qtype;
    k
}

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: plain-old-data bindgen structs, read as their bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// One RR in the answer section: name = pointer to the question, TTL 300.
fn rr(rtype: u16, rdata: &[u8]) -> Vec<u8> {
    let mut r = vec![0xc0, 0x0c];
    r.extend_from_slice(&rtype.to_be_bytes());
    r.extend_from_slice(&1u16.to_be_bytes());
    r.extend_from_slice(&300u32.to_be_bytes());
    r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    r.extend_from_slice(rdata);
    r
}

fn answer(rrs: &[Vec<u8>]) -> fp_dns_answer {
    let mut a = fp_dns_answer::default();
    let all = rrs.concat();
    a.rr[..all.len()].copy_from_slice(&all);
    a.len = all.len() as u16;
    a.ancount = rrs.len() as u16;
    a
}

#[test]
fn map_answers_records_nodata_and_nxdomain() {
    if !require_root("map_answers_records_nodata_and_nxdomain") {
        return;
    }
    let mut obj = MaybeUninit::<OpenObject>::uninit();
    let skel = DnsMapSkelBuilder::default().open(&mut obj).unwrap().load().expect("verifier");
    let a_rrs = vec![rr(1, &v4("203.0.113.10")), rr(1, &v4("203.0.113.11"))];
    let aaaa_rrs = vec![rr(28, &v6("2001:db8::10"))];
    let full: Vec<Vec<u8>> = (0..4).map(|i| rr(28, &v6(&format!("2001:db8::{i}")))).collect();
    let records = [
        (key("www.example.com", 1), answer(&a_rrs)),
        (key("www.example.com", 28), answer(&aaaa_rrs)),
        (key("www.example.com", 0), answer(&[])),
        (key("full.example", 28), answer(&full)),
        (key("full.example", 0), answer(&[])),
    ];
    for (k, v) in &records {
        skel.maps.dns_records.update(bytes_of(k), bytes_of(v), MapFlags::ANY).unwrap();
    }
    let prog = &skel.progs.fp_dns_map;
    let mut cases: Vec<Case> = Vec::new();
    for fam in [Fam::V4, Fam::V6] {
        let qa = question("WwW.Example.Com", 1, 1);
        cases.push((
            "A, mixed case",
            q_frame(&fam, &msg(0x1111, 0x0100, [1, 0, 0, 0], &qa)),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0x1111, 0, 1, 2), qa, a_rrs.concat()].concat())),
        ));
        let q6 = question("www.example.com.", 28, 1);
        cases.push((
            "AAAA with OPT",
            q_frame(&fam, &msg(0x2222, 0x0100, [1, 0, 0, 1], &[q6.clone(), opt_rr()].concat())),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0x2222, 0, 1, 1), q6, aaaa_rrs.concat()].concat())),
        ));
        let qf = question("FULL.example", 28, 1);
        cases.push((
            "four AAAA (the largest answer)",
            q_frame(&fam, &query(0x2223, "FULL.example", 28)),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0x2223, 0, 1, 4), qf, full.concat()].concat())),
        ));
        let qmx = question("www.example.com", 15, 1);
        cases.push((
            "MX: NODATA",
            q_frame(&fam, &query(0x3333, "www.example.com", 15)),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0x3333, 0, 1, 0), qmx].concat())),
        ));
        let qn = question("ww.example.com", 1, 1);
        cases.push((
            "NXDOMAIN",
            q_frame(&fam, &query(0x4444, "ww.example.com", 1)),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0x4444, 3, 1, 0), qn].concat())),
        ));
        // Longer than a key can hold: never a record, whatever its prefix.
        let long = format!("www.example.com.{}", "z".repeat(60));
        let ql = question(&long, 1, 1);
        cases.push((
            "name longer than the key",
            q_frame(&fam, &query(0x5555, &long, 1)),
            XDP_TX,
            Some(a_frame(&fam, &[ans_hdr(0x5555, 3, 1, 0), ql].concat())),
        ));
        cases.extend(malformed_cases(fam));
    }
    let failed = check_cases(prog, &cases);
    assert!(failed.is_empty(), "{} of {} cases failed:\n{}", failed.len(), cases.len(), failed.join("\n"));
    let c = counters(&skel.maps.dns_stats);
    assert_eq!(c[FP_DNS_C_ANSWER as usize], 6);
    assert_eq!(c[FP_DNS_C_NODATA as usize], 2);
    assert_eq!(c[FP_DNS_C_NXDOMAIN as usize], 4);
}

/// The bench's query generator writes the whole frame from its template on
/// every run (recycled pages come back holding answers), with query q's ID,
/// name digits (q / 2 in hex) and type (A, AAAA alternating), and trims the
/// spare input byte so the frame has exactly the template's length.
#[test]
fn generator_writes_queries_over_recycled_answers() {
    use fastpath_bpf::skel::dns_gen::DnsGenSkelBuilder;
    if !require_root("generator_writes_queries_over_recycled_answers") {
        return;
    }
    let tmpl = q_frame(&Fam::V4, &query(0, "h000000.dns.example", 1));
    let (id_at, digits_at, qtype_at) = (42, 42 + 12 + 2, 42 + 12 + 21);
    let mut obj = MaybeUninit::<OpenObject>::uninit();
    let mut open = DnsGenSkelBuilder::default().open(&mut obj).unwrap();
    open.progs.fp_dns_pass.set_autoload(false);
    let ro = open.maps.rodata_data.as_deref_mut().unwrap();
    ro.dg_tmpl[..tmpl.len()].copy_from_slice(&tmpl);
    ro.dg_len = tmpl.len() as u32;
    ro.dg_id = id_at as u32;
    ro.dg_digits = digits_at as u32;
    ro.dg_qtype = qtype_at as u32;
    ro.dg_queries = 0x2a * 2 + 2;
    let skel = open.load().expect("verifier");
    // Input: an answer left in the page, longer than the query, plus garbage.
    let mut dirty = vec![0xee; tmpl.len() + 40];
    dirty[..10].fill(0x11);
    let mut seen = Vec::new();
    for q in 0..0x2a * 2 + 3u32 {
        let (v, out) = run(&skel.progs.fp_dns_gen, &dirty);
        assert_eq!(v, XDP_TX);
        assert_eq!(out.len(), tmpl.len(), "query {q}: length");
        let q = q % (0x2a * 2 + 2);
        let mut want = tmpl.clone();
        want[id_at..id_at + 2].copy_from_slice(&(q as u16).to_be_bytes());
        want[digits_at..digits_at + 6].copy_from_slice(format!("{:06x}", q / 2).as_bytes());
        want[qtype_at + 1] = if q % 2 == 1 { 28 } else { 1 };
        assert_eq!(out, want, "query {q}");
        seen.push(q);
    }
    assert_eq!(seen.last(), Some(&0), "wraps after dg_queries");
}
