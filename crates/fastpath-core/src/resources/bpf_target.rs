//! fastpath's own BPF maps as a target: every map is its own pool, every
//! entry costs one slot, capacities are the maps' max_entries. The daemon
//! knows exactly what it wrote (the reconciler's shadow), so accounting is
//! exact and no device is ever asked: the predictive model fits it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{full, Cost, Denied, Entry, PoolInfo, Target, Usage};
use crate::model::Family;
use crate::tables::{Capacities, Desired};

pub const FIB4: usize = 0;
pub const FIB6: usize = 1;
pub const NEXTHOPS: usize = 2;
pub const GROUPS: usize = 3;
pub const BUCKETS: usize = 4;
pub const NEIGHBOURS: usize = 5;
pub const INTERFACES: usize = 6;
const NAMES: [&str; 7] = ["fib4", "fib6", "nexthops", "groups", "buckets", "neighbours", "interfaces"];

/// Usable slots and used slots of every map, in pool order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BpfUsage {
    pub pools: [Usage; 7],
}

impl BpfUsage {
    /// From the configured capacities and the tables the maps hold.
    pub fn of(caps: &Capacities, applied: &Desired) -> BpfUsage {
        let u = |capacity: u32, used: usize| Usage { capacity: u64::from(capacity), used: used as u64, reserved: 0 };
        BpfUsage {
            pools: [
                u(caps.fib4, applied.fib4.len()),
                u(caps.fib6, applied.fib6.len()),
                // Id 0 of the next-hop and group arrays is never used; bucket
                // keys hold 16 bits of group id.
                u(caps.nexthops.saturating_sub(1), applied.nexthops.len()),
                u(caps.groups.saturating_sub(1).min(u32::from(u16::MAX)), applied.groups.len()),
                u(caps.buckets, applied.res_buckets.len()),
                u(caps.neigh, applied.neigh.len()),
                u(caps.ifaces, applied.ifaces.len()),
            ],
        }
    }
}

#[derive(Debug, Default)]
pub struct BpfTarget {
    state: Mutex<BpfUsage>,
}

impl BpfTarget {
    pub fn new(usage: BpfUsage) -> BpfTarget {
        BpfTarget { state: Mutex::new(usage) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut BpfUsage) -> R) -> R {
        let mut g = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }
}

impl Target for BpfTarget {
    fn name(&self) -> &'static str {
        "bpf"
    }

    fn pools(&self) -> Vec<PoolInfo> {
        let caps = self.with(|s| s.pools.map(|p| p.capacity));
        NAMES
            .iter()
            .zip(caps)
            .enumerate()
            .map(|(i, (n, c))| {
                let costs: BTreeMap<&'static str, u64> = match i {
                    NEIGHBOURS => [("ipv4", 1), ("ipv6", 1)].into(),
                    _ => [("entry", 1)].into(),
                };
                PoolInfo { name: (*n).into(), capacity: c, costs }
            })
            .collect()
    }

    fn cost(&self, e: &Entry) -> Result<Cost, Denied> {
        let (pool, kind) = match e {
            Entry::Route { family: Family::V4, prefix_len } if *prefix_len <= 32 => (FIB4, "entry"),
            Entry::Route { family: Family::V6, prefix_len } if *prefix_len <= 128 => (FIB6, "entry"),
            Entry::Route { .. } => return Err(Denied::Unsupported { entry: *e }),
            Entry::Neighbour { family: Family::V4 } => (NEIGHBOURS, "ipv4"),
            Entry::Neighbour { family: Family::V6 } => (NEIGHBOURS, "ipv6"),
            Entry::Nexthop => (NEXTHOPS, "entry"),
            Entry::Group => (GROUPS, "entry"),
            Entry::Bucket => (BUCKETS, "entry"),
        };
        Ok(Cost { pool, units: 1, kind })
    }

    fn query(&self) -> Vec<Usage> {
        self.with(|s| s.pools.to_vec())
    }

    fn reserve(&self, pool: usize, units: u64) -> u64 {
        self.with(|s| s.pools.get_mut(pool).map_or(0, |p| p.grant(units)))
    }

    fn unreserve(&self, pool: usize, units: u64) {
        self.with(|s| {
            if let Some(p) = s.pools.get_mut(pool) {
                p.ungrant(units);
            }
        })
    }

    fn write(&self, e: &Entry, reserved: bool) -> Result<(), Denied> {
        let c = self.cost(e)?;
        self.with(|s| s.pools[c.pool].take(c.units, reserved)).map_err(|u| full(self, e, &c, &u))
    }

    fn erase(&self, e: &Entry) {
        if let Ok(c) = self.cost(e) {
            self.with(|s| {
                s.pools[c.pool].give_back(c.units);
            })
        }
    }
}
