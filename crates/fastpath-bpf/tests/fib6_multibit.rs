//! The IPv6 multibit index (`--fib6-index multibit`) against the trie, in
//! the program: random tables of nested routes of every length, and for
//! addresses at and around each route, one packet through the program with
//! the index and the same through the program without. Both must give the
//! same verdict, bytes and counter, and that the longest matching route's.
//!
//! dir6's own tests check its walk in Rust; these check the data path's
//! walk (fib.h) and the key and word layout between the two, which no Rust
//! test sees. Each table goes in twice: painted whole, every /16 written
//! (what the prog_run cases see), and route by route with changes under
//! the live index, as the daemon writes it (replaced versions rest in
//! fp_fib6_dir beside the current ones, freed value slots are reused).
//!
//! Needs root.
//!
//!   CARGO_TARGET_DIR=/work/tgt-dp cargo test --release -p fastpath-bpf --test fib6_multibit

#[allow(dead_code)] // each test binary uses its own part of the support code
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fastpath_bpf::intf::fp_reason::{self, *};
use fastpath_bpf::intf::*;
use fastpath_core::dir6::{self, table, Dir6};
use libbpf_rs::{MapCore, MapFlags};

use support::netns::{require_root, Lab};
use support::packet::*;
use support::runner::*;
use support::world::*;

const NH_GW10: u32 = 10;
const NH_GW11: u32 = 11;
const MAC_GW10: Mac = [0x02, 0, 0, 0, 0, 0x10];
const MAC_GW11: Mac = [0x02, 0, 0, 0, 0, 0x11];
const GROUP: u32 = 1;

/// Every probe's IPv6 payload length: above the IPv6 minimum MTU, so a
/// route's own MTU can refuse it and values that differ only there differ
/// in what the program does.
const PAYLOAD: usize = 1300;
const IP_LEN: u32 = 40 + PAYLOAD as u32;

use fastpath_core::xorshift::XorShift as Rng;

fn mask(len: u8) -> u128 {
    if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) }
}

/// What the program must do with a probe, by the route it matches.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    /// Forwarded to one of these MACs (two for the ECMP group: the hash picks).
    Out(&'static [Mac]),
    Punt(fp_reason),
}

/// A route value and what it does to a probe. Forwarding values come with
/// several MTUs, so a table has dozens of distinct values and freeing and
/// reusing slots happens.
fn random_value(rng: &mut Rng) -> (fp_route, Want) {
    let forward = |nh_id, mtu| fp_route { type_: fp_route_type::FP_RT_FORWARD as u8, nh_id, mtu, ..Default::default() };
    let mtu = [0, 1300, 1339, 1340, 1400][rng.below(5) as usize] + rng.below(3) as u32;
    let fits = |mac| if mtu == 0 || mtu.max(1280) >= IP_LEN { Want::Out(mac) } else { Want::Punt(FP_R_MTU) };
    match rng.below(11) {
        0 => (forward(NH_GW6, mtu), fits(&[MAC_GW6])),
        1 => (forward(NH_GW10, mtu), fits(&[MAC_GW10])),
        2 => (forward(NH_GW11, mtu), fits(&[MAC_GW11])),
        // On-link: the probes' destinations have no neighbour entry.
        3 => (forward(NH_ONLINK_B, 0), Want::Punt(FP_R_NO_NEIGH)),
        4 => (route(fp_route_type::FP_RT_MULTIPATH, GROUP), Want::Out(&[MAC_GW6, MAC_GW10])),
        5 => (route(fp_route_type::FP_RT_LOCAL, 0), Want::Punt(FP_R_LOCAL)),
        6 => (route(fp_route_type::FP_RT_BLACKHOLE, 0), Want::Punt(FP_R_BLACKHOLE)),
        7 => (route(fp_route_type::FP_RT_UNREACHABLE, 0), Want::Punt(FP_R_UNREACHABLE)),
        8 => (route(fp_route_type::FP_RT_PROHIBIT, 0), Want::Punt(FP_R_PROHIBIT)),
        9 => (punt_route(FP_R_ECMP as u8), Want::Punt(FP_R_ECMP)),
        _ => (punt_route(FP_R_TABLE_FULL as u8), Want::Punt(FP_R_TABLE_FULL)),
    }
}

/// The /16s most routes start in: few, so routes pile up and nest in them.
fn home(rng: &mut Rng) -> u128 {
    (u128::from(0x2001u16 + rng.below(3) as u16) << 112) | (rng.addr() >> 16)
}

/// A prefix length: many of /32 to /64 (the index's levels), some of /16
/// and shorter (the top words), some past /64 (the trie's).
fn random_len(rng: &mut Rng) -> u8 {
    match rng.below(20) {
        // Rarely very short: a table with no route for most addresses
        // asks the index for "none" as often as for a value.
        0..=2 if rng.below(4) == 0 => rng.below(8) as u8,
        0..=2 => 8 + rng.below(9) as u8,
        3..=4 => 17 + rng.below(15) as u8,
        5..=15 => 32 + rng.below(33) as u8,
        _ => 65 + rng.below(64) as u8,
    }
}

