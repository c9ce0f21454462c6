use super::*;

#[derive(Default)]
struct Mem {
    vals: HashMap<u16, u32>,
    entries: HashMap<Key, u32>,
    tops: Vec<u64>,
    /// Puts refused from this many entries on (a full map).
    cap: Option<usize>,
}

impl Mem {
    fn new() -> Mem {
        Mem { tops: vec![u64::from(TRIE); TOPS], ..Default::default() }
    }

    /// What a lookup with `word` as the top finds: the value, or None for
    /// no route; "ask the trie" answers from `trie`.
    fn lookup(&self, word: u64, addr: u128, trie: &BTreeMap<(u128, u8), u32>) -> Option<u32> {
        match walk(word, addr, |k| self.entries.get(k).copied()) {
            Some(SLOT_NONE) => None,
            Some(s) => Some(*self.vals.get(&s).unwrap_or_else(|| panic!("slot {s} never written"))),
            None => lpm(trie, addr),
        }
    }
}

impl Dir6Sink<u32> for Mem {
    fn set_val(&mut self, slot: u16, v: &u32) -> bool {
        self.vals.insert(slot, *v);
        true
    }
    fn put(&mut self, entries: &[(Key, u32)]) -> bool {
        for (k, e) in entries {
            if self.cap.is_some_and(|c| self.entries.len() >= c) {
                return false;
            }
            assert!(self.entries.insert(*k, *e).is_none(), "key {k:?} written twice");
        }
        true
    }
    fn del(&mut self, keys: &[Key]) {
        for k in keys {
            self.entries.remove(k);
        }
    }
    fn set_top(&mut self, top: u16, word: u64) {
        self.tops[usize::from(top)] = word;
    }
}

fn lpm(routes: &BTreeMap<(u128, u8), u32>, addr: u128) -> Option<u32> {
    (0..=128u8).rev().find_map(|l| routes.get(&(addr & mask128(l), l)).copied())
}

use crate::xorshift::XorShift as Rng;

const LENS: &[u8] = &[0, 3, 12, 16, 17, 20, 24, 29, 32, 33, 36, 40, 44, 47, 48, 52, 56, 60, 64, 65, 80, 127, 128];

/// Routes that nest: most start inside a few /16s, many inside each other.
fn random_route(rng: &mut Rng, have: &[(u128, u8)]) -> (u128, u8) {
    let len = LENS[rng.below(LENS.len() as u64) as usize];
    let a = if !have.is_empty() && rng.below(3) > 0 {
        // Inside (or around) an existing route, so routes nest deeply.
        let (p, _) = have[rng.below(have.len() as u64) as usize];
        p ^ (rng.addr() >> (16 + rng.below(100)))
    } else {
        (u128::from(0x2001u16 + rng.below(4) as u16) << 112) | (rng.addr() >> 16)
    };
    (a & mask128(len), len)
}

/// Addresses worth asking: inside each route, at its edges, and random.
fn probes(rng: &mut Rng, routes: &BTreeMap<(u128, u8), u32>) -> Vec<u128> {
    let mut out = Vec::new();
    for &(p, l) in routes.keys() {
        let host = !mask128(l);
        out.push(p);
        out.push(p | host);
        out.push(p | (rng.addr() & host));
        out.push(p.wrapping_sub(1));
    }
    for _ in 0..200 {
        out.push((u128::from(0x2001u16 + rng.below(4) as u16) << 112) | (rng.addr() >> 16));
        out.push(rng.addr());
    }
    out
}

fn check(d: &Dir6<u32>, mem: &Mem, routes: &BTreeMap<(u128, u8), u32>, rng: &mut Rng, what: &str) {
    for a in probes(rng, routes) {
        let t = (a >> 112) as u16;
        assert_eq!(mem.tops[usize::from(t)], d.top_word(t), "{what}: top {t:x} as written");
        assert_eq!(mem.lookup(mem.tops[usize::from(t)], a, routes), lpm(routes, a), "{what}: {a:x}");
    }
}

