//! `fastpath bench fulltable`, last part: what the changes of a failover
//! cost with the full table present.
//!
//! - A link flap: the sink's end of r1's veth goes down, so r1 loses carrier
//!   (its routes stay, marked linkdown, so nothing has to be loaded again),
//!   then comes back up. Timed from the `ip link` command to r1's fp_ifaces
//!   entry losing FP_IF_UP (from then on the data path punts what would have
//!   gone out of r1, cached flows included, and the kernel decides), and from
//!   the second command to the entry having it again (a route re-dump and a
//!   full recompute later).
//! - An address taken over (what keepalived does with a virtual address):
//!   198.51.100.77/32 added to r0, inside the subnet routed out of r1, then
//!   removed. Timed from the `ip addr` command until fp_fib4's answer for the
//!   address is a local route (from then on its packets are punted to the
//!   kernel, which delivers them), and back.
//! - An interface's last IPv4 address removed (r0's 192.0.2.1/24): the
//!   kernel flushes every IPv4 route through it unannounced, so the daemon
//!   re-dumps every route. Timed from the `ip addr del` until r0's fp_ifaces
//!   entry has FP_IF_V4_FLUSH (from then on IPv4 leaving by r0 is punted,
//!   cached flows included), and until the recompute from the re-dumped
//!   routes has lifted it again. The address and the routes are put back
//!   after each.

use std::mem::offset_of;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf::{fp_iface, fp_route, fp_route_type, FP_IF_UP, FP_IF_V4_FLUSH, FP_MAX_IFACES};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::router;
use super::tablesync::wait_idle;
use super::topo::{self, Topology};

/// Seconds per flap: until r1 was down in fp_ifaces, until it was up again.
#[derive(Default)]
pub struct Flaps {
    pub down: Vec<f64>,
    pub up: Vec<f64>,
}

pub fn link_flaps(t: &Topology, daemon_pid: u32, flaps: usize, stop: &AtomicBool) -> Result<Flaps> {
    let ifaces = router::fastpath_map(t, "fp_ifaces")?;
    let r1 = t.ifindex(&t.router, topo::R1)?;
    let slot = slot_of(&ifaces, r1)?;
    let mut out = Flaps::default();
    for _ in 0..flaps {
        for (state, want_up) in [("down", false), ("up", true)] {
            wait_idle(daemon_pid, stop)?;
            let t0 = Instant::now();
            set_link(&t.sink, topo::S0, state)?;
            let took = wait_until(t0, stop, || Ok(flag(&ifaces, slot, FP_IF_UP)? == want_up))
                .with_context(|| format!("r1 {state} in fp_ifaces after its peer went {state}"))?;
            if want_up { &mut out.up } else { &mut out.down }.push(took);
        }
    }
    Ok(out)
}

/// The address taken over and given back.
const VIP: [u8; 4] = [198, 51, 100, 77];

/// Seconds per takeover: until the address was local in fp_fib4, until it
/// was not any more.
pub fn address_takeovers(t: &Topology, daemon_pid: u32, n: usize, stop: &AtomicBool) -> Result<Flaps> {
    let fib4 = router::fastpath_map(t, "fp_fib4")?;
    let vip = format!("{}/32", std::net::Ipv4Addr::from(VIP));
    let mut out = Flaps::default();
    for _ in 0..n {
        for (verb, want_local) in [("add", true), ("del", false)] {
            wait_idle(daemon_pid, stop)?;
            let t0 = Instant::now();
            ip(&["-n", &t.router, "addr", verb, &vip, "dev", topo::R0])?;
            let took = wait_until(t0, stop, || Ok(local(&fib4)? == want_local)).with_context(|| {
                format!("{vip} {} in fp_fib4 after ip addr {verb}", if want_local { "local" } else { "not local" })
            })?;
            // `down`: the address taken (punted), `up`: given back.
            if want_local { &mut out.down } else { &mut out.up }.push(took);
        }
    }
    Ok(out)
}

/// r0's only IPv4 address.
const R0_ADDR: &str = "192.0.2.1/24";

/// Seconds per loss of r0's last IPv4 address, from the start of `ip addr del`.
#[derive(Default)]
pub struct Losses {
    /// Until r0's fp_ifaces entry punted IPv4 (polled while `ip` runs).
    pub punted: Vec<f64>,
    /// Until `ip addr del` returned: the kernel's flush of r0's routes.
    pub ip: Vec<f64>,
    /// Until the recompute from the re-dumped routes lifted the punt.
    pub lifted: Vec<f64>,
}

