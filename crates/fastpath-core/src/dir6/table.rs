//! Where the index's entries live: a two-choice hash table of 64-byte
//! buckets, four slots each, in a flat array the data path reads (one
//! cache line per bucket, the two buckets' reads independent). A BPF hash
//! map costs two dependent misses a probe (bucket head, then element); at
//! three probes a lookup that was no cheaper than the trie walk.
//!
//! An entry moves only from its first bucket to its second, copied before
//! it is cleared, so a reader (first bucket first) always finds it; the
//! reader checks the tag again after reading the entry, so a slot cleared
//! and refilled meanwhile is not taken for the moved one. A slot is
//! written entry, address, tag last, and
//! its key is of a version no reader looks for until its /16's word names
//! it (written after); a slot is emptied only once its version rested.

use super::Key;

pub const WAYS: usize = 4;

/// One slot as the data path reads it (struct fp_dir6_slot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Slot {
    pub hi: u64,
    /// version << 8 | level; 0 = empty.
    pub tag: u32,
    pub entry: u32,
}

/// Versions are 24 bits (the tag's upper part).
pub const VER_MASK: u32 = 0x00FF_FFFF;

pub fn tag(k: &Key) -> u32 {
    ((k.ver & VER_MASK) << 8) | u32::from(k.level)
}

/// The data path's hash of a key (fp_dir6_hash()); its two buckets are
/// the low and the high half, masked. A full finalizer (murmur3's): keys
/// of a short level are zero in their low bits, and a single multiply
/// leaves a product's low bits to the factors' low bits alone, which sent
/// every /24 of a /16 to one bucket.
pub fn hash(hi: u64, tag: u32) -> u64 {
    let mut x = hi ^ u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    x = x.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    x ^ (x >> 33)
}

pub fn buckets(hi: u64, tag: u32, n_buckets: usize) -> (usize, usize) {
    debug_assert!(n_buckets.is_power_of_two() && n_buckets <= 1 << 32);
    let h = hash(hi, tag);
    let m = (n_buckets - 1) as u64;
    ((h & m) as usize, ((h >> 32) & m) as usize)
}

/// The bucket array (mapped BPF memory in the daemon, a vector in tests).
pub trait Buckets {
    fn n_buckets(&self) -> usize;
    fn slot(&self, bucket: usize, way: usize) -> Slot;
    /// Writes `s` into an empty slot: entry, then address, then tag.
    fn fill(&mut self, bucket: usize, way: usize, s: Slot);
    /// Empties a slot (its tag).
    fn clear(&mut self, bucket: usize, way: usize);
}

/// Adds `k`; false when both its buckets are full.
pub fn insert(mem: &mut impl Buckets, k: &Key, entry: u32) -> bool {
    let t = tag(k);
    let (b1, b2) = buckets(k.hi, t, mem.n_buckets());
    // The emptier bucket: two choices keep the fullest bucket low.
    let free = |b: usize| (0..WAYS).filter(|&w| mem.slot(b, w).tag == 0).collect::<Vec<_>>();
    let (f1, f2) = (free(b1), free(b2));
    let (b, ways) = if f2.len() > f1.len() { (b2, f2) } else { (b1, f1) };
    if let Some(&w) = ways.first() {
        mem.fill(b, w, Slot { hi: k.hi, tag: t, entry });
        return true;
    }
    // Both full: move one of their entries to its other bucket. Only from
    // its first bucket to its second: a reader searches the first, then
    // the second, and the copy is in place before the original goes, so
    // it finds the entry in one or the other. (The other way a reader could
    // search the first before the copy and the second after the removal.)
    for b in [b1, b2] {
        for w in 0..WAYS {
            let v = mem.slot(b, w);
            let (v1, v2) = buckets(v.hi, v.tag, mem.n_buckets());
            if v1 != b || v2 == b {
                continue;
            }
            if let Some(w2) = (0..WAYS).find(|&w2| mem.slot(v2, w2).tag == 0) {
                mem.fill(v2, w2, v);
                mem.clear(b, w);
                mem.fill(b, w, Slot { hi: k.hi, tag: t, entry });
                return true;
            }
        }
    }
    false
}

/// Where `k` is, if anywhere: the data path's search, first bucket first.
pub fn find(mem: &impl Buckets, k: &Key) -> Option<(usize, usize)> {
    let t = tag(k);
    let (b1, b2) = buckets(k.hi, t, mem.n_buckets());
    [b1, b2].into_iter().find_map(|b| (0..WAYS).find(|&w| mem.slot(b, w).tag == t && mem.slot(b, w).hi == k.hi).map(|w| (b, w)))
}

