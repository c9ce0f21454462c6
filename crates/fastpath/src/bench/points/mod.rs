//! `fastpath bench points`: the execution-point study of paper 003 on this
//! box. The same workloads run at each point the kernel offers here —
//! native XDP, generic (skb) XDP, TC (cls_bpf direct action) and AF_XDP user
//! space — on the bench lab (generator – router, the router's r0 is the
//! device under test). NIC offload is not available (veth; no offload-capable
//! NIC or netdevsim), and the report says so with the kernel's answer.
//!
//! Workloads: (a) drop everything, 1 and many flows, 1 and 2 cores;
//! (b) N IPv4 header checksums per frame, then drop; (e) map update rates
//! from user space; (f) CPU time split (user / system / softirq) for every
//! cell of (a) and (b). (c) and (d), the DNS responders, plug in below.

mod attach;
pub(super) mod cpustat;
mod maps;
mod report;
mod xsk;

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::topo::{self, Topology};
use super::traffic::{Generator, Placement};
use attach::Attached;
use cpustat::CpuUse;

#[derive(Clone, Debug, clap::Args)]
pub struct PointsArgs {
    /// Smoke run: 1 flow, 1 core, N = 0 and 25, 1 k map sets, 1 x 0.3 s per cell.
    #[arg(long)]
    pub quick: bool,
    /// Workloads to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Workload::Drop, Workload::Csum, Workload::Maps, Workload::Dns])]
    pub workloads: Vec<Workload>,
    /// Execution points to measure (NIC offload is not available here).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Point::Native, Point::Generic, Point::Tc, Point::Afxdp])]
    pub points: Vec<Point>,
    /// Flow counts for the drop workload.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 10_000])]
    pub flows: Vec<u32>,
    /// Core counts for the drop workload (1 or 2).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2])]
    pub cores: Vec<usize>,
    /// Checksums per frame for the checksum workload.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0u32, 10, 25, 50, 100, 150])]
    pub csum: Vec<u32>,
    /// Map set sizes for the update-rate workload.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1_000u32, 1_000_000])]
    pub map_sizes: Vec<u32>,
    /// Repetitions per cell; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seconds per repetition.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// The CPU of the 1-core runs (the AF_XDP loop and the second core use the other one).
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
    /// Run the generator threads and the AF_XDP loop with normal scheduling instead of SCHED_FIFO.
    #[arg(long)]
    pub no_rt: bool,
    /// Write the results here (default: <out>/points.json).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for points.json and points.png.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

/// `fastpath bench dns`'s options, parsed for the DNS part of this bench.
#[derive(clap::Parser)]
struct DnsCli {
    #[command(flatten)]
    a: crate::bench::dns::DnsArgs,
}

/// What runs at each point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// (a) drop every frame.
    Drop,
    /// (b) N IPv4 checksums per frame, then drop.
    Csum,
    /// (e) map update rate from user space.
    Maps,
    /// (c) and (d): DNS responders (NXDOMAIN, small and large record sets)
    /// in XDP (native, generic) against a UDP socket server (bench/dns.rs).
    Dns,
}

/// Where the program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Point {
    /// XDP in the veth driver (native mode).
    Native,
    /// XDP on the skb path (XDP_FLAGS_SKB_MODE).
    Generic,
    /// cls_bpf direct action on the ingress clsact hook.
    Tc,
    /// AF_XDP socket, work done in a Rust thread (copy mode on veth).
    Afxdp,
}

impl Point {
    pub fn name(self) -> &'static str {
        match self {
            Point::Native => "native",
            Point::Generic => "generic",
            Point::Tc => "tc",
            Point::Afxdp => "afxdp",
        }
    }
}

/// One measured cell: a workload variant at one point, flows and cores.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub workload: Workload,
    pub point: Point,
    /// Checksums per frame (0 for drop).
    pub n: u32,
    pub flows: u32,
    pub cores: usize,
    /// Frames the point handled over all repetitions.
    pub packets: u64,
    pub mpps: Vec<f64>,
    pub median_mpps: f64,
    pub min_mpps: f64,
    pub max_mpps: f64,
    pub offered_mpps: f64,
    /// Frames per second of CPU time the bench's own threads got (generator
    /// threads, with the softirq work done in their context, plus the
    /// AF_XDP loop): the fairer figure on a shared box.
    pub mpps_per_cpu_s: f64,
    /// CPU use of the CPUs the cell ran on, mean over repetitions (workload f).
    pub cpus: Vec<usize>,
    pub cpu: CpuUse,
    /// CPU time per handled frame, by kind (ns).
    pub ns_per_packet_user: f64,
    pub ns_per_packet_system: f64,
    pub ns_per_packet_softirq: f64,
    pub ns_per_packet_total: f64,
    /// AF_XDP only: time its loop spent on frames (not polling) per frame.
    pub afxdp_work_ns_per_packet: Option<f64>,
}

