//! The IPv4 FIB's /24 index (DIR-24 in front of the LPM trie): one 16-bit
//! entry per /24 block that answers a destination lookup with one array read
//! wherever no route longer than /24 lies inside the block. A full table
//! walks the BPF LPM trie ~20 nodes deep, one cache miss each, which made a
//! flood of new flows no faster than the kernel; the index reads one line.
//!
//! An entry is `NONE` (no route covers the block and none lies inside it),
//! `TRIE` (a longer route lies inside: ask the trie, which holds every
//! route; also what a block never written holds, so a fresh index is
//! slow but right), or the index of the block's longest covering route's value in a
//! table of distinct route values (a full table has few: one per next hop
//! or group, and the special types).
//!
//! A first level of one entry per /16 holds the value all 256 of its
//! blocks agree on, if they do (`DESCEND` otherwise): with a small table,
//! destinations spread over many /24s read that 128 KiB level, which stays
//! in cache, instead of a line of the 32 MiB one each.
//!
//! `Dir24` keeps the index in step with the trie, route by route, as rte_lpm
//! does: each block remembers the length of the route that painted it, so an
//! added route repaints only the blocks no longer route already owns, and a
//! deleted one hands its blocks to the route that covers it. Freed value
//! slots rest for `quarantine` before reuse: an XDP program that read a slot
//! number just before its route went must still find that route's value,
//! never another route's.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A route longer than /24 lies in the block (or it was never written): the trie decides.
pub const TRIE: u16 = 0;
/// No route for any address of the block.
pub const NONE: u16 = 0xFFFF;
/// Value slots 1..=MAX_VALS.
pub const MAX_VALS: u16 = 0xFFFE;
pub const BLOCKS: usize = 1 << 24;
/// First-level entry: the /16's blocks disagree (or it was never written): read the block.
pub const DESCEND: u16 = 0;
pub const TOPS: usize = 1 << 16;

/// Where the index lives (the BPF maps, or a vector in tests).
pub trait DirSink<V> {
    /// Called before any `set_block` that names `slot`; false when the
    /// value could not be stored (the route's blocks then use the trie).
    fn set_val(&mut self, slot: u16, v: &V) -> bool;
    fn set_block(&mut self, block: u32, entry: u16);
    /// What `block` holds now (TRIE where nothing was ever written): the
    /// index itself is the record of what was written, so the daemon keeps
    /// no 32 MiB copy of it.
    fn block(&self, block: u32) -> u16;
    /// The first-level entry of the /16 `top`.
    fn set_top(&mut self, top: u32, entry: u16);
}

struct Val {
    slot: u16,
    refs: u32,
}

/// A route of /24 or shorter as one word: its masked address (whose low
/// byte is zero) with its length in that byte. With a full table's ~970k
/// such routes every byte of their map's entries costs 2 MiB.
fn short_key(addr: u32, len: u8) -> u32 {
    debug_assert!(len <= 24);
    mask(addr, len) | u32::from(len)
}

pub struct Dir24<V> {
    /// Painter of each block: its route's length + 1 (0: none).
    depth: Vec<u8>,
    /// What each /16's first-level entry was last set to.
    top: Vec<u16>,
    /// Routes of /24 or shorter (`short_key`): the slot of their value,
    /// TRIE when no slot was free (their blocks send lookups to the trie).
    short: HashMap<u32, u16>,
    /// The values of those without a slot.
    unslotted: HashMap<u32, V>,
    /// The value each slot in use holds (the reverse of `vals`).
    slot_v: Vec<Option<V>>,
    /// Routes longer than /24: the set, and how many lie in each block.
    long: HashMap<(u32, u8), ()>,
    long_in: HashMap<u32, u32>,
    vals: HashMap<V, Val>,
    free: VecDeque<(Instant, u16)>,
    next: u32,
    max_vals: u16,
    quarantine: Duration,
    /// Adopted slots holding a value another adopted slot holds too (a
    /// value freed and taken again while its old slot rested).
    adopted_twice: Vec<u16>,
}

