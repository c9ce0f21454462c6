//! The UMEM: one anonymous mapping of fixed-size chunks that every socket
//! of a forwarder thread shares (XDP_SHARED_UMEM), so a frame received on
//! one interface is transmitted on another by passing its address, without
//! a copy. Single-threaded: the free list needs no lock.

use std::ptr::NonNull;

use anyhow::{bail, Result};
use fastpath_bpf::intf;

pub const FRAME_SIZE: u32 = intf::FP_XSK_FRAME_SIZE;

pub struct Umem {
    base: NonNull<u8>,
    len: usize,
    /// Chunk addresses (offsets into the mapping) that we hold and no ring does.
    free: Vec<u64>,
}

// SAFETY: the mapping is owned by the one thread that holds the Umem; it is
// only ever moved into that thread after setup.
unsafe impl Send for Umem {}

impl Umem {
    pub fn new(frames: u32) -> Result<Self> {
        let len = frames as usize * FRAME_SIZE as usize;
        // SAFETY: fresh private anonymous mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("mmap of a {len}-byte UMEM: {}", std::io::Error::last_os_error());
        }
        let base = NonNull::new(p as *mut u8).ok_or_else(|| anyhow::anyhow!("mmap returned null"))?;
        // Popped from the end: low addresses first, for locality.
        let free = (0..frames as u64).rev().map(|i| i * FRAME_SIZE as u64).collect();
        Ok(Umem { base, len, free })
    }

    /// What XDP_UMEM_REG registers.
    pub fn reg(&self) -> libc::xdp_umem_reg {
        libc::xdp_umem_reg {
            addr: self.base.as_ptr() as u64,
            len: self.len as u64,
            chunk_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        }
    }

    pub fn alloc(&mut self) -> Option<u64> {
        self.free.pop()
    }

    pub fn free(&mut self, addr: u64) {
        // Descriptors point into the chunk (past the headroom): keep its start.
        self.free.push(addr & !(FRAME_SIZE as u64 - 1));
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The bytes [addr, addr + len) of one chunk. None if they leave the
    /// chunk (a descriptor the kernel should never give).
    pub fn frame_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let chunk = addr & !(FRAME_SIZE as u64 - 1);
        if addr as usize + len > chunk as usize + FRAME_SIZE as usize || addr as usize + len > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above); the frame is ours while the
        // descriptor is between the RX ring and a TX/fill ring.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(addr as usize), len) })
    }

    /// Hint the CPU to fetch a frame's first cache line ahead of use.
    #[inline(always)]
    pub fn prefetch(&self, addr: u64) {
        #[cfg(target_arch = "x86_64")]
        if (addr as usize) < self.len {
            // SAFETY: a hint on an address inside our mapping; never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    self.base.as_ptr().add(addr as usize) as *const i8,
                    std::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = addr;
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: our mapping; the sockets that registered it are closed first
        // (they are dropped before the Umem, see socket::QueueSockets).
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}
