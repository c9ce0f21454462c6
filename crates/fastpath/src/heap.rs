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
    last: Option<Instant>,
}

impl Trimmer {
    /// Dirty from the start, and due at the first round: the daemon's
    /// first dump and recompute are done by the time its loop runs.
    pub fn new() -> Self {
        Trimmer { dirty: true, last: None }
    }

    /// The tables were updated: garbage was made.
    pub fn updated(&mut self) {
        self.dirty = true;
    }

    /// From the daemon's periodic round: trims when due; how long it took.
    pub fn tick(&mut self) -> Option<Duration> {
        self.due(Instant::now()).then(trim)
    }

    /// Whether a trim is due at `now` (it is then taken as done).
    fn due(&mut self, now: Instant) -> bool {
        if !self.dirty || self.last.is_some_and(|l| now.saturating_duration_since(l) < EVERY) {
            return false;
        }
        self.dirty = false;
        self.last = Some(now);
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_after_updates_at_most_every_ten_seconds() {
        let mut t = Trimmer::new();
        let t0 = Instant::now();
        assert!(t.due(t0), "the start's own garbage, at the first round");
        assert!(!t.due(t0 + EVERY * 5), "a quiet daemon is left alone");
        t.updated();
        t.updated();
        assert!(t.due(t0 + EVERY * 5));
        t.updated();
        assert!(!t.due(t0 + EVERY * 5 + Duration::from_secs(9)), "updated, but trimmed 9 s ago");
        assert!(t.due(t0 + EVERY * 6));
        assert!(!t.due(t0 + EVERY * 7));
    }
}
