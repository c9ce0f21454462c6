//! The IPv6 FIB's multibit index (`--fib6-index multibit`) in front of the
//! LPM trie. A full IPv6 table walks the BPF trie ~20 nodes deep, a cache
//! miss each: a flood of new IPv6 flows ran at a third of the one-route
//! rate. The index answers most lookups in a first-level array read and
//! two or three hash lookups, the way DPDK's lpm6 steps a byte at a time,
//! but skipping the levels a block has nothing at.
//!
//! The first level is one word per /16 (`top`). Below it, hash entries at
//! the levels /24, /32, ... /64, keyed by (level, the block's bits, the
//! top's version). An entry is `TRIE` (ask the trie: a route longer than
//! /64 lies in the block, or a value found no slot), `VAL(slot)` (the
//! longest route covering the block; nothing longer lies inside), or
//! `DESCEND(level, default)`: look up the block of the address at `level`,
//! and if that level has no entry for it, the answer is `default`. The
//! next level is the first one at or past the shortest route inside, so a
//! /48 alone in its /16 costs the top and one hash lookup.
//!
//! Slots name route values in a table of distinct values. `INHERIT`
//! means "the top's covering route" (the longest of /16 or shorter): so a
//! change of the default route rewrites top words only, not every entry.
//!
//! Changes are collected per /16 and applied by `flush`, which builds a
//! changed /16's entries under a new version and then switches its top
//! word in one 8-byte store: a lookup sees the old version's entries or
//! the new ones, never a mix. Old entries are deleted, and freed value
//! slots reused, only after `quarantine`: an XDP program that read the old
//! top word just before must still find what it pointed at.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The hash levels, in order.
pub const LEVELS: [u8; 6] = [24, 32, 40, 48, 56, 64];
pub const TOPS: usize = 1 << 16;

pub const KIND_TRIE: u32 = 0;
pub const KIND_VAL: u32 = 1;
pub const KIND_DESCEND: u32 = 2;
/// No route.
pub const SLOT_NONE: u16 = 0;
/// The top's covering route (never in a top word).
pub const SLOT_INHERIT: u16 = 0xFFFF;
/// Value slots 1..=MAX_VALS.
pub const MAX_VALS: u16 = 0xFFFE;
/// What a never-written top (or a failed entry) holds: ask the trie.
pub const TRIE: u32 = 0;

/// An entry word: kind (bits 24-31), next level (16-23), slot (0-15).
pub const fn entry(kind: u32, level: u8, slot: u16) -> u32 {
    (kind << 24) | ((level as u32) << 16) | slot as u32
}

pub const fn val(slot: u16) -> u32 {
    entry(KIND_VAL, 0, slot)
}

pub const fn kind(e: u32) -> u32 {
    e >> 24
}

pub const fn level(e: u32) -> u8 {
    (e >> 16) as u8
}

pub const fn slot(e: u32) -> u16 {
    e as u16
}

/// A hash entry's key: the block's upper 64 address bits (host order,
/// masked to `level`), its level and the version of its top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub hi: u64,
    pub level: u8,
    pub ver: u32,
}

/// Where the index lives (the BPF maps, or memory in tests).
pub trait Dir6Sink<V> {
    /// Called before any entry names `slot`; false when the value could
    /// not be stored (the routes holding it then use the trie).
    fn set_val(&mut self, slot: u16, v: &V) -> bool;
    /// Adds one top's entries (all new keys); false if any was refused
    /// (a full map): the caller deletes them all again.
    fn put(&mut self, entries: &[(Key, u32)]) -> bool;
    fn del(&mut self, keys: &[Key]);
    /// The top word: the entry (low 32 bits) and version (high 32), one store.
    fn set_top(&mut self, top: u16, word: u64);
}

fn mask128(len: u8) -> u128 {
    if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) }
}

