//! Giving the memory of table updates back to the system.
//!
//! Recomputing, reconciling and publishing the tables with a full table
//! builds and drops millions of small allocations (tree nodes of the
//! desired, applied and published tables, the route index). glibc keeps
//! the freed pages inside its heap, so the daemon's resident size only grew
//! with the updates it made; `malloc_trim` hands whole free pages back.

use std::time::{Duration, Instant};

/// At most this often: a trim walks every free chunk of the heap.
const EVERY: Duration = Duration::from_secs(10);

/// Trims the heap some time after table updates, never in a quiet daemon.
pub struct Trimmer {
    dirty: bool,
    last: Instant,
}

impl Trimmer {
    /// Dirty from the start: the daemon's first dump and recompute.
    pub fn new() -> Self {
        Trimmer { dirty: true, last: Instant::now() }
    }

    /// The tables were updated: garbage was made.
    pub fn updated(&mut self) {
        self.dirty = true;
    }

    /// From the daemon's periodic round: trims when due; how long it took.
    pub fn tick(&mut self) -> Option<Duration> {
        if !self.dirty || self.last.elapsed() < EVERY {
            return None;
        }
        self.dirty = false;
        self.last = Instant::now();
        Some(trim())
    }
}

/// Returns the heap's free pages to the kernel; how long that took.
fn trim() -> Duration {
    let t = Instant::now();
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of glibc's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
    t.elapsed()
}
