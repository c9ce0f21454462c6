//! Resource management for offloaded tables (paper 000): what each target
//! can hold, what is used and reserved, and the reservation models that
//! answer yes or no for an entry *before* it is accepted, so a route source
//! gets synchronous feedback instead of a silent blackhole.
//!
//! A `Target` is a set of pools (memories). Every kind of entry costs some
//! units of one pool; on fastpath's BPF maps each map is its own pool and
//! every entry costs 1, on the simulated ASIC host routes and neighbours
//! share a hash memory and prefixes of different kinds share an LPM memory
//! at different costs. A `Model` decides admissions against a target
//! (lockstep, synchronous prefetch, credit-based, predictive).

pub mod admission;
pub mod asic;
pub mod bpf_target;
pub mod models;
pub mod simulate;

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

use crate::model::Family;

pub use admission::{Admission, AdmissionStatus, TargetKind};
pub use asic::{AsicConfig, SimAsic};
pub use bpf_target::{BpfTarget, BpfUsage};
pub use models::{new_model, CreditConfig, Model, ModelKind};

/// One kernel object as a resource consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Entry {
    Route { family: Family, prefix_len: u8 },
    Neighbour { family: Family },
    Nexthop,
    Group,
    /// One bucket of a resilient next-hop group.
    Bucket,
}

impl Entry {
    pub fn route4(prefix_len: u8) -> Entry {
        Entry::Route { family: Family::V4, prefix_len }
    }
    pub fn route6(prefix_len: u8) -> Entry {
        Entry::Route { family: Family::V6, prefix_len }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::Route { family: Family::V4, prefix_len } => write!(f, "IPv4 /{prefix_len} route"),
            Entry::Route { family: Family::V6, prefix_len } => write!(f, "IPv6 /{prefix_len} route"),
            Entry::Neighbour { family: Family::V4 } => f.write_str("IPv4 neighbour"),
            Entry::Neighbour { family: Family::V6 } => f.write_str("IPv6 neighbour"),
            Entry::Nexthop => f.write_str("next hop"),
            Entry::Group => f.write_str("next-hop group"),
            Entry::Bucket => f.write_str("resilient bucket"),
        }
    }
}

/// What one entry takes: `units` of pool number `pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub pool: usize,
    pub units: u64,
    /// The entry kind's name in the pool's cost table.
    pub kind: &'static str,
}

/// The static description of one pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolInfo {
    pub name: String,
    /// In units.
    pub capacity: u64,
    /// Entry kind -> units per entry. One kind costing 1 is a plain table.
    pub costs: BTreeMap<&'static str, u64>,
}

/// Occupancy of one pool, in units. `reserved` is held for entries that
/// were admitted but are not written yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub capacity: u64,
    pub used: u64,
    pub reserved: u64,
}

impl Usage {
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.used + self.reserved)
    }

    /// Reserves up to `units` of what is free; returns what it got. The
    /// pool arithmetic every target shares.
    pub fn grant(&mut self, units: u64) -> u64 {
        let g = units.min(self.free());
        self.reserved += g;
        g
    }

    pub fn ungrant(&mut self, units: u64) {
        self.reserved = self.reserved.saturating_sub(units);
    }

    /// Writes an entry of `units`, out of a reservation when `reserved` and
    /// one is held, else out of free space; Err(self) when it does not fit.
    pub fn take(&mut self, units: u64, reserved: bool) -> Result<(), Usage> {
        if reserved && self.reserved >= units {
            self.reserved -= units;
        } else if self.free() < units {
            return Err(*self);
        }
        self.used += units;
        Ok(())
    }

    pub fn give_back(&mut self, units: u64) {
        self.used = self.used.saturating_sub(units);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Denied {
    #[error("no space for {entry} in {pool} (needs {need}, {free} free of {capacity}): ENOSPC")]
    Full { entry: Entry, pool: String, need: u64, free: u64, capacity: u64 },
    #[error("{entry} cannot be held by this target")]
    Unsupported { entry: Entry },
}

impl Denied {
    /// The errno a route source gets for it.
    pub fn errno(&self) -> i32 {
        match self {
            Denied::Full { .. } => libc::ENOSPC,
            Denied::Unsupported { .. } => libc::EOPNOTSUPP,
        }
    }
}

/// Something with finite tables that entries are written into. Every
/// method is atomic with respect to the others: `reserve` never grants
/// past what is free, whoever calls it concurrently.
pub trait Target: Send + Sync {
    fn name(&self) -> &'static str;
    /// Pools and cost tables (static, no device access).
    fn pools(&self) -> Vec<PoolInfo>;
    fn cost(&self, e: &Entry) -> Result<Cost, Denied>;
    /// Current occupancy of every pool (a device query: may be slow).
    fn query(&self) -> Vec<Usage>;
    /// Reserves up to `units` of `pool` for later writes; returns how many
    /// were granted (less when less is free). A device access.
    fn reserve(&self, pool: usize, units: u64) -> u64;
    /// Gives back reserved units that will not be written.
    fn unreserve(&self, pool: usize, units: u64);
    /// Writes an entry; with `reserved` it consumes units reserved before
    /// (and cannot fail for space), otherwise it needs free units.
    fn write(&self, e: &Entry, reserved: bool) -> Result<(), Denied>;
    /// Removes a written entry.
    fn erase(&self, e: &Entry);
}

/// The error for `e` not fitting into `pool` as it is now.
pub fn full(target: &dyn Target, e: &Entry, cost: &Cost, usage: &Usage) -> Denied {
    let pool = target.pools().get(cost.pool).map(|p| p.name.clone()).unwrap_or_default();
    Denied::Full { entry: *e, pool, need: cost.units, free: usage.free(), capacity: usage.capacity }
}

/// One line of `fastpath resources`: devlink-resource style.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResourceLine {
    pub name: String,
    pub size: u64,
    /// null when the table is not accounted (e.g. an LRU that evicts).
    pub used: Option<u64>,
    pub reserved: u64,
    /// "units" when entry kinds cost differently, else "entries".
    pub unit: &'static str,
    /// Shared pools: units per entry kind; empty for plain tables.
    pub costs: BTreeMap<&'static str, u64>,
}

/// A whole target as `fastpath resources` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct View {
    pub target: String,
    pub model: String,
    pub resources: Vec<ResourceLine>,
}

/// The view of `target` with `held` (units a model keeps per pool, e.g.
/// its credit) counted as reserved.
pub fn view(target: &dyn Target, model: &str, held: &[u64]) -> View {
    let usage = target.query();
    let resources = target
        .pools()
        .into_iter()
        .zip(usage)
        .enumerate()
        .map(|(i, (p, u))| {
            // Several kinds of entry in one pool: show what each costs.
            let shared = p.costs.len() > 1 || p.costs.values().any(|c| *c != 1);
            let weighted = p.costs.values().any(|c| *c != 1);
            ResourceLine {
                name: p.name,
                size: p.capacity,
                used: Some(u.used),
                reserved: u.reserved + held.get(i).copied().unwrap_or(0),
                unit: if weighted { "units" } else { "entries" },
                costs: if shared { p.costs } else { BTreeMap::new() },
            }
        })
        .collect();
    View { target: target.name().into(), model: model.into(), resources }
}