fn mask(addr: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        addr & (u32::MAX << (32 - u32::from(len)))
    }
}

/// The blocks a route of `len` <= 24 at `addr` covers.
fn blocks(addr: u32, len: u8) -> std::ops::Range<u32> {
    let first = mask(addr, len) >> 8;
    first..first + (1u32 << (24 - u32::from(len)))
}

impl<V: Eq + Hash + Clone> Dir24<V> {
    pub fn new(quarantine: Duration) -> Self {
        Self::with_max_vals(quarantine, MAX_VALS)
    }

    /// `max_vals` slots only (tests of exhaustion).
    pub fn with_max_vals(quarantine: Duration, max_vals: u16) -> Self {
        Dir24 {
            depth: vec![0; BLOCKS],
            top: vec![DESCEND; TOPS],
            short: HashMap::new(),
            unslotted: HashMap::new(),
            slot_v: vec![None; usize::from(max_vals.min(MAX_VALS)) + 1],
            long: HashMap::new(),
            long_in: HashMap::new(),
            vals: HashMap::new(),
            free: VecDeque::new(),
            next: 1,
            max_vals: max_vals.min(MAX_VALS),
            quarantine,
            adopted_twice: Vec::new(),
        }
    }

    /// Distinct route values holding a slot.
    pub fn vals_used(&self) -> usize {
        self.vals.len()
    }

    /// Blocks whose lookups go to the trie because a longer route lies in them.
    pub fn trie_blocks(&self) -> usize {
        self.long_in.len()
    }

    /// Routes whose value found no free slot (their blocks use the trie).
    pub fn unslotted(&self) -> usize {
        self.unslotted.len()
    }

    pub fn routes(&self) -> usize {
        self.short.len() + self.long.len()
    }

    /// What `block` should hold from its painter alone.
    fn painted(&self, block: u32) -> u16 {
        let d = self.depth[block as usize];
        if d == 0 {
            return NONE;
        }
        // A route without a slot (TRIE), or (never while depth and short
        // agree) no route: the trie is always right.
        self.short.get(&short_key(block << 8, d - 1)).copied().unwrap_or(TRIE)
    }

    /// The first-level entry of the /16 `top`, as last written.
    pub fn top_entry(&self, top: u32) -> u16 {
        self.top[top as usize]
    }

    /// Brings the first-level entries of the /16s holding blocks `first..=last`
    /// in line with their blocks (`force`: write them even if unchanged).
    fn refresh(&mut self, first: u32, last: u32, force: bool, sink: &mut impl DirSink<V>) {
        for t in (first >> 8)..=(last >> 8) {
            let e0 = sink.block(t << 8);
            let e = if e0 != TRIE && ((t << 8) + 1..(t + 1) << 8).all(|b| sink.block(b) == e0) { e0 } else { DESCEND };
            if force || self.top[t as usize] != e {
                self.top[t as usize] = e;
                sink.set_top(t, e);
            }
        }
    }

    /// Writes every block again, from the routes alone: after taking over
    /// an index another process wrote (`adopt_slots`), whatever it left
    /// half done. Blocks no route covers become NONE.
    pub fn sweep(&mut self, sink: &mut impl DirSink<V>) {
        // One pass, blocks and first level together; neighbouring blocks
        // mostly share their painter: one lookup per run.
        let mut long: Vec<u32> = self.long_in.keys().copied().collect();
        long.sort_unstable();
        let mut long = long.into_iter().peekable();
        let mut last: Option<(u32, u16)> = None;
        for t in 0..TOPS as u32 {
            let mut agree = None;
            let mut uniform = true;
            for b in (t << 8)..((t + 1) << 8) {
                let d = self.depth[b as usize];
                let e = if long.next_if_eq(&b).is_some() {
                    TRIE
                } else if d == 0 {
                    NONE
                } else {
                    let key = short_key(b << 8, d - 1);
                    match last {
                        Some((k, e)) if k == key => e,
                        _ => {
                            let e = self.painted(b);
                            last = Some((key, e));
                            e
                        }
                    }
                };
                sink.set_block(b, e);
                uniform &= *agree.get_or_insert(e) == e;
            }
            let e = match agree {
                Some(e) if uniform && e != TRIE => e,
                _ => DESCEND,
            };
            self.top[t as usize] = e;
            sink.set_top(t, e);
        }
    }

