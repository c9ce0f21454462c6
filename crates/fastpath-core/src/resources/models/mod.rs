//! Reservation models (paper 000, "Problem Definition"): each answers yes
//! or no for an entry synchronously, before the entry is accepted, and
//! differs only in when it talks to the device.
//!
//! | model | device access on the admit path |
//! |---|---|
//! | lockstep | one write per entry |
//! | synchronous prefetch | one reservation of N entries every N entries |
//! | credit-based | none while the bucket lasts (refilled by a thread) |
//! | predictive | none: occupancy is computed, never asked |

mod credit;
mod lockstep;
mod predictive;
mod prefetch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Denied, Entry, Target};

pub use credit::{Credit, CreditConfig};
pub use lockstep::Lockstep;
pub use predictive::Predictive;
pub use prefetch::Prefetch;

/// An admission controller in front of a target. Admitted entries hold
/// their units until `commit` writes them or `cancel` gives them back.
pub trait Model: Send + Sync {
    fn name(&self) -> &'static str;
    /// Yes (the units are held for `e`) or no, synchronously.
    fn admit(&self, e: &Entry) -> Result<(), Denied>;
    /// Writes an admitted entry to the target (the deferred install;
    /// lockstep wrote it already).
    fn commit(&self, e: &Entry) -> Result<(), Denied>;
    /// Gives back an admitted entry that will not be written (a batch that
    /// failed elsewhere).
    fn cancel(&self, e: &Entry);
    /// Removes a committed entry.
    fn remove(&self, e: &Entry);
    /// Units per pool this model holds that the target does not report
    /// (predictive's admitted-but-unwritten entries).
    fn held(&self) -> Vec<u64> {
        Vec::new()
    }
    /// Device accesses and stalls on the admit path so far.
    fn stats(&self) -> Stats;
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Device accesses made inline by `admit` (latency the route source sees).
    pub inline_accesses: u64,
    /// Credit-based: admissions that found the bucket dry and had to refill inline.
    pub stalls: u64,
    /// Credit-based: asynchronous refills.
    pub refills: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub inline_accesses: AtomicU64,
    pub stalls: AtomicU64,
    pub refills: AtomicU64,
}

impl Counters {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> Stats {
        Stats {
            inline_accesses: self.inline_accesses.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
            refills: self.refills.load(Ordering::Relaxed),
        }
    }
}

/// Which model, with its parameters; parsed from `lockstep`, `prefetch:N`,
/// `credit[:MAX]`, `predictive` (shared-pool) or `predictive-flat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelKind {
    Lockstep,
    Prefetch { n: u64 },
    Credit(CreditConfig),
    Predictive { flat: bool },
}

impl std::str::FromStr for ModelKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |a: Option<&str>, default: u64| -> Result<u64, String> {
            match a {
                None => Ok(default),
                Some(a) => match a.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!("{s:?}: {a:?} is not a positive number")),
                },
            }
        };
        Ok(match name {
            "lockstep" => ModelKind::Lockstep,
            "prefetch" => ModelKind::Prefetch { n: num(arg, 64)? },
            "credit" => {
                let d = CreditConfig::default();
                ModelKind::Credit(CreditConfig { max: num(arg, d.max)?, ..d })
            }
            "predictive" => ModelKind::Predictive { flat: false },
            "predictive-flat" => ModelKind::Predictive { flat: true },
            _ => return Err(format!("unknown reservation model {s:?} (lockstep, prefetch:N, credit[:MAX], predictive, predictive-flat)")),
        })
    }
}

impl ModelKind {
    pub fn all_default() -> [ModelKind; 5] {
        [
            ModelKind::Lockstep,
            ModelKind::Prefetch { n: 64 },
            ModelKind::Credit(CreditConfig::default()),
            ModelKind::Predictive { flat: false },
            ModelKind::Predictive { flat: true },
        ]
    }
}

pub fn new_model(kind: &ModelKind, target: Arc<dyn Target>) -> Box<dyn Model> {
    match kind {
        ModelKind::Lockstep => Box::new(Lockstep::new(target)),
        ModelKind::Prefetch { n } => Box::new(Prefetch::new(target, *n)),
        ModelKind::Credit(cfg) => Box::new(Credit::new(target, cfg.clone())),
        ModelKind::Predictive { flat } => Box::new(Predictive::new(target, *flat)),
    }
}

/// The Full error for `e` as the target stands now (a query: only on the
/// failure path).
pub(crate) fn denied(target: &dyn Target, e: &Entry) -> Denied {
    match target.cost(e) {
        Ok(c) => {
            let u = target.query().get(c.pool).copied().unwrap_or_default();
            super::full(target, e, &c, &u)
        }
        Err(d) => d,
    }
}

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
