//! The IPv4 /24 index (fp_fib4_dir, fp_fib4_vals) as `MapWriter` keeps it
//! beside fp_fib4: fastpath_core::dir24 decides what each block holds; this
//! writes it. The index is mapped into the daemon (BPF_F_MMAPABLE), so
//! painting a /8 is 65,536 stores, not as many syscalls. Each entry is an
//! aligned u16, written whole: the data path reads the old entry or the
//! new, never half of each.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use fastpath_bpf::intf::{self, fp_dir24_elem, fp_route};
use fastpath_core::dir24::{self, Dir24, DirSink};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::mapped::Mapped;
use super::{bytes, from_bytes};

/// Longer than any XDP program run by far: a program that read a slot
/// number just before its value went finds the old value still there.
const QUARANTINE: Duration = Duration::from_secs(1);

const _: () = assert!(dir24::TRIE as u32 == intf::FP_DIR24_TRIE && dir24::NONE as u32 == intf::FP_DIR24_NONE);
const _: () = assert!(dir24::MAX_VALS as u32 == intf::FP_DIR24_VALS - 1 && dir24::BLOCKS as u32 == intf::FP_DIR24_ELEMS * intf::FP_DIR24_PER_ELEM);
const _: () = assert!(dir24::DESCEND as u32 == intf::FP_DIR16_DESCEND && dir24::TOPS as u32 == intf::FP_DIR16_ELEMS * intf::FP_DIR24_PER_ELEM);
const _: () = assert!(size_of::<fp_dir24_elem>().is_multiple_of(8), "array elements are 8-byte steps: the mapping is one flat u16 array");

type Val = [u8; size_of::<fp_route>()];

/// A route value as the index deduplicates it: its bytes.
fn val(v: &fp_route) -> Val {
    bytes(v).try_into().expect("an fp_route's bytes")
}

struct Sink<'a> {
    mem: &'a Mapped<u16>,
    top: &'a Mapped<u16>,
    vals: &'a MapHandle,
    /// Values only, no entries (an adoption computes the whole index
    /// before its sweep writes any entry).
    quiet: bool,
}

impl DirSink<Val> for Sink<'_> {
    fn set_val(&mut self, slot: u16, v: &Val) -> bool {
        match self.vals.update(&u32::from(slot).to_ne_bytes(), v, MapFlags::ANY) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("fp_fib4_vals slot {slot}: {e}; its routes' blocks use the trie");
                false
            }
        }
    }

    fn set_block(&mut self, block: u32, entry: u16) {
        if !self.quiet {
            self.mem.store(block as usize, entry);
        }
    }

    fn set_top(&mut self, top: u32, entry: u16) {
        if !self.quiet {
            self.top.store(top as usize, entry);
        }
    }

    fn block(&self, block: u32) -> u16 {
        self.mem.load(block as usize)
    }
}

/// The index and where it is written.
pub(super) struct Fib4Dir {
    index: Dir24<Val>,
    mem: Mapped<u16>,
    top: Mapped<u16>,
    vals: MapHandle,
    /// Nothing written yet: the first route write sweeps first, so blocks
    /// no route covers say NONE rather than send their lookups to the trie.
    /// (`adopt` sweeps instead: a pinned index is live until then.)
    fresh: bool,
}

/// How full the index is, for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirUsage {
    /// Distinct route values holding a slot, of `vals_capacity`.
    pub vals: usize,
    pub vals_capacity: usize,
    /// /24 blocks a route longer than /24 sends to the trie.
    pub trie_blocks: usize,
    /// Routes whose value found no slot (their blocks use the trie).
    pub unslotted: usize,
}

impl Fib4Dir {
    pub(super) fn new(dir: &MapHandle, dir16: &MapHandle, vals: &MapHandle) -> std::io::Result<Fib4Dir> {
        let vals = MapHandle::try_from(vals).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Fib4Dir {
            index: Dir24::new(QUARANTINE),
            mem: Mapped::new(dir, dir24::BLOCKS)?,
            top: Mapped::new(dir16, dir24::TOPS)?,
            vals,
            fresh: true,
        })
    }

    fn sweep_if_fresh(&mut self) {
        if std::mem::take(&mut self.fresh) {
            let Fib4Dir { index, mem, top, vals, .. } = self;
            index.sweep(&mut Sink { mem, top, vals, quiet: false });
        }
    }

    /// After fp_fib4 took the route.
    pub(super) fn upsert(&mut self, addr: Ipv4Addr, len: u8, v: &fp_route) {
        self.sweep_if_fresh();
        let sink = &mut Sink { mem: &self.mem, top: &self.top, vals: &self.vals, quiet: false };
        self.index.upsert(u32::from(addr), len, val(v), Instant::now(), sink);
    }

    /// After fp_fib4 let the route go.
    pub(super) fn delete(&mut self, addr: Ipv4Addr, len: u8) {
        self.sweep_if_fresh();
        let sink = &mut Sink { mem: &self.mem, top: &self.top, vals: &self.vals, quiet: false };
        self.index.delete(u32::from(addr), len, Instant::now(), sink);
    }

    /// Takes over the index a dead daemon left (pinned maps) with the
    /// routes its fp_fib4 holds: values keep their slots, so no block ever
    /// points at another route's value. The old programs forward by that
    /// index meanwhile, so no entry is written until the whole index is
    /// known (painted route by route, a /8 would take its /16s' blocks for
    /// a moment); then the sweep moves each entry from its old answer to
    /// its new one in one store.
    pub(super) fn adopt(&mut self, routes: impl Iterator<Item = (Ipv4Addr, u8, fp_route)>) {
        let mut old = Vec::new();
        for slot in 1..=dir24::MAX_VALS {
            if let Ok(Some(b)) = self.vals.lookup(&u32::from(slot).to_ne_bytes(), MapFlags::ANY) {
                let v = from_bytes::<fp_route>(&b);
                if v.type_ != 0 {
                    old.push((slot, val(&v)));
                }
            }
        }
        self.index.adopt_slots(old);
        self.fresh = false;
        let now = Instant::now();
        {
            let Fib4Dir { index, mem, top, vals, .. } = self;
            let sink = &mut Sink { mem, top, vals, quiet: true };
            for (a, l, v) in routes {
                index.upsert(u32::from(a), l, val(&v), now, sink);
            }
        }
        let Fib4Dir { index, mem, top, vals, .. } = self;
        index.sweep(&mut Sink { mem, top, vals, quiet: false });
        // Only now does no entry name an unclaimed slot: its rest starts.
        self.index.release_adopted(Instant::now());
    }

    pub(super) fn usage(&self) -> DirUsage {
        DirUsage {
            vals: self.index.vals_used(),
            vals_capacity: usize::from(dir24::MAX_VALS),
            trie_blocks: self.index.trie_blocks(),
            unslotted: self.index.unslotted(),
        }
    }
}
