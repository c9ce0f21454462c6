//! The IPv6 multibit index (fp_fib6_dir16, fp_fib6_dir, fp_fib6_vals) as
//! `MapWriter` keeps it beside fp_fib6: fastpath_core::dir6 decides what
//! each /16 holds; this writes it. The first level is mapped into the
//! daemon: a /16 switches to its new entries with one aligned 8-byte store,
//! so the data path reads the old word or the new, never half of each.

use std::net::Ipv6Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use fastpath_bpf::intf::{self, fp_dir6_key, fp_route};
use fastpath_core::dir6::{self, Dir6, Dir6Sink, Key};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

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

fn key(k: &Key) -> fp_dir6_key {
    fp_dir6_key { hi: k.hi, ver: k.ver, level: k.level, ..Default::default() }
}

/// fp_fib6_dir16 mapped read-write into this process.
struct Tops {
    base: NonNull<u64>,
}

// SAFETY: the mapping belongs to this value alone; the data path only reads it.
unsafe impl Send for Tops {}

const TOPS_LEN: usize = dir6::TOPS * size_of::<u64>();

impl Tops {
    fn new(map: &MapHandle) -> std::io::Result<Tops> {
        // SAFETY: maps the whole array map (its size exactly) shared; the
        // pointer is checked before use and unmapped on drop.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), TOPS_LEN, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, map.as_fd().as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Tops { base: NonNull::new(p.cast()).expect("mmap returned NULL") })
    }

    fn store(&self, top: u16, word: u64) {
        // SAFETY: top < 65536 entries of a live mapping of that many u64s,
        // page-aligned so each is aligned: one volatile 8-byte store.
        unsafe { self.base.as_ptr().add(usize::from(top)).write_volatile(word) }
    }

    fn load(&self, top: u16) -> u64 {
        // SAFETY: as in `store`.
        unsafe { self.base.as_ptr().add(usize::from(top)).read_volatile() }
    }
}

impl Drop for Tops {
    fn drop(&mut self) {
        // SAFETY: exactly the region mmap returned.
        unsafe { libc::munmap(self.base.as_ptr().cast(), TOPS_LEN) };
    }
}

struct Sink<'a> {
    tops: &'a Tops,
    dir: &'a MapHandle,
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
        for chunk in entries.chunks(BATCH) {
            let keys: Vec<u8> = chunk.iter().flat_map(|(k, _)| bytes(&key(k)).to_vec()).collect();
            let vals: Vec<u8> = chunk.iter().flat_map(|(_, e)| e.to_ne_bytes()).collect();
            let out = crate::batch::update(self.dir, &keys, &vals, chunk.len());
            if out.landed < chunk.len() {
                // The batch call may be refused as a whole (old kernel): one by one then.
                for (k, e) in &chunk[out.landed..] {
                    if self.dir.update(bytes(&key(k)), &e.to_ne_bytes(), MapFlags::ANY).is_err() {
                        return false;
                    }
                }
            }
        }
        true
    }

    fn del(&mut self, keys: &[Key]) {
        // Missing keys (a refused put) stop a batch delete: one by one.
        for k in keys {
            let _ = self.dir.delete(bytes(&key(k)));
        }
    }

    fn set_top(&mut self, top: u16, word: u64) {
        self.tops.store(top, word);
    }
}

/// Entries per batch call.
const BATCH: usize = 4096;

/// The index and where it is written.
pub(super) struct Fib6Dir {
    index: Dir6<Val>,
    tops: Tops,
    dir: MapHandle,
    vals: MapHandle,
}

/// How full the index is, for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dir6Usage {
    /// Distinct route values holding a slot, of `vals_capacity`.
    pub vals: usize,
    pub vals_capacity: usize,
    /// Hash entries of the current versions, of `entries_capacity`.
    pub entries: usize,
    pub entries_capacity: usize,
    /// /16s whose lookups all go to the trie (a value without a slot, a full map).
    pub trie_tops: usize,
    /// Routes' values that found no slot.
    pub unslotted: usize,
}

impl Fib6Dir {
    pub(super) fn new(dir16: &MapHandle, dir: &MapHandle, vals: &MapHandle) -> std::io::Result<Fib6Dir> {
        let dup = |m: &MapHandle| MapHandle::try_from(m).map_err(|e| std::io::Error::other(e.to_string()));
        Ok(Fib6Dir { index: Dir6::new(QUARANTINE), tops: Tops::new(dir16)?, dir: dup(dir)?, vals: dup(vals)? })
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
        let mut max_ver = (0..=u16::MAX).map(|t| (self.tops.load(t) >> 32) as u32).max().unwrap_or(0);
        for k in self.dir.keys() {
            let k = from_bytes::<fp_dir6_key>(&k);
            max_ver = max_ver.max(k.ver);
            old_keys.push(Key { hi: k.hi, level: k.level, ver: k.ver });
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
            entries_capacity: self.dir.info().map_or(0, |i| i.info.max_entries as usize),
            trie_tops: u.trie_tops,
            unslotted: u.unslotted,
        }
    }
}