/// Failures shown of a run.
const SHOWN: usize = 20;

type Table = BTreeMap<(u128, u8), (fp_route, Want)>;

/// A new prefix: mostly inside (or around) one the table has, so routes
/// nest many deep; else in a home /16, or anywhere when short.
fn random_prefix(rng: &mut Rng, t: &Table) -> (u128, u8) {
    let len = random_len(rng);
    let a = match rng.below(3) {
        0 | 1 if !t.is_empty() => {
            let (p, l) = *t.keys().nth(rng.below(t.len() as u64) as usize).expect("in range");
            p | (rng.addr() & !mask(l.saturating_add(rng.below(9) as u8).min(128)))
        }
        _ if len < 16 => rng.addr(),
        _ => home(rng),
    };
    (a & mask(len), len)
}

fn random_table(rng: &mut Rng, n: usize) -> Table {
    let mut t = Table::new();
    while t.len() < n {
        let p = random_prefix(rng, &t);
        let v = random_value(rng);
        t.insert(p, v);
    }
    t
}

fn lpm6_of(addr: u128, len: u8) -> fp_lpm6_key {
    fp_lpm6_key { prefixlen: u32::from(len), addr: addr.to_be_bytes() }
}

fn route6(v: &fp_route) -> Route6 {
    raw(v).try_into().expect("an fp_route")
}

/// What the program must do with a probe to `dst`: the classes it decides
/// before any lookup, else the longest matching route's.
fn want(t: &Table, dst: u128) -> (Want, Option<(u128, u8)>) {
    if dst <= 1 {
        return (Want::Punt(FP_R_MARTIAN), None);
    }
    if dst >> 120 == 0xFF {
        return (Want::Punt(FP_R_MULTICAST), None);
    }
    if dst >> 118 == 0xFE80 >> 6 {
        return (Want::Punt(FP_R_LINK_LOCAL), None);
    }
    match (0..=128u8).rev().find_map(|l| t.get_key_value(&(dst & mask(l), l))) {
        Some((p, (_, w))) => (*w, Some(*p)),
        None => (Want::Punt(FP_R_NO_ROUTE), None),
    }
}

/// Addresses worth asking for: each route's first and last, one inside,
/// the neighbours just outside, and random ones (in the home /16s and
/// anywhere).
fn probes(rng: &mut Rng, t: &Table) -> Vec<u128> {
    let mut out = Vec::new();
    for &(p, l) in t.keys() {
        let last = p | !mask(l);
        out.extend([p, last, p | (rng.addr() & !mask(l)), p.wrapping_sub(1), last.wrapping_add(1)]);
    }
    for _ in 0..100 {
        out.push(home(rng));
        out.push(rng.addr());
    }
    out
}

fn world(a: u32, b: u32) -> World {
    let mut w = World::new(a, b);
    w.fib6.clear();
    w.nexthops.push((NH_GW10, gw_nh(b, AF_INET6, &v6("2001:db8:b::10"))));
    w.nexthops.push((NH_GW11, gw_nh(b, AF_INET6, &v6("2001:db8:b::11"))));
    w.neigh.push((neigh_key(b, AF_INET6, &v6("2001:db8:b::10")), neigh(MAC_GW10)));
    w.neigh.push((neigh_key(b, AF_INET6, &v6("2001:db8:b::11")), neigh(MAC_GW11)));
    w.set_group(GROUP, 0, &[(i32::MAX / 2, NH_GW6), (i32::MAX, NH_GW10)]);
    w
}

/// The program with the index (`on`) and the one without, each counting
/// what it did.
struct Pair {
    off: Loaded,
    on: Loaded,
    counted: std::cell::RefCell<[Vec<u64>; 2]>,
}

/// One probe's outcome: verdict, output frame, the reason counted.
type Outcome = (u32, Vec<u8>, usize);

impl Pair {
    fn run(&self, w: &World, i: usize, pkt: &[u8]) -> Outcome {
        let l = if i == 0 { &self.off } else { &self.on };
        let (verdict, out) = l.run(w.a, pkt).expect("run");
        let now = l.stats(SLOT_A).expect("stats").packets.to_vec();
        let prev = std::mem::replace(&mut self.counted.borrow_mut()[i], now.clone());
        let grew: Vec<usize> = (0..now.len()).filter(|r| now[*r] != prev[*r]).collect();
        assert_eq!(grew.len(), 1, "one packet, counted under {grew:?}");
        (verdict, out, grew[0])
    }

