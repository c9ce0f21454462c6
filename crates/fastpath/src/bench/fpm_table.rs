//! `fastpath bench fpm`: a full routing table delivered over FPM, the way
//! FRR's zebra (dplane_fpm_nl) delivers it to `fastpath run --route-source
//! fpm`, and what it costs: seconds to send it, until fp_fib4/fp_fib6 hold it
//! and until every route's offload status came back; the latency of one
//! route change with the table present (FPM message -> entry in the BPF map,
//! and -> RTM_F_OFFLOAD status back); the daemon's CPU under steady route
//! churn; and a zebra restart (reconnect, whole table replayed) until the
//! daemon is idle again. The FPM counterpart of `fastpath bench fulltable`
//! (tablesync.rs), with the same generated table and probe routes.
//!
//! The client (fpm_client.rs) plays zebra: BGP routes (protocol 186, metric
//! 20, main table) with gateway and output interface, packed many to a
//! frame, and a reader thread that takes in every status reply at once, as
//! zebra does (the daemon's writes time out after 1 s otherwise).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use libbpf_rs::MapHandle;

use super::fpm_client::{self, Client, Route, TableStatus};
use super::fulltable::{self, Gateway};
use super::router::{self, Daemon};
use super::tablesync::{
    indent, lpm_key, max, median, present, run_ip, summary, wait_idle, wait_mirrored, wait_stable, Churn, TableArgs, PROBE4, PROBE6,
};
use super::topo::{self, Topology};
use crate::api;

#[derive(Debug, Clone, clap::Args)]
pub struct FpmArgs {
    /// The same table as `bench fulltable` with the same seed.
    #[command(flatten)]
    pub table: TableArgs,
    /// Single-route add/delete pairs timed per family with the full table present.
    #[arg(long, default_value_t = 20)]
    pub changes: usize,
    /// Steady churn with the full table present: route changes per second
    /// (IPv4 /32s in 203.0.113.0/24, added then deleted in turn; 0: skip).
    #[arg(long, default_value_t = 200)]
    pub churn: u32,
    /// Seconds of steady churn (rounded up to whole add/delete cycles of 256 routes).
    #[arg(long, default_value_t = 5)]
    pub churn_secs: u64,
    /// zebra restarts: the connection closed, a new one made and the whole
    /// table sent again, timed until the daemon is idle (0: skip).
    #[arg(long, default_value_t = 1)]
    pub replays: usize,
    /// Give up waiting for the mirror after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// TCP port the daemon's FPM server listens on (127.0.0.1 in the router namespace).
    #[arg(long, default_value_t = 2620)]
    pub port: u16,
}

/// How long the status replies may pause before the bench stops waiting
/// for the rest (a daemon that sends none, e.g. an older one being A/B'd).
const STATUS_QUIET: Duration = Duration::from_secs(10);
/// Longest wait for one change to reach the map.
const CHANGE_LIMIT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Results {
    send_s: f64,
    mirrored_s: f64,
    status: TableStatus,
    idle_s: f64,
    change: Vec<Changes>,
    churn: Option<Churn>,
    replays: Vec<Replay>,
}

/// One family's single changes, seconds each.
struct Changes {
    fam: &'static str,
    /// Add until in the map.
    adds: Vec<f64>,
    /// Add until its OFFLOAD status arrived.
    stats: Vec<f64>,
    /// Delete until gone from the map.
    dels: Vec<f64>,
}

struct Replay {
    send_s: f64,
    idle_s: f64,
    status: TableStatus,
    occupancy_ok: bool,
}