pub fn get(mem: &impl Buckets, k: &Key) -> Option<u32> {
    find(mem, k).map(|(b, w)| mem.slot(b, w).entry)
}

pub fn remove(mem: &mut impl Buckets, k: &Key) {
    if let Some((b, w)) = find(mem, k) {
        mem.clear(b, w);
    }
}

/// A bucket array in memory (tests, and the BPF tests' picture of the map).
pub struct VecBuckets(pub Vec<[Slot; WAYS]>);

impl VecBuckets {
    pub fn new(n_buckets: usize) -> VecBuckets {
        assert!(n_buckets.is_power_of_two());
        VecBuckets(vec![[Slot::default(); WAYS]; n_buckets])
    }

    pub fn used(&self) -> usize {
        self.0.iter().flatten().filter(|s| s.tag != 0).count()
    }
}

impl Buckets for VecBuckets {
    fn n_buckets(&self) -> usize {
        self.0.len()
    }
    fn slot(&self, bucket: usize, way: usize) -> Slot {
        self.0[bucket][way]
    }
    fn fill(&mut self, bucket: usize, way: usize, s: Slot) {
        self.0[bucket][way] = s;
    }
    fn clear(&mut self, bucket: usize, way: usize) {
        self.0[bucket][way].tag = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_it_holds_and_fills_to_the_brim_before_refusing() {
        let mut mem = VecBuckets::new(64);
        let mut held = Vec::new();
        let mut refused = 0;
        for i in 0..400u64 {
            let k = Key { hi: i.wrapping_mul(0x0001_0000_0001_0000) << 16, level: 48, ver: 1 + (i % 3) as u32 };
            if insert(&mut mem, &k, i as u32) {
                held.push((k, i as u32));
            } else {
                refused += 1;
            }
        }
        assert_eq!(held.len() + refused, 400);
        // Two choices of four ways, and a move, fill most of the 256 slots.
        assert!(held.len() > 220, "{} held", held.len());
        for (k, e) in &held {
            assert_eq!(get(&mem, k), Some(*e));
        }
        for (k, _) in held.iter().step_by(2) {
            remove(&mut mem, k);
        }
        for (i, (k, e)) in held.iter().enumerate() {
            assert_eq!(get(&mem, k), if i % 2 == 0 { None } else { Some(*e) });
        }
        assert_eq!(mem.used(), held.len() / 2);
    }

    #[test]
    fn tags_keep_levels_and_versions_apart() {
        let k = Key { hi: 0x2001_0db8_0000_0000, level: 32, ver: 5 };
        assert_ne!(tag(&k), tag(&Key { level: 40, ..k }));
        assert_ne!(tag(&k), tag(&Key { ver: 6, ..k }));
        assert_ne!(tag(&k), 0);
    }

    /// Every /24 of a /16 (their low 40 bits zero) fits a small table:
    /// the hash spreads them over its buckets.
    #[test]
    fn short_levels_spread_over_the_buckets() {
        let mut mem = VecBuckets::new(1024);
        for i in 0..256u64 {
            let k = Key { hi: (0x2001u64 << 48) | (i << 40), level: 24, ver: 1 };
            assert!(insert(&mut mem, &k, i as u32), "/24 number {i} refused");
        }
        let used: std::collections::HashSet<usize> = (0..256u64)
            .map(|i| find(&mem, &Key { hi: (0x2001u64 << 48) | (i << 40), level: 24, ver: 1 }).expect("held").0)
            .collect();
        assert!(used.len() > 200, "{} buckets for 256 keys", used.len());
    }
}

#[cfg(test)]
mod load {
    use super::*;

    /// Keys of every level (several versions) fill three quarters of the
    /// slots before the first refusal; the daemon sizes for under two
    /// thirds (eight slots a route, about five entries a route).
    #[test]
    fn fills_past_two_thirds_before_the_first_refusal() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3 {
            let mut mem = VecBuckets::new(8192);
            let mut n = 0;
            loop {
                let lv = [24u8, 32, 40, 48, 56, 64][(next() % 6) as usize];
                let hi = ((next() & 0x0003_ffff_ffff_ffff) | (0x2001 << 48)) & (u64::MAX << (64 - lv));
                let k = Key { hi, level: lv, ver: (next() % 50) as u32 + 1 };
                if find(&mem, &k).is_some() {
                    continue;
                }
                if !insert(&mut mem, &k, 1) {
                    break;
                }
                n += 1;
            }
            assert!(n * 3 > 8192 * WAYS * 2, "first refusal after {n} of {} slots", 8192 * WAYS);
        }
    }
}
