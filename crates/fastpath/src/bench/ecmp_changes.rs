//! `fastpath bench fulltable`, ECMP part: the multipath changes BGP
//! multipath makes (through FRR's next-hop objects or plain multipath
//! routes), timed with the full table present.
//!
//! - A multipath route over two gateways added to r1's side and deleted:
//!   from the `ip route` line until fp_fib4's entry for the prefix is a
//!   multipath one, and until it is gone.
//! - A route to a next-hop group object losing a path and getting it back
//!   (`ip nexthop replace id G group A`, then `group A/B`, as FRR does when a
//!   peer withdraws a path): until the entry points at another ECMP group
//!   (a group of one path is still a group, as in the kernel), and back.
//! - The group and its two paths deleted once no route uses them (as FRR
//!   does when its keep timer runs out): the daemon's CPU time until it is
//!   idle again, and how long it stayed busy (nothing vanishes with them:
//!   no route re-dump is needed).
//!
//! The router's multipath hash seed is set first (without one the kernel's
//! hash cannot be reproduced and multipath routes are punted); every timed
//! change starts from an idle daemon.

use std::mem::offset_of;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf::{fp_route, fp_route_type};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::router::process_cpu_time;
use super::tablesync::{wait_idle, Batch};

/// The prefix the changes use: documentation space, outside the generated table.
const PREFIX: &str = "203.0.113.0/24";
const KEY: ([u8; 4], u8) = ([203, 0, 113, 0], 24);
const GW: [&str; 2] = ["198.51.100.10", "198.51.100.11"];
/// Next-hop object ids: the two paths and their group.
const OBJ: [u32; 3] = [9001, 9002, 9003];

/// Seconds per change, by kind.
#[derive(Default)]
pub struct EcmpTimes {
    pub route_add: Vec<f64>,
    pub route_del: Vec<f64>,
    pub shrink: Vec<f64>,
    pub grow: Vec<f64>,
    /// Unused objects deleted: daemon CPU seconds, and seconds until it
    /// went quiet.
    pub unused_cpu: Vec<f64>,
    pub unused_busy: Vec<f64>,
}

pub fn ecmp_changes(router: &str, ip: &mut Batch, fib4: &MapHandle, daemon_pid: u32, n: usize, stop: &AtomicBool) -> Result<EcmpTimes> {
    let st = Command::new("ip")
        .args(["netns", "exec", router, "sysctl", "-qw", "net.ipv4.fib_multipath_hash_seed=4660"])
        .status()
        .context("running sysctl")?;
    if !st.success() {
        bail!("setting the router's multipath hash seed failed");
    }
    let is = |t: fp_route_type| move || Ok(route(fib4)?.is_some_and(|(k, _)| k == t as u8));
    // The entry is multipath through another group than `old`'s.
    let moved = |old: Option<(u8, u32)>| {
        move || Ok(route(fib4)?.is_some_and(|r| r.0 == fp_route_type::FP_RT_MULTIPATH as u8 && Some(r) != old))
    };
    let mut out = EcmpTimes::default();
    let two = format!("nexthop via {} dev r1 nexthop via {} dev r1", GW[0], GW[1]);
    for _ in 0..n {
        wait_idle(daemon_pid, stop)?;
        out.route_add.push(ip.time_until(&format!("route add {PREFIX} {two}"), is(fp_route_type::FP_RT_MULTIPATH))?);
        wait_idle(daemon_pid, stop)?;
        out.route_del.push(ip.time_until(&format!("route del {PREFIX}"), || Ok(route(fib4)?.is_none()))?);
    }
    let [a, b, g] = OBJ;
    ip.write(&format!("nexthop add id {a} via {} dev r1", GW[0]))?;
    ip.write(&format!("nexthop add id {b} via {} dev r1", GW[1]))?;
    ip.write(&format!("nexthop add id {g} group {a}/{b}"))?;
    ip.time_until(&format!("route add {PREFIX} nhid {g}"), is(fp_route_type::FP_RT_MULTIPATH))
        .context("the route to the group never became multipath in fp_fib4")?;
    for _ in 0..n {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        wait_idle(daemon_pid, stop)?;
        let before = route(fib4)?;
        out.shrink.push(ip.time_until(&format!("nexthop replace id {g} group {a}"), moved(before))?);
        wait_idle(daemon_pid, stop)?;
        let before = route(fib4)?;
        out.grow.push(ip.time_until(&format!("nexthop replace id {g} group {a}/{b}"), moved(before))?);
    }
    ip.write(&format!("route del {PREFIX}"))?;
    let t = Instant::now();
    while route(fib4)?.is_some() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 0..n {
        if i > 0 {
            ip.write(&format!("nexthop add id {a} via {} dev r1", GW[0]))?;
            ip.write(&format!("nexthop add id {b} via {} dev r1", GW[1]))?;
            ip.write(&format!("nexthop add id {g} group {a}/{b}"))?;
        }
        wait_idle(daemon_pid, stop)?;
        let cpu = || process_cpu_time(daemon_pid).context("reading the daemon's CPU time");
        let before = cpu()?;
        for id in [g, a, b] {
            ip.write(&format!("nexthop del id {id}"))?;
        }
        out.unused_busy.push(wait_idle(daemon_pid, stop)?.as_secs_f64());
        out.unused_cpu.push(cpu()?.saturating_sub(before).as_secs_f64());
    }
    Ok(out)
}

/// Type and next hop or group id of fp_fib4's entry for PREFIX, if there is
/// one (nothing in the generated table or the lab covers it, as for the
/// single changes).
fn route(fib4: &MapHandle) -> Result<Option<(u8, u32)>> {
    let mut key = u32::from(KEY.1).to_ne_bytes().to_vec();
    key.extend_from_slice(&KEY.0);
    let Some(v) = fib4.lookup(&key, MapFlags::ANY).context("looking up fp_fib4")? else {
        return Ok(None);
    };
    let t = v.get(offset_of!(fp_route, type_)).copied().unwrap_or(0);
    let off = offset_of!(fp_route, nh_id);
    let id = v.get(off..off + 4).map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    Ok(Some((t, id)))
}
