//! The paper's control-plane experiment on the simulated ASIC: a route
//! source adds N routes one by one, each admitted synchronously by the
//! model; admitted routes are written by a separate writer (the driver's
//! work queue), except under lockstep where admission is the write.
//!
//! `answered`: when the route source had its last answer (what it waits
//! for); `written`: when the last route reached the device (the earliest
//! the data plane can forward to it: the outage of a route installed last).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::models::Stats;
use super::{new_model, AsicConfig, Entry, ModelKind, SimAsic};

#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    pub model: String,
    pub routes: usize,
    pub admitted: usize,
    pub refused: usize,
    pub answered: Duration,
    pub written: Duration,
    pub stats: Stats,
}

/// Runs `entries` through a fresh ASIC with `cfg` under `kind`.
pub fn run(kind: &ModelKind, cfg: &AsicConfig, entries: &[Entry]) -> SimResult {
    let asic = Arc::new(SimAsic::new(cfg.clone()));
    let model: Arc<dyn super::Model> = Arc::from(new_model(kind, asic));
    let (tx, rx) = mpsc::channel::<Entry>();
    let writer_model = Arc::clone(&model);
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut last = Duration::ZERO;
        for e in rx {
            if writer_model.commit(&e).is_err() {
                log::warn!("simulation: an admitted {e} could not be written");
            }
            last = start.elapsed();
        }
        last
    });
    let lockstep = *kind == ModelKind::Lockstep;
    let mut admitted = 0;
    for e in entries {
        if model.admit(e).is_ok() {
            admitted += 1;
            if !lockstep {
                // The writer only goes away if it panicked; then nothing is written.
                let _ = tx.send(*e);
            }
        }
    }
    let answered = start.elapsed();
    drop(tx);
    let written = match writer.join() {
        Ok(w) if !lockstep => w.max(answered),
        _ => answered,
    };
    SimResult {
        model: model.name().into(),
        routes: entries.len(),
        admitted,
        refused: entries.len() - admitted,
        answered,
        written,
        stats: model.stats(),
    }
}

/// `n` distinct IPv4 /24 routes (the paper's 10,000-route experiment).
pub fn ipv4_routes(n: usize) -> Vec<Entry> {
    vec![Entry::route4(24); n]
}
