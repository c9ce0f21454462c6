//! Synchronous prefetch: when its credit for a pool runs out, admit
//! reserves N entries' worth inline; the next N-1 admissions need no device
//! access, and the writes themselves are deferred (`commit`).

use std::sync::{Arc, Mutex};

use super::{denied, lock, Counters, Model, Stats};
use crate::resources::{Denied, Entry, Target};

pub struct Prefetch {
    target: Arc<dyn Target>,
    n: u64,
    /// Reserved units not yet handed to an entry, per pool.
    credit: Mutex<Vec<u64>>,
    counters: Counters,
}

impl Prefetch {
    pub fn new(target: Arc<dyn Target>, n: u64) -> Prefetch {
        let pools = target.pools().len();
        Prefetch { target, n: n.max(1), credit: Mutex::new(vec![0; pools]), counters: Counters::default() }
    }
}

impl Model for Prefetch {
    fn name(&self) -> &'static str {
        "prefetch"
    }

    fn admit(&self, e: &Entry) -> Result<(), Denied> {
        let c = self.target.cost(e)?;
        let mut credit = lock(&self.credit);
        if credit[c.pool] < c.units {
            Counters::bump(&self.counters.inline_accesses);
            credit[c.pool] += self.target.reserve(c.pool, self.n * c.units);
        }
        if credit[c.pool] < c.units {
            drop(credit);
            return Err(denied(self.target.as_ref(), e));
        }
        credit[c.pool] -= c.units;
        Ok(())
    }

    fn commit(&self, e: &Entry) -> Result<(), Denied> {
        self.target.write(e, true)
    }

    fn cancel(&self, e: &Entry) {
        if let Ok(c) = self.target.cost(e) {
            lock(&self.credit)[c.pool] += c.units;
        }
    }

    fn remove(&self, e: &Entry) {
        self.target.erase(e);
    }

    fn stats(&self) -> Stats {
        self.counters.get()
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        for (pool, units) in lock(&self.credit).iter().enumerate() {
            if *units > 0 {
                self.target.unreserve(pool, *units);
            }
        }
    }
}