#[test]
fn answers_as_the_longest_prefix_match_through_changes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..6 {
        let mut d = Dir6::new(Duration::from_secs(3600));
        let mut mem = Mem::new();
        let mut routes = BTreeMap::new();
        let now = Instant::now();
        let mut keys: Vec<(u128, u8)> = Vec::new();
        for _ in 0..300 {
            let (a, l) = random_route(&mut rng, &keys);
            let v = rng.below(12) as u32;
            d.upsert(a, l, v, now, &mut mem);
            routes.insert((a, l), v);
            keys.push((a, l));
        }
        d.flush(now, &mut mem);
        check(&d, &mem, &routes, &mut rng, &format!("round {round} loaded"));
        for step in 0..40 {
            for _ in 0..5 {
                if rng.below(2) == 0 && !keys.is_empty() {
                    let (a, l) = keys.swap_remove(rng.below(keys.len() as u64) as usize);
                    d.delete(a, l);
                    routes.remove(&(a, l));
                } else {
                    let (a, l) = random_route(&mut rng, &keys);
                    let v = rng.below(12) as u32;
                    d.upsert(a, l, v, now, &mut mem);
                    if routes.insert((a, l), v).is_none() {
                        keys.push((a, l));
                    }
                }
            }
            d.flush(now, &mut mem);
            if step % 2 == 1 {
                // What the quarantine keeps is never what a current top needs.
                d.drain_retired(&mut mem);
            }
            check(&d, &mem, &routes, &mut rng, &format!("round {round} step {step}"));
        }
        d.drain_retired(&mut mem);
        assert_eq!(mem.entries.len(), d.usage().entries, "only the current versions' entries remain");
    }
}

#[test]
fn a_reader_of_the_old_top_word_finds_the_old_answers() {
    let mut rng = Rng(7);
    let mut d = Dir6::new(Duration::from_secs(3600));
    let mut mem = Mem::new();
    let now = Instant::now();
    let mut routes = BTreeMap::new();
    for (a, l, v) in [(0x2001_0db8u128 << 96, 32, 1), (0x2001_0db8_0001u128 << 80, 48, 2), (0x2001_0db8_0001_0002u128 << 64, 64, 3)] {
        d.upsert(a, l, v, now, &mut mem);
        routes.insert((a, l), v);
    }
    d.flush(now, &mut mem);
    let t = 0x2001u16;
    let old_word = mem.tops[usize::from(t)];
    let old_routes = routes.clone();
    // A /40 in between and the /48 gone: a new shape (next level 40, not 48).
    d.upsert(0x2001_0db8u128 << 96, 40, 4, now, &mut mem);
    routes.insert((0x2001_0db8u128 << 96, 40), 4);
    d.delete(0x2001_0db8_0001u128 << 80, 48);
    routes.remove(&(0x2001_0db8_0001u128 << 80, 48));
    d.flush(now, &mut mem);
    assert_ne!(old_word, mem.tops[usize::from(t)]);
    for a in probes(&mut rng, &old_routes).into_iter().chain(probes(&mut rng, &routes)) {
        if (a >> 112) as u16 != t {
            continue;
        }
        assert_eq!(mem.lookup(old_word, a, &old_routes), lpm(&old_routes, a), "old word, {a:x}");
        assert_eq!(mem.lookup(mem.tops[usize::from(t)], a, &routes), lpm(&routes, a), "new word, {a:x}");
    }
    // The old route's value slot rests too: nothing else took slot 2.
    assert_eq!(mem.vals.get(&2), Some(&2));
}

#[test]
fn the_default_route_changes_top_words_only() {
    let mut d = Dir6::new(Duration::ZERO);
    let mut mem = Mem::new();
    let now = Instant::now();
    d.upsert(0x2001_0db8_0001u128 << 80, 48, 5, now, &mut mem);
    d.upsert(0, 0, 1, now, &mut mem);
    d.flush(now, &mut mem);
    let entries = mem.entries.clone();
    d.upsert(0, 0, 2, now, &mut mem);
    d.flush(now, &mut mem);
    assert_eq!(mem.entries, entries, "no entry rewritten");
    let mut routes = BTreeMap::new();
    routes.insert((0x2001_0db8_0001u128 << 80, 48), 5);
    routes.insert((0, 0), 2);
    for a in [0x2001_0db8_0001u128 << 80, 0x2001_0db8_0002u128 << 80, 0x3000u128 << 112, 0x2001u128 << 112] {
        assert_eq!(mem.lookup(mem.tops[(a >> 112) as usize], a, &routes), lpm(&routes, a), "{a:x}");
    }
    assert_eq!(walk(mem.tops[0x3000], 0x3000u128 << 112, |_| None), Some(d.slot_of(&2).expect("the default route's value holds a slot")));
}

