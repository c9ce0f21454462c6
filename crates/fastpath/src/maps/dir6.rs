//! The IPv6 multibit index (fp_fib6_dir16, fp_fib6_dir, fp_fib6_vals) as
//! `MapWriter` keeps it beside fp_fib6: fastpath_core::dir6 decides what
//! each /16 holds; this writes it. The first level is mapped into the
//! daemon: a /16 switches to its new entries with one aligned 8-byte store,
//! so the data path reads the old word or the new, never half of each.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use fastpath_bpf::intf::{self, fp_dir6_bucket, fp_route};
use fastpath_core::dir6::table::{self, Buckets, Slot, WAYS};
use fastpath_core::dir6::{self, Dir6, Dir6Sink, Key};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::mapped::Mapped;
use super::{bytes, from_bytes};

/// Longer than any XDP program run by far: a program that read a /16's
/// old word finds its entries and values still there.
const QUARANTINE: Duration = Duration::from_secs(1);

const _: () = assert!(dir6::TRIE == intf::FP_DIR6_TRIE && dir6::KIND_VAL == intf::FP_DIR6_VAL && dir6::KIND_DESCEND == intf::FP_DIR6_DESCEND);
const _: () = assert!(dir6::SLOT_NONE as u32 == intf::FP_DIR6_NONE && dir6::SLOT_INHERIT as u32 == intf::FP_DIR6_INHERIT);
const _: () = assert!(dir6::MAX_VALS as u32 == intf::FP_DIR6_VALS - 1 && dir6::TOPS as u32 == intf::FP_DIR6_TOPS);
const _: () = assert!(dir6::LEVELS.len() == intf::FP_DIR6_HOPS as usize);

type Val = [u8; size_of::<fp_route>()];

fn val(v: &fp_route) -> Val {
    bytes(v).try_into().expect("an fp_route's bytes")
}

const _: () = assert!(size_of::<fp_dir6_bucket>() == WAYS * size_of::<Slot>() && table::VER_MASK == intf::FP_DIR6_VER_MASK);
const _: () = assert!(WAYS == intf::FP_DIR6_WAYS as usize);

impl Buckets for Mapped<[Slot; WAYS]> {
    fn n_buckets(&self) -> usize {
        self.len()
    }

    fn slot(&self, bucket: usize, way: usize) -> Slot {
        // SAFETY: a live mapping of buckets, `way` < WAYS by the array type; only this process writes it.
        unsafe { std::ptr::addr_of!((*self.ptr(bucket))[way]).read_volatile() }
    }

    fn fill(&mut self, bucket: usize, way: usize, s: Slot) {
        let p = self.ptr(bucket);
        // SAFETY: as in `slot`. Volatile stores in this order, which x86
        // keeps for other CPUs: a reader that sees the tag sees the rest
        // (and no reader asks for the tag before its /16's word names it).
        unsafe {
            std::ptr::addr_of_mut!((*p)[way].entry).write_volatile(s.entry);
            std::ptr::addr_of_mut!((*p)[way].hi).write_volatile(s.hi);
            std::ptr::addr_of_mut!((*p)[way].tag).write_volatile(s.tag);
        }
    }

    fn clear(&mut self, bucket: usize, way: usize) {
        // SAFETY: as in `slot`.
        unsafe { std::ptr::addr_of_mut!((*self.ptr(bucket))[way].tag).write_volatile(0) }
    }
}

struct Sink<'a> {
    tops: &'a Mapped<u64>,
    dir: &'a mut Mapped<[Slot; WAYS]>,
    vals: &'a MapHandle,
}

impl Dir6Sink<Val> for Sink<'_> {
    fn set_val(&mut self, slot: u16, v: &Val) -> bool {
        match self.vals.update(&u32::from(slot).to_ne_bytes(), v, MapFlags::ANY) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("fp_fib6_vals slot {slot}: {e}; its routes' /16s use the trie");
                false
            }
        }
    }

    fn put(&mut self, entries: &[(Key, u32)]) -> bool {
        entries.iter().all(|(k, e)| table::insert(self.dir, k, *e))
    }

    fn del(&mut self, keys: &[Key]) {
        for k in keys {
            table::remove(self.dir, k);
        }
    }

    fn set_top(&mut self, top: u16, word: u64) {
        // One aligned 8-byte store: entry and version together.
        self.tops.store(usize::from(top), word);
    }
}

