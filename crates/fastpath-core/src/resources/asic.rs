//! A simulated switch ASIC (paper 000, "Shared Hardware Resources"): host
//! routes (/32, /128) and neighbours share one hash memory, prefixes share
//! an LPM memory where an IPv6 prefix takes more room than an IPv4 one, and
//! next hops, groups and buckets live in an adjacency table. Every device
//! access really sleeps for its configured latency, so the cost of each
//! reservation model shows on any machine; tests set the latencies to 0.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{full, Cost, Denied, Entry, PoolInfo, Target, Usage};
use crate::model::Family;

pub const HASH: usize = 0;
pub const LPM: usize = 1;
pub const ADJ: usize = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsicConfig {
    /// Shared hash memory (host routes and neighbours), in units.
    pub hash_units: u64,
    /// LPM memory, in units.
    pub lpm_units: u64,
    /// Adjacency table (next hops, groups, buckets), in entries.
    pub adj_entries: u64,
    /// Units per entry kind: hash memory.
    pub host4: u64,
    pub host6: u64,
    pub neigh4: u64,
    pub neigh6: u64,
    /// Units per entry kind: LPM memory (IPv6 up to /64, IPv6 longer).
    pub lpm4: u64,
    pub lpm6_64: u64,
    pub lpm6_128: u64,
    /// One route (entry) write over the bus: 50-55 µs measured on Spectrum.
    pub write_latency: Duration,
    /// One resource query or reservation: the paper's pessimistic 350 µs.
    pub query_latency: Duration,
}

impl Default for AsicConfig {
    fn default() -> Self {
        AsicConfig {
            hash_units: 64 * 1024,
            lpm_units: 64 * 1024,
            adj_entries: 16 * 1024,
            host4: 1,
            host6: 2,
            neigh4: 1,
            neigh6: 2,
            lpm4: 1,
            lpm6_64: 2,
            lpm6_128: 4,
            write_latency: Duration::from_micros(55),
            query_latency: Duration::from_micros(350),
        }
    }
}

impl AsicConfig {
    /// No sleeps: for tests.
    pub fn instant(mut self) -> Self {
        self.write_latency = Duration::ZERO;
        self.query_latency = Duration::ZERO;
        self
    }
}

#[derive(Debug)]
pub struct SimAsic {
    cfg: AsicConfig,
    pools: Mutex<[Usage; 3]>,
}

impl SimAsic {
    pub fn new(cfg: AsicConfig) -> SimAsic {
        let u = |capacity| Usage { capacity, used: 0, reserved: 0 };
        let pools = Mutex::new([u(cfg.hash_units), u(cfg.lpm_units), u(cfg.adj_entries)]);
        SimAsic { cfg, pools }
    }

    pub fn config(&self) -> &AsicConfig {
        &self.cfg
    }

    fn bus(d: Duration) {
        if !d.is_zero() {
            precise_sleeps();
            std::thread::sleep(d);
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut [Usage; 3]) -> R) -> R {
        let mut g = match self.pools.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }
}

/// A sleep of 55 µs takes up to the thread's timer slack (50 µs by
/// default) longer: the simulated device would be slower than configured.
/// Once per thread that simulates device accesses, the slack goes to 1 ns.
fn precise_sleeps() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    DONE.with(|done| {
        if !done.get() {
            // SAFETY: PR_SET_TIMERSLACK takes a plain integer and only affects this thread.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
            done.set(true);
        }
    });
}

impl Target for SimAsic {
    fn name(&self) -> &'static str {
        "sim-asic"
    }

    fn pools(&self) -> Vec<PoolInfo> {
        let c = &self.cfg;
        vec![
            PoolInfo {
                name: "hash".into(),
                capacity: c.hash_units,
                costs: BTreeMap::from([("host4", c.host4), ("host6", c.host6), ("neigh4", c.neigh4), ("neigh6", c.neigh6)]),
            },
            PoolInfo {
                name: "lpm".into(),
                capacity: c.lpm_units,
                costs: BTreeMap::from([("ipv4", c.lpm4), ("ipv6_64", c.lpm6_64), ("ipv6_128", c.lpm6_128)]),
            },
            PoolInfo {
                name: "adjacency".into(),
                capacity: c.adj_entries,
                costs: BTreeMap::from([("nexthop", 1), ("group", 1), ("bucket", 1)]),
            },
        ]
    }

    fn cost(&self, e: &Entry) -> Result<Cost, Denied> {
        let c = &self.cfg;
        let (pool, units, kind) = match *e {
            Entry::Route { family: Family::V4, prefix_len: 32 } => (HASH, c.host4, "host4"),
            Entry::Route { family: Family::V4, prefix_len: 0..=31 } => (LPM, c.lpm4, "ipv4"),
            Entry::Route { family: Family::V6, prefix_len: 128 } => (HASH, c.host6, "host6"),
            Entry::Route { family: Family::V6, prefix_len: 0..=64 } => (LPM, c.lpm6_64, "ipv6_64"),
            Entry::Route { family: Family::V6, prefix_len: 65..=127 } => (LPM, c.lpm6_128, "ipv6_128"),
            Entry::Route { .. } => return Err(Denied::Unsupported { entry: *e }),
            Entry::Neighbour { family: Family::V4 } => (HASH, c.neigh4, "neigh4"),
            Entry::Neighbour { family: Family::V6 } => (HASH, c.neigh6, "neigh6"),
            Entry::Nexthop => (ADJ, 1, "nexthop"),
            Entry::Group => (ADJ, 1, "group"),
            Entry::Bucket => (ADJ, 1, "bucket"),
        };
        Ok(Cost { pool, units, kind })
    }

    fn query(&self) -> Vec<Usage> {
        Self::bus(self.cfg.query_latency);
        self.with(|p| p.to_vec())
    }

    fn reserve(&self, pool: usize, units: u64) -> u64 {
        Self::bus(self.cfg.query_latency);
        self.with(|p| p.get_mut(pool).map_or(0, |p| p.grant(units)))
    }

    fn unreserve(&self, pool: usize, units: u64) {
        self.with(|p| {
            if let Some(p) = p.get_mut(pool) {
                p.ungrant(units);
            }
        })
    }

    fn write(&self, e: &Entry, reserved: bool) -> Result<(), Denied> {
        let c = self.cost(e)?;
        Self::bus(self.cfg.write_latency);
        self.with(|p| p[c.pool].take(c.units, reserved)).map_err(|u| full(self, e, &c, &u))
    }

    fn erase(&self, e: &Entry) {
        if let Ok(c) = self.cost(e) {
            Self::bus(self.cfg.write_latency);
            self.with(|p| {
                p[c.pool].give_back(c.units);
            })
        }
    }
}
