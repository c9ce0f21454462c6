//! Desired tables vs written tables -> ordered map writes.
//! STUB: signatures are the contract; bodies being implemented.

use crate::tables::{Desired, Op, TableWriter};

#[derive(Debug, thiserror::Error)]
#[error("applying {op:?}: {source}")]
pub struct ReconcileError<E: std::error::Error + 'static> {
    pub op: Op,
    #[source]
    pub source: E,
}

/// Holds the shadow of what is in the maps.
#[derive(Debug, Default)]
pub struct Reconciler {
    _private: (),
}

impl Reconciler {
    pub fn new() -> Self {
        todo!()
    }
    /// The ops that take the maps from `applied()` to `desired`, safely ordered.
    pub fn plan(&self, _desired: &Desired) -> Vec<Op> {
        todo!()
    }
    /// Plans and applies; returns how many ops were applied.
    pub fn apply<W: TableWriter>(&mut self, _desired: &Desired, _w: &mut W) -> Result<usize, ReconcileError<W::Error>> {
        todo!()
    }
    /// What the maps hold now.
    pub fn applied(&self) -> &Desired {
        todo!()
    }
    /// Number of BumpGeneration ops applied so far.
    pub fn generation(&self) -> u64 {
        todo!()
    }
}