/// `restore` puts back the routes the kernel flushed, after the address.
pub fn address_losses(
    t: &Topology,
    daemon_pid: u32,
    n: usize,
    stop: &AtomicBool,
    mut restore: impl FnMut() -> Result<()>,
) -> Result<Losses> {
    let ifaces = router::fastpath_map(t, "fp_ifaces")?;
    let slot = slot_of(&ifaces, t.ifindex(&t.router, topo::R0)?)?;
    let mut out = Losses::default();
    for _ in 0..n {
        wait_idle(daemon_pid, stop)?;
        let mut del = Running::ip(&["-n", &t.router, "addr", "del", R0_ADDR, "dev", topo::R0])?;
        let t0 = del.t0;
        let res = (|| {
            let punted = wait_until(t0, stop, || {
                del.check()?;
                flag(&ifaces, slot, FP_IF_V4_FLUSH)
            })
            .context("IPv4 out of r0 punted after its last address went")?;
            let lifted = wait_until(t0, stop, || Ok(del.check()?.is_some() && !flag(&ifaces, slot, FP_IF_V4_FLUSH)?))
                .context("the punt lifted by the recompute")?;
            Ok::<_, anyhow::Error>((punted, lifted))
        })();
        let (secs, ok) = del.finish()?;
        // Back before anything else runs, failed or not.
        ip(&["-n", &t.router, "addr", "add", R0_ADDR, "dev", topo::R0])?;
        restore()?;
        let (punted, lifted) = res?;
        if !ok {
            bail!("ip addr del {R0_ADDR} dev {} failed", topo::R0);
        }
        out.punted.push(punted);
        out.ip.push(secs);
        out.lifted.push(lifted);
    }
    wait_idle(daemon_pid, stop)?;
    Ok(out)
}

/// `ip` running in the background; when it exited, taken when first seen.
struct Running {
    child: std::process::Child,
    t0: Instant,
    done: Option<(f64, bool)>,
}

impl Running {
    fn ip(args: &[&str]) -> Result<Running> {
        let t0 = Instant::now();
        let child = Command::new("ip").args(args).spawn().context("running ip")?;
        Ok(Running { child, t0, done: None })
    }

    /// (seconds from the start, success) once it has exited.
    fn check(&mut self) -> Result<Option<(f64, bool)>> {
        if self.done.is_none() {
            if let Some(st) = self.child.try_wait().context("waiting for ip")? {
                self.done = Some((self.t0.elapsed().as_secs_f64(), st.success()));
            }
        }
        Ok(self.done)
    }

    fn finish(&mut self) -> Result<(f64, bool)> {
        if let Some(d) = self.check()? {
            return Ok(d);
        }
        let st = self.child.wait().context("waiting for ip")?;
        Ok((self.t0.elapsed().as_secs_f64(), st.success()))
    }
}

/// Seconds from `t0` until `done`, polled every 100 us for up to 60 s.
fn wait_until(t0: Instant, stop: &AtomicBool, mut done: impl FnMut() -> Result<bool>) -> Result<f64> {
    while !done()? {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("not within 60 s");
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// fp_fib4's longest match for VIP is a local route.
fn local(fib4: &MapHandle) -> Result<bool> {
    let mut key = 32u32.to_ne_bytes().to_vec();
    key.extend_from_slice(&VIP);
    let Some(v) = fib4.lookup(&key, MapFlags::ANY).context("looking up fp_fib4")? else {
        return Ok(false);
    };
    Ok(v.get(offset_of!(fp_route, type_)).is_some_and(|t| *t == fp_route_type::FP_RT_LOCAL as u8))
}

fn ip(args: &[&str]) -> Result<()> {
    let st = Command::new("ip").args(args).status().context("running ip")?;
    if !st.success() {
        bail!("ip {} failed", args.join(" "));
    }
    Ok(())
}

fn set_link(ns: &str, dev: &str, state: &str) -> Result<()> {
    ip(&["-n", ns, "link", "set", dev, state])
}

fn entry(map: &MapHandle, slot: u32) -> Result<Vec<u8>> {
    map.lookup(&slot.to_ne_bytes(), MapFlags::ANY)
        .context("reading fp_ifaces")?
        .context("fp_ifaces slot out of range")
}

fn field_u32(v: &[u8], off: usize) -> u32 {
    v.get(off..off + 4).map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// The fp_ifaces entry in `slot` has `bit` (an FP_IF_*) set.
fn flag(map: &MapHandle, slot: u32, bit: u32) -> Result<bool> {
    let v = entry(map, slot)?;
    let off = offset_of!(fp_iface, flags);
    let flags = v.get(off..off + 2).map_or(0, |b| u16::from_ne_bytes([b[0], b[1]]));
    Ok(u32::from(flags) & bit != 0)
}

fn slot_of(map: &MapHandle, ifindex: u32) -> Result<u32> {
    for slot in 0..FP_MAX_IFACES {
        if field_u32(&entry(map, slot)?, offset_of!(fp_iface, ifindex)) == ifindex {
            return Ok(slot);
        }
    }
    bail!("no fp_ifaces slot holds ifindex {ifindex}")
}
