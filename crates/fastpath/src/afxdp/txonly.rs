//! Transmit alone, for the forward bench's `afxdp-tx` mode: one socket
//! sends ready-made frames out of an interface as fast as the kernel takes
//! them; nothing is received, parsed or looked up. Every frame an AF_XDP
//! forwarder sends pays at least this, so the rate is that forwarder's
//! ceiling on the device, as the raw redirect is the XDP router's. On a
//! driver without zero-copy (veth) the socket is in copy mode, where each
//! `sendto()` turns TX-ring entries into one skb per frame.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::socket::{BindMode, RingSizes, Xsk};
use super::umem::{Umem, FRAME_SIZE};

const RING: u32 = 2048;
/// Frames per sendto(): copy mode transmits at most 32 per call
/// (net/xdp/xsk.c, TX_BATCH_SIZE); more would wait for the next call.
const BATCH: u32 = 32;

pub struct TxOnly {
    // First: the socket (and its rings) drop before the UMEM.
    x: Xsk,
    _umem: Umem,
    /// Chunks holding a frame, not on the TX ring.
    idle: Vec<u64>,
    len: u32,
    pub mode: BindMode,
}

// SAFETY: the rings and the UMEM are mappings owned by this value; it is
// used by one thread at a time (moved, or lent as &mut).
unsafe impl Send for TxOnly {}

/// What one `run` did.
#[derive(Debug, Clone, Copy)]
pub struct TxRun {
    /// Frames the kernel took off the TX ring.
    pub sent: u64,
    pub elapsed: Duration,
}

impl TxOnly {
    /// A TX-only socket on (`ifindex`, queue 0) of the calling thread's
    /// network namespace, its UMEM filled with `frames` in turn (all of one
    /// length).
    pub fn open(ifindex: u32, frames: &[Vec<u8>]) -> Result<Self> {
        let len = match frames.first() {
            Some(f) if frames.iter().all(|g| g.len() == f.len()) && f.len() <= FRAME_SIZE as usize => f.len(),
            _ => bail!("TX-only: need frames of one length up to {FRAME_SIZE} bytes"),
        };
        let mut umem = Umem::new(RING * 2).context("allocating the UMEM")?;
        let sizes = RingSizes { rx: 64, tx: RING, fill: 64, comp: RING };
        let x = match Xsk::open(&umem, None, ifindex, 0, sizes, true) {
            Ok(x) => x,
            Err(_) => Xsk::open(&umem, None, ifindex, 0, sizes, false)?,
        };
        let mut idle = Vec::new();
        let mut i = 0;
        while let Some(a) = umem.alloc() {
            let buf = umem.frame_mut(a, len).context("UMEM chunk")?;
            buf.copy_from_slice(&frames[i % frames.len()]);
            idle.push(a);
            i += 1;
        }
        // Popped from the end: send in the order filled.
        idle.reverse();
        Ok(TxOnly { mode: x.mode, x, _umem: umem, idle, len: len as u32 })
    }

    /// Transmits for `duration` (or until `stop`) from the calling thread.
    pub fn run(&mut self, duration: Duration, stop: &AtomicBool) -> TxRun {
        let start = Instant::now();
        let mut sent = 0u64;
        let mut rounds = 0u32;
        loop {
            sent += u64::from(self.reclaim());
            let n = self.x.tx.free(BATCH).min(BATCH).min(self.idle.len() as u32);
            for _ in 0..n {
                if let Some(a) = self.idle.pop() {
                    self.x.tx.push(libc::xdp_desc { addr: a, len: self.len, options: 0 });
                }
            }
            if n > 0 {
                self.x.tx.submit();
            }
            self.x.kick_tx();
            rounds = rounds.wrapping_add(1);
            if (rounds & 63) == 0 && (start.elapsed() >= duration || stop.load(Ordering::Relaxed)) {
                break;
            }
        }
        TxRun { sent, elapsed: start.elapsed() }
    }

    /// Frames still on the TX ring go back to the pool (before the next run).
    pub fn drain(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(200);
        while self.idle.len() < (RING * 2) as usize && Instant::now() < deadline {
            self.x.kick_tx();
            self.reclaim();
        }
    }

    /// Completed frames back to the pool; how many.
    fn reclaim(&mut self) -> u32 {
        let done = self.x.comp.available(RING);
        for i in 0..done {
            self.idle.push(self.x.comp.get(i));
        }
        if done > 0 {
            self.x.comp.release(done);
        }
        done
    }
}
