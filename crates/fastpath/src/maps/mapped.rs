//! An mmapable array map mapped read-write into the daemon: the indexes
//! in front of the FIB tries (dir24, dir6) are painted with plain stores,
//! not a syscall per entry. Every access is volatile: the data path reads
//! the memory concurrently, and each element is written whole.

use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;

use libbpf_rs::MapHandle;

/// `len` elements of T: the whole array map.
pub(super) struct Mapped<T> {
    base: NonNull<T>,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone; the data path only reads it.
unsafe impl<T> Send for Mapped<T> {}

impl<T: Copy> Mapped<T> {
    pub(super) fn new(map: &MapHandle, len: usize) -> std::io::Result<Mapped<T>> {
        // SAFETY: maps the whole array map (its size exactly) shared; the
        // pointer is checked before use and unmapped on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * size_of::<T>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped { base: NonNull::new(p.cast()).expect("mmap returned NULL"), len })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Element `i`, for field-by-field volatile access.
    pub(super) fn ptr(&self, i: usize) -> *mut T {
        assert!(i < self.len);
        // SAFETY: in bounds (asserted) of a live mapping.
        unsafe { self.base.as_ptr().add(i) }
    }

    /// One aligned volatile store of element `i`.
    pub(super) fn store(&self, i: usize, v: T) {
        // SAFETY: in bounds of a live, page-aligned mapping of T.
        unsafe { self.ptr(i).write_volatile(v) }
    }

    pub(super) fn load(&self, i: usize) -> T {
        // SAFETY: as in `store`; only this process writes it.
        unsafe { self.ptr(i).read_volatile() }
    }
}

impl<T> Drop for Mapped<T> {
    fn drop(&mut self) {
        // SAFETY: exactly the region mmap returned.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len * size_of::<T>()) };
    }
}
