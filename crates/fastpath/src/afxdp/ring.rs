//! The four AF_XDP rings (fill, completion, RX, TX): single-producer,
//! single-consumer arrays shared with the kernel through mmap. Each side
//! keeps a cached copy of the other side's index and reloads it only when
//! the cache says the ring is full (producer) or empty (consumer), so a
//! batch costs one shared-cache-line read at most.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Result};

/// One mmapped ring; unmapped on drop.
pub struct Mapped<T> {
    base: NonNull<libc::c_void>,
    len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    size: u32,
}

impl<T> Mapped<T> {
    /// Maps the ring of `size` entries the kernel placed at page offset `pgoff`.
    pub fn map(fd: BorrowedFd<'_>, off: &libc::xdp_ring_offset, pgoff: u64, size: u32) -> Result<Self> {
        if !size.is_power_of_two() {
            bail!("ring size {size} is not a power of two");
        }
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("mmap of an AF_XDP ring: {}", std::io::Error::last_os_error());
        }
        let base = NonNull::new(p).ok_or_else(|| anyhow::anyhow!("mmap returned null"))?;
        let at = |o: u64| (p as usize + o as usize) as *mut u8;
        Ok(Mapped {
            base,
            len,
            producer: at(off.producer) as *const AtomicU32,
            consumer: at(off.consumer) as *const AtomicU32,
            flags: at(off.flags) as *const AtomicU32,
            desc: at(off.desc) as *mut T,
            mask: size - 1,
            size,
        })
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: points into our live mapping, u32-aligned by the kernel.
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as prod().
        unsafe { &*self.consumer }
    }

    /// XDP_RING_NEED_WAKEUP: the kernel wants a syscall to make progress.
    pub fn needs_wakeup(&self) -> bool {
        // SAFETY: as prod().
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY: masked index within the mapped array.
        unsafe { self.desc.add((idx & self.mask) as usize) }
    }
}

impl<T> Drop for Mapped<T> {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr(), self.len) };
    }
}

/// We produce, the kernel consumes (fill, TX).
pub struct Producer<T> {
    ring: Mapped<T>,
    head: u32,
    cached_cons: u32,
}

impl<T: Copy> Producer<T> {
    pub fn new(ring: Mapped<T>) -> Self {
        let head = ring.prod().load(Ordering::Relaxed);
        let cached_cons = ring.cons().load(Ordering::Acquire);
        Producer { ring, head, cached_cons }
    }

    /// Free entries, reloading the consumer index only when needed.
    pub fn free(&mut self, want: u32) -> u32 {
        let free = self.ring.size - self.head.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        self.cached_cons = self.ring.cons().load(Ordering::Acquire);
        self.ring.size - self.head.wrapping_sub(self.cached_cons)
    }

    /// Writes one entry (the caller checked `free`); visible after `submit`.
    pub fn push(&mut self, v: T) {
        // SAFETY: the entry at head is ours until the producer index passes it.
        unsafe { self.ring.slot(self.head).write(v) };
        self.head = self.head.wrapping_add(1);
    }

    /// Publishes every pushed entry to the kernel.
    pub fn submit(&mut self) {
        self.ring.prod().store(self.head, Ordering::Release);
    }

    /// Entries the kernel has not consumed yet.
    pub fn outstanding(&mut self) -> u32 {
        self.cached_cons = self.ring.cons().load(Ordering::Acquire);
        self.head.wrapping_sub(self.cached_cons)
    }

    pub fn needs_wakeup(&self) -> bool {
        self.ring.needs_wakeup()
    }
}

/// The kernel produces, we consume (RX, completion).
pub struct Consumer<T> {
    ring: Mapped<T>,
    tail: u32,
    cached_prod: u32,
}

impl<T: Copy> Consumer<T> {
    pub fn new(ring: Mapped<T>) -> Self {
        let tail = ring.cons().load(Ordering::Relaxed);
        Consumer { ring, tail, cached_prod: tail }
    }

    /// Up to `max` entries ready to read from `tail()` on.
    pub fn available(&mut self, max: u32) -> u32 {
        let mut n = self.cached_prod.wrapping_sub(self.tail);
        if n < max {
            self.cached_prod = self.ring.prod().load(Ordering::Acquire);
            n = self.cached_prod.wrapping_sub(self.tail);
        }
        n.min(max)
    }

    /// Entry `i` past the tail (i < what `available` returned).
    pub fn get(&self, i: u32) -> T {
        // SAFETY: published by the kernel (Acquire in available) and not yet released.
        unsafe { self.ring.slot(self.tail.wrapping_add(i)).read() }
    }

    /// Hands `n` entries back to the kernel.
    pub fn release(&mut self, n: u32) {
        self.tail = self.tail.wrapping_add(n);
        self.ring.cons().store(self.tail, Ordering::Release);
    }
}
