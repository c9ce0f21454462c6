//! Neighbour keep-alive. Fast-pathed packets never touch the kernel's
//! neighbour entries, so without help a neighbour we forward to all the time
//! would look idle to the kernel, go STALE, and eventually be garbage
//! collected: forwarding would stall on a punt + ARP/ND round trip. The data
//! path stamps `used_ns` on use; for every recently used entry we tell the
//! kernel "in use" (NTF_USE), exactly what its own transmit path would do.
//!
//! Never for PERMANENT (or NOARP) entries: they do not age, and since Linux
//! 5.16 neigh_add() handles NTF_USE through __neigh_update() with
//! NEIGH_UPDATE_F_USE, which clears NUD_PERMANENT — a static entry would
//! turn into an unresolved one and be re-learnt by ARP/ND. Found by the
//! benchmark, which uses static neighbours.

use std::time::Duration;

use log::debug;

use fastpath_core::model::{KernelState, NUD_NOARP, NUD_PERMANENT};

use crate::maps::Maps;

/// CLOCK_MONOTONIC_COARSE in ns, the clock of bpf_ktime_get_coarse_ns().
pub fn now_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Refreshes every neighbour used within `window`; returns how many the
/// kernel accepted.
pub fn refresh(maps: &Maps, state: &KernelState, window: Duration) -> u64 {
    let now = now_coarse_ns();
    let window = window.as_nanos() as u64;
    let mut calls = 0;
    for (key, used_ns) in maps.neigh_uses() {
        // used_ns == 0: never used since written. A stamp from the future
        // (clock skew between CPUs) counts as recent.
        if used_ns == 0 || now.saturating_sub(used_ns) > window {
            continue;
        }
        // Only entries the kernel ages; a missing one is gone already.
        match state.neighbours.get(&(key.ifindex, key.addr)) {
            Some(n) if n.state & (NUD_PERMANENT | NUD_NOARP) == 0 => {}
            _ => continue,
        }
        match fastpath_core::mirror::neigh_use(key.ifindex, key.addr) {
            Ok(()) => calls += 1,
            Err(e) => debug!("keep-alive of {} on ifindex {}: {e}", key.addr, key.ifindex),
        }
    }
    calls
}
