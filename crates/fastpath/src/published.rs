//! The tables as `status`, `routes`, metrics and FPM reports show them: one
//! copy all readers share (`Arc<Desired>`). A route-only or neighbour-only
//! change cannot update it in place while a reader (the published snapshot,
//! always) holds it, and with a full table (1.1M routes) copying it costs
//! ~11 ms and dropping the old copy about as much: most of the daemon's work
//! per BGP update once the change itself got cheap (route_delta). So such
//! changes to a big table are queued and folded into a new copy at most
//! every `LAG`: the maps have them at once, only what readers see lags.
//! Tables small enough to copy cheaply are copied at once, as before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fastpath_core::overflow::Offload;
use fastpath_core::route_delta::FibDelta;
use fastpath_core::tables::Desired;

/// How long readers may see the tables without the latest route-only or
/// neighbour-only changes (the main loop looks at least every IDLE_POLL on top).
pub const LAG: Duration = Duration::from_millis(500);
/// FIB entries (both families) up to which a copy per change is cheap (~1 ms).
const COPY_FREE: usize = 65_536;

pub struct Published {
    tables: Arc<Desired>,
    /// Route-only changes written to the maps but not yet to `tables`, in order.
    queued: Vec<FibDelta>,
    /// When `queued` must be folded in (set by its first entry).
    due: Option<Instant>,
    copy_free: usize,
}

impl Published {
    pub fn new(tables: Desired) -> Published {
        Published { tables: Arc::new(tables), queued: Vec::new(), due: None, copy_free: COPY_FREE }
    }

    /// What a full reconcile applied: replaces everything, queue included.
    pub fn replace(&mut self, tables: Desired) {
        self.tables = Arc::new(tables);
        self.queued.clear();
        self.due = None;
    }

    /// The shared copy (without the queued changes, at most LAG old).
    pub fn tables(&self) -> &Arc<Desired> {
        &self.tables
    }

    /// The last full compute's offload result; deltas never change it
    /// (route_delta declines whenever something did not fit).
    pub fn offload(&self) -> &Offload {
        &self.tables.offload
    }

    /// A delta written to the maps. True when the shared copy
    /// has it now (publish it), false when it was queued.
    pub fn apply(&mut self, delta: FibDelta, now: Instant) -> bool {
        if self.queued.is_empty() {
            if let Some(t) = Arc::get_mut(&mut self.tables) {
                delta.apply_to(t);
                return true;
            }
            if self.tables.fib4.len() + self.tables.fib6.len() <= self.copy_free {
                delta.apply_to(Arc::make_mut(&mut self.tables));
                return true;
            }
        }
        self.queued.push(delta);
        self.due.get_or_insert(now + LAG);
        false
    }

    /// Folds the queued changes into a new copy once they are due. True
    /// when it did (publish it).
    pub fn catch_up(&mut self, now: Instant) -> bool {
        if self.due.is_none_or(|t| now < t) {
            return false;
        }
        let t = Arc::make_mut(&mut self.tables);
        for d in self.queued.drain(..) {
            d.apply_to(t);
        }
        self.due = None;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use fastpath_core::tables::{RouteAction, RouteEntry};

    use super::*;

    fn fwd(nh_id: u32) -> RouteEntry {
        RouteEntry { action: RouteAction::Forward { nh_id }, mtu: 0 }
    }

    fn delta(third: u8, e: Option<RouteEntry>) -> FibDelta {
        let mut d = FibDelta::default();
        d.v4.insert((Ipv4Addr::new(203, 0, third, 0), 24), e);
        d
    }

    fn tables(n: u8) -> Desired {
        let mut d = Desired::default();
        for i in 0..n {
            d.fib4.insert((Ipv4Addr::new(198, 51, i, 0), 24), fwd(1));
        }
        d
    }

    #[test]
    fn an_unshared_or_small_copy_takes_a_change_at_once() {
        let now = Instant::now();
        let mut p = Published::new(tables(4));
        assert!(p.apply(delta(1, Some(fwd(2))), now));
        let reader = Arc::clone(p.tables());
        assert!(p.apply(delta(2, Some(fwd(2))), now));
        assert_eq!(p.tables().fib4.len(), 6);
        assert_eq!(reader.fib4.len(), 5, "a reader keeps the copy it took");
        assert!(!p.catch_up(now + LAG));
    }

    #[test]
    fn a_big_shared_copy_takes_changes_in_order_once_due() {
        let now = Instant::now();
        let mut p = Published::new(tables(8));
        p.copy_free = 4;
        let reader = Arc::clone(p.tables());
        let changes = [delta(1, Some(fwd(2))), delta(2, Some(fwd(2))), delta(1, Some(fwd(3))), delta(2, None)];
        for (i, d) in changes.iter().enumerate() {
            assert!(!p.apply(d.clone(), now + Duration::from_millis(i as u64)));
        }
        assert_eq!(p.tables().fib4.len(), 8, "readers see the copy without the queue");
        assert!(!p.catch_up(now + LAG - Duration::from_millis(1)), "not due before LAG after the first");
        assert!(p.catch_up(now + LAG));
        let mut eager = tables(8);
        for d in &changes {
            d.apply_to(&mut eager);
        }
        assert_eq!(**p.tables(), eager);
        assert_eq!(*reader, tables(8));
        assert!(!p.catch_up(now + LAG * 3), "nothing queued");
        // Queued while something waits: the next change queues behind it
        // even once the copy is free, so the order holds.
        drop(reader);
        let reader = Arc::clone(p.tables());
        assert!(!p.apply(delta(5, Some(fwd(4))), now));
        drop(reader);
        assert!(!p.apply(delta(5, None), now));
        assert!(p.catch_up(now + LAG));
        assert_eq!(**p.tables(), eager);
    }

    #[test]
    fn a_full_reconcile_replaces_the_queue() {
        let now = Instant::now();
        let mut p = Published::new(tables(8));
        p.copy_free = 4;
        let _reader = Arc::clone(p.tables());
        assert!(!p.apply(delta(1, Some(fwd(2))), now));
        p.replace(tables(2));
        assert!(!p.catch_up(now + LAG));
        assert_eq!(**p.tables(), tables(2));
    }
}
