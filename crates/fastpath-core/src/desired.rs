//! Kernel state -> the tables fastpath should hold.
//! STUB: signatures are the contract; bodies being implemented.

use std::collections::BTreeMap;

use crate::model::KernelState;
use crate::tables::{Capacities, Desired, NexthopEntry};

/// Stable next-hop ids: content-addressed by (ifindex, gateway), never
/// re-pointed while a written route may still reference them.
#[derive(Debug, Default)]
pub struct NexthopIds {
    _private: (),
}

impl NexthopIds {
    pub fn new(_capacity: u32) -> Self {
        todo!()
    }
    /// Forget ids that are neither in `desired` nor in the `applied` tables.
    pub fn release_unused(&mut self, _applied: &BTreeMap<u32, NexthopEntry>) {
        todo!()
    }
}

/// `managed`: ifindex -> fp_stats slot of every interface fastpath runs on.
pub fn compute(
    _state: &KernelState,
    _managed: &BTreeMap<u32, u32>,
    _caps: &Capacities,
    _ids: &mut NexthopIds,
) -> Desired {
    todo!()
}
