//! Credit-based: a bucket of reserved units per pool that admissions draw
//! from without touching the device. A thread refills it when it drops
//! below a low-water mark, and sizes it by the free space (a big bucket
//! while the pool is empty, a small one as it fills, so credit parked here
//! does not starve other users of a shared pool). Only when the bucket runs
//! dry faster than the thread refills it does an admission reserve inline
//! (a stall): the answer stays synchronous and exact.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{denied, lock, Counters, Model, Stats};
use crate::resources::{Denied, Entry, Target};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditConfig {
    /// Largest bucket, in units.
    pub max: u64,
    /// Smallest bucket, in units.
    pub min: u64,
    /// The bucket holds at most 1/share_div of what is free in the pool.
    pub share_div: u64,
    /// Refill when the bucket is below size / low_water_div.
    pub low_water_div: u64,
    /// Even without a wake-up, the refill thread re-sizes buckets this often.
    pub period: Duration,
}

impl Default for CreditConfig {
    fn default() -> Self {
        CreditConfig { max: 256, min: 1, share_div: 8, low_water_div: 4, period: Duration::from_millis(50) }
    }
}

#[derive(Debug, Default)]
struct State {
    credit: Vec<u64>,
    size: Vec<u64>,
    /// A refill or give-back of this pool is between the device and the
    /// bucket: its units are in neither, so a dry admission must wait for
    /// it instead of concluding the pool is full.
    moving: Vec<bool>,
    wake: bool,
    stop: bool,
}

struct Inner {
    target: Arc<dyn Target>,
    cfg: CreditConfig,
    state: Mutex<State>,
    cv: Condvar,
    /// Signalled when a refill or give-back has landed.
    landed: Condvar,
    counters: Counters,
}

impl Inner {
    fn low_water(&self, size: u64) -> u64 {
        (size / self.cfg.low_water_div.max(1)).max(1)
    }

    /// One refill round: one occupancy query, then a reservation (or a
    /// give-back) for every pool whose bucket is off its size.
    fn refill(&self) {
        let usage = self.target.query();
        for (pool, u) in usage.iter().enumerate() {
            let mut st = lock(&self.state);
            let cur = st.credit[pool];
            let size = ((u.free() + cur) / self.cfg.share_div.max(1)).clamp(self.cfg.min, self.cfg.max.max(self.cfg.min));
            st.size[pool] = size;
            if cur < self.low_water(size) {
                st.moving[pool] = true;
                drop(st);
                let g = self.target.reserve(pool, size - cur);
                Counters::bump(&self.counters.refills);
                let mut st = lock(&self.state);
                st.credit[pool] += g;
                st.moving[pool] = false;
                self.landed.notify_all();
            } else if cur > size {
                st.moving[pool] = true;
                st.credit[pool] = size;
                drop(st);
                self.target.unreserve(pool, cur - size);
                lock(&self.state).moving[pool] = false;
                self.landed.notify_all();
            }
        }
    }

    fn run(&self) {
        loop {
            {
                let mut st = lock(&self.state);
                if !st.wake && !st.stop {
                    st = match self.cv.wait_timeout(st, self.cfg.period) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
                if st.stop {
                    return;
                }
                st.wake = false;
            }
            self.refill();
        }
    }

    fn wake(&self, st: &mut State) {
        st.wake = true;
        self.cv.notify_one();
    }
}

pub struct Credit {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Credit {
    /// Fills the buckets once (before the first admission) and starts the
    /// refill thread.
    pub fn new(target: Arc<dyn Target>, cfg: CreditConfig) -> Credit {
        let pools = target.pools().len();
        let inner = Arc::new(Inner {
            target,
            cfg,
            state: Mutex::new(State {
                credit: vec![0; pools],
                size: vec![0; pools],
                moving: vec![false; pools],
                ..Default::default()
            }),
            cv: Condvar::new(),
            landed: Condvar::new(),
            counters: Counters::default(),
        });
        inner.refill();
        let bg = Arc::clone(&inner);
        let thread = std::thread::Builder::new().name("credit-refill".into()).spawn(move || bg.run());
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                // Still correct without it: every dry bucket stalls and refills inline.
                log::warn!("credit model: no refill thread ({e}); refilling inline");
                None
            }
        };
        Credit { inner, thread }
    }

    /// Units currently in the buckets, per pool.
    pub fn credit(&self) -> Vec<u64> {
        lock(&self.inner.state).credit.clone()
    }
}

impl Model for Credit {
    fn name(&self) -> &'static str {
        "credit"
    }

    fn admit(&self, e: &Entry) -> Result<(), Denied> {
        let inner = &self.inner;
        let c = inner.target.cost(e)?;
        {
            let mut st = lock(&inner.state);
            while st.credit[c.pool] < c.units && st.moving[c.pool] {
                st = match inner.landed.wait(st) {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
            }
            if st.credit[c.pool] >= c.units {
                st.credit[c.pool] -= c.units;
                if st.credit[c.pool] < inner.low_water(st.size[c.pool]) {
                    inner.wake(&mut st);
                }
                return Ok(());
            }
        }
        // Dry: reserve this entry's units inline rather than say no to
        // space the device still has.
        Counters::bump(&inner.counters.stalls);
        Counters::bump(&inner.counters.inline_accesses);
        let g = inner.target.reserve(c.pool, c.units);
        let mut st = lock(&inner.state);
        st.credit[c.pool] += g;
        inner.wake(&mut st);
        while st.credit[c.pool] < c.units && st.moving[c.pool] {
            st = match inner.landed.wait(st) {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
        }
        if st.credit[c.pool] >= c.units {
            st.credit[c.pool] -= c.units;
            return Ok(());
        }
        drop(st);
        Err(denied(inner.target.as_ref(), e))
    }

    fn commit(&self, e: &Entry) -> Result<(), Denied> {
        self.inner.target.write(e, true)
    }

    fn cancel(&self, e: &Entry) {
        if let Ok(c) = self.inner.target.cost(e) {
            lock(&self.inner.state).credit[c.pool] += c.units;
        }
    }

    fn remove(&self, e: &Entry) {
        self.inner.target.erase(e);
    }

    fn stats(&self) -> Stats {
        self.inner.counters.get()
    }
}

impl Drop for Credit {
    fn drop(&mut self) {
        {
            let mut st = lock(&self.inner.state);
            st.stop = true;
            self.inner.cv.notify_one();
        }
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::warn!("credit refill thread panicked");
            }
        }
        let credit = std::mem::take(&mut lock(&self.inner.state).credit);
        for (pool, units) in credit.into_iter().enumerate() {
            if units > 0 {
                self.inner.target.unreserve(pool, units);
            }
        }
    }
}