pub fn run(a: &FpmArgs, exe: &Path, work: &Path, stop: &AtomicBool) -> Result<()> {
    let n = a.table.v4 + a.table.v6;
    println!("fastpath bench fpm: {} IPv4 + {} IPv6 routes over FPM (seed {})", a.table.v4, a.table.v6, a.table.seed);
    let topo = Topology::create()?;
    let r = topo.router.clone();
    for (addr, dev) in [("2001:db8:0:1::1/64", topo::R0), ("2001:db8:0:2::1/64", topo::R1)] {
        run_ip(&["-n", &r, "addr", "add", addr, "dev", dev, "nodad"])?;
    }
    // The link-local addresses' DAD would otherwise add local-table
    // entries after the daemon's base occupancy was taken.
    wait_no_tentative(&r, stop)?;
    let oif = |g: &Gateway| topo.ifindex(&r, &g.dev);
    let route = |dst: IpAddr, len: u8, g: &Gateway| -> Result<Route> { Ok(Route { dst, len, gw: g.addr, oif: oif(g)? }) };

    // The whole table as zebra would stream it, encoded once (and sent
    // again as is by each replay).
    let t = Instant::now();
    let (gw4, gw6) = fulltable::lab_gateways();
    let mut routes = Vec::with_capacity(n);
    for (i, (p, l)) in fulltable::prefixes4(a.table.seed, a.table.v4).into_iter().enumerate() {
        routes.push(route(p.into(), l, &gw4[i % gw4.len()])?);
    }
    for (i, (p, l)) in fulltable::prefixes6(a.table.seed, a.table.v6).into_iter().enumerate() {
        routes.push(route(p.into(), l, &gw6[i % gw6.len()])?);
    }
    let table = fpm_client::frames(routes.iter().zip(1u32..).map(|(r, seq)| fpm_client::add_msg(r, seq)))?;
    drop(routes);
    println!(
        "generated the table and encoded it as {:.1} MiB of FPM frames in {:.2} s",
        table.len() as f64 / 1048576.0,
        t.elapsed().as_secs_f64()
    );
    let probe4 = probe(&PROBE4.0, PROBE4.1, PROBE4.2)?;
    let probe6 = probe(&PROBE6.0, PROBE6.1, PROBE6.2)?;
    let (probe4, probe6) = (route(probe4.0, probe4.1, &probe4.2)?, route(probe6.0, probe6.1, &probe6.2)?);

    // 1. The daemon, with routes from FPM.
    let listen = SocketAddr::from(([127, 0, 0, 1], a.port));
    let mut daemon_args = a.table.fib_room();
    daemon_args.extend([
        "--route-source".into(),
        "fpm".into(),
        "--fpm-listen".into(),
        listen.to_string(),
    ]);
    let timeout = Duration::from_secs(a.timeout);
    let mut res = Results::default();
    let mut d = Daemon::spawn_with(&topo, exe, work, &daemon_args)?;
    d.wait_ready(Duration::from_secs(30), stop)?;
    let base = wait_stable(d.socket(), stop)?;
    println!("-- daemon up (fib4 {} / fib6 {} entries of its own); zebra connects to {listen}", base.fib4, base.fib6);
    let mut c = Client::connect(&r, listen, Duration::from_secs(10))?;

    // 2. The whole table.
    println!("-- the whole table over FPM");
    let want = (base.fib4 + a.table.v4 as u64, base.fib6 + a.table.v6 as u64);
    let t0 = Instant::now();
    c.send(&table, stop)?;
    res.send_s = t0.elapsed().as_secs_f64();
    println!("   sent {n} routes in {:.3} s", res.send_s);
    let done = wait_mirrored(d.socket(), want, t0, timeout, stop, &d)?;
    res.mirrored_s = done.since.as_secs_f64();
    println!("   in fp_fib4/fp_fib6 {:.2} s after the first route", res.mirrored_s);
    res.status = c.replies().wait_all(n, t0, STATUS_QUIET, timeout, stop)?;
    println!("   status replies: {}", status_line(&res.status, n));

    // 3. One route at a time with the table present.
    println!("-- single route changes with the full table present");
    let settled = wait_idle(d.pid(), stop)?;
    res.idle_s = settled.as_secs_f64();
    println!("   daemon idle {:.2} s after the statuses", res.idle_s);
    let fib4 = router::fastpath_map(&topo, "fp_fib4")?;
    let fib6 = router::fastpath_map(&topo, "fp_fib6")?;
    for (fam, map, p) in [("IPv4", &fib4, &probe4), ("IPv6", &fib6, &probe6)] {
        let key = lpm_key(&octets(&p.dst), p.len);
        let (mut adds, mut stats, mut dels) = (Vec::new(), Vec::new(), Vec::new());
        let mut missing = 0;
        for _ in 0..a.changes {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            let msg = fpm_client::add_msg(p, c.next_seq());
            let t = Instant::now();
            adds.push(time_until(&mut c, msg, t, || present(map, &key))?);
            match c.replies().wait_offloaded((p.dst, p.len), t, CHANGE_LIMIT) {
                Some(s) => stats.push(s.as_secs_f64()),
                None => missing += 1,
            }
            let msg = fpm_client::del_msg(p.dst, p.len, c.next_seq());
            dels.push(time_until(&mut c, msg, Instant::now(), || Ok(!present(map, &key)?))?);
        }
        println!("   {fam} add: {}   delete: {}", summary(&adds), summary(&dels));
        println!(
            "   {fam} add's OFFLOAD status: {}{}",
            summary(&stats),
            if missing > 0 { format!(" ({missing} never came)") } else { String::new() }
        );
        res.change.push(Changes { fam, adds, stats, dels });
    }

    // 4. Steady churn.
    if a.churn > 0 {
        let ch = churn(&mut c, &fib4, &probe4, d.pid(), a.churn, Duration::from_secs(a.churn_secs), stop)?;
        println!("   steady route churn: {}", ch.line(a.churn));
        res.churn = Some(ch);
    }

    // 5. zebra restarts and replays everything.
    for i in 0..a.replays {
        println!("-- replay {}: zebra reconnects and sends the whole table again", i + 1);
        // What readers see lags a big table's last changes by up to 0.5 s.
        let before = wait_stable(d.socket(), stop)?;
        c.close();
        let t0 = Instant::now();
        c = Client::connect(&r, listen, Duration::from_secs(10))?;
        c.send(&table, stop)?;
        let send_s = t0.elapsed().as_secs_f64();
        let waited = t0.elapsed();
        let idle_s = (waited + wait_idle(d.pid(), stop)?).as_secs_f64();
        let status = c.replies().wait_all(n, t0, STATUS_QUIET, timeout, stop)?;
        let occ = wait_stable(d.socket(), stop)?;
        let occupancy_ok = (occ.fib4, occ.fib6) == want;
        println!(
            "   sent in {send_s:.3} s, daemon idle {idle_s:.2} s after the reconnect; fib4 {} / fib6 {} entries (before {} / {}, table + own {} / {}); status replies: {}",
            occ.fib4,
            occ.fib6,
            before.fib4,
            before.fib6,
            want.0,
            want.1,
            status_line(&status, n)
        );
        res.replays.push(Replay { send_s, idle_s, status, occupancy_ok });
    }

    // 6. What the daemon says, and stop.
    if let Some(src) = api::request(d.socket(), "status").ok().and_then(|v| v.get("route_source").cloned()) {
        println!("   daemon's route_source: {src}");
    }
    {
        let g = c.replies().lock();
        println!(
            "   replies on the last connection: {} OFFLOAD, {} OFFLOAD_FAILED, {} other{}",
            g.offload_msgs,
            g.failed_msgs,
            g.other_msgs,
            g.ended.as_ref().map(|e| format!("; reader ended: {e}")).unwrap_or_default()
        );
    }
    println!("   daemon log (tail):\n{}", indent(&d.log_tail()));
    c.close();
    d.stop()?;
    drop(d);
    drop((fib4, fib6));

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| FPM send of {n} routes (frames of many messages) | {:.3} s |", res.send_s);
    println!("| in fp_fib4/fp_fib6, from the first route | {:.2} s |", res.mirrored_s);
    println!("| all status replies, from the first route | {} |", status_cell(&res.status, n));
    println!("| daemon idle after the statuses | {:.2} s |", res.idle_s);
    for Changes { fam, adds, stats, dels } in &res.change {
        println!("| one {fam} route add: in the map, median / max | {} |", ms_pair(adds));
        println!("| one {fam} route add: OFFLOAD status back, median / max | {} |", ms_pair(stats));
        println!("| one {fam} route delete: gone from the map, median / max | {} |", ms_pair(dels));
    }
    if let Some(ch) = &res.churn {
        println!(
            "| daemon CPU under {:.0} route changes/s | {:.1} % ({:.3} ms per change) |",
            ch.changes as f64 / ch.wall.as_secs_f64(),
            ch.cpu_share() * 100.0,
            ch.ms_per_change()
        );
        println!("| last churn change in fp_fib4 | {:.2} ms |", ch.last_lag.as_secs_f64() * 1e3);
    }
    for (i, rp) in res.replays.iter().enumerate() {
        let k = i + 1;
        println!("| replay {k}: send of the whole table | {:.3} s |", rp.send_s);
        println!(
            "| replay {k}: daemon idle, from the reconnect | {:.2} s{} |",
            rp.idle_s,
            if rp.occupancy_ok { "" } else { " (occupancy wrong)" }
        );
        println!("| replay {k}: all status replies, from the reconnect | {} |", status_cell(&rp.status, n));
    }
    drop(topo);
    Ok(())
}