fn mask64(len: u8) -> u64 {
    match len {
        0 => 0,
        l if l >= 64 => u64::MAX,
        l => u64::MAX << (64 - u32::from(l)),
    }
}

/// What a /16 holds below its top word.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum Shape {
    /// No route longer than /16 in it: the top word is VAL(cover).
    #[default]
    Empty,
    /// Entries under `ver`, first consulted at `level`.
    Descend { level: u8, ver: u32 },
    /// The trie decides (a route past /64, an unslotted value, a full map).
    Trie,
}

#[derive(Default)]
struct Top {
    shape: Shape,
    /// The entries of the current version (deleted when it is replaced).
    keys: Vec<Key>,
    word: u64,
}

struct ValSlot {
    slot: Option<u16>,
    refs: u32,
}

/// How full the index is, for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub vals: usize,
    pub entries: usize,
    /// /16s whose lookups all go to the trie.
    pub trie_tops: usize,
    pub unslotted: usize,
}

pub struct Dir6<V> {
    /// Routes of /16 or shorter (they cover whole tops).
    short: BTreeMap<(u128, u8), V>,
    /// Routes longer than /16.
    long: BTreeMap<(u128, u8), V>,
    vals: HashMap<V, ValSlot>,
    /// Values whose last route went since the last flush.
    dropped: Vec<V>,
    free: VecDeque<(Instant, u16)>,
    next_slot: u32,
    max_vals: u16,
    tops: Vec<Top>,
    /// Tops whose inside changed (rebuild) and whose cover changed (rewrite the word).
    inside_dirty: BTreeSet<u16>,
    cover_dirty: BTreeSet<u16>,
    /// Entries of replaced versions, deleted once their time has come.
    retired: VecDeque<(Instant, Vec<Key>)>,
    next_ver: u32,
    quarantine: Duration,
    entries: usize,
    /// No word written yet: the first flush writes all 65,536, so a /16
    /// without routes says NONE instead of sending lookups to the trie.
    fresh: bool,
}

impl<V: Eq + Hash + Clone> Dir6<V> {
    pub fn new(quarantine: Duration) -> Self {
        Self::with_max_vals(quarantine, MAX_VALS)
    }

    /// `max_vals` slots only (tests of exhaustion).
    pub fn with_max_vals(quarantine: Duration, max_vals: u16) -> Self {
        Dir6 {
            short: BTreeMap::new(),
            long: BTreeMap::new(),
            vals: HashMap::new(),
            dropped: Vec::new(),
            free: VecDeque::new(),
            next_slot: 1,
            max_vals: max_vals.min(MAX_VALS),
            tops: (0..TOPS).map(|_| Top::default()).collect(),
            inside_dirty: BTreeSet::new(),
            cover_dirty: BTreeSet::new(),
            retired: VecDeque::new(),
            next_ver: 1,
            quarantine,
            entries: 0,
            fresh: true,
        }
    }

    pub fn usage(&self) -> Usage {
        Usage {
            vals: self.vals.values().filter(|v| v.slot.is_some()).count(),
            entries: self.entries,
            trie_tops: self.tops.iter().filter(|t| t.shape == Shape::Trie).count(),
            unslotted: self.vals.values().filter(|v| v.slot.is_none()).count(),
        }
    }

    pub fn routes(&self) -> usize {
        self.short.len() + self.long.len()
    }

    /// The top word as last written.
    pub fn top_word(&self, top: u16) -> u64 {
        self.tops[usize::from(top)].word
    }

    /// The next version `flush` gives a rebuilt top (after `adopt_versions`
    /// past every version a dead daemon's entries use).
    pub fn skip_versions(&mut self, past: u32) {
        self.next_ver = next_version(self.next_ver.max(past));
    }

    /// Keys another process wrote (an adopted index): deleted once the
    /// first flush's words are in place and the quarantine is over.
    pub fn retire_foreign(&mut self, keys: Vec<Key>, now: Instant) {
        if !keys.is_empty() {
            self.retired.push_back((now, keys));
        }
    }

