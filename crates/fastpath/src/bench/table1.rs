//! `fastpath bench table1`: paper 000's Table 1 on fastpath. 10,000 IPv4
//! routes arrive (`ip -batch` in the router namespace, or BGP UPDATEs from
//! a peer namespace into FRR on the router) while the daemon runs with each
//! reservation model, on the BPF target and on the simulated ASIC; a client
//! pings an address in the prefix installed last every 10 ms.
//!
//! Per run, all on the wall clock: t0 the first route sent (`ip -batch`
//! started, or the peer's route-map flipped to announce), t_last the pinged
//! prefix's netlink message (its RTM_NEWROUTE, seen by a listener in the
//! router namespace: table1_watch.rs), then
//! - control latency: t0 -> the model's last answer (the daemon's status),
//! - last-route forwarding: t_last -> the last prefix in the BPF LPM map
//!   (polled by the bench),
//! - outage: t_last -> the first echo reply through the router.
//!
//! The router's kernel must not forward what fastpath punts, or the outage
//! would be the kernel's: an nftables forward rule drops the routes' range
//! (the daemon runs with --allow-netfilter-bypass, so XDP-forwarded packets
//! skip it). Median of `--reps` repetitions; the routes are removed and the
//! tables settle between repetitions.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use super::router::{self, Daemon};
use super::table1_frr::{self, Bgp};
use super::tablesync::{path_str, run_ip};
use super::table1_watch::RouteWatch;
use super::topo::{self, Topology};
use crate::api;

#[derive(Debug, Clone, clap::Args)]
pub struct Table1Args {
    /// Routes per run.
    #[arg(long, default_value_t = 10_000)]
    pub routes: usize,
    /// Repetitions per row; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Reservation models (lockstep, prefetch:N, credit[:MAX], predictive, predictive-flat).
    #[arg(long = "model", value_name = "MODEL", value_delimiter = ',',
          default_values = ["lockstep", "prefetch:64", "credit", "predictive", "predictive-flat"])]
    pub models: Vec<String>,
    /// Resource targets (bpf, sim-asic).
    #[arg(long = "target", value_name = "TARGET", value_delimiter = ',', default_values = ["bpf", "sim-asic"])]
    pub targets: Vec<String>,
    /// Route sources (batch = `ip -batch`, bgp = FRR bgpd from a peer namespace).
    #[arg(long = "source", value_name = "SOURCE", value_delimiter = ',', default_values = ["batch", "bgp"])]
    pub sources: Vec<String>,
    /// Simulated ASIC: µs per route write.
    #[arg(long, default_value_t = 55)]
    pub sim_write_us: u64,
    /// Simulated ASIC: µs per resource query or reservation.
    #[arg(long, default_value_t = 350)]
    pub sim_query_us: u64,
    /// Directory for table1.json and table1.png.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

/// The targets, on the BPF target.
const TARGET_FORWARD_MS: f64 = 100.0;
const TARGET_OUTAGE_S: f64 = 0.15;
/// Give up on one run after this long.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Serialize)]
struct Rep {
    /// `ip -batch` run time (batch source only).
    send_ms: Option<f64>,
    control_ms: Option<f64>,
    forward_ms: Option<f64>,
    /// t0 -> every route in fp_fib4 (status, 5 ms resolution).
    all_in_map_ms: Option<f64>,
    outage_s: Option<f64>,
    refused: u64,
    /// Device accesses on the admission path in this run, and of those
    /// the credit model's dry-bucket stalls.
    inline_accesses: u64,
    stalls: u64,
    /// Admission answers in this run (yes and no).
    answers: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    target: String,
    model: String,
    source: String,
    reps: Vec<Rep>,
    send_ms: Option<f64>,
    control_ms: Option<f64>,
    forward_ms: Option<f64>,
    all_in_map_ms: Option<f64>,
    outage_s: Option<f64>,
    refused: u64,
}

#[derive(Serialize)]
struct Report<'a> {
    bench: &'static str,
    unix_time: u64,
    kernel_release: String,
    routes: usize,
    sim_write_us: u64,
    sim_query_us: u64,
    method: &'static str,
    rows: &'a [Row],
    target: serde_json::Value,
}