/// A cell that could not run here, and why (e.g. 2 cores on a 1-CPU box).
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub workload: Workload,
    pub point: Point,
    pub flows: u32,
    pub cores: usize,
    pub why: String,
}

#[derive(Debug, Serialize)]
pub struct PointsReport {
    pub bench: &'static str,
    pub unix_time: u64,
    pub kernel_release: String,
    pub method: &'static str,
    pub reps: usize,
    pub duration_s: f64,
    pub points: Vec<Point>,
    pub nic_offload: String,
    pub notes: Vec<String>,
    pub drop: Vec<Cell>,
    pub csum: Vec<Cell>,
    pub maps: Vec<maps::UpdateRate>,
    pub skipped: Vec<Skipped>,
    /// Workloads (c) and (d): filled by the DNS responders when merged.
    pub dns: Option<serde_json::Value>,
}

const METHOD: &str = "generator spring (64 B UDP going round gx1 -> gx0, each round a broadcast copy out of g0) \
    -> r0 in the router namespace, where the point's program handles and drops every frame; Mpps = frames the \
    point handled / run time; 1 core: spring and r0's NAPI on one CPU (AF_XDP's user loop on the other); \
    2 cores: a spring per CPU, r0 with 2 RX queues (veth picks the queue by sending CPU); \
    CPU split from /proc/stat deltas of the CPUs in use";

struct Lab<'a> {
    topo: &'a Topology,
    stop: &'a AtomicBool,
    reps: usize,
    duration: Duration,
    warmup: Duration,
    cpu: usize,
    other: Option<usize>,
    fifo: bool,
    bar: &'a ProgressBar,
}

impl Lab<'_> {
    fn places(&self, cores: usize) -> Vec<Placement> {
        let mut v = vec![Placement {
            cpu: self.cpu,
            fifo: self.fifo,
        }];
        if cores == 2 {
            if let Some(o) = self.other {
                v.push(Placement {
                    cpu: o,
                    fifo: self.fifo,
                });
            }
        }
        v
    }

    fn measure(
        &self,
        workload: Workload,
        point: Point,
        n: u32,
        flows: u32,
        cores: usize,
    ) -> Result<Cell> {
        let loop_cpu = self.other.unwrap_or(self.cpu);
        let progs = attach::load(n)?;
        // Two SCHED_FIFO spinners on one CPU would starve the generator.
        let loop_place = Placement {
            cpu: loop_cpu,
            fifo: self.fifo && self.other.is_some(),
        };
        let att = Attached::new(point, progs, n, self.topo, loop_place)?;
        let mut obj = MaybeUninit::uninit();
        // Every point drops what it handles: the spring, not the loop.
        let gen = Generator::load_spring(&mut obj, self.topo, 64, flows)?;
        let places = self.places(cores);
        let mut cpus: Vec<usize> = places.iter().map(|p| p.cpu).collect();
        if point == Point::Afxdp && !cpus.contains(&loop_cpu) {
            cpus.push(loop_cpu);
        }
        cpus.sort();
        gen.run_parallel(&places, self.warmup, self.stop)?;
        let (mut mpps, mut uses) = (Vec::new(), Vec::new());
        let (mut packets, mut sent, mut secs_total) = (0u64, 0u64, 0f64);
        let mut busy_s = [0f64; 4];
        let mut own_cpu_s = 0f64;
        let mut work_s = 0f64;
        for _ in 0..self.reps {
            if self.stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            let before = att.packets()?;
            let user0 = att.user_cpu_time()?;
            let work0 = att.user_work_time();
            let s0 = cpustat::read()?;
            let runs =
                gen.run_parallel(&places, self.duration, self.stop)?;
            let s1 = cpustat::read()?;
            // The spring's frames never leave the generator namespace (the
            // router gets copies), so at the stop all come round on their
            // CPU, unless the spring went round another one.
            for (p, r) in places.iter().zip(&runs).filter(|(_, r)| r.lost > 0) {
                println!("   note: the spring: {}; this repetition's rate is not that CPU's", r.missing(p.cpu));
            }
            let user1 = att.user_cpu_time()?;
            // Frames still in the rings (or on the AF_XDP RX ring) finish on their CPU just after.
            std::thread::sleep(Duration::from_millis(20));
            let pkts = att.packets()?.saturating_sub(before);
            if let (Some(a), Some(b)) = (work0, att.user_work_time()) {
                work_s += b.saturating_sub(a).as_secs_f64();
            }
            own_cpu_s += runs.iter().map(|r| r.cpu_time.as_secs_f64()).sum::<f64>()
                + user1.saturating_sub(user0).as_secs_f64();
            let secs = runs
                .iter()
                .map(|r| r.elapsed.as_secs_f64())
                .fold(0.0, f64::max)
                .max(1e-9);
            let u = cpustat::between(&s0, &s1, &cpus);
            busy_s[0] += u.user * secs;
            busy_s[1] += u.system * secs;
            busy_s[2] += u.softirq * secs;
            busy_s[3] += u.busy() * secs;
            packets += pkts;
            sent += runs.iter().map(|r| r.sent).sum::<u64>();
            secs_total += secs;
            mpps.push(pkts as f64 / secs / 1e6);
            uses.push(u);
        }
        let per = |s: f64| {
            if packets > 0 {
                s / packets as f64 * 1e9
            } else {
                0.0
            }
        };
        Ok(Cell {
            workload,
            point,
            n,
            flows,
            cores,
            packets,
            median_mpps: super::report::median(&mpps),
            min_mpps: mpps.iter().copied().fold(f64::INFINITY, f64::min),
            max_mpps: mpps.iter().copied().fold(0.0, f64::max),
            mpps,
            offered_mpps: sent as f64 / secs_total.max(1e-9) / 1e6,
            mpps_per_cpu_s: packets as f64 / own_cpu_s.max(1e-9) / 1e6,
            cpus,
            cpu: CpuUse::mean(&uses),
            ns_per_packet_user: per(busy_s[0]),
            ns_per_packet_system: per(busy_s[1]),
            ns_per_packet_softirq: per(busy_s[2]),
            ns_per_packet_total: per(busy_s[3]),
            afxdp_work_ns_per_packet: (point == Point::Afxdp).then(|| per(work_s)),
        })
    }

    fn progress(&self, what: String) {
        self.bar.set_message(what);
    }
}