#[test]
fn a_lone_48_costs_one_hash_entry_and_a_longer_route_the_trie() {
    let mut d = Dir6::new(Duration::ZERO);
    let mut mem = Mem::new();
    let now = Instant::now();
    d.upsert(0x2001_0db8_0001u128 << 80, 48, 5, now, &mut mem);
    d.flush(now, &mut mem);
    assert_eq!(mem.entries.len(), 1);
    let w = mem.tops[0x2001] as u32;
    assert_eq!((kind(w), level(w)), (KIND_DESCEND, 48));
    // A /96 inside: its /64 block asks the trie, the rest of the /48 does not.
    d.upsert(0x2001_0db8_0001_0000_0000_0001u128 << 32, 96, 6, now, &mut mem);
    d.flush(now, &mut mem);
    let top = mem.tops[0x2001];
    let get = |k: &Key| mem.entries.get(k).copied();
    assert_eq!(walk(top, 0x2001_0db8_0001_0000_0000_0001u128 << 32, get), None);
    assert_eq!(walk(top, 0x2001_0db8_0001_0001u128 << 64, get), d.slot_of(&5));
    assert_eq!(walk(top, 0x2001_0db8_0002u128 << 80, get), Some(SLOT_NONE));
}

#[test]
fn a_full_map_or_no_slot_sends_the_top_to_the_trie() {
    let now = Instant::now();
    let mut d = Dir6::new(Duration::ZERO);
    let mut mem = Mem::new();
    mem.cap = Some(2);
    for i in 0..3u128 {
        d.upsert((0x2001_0db8_0000u128 + i) << 80, 48, 5, now, &mut mem);
    }
    d.flush(now, &mut mem);
    assert_eq!(mem.tops[0x2001], u64::from(TRIE));
    assert!(mem.entries.is_empty(), "what landed was taken back");
    assert_eq!(d.usage().trie_tops, 1);

    let mut d = Dir6::with_max_vals(Duration::ZERO, 1);
    let mut mem = Mem::new();
    d.upsert(0x2001u128 << 112, 16, 1, now, &mut mem);
    d.upsert(0x2002_0001u128 << 96, 32, 2, now, &mut mem);
    d.flush(now, &mut mem);
    assert_eq!(mem.tops[0x2001], u64::from(val(1)));
    assert_eq!(mem.tops[0x2002], u64::from(TRIE), "its route has no slot");
    assert_eq!(d.usage().unslotted, 1);
}

#[test]
fn the_first_flush_writes_every_word() {
    let mut d = Dir6::new(Duration::ZERO);
    let mut mem = Mem::new();
    let now = Instant::now();
    d.upsert(0x2001_0db8_0001u128 << 80, 48, 5, now, &mut mem);
    d.flush(now, &mut mem);
    // A /16 without routes answers "no route" from its word, not the trie.
    assert_eq!(mem.tops[0x3000], u64::from(val(SLOT_NONE)));
    assert_eq!(walk(mem.tops[0x3000], 0x3000u128 << 112, |_| None), Some(SLOT_NONE));
}

#[test]
fn freed_slots_rest_before_reuse() {
    let t0 = Instant::now();
    let q = Duration::from_secs(1);
    let mut d = Dir6::with_max_vals(q, 1);
    let mut mem = Mem::new();
    d.upsert(0x2001u128 << 112, 16, 1, t0, &mut mem);
    d.flush(t0, &mut mem);
    d.delete(0x2001u128 << 112, 16);
    d.flush(t0, &mut mem);
    d.upsert(0x2002u128 << 112, 16, 2, t0 + q / 2, &mut mem);
    d.flush(t0 + q / 2, &mut mem);
    assert_eq!(mem.vals.get(&1), Some(&1), "slot 1 rests");
    assert_eq!(mem.tops[0x2002], u64::from(TRIE));
    d.delete(0x2002u128 << 112, 16);
    d.upsert(0x2003u128 << 112, 16, 3, t0 + q, &mut mem);
    d.flush(t0 + q, &mut mem);
    assert_eq!(mem.vals.get(&1), Some(&3));
    assert_eq!(mem.tops[0x2003], u64::from(val(1)));
}
