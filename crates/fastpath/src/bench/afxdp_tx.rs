//! The forward bench's `afxdp-tx` mode: no generator and nothing on the
//! router's r0; an AF_XDP socket on r1 sends the frames a forwarder would
//! (MACs of the r1 -> s0 hop, TTL 63) from a thread placed as the
//! generator is, and the sink counts them. Copy-mode transmit (veth) runs
//! inside the thread's sendto(), the sink's softirq work after it on the
//! same CPU: the per-CPU figure is the whole cost of transmitting from user
//! space here.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::report::Rep;
use super::traffic::{self, Placement};
use super::{topo, Bench};
use crate::afxdp::txonly::{TxOnly, TxRun};

/// Distinct frames at most (the socket's UMEM holds this many).
const MAX_FRAMES: u32 = 4096;

pub(super) fn measure_reps(b: &Bench<'_>, size: usize, flows: u32, n: usize) -> Result<Vec<Rep>> {
    let frames = frames(size, flows)?;
    let r1 = b.topo.ifindex(&b.topo.router, topo::R1)?;
    let mut tx = open(b, r1, &frames)?;
    let place = b.plan.place;
    run(&mut tx, place, b.plan.warmup, b.stop)?;
    let mut reps = Vec::new();
    for _ in 0..n {
        b.check_stop()?;
        b.sink.zero()?;
        let (run, cpu) = run(&mut tx, place, b.plan.duration, b.stop)?;
        std::thread::sleep(Duration::from_millis(20));
        let (pkts, _) = b.sink.read()?;
        b.check_stop()?;
        if pkts == 0 {
            bail!("afxdp-tx, {size} B: nothing reached the sink ({} frames sent, {:?} mode)", run.sent, tx.mode);
        }
        reps.push(Rep::measured(pkts, run.sent, run.elapsed, cpu));
    }
    Ok(reps)
}

/// The socket on r1. A socket closed just before (the last cell's, or the
/// afxdp daemon's) leaves its queue busy until the kernel's deferred
/// release has run: retry for a while.
fn open(b: &Bench<'_>, r1: u32, frames: &[Vec<u8>]) -> Result<TxOnly> {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        match topo::in_netns(&b.topo.router, || TxOnly::open(r1, frames))? {
            Ok(tx) => return Ok(tx),
            Err(e) if Instant::now() >= until => return Err(e.context("opening the afxdp-tx socket on r1")),
            Err(_) => {
                b.check_stop()?;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// One timed run on a thread placed like the generator's; its CPU time.
fn run(tx: &mut TxOnly, place: Placement, duration: Duration, stop: &AtomicBool) -> Result<(TxRun, Duration)> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<(TxRun, Duration)> {
            place.apply()?;
            let c0 = traffic::thread_cpu_time()?;
            let r = tx.run(duration, stop);
            let cpu = traffic::thread_cpu_time()?.saturating_sub(c0);
            tx.drain();
            Ok((r, cpu))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("afxdp-tx thread panicked"))?
    })
}

/// The generator's frames of the first min(flows, MAX_FRAMES) flows as the
/// router would send them to the sink.
fn frames(size: usize, flows: u32) -> Result<Vec<Vec<u8>>> {
    let base = traffic::frame(size)?;
    let mut out = Vec::new();
    for i in 0..flows.clamp(1, MAX_FRAMES) {
        let mut f = base.clone();
        f[0..6].copy_from_slice(&topo::MAC_S0);
        f[6..12].copy_from_slice(&topo::MAC_R1);
        f[22] -= 1; // TTL
        f[24..26].fill(0);
        let csum = traffic::ipv4_checksum(&f[14..34]);
        f[24..26].copy_from_slice(&csum.to_be_bytes());
        let sport = traffic::SPORT_BASE.wrapping_add((i % traffic::SPORTS) as u16);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        out.push(f);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_the_generators_as_forwarded_to_the_sink() {
        let fs = frames(64, 3).unwrap();
        assert_eq!(fs.len(), 3);
        let sent = traffic::frame(64).unwrap();
        for (i, f) in fs.iter().enumerate() {
            assert_eq!(f.len(), sent.len());
            assert_eq!(&f[0..6], &topo::MAC_S0);
            assert_eq!(&f[6..12], &topo::MAC_R1);
            assert_eq!(f[22], sent[22] - 1, "TTL");
            assert_eq!(traffic::ipv4_checksum(&f[14..34]), 0, "header checksum");
            assert_eq!(u16::from_be_bytes([f[34], f[35]]), traffic::SPORT_BASE + i as u16);
            assert_eq!(&f[36..], &sent[36..], "everything past the source port");
        }
        assert_eq!(frames(64, 1_000_000).unwrap().len(), MAX_FRAMES as usize);
    }
}
