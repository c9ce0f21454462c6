//! Predictive: occupancy is computed, never asked. One query when the model
//! starts, then every admission is checked against the model's own count.
//! `flat` is the driver-profile model: each entry kind of a pool gets a
//! fixed share of it (safe, but a full share refuses entries that would
//! still fit); otherwise the shared-pool model charges each entry its
//! cost in the pool it really occupies.
//!
//! Exact only while the model is the sole writer of the target, which is
//! what fastpath's BPF maps are (the daemon writes them all).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{lock, Counters, Model, Stats};
use crate::resources::{Cost, Denied, Entry, PoolInfo, Target, Usage};

#[derive(Debug, Default)]
struct State {
    /// Units used per pool as predicted (written, admitted, or someone
    /// else's reservation when the model started).
    used: Vec<u64>,
    /// Units admitted but not yet written, per pool.
    pending: Vec<u64>,
    /// Flat: units per (pool, kind) admitted through this model.
    by_kind: BTreeMap<(usize, &'static str), u64>,
}

pub struct Predictive {
    target: Arc<dyn Target>,
    flat: bool,
    pools: Vec<PoolInfo>,
    state: Mutex<State>,
    counters: Counters,
}

impl Predictive {
    pub fn new(target: Arc<dyn Target>, flat: bool) -> Predictive {
        let pools = target.pools();
        let usage = target.query();
        let used = usage.iter().map(|u| u.used + u.reserved).collect();
        let pending = vec![0; pools.len()];
        Predictive { target, flat, pools, state: Mutex::new(State { used, pending, by_kind: BTreeMap::new() }), counters: Counters::default() }
    }

    /// Flat model: the units of `pool` reserved for one entry kind.
    fn share(&self, c: &Cost) -> u64 {
        let p = &self.pools[c.pool];
        p.capacity / (p.costs.len().max(1) as u64)
    }

    fn full(&self, e: &Entry, c: &Cost, used: u64) -> Denied {
        let capacity = self.pools[c.pool].capacity;
        let u = Usage { capacity, used, reserved: 0 };
        crate::resources::full(self.target.as_ref(), e, c, &u)
    }
}

impl Model for Predictive {
    fn name(&self) -> &'static str {
        if self.flat {
            "predictive-flat"
        } else {
            "predictive"
        }
    }

    fn admit(&self, e: &Entry) -> Result<(), Denied> {
        let c = self.target.cost(e)?;
        let mut st = lock(&self.state);
        let capacity = self.pools[c.pool].capacity;
        if st.used[c.pool] + c.units > capacity {
            let used = st.used[c.pool];
            return Err(self.full(e, &c, used));
        }
        if self.flat {
            let share = self.share(&c);
            let mine = st.by_kind.get(&(c.pool, c.kind)).copied().unwrap_or(0);
            if mine + c.units > share {
                return Err(self.full(e, &Cost { units: c.units, ..c }, capacity - share + mine));
            }
            *st.by_kind.entry((c.pool, c.kind)).or_default() += c.units;
        }
        st.used[c.pool] += c.units;
        st.pending[c.pool] += c.units;
        Ok(())
    }

    fn commit(&self, e: &Entry) -> Result<(), Denied> {
        let c = self.target.cost(e)?;
        let res = self.target.write(e, false);
        let mut st = lock(&self.state);
        st.pending[c.pool] = st.pending[c.pool].saturating_sub(c.units);
        if res.is_err() {
            // Mispredicted (another writer): the entry is not there.
            st.used[c.pool] = st.used[c.pool].saturating_sub(c.units);
            if let Some(k) = st.by_kind.get_mut(&(c.pool, c.kind)) {
                *k = k.saturating_sub(c.units);
            }
        }
        res
    }

    fn cancel(&self, e: &Entry) {
        if let Ok(c) = self.target.cost(e) {
            let mut st = lock(&self.state);
            st.pending[c.pool] = st.pending[c.pool].saturating_sub(c.units);
            st.used[c.pool] = st.used[c.pool].saturating_sub(c.units);
            if let Some(k) = st.by_kind.get_mut(&(c.pool, c.kind)) {
                *k = k.saturating_sub(c.units);
            }
        }
    }

    fn remove(&self, e: &Entry) {
        if let Ok(c) = self.target.cost(e) {
            self.target.erase(e);
            let mut st = lock(&self.state);
            st.used[c.pool] = st.used[c.pool].saturating_sub(c.units);
            if let Some(k) = st.by_kind.get_mut(&(c.pool, c.kind)) {
                *k = k.saturating_sub(c.units);
            }
        }
    }

    fn held(&self) -> Vec<u64> {
        lock(&self.state).pending.clone()
    }

    fn stats(&self) -> Stats {
        self.counters.get()
    }
}