/// The index and where it is written.
pub(super) struct Fib6Dir {
    index: Dir6<Val>,
    tops: Mapped<u64>,
    dir: Mapped<[Slot; WAYS]>,
    vals: MapHandle,
}

/// How full the index is, for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dir6Usage {
    /// Distinct route values holding a slot, of `vals_capacity`.
    pub vals: usize,
    pub vals_capacity: usize,
    /// Entries of the current versions, of `entries_capacity` slots.
    pub entries: usize,
    pub entries_capacity: usize,
    /// /16s whose lookups all go to the trie (a value without a slot, a full map).
    pub trie_tops: usize,
    /// Routes' values that found no slot.
    pub unslotted: usize,
}

impl Fib6Dir {
    pub(super) fn new(dir16: &MapHandle, dir: &MapHandle, vals: &MapHandle) -> std::io::Result<Fib6Dir> {
        let buckets = dir.info().map_err(|e| std::io::Error::other(e.to_string()))?.info.max_entries as usize;
        Ok(Fib6Dir {
            index: Dir6::new(QUARANTINE),
            tops: Mapped::new(dir16, dir6::TOPS)?,
            dir: Mapped::new(dir, buckets)?,
            vals: MapHandle::try_from(vals).map_err(|e| std::io::Error::other(e.to_string()))?,
        })
    }

    /// After fp_fib6 took the route (in effect at the next `flush`).
    pub(super) fn upsert(&mut self, addr: Ipv6Addr, len: u8, v: &fp_route) {
        let Fib6Dir { index, tops, dir, vals } = self;
        index.upsert(u128::from(addr), len, val(v), Instant::now(), &mut Sink { tops, dir, vals });
    }

    /// After fp_fib6 let the route go (in effect at the next `flush`).
    pub(super) fn delete(&mut self, addr: Ipv6Addr, len: u8) {
        self.index.delete(u128::from(addr), len);
    }

    /// Switches the changed /16s to their new entries; deletes what rested.
    pub(super) fn flush(&mut self) {
        let Fib6Dir { index, tops, dir, vals } = self;
        index.flush(Instant::now(), &mut Sink { tops, dir, vals });
    }

    /// Takes over the index a dead daemon left (pinned maps) with the
    /// routes its fp_fib6 holds: values keep their slots, versions go on
    /// past its, and its entries are deleted once every /16 has its new
    /// word and the quarantine is over.
    pub(super) fn adopt(&mut self, routes: impl Iterator<Item = (Ipv6Addr, u8, fp_route)>) {
        let mut old_vals = Vec::new();
        for slot in 1..=dir6::MAX_VALS {
            if let Ok(Some(b)) = self.vals.lookup(&u32::from(slot).to_ne_bytes(), MapFlags::ANY) {
                let v = from_bytes::<fp_route>(&b);
                if v.type_ != 0 {
                    old_vals.push((slot, val(&v)));
                }
            }
        }
        let now = Instant::now();
        self.index.adopt_slots(old_vals, now);
        let mut old_keys = Vec::new();
        let mut max_ver = (0..dir6::TOPS).map(|t| (self.tops.load(t) >> 32) as u32).max().unwrap_or(0);
        for b in 0..self.dir.n_buckets() {
            for w in 0..WAYS {
                let s = self.dir.slot(b, w);
                if s.tag != 0 {
                    max_ver = max_ver.max(s.tag >> 8);
                    old_keys.push(Key { hi: s.hi, level: s.tag as u8, ver: s.tag >> 8 });
                }
            }
        }
        self.index.skip_versions(max_ver);
        {
            let Fib6Dir { index, tops, dir, vals } = self;
            let sink = &mut Sink { tops, dir, vals };
            for (a, l, v) in routes {
                index.upsert(u128::from(a), l, val(&v), now, sink);
            }
        }
        self.index.mark_all();
        self.flush();
        self.index.retire_foreign(old_keys, Instant::now());
    }

    pub(super) fn usage(&self) -> Dir6Usage {
        let u = self.index.usage();
        Dir6Usage {
            vals: u.vals,
            vals_capacity: usize::from(dir6::MAX_VALS),
            entries: u.entries,
            entries_capacity: self.dir.n_buckets() * WAYS,
            trie_tops: u.trie_tops,
            unslotted: u.unslotted,
        }
    }
}