    /// Slots another process wrote (an adopted index): their values keep
    /// them, so no top it left names another value; the others rest.
    pub fn adopt_slots(&mut self, old: impl IntoIterator<Item = (u16, V)>, now: Instant) {
        let mut used = BTreeSet::new();
        for (slot, v) in old {
            if slot == SLOT_NONE || slot > self.max_vals {
                continue;
            }
            used.insert(slot);
            if let std::collections::hash_map::Entry::Vacant(e) = self.vals.entry(v.clone()) {
                e.insert(ValSlot { slot: Some(slot), refs: 0 });
                self.dropped.push(v);
            } else {
                self.free.push_back((now, slot));
            }
        }
        self.next_slot = used.last().map_or(1, |s| u32::from(*s) + 1);
        for s in 1..self.next_slot {
            if !used.contains(&(s as u16)) {
                self.free.push_back((now, s as u16));
            }
        }
    }

    fn alloc(&mut self, now: Instant) -> Option<u16> {
        if let Some(&(at, slot)) = self.free.front() {
            if now.saturating_duration_since(at) >= self.quarantine {
                self.free.pop_front();
                return Some(slot);
            }
        }
        if self.next_slot <= u32::from(self.max_vals) {
            self.next_slot += 1;
            return Some((self.next_slot - 1) as u16);
        }
        None
    }

    fn take(&mut self, v: &V, now: Instant, sink: &mut impl Dir6Sink<V>) {
        if let Some(s) = self.vals.get_mut(v) {
            s.refs += 1;
            return;
        }
        let slot = self.alloc(now).filter(|slot| {
            let ok = sink.set_val(*slot, v);
            if !ok {
                self.free.push_back((now, *slot));
            }
            ok
        });
        self.vals.insert(v.clone(), ValSlot { slot, refs: 1 });
    }

    fn release(&mut self, v: &V) {
        if let Some(s) = self.vals.get_mut(v) {
            s.refs -= 1;
            if s.refs == 0 {
                self.dropped.push(v.clone());
            }
        }
    }

    fn mark(&mut self, addr: u128, len: u8) {
        let first = (addr >> 112) as u32;
        if len > 16 {
            self.inside_dirty.insert(first as u16);
        } else {
            for t in first..first + (1u32 << (16 - len)) {
                self.cover_dirty.insert(t as u16);
            }
        }
    }

    /// The route `addr/len` now has value `v` (in the trie already).
    pub fn upsert(&mut self, addr: u128, len: u8, v: V, now: Instant, sink: &mut impl Dir6Sink<V>) {
        let addr = addr & mask128(len);
        let map = if len > 16 { &mut self.long } else { &mut self.short };
        let old = map.insert((addr, len), v.clone());
        if old.as_ref() == Some(&v) {
            return;
        }
        self.take(&v, now, sink);
        if let Some(o) = old {
            self.release(&o);
        }
        self.mark(addr, len);
    }

    /// The route `addr/len` is gone (from the trie already).
    pub fn delete(&mut self, addr: u128, len: u8) {
        let addr = addr & mask128(len);
        let map = if len > 16 { &mut self.long } else { &mut self.short };
        if let Some(o) = map.remove(&(addr, len)) {
            self.release(&o);
            self.mark(addr, len);
        }
    }

    /// Every top again (after adopting an index another process wrote).
    pub fn mark_all(&mut self) {
        self.inside_dirty.extend(0..=u16::MAX);
    }

    pub fn pending(&self) -> bool {
        !self.inside_dirty.is_empty() || !self.cover_dirty.is_empty()
    }

    fn slot_of(&self, v: &V) -> Option<u16> {
        self.vals.get(v).and_then(|s| s.slot)
    }

