//! Neighbour keep-alive. Fast-pathed packets never touch the kernel's
//! neighbour entries, so without help a neighbour we forward to all the time
//! would look idle to the kernel, go STALE, and eventually be garbage
//! collected: forwarding would stall on a punt + ARP/ND round trip. Each
//! tick advances fp_runtime.neigh_clock (coarse seconds); the data path
//! stamps it into the neighbour's `used` when it differs, so it stores once
//! per tick per neighbour and reads no clock per packet. For every entry
//! stamped within the window we tell the kernel "in use" (NTF_USE), exactly
//! what its own transmit path would do. We never write `used` back: a hash
//! update recycles the old element (per-CPU spare of preallocated maps)
//! while a packet may still be reading its MAC.
//!
//! Never for PERMANENT (or NOARP) entries: they do not age, and since Linux
//! 5.16 neigh_add() handles NTF_USE through __neigh_update() with
//! NEIGH_UPDATE_F_USE, which clears NUD_PERMANENT — a static entry would
//! turn into an unresolved one and be re-learnt by ARP/ND. Found by the
//! benchmark, which uses static neighbours.

use std::time::Duration;

use log::{debug, warn};

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

/// The neigh_clock for now: CLOCK_MONOTONIC_COARSE seconds + 1 (0 is "never").
pub fn neigh_clock_now() -> u32 {
    ((now_coarse_ns() / 1_000_000_000) as u32).wrapping_add(1).max(1)
}

/// Advances the data path's clock and refreshes every neighbour used within
/// `window`; returns how many the kernel accepted.
pub fn refresh(maps: &Maps, state: &KernelState, window: Duration) -> u64 {
    let clock = neigh_clock_now();
    if let Err(e) = maps.set_neigh_clock(clock) {
        warn!("advancing the neighbour keep-alive clock: {e}");
    }
    let window = u32::try_from(window.as_secs()).unwrap_or(u32::MAX).max(1);
    let mut calls = 0;
    for (key, used) in maps.neigh_uses() {
        // 0: never used since written. A stamp ahead of the clock cannot
        // happen (only we advance it) and would count as old.
        if used == 0 || clock.wrapping_sub(used) > window {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_never_zero_and_tracks_seconds() {
        let c = neigh_clock_now();
        assert_ne!(c, 0);
        // The second may turn between the two reads.
        assert!(now_coarse_ns() / 1_000_000_000 - u64::from(c - 1) <= 1);
    }
}