    /// After both programs' tables were emptied: their counters are too.
    fn zeroed(&self) {
        *self.counted.borrow_mut() = [vec![0; FP_R__COUNT as usize], vec![0; FP_R__COUNT as usize]];
    }
}

fn show(o: &Outcome, pkt: &[u8]) -> String {
    let (verdict, out, reason) = o;
    let bytes = if out == pkt {
        "unchanged".to_owned()
    } else {
        out.iter().take(6).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":") + " ..."
    };
    format!("verdict {verdict} {} ({bytes})", reason_name(*reason))
}

/// fp_fib6_dir read back, a bucket a lookup.
struct MapBuckets<'a>(&'a Loaded);

impl table::Buckets for MapBuckets<'_> {
    fn n_buckets(&self) -> usize {
        DIR6_BUCKETS as usize
    }
    fn slot(&self, bucket: usize, way: usize) -> table::Slot {
        let m = &self.0.skel.maps.fp_fib6_dir;
        let b = m.lookup(&(bucket as u32).to_ne_bytes(), MapFlags::ANY).expect("fp_fib6_dir").expect("a bucket");
        let s: fp_dir6_slot = from_raw(&b[way * size_of::<fp_dir6_slot>()..][..size_of::<fp_dir6_slot>()]);
        table::Slot { hi: s.hi, tag: s.tag, entry: s.entry }
    }
    fn fill(&mut self, _: usize, _: usize, _: table::Slot) {
        unreachable!("read only")
    }
    fn clear(&mut self, _: usize, _: usize) {
        unreachable!("read only")
    }
}

/// The data path's walk for `dst` read back from the maps, for a failure's message.
fn walk_of(l: &Loaded, dst: u128) -> String {
    let m = &l.skel.maps;
    let top = (dst >> 112) as u32;
    let word = m
        .fp_fib6_dir16
        .lookup(&top.to_ne_bytes(), MapFlags::ANY)
        .ok()
        .flatten()
        .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("a u64")));
    let steps = std::cell::RefCell::new(Vec::new());
    let answer = dir6::walk(word, dst, |k| {
        let e = table::get(&MapBuckets(l), k);
        steps.borrow_mut().push(e.map_or(format!("/{} none", k.level), |e| format!("/{} {e:#010x}", k.level)));
        e
    });
    let slot = match answer {
        Some(s) if s != dir6::SLOT_NONE => {
            let v = m.fp_fib6_vals.lookup(&u32::from(s).to_ne_bytes(), MapFlags::ANY).ok().flatten();
            format!("slot {s} = {:?}", v.map(|b| from_raw::<fp_route>(&b)))
        }
        Some(_) => "no route".to_owned(),
        None => "trie".to_owned(),
    };
    format!("top {top:#06x} word {word:#018x}, {} -> {slot}", steps.into_inner().join(", "))
}

/// Every probe through both programs; failures as messages.
fn check(pair: &Pair, w: &World, t: &Table, probes: &[u128], what: &str, failed: &mut Vec<String>) {
    let src = v6("2001:db8:a::10");
    for &dst in probes {
        let p = Ip6 { payload: udp(PAYLOAD - 8), ..Ip6::new(src, dst.to_be_bytes()) };
        let pkt = p.frame(MAC_A, MAC_CLIENT);
        let off = pair.run(w, 0, &pkt);
        let on = pair.run(w, 1, &pkt);
        let (want, by) = want(t, dst);
        let fits = |o: &Outcome| match want {
            Want::Punt(r) => o.0 == XDP_PASS && o.1 == pkt && o.2 == r as usize,
            Want::Out(macs) => {
                let mut q = p.clone();
                q.hop -= 1;
                o.0 == XDP_REDIRECT && o.2 == FP_R_FORWARDED as usize && macs.iter().any(|m| o.1 == q.frame(*m, MAC_B))
            }
        };
        if on != off || !fits(&off) {
            let by = by.map_or("no route".to_owned(), |(a, l)| format!("{}/{l}", std::net::Ipv6Addr::from(a)));
            // Only the failures shown: a walk read back costs a hundred lookups.
            let walk = if failed.len() < SHOWN { walk_of(&pair.on, dst) } else { String::new() };
            failed.push(format!(
                "{what}: {} (route {by}, want {want:?}):\n  trie  {}\n  index {}\n  walk  {walk}",
                std::net::Ipv6Addr::from(dst),
                show(&off, &pkt),
                show(&on, &pkt),
            ));
        }
    }
}

/// Writes a route into both programs' fp_fib6 (None: deletes it).
fn trie_set(pair: &Pair, (a, l): (u128, u8), v: Option<&fp_route>) {
    for loaded in [&pair.off, &pair.on] {
        let m = &loaded.skel.maps.fp_fib6;
        let k = lpm6_of(a, l);
        match v {
            Some(v) => m.update(raw(&k), raw(v), MapFlags::ANY).expect("fp_fib6 update"),
            None => m.delete(raw(&k)).expect("fp_fib6 delete"),
        }
    }
}