    /// The slot of top `t`'s covering route: NONE without one, None when
    /// its value has no slot.
    fn cover(&self, t: u16) -> Option<u16> {
        let base = u128::from(t) << 112;
        for len in (0..=16u8).rev() {
            if let Some(v) = self.short.get(&(base & mask128(len), len)) {
                return self.slot_of(v);
            }
        }
        Some(SLOT_NONE)
    }

    /// Applies what changed: rebuilt tops get their new words, replaced
    /// entries are retired, and what rested long enough is deleted.
    pub fn flush(&mut self, now: Instant, sink: &mut impl Dir6Sink<V>) {
        if std::mem::take(&mut self.fresh) {
            self.cover_dirty.extend(0..=u16::MAX);
        }
        let inside = std::mem::take(&mut self.inside_dirty);
        let mut cover = std::mem::take(&mut self.cover_dirty);
        let mut refused = Vec::new();
        for t in inside {
            cover.remove(&t);
            if !self.rebuild(t, now, sink) {
                refused.push(t);
            }
        }
        if let Some(first) = refused.first() {
            // One line a flush: a table too small for its routes refuses many.
            log::warn!(
                "fp_fib6_dir: the entries of {} /16s did not fit (the first {first:x}::/16); their lookups use the trie (a larger --fib6-entries gives the index more room)",
                refused.len()
            );
        }
        for t in cover {
            self.rewrite_word(t, sink);
        }
        for v in std::mem::take(&mut self.dropped) {
            if self.vals.get(&v).is_some_and(|s| s.refs == 0) {
                if let Some(slot) = self.vals.remove(&v).and_then(|s| s.slot) {
                    self.free.push_back((now, slot));
                }
            }
        }
        while let Some((at, _)) = self.retired.front() {
            if now.saturating_duration_since(*at) < self.quarantine {
                break;
            }
            let (_, keys) = self.retired.pop_front().expect("front");
            sink.del(&keys);
        }
    }

    /// Deletes every retired entry now (tests, and shutdown).
    pub fn drain_retired(&mut self, sink: &mut impl Dir6Sink<V>) {
        for (_, keys) in self.retired.drain(..) {
            sink.del(&keys);
        }
    }

    fn rewrite_word(&mut self, t: u16, sink: &mut impl Dir6Sink<V>) {
        let word = match (&self.tops[usize::from(t)].shape, self.cover(t)) {
            (Shape::Trie, _) | (_, None) => u64::from(TRIE),
            (Shape::Empty, Some(c)) => u64::from(val(c)),
            (Shape::Descend { level, ver }, Some(c)) => u64::from(entry(KIND_DESCEND, *level, c)) | (u64::from(*ver) << 32),
        };
        if self.tops[usize::from(t)].word != word {
            self.tops[usize::from(t)].word = word;
            sink.set_top(t, word);
        }
    }

    /// Builds /16 `t` again; false if its entries did not fit.
    fn rebuild(&mut self, t: u16, now: Instant, sink: &mut impl Dir6Sink<V>) -> bool {
        let base = u128::from(t) << 112;
        let end = base | !mask128(16);
        let mut routes = Vec::new();
        let mut unslotted = false;
        for ((a, l), v) in self.long.range((base, 0)..=(end, u8::MAX)) {
            match self.slot_of(v) {
                Some(s) => routes.push(((a >> 64) as u64, *l, s)),
                None => unslotted = true,
            }
        }
        let mut fitted = true;
        let old = std::mem::take(&mut self.tops[usize::from(t)].keys);
        if !old.is_empty() {
            self.entries -= old.len();
            self.retired.push_back((now, old));
        }
        let shape = if routes.is_empty() && !unslotted {
            Shape::Empty
        } else if unslotted {
            Shape::Trie
        } else {
            let ver = self.next_ver;
            self.next_ver = next_version(ver);
            let mut out = Vec::new();
            let e = subtree(16, &routes, SLOT_INHERIT, ver, &mut out);
            if kind(e) != KIND_DESCEND {
                Shape::Trie
            } else if sink.put(&out) {
                self.entries += out.len();
                self.tops[usize::from(t)].keys = out.into_iter().map(|(k, _)| k).collect();
                Shape::Descend { level: level(e), ver }
            } else {
                let keys: Vec<Key> = out.into_iter().map(|(k, _)| k).collect();
                sink.del(&keys);
                fitted = false;
                Shape::Trie
            }
        };
        self.tops[usize::from(t)].shape = shape;
        // A rebuilt top's word is written even if equal: its version is new.
        self.tops[usize::from(t)].word = u64::MAX;
        self.rewrite_word(t, sink);
        fitted
    }
}

