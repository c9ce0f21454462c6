//! `fastpath bench fulltable`: a full routing table in the lab router, and
//! what fastpath makes of it: seconds until it is mirrored (routes loaded
//! while the daemon runs, and daemon started with the routes present), BPF
//! map memory per route, the latency of one route change with the full
//! table present (netlink write -> entry visible in the BPF map), and the
//! daemon's CPU under steady route and neighbour churn, and how long a link
//! losing or regaining carrier and an address taken over take to reach the
//! maps (failover.rs).
//!
//! Memory is measured two ways, both printed: the maps' own accounting
//! (`memlock:` in the map fd's fdinfo, what `bpftool map show` prints), and
//! the kernel's Slab + VmallocUsed + Percpu from /proc/meminfo before and
//! after the daemon fills its tables (system-wide, so other activity on the
//! box adds noise).

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::fulltable::{self, Gateway, Spec};
use super::ecmp_changes;
use super::failover;
use super::router::{self, Daemon};
use super::topo::{self, Topology};
use crate::api;

/// The generated table (fulltable.rs): both `bench fulltable` and `bench fpm` take it.
#[derive(Debug, Clone, clap::Args)]
pub struct TableArgs {
    /// IPv4 routes in the table.
    #[arg(long, default_value_t = 1_000_000)]
    pub v4: usize,
    /// IPv6 routes in the table.
    #[arg(long, default_value_t = 100_000)]
    pub v6: usize,
    /// Seed of the prefix generator: the same seed gives the same table.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl TableArgs {
    /// Daemon options sizing its FIBs for the table plus the lab's own routes.
    pub(super) fn fib_room(&self) -> Vec<String> {
        vec![
            "--fib4-entries".into(),
            (self.v4 + self.v4 / 10 + 1024).to_string(),
            "--fib6-entries".into(),
            (self.v6 + self.v6 / 10 + 1024).to_string(),
        ]
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct FulltableArgs {
    /// Only write the table as an `ip -batch` file and exit (no root needed).
    #[arg(long, value_name = "FILE")]
    pub emit: Option<PathBuf>,
    /// With --emit: write `route del` lines instead of `route add`.
    #[arg(long)]
    pub delete: bool,
    #[command(flatten)]
    pub table: TableArgs,
    /// IPv4 next hops as ADDR@DEV, comma-separated (default: the bench lab's).
    #[arg(long, value_delimiter = ',')]
    pub gw4: Vec<Gateway>,
    /// IPv6 next hops as ADDR@DEV, comma-separated (default: the bench lab's).
    #[arg(long, value_delimiter = ',')]
    pub gw6: Vec<Gateway>,
    /// Single-route add/delete pairs timed per family with the full table present.
    #[arg(long, default_value_t = 20)]
    pub changes: usize,
    /// Steady churn with the full table present: route changes per second
    /// (IPv4 /32s in 203.0.113.0/24, added then deleted in turn; 0: skip).
    #[arg(long, default_value_t = 200)]
    pub churn: u32,
    /// Seconds of steady churn.
    #[arg(long, default_value_t = 5)]
    pub churn_secs: u64,
    /// Steady neighbour churn with the full table present: neighbour changes
    /// per second (permanent entries for 198.51.100.100-227 on r1, added
    /// then deleted in turn, for --churn-secs; 0: skip).
    #[arg(long, default_value_t = 50)]
    pub neigh_churn: u32,
    /// Link flaps with the full table present: r1 loses carrier and gets it
    /// back, each timed until r1's fp_ifaces entry follows (0: skip).
    #[arg(long, default_value_t = 3)]
    pub link_flaps: usize,
    /// Address takeovers with the full table present: 198.51.100.77/32
    /// added to r0 and removed, each timed until fp_fib4 follows (0: skip).
    #[arg(long, default_value_t = 3)]
    pub takeovers: usize,
    /// r0's last IPv4 address removed with the full table present (the
    /// kernel flushes the table's routes via r0: half the IPv4 ones), each
    /// timed until r0's fp_ifaces entry punts IPv4 and until the recompute
    /// lifts that; address and routes put back after each (0: skip).
    #[arg(long, default_value_t = 3)]
    pub addr_losses: usize,
    /// ECMP changes with the full table present: a multipath route added
    /// and deleted, a next-hop group object losing a path and getting it
    /// back, each this many times, timed until fp_fib4 follows (0: skip).
    #[arg(long, default_value_t = 3)]
    pub ecmp: usize,
    /// Give up waiting for the mirror after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

impl FulltableArgs {
    fn spec(&self) -> Spec {
        let (gw4, gw6) = fulltable::lab_gateways();
        Spec {
            seed: self.table.seed,
            v4: self.table.v4,
            v6: self.table.v6,
            gw4: if self.gw4.is_empty() { gw4 } else { self.gw4.clone() },
            gw6: if self.gw6.is_empty() { gw6 } else { self.gw6.clone() },
        }
    }
}

/// `--emit FILE`: the batch file alone.
pub fn emit(a: &FulltableArgs, path: &Path) -> Result<()> {
    let spec = a.spec();
    let text = fulltable::batch(&spec, if a.delete { "del" } else { "add" })?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {} ({} IPv4 + {} IPv6 routes, seed {})", path.display(), spec.v4, spec.v6, spec.seed);
    print_mix(&spec);
    Ok(())
}

fn print_mix(spec: &Spec) {
    let fmt = |h: Vec<(u8, usize)>, n: usize| {
        h.iter()
            .map(|(l, c)| format!("/{l} {:.1}%", *c as f64 * 100.0 / n.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let h4 = fulltable::length_histogram(fulltable::prefixes4(spec.seed, spec.v4).iter().map(|p| p.1));
    let h6 = fulltable::length_histogram(fulltable::prefixes6(spec.seed, spec.v6).iter().map(|p| p.1));
    println!("IPv4 mix: {}", fmt(h4, spec.v4));
    println!("IPv6 mix: {}", fmt(h6, spec.v6));
}

/// The probe routes timed one at a time: outside everything the generator
/// produces (documentation space), so a lookup finds them or nothing.
pub(super) const PROBE4: ([u8; 4], u8, &str) = ([203, 0, 113, 0], 24, "203.0.113.0/24 via 198.51.100.10 dev r1");
pub(super) const PROBE6: ([u8; 16], u8, &str) = (
    [0x20, 0x01, 0x0d, 0xb8, 0x0f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    48,
    "2001:db8:fff::/48 via 2001:db8:0:2::10 dev r1",
);

pub fn run(a: &FulltableArgs, exe: &Path, work: &Path, stop: &AtomicBool) -> Result<()> {
    let spec = a.spec();
    println!("fastpath bench fulltable: {} IPv4 + {} IPv6 routes (seed {})", spec.v4, spec.v6, spec.seed);
    print_mix(&spec);
    let t = Instant::now();
    let add = work.join("add.batch");
    std::fs::write(&add, fulltable::batch(&spec, "add")?).context("writing the route batch")?;
    println!("generated the batch in {:.2} s", t.elapsed().as_secs_f64());

    let topo = Topology::create()?;
    let r = topo.router.clone();
    for (addr, dev) in [("2001:db8:0:1::1/64", topo::R0), ("2001:db8:0:2::1/64", topo::R1)] {
        run_ip(&["-n", &r, "addr", "add", addr, "dev", dev, "nodad"])?;
    }
    let daemon_args = a.table.fib_room();
    let timeout = Duration::from_secs(a.timeout);
    let mut res = Results::default();

    // 1. Daemon first, then the routes arrive.
    println!("-- routes loaded while fastpath runs");
    let mut d = Daemon::spawn_with(&topo, exe, work, &daemon_args)?;
    d.wait_ready(Duration::from_secs(30), stop)?;
    let base = wait_stable(d.socket(), stop)?;
    let empty_memlock = map_memlock(&topo)?;
    let t0 = Instant::now();
    run_ip(&["-n", &r, "-batch", &path_str(&add)?])?;
    res.load_s = t0.elapsed().as_secs_f64();
    println!("   ip -batch took {:.2} s", res.load_s);
    let want = (base.fib4 + spec.v4 as u64, base.fib6 + spec.v6 as u64);
    let done = wait_mirrored(d.socket(), want, t0, timeout, stop, &d)?;
    res.live_from_start_s = done.since.as_secs_f64();
    res.live_after_load_s = (done.since.as_secs_f64() - res.load_s).max(0.0);
    res.live_resyncs = done.occ.resyncs - base.resyncs;
    println!(
        "   mirrored {:.2} s after the first route ({:.2} s after ip -batch returned), {} netlink resyncs",
        res.live_from_start_s, res.live_after_load_s, res.live_resyncs
    );

    // 2. One route at a time with the full table present.
    println!("-- single route changes with the full table present");
    // The counts can be complete while the daemon still has a netlink
    // overrun of the load to find (its resync takes seconds): time the
    // changes, not the load's tail.
    let settled = wait_idle(d.pid(), stop)?;
    println!("   daemon idle {:.2} s after the counts were complete", settled.as_secs_f64());
    let fib4 = router::fastpath_map(&topo, "fp_fib4")?;
    let fib6 = router::fastpath_map(&topo, "fp_fib6")?;
    let mut ip = Batch::start(&r, work)?;
    for (map, probe) in [(&fib4, lpm_key(&PROBE4.0, PROBE4.1)), (&fib6, lpm_key(&PROBE6.0, PROBE6.1))] {
        let line = if map.name() == "fp_fib4" { PROBE4.2 } else { PROBE6.2 };
        let (adds, dels) = (&mut Vec::new(), &mut Vec::new());
        for _ in 0..a.changes {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            adds.push(ip.time_until(&format!("route add {line}"), || present(map, &probe))?);
            let prefix = line.split_whitespace().next().unwrap_or_default();
            dels.push(ip.time_until(&format!("route del {prefix}"), || Ok(!present(map, &probe)?))?);
        }
        let fam = if map.name() == "fp_fib4" { "IPv4" } else { "IPv6" };
        println!("   {fam} add: {}   delete: {}", summary(adds), summary(dels));
        res.change.push((fam, median(adds), max(adds), median(dels), max(dels)));
    }
    let secs = Duration::from_secs(a.churn_secs);
    if a.churn > 0 {
        let c = churn(&mut ip, &fib4, d.pid(), a.churn, secs, stop)?;
        println!("   steady route churn: {}", c.line(a.churn));
        res.churn = Some(c);
    }
    if a.neigh_churn > 0 {
        let neigh4 = router::fastpath_map(&topo, "fp_neigh4")?;
        let ifindex = topo.ifindex(&r, "r1")?;
        let c = neigh_churn(&mut ip, &neigh4, ifindex, d.pid(), a.neigh_churn, secs, stop)?;
        println!("   steady neighbour churn: {}", c.line(a.neigh_churn));
        res.neigh_churn = Some(c);
    }
    if a.ecmp > 0 {
        let e = ecmp_changes::ecmp_changes(&r, &mut ip, &fib4, d.pid(), a.ecmp, stop)?;
        println!("   multipath route added: multipath in fp_fib4 after {}", summary(&e.route_add));
        println!("   and deleted: gone after {}", summary(&e.route_del));
        println!("   next-hop group loses a path: its route on the new group in fp_fib4 after {}", summary(&e.shrink));
        println!("   and gets it back: on the next group after {}", summary(&e.grow));
        println!("   unused group and paths deleted: daemon CPU {}, busy for {}", summary(&e.unused_cpu), summary(&e.unused_busy));
        res.ecmp = Some(e);
    }
    drop(ip);
    if a.link_flaps > 0 {
        let f = failover::link_flaps(&topo, d.pid(), a.link_flaps, stop)?;
        println!("   r1 loses carrier: down in fp_ifaces after {}", summary(&f.down));
        println!("   r1 gets carrier back: up in fp_ifaces after {}", summary(&f.up));
        res.flaps = Some(f);
    }
    if a.takeovers > 0 {
        let f = failover::address_takeovers(&topo, d.pid(), a.takeovers, stop)?;
        println!("   198.51.100.77/32 added to r0: local in fp_fib4 after {}", summary(&f.down));
        println!("   and removed: no longer local after {}", summary(&f.up));
        res.takeovers = Some(f);
    }
    if a.addr_losses > 0 {
        // The table's IPv4 routes via r0's gateways go with its address.
        let text = std::fs::read_to_string(&add).context("reading the route batch")?;
        let r0_routes: String = text
            .lines()
            .filter(|l| l.ends_with(&format!(" dev {}", topo::R0)) && !l.contains(':'))
            .map(|l| format!("{}\n", l.replacen("route add", "route replace", 1)))
            .collect();
        let r0_batch = work.join("r0.batch");
        std::fs::write(&r0_batch, r0_routes).context("writing the r0 route batch")?;
        let restore = || {
            run_ip(&["-n", &r, "-batch", &path_str(&r0_batch)?])?;
            wait_mirrored(d.socket(), want, Instant::now(), timeout, stop, &d).map(|_| ())
        };
        let f = failover::address_losses(&topo, d.pid(), a.addr_losses, stop, restore)?;
        println!("   r0's last IPv4 address removed: IPv4 out of r0 punted after {}", summary(&f.punted));
        println!("   (`ip addr del`, the kernel flushing r0's routes, returned after {})", summary(&f.ip));
        println!("   and the recompute lifted the punt after {}", summary(&f.lifted));
        res.addr_losses = Some(f);
    }
    let full_memlock = map_memlock(&topo)?;
    res.daemon_rss_grown_kb = status_kb(d.pid(), "VmRSS:");
    println!("   daemon log (tail):\n{}", indent(&d.log_tail()));
    d.stop()?;
    drop(d);
    drop((fib4, fib6));

    // 3. Routes first, then the daemon starts.
    println!("-- fastpath started with the routes present");
    // Freed maps go back through RCU; let the numbers settle.
    std::thread::sleep(Duration::from_secs(2));
    let mem_before = kernel_mem_kb()?;
    let t0 = Instant::now();
    let mut d = Daemon::spawn_with(&topo, exe, work, &daemon_args)?;
    let done = wait_mirrored(d.socket(), want, t0, timeout, stop, &d)?;
    res.start_s = done.since.as_secs_f64();
    println!("   mirrored {:.2} s after the daemon was started", res.start_s);
    std::thread::sleep(Duration::from_secs(2));
    let mem_after = kernel_mem_kb()?;
    // By now the daemon has handed the start's garbage back to the system
    // (heap::Trimmer, at its loop's first round): its steady size.
    res.daemon_rss_kb = status_kb(d.pid(), "VmRSS:");
    res.daemon_hwm_kb = status_kb(d.pid(), "VmHWM:");
    let start_memlock = map_memlock(&topo)?;
    println!("   daemon log (tail):\n{}", indent(&d.log_tail()));
    d.stop()?;
    drop(d);

    let routes = (spec.v4 + spec.v6) as f64;
    println!("-- BPF map memory (memlock accounting), empty -> full table");
    for (name, full) in &start_memlock {
        let empty = empty_memlock.iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap_or(0);
        println!("   {name:<14} {:>12} -> {:>12} B", empty, full);
    }
    let sum = |v: &[(String, u64)]| v.iter().map(|(_, b)| *b).sum::<u64>();
    let get = |v: &[(String, u64)], n: &str| v.iter().find(|(m, _)| m == n).map(|(_, b)| *b).unwrap_or(0);
    res.memlock_total = sum(&start_memlock);
    res.memlock_delta = sum(&start_memlock).saturating_sub(sum(&empty_memlock));
    let fib4_b = get(&start_memlock, "fp_fib4") as f64 / spec.v4.max(1) as f64;
    let fib6_b = get(&start_memlock, "fp_fib6") as f64 / spec.v6.max(1) as f64;
    println!(
        "   per route: all maps {:.1} B (total {} B / {} routes), growth {:.1} B; fp_fib4 {:.1} B per IPv4 route, fp_fib6 {:.1} B per IPv6 route",
        res.memlock_total as f64 / routes,
        res.memlock_total,
        routes,
        res.memlock_delta as f64 / routes,
        fib4_b,
        fib6_b
    );
    let kmem = (mem_after as f64 - mem_before as f64) * 1024.0;
    println!(
        "   kernel Slab+VmallocUsed+Percpu grew {:.1} MiB while the daemon filled its tables: {:.1} B per route (system-wide, noisy)",
        kmem / 1048576.0,
        kmem / routes
    );
    println!(
        "   daemon RSS {:.1} MiB ({:.0} B per route, user space; peak {:.1} MiB while it mirrored the table); \
         {:.1} MiB in the daemon that followed the table's load and the changes above",
        res.daemon_rss_kb as f64 / 1024.0,
        res.daemon_rss_kb as f64 * 1024.0 / routes,
        res.daemon_hwm_kb as f64 / 1024.0,
        res.daemon_rss_grown_kb as f64 / 1024.0
    );
    println!("   (the full table after the change tests held {} B of memlock)", sum(&full_memlock));

    println!();
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!("| `ip -batch` of {} routes (kernel) | {:.2} s | |", spec.v4 + spec.v6, res.load_s);
    // The target is the mirror's: from the first route it includes the
    // kernel's own `ip -batch`, the row above.
    println!("| mirrored, routes loaded while running (from first route) | {:.2} s | |", res.live_from_start_s);
    println!("| mirrored, after `ip -batch` returned | {:.2} s | <= 10 s |", res.live_after_load_s);
    println!("| mirrored, daemon started with routes present | {:.2} s | <= 10 s |", res.start_s);
    println!("| BPF map memory per route (memlock, all maps) | {:.1} B | <= 150 B |", res.memlock_total as f64 / routes);
    println!("| kernel memory growth per route (meminfo) | {:.1} B | |", kmem / routes);
    println!(
        "| daemon RSS: started with the table (peak) / after loading it live | {:.0} ({:.0}) / {:.0} MiB | |",
        res.daemon_rss_kb as f64 / 1024.0,
        res.daemon_hwm_kb as f64 / 1024.0,
        res.daemon_rss_grown_kb as f64 / 1024.0
    );
    for (fam, am, ax, dm, dx) in &res.change {
        println!("| one {fam} route add, median / max | {:.2} / {:.2} ms | |", am * 1e3, ax * 1e3);
        println!("| one {fam} route delete, median / max | {:.2} / {:.2} ms | |", dm * 1e3, dx * 1e3);
    }
    for (what, c) in [("route", &res.churn), ("neighbour", &res.neigh_churn)] {
        let Some(c) = c else { continue };
        println!(
            "| daemon CPU under {:.0} {what} changes/s | {:.1} % ({:.3} ms per change) | |",
            c.changes as f64 / c.wall.as_secs_f64(),
            c.cpu_share() * 100.0,
            c.ms_per_change()
        );
    }
    if let Some(e) = &res.ecmp {
        for (what, v) in [
            ("multipath route added", &e.route_add),
            ("multipath route deleted", &e.route_del),
            ("next-hop group loses a path", &e.shrink),
            ("next-hop group gets it back", &e.grow),
        ] {
            println!("| {what}: in fp_fib4, median / max | {:.2} / {:.2} ms | |", median(v) * 1e3, max(v) * 1e3);
        }
        println!(
            "| unused next-hop group and paths deleted: daemon CPU / busy, median | {:.1} / {:.1} ms | |",
            median(&e.unused_cpu) * 1e3,
            median(&e.unused_busy) * 1e3
        );
    }
    if let Some(f) = &res.flaps {
        println!("| r1 loses carrier: down in fp_ifaces, median / max | {:.2} / {:.2} ms | |", median(&f.down) * 1e3, max(&f.down) * 1e3);
        println!("| r1 gets carrier back: up in fp_ifaces, median / max | {:.2} / {:.2} ms | |", median(&f.up) * 1e3, max(&f.up) * 1e3);
    }
    if let Some(f) = &res.takeovers {
        println!("| address added: local in fp_fib4, median / max | {:.2} / {:.2} ms | |", median(&f.down) * 1e3, max(&f.down) * 1e3);
        println!("| address removed: not local, median / max | {:.2} / {:.2} ms | |", median(&f.up) * 1e3, max(&f.up) * 1e3);
    }
    if let Some(f) = &res.addr_losses {
        for (what, v) in [
            ("last IPv4 address removed: IPv4 punted", &f.punted),
            ("`ip addr del` returned (kernel flush)", &f.ip),
            ("the punt lifted by the recompute", &f.lifted),
        ] {
            println!("| {what}, median / max | {:.2} / {:.2} ms | |", median(v) * 1e3, max(v) * 1e3);
        }
    }
    drop(topo);
    Ok(())
}

#[derive(Default)]
struct Results {
    load_s: f64,
    live_from_start_s: f64,
    live_after_load_s: f64,
    live_resyncs: u64,
    start_s: f64,
    memlock_total: u64,
    memlock_delta: u64,
    daemon_rss_kb: u64,
    daemon_hwm_kb: u64,
    daemon_rss_grown_kb: u64,
    change: Vec<(&'static str, f64, f64, f64, f64)>,
    churn: Option<Churn>,
    neigh_churn: Option<Churn>,
    ecmp: Option<ecmp_changes::EcmpTimes>,
    flaps: Option<failover::Flaps>,
    takeovers: Option<failover::Flaps>,
    addr_losses: Option<failover::Losses>,
}

pub(super) struct Churn {
    pub(super) changes: u64,
    pub(super) wall: Duration,
    /// The daemon's CPU time over `wall`.
    pub(super) cpu: Duration,
    /// From writing the last change until the map had it.
    pub(super) last_lag: Duration,
}

impl Churn {
    pub(super) fn cpu_share(&self) -> f64 {
        self.cpu.as_secs_f64() / self.wall.as_secs_f64()
    }

    pub(super) fn ms_per_change(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e3 / self.changes as f64
    }

    pub(super) fn line(&self, rate: u32) -> String {
        format!(
            "{} changes in {:.1} s ({rate} /s): daemon CPU {:.1} % of one core, {:.3} ms per change; last change in the map {:.2} ms after it was written",
            self.changes,
            self.wall.as_secs_f64(),
            self.cpu_share() * 100.0,
            self.ms_per_change(),
            self.last_lag.as_secs_f64() * 1e3
        )
    }
}

/// `rate` route changes a second for `secs`, paced: host routes in
/// 203.0.113.0/24 (outside the generated table) added in turn, then deleted
/// in turn. Ends with every one deleted, and the last change in the map.
fn churn(ip: &mut Batch, fib4: &MapHandle, pid: u32, rate: u32, secs: Duration, stop: &AtomicBool) -> Result<Churn> {
    paced(ip, pid, rate, secs, 256, stop, |i, add| {
        let line = if add {
            format!("route add 203.0.113.{i}/32 via 198.51.100.10 dev r1")
        } else {
            format!("route del 203.0.113.{i}/32")
        };
        let probe = lpm_key(&[203, 0, 113, i as u8], 32);
        (line, Box::new(move || Ok(present(fib4, &probe)? == add)))
    })
}

/// `rate` neighbour changes a second for `secs`: permanent entries for
/// 198.51.100.100-227 on r1 (the lab's own subnet; nothing is sent to them)
/// added in turn, then deleted in turn.
fn neigh_churn(
    ip: &mut Batch,
    fib: &MapHandle,
    ifindex: u32,
    pid: u32,
    rate: u32,
    secs: Duration,
    stop: &AtomicBool,
) -> Result<Churn> {
    paced(ip, pid, rate, secs, 128, stop, |i, add| {
        let host = 100 + i;
        let line = if add {
            format!("neigh replace 198.51.100.{host} lladdr 02:00:00:00:01:{host:02x} dev r1 nud permanent")
        } else {
            format!("neigh del 198.51.100.{host} dev r1")
        };
        let mut key = ifindex.to_ne_bytes().to_vec();
        key.extend_from_slice(&[198, 51, 100, host as u8]);
        (line, Box::new(move || Ok(present(fib, &key)? == add)))
    })
}

type Check<'a> = Box<dyn FnMut() -> Result<bool> + 'a>;

/// Writes `rate` changes a second for `secs` (rounded up to whole add and
/// delete cycles over `n` objects): `change(i, add)` gives the line for
/// object i and the check that the map has it. Times the last one.
fn paced<'a>(
    ip: &mut Batch,
    pid: u32,
    rate: u32,
    secs: Duration,
    n: u32,
    stop: &AtomicBool,
    change: impl Fn(u32, bool) -> (String, Check<'a>),
) -> Result<Churn> {
    let cycle = u64::from(n) * 2;
    let total = (u64::from(rate) * secs.as_secs()).max(1).div_ceil(cycle) * cycle;
    let step = Duration::from_secs_f64(1.0 / f64::from(rate));
    let cpu0 = router::process_cpu_time(pid).context("reading the daemon's CPU time")?;
    let t0 = Instant::now();
    let mut last_lag = Duration::ZERO;
    for i in 0..total {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let (line, done) = change((i % u64::from(n)) as u32, i % cycle < u64::from(n));
        if i + 1 == total {
            last_lag = Duration::from_secs_f64(ip.time_until(&line, done)?);
        } else {
            ip.write(&line)?;
        }
        if let Some(wait) = (t0 + step * (i as u32 + 1)).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let wall = t0.elapsed();
    let cpu = router::process_cpu_time(pid).context("reading the daemon's CPU time")?.saturating_sub(cpu0);
    Ok(Churn { changes: total, wall, cpu, last_lag })
}

pub(super) fn run_ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2)")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first: Vec<&str> = err.lines().take(5).collect();
        bail!("ip {}: {}", args.join(" "), first.join("; "));
    }
    Ok(())
}

pub(super) fn path_str(p: &Path) -> Result<String> {
    p.to_str().map(str::to_string).context("non-UTF-8 scratch path")
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Occ {
    pub(super) fib4: u64,
    pub(super) fib6: u64,
    resyncs: u64,
    generation: u64,
}

pub(super) fn occupancy(sock: &Path) -> Result<Occ> {
    let v = api::request(sock, "status")?;
    let n = |p: &str| v.pointer(p).and_then(|x| x.as_u64()).with_context(|| format!("status has no {p}"));
    Ok(Occ {
        fib4: n("/tables/fib4/used")?,
        fib6: n("/tables/fib6/used")?,
        resyncs: n("/netlink_resyncs")?,
        generation: n("/generation")?,
    })
}

/// The lab's own table as the daemon holds it once it stops changing.
pub(super) fn wait_stable(sock: &Path, stop: &AtomicBool) -> Result<Occ> {
    let mut last = occupancy(sock)?;
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let now = occupancy(sock)?;
        if (now.fib4, now.fib6, now.generation) == (last.fib4, last.fib6, last.generation) || start.elapsed() > Duration::from_secs(10) {
            return Ok(now);
        }
        last = now;
    }
}

pub(super) struct Mirrored {
    pub(super) since: Duration,
    occ: Occ,
}

/// Waits until process `pid` has used (almost) no CPU for a second; returns
/// how long that took.
pub(super) fn wait_idle(pid: u32, stop: &AtomicBool) -> Result<Duration> {
    const STEP: Duration = Duration::from_millis(250);
    let start = Instant::now();
    let cpu = || router::process_cpu_time(pid).context("reading the daemon's CPU time");
    let mut last = cpu()?;
    let mut quiet = 0;
    while quiet < 4 {
        if start.elapsed() > Duration::from_secs(60) {
            bail!("the daemon kept busy for 60 s after mirroring the table");
        }
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        std::thread::sleep(STEP);
        let now = cpu()?;
        quiet = if now.saturating_sub(last) <= Duration::from_millis(10) { quiet + 1 } else { 0 };
        last = now;
    }
    Ok(start.elapsed() - STEP * 4)
}

/// Polls `status` until both FIBs hold `want` entries.
pub(super) fn wait_mirrored(sock: &Path, want: (u64, u64), t0: Instant, timeout: Duration, stop: &AtomicBool, d: &Daemon) -> Result<Mirrored> {
    let mut last = String::from("no answer yet");
    while t0.elapsed() < timeout {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        match occupancy(sock) {
            Ok(o) if o.fib4 >= want.0 && o.fib6 >= want.1 => return Ok(Mirrored { since: t0.elapsed(), occ: o }),
            Ok(o) => last = format!("fib4 {}/{}, fib6 {}/{}", o.fib4, want.0, o.fib6, want.1),
            Err(e) => last = format!("{e:#}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("not mirrored within {timeout:?} ({last}); status:\n{}\nlog:\n{}", d.status_text(), d.log_tail())
}

/// An LPM trie key (fp_lpm4_key / fp_lpm6_key): prefix length, then the
/// address in network order.
pub(super) fn lpm_key(addr: &[u8], len: u8) -> Vec<u8> {
    let mut k = u32::from(len).to_ne_bytes().to_vec();
    k.extend_from_slice(addr);
    k
}

pub(super) fn present(map: &MapHandle, key: &[u8]) -> Result<bool> {
    Ok(map.lookup(key, MapFlags::ANY).context("looking up the probe route")?.is_some())
}

/// `ip -force -batch -` kept open in the router namespace: a route change
/// costs one line on its stdin, not a process start.
pub(super) struct Batch {
    child: std::process::Child,
}

impl Batch {
    fn start(ns: &str, work: &Path) -> Result<Batch> {
        let err = std::fs::File::create(work.join("ip-batch.err")).context("creating ip-batch.err")?;
        let child = Command::new("ip")
            .args(["-n", ns, "-force", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .context("starting ip -batch -")?;
        Ok(Batch { child })
    }

    pub(super) fn write(&mut self, line: &str) -> Result<()> {
        let stdin = self.child.stdin.as_mut().context("ip -batch has no stdin")?;
        stdin.write_all(format!("{line}\n").as_bytes()).context("writing to ip -batch")?;
        stdin.flush().context("writing to ip -batch")
    }

    /// Seconds from writing `line` until `done` holds (10 s at most).
    pub(super) fn time_until(&mut self, line: &str, mut done: impl FnMut() -> Result<bool>) -> Result<f64> {
        let stdin = self.child.stdin.as_mut().context("ip -batch has no stdin")?;
        let t = Instant::now();
        stdin.write_all(format!("{line}\n").as_bytes()).context("writing to ip -batch")?;
        stdin.flush().context("writing to ip -batch")?;
        while !done()? {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("`ip {line}` did not reach the map within 10 s");
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(t.elapsed().as_secs_f64())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

pub(super) fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

pub(super) fn summary(v: &[f64]) -> String {
    format!("median {:.2} ms, max {:.2} ms (n={})", median(v) * 1e3, max(v) * 1e3, v.len())
}

/// memlock of every map of the program on r0, as the kernel accounts it.
fn map_memlock(t: &Topology) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for m in router::fastpath_maps(t)? {
        let fd = m.as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).context("reading map fdinfo")?;
        let bytes = info
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .context("no memlock in map fdinfo")?;
        out.push((m.name().to_string_lossy().into_owned(), bytes));
    }
    out.sort();
    Ok(out)
}

/// Slab + VmallocUsed + Percpu in KiB: where BPF maps live.
fn kernel_mem_kb() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    let mut sum = 0;
    for l in text.lines() {
        let mut w = l.split_whitespace();
        if let (Some(k), Some(v)) = (w.next(), w.next()) {
            if matches!(k, "Slab:" | "VmallocUsed:" | "Percpu:") {
                sum += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    Ok(sum)
}

/// A kB field of /proc/PID/status ("VmRSS:", "VmHWM:"); 0 if unreadable.
fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix(field)).map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0)))
        .unwrap_or(0)
}

pub(super) fn indent(text: &str) -> String {
    text.lines().map(|l| format!("     {l}")).collect::<Vec<_>>().join("\n")
}