/// Every /16 and value found room: what the trie answers for a /16 left
/// to it would not test the index.
fn fitted(d: &Dir6<Route6>, what: &str, failed: &mut Vec<String>) {
    let u = d.usage();
    if u.trie_tops != 0 || u.unslotted != 0 {
        failed.push(format!("{what}: the index did not hold everything: {u:?}"));
    }
}

#[test]
fn multibit_answers_as_the_trie() {
    if !require_root("multibit_answers_as_the_trie") {
        return;
    }
    let lab = Lab::new().expect("private netns with a veth pair");
    let base = world(lab.a, lab.b);
    let pair = Pair {
        off: Loaded::new(&base).expect("load without the index"),
        on: Loaded::new(&World { fib6_dir: true, ..base.clone() }).expect("load with the index"),
        counted: Default::default(),
    };
    let mut rng = Rng(0x6a09_e667_f3bc_c908);
    let mut failed = Vec::new();
    let mut probed = 0;
    for round in 0..3 {
        // Painted whole, all 65536 words.
        let mut t = random_table(&mut rng, 300);
        let w = World { fib6: t.iter().map(|((a, l), (v, _))| (lpm6_of(*a, *l), *v)).collect(), ..base.clone() };
        pair.off.reset().expect("reset");
        w.apply(&pair.off.skel).expect("apply");
        pair.on.reset().expect("reset");
        World { fib6_dir: true, ..w.clone() }.apply(&pair.on.skel).expect("apply with the index");
        pair.zeroed();
        let ps = probes(&mut rng, &t);
        probed += ps.len();
        check(&pair, &w, &t, &ps, &format!("round {round}, painted"), &mut failed);

        // Route by route as the daemon writes them: the trie first, the
        // index at the next flush. The clock is dir6's only: each flush a
        // second apart, and what was retired or freed comes back after two.
        pair.off.reset().expect("reset");
        base.apply(&pair.off.skel).expect("apply");
        pair.on.reset().expect("reset");
        base.apply(&pair.on.skel).expect("apply");
        pair.zeroed();
        let mut d = Dir6::new(Duration::from_millis(1500));
        let mut sink = Dir6Maps::new(&pair.on.skel);
        let mut now = Instant::now();
        let routes: Vec<_> = t.iter().map(|(k, v)| (*k, *v)).collect();
        for chunk in routes.chunks(60) {
            for ((a, l), (v, _)) in chunk {
                trie_set(&pair, (*a, *l), Some(v));
                d.upsert(*a, *l, route6(v), now, &mut sink);
            }
            d.flush(now, &mut sink);
            now += Duration::from_secs(1);
            fitted(&d, &format!("round {round}, growing"), &mut failed);
        }
        let ps = probes(&mut rng, &t);
        probed += ps.len();
        check(&pair, &base, &t, &ps, &format!("round {round}, grown"), &mut failed);
        for step in 0..6 {
            let mut changed = Vec::new();
            for _ in 0..15 {
                let (k, _) = t.iter().nth(rng.below(t.len() as u64) as usize).map(|(k, v)| (*k, *v)).expect("in range");
                t.remove(&k);
                trie_set(&pair, k, None);
                d.delete(k.0, k.1);
                changed.push(k);
            }
            for _ in 0..15 {
                let k = random_prefix(&mut rng, &t);
                let v = random_value(&mut rng);
                trie_set(&pair, k, Some(&v.0));
                d.upsert(k.0, k.1, route6(&v.0), now, &mut sink);
                t.insert(k, v);
                changed.push(k);
            }
            for _ in 0..15 {
                let (k, _) = t.iter().nth(rng.below(t.len() as u64) as usize).map(|(k, v)| (*k, *v)).expect("in range");
                let v = random_value(&mut rng);
                trie_set(&pair, k, Some(&v.0));
                d.upsert(k.0, k.1, route6(&v.0), now, &mut sink);
                t.insert(k, v);
                changed.push(k);
            }
            d.flush(now, &mut sink);
            now += Duration::from_secs(1);
            fitted(&d, &format!("round {round}, step {step}"), &mut failed);
            let mut ps = probes(&mut rng, &t);
            // The deleted routes' addresses too: they must fall to their covers.
            for (a, l) in changed {
                ps.extend([a, a | !mask(l), a.wrapping_sub(1), (a | !mask(l)).wrapping_add(1)]);
            }
            probed += ps.len();
            check(&pair, &base, &t, &ps, &format!("round {round}, step {step}"), &mut failed);
        }
    }
    assert!(failed.is_empty(), "{} of {probed} probes differ:\n{}", failed.len(), failed[..failed.len().min(SHOWN)].join("\n"));
}