/// Versions are 24 bits and never 0 (an empty slot's tag). A key holds
/// its /16's bits, so two /16s may share a version; one /16 would need 16M
/// rebuilds within a quarantine to meet an old one of its own.
fn next_version(v: u32) -> u32 {
    ((v & table::VER_MASK) + 1) & table::VER_MASK | u32::from(v & table::VER_MASK == table::VER_MASK)
}

/// A block's longest painter (length, slot) and the routes inside it.
type Kid = (Option<(u8, u16)>, Vec<(u64, u8, u16)>);

/// The entry of a block at `parent` level holding `routes` (all inside it,
/// longer than `parent`, sorted) whose lookups default to `d`; its
/// children's entries go to `out`.
fn subtree(parent: u8, routes: &[(u64, u8, u16)], d: u16, ver: u32, out: &mut Vec<(Key, u32)>) -> u32 {
    let Some(min) = routes.iter().map(|r| r.1).min() else {
        return val(d);
    };
    // Past /64 the trie decides: the /64 block holding such a route says so.
    let Some(&n) = LEVELS.iter().find(|&&l| l >= min.min(64) && l > parent) else {
        return TRIE;
    };
    // Per block at `n`: its longest painter (a route of `n` or shorter
    // covering it) and the routes inside it.
    let mut kids: BTreeMap<u64, Kid> = BTreeMap::new();
    for &(hi, len, s) in routes {
        if len <= n {
            let first = hi & mask64(len);
            let step = if n >= 64 { 1 } else { 1u64 << (64 - n) };
            for i in 0..(1u64 << (n - len)) {
                let k = kids.entry(first + i * step).or_default();
                if k.0.is_none_or(|(l, _)| l < len) {
                    k.0 = Some((len, s));
                }
            }
        } else {
            kids.entry(hi & mask64(n)).or_default().1.push((hi, len, s));
        }
    }
    for (hi, (painter, inside)) in kids {
        let ds = painter.map_or(d, |p| p.1);
        let e = subtree(n, &inside, ds, ver, out);
        // A miss answers `d`: an entry saying so is not needed.
        if e != val(d) {
            out.push((Key { hi, level: n, ver }, e));
        }
    }
    entry(KIND_DESCEND, n, d)
}

/// What a lookup of `addr` finds (the data path's walk, for tests):
/// Some(slot) (NONE for no route), None for "ask the trie". `get` reads a
/// hash entry.
pub fn walk(top_word: u64, addr: u128, get: impl Fn(&Key) -> Option<u32>) -> Option<u16> {
    let hi = (addr >> 64) as u64;
    let ver = (top_word >> 32) as u32;
    let mut e = top_word as u32;
    let cover = slot(e);
    for _ in 0..LEVELS.len() {
        if kind(e) != KIND_DESCEND {
            break;
        }
        let lv = level(e);
        if !(LEVELS[0]..=64).contains(&lv) {
            return None;
        }
        e = get(&Key { hi: hi & mask64(lv), level: lv, ver }).unwrap_or(val(slot(e)));
    }
    match kind(e) {
        KIND_VAL if slot(e) == SLOT_INHERIT => Some(cover),
        KIND_VAL => Some(slot(e)),
        _ => None,
    }
}

pub mod table;

#[cfg(test)]
mod tests;