    /// Takes over value slots another process filled (a pinned index):
    /// before any route is added, `old` lists each slot's value. A route
    /// with one of these values gets its old slot, so blocks it painted
    /// never point at another value; slots no route claims by the first
    /// `release_adopted` rest like freed ones.
    pub fn adopt_slots(&mut self, old: impl IntoIterator<Item = (u16, V)>) {
        for (slot, v) in old {
            if slot == TRIE || slot > self.max_vals {
                continue;
            }
            self.next = self.next.max(u32::from(slot) + 1);
            match self.vals.entry(v) {
                std::collections::hash_map::Entry::Vacant(e) => {
                    self.slot_v[usize::from(slot)] = Some(e.key().clone());
                    e.insert(Val { slot, refs: 0 });
                }
                std::collections::hash_map::Entry::Occupied(_) => self.adopted_twice.push(slot),
            }
        }
    }

    /// Ends an adoption: adopted slots no route took rest from `now`.
    pub fn release_adopted(&mut self, now: Instant) {
        let idle: Vec<V> = self.vals.iter().filter(|(_, e)| e.refs == 0).map(|(v, _)| v.clone()).collect();
        for v in idle {
            let e = self.vals.remove(&v).expect("listed just now");
            self.slot_v[usize::from(e.slot)] = None;
            self.free.push_back((now, e.slot));
        }
        for slot in std::mem::take(&mut self.adopted_twice) {
            self.free.push_back((now, slot));
        }
    }

    fn acquire(&mut self, v: &V, now: Instant, sink: &mut impl DirSink<V>) -> Option<u16> {
        if let Some(e) = self.vals.get_mut(v) {
            e.refs += 1;
            return Some(e.slot);
        }
        let slot = match self.free.front() {
            Some(&(at, slot)) if now.saturating_duration_since(at) >= self.quarantine => {
                self.free.pop_front();
                slot
            }
            _ if self.next <= u32::from(self.max_vals) => {
                self.next += 1;
                (self.next - 1) as u16
            }
            _ => return None,
        };
        if !sink.set_val(slot, v) {
            self.free.push_front((now, slot));
            return None;
        }
        self.vals.insert(v.clone(), Val { slot, refs: 1 });
        self.slot_v[usize::from(slot)] = Some(v.clone());
        Some(slot)
    }

    /// A route of `slot`'s value went.
    fn release(&mut self, slot: u16, now: Instant) {
        let Some(v) = self.slot_v[usize::from(slot)].as_ref() else {
            return;
        };
        if let Some(e) = self.vals.get_mut(v) {
            e.refs = e.refs.saturating_sub(1);
            if e.refs == 0 {
                self.vals.remove(v);
                self.slot_v[usize::from(slot)] = None;
                self.free.push_back((now, slot));
            }
        }
    }

    /// The value of the short route `key`, if there is one.
    fn short_value(&self, key: u32) -> Option<&V> {
        match *self.short.get(&key)? {
            TRIE => self.unslotted.get(&key),
            slot => self.slot_v[usize::from(slot)].as_ref(),
        }
    }

    /// Paints the blocks of `addr/len` whose painter is `len` or shorter
    /// (`owned_only`: exactly `len`, i.e. this route's own) with `len`/`slot`.
    /// Then the first level follows, before any slot is released.
    fn paint(&mut self, addr: u32, len: u8, depth: u8, entry: u16, owned_only: bool, sink: &mut impl DirSink<V>) {
        let range = blocks(addr, len);
        let (first, last) = (range.start, range.end - 1);
        for b in range {
            let d = self.depth[b as usize];
            let mine = if owned_only { d == len + 1 } else { d <= len + 1 };
            if !mine {
                continue;
            }
            self.depth[b as usize] = depth;
            if !self.long_in.contains_key(&b) {
                sink.set_block(b, entry);
            }
        }
        self.refresh(first, last, false, sink);
    }

