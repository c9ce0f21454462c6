//! Lockstep: the entry is written to the device inline, before the route
//! source gets its answer. Exact, but every entry pays the write latency.

use std::sync::Arc;

use super::{Counters, Model, Stats};
use crate::resources::{Denied, Entry, Target};

pub struct Lockstep {
    target: Arc<dyn Target>,
    counters: Counters,
}

impl Lockstep {
    pub fn new(target: Arc<dyn Target>) -> Lockstep {
        Lockstep { target, counters: Counters::default() }
    }
}

impl Model for Lockstep {
    fn name(&self) -> &'static str {
        "lockstep"
    }

    fn admit(&self, e: &Entry) -> Result<(), Denied> {
        Counters::bump(&self.counters.inline_accesses);
        self.target.write(e, false)
    }

    fn commit(&self, _e: &Entry) -> Result<(), Denied> {
        Ok(())
    }

    fn cancel(&self, e: &Entry) {
        self.target.erase(e);
    }

    fn remove(&self, e: &Entry) {
        self.target.erase(e);
    }

    fn stats(&self) -> Stats {
        self.counters.get()
    }
}