/// Waits (5 s at most) until no IPv6 address in `ns` is still tentative.
fn wait_no_tentative(ns: &str, stop: &AtomicBool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let out = std::process::Command::new("ip")
            .args(["-n", ns, "-6", "addr", "show", "tentative"])
            .output()
            .context("running ip (iproute2)")?;
        if out.stdout.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A tablesync probe (`PREFIX via GW dev DEV`) as prefix and gateway.
fn probe(addr: &[u8], len: u8, line: &str) -> Result<(IpAddr, u8, Gateway)> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let after = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1)).copied();
    let (Some(gw), Some(dev)) = (after("via"), after("dev")) else {
        bail!("probe route {line:?} has no via/dev");
    };
    let dst = match addr.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(addr)?),
        _ => IpAddr::from(<[u8; 16]>::try_from(addr).context("probe address")?),
    };
    Ok((dst, len, format!("{gw}@{dev}").parse()?))
}

fn octets(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Seconds from `t` (just before sending `msg`) until `done` holds.
fn time_until(c: &mut Client, msg: Vec<u8>, t: Instant, mut done: impl FnMut() -> Result<bool>) -> Result<f64> {
    c.send_msgs(vec![msg])?;
    while !done()? {
        if t.elapsed() > CHANGE_LIMIT {
            bail!("an FPM route change did not reach the map within {CHANGE_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// `rate` route changes a second for `secs`, paced as tablesync's churn:
/// host routes in 203.0.113.0/24 via the IPv4 probe's gateway, added in
/// turn, then deleted in turn, in whole cycles of 256. Ends with every one
/// deleted, and the last change in the map.
fn churn(c: &mut Client, fib4: &MapHandle, via: &Route, pid: u32, rate: u32, secs: Duration, stop: &AtomicBool) -> Result<Churn> {
    const N: u64 = 256;
    let cycle = N * 2;
    let total = (u64::from(rate) * secs.as_secs()).max(1).div_ceil(cycle) * cycle;
    let step = Duration::from_secs_f64(1.0 / f64::from(rate));
    let cpu0 = router::process_cpu_time(pid).context("reading the daemon's CPU time")?;
    let t0 = Instant::now();
    let mut last_lag = Duration::ZERO;
    for i in 0..total {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let host = (i % N) as u8;
        let add = i % cycle < N;
        let r = Route { dst: IpAddr::from([203, 0, 113, host]), len: 32, ..*via };
        let msg = if add { fpm_client::add_msg(&r, c.next_seq()) } else { fpm_client::del_msg(r.dst, 32, c.next_seq()) };
        if i + 1 == total {
            let key = lpm_key(&[203, 0, 113, host], 32);
            let lag = time_until(c, msg, Instant::now(), || Ok(present(fib4, &key)? == add))?;
            last_lag = Duration::from_secs_f64(lag);
        } else {
            c.send_msgs(vec![msg])?;
        }
        if let Some(wait) = (t0 + step * (i as u32 + 1)).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let wall = t0.elapsed();
    let cpu = router::process_cpu_time(pid).context("reading the daemon's CPU time")?.saturating_sub(cpu0);
    Ok(Churn { changes: total, wall, cpu, last_lag })
}

fn status_line(s: &TableStatus, n: usize) -> String {
    match s.last {
        Some(t) => format!("all {n} in {:.2} s ({} offloaded, {} failed)", t.as_secs_f64(), s.offloaded, s.prefixes - s.offloaded),
        None => format!("only {} of {n} prefixes got one ({} offloaded)", s.prefixes, s.offloaded),
    }
}

fn status_cell(s: &TableStatus, n: usize) -> String {
    match s.last {
        Some(t) if s.offloaded == n => format!("{:.2} s", t.as_secs_f64()),
        Some(t) => format!("{:.2} s ({} failed)", t.as_secs_f64(), s.prefixes - s.offloaded),
        None => format!("incomplete ({} of {n})", s.prefixes),
    }
}

fn ms_pair(v: &[f64]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    format!("{:.2} / {:.2} ms", median(v) * 1e3, max(v) * 1e3)
}