    /// Adds or replaces the route `addr/len` (host order) with value `v`.
    /// The trie must already hold it.
    pub fn upsert(&mut self, addr: u32, len: u8, v: V, now: Instant, sink: &mut impl DirSink<V>) {
        assert!(len <= 32, "IPv4 prefix length {len}");
        let key = (mask(addr, len), len);
        if len > 24 {
            if self.long.insert(key, ()).is_none() {
                let n = self.long_in.entry(key.0 >> 8).or_insert(0);
                *n += 1;
                if *n == 1 {
                    sink.set_block(key.0 >> 8, TRIE);
                    self.refresh(key.0 >> 8, key.0 >> 8, false, sink);
                }
            }
            return;
        }
        let skey = short_key(addr, len);
        if self.short_value(skey) == Some(&v) {
            return;
        }
        let slot = self.acquire(&v, now, sink);
        let entry = slot.unwrap_or(TRIE);
        let old = self.short.insert(skey, entry);
        if old == Some(TRIE) {
            self.unslotted.remove(&skey);
        }
        if slot.is_none() {
            self.unslotted.insert(skey, v);
        }
        // A replaced route repaints only its own blocks; a new one takes
        // every block a shorter route (or none) painted.
        self.paint(key.0, len, len + 1, entry, old.is_some(), sink);
        // Only a route that got a slot holds a reference to its value.
        if let Some(o) = old.filter(|&o| o != TRIE) {
            self.release(o, now);
        }
    }

    /// Removes the route `addr/len`; the trie may still hold it (it is
    /// deleted there after).
    pub fn delete(&mut self, addr: u32, len: u8, now: Instant, sink: &mut impl DirSink<V>) {
        assert!(len <= 32, "IPv4 prefix length {len}");
        let key = (mask(addr, len), len);
        if len > 24 {
            if self.long.remove(&key).is_some() {
                let b = key.0 >> 8;
                let n = self.long_in.get_mut(&b).expect("a long route counts in its block");
                *n -= 1;
                if *n == 0 {
                    self.long_in.remove(&b);
                    let e = self.painted(b);
                    sink.set_block(b, e);
                    self.refresh(b, b, false, sink);
                }
            }
            return;
        }
        let skey = short_key(addr, len);
        let Some(gone) = self.short.remove(&skey) else {
            return;
        };
        if gone == TRIE {
            self.unslotted.remove(&skey);
        }
        let (depth, entry) =
            match (0..len).rev().find_map(|l| self.short.get(&short_key(key.0, l)).map(|&e| (l, e))) {
                Some((l, e)) => (l + 1, e),
                None => (0, NONE),
            };
        self.paint(key.0, len, depth, entry, true, sink);
        if gone != TRIE {
            self.release(gone, now);
        }
    }
}

/// An index in memory, as the data path sees it: for tests of the index
/// itself and of the BPF program (which copy it into the maps).
pub struct MemSink<V> {
    pub blocks: Vec<u16>,
    pub top: Vec<u16>,
    pub vals: HashMap<u16, V>,
}

impl<V> MemSink<V> {
    /// Never written: every lookup goes on to the trie.
    pub fn new() -> Self {
        MemSink { blocks: vec![TRIE; BLOCKS], top: vec![DESCEND; TOPS], vals: HashMap::new() }
    }
}