const METHOD: &str = "t0 = first route sent (ip -batch start / peer route-map flipped); t_last = the pinged prefix's RTM_NEWROUTE in the router. \
control = t0 -> the model's last answer; forward = t_last -> last prefix in fp_fib4; all_in_map = t0 -> every route in fp_fib4; \
outage = t_last -> first echo reply (ping -i 0.01). \
Kernel forwarding of the routes' range is dropped by nftables, so only fastpath forwards. Median of the repetitions.";

/// Route i of source `base`: 10.(base + i / 256).(i % 256).0/24.
fn prefix(base: usize, i: usize) -> (u8, u8, u8) {
    (10, (base + i / 256) as u8, (i % 256) as u8)
}

const BATCH_BASE: usize = 0;
const BGP_BASE: usize = 64;

fn prefix_str(base: usize, i: usize) -> String {
    let (a, b, c) = prefix(base, i);
    format!("{a}.{b}.{c}.0/24")
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

fn ms_between(from_us: u64, to_us: u64) -> f64 {
    (to_us as f64 - from_us as f64) / 1e3
}

pub fn run(a: &Table1Args, exe: &Path, work: &Path, stop: &AtomicBool) -> Result<()> {
    if a.routes == 0 || a.routes > 60 * 256 || a.reps == 0 {
        bail!("--routes must be 1..={} and --reps at least 1", 60 * 256);
    }
    for s in &a.sources {
        if s != "batch" && s != "bgp" {
            bail!("--source {s}: batch or bgp");
        }
    }
    let bgp_wanted = a.sources.iter().any(|s| s == "bgp");
    if bgp_wanted && !table1_frr::available() {
        bail!("--source bgp needs FRR ({} and {}; scripts/setup.sh installs it)", table1_frr::ZEBRA, table1_frr::BGPD);
    }
    println!(
        "fastpath bench table1: {} routes, models {}, targets {}, sources {}, {} reps; sim-asic {} µs/write, {} µs/query",
        a.routes,
        a.models.join(","),
        a.targets.join(","),
        a.sources.join(","),
        a.reps,
        a.sim_write_us,
        a.sim_query_us
    );
    let topo = Topology::create()?;
    let last_batch = prefix(BATCH_BASE, a.routes - 1);
    let last_bgp = prefix(BGP_BASE, a.routes - 1);
    prepare(&topo, &[last_batch, last_bgp])?;
    let add = work.join("add.batch");
    let del = work.join("del.batch");
    let via = format!("via {} dev {}", "198.51.100.2", topo::R1);
    let lines = |verb: &str, tail: &str| -> String {
        (0..a.routes).map(|i| format!("route {verb} {} {tail}\n", prefix_str(BATCH_BASE, i))).collect()
    };
    std::fs::write(&add, lines("add", &via)).context("writing the route batch")?;
    std::fs::write(&del, lines("del", "")).context("writing the route batch")?;
    let bgp = if bgp_wanted {
        let prefixes: Vec<String> = (0..a.routes).map(|i| prefix_str(BGP_BASE, i)).collect();
        println!("-- starting FRR (zebra + bgpd on the router, bgpd on the peer)");
        Some(Bgp::start(&topo.router, &topo.sink, &prefixes)?)
    } else {
        None
    };

    let mut rows = Vec::new();
    for target in &a.targets {
        for model in &a.models {
            let extra: Vec<String> = [
                "--allow-netfilter-bypass",
                "--reservation-model",
                model,
                "--resource-target",
                target,
                "--sim-write-us",
                &a.sim_write_us.to_string(),
                "--sim-query-us",
                &a.sim_query_us.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            println!("-- {target} / {model}");
            let mut d = Daemon::spawn_with(&topo, exe, work, &extra)?;
            d.wait_ready(Duration::from_secs(30), stop)?;
            let fib4 = router::fastpath_map(&topo, "fp_fib4")?;
            let base = settle(&d, stop)?;
            for source in &a.sources {
                let mut reps = Vec::new();
                for _ in 0..a.reps {
                    if stop.load(Ordering::Relaxed) {
                        bail!("interrupted");
                    }
                    let run = Run { topo: &topo, d: &d, fib4: &fib4, stop, base, routes: a.routes as u64 };
                    let r = if source == "batch" {
                        run.batch(&add, &del, last_batch)
                    } else {
                        let b = bgp.as_ref().context("no BGP speakers")?;
                        run.bgp(b, last_bgp).with_context(|| b.logs())
                    }
                    .with_context(|| format!("{target} / {model} / {source}; daemon log:\n{}", d.log_tail()))?;
                    println!("   {source}: {}", rep_line(&r));
                    reps.push(r);
                }
                rows.push(row(target, model, source, reps));
            }
            d.stop()?;
        }
    }
    drop(bgp);
    drop(topo);

    print_table(&rows, a);
    let json = write_json(&rows, a)?;
    println!("wrote {}", json.display());
    if let Some(png) = plot(&json) {
        println!("wrote {}", png.display());
    }
    Ok(())
}

/// Client and server ends for the pings, and the kernel kept from
/// forwarding the routes' range.
fn prepare(t: &Topology, lasts: &[(u8, u8, u8)]) -> Result<()> {
    run_ip(&["-n", &t.gen, "route", "add", "default", "via", "192.0.2.1"])?;
    run_ip(&["-n", &t.sink, "route", "add", "default", "via", "198.51.100.1"])?;
    for (a, b, c) in lasts {
        run_ip(&["-n", &t.sink, "addr", "add", &format!("{a}.{b}.{c}.1/32"), "dev", "lo"])?;
    }
    // Frames fastpath redirects into a veth are only taken by a peer with XDP or GRO.
    for (ns, dev) in [(&t.gen, topo::G0), (&t.sink, topo::S0)] {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "ethtool", "-K", dev, "gro", "on"])
            .output()
            .context("running ethtool")?;
        if !out.status.success() {
            bail!("ethtool -K {dev} gro on: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    let rules = "table ip fpt1 {\n chain block {\n  type filter hook forward priority 0; policy accept;\n  ip daddr 10.0.0.0/8 drop\n }\n}\n";
    let mut nft = Command::new("ip")
        .args(["netns", "exec", &t.router, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    nft.stdin.take().context("nft stdin")?.write_all(rules.as_bytes()).context("writing to nft")?;
    let out = nft.wait_with_output().context("running nft")?;
    if !out.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, Default)]
struct Base {
    fib4: u64,
}

#[derive(Debug, Clone, Default)]
struct Adm {
    answers: u64,
    refused: u64,
    pending: u64,
    last_answer_us: u64,
    inline: u64,
    stalls: u64,
}

fn status(d: &Daemon) -> Result<(u64, Option<Adm>)> {
    let v = api::request(d.socket(), "status")?;
    let fib4 = v.pointer("/tables/fib4/used").and_then(|x| x.as_u64()).context("status has no fib4")?;
    let adm = v.get("admission").filter(|a| !a.is_null()).map(|a| {
        let n = |k: &str| a.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        Adm {
            answers: n("admitted") + n("refusals"),
            refused: n("refused"),
            pending: n("pending"),
            last_answer_us: n("last_answer_unix_us"),
            inline: n("inline_accesses"),
            stalls: n("stalls"),
        }
    });
    Ok((fib4, adm))
}

/// Waits until the tables stop changing and nothing is pending.
fn settle(d: &Daemon, stop: &AtomicBool) -> Result<Base> {
    let t = Instant::now();
    let mut last = status(d)?;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let now = status(d)?;
        let quiet = now.0 == last.0 && now.1.as_ref().is_none_or(|a| a.pending == 0);
        if quiet || t.elapsed() > Duration::from_secs(30) {
            return Ok(Base { fib4: now.0 });
        }
        last = now;
    }
}

struct Run<'a> {
    topo: &'a Topology,
    d: &'a Daemon,
    fib4: &'a MapHandle,
    stop: &'a AtomicBool,
    base: Base,
    /// Routes every run adds.
    routes: u64,
}

impl Run<'_> {
    fn batch(&self, add: &Path, del: &Path, last: (u8, u8, u8)) -> Result<Rep> {
        let before = status(self.d)?.1.unwrap_or_default();
        let ping = Ping::start(&self.topo.gen, last)?;
        let watch = RouteWatch::start(self.topo, [last.0, last.1, last.2, 0], 24, now_us)?;
        let t0 = now_us();
        run_ip(&["-n", &self.topo.router, "-batch", &path_str(add)?])?;
        let sent = now_us();
        let rep = self.measure(ping, watch, &before, t0, last, Some(ms_between(t0, sent)));
        run_ip(&["-n", &self.topo.router, "-force", "-batch", &path_str(del)?])?;
        self.back_to_base()?;
        rep
    }

    fn bgp(&self, b: &Bgp, last: (u8, u8, u8)) -> Result<Rep> {
        let before = status(self.d)?.1.unwrap_or_default();
        let ping = Ping::start(&self.topo.gen, last)?;
        let watch = RouteWatch::start(self.topo, [last.0, last.1, last.2, 0], 24, now_us)?;
        let t0 = now_us();
        b.announce()?;
        let rep = self.measure(ping, watch, &before, t0, last, None);
        b.withdraw()?;
        self.back_to_base()?;
        rep
    }

    /// `before`: the admission counters before t0 (they count since the daemon started).
    /// `watch`: stamps the last prefix's netlink message (t_last).
    fn measure(&self, ping: Ping, watch: RouteWatch, before: &Adm, t0: u64, last: (u8, u8, u8), send_ms: Option<f64>) -> Result<Rep> {
        let key = lpm_key(last);
        let start = Instant::now();
        let mut t_map = None;
        let mut t_all = None;
        let mut adm = None;
        let mut asked: Option<Instant> = None;
        // The last prefix in the map, every route in it, every route answered
        // (a refused route never shows).
        while start.elapsed() < RUN_TIMEOUT {
            if self.stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            if t_map.is_none() && self.fib4.lookup(&key, MapFlags::ANY).context("looking up the last prefix")?.is_some() {
                t_map = Some(now_us());
            }
            if asked.is_none_or(|t| t.elapsed() >= Duration::from_millis(5)) {
                asked = Some(Instant::now());
                let (fib4, a) = status(self.d)?;
                if t_all.is_none() && fib4 >= self.base.fib4 + self.routes {
                    t_all = Some(now_us());
                }
                let done = match &a {
                    Some(a) => {
                        a.answers.saturating_sub(before.answers) >= self.routes && a.pending == 0 && a.last_answer_us >= t0
                    }
                    None => fib4 >= self.base.fib4 + self.routes,
                };
                let refused = a.as_ref().is_some_and(|a| a.refused > 0);
                if done && ((t_map.is_some() && t_all.is_some()) || refused) {
                    adm = a;
                    break;
                }
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        // Replies come within a few ping intervals of the route landing.
        std::thread::sleep(Duration::from_millis(300));
        let first_reply = ping.stop()?;
        let t_last = watch.seen_us();
        drop(watch);
        let control_ms = match &adm {
            Some(a) if a.last_answer_us > 0 => Some(ms_between(t0, a.last_answer_us)),
            // No model in the route path (predictive on bpf): the trim answers as the maps are written.
            None => t_all.map(|t| ms_between(t0, t)),
            _ => None,
        };
        Ok(Rep {
            send_ms,
            control_ms,
            forward_ms: t_map.zip(t_last).map(|(t, l)| ms_between(l, t)),
            all_in_map_ms: t_all.map(|t| ms_between(t0, t)),
            outage_s: first_reply.zip(t_last).map(|(t, l)| ms_between(l, t) / 1e3),
            refused: adm.as_ref().map(|a| a.refused).unwrap_or(0),
            inline_accesses: adm.as_ref().map(|a| a.inline.saturating_sub(before.inline)).unwrap_or(0),
            stalls: adm.as_ref().map(|a| a.stalls.saturating_sub(before.stalls)).unwrap_or(0),
            answers: adm.as_ref().map(|a| a.answers.saturating_sub(before.answers)).unwrap_or(0),
        })
    }

    fn back_to_base(&self) -> Result<()> {
        let t = Instant::now();
        loop {
            let (fib4, a) = status(self.d)?;
            if fib4 <= self.base.fib4 && a.as_ref().is_none_or(|a| a.pending == 0) {
                return Ok(());
            }
            if t.elapsed() > RUN_TIMEOUT {
                bail!("the routes did not leave the FIB within {RUN_TIMEOUT:?} (fib4 {fib4}, base {})", self.base.fib4);
            }
            if self.stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// fp_lpm4_key: prefix length, then the address in network order.
fn lpm_key(p: (u8, u8, u8)) -> Vec<u8> {
    let mut k = 24u32.to_ne_bytes().to_vec();
    k.extend_from_slice(&[p.0, p.1, p.2, 0]);
    k
}

/// `ping -D -i 0.01` from the client namespace; stopped by SIGINT (it then
/// flushes its output).
struct Ping {
    child: Child,
}

impl Ping {
    fn start(gen: &str, last: (u8, u8, u8)) -> Result<Ping> {
        let dst = format!("{}.{}.{}.1", last.0, last.1, last.2);
        let child = Command::new("ip")
            .args(["netns", "exec", gen, "ping", "-D", "-n", "-i", "0.01", &dst])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ping")?;
        Ok(Ping { child })
    }

    /// Wall clock (µs) of the first echo reply, if any.
    fn stop(mut self) -> Result<Option<u64>> {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().context("spawning true")?)
            .wait_with_output()
            .context("waiting for ping")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let first = first_reply(&text);
        if first.is_none() {
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            println!("   (no echo reply; ping said: {})", tail.into_iter().rev().collect::<Vec<_>>().join(" / "));
        }
        Ok(first)
    }
}

impl Drop for Ping {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
        }
        let _ = self.child.wait();
    }
}

/// `[1732200000.123456] 64 bytes from ...`: the first reply's timestamp in µs.
fn first_reply(out: &str) -> Option<u64> {
    out.lines().filter(|l| l.contains(" bytes from ")).find_map(|l| {
        let ts = l.strip_prefix('[')?.split(']').next()?;
        let (s, us) = ts.split_once('.')?;
        Some(s.parse::<u64>().ok()? * 1_000_000 + format!("{us:0<6}").get(..6)?.parse::<u64>().ok()?)
    })
}

fn median(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut s: Vec<f64> = v.flatten().collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    Some(s[s.len() / 2])
}

fn row(target: &str, model: &str, source: &str, reps: Vec<Rep>) -> Row {
    Row {
        target: target.into(),
        model: model.into(),
        source: source.into(),
        send_ms: median(reps.iter().map(|r| r.send_ms)),
        control_ms: median(reps.iter().map(|r| r.control_ms)),
        forward_ms: median(reps.iter().map(|r| r.forward_ms)),
        all_in_map_ms: median(reps.iter().map(|r| r.all_in_map_ms)),
        outage_s: median(reps.iter().map(|r| r.outage_s)),
        refused: reps.iter().map(|r| r.refused).max().unwrap_or(0),
        reps,
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}")).unwrap_or_else(|| "-".into())
}

fn rep_line(r: &Rep) -> String {
    format!(
        "ip -batch {} ms, control {} ms, last route forwarding {} ms, all in map {} ms, outage {} s, refused {}, answers {}, inline device accesses {}, stalls {}",
        opt(r.send_ms, 1),
        opt(r.control_ms, 1),
        opt(r.forward_ms, 1),
        opt(r.all_in_map_ms, 1),
        opt(r.outage_s, 3),
        r.refused,
        r.answers,
        r.inline_accesses,
        r.stalls
    )
}

fn print_table(rows: &[Row], a: &Table1Args) {
    println!();
    println!("Table 1 ({} IPv4 routes, median of {}; sim-asic {} µs/write, {} µs/query)", a.routes, a.reps, a.sim_write_us, a.sim_query_us);
    println!("| target | model | source | control latency (ms) | last-route forwarding (ms) | data outage (s) | all routes in map (ms) | refused | ip -batch (ms) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.target,
            r.model,
            r.source,
            opt(r.control_ms, 1),
            opt(r.forward_ms, 1),
            opt(r.outage_s, 3),
            opt(r.all_in_map_ms, 1),
            r.refused,
            opt(r.send_ms, 1)
        );
    }
    println!();
    println!(
        "targets (issue #5, BPF target): last of {} routes forwarding <= {TARGET_FORWARD_MS:.0} ms after its netlink message; outage <= {TARGET_OUTAGE_S} s",
        a.routes
    );
    for r in rows.iter().filter(|r| r.target == "bpf") {
        let ok = |v: Option<f64>, max: f64| match v {
            Some(x) if x <= max => "met",
            Some(_) => "missed",
            None => "n/a",
        };
        println!(
            "   bpf / {} / {}: forwarding {} ({} ms), outage {} ({} s)",
            r.model,
            r.source,
            ok(r.forward_ms, TARGET_FORWARD_MS),
            opt(r.forward_ms, 1),
            ok(r.outage_s, TARGET_OUTAGE_S),
            opt(r.outage_s, 3)
        );
    }
    println!("control = first route sent -> the model's last answer; forwarding and outage from the pinged prefix's own netlink");
    println!("message (its RTM_NEWROUTE in the router, for both sources); all routes in map: from the first route sent.");
    println!("bgp: FRR does not install in announcement order, so the pinged prefix need not be the last one in; `all routes in map`");
    println!("covers every route.");
}

fn write_json(rows: &[Row], a: &Table1Args) -> Result<PathBuf> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let path = a.out.join("table1.json");
    let rep = Report {
        bench: "table1",
        unix_time: super::report::unix_time(),
        kernel_release: super::report::kernel_release(),
        routes: a.routes,
        sim_write_us: a.sim_write_us,
        sim_query_us: a.sim_query_us,
        method: METHOD,
        rows,
        target: serde_json::json!({"target": "bpf", "max_forward_ms": TARGET_FORWARD_MS, "max_outage_s": TARGET_OUTAGE_S}),
    };
    let text = serde_json::to_string_pretty(&rep).context("serialising the report")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// bench/plot_table1.py with the venv's matplotlib; a missing venv is a note.
fn plot(json: &Path) -> Option<PathBuf> {
    let root = super::repo_root();
    let python = root.join(".venv/bin/python");
    let script = root.join("bench/plot_table1.py");
    let png = json.with_extension("png");
    if !python.exists() || !script.exists() {
        println!("note: no PNG: {} or {} missing (run `make setup`)", python.display(), script.display());
        return None;
    }
    match Command::new(&python).arg(&script).arg(json).arg(&png).output() {
        Ok(o) if o.status.success() => Some(png),
        Ok(o) => {
            println!("note: no PNG: bench/plot_table1.py failed: {}", String::from_utf8_lossy(&o.stderr).trim());
            None
        }
        Err(e) => {
            println!("note: no PNG: cannot run {}: {e}", python.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reply_timestamp() {
        let out = "PING 10.39.15.1 (10.39.15.1) 56(84) bytes of data.\n\
                   [1732200000.5] From 192.0.2.1 icmp_seq=1 Destination Net Unreachable\n\
                   [1732200001.012345] 64 bytes from 10.39.15.1: icmp_seq=3 ttl=63 time=0.1 ms\n\
                   [1732200001.022345] 64 bytes from 10.39.15.1: icmp_seq=4 ttl=63 time=0.1 ms\n";
        assert_eq!(first_reply(out), Some(1_732_200_001_012_345));
        assert_eq!(first_reply("no replies\n"), None);
    }

    #[test]
    fn prefixes_and_keys() {
        assert_eq!(prefix_str(BATCH_BASE, 9_999), "10.39.15.0/24");
        assert_eq!(prefix_str(BGP_BASE, 0), "10.64.0.0/24");
        assert_eq!(lpm_key((10, 39, 15)), [24u32.to_ne_bytes().as_slice(), &[10, 39, 15, 0]].concat());
    }

    #[test]
    fn median_skips_missing() {
        assert_eq!(median([Some(3.0), None, Some(1.0), Some(2.0)].into_iter()), Some(2.0));
        assert_eq!(median([None, None].into_iter()), None);
    }
}