/// A progress line above the bar; printed plainly when the bar is hidden
/// (no terminal), where indicatif would swallow it.
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

/// Gives r0 two RX queues so a second generator CPU lands on its own queue.
fn two_queues(t: &Topology) -> Result<()> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &t.router,
            "ethtool",
            "-L",
            topo::R0,
            "rx",
            "2",
            "tx",
            "2",
        ])
        .output()
        .context("running ethtool")?;
    if !out.status.success() {
        bail!(
            "ethtool -L r0 rx 2 tx 2: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

pub fn run(args: &PointsArgs) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    let mut a = args.clone();
    if a.quick {
        a.flows = vec![1];
        a.cores = vec![1];
        a.csum = vec![0, 25];
        a.map_sizes = vec![1_000];
        a.reps = 1;
        a.duration = 0.3;
    }
    let duration = Duration::try_from_secs_f64(a.duration).context("--duration")?;
    a.points.sort();
    a.points.dedup();
    a.workloads.sort();
    a.workloads.dedup();
    if a.reps == 0 || duration.is_zero() || a.points.is_empty() || a.workloads.is_empty() {
        bail!("nothing to measure: --reps, --duration, --points and --workloads must be non-empty");
    }
    if let Some(&n) = a.csum.iter().find(|&&n| n > 150) {
        bail!("--csum {n}: at most 150 (the programs' loop bound)");
    }
    if let Some(&c) = a.cores.iter().find(|&&c| c != 1 && c != 2) {
        bail!("--cores {c}: 1 or 2");
    }
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let place = Placement::check(a.cpu, !a.no_rt)?;
    let other = (0..ncpu).find(|&c| c != a.cpu);

    let traffic = a
        .workloads
        .iter()
        .any(|w| matches!(w, Workload::Drop | Workload::Csum));
    let n_cells = if traffic {
        let drop_cells = if a.workloads.contains(&Workload::Drop) {
            a.points.len() * a.flows.len() * a.cores.len()
        } else {
            0
        };
        let csum_cells = if a.workloads.contains(&Workload::Csum) {
            a.points.len() * a.csum.len()
        } else {
            0
        };
        drop_cells + csum_cells
    } else {
        0
    };
    let maps_cells = if a.workloads.contains(&Workload::Maps) {
        a.map_sizes.len() * 5
    } else {
        0
    };
    let bar = ProgressBar::new((n_cells + maps_cells) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    println!(
        "fastpath bench points: points {}, workloads {}, {} x {:.1} s per cell",
        a.points
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(","),
        a.workloads
            .iter()
            .map(|w| format!("{w:?}").to_lowercase())
            .collect::<Vec<_>>()
            .join(","),
        a.reps,
        a.duration
    );

    let mut rep = PointsReport {
        bench: "points",
        unix_time: crate::bench::report::unix_time(),
        kernel_release: super::report::kernel_release(),
        method: METHOD,
        reps: a.reps,
        duration_s: a.duration,
        points: a.points.clone(),
        nic_offload: String::new(),
        notes: Vec::new(),
        drop: Vec::new(),
        csum: Vec::new(),
        maps: Vec::new(),
        skipped: Vec::new(),
        dns: None,
    };

    if traffic {
        let topo = Topology::create()?;
        rep.nic_offload = format!(
            "not available: no BPF-offload NIC here (veth only, no nfp/netdevsim); {}",
            attach::offload_attempt(&topo)
        );
        let two = match (other, two_queues(&topo)) {
            (None, _) => Err(format!("only {ncpu} CPU online")),
            (_, Err(e)) => Err(format!("{e:#}")),
            (Some(_), Ok(())) => Ok(()),
        };
        if other.is_none() {
            rep.notes
                .push("one CPU: the AF_XDP loop shares the generator's CPU".into());
        }
        rep.notes.push(
            "veth has no RSS: the receive queue follows the sending CPU, so 1 flow and many flows spread the same \
             way on 2 cores (the paper's single-flow case, stuck on one core, cannot be reproduced on veth)"
                .into(),
        );
        rep.notes.push(format!(
            "afxdp: copy mode (veth has no zero-copy), one socket on queue 0, user loop busy-polling on CPU {}; \
             it is measured on 1 core only (2 cores would need a socket and loop per queue on CPUs the generator uses)",
            other.unwrap_or(a.cpu)
        ));
        let lab = Lab {
            topo: &topo,
            stop: &stop,
            reps: a.reps,
            duration,
            warmup: Duration::from_millis(if a.quick { 100 } else { 200 }),
            cpu: a.cpu,
            other,
            fifo: place.fifo,
            bar: &bar,
        };
        if a.workloads.contains(&Workload::Drop) {
            for &point in &a.points {
                for &cores in &a.cores {
                    for &flows in &a.flows {
                        lab.progress(format!(
                            "drop {} {flows} flow(s) {cores} core(s)",
                            point.name()
                        ));
                        let why = match (&two, cores, point) {
                            (Err(e), 2, _) => Some(e.clone()),
                            (_, 2, Point::Afxdp) => {
                                Some("AF_XDP is measured on 1 core (see notes)".into())
                            }
                            _ => None,
                        };
                        if let Some(why) = why {
                            rep.skipped.push(Skipped {
                                workload: Workload::Drop,
                                point,
                                flows,
                                cores,
                                why,
                            });
                        } else {
                            let c = lab.measure(Workload::Drop, point, 0, flows, cores)?;
                            say(&bar, report::cell_line(&c));
                            rep.drop.push(c);
                        }
                        bar.inc(1);
                    }
                }
            }
        }
        if a.workloads.contains(&Workload::Csum) {
            for &point in &a.points {
                for &n in &a.csum {
                    lab.progress(format!("csum N={n} {}", point.name()));
                    let c = lab.measure(Workload::Csum, point, n, 1, 1)?;
                    say(&bar, report::cell_line(&c));
                    rep.csum.push(c);
                    bar.inc(1);
                }
            }
        }
    }
    if a.workloads.contains(&Workload::Maps) {
        let min = if a.quick {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(500)
        };
        rep.maps = maps::measure(&a.map_sizes, min, |what| {
            bar.set_message(format!("map updates: {what}"));
            bar.inc(1);
        })?;
    }
    bar.finish_and_clear();
    // (c) and (d) build their own lab (client, responder, socket server):
    // after the one above is gone.
    if a.workloads.contains(&Workload::Dns) {
        let mut args = vec!["dns".to_string(), "--cpu".into(), a.cpu.to_string()];
        if a.quick {
            args.push("--quick".into());
        }
        if a.no_rt {
            args.push("--no-rt".into());
        }
        let dns_args = DnsCli::try_parse_from(&args).context("DNS bench options")?.a;
        let results = crate::bench::dns::measure(&dns_args).context("DNS responders")?;
        rep.dns = Some(serde_json::to_value(&results).context("DNS results as JSON")?);
    }

    report::print(&rep);
    let json = a.json.clone().unwrap_or_else(|| a.out.join("points.json"));
    report::write_json(&rep, &json)?;
    println!("wrote {}", json.display());
    if let Some(png) = report::plot(&json, &a.out.join("points.png")) {
        println!("wrote {}", png.display());
    }
    Ok(())
}