impl<V> Default for MemSink<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Clone> DirSink<V> for MemSink<V> {
    fn set_val(&mut self, slot: u16, v: &V) -> bool {
        self.vals.insert(slot, v.clone());
        true
    }
    fn set_block(&mut self, block: u32, entry: u16) {
        self.blocks[block as usize] = entry;
    }
    fn set_top(&mut self, top: u32, entry: u16) {
        self.top[top as usize] = entry;
    }
    fn block(&self, block: u32) -> u16 {
        self.blocks[block as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Mem = MemSink<u32>;

    fn mem() -> Mem {
        MemSink::new()
    }

    /// The data path's lookup: the index, else a plain longest match.
    fn lookup(m: &Mem, routes: &HashMap<(u32, u8), u32>, addr: u32) -> Option<u32> {
        match m.top[(addr >> 16) as usize] {
            DESCEND => {}
            NONE => return None,
            slot => return Some(*m.vals.get(&slot).expect("a first-level slot has its value")),
        }
        match m.blocks[(addr >> 8) as usize] {
            NONE => None,
            TRIE => lpm(routes, addr),
            slot => Some(*m.vals.get(&slot).expect("a painted slot has its value")),
        }
    }

    fn lpm(routes: &HashMap<(u32, u8), u32>, addr: u32) -> Option<u32> {
        (0..=32u8).rev().find_map(|l| routes.get(&(mask(addr, l), l)).copied())
    }

    #[test]
    fn longest_covering_route_and_its_removal() {
        let (mut d, mut m, t0) = (Dir24::new(Duration::ZERO), mem(), Instant::now());
        let a = |s: &str| u32::from(s.parse::<std::net::Ipv4Addr>().unwrap());
        d.upsert(0, 0, 1, t0, &mut m);
        d.upsert(a("198.51.0.0"), 16, 2, t0, &mut m);
        d.upsert(a("198.51.100.0"), 24, 3, t0, &mut m);
        let e = |m: &Mem, s: &str| m.vals.get(&m.blocks[(a(s) >> 8) as usize]).copied();
        assert_eq!(e(&m, "203.0.113.1"), Some(1));
        assert_eq!(e(&m, "198.51.7.1"), Some(2));
        assert_eq!(e(&m, "198.51.100.9"), Some(3));
        d.upsert(a("198.51.100.128"), 25, 4, t0, &mut m);
        assert_eq!(m.blocks[(a("198.51.100.0") >> 8) as usize], TRIE);
        d.delete(a("198.51.0.0"), 16, t0, &mut m);
        assert_eq!(e(&m, "198.51.7.1"), Some(1), "the /16's blocks go to the default route");
        d.delete(a("198.51.100.128"), 25, t0, &mut m);
        assert_eq!(e(&m, "198.51.100.9"), Some(3), "the block leaves the trie with its /24 value");
        d.delete(0, 0, t0, &mut m);
        assert_eq!(m.blocks[(a("203.0.113.1") >> 8) as usize], NONE);
        assert_eq!((d.vals_used(), d.trie_blocks(), d.routes()), (1, 0, 1));
    }

    #[test]
    fn a_freed_slot_rests_before_reuse() {
        let (mut d, mut m, t0) = (Dir24::with_max_vals(Duration::from_secs(1), 2), mem(), Instant::now());
        d.upsert(0x0a00_0000, 8, 10, t0, &mut m);
        d.upsert(0x0b00_0000, 8, 11, t0, &mut m);
        let s10 = m.blocks[0x0a_0000];
        d.delete(0x0a00_0000, 8, t0, &mut m);
        // Slots exhausted and the freed one resting: the trie answers.
        d.upsert(0x0c00_0000, 8, 12, t0 + Duration::from_millis(500), &mut m);
        assert_eq!(m.blocks[0x0c_0000], TRIE);
        assert_eq!(d.unslotted(), 1);
        assert_eq!(m.vals[&s10], 10, "a resting slot keeps its old value");
        d.upsert(0x0d00_0000, 8, 13, t0 + Duration::from_secs(1), &mut m);
        assert_eq!(m.blocks[0x0d_0000], s10);
        assert_eq!(m.vals[&s10], 13);
    }

    /// A restarted daemon takes over a pinned index: values keep their
    /// slots, unclaimed slots rest, and the sweep rewrites every block.
    #[test]
    fn adoption_keeps_slots_of_surviving_values() {
        let (mut old, mut m, t0) = (Dir24::new(Duration::from_secs(1)), mem(), Instant::now());
        old.upsert(0x0a00_0000, 8, 10, t0, &mut m);
        old.upsert(0x0b00_0000, 8, 11, t0, &mut m);
        let (s10, s11) = (m.blocks[0x0a_0000], m.blocks[0x0b_0000]);
        let mut slots: Vec<(u16, u32)> = m.vals.iter().map(|(s, v)| (*s, *v)).collect();
        slots.sort();
        // 10's value was freed and taken again while slot 99 rested with it.
        slots.push((99, 10));
        // The old process died with 12.0.0.0/8 half painted, and 11/8 went while it was down.
        m.blocks[0x0c_0000] = s11;
        m.top[0x0c00] = s11;
        let mut new = Dir24::new(Duration::from_secs(1));
        new.adopt_slots(slots);
        new.upsert(0x0a00_0000, 8, 10, t0, &mut m);
        new.upsert(0x0d00_0000, 8, 13, t0, &mut m);
        new.release_adopted(t0);
        new.sweep(&mut m);
        assert_eq!(m.blocks[0x0a_0000], s10, "a surviving value keeps its slot");
        let s13 = m.blocks[0x0d_0000];
        assert!(s13 != s10 && s13 != s11, "a new value takes no adopted slot");
        assert_eq!((m.blocks[0x0b_0000], m.blocks[0x0c_0000]), (NONE, NONE), "the sweep clears what is gone");
        assert_eq!((m.top[0x0b00], m.top[0x0c00], m.top[0x0a00]), (NONE, NONE, s10), "the first level too");
        assert_eq!(m.vals[&s11], 11, "the unclaimed slot rests with its old value");
        new.upsert(0x0e00_0000, 8, 14, t0 + Duration::from_secs(1), &mut m);
        assert_eq!(m.blocks[0x0e_0000], s11, "and is reused after the rest");
        new.upsert(0x0f00_0000, 8, 15, t0 + Duration::from_secs(1), &mut m);
        assert_eq!(m.blocks[0x0f_0000], 99, "as is a second slot of one value");
    }

    /// A /16 whose blocks agree is answered by its first-level entry; a
    /// longer route or a differing /24 inside sends it down again.
    #[test]
    fn first_level_holds_agreeing_16s() {
        let (mut d, mut m, t0) = (Dir24::new(Duration::ZERO), mem(), Instant::now());
        d.upsert(0, 0, 1, t0, &mut m);
        let s1 = m.blocks[0];
        assert!(m.top.iter().all(|&t| t == s1), "one default route: every /16 agrees");
        d.upsert(0xC633_6400, 24, 2, t0, &mut m);
        assert_eq!((m.top[0xC633], m.top[0xC634]), (DESCEND, s1));
        d.delete(0xC633_6400, 24, t0, &mut m);
        assert_eq!(m.top[0xC633], s1);
        d.upsert(0xC633_6480, 25, 3, t0, &mut m);
        assert_eq!(m.top[0xC633], DESCEND, "a block sent to the trie");
        d.delete(0xC633_6480, 25, t0, &mut m);
        assert_eq!(m.top[0xC633], s1);
        d.delete(0, 0, t0, &mut m);
        assert!(m.top.iter().all(|&t| t == NONE));
    }

    /// A route that got no slot held no reference to its value: replacing
    /// or deleting it must not free the slot another route of that value
    /// got later (found by the property test).
    #[test]
    fn an_unslotted_route_frees_no_slot() {
        let (mut d, mut m, t0) = (Dir24::with_max_vals(Duration::ZERO, 1), mem(), Instant::now());
        d.upsert(0x0a00_0000, 8, 1, t0, &mut m);
        d.upsert(0, 0, 2, t0, &mut m);
        assert_eq!(m.blocks[0x0b_0000], TRIE, "no slot left for the default route");
        d.delete(0x0a00_0000, 8, t0, &mut m);
        d.upsert(0x0c00_0000, 8, 2, t0, &mut m);
        let s2 = m.blocks[0x0c_0000];
        assert_ne!(s2, TRIE);
        d.upsert(0, 0, 3, t0, &mut m);
        d.upsert(0x0d00_0000, 8, 4, t0, &mut m);
        assert_eq!(m.vals[&m.blocks[0x0c_0000]], 2, "12/8 still finds its own value");
        d.delete(0, 0, t0, &mut m);
        assert_eq!(m.vals[&m.blocks[0x0c_0000]], 2);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Up(u32, u8, u32),
        Del(u32, u8),
    }

    /// Addresses in a few /16s so that routes nest and overlap.
    fn op() -> impl Strategy<Value = Op> {
        let addr = (0u32..3, 0u32..4, any::<u16>())
            .prop_map(|(a, b, lo)| (0xC633_0000u32 + (a << 24)) | (b << 16) & 0x00FF_0000 | u32::from(lo));
        let len = prop_oneof![1 => Just(0u8), 2 => 6u8..=16, 4 => 17u8..=24, 4 => 20u8..=24, 4 => 25u8..=32];
        prop_oneof![
            3 => (addr.clone(), len.clone(), 0u32..6).prop_map(|(a, l, v)| Op::Up(a, l, v)),
            2 => (addr, len).prop_map(|(a, l)| Op::Del(a, l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// After any sequence of changes every probed address gets what a
        /// longest-prefix match over the routes gives, also with only a few
        /// value slots (the rest falling back to the trie), and the
        /// bookkeeping returns to empty when every route is gone.
        #[test]
        fn index_matches_longest_prefix_match(ops in proptest::collection::vec(op(), 1..60),
                                               probes in proptest::collection::vec(any::<u32>(), 64),
                                               few in any::<bool>()) {
            let max = if few { 3 } else { MAX_VALS };
            let (mut d, mut m) = (Dir24::with_max_vals(Duration::ZERO, max), mem());
            let mut routes = HashMap::new();
            let t0 = Instant::now();
            for (i, o) in ops.iter().enumerate() {
                let now = t0 + Duration::from_millis(i as u64);
                match *o {
                    Op::Up(a, l, v) => { routes.insert((mask(a, l), l), v); d.upsert(a, l, v, now, &mut m); }
                    Op::Del(a, l) => { routes.remove(&(mask(a, l), l)); d.delete(a, l, now, &mut m); }
                }
            }
            let mut addrs: Vec<u32> = probes.iter().map(|p| (p & 0x03FF_FFFF) | 0xC400_0000).collect();
            for o in &ops {
                let (Op::Up(a, l, _) | Op::Del(a, l)) = *o;
                let lo = mask(a, l);
                addrs.extend([lo, lo | 0x7F, lo.wrapping_sub(1), lo | (u32::MAX >> l.min(31))]);
            }
            for a in addrs {
                prop_assert_eq!(lookup(&m, &routes, a), lpm(&routes, a), "address {:#x}", a);
                let t = (a >> 16) as usize;
                prop_assert_eq!(d.top_entry(a >> 16), m.top[t]);
                let bs = &m.blocks[t << 8..(t + 1) << 8];
                prop_assert!(m.top[t] == DESCEND || bs.iter().all(|&b| b == m.top[t]),
                             "the /16 {:#x} says {} but its blocks disagree", t, m.top[t]);
            }
            for &(a, l) in routes.keys() {
                d.delete(a, l, t0, &mut m);
            }
            prop_assert_eq!((d.routes(), d.vals_used(), d.trie_blocks(), d.unslotted()), (0, 0, 0, 0));
            prop_assert!(m.blocks.iter().all(|&b| b == NONE || b == TRIE));
        }
    }
}
