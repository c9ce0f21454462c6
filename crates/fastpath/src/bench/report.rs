//! Turning repetitions into the printed table, bench/out/forward.json and the
//! PNG (drawn by bench/plot.py with the project's venv).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::Serialize;

use super::hints::HintsReport;
use super::router::{Mode, Verdicts};

/// Issue #3's targets for cache-hit forwarding at 64 B (reported, never asserted).
pub const TARGET_RATIO: f64 = 3.3;
pub const TARGET_SHARE_OF_RAW: f64 = 0.9;
pub const TARGET_RATIO_TO_REFERENCE: f64 = 1.3;
pub const TARGET_SIZE: usize = 64;
/// Issue #6's target: AF_XDP forwarding against native XDP on the same job.
pub const AFXDP_TARGET_SHARE: f64 = 0.6;
/// Below this share of wall time on its CPU, a repetition ran on a busy box.
const BUSY_SHARE: f64 = 0.9;

/// One repetition as measured.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Rep {
    /// Frames counted at the sink per second of wall time.
    pub mpps: f64,
    /// Frames the generator produced per second of wall time.
    pub offered_mpps: f64,
    /// Frames counted at the sink per second of the bench thread's CPU time.
    pub mpps_per_cpu_s: f64,
    /// Share of the wall time the bench thread was actually on its CPU.
    pub cpu_share: f64,
    /// Frames that did not come round the loop again on its CPU at the end (traffic::GenRun::lost).
    pub lost_frames: u64,
    /// Of those, the ones that came round on another CPU (traffic::GenRun::strayed).
    pub strayed_frames: u64,
}

impl Rep {
    /// Frames of the loop that did not stay on the bench CPU when `mode`
    /// should have kept them there: all that did not come round there,
    /// except, for the AF_XDP modes (whose forwarder sends from the other
    /// CPU, so the loop goes round there), those that came round elsewhere.
    pub fn loop_trouble(&self, mode: Mode) -> u64 {
        if mode.afxdp() {
            self.lost_frames.saturating_sub(self.strayed_frames)
        } else {
            self.lost_frames
        }
    }

    /// From frames counted at the sink, frames sent, and the run's wall and CPU time.
    pub fn measured(sink_frames: u64, sent: u64, wall: std::time::Duration, cpu: std::time::Duration) -> Rep {
        let secs = wall.as_secs_f64();
        let cpu = cpu.as_secs_f64().max(1e-9);
        Rep {
            mpps: sink_frames as f64 / secs / 1e6,
            offered_mpps: sent as f64 / secs / 1e6,
            mpps_per_cpu_s: sink_frames as f64 / cpu / 1e6,
            cpu_share: cpu / secs,
            lost_frames: 0,
            strayed_frames: 0,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub mode: Mode,
    pub size: usize,
    pub flows: u32,
    pub reps: Vec<Rep>,
    pub median_mpps: f64,
    pub min_mpps: f64,
    pub max_mpps: f64,
    pub ratio_to_kernel: Option<f64>,
    /// Median Mpps / the raw redirect's at the same size and flows.
    pub share_of_raw: Option<f64>,
    /// Median Mpps / the bpf_fib_lookup reference's (fib-fwd).
    pub ratio_to_reference: Option<f64>,
    pub median_mpps_per_cpu_s: f64,
    pub ratio_to_kernel_per_cpu_s: Option<f64>,
    pub share_of_raw_per_cpu_s: Option<f64>,
    pub ratio_to_reference_per_cpu_s: Option<f64>,
    pub median_cpu_share: f64,
    /// Benches in rounds (repetition i of every mode is round i): the median
    /// over the rounds of this cell's Mpps / the kernel's, raw's and the
    /// reference's in the same round. The VM's speed drifts between minutes;
    /// a round's modes run seconds apart, so these ratios drift less than
    /// the ratios of medians.
    pub paired_ratio_to_kernel: Option<f64>,
    pub paired_share_of_raw: Option<f64>,
    pub paired_ratio_to_reference: Option<f64>,
    /// The sign-test 95 % interval of `paired_share_of_raw` (None for fewer
    /// than 6 rounds): whether a share near a target is above or below it
    /// beyond this VM's round-to-round spread.
    pub paired_share_of_raw_95: Option<(f64, f64)>,
    /// fastpath's own counters over this cell's warm-up and repetitions.
    pub fastpath_verdicts: Option<Verdicts>,
}

impl Cell {
    pub fn new(mode: Mode, size: usize, flows: u32, reps: Vec<Rep>) -> Self {
        let mpps: Vec<f64> = reps.iter().map(|r| r.mpps).collect();
        let per_cpu: Vec<f64> = reps.iter().map(|r| r.mpps_per_cpu_s).collect();
        let share: Vec<f64> = reps.iter().map(|r| r.cpu_share).collect();
        Cell {
            mode,
            size,
            flows,
            median_mpps: median(&mpps),
            min_mpps: mpps.iter().copied().fold(f64::INFINITY, f64::min),
            max_mpps: mpps.iter().copied().fold(0.0, f64::max),
            ratio_to_kernel: None,
            share_of_raw: None,
            ratio_to_reference: None,
            median_mpps_per_cpu_s: median(&per_cpu),
            ratio_to_kernel_per_cpu_s: None,
            share_of_raw_per_cpu_s: None,
            ratio_to_reference_per_cpu_s: None,
            median_cpu_share: median(&share),
            paired_ratio_to_kernel: None,
            paired_share_of_raw: None,
            paired_ratio_to_reference: None,
            paired_share_of_raw_95: None,
            fastpath_verdicts: None,
            reps,
        }
    }
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// (wall-clock, per-CPU-second) medians of `mode` at a size and flow count.
fn medians_of(cells: &[Cell], mode: Mode, size: usize, flows: u32) -> Option<(f64, f64)> {
    cells
        .iter()
        .find(|c| c.mode == mode && c.size == size && c.flows == flows)
        .map(|c| (c.median_mpps, c.median_mpps_per_cpu_s))
}

fn ratio_of(x: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| x / base)
}

/// Fills in each cell's ratios to the kernel, raw and reference cells of
/// the same size and flows (when those modes were measured).
pub fn add_ratios(cells: &mut [Cell]) {
    add_ratios_against(cells, [Mode::Kernel, Mode::Raw, Mode::FibFwd]);
}

/// As `add_ratios`, with other modes as the [kernel, raw, reference] bases
/// (`fastpath bench stateful`: kernel-ct, raw, ct-ref).
pub fn add_ratios_against(cells: &mut [Cell], bases: [Mode; 3]) {
    let bases: Vec<[Option<(f64, f64)>; 3]> = cells
        .iter()
        .map(|c| bases.map(|m| medians_of(cells, m, c.size, c.flows)))
        .collect();
    for (c, [kernel, raw, reference]) in cells.iter_mut().zip(bases) {
        let (m, mc) = (c.median_mpps, c.median_mpps_per_cpu_s);
        if let Some((k, kc)) = kernel {
            c.ratio_to_kernel = ratio_of(m, k);
            c.ratio_to_kernel_per_cpu_s = ratio_of(mc, kc);
        }
        if let Some((r, rc)) = raw {
            c.share_of_raw = ratio_of(m, r);
            c.share_of_raw_per_cpu_s = ratio_of(mc, rc);
        }
        if let Some((f, fc)) = reference {
            c.ratio_to_reference = ratio_of(m, f);
            c.ratio_to_reference_per_cpu_s = ratio_of(mc, fc);
        }
    }
}

/// The median of `xs[i] / bases[i]`: for values measured in the same rounds
/// (None unless both have a value for every round).
pub fn paired_ratio(xs: &[f64], bases: &[f64]) -> Option<f64> {
    paired_ratios(xs, bases).map(|r| median(&r))
}

/// `xs[i] / bases[i]` for every round, or None unless both have a value
/// for every round.
fn paired_ratios(xs: &[f64], bases: &[f64]) -> Option<Vec<f64>> {
    if xs.is_empty() || xs.len() != bases.len() || bases.iter().any(|b| *b <= 0.0) {
        return None;
    }
    Some(xs.iter().zip(bases).map(|(x, b)| x / b).collect())
}

/// A distribution-free confidence interval for the median of the paired
/// ratios `xs[i] / bases[i]` (the sign-test interval: order statistics
/// k and n+1-k, with k the largest for which the binomial tails leave at
/// least `level` between them). Rounds on this VM drift by more than the
/// differences sought, and not normally, so no mean and standard error.
/// None for fewer rounds than can reach `level` (6 for 95 %).
pub fn paired_ratio_interval(xs: &[f64], bases: &[f64], level: f64) -> Option<(f64, f64)> {
    let mut r = paired_ratios(xs, bases)?;
    r.sort_by(|a, b| a.total_cmp(b));
    let k = sign_test_rank(r.len(), level)?;
    Some((r[k - 1], r[r.len() - k]))
}

/// The largest k >= 1 with P(Bin(n, 1/2) <= k - 1) <= (1 - level) / 2.
fn sign_test_rank(n: usize, level: f64) -> Option<usize> {
    let tail = (1.0 - level) / 2.0;
    let (mut cdf, mut pmf) = (0.0f64, 0.5f64.powi(n as i32));
    let mut k = None;
    for j in 0..n / 2 {
        // cdf = P(X <= j); rank j + 1 is usable while it stays within the tail.
        cdf += pmf;
        if cdf > tail {
            break;
        }
        k = Some(j + 1);
        pmf *= (n - j) as f64 / (j + 1) as f64;
    }
    k
}

/// Fills in the paired ratios (see `Cell`) against the [kernel, raw,
/// reference] modes; only for cells measured in rounds.
pub fn add_paired_ratios(cells: &mut [Cell], bases: [Mode; 3]) {
    let mpps = |c: &Cell| c.reps.iter().map(|r| r.mpps).collect::<Vec<f64>>();
    let base_reps: Vec<[Option<Vec<f64>>; 3]> = cells
        .iter()
        .map(|c| {
            bases.map(|m| cells.iter().find(|k| k.mode == m && k.size == c.size && k.flows == c.flows).map(mpps))
        })
        .collect();
    for (c, [kernel, raw, reference]) in cells.iter_mut().zip(base_reps) {
        let x = mpps(c);
        c.paired_ratio_to_kernel = kernel.and_then(|b| paired_ratio(&x, &b));
        c.paired_share_of_raw = raw.as_ref().and_then(|b| paired_ratio(&x, b));
        c.paired_share_of_raw_95 = raw.as_ref().and_then(|b| paired_ratio_interval(&x, b, 0.95));
        c.paired_ratio_to_reference = reference.and_then(|b| paired_ratio(&x, &b));
    }
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub bench: &'static str,
    /// The IP version of the traffic.
    pub family: super::topo::Family,
    pub unix_time: u64,
    pub kernel_release: String,
    pub method: &'static str,
    pub cpu: usize,
    pub sched_fifo: bool,
    pub reps: usize,
    pub duration_s: f64,
    pub results: &'a [Cell],
    /// fastpath's own counters over all repetitions of each fastpath mode.
    pub fastpath_verdicts: std::collections::BTreeMap<&'static str, Verdicts>,
    /// XDP1 / XDP_HINTS / XDP3 in ns per packet (None if not run).
    pub hints: Option<&'a HintsReport>,
    /// `--flow-entries` given to the daemon (None: its default).
    pub flow_entries: Option<u32>,
    /// `--daemon-arg`s given to the fastpath modes' daemons.
    pub daemon_args: &'a [String],
    pub target: Target,
}

#[derive(Debug, Serialize)]
pub struct Target {
    pub modes: [&'static str; 2],
    pub size: usize,
    pub min_ratio_to_kernel: f64,
    pub min_share_of_raw: f64,
    pub min_ratio_to_reference: f64,
    pub max_hint_to_parse: f64,
}

pub const METHOD: &str = "a loop of 192 frames: generator (XDP on g1, next flow's header, redirect out of g0) \
    -> router -> sink (XDP on s0: count, redirect out of s1 back to g1), all in one CPU's softirq work; \
    Mpps = frames counted at the sink / run time; CPU time = that CPU's busy ticks (/proc/stat); \
    sizes are Ethernet frame sizes incl. 4 B FCS (veth frames are 4 B shorter); \
    flow i = UDP source port 10000 + i % 32768, destination port 9 + i / 32768";

/// A ratio as the tables print it ("3.31x"), "-" where there is none.
pub(super) fn ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into())
}

/// A share as the tables print it ("82%"), "-" where there is none.
pub(super) fn pct(r: Option<f64>) -> String {
    r.map(|r| format!("{:.0}%", r * 100.0)).unwrap_or_else(|| "-".into())
}

pub fn print_table(cells: &[Cell], target_size: usize) {
    println!();
    println!(
        "{:<16} {:>4} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5} {:>6} | {:>8} {:>6} {:>5} {:>6} {:>4}",
        "mode", "size", "flows", "Mpps", "min", "max", "xkern", "%raw", "xref", "Mpps/CPU", "xkern", "%raw", "xref",
        "cpu%"
    );
    for c in cells {
        println!(
            "{:<16} {:>4} {:>7} {:>7.3} {:>6.3} {:>6.3} {:>6} {:>5} {:>6} | {:>8.3} {:>6} {:>5} {:>6} {:>4.0}",
            c.mode.name(),
            c.size,
            c.flows,
            c.median_mpps,
            c.min_mpps,
            c.max_mpps,
            ratio(c.ratio_to_kernel),
            pct(c.share_of_raw),
            ratio(c.ratio_to_reference),
            c.median_mpps_per_cpu_s,
            ratio(c.ratio_to_kernel_per_cpu_s),
            pct(c.share_of_raw_per_cpu_s),
            ratio(c.ratio_to_reference_per_cpu_s),
            c.median_cpu_share * 100.0
        );
    }
    println!("(Mpps: median over repetitions of sink frames / wall time; xkern, %raw, xref: against kernel, raw and the");
    println!(" bpf_fib_lookup reference fib-fwd at the same size and flows; right of |: the same per second of the bench");
    println!(" CPU's time actually spent on the traffic; cpu%: that time / wall time — below ~90% the box was busy and the");
    println!(" per-CPU-second figures are the fairer ones; afxdp's frames and CPU time are both CPUs': its forwarder thread and the loop run on the other)");
    // The targets are ratios to kernel, raw and fib-fwd: only with one of them.
    let refs = cells.iter().any(|c| matches!(c.mode, Mode::Kernel | Mode::Raw | Mode::FibFwd));
    for c in cells
        .iter()
        .filter(|c| refs && matches!(c.mode, Mode::Fastpath | Mode::FastpathHint) && c.size == target_size)
    {
        let busy = cells
            .iter()
            .filter(|k| k.size == c.size && k.flows == c.flows)
            .any(|k| k.median_cpu_share < BUSY_SHARE);
        let (hits, bypass) = c
            .fastpath_verdicts
            .as_ref()
            .map(|v| (v.cache_hits as f64 * 100.0 / (v.cache_hits + v.cache_misses).max(1) as f64, v.bypass_note()))
            .unwrap_or_default();
        println!(
            "{} {} B {} flow(s), {hits:.0}% cache hits{bypass}: {} kernel, {} of raw, {} fib-fwd (wall); {} / {} / {} per CPU-s; {} / {} / {} paired by round{}{}",
            c.mode.name(),
            c.size,
            c.flows,
            ratio(c.ratio_to_kernel),
            pct(c.share_of_raw),
            ratio(c.ratio_to_reference),
            ratio(c.ratio_to_kernel_per_cpu_s),
            pct(c.share_of_raw_per_cpu_s),
            ratio(c.ratio_to_reference_per_cpu_s),
            ratio(c.paired_ratio_to_kernel),
            pct(c.paired_share_of_raw),
            ratio(c.paired_ratio_to_reference),
            c.paired_share_of_raw_95
                .map(|(lo, hi)| format!(" (of raw paired, 95% interval {:.0}-{:.0}%)", lo * 100.0, hi * 100.0))
                .unwrap_or_default(),
            if busy { " (box busy: trust per CPU-s)" } else { "" }
        );
    }
    if refs && cells.iter().any(|c| matches!(c.mode, Mode::Fastpath | Mode::FastpathHint)) {
        println!(
            "targets for cache-hit forwarding at {target_size} B: >= {TARGET_RATIO}x kernel, >= {:.0}% of raw, >= {TARGET_RATIO_TO_REFERENCE}x fib-fwd",
            TARGET_SHARE_OF_RAW * 100.0
        );
        print_raw_headroom(cells, target_size);
    }
    print_loop_losses(cells);
    print_router_ns(cells, target_size);
    print_afxdp_shares(cells);
}

/// ns per frame a mode adds to the raw redirect's (1000 / Mpps each, so the
/// difference of two rates in Mpps): the router's own work, whatever the
/// generator and sink cost, which the ratios of whole-path rates hide.
fn ns_above(mpps: f64, raw_mpps: f64) -> Option<f64> {
    (mpps > 0.0 && raw_mpps > 0.0).then(|| 1000.0 / mpps - 1000.0 / raw_mpps)
}

/// The cells with repetitions whose loop did not keep its frames on the
/// bench CPU (traffic::GenRun::lost): their medians mix in a different
/// measurement.
fn loop_losses(cells: &[Cell]) -> Option<String> {
    let parts: Vec<String> = cells
        .iter()
        .filter_map(|c| {
            let bad: Vec<&Rep> = c.reps.iter().filter(|r| r.loop_trouble(c.mode) > 0).collect();
            (!bad.is_empty()).then(|| {
                let (lost, strayed) = bad.iter().fold((0, 0), |(l, s), r| (l + r.lost_frames, s + r.strayed_frames));
                format!(
                    "{} {} B {} flow(s): {} of {} reps ({lost} frames, {strayed} of them round another CPU)",
                    c.mode.name(),
                    c.size,
                    c.flows,
                    bad.len(),
                    c.reps.len()
                )
            })
        })
        .collect();
    (!parts.is_empty()).then(|| format!("repetitions whose loop lost frames or left the bench CPU: {}", parts.join("; ")))
}

fn print_loop_losses(cells: &[Cell]) {
    if let Some(line) = loop_losses(cells) {
        println!("{line}");
    }
}

/// At the target size: each measured router mode's ns per frame above raw,
/// per flow count, and the reference's against fastpath's.
fn print_router_ns(cells: &[Cell], target_size: usize) {
    const MODES: [Mode; 5] = [Mode::Fastpath, Mode::FastpathHint, Mode::FastpathNocache, Mode::FibFwd, Mode::Kernel];
    let mut flows: Vec<u32> = cells.iter().filter(|c| c.size == target_size).map(|c| c.flows).collect();
    flows.sort_unstable();
    flows.dedup();
    let mut parts = Vec::new();
    for f in flows {
        let at = |m: Mode| cells.iter().find(|c| c.mode == m && c.size == target_size && c.flows == f);
        let Some(raw) = at(Mode::Raw) else { continue };
        let ns: Vec<(Mode, f64)> = MODES
            .iter()
            .filter_map(|&m| at(m).and_then(|c| ns_above(c.median_mpps, raw.median_mpps)).map(|n| (m, n)))
            .collect();
        if ns.is_empty() {
            continue;
        }
        let mut line: Vec<String> = ns.iter().map(|(m, n)| format!("{} {n:.1}", m.name())).collect();
        let of = |m: Mode| ns.iter().find(|(k, _)| *k == m).map(|(_, n)| *n);
        if let (Some(fp), Some(rf)) = (of(Mode::Fastpath), of(Mode::FibFwd)) {
            if fp > 0.0 {
                line.push(format!("fib-fwd/fastpath {:.2}x", rf / fp));
            }
        }
        parts.push(format!("{f} flow(s): {}", line.join(", ")));
    }
    if !parts.is_empty() {
        println!("ns per frame above raw at {target_size} B (the router's own work): {}", parts.join("; "));
    }
}

/// How far the limit itself is from the kernel in this run: the "x kernel"
/// target asks for that share of raw, which on a VM whose kernel path is
/// cheap (or whose veth and generator are dear) may exceed what any program
/// reaches.
fn print_raw_headroom(cells: &[Cell], target_size: usize) {
    let line: Vec<String> = cells
        .iter()
        .filter(|c| c.mode == Mode::Raw && c.size == target_size)
        .filter_map(|c| {
            c.ratio_to_kernel
                .map(|x| format!("{} flow(s) {x:.2}x kernel, so {TARGET_RATIO}x kernel is {:.0}% of raw", c.flows, TARGET_RATIO * 100.0 / x))
        })
        .collect();
    if !line.is_empty() {
        println!("raw (no lookups, the limit) at {target_size} B: {}", line.join("; "));
    }
}

/// Issue #6: AF_XDP forwarding against native XDP (fastpath), and the
/// transmit-alone ceiling against the same.
fn print_afxdp_shares(cells: &[Cell]) {
    let find = |mode: Mode, c: &Cell| cells.iter().find(|k| k.mode == mode && k.size == c.size && k.flows == c.flows);
    let mut any = false;
    for c in cells.iter().filter(|c| matches!(c.mode, Mode::Afxdp | Mode::AfxdpNoprefetch | Mode::AfxdpTx)) {
        let Some(fp) = find(Mode::Fastpath, c) else { continue };
        println!(
            "{} {} B {} flow(s): {:.0}% of fastpath (wall), {:.0}% per CPU-s",
            c.mode.name(),
            c.size,
            c.flows,
            c.median_mpps * 100.0 / fp.median_mpps.max(1e-9),
            c.median_mpps_per_cpu_s * 100.0 / fp.median_mpps_per_cpu_s.max(1e-9)
        );
        any = true;
    }
    if any {
        println!(
            "target for AF_XDP forwarding: >= {:.0}% of native XDP; afxdp-tx (transmit alone) bounds what any AF_XDP forwarder reaches here",
            AFXDP_TARGET_SHARE * 100.0
        );
    }
}

pub fn write_json(report: &Report<'_>, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("forward.json");
    let text = serde_json::to_string_pretty(report).context("serialising the report")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Draws the PNG with bench/plot.py; a missing venv or matplotlib is a note,
/// not an error: the JSON is the result, the picture is a convenience.
pub fn plot(root: &Path, json: &Path) -> Option<PathBuf> {
    let python = root.join(".venv/bin/python");
    let script = root.join("bench/plot.py");
    let png = json.with_extension("png");
    if !python.exists() || !script.exists() {
        println!(
            "note: no PNG: {} or {} missing (run `make setup` for the venv with matplotlib)",
            python.display(),
            script.display()
        );
        return None;
    }
    match Command::new(&python).arg(&script).arg(json).arg(&png).output() {
        Ok(o) if o.status.success() => Some(png),
        Ok(o) => {
            println!(
                "note: no PNG: bench/plot.py failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        Err(e) => {
            println!("note: no PNG: cannot run {}: {e}", python.display());
            None
        }
    }
}

/// Seconds since the epoch, for the JSON reports (0 if the clock is before it).
pub fn unix_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_ns_is_the_difference_of_the_frame_times() {
        // 10 Mpps raw = 100 ns a frame; 8 Mpps = 125 ns: 25 ns more.
        assert_eq!(ns_above(8.0, 10.0), Some(25.0));
        assert_eq!(ns_above(10.0, 10.0), Some(0.0));
        assert_eq!(ns_above(0.0, 10.0), None);
        assert_eq!(ns_above(8.0, 0.0), None);
    }

    /// Only cells with a repetition whose loop lost frames are named, with
    /// how many of their repetitions and frames, and how many went round elsewhere.
    #[test]
    fn loop_losses_name_only_the_cells_whose_loop_did_not_keep_its_frames() {
        let sec = std::time::Duration::from_secs(1);
        let rep = |lost, strayed| Rep { lost_frames: lost, strayed_frames: strayed, ..Rep::measured(1_000_000, 1_000_000, sec, sec) };
        let clean = Cell::new(Mode::Raw, 64, 1, vec![rep(0, 0), rep(0, 0)]);
        assert_eq!(loop_losses(std::slice::from_ref(&clean)), None);
        // The AF_XDP forwarder sends from the other CPU: its loop goes round there.
        let afxdp = Cell::new(Mode::Afxdp, 64, 1, vec![rep(192, 192)]);
        assert_eq!(loop_losses(&[afxdp]), None);
        let afxdp_lost = Cell::new(Mode::Afxdp, 64, 1, vec![rep(192, 190)]);
        assert!(loop_losses(&[afxdp_lost]).is_some());
        let bad = Cell::new(Mode::Kernel, 64, 1, vec![rep(192, 192), rep(0, 0), rep(3, 0)]);
        assert_eq!(
            loop_losses(&[clean, bad]).as_deref(),
            Some(
                "repetitions whose loop lost frames or left the bench CPU: kernel 64 B 1 flow(s): 2 of 3 reps \
                 (195 frames, 192 of them round another CPU)"
            )
        );
    }

    #[test]
    fn sign_test_ranks_match_the_binomial_tables() {
        // Ranks of the 95 % interval for the median in the usual tables.
        assert_eq!(sign_test_rank(5, 0.95), None);
        assert_eq!(sign_test_rank(6, 0.95), Some(1));
        assert_eq!(sign_test_rank(10, 0.95), Some(2));
        assert_eq!(sign_test_rank(20, 0.95), Some(6));
        assert_eq!(sign_test_rank(24, 0.95), Some(7));
    }

    #[test]
    fn paired_interval_brackets_the_paired_median() {
        let base = [100.0; 10];
        let xs = [90.0, 95.0, 97.0, 99.0, 100.0, 101.0, 102.0, 104.0, 110.0, 120.0];
        let (lo, hi) = paired_ratio_interval(&xs, &base, 0.95).expect("10 rounds reach 95 %");
        // Ranks 2 and 9 of 10.
        assert_eq!((lo, hi), (0.95, 1.1));
        let m = paired_ratio(&xs, &base).expect("paired");
        assert!(lo <= m && m <= hi);
        assert_eq!(paired_ratio_interval(&xs[..5], &base[..5], 0.95), None);
        assert_eq!(paired_ratio_interval(&xs, &base[..9], 0.95), None);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn ratios_against_matching_kernel_cell() {
        let rep = |mpps: f64| Rep {
            mpps,
            offered_mpps: mpps,
            mpps_per_cpu_s: 2.0 * mpps,
            cpu_share: 0.5,
            lost_frames: 0,
            strayed_frames: 0,
        };
        let mut cells = vec![
            Cell::new(Mode::Kernel, 64, 1, vec![rep(1.0)]),
            Cell::new(Mode::FibFwd, 64, 1, vec![rep(2.0)]),
            Cell::new(Mode::Fastpath, 64, 1, vec![rep(3.0), rep(2.0), rep(4.0)]),
            Cell::new(Mode::Raw, 64, 1, vec![rep(4.0)]),
            Cell::new(Mode::Raw, 512, 1, vec![rep(3.0)]),
        ];
        add_ratios(&mut cells);
        assert_eq!(cells[0].ratio_to_kernel, Some(1.0));
        assert_eq!(cells[2].ratio_to_kernel, Some(3.0));
        assert_eq!(cells[2].ratio_to_kernel_per_cpu_s, Some(3.0));
        assert_eq!(cells[2].share_of_raw, Some(0.75));
        assert_eq!(cells[2].ratio_to_reference, Some(1.5));
        assert_eq!(cells[2].ratio_to_reference_per_cpu_s, Some(1.5));
        assert_eq!((cells[2].min_mpps, cells[2].max_mpps), (2.0, 4.0));
        assert_eq!(cells[4].ratio_to_kernel, None);
        assert_eq!(cells[4].share_of_raw, Some(1.0));
        assert_eq!(cells[4].ratio_to_reference, None);
    }

    #[test]
    fn paired_ratios_take_each_round_on_its_own() {
        let rep = |mpps: f64| Rep { mpps, offered_mpps: mpps, mpps_per_cpu_s: mpps, cpu_share: 1.0, lost_frames: 0, strayed_frames: 0 };
        // The machine runs at half speed in round 2: each round fastpath is 3x the kernel.
        let mut cells = vec![
            Cell::new(Mode::Kernel, 64, 1, vec![rep(1.0), rep(0.5), rep(1.0)]),
            Cell::new(Mode::Fastpath, 64, 1, vec![rep(3.0), rep(1.5), rep(3.0)]),
            Cell::new(Mode::Raw, 64, 1, vec![rep(4.0), rep(2.0)]),
        ];
        add_paired_ratios(&mut cells, [Mode::Kernel, Mode::Raw, Mode::FibFwd]);
        assert_eq!(cells[1].paired_ratio_to_kernel, Some(3.0));
        assert_eq!(cells[0].paired_ratio_to_kernel, Some(1.0));
        // Rounds that do not line up give no paired figure.
        assert_eq!(cells[1].paired_share_of_raw, None);
        assert_eq!(cells[1].paired_ratio_to_reference, None);
        assert_eq!(paired_ratio(&[2.0, 9.0, 3.0], &[1.0, 3.0, 1.0]), Some(3.0));
        assert_eq!(paired_ratio(&[1.0], &[0.0]), None);
        // Nor an interval (which three rounds could not reach anyway).
        assert_eq!(cells[1].paired_share_of_raw_95, None);
    }

    #[test]
    fn share_of_raw_gets_its_interval_from_enough_rounds() {
        let rep = |mpps: f64| Rep { mpps, offered_mpps: mpps, mpps_per_cpu_s: mpps, cpu_share: 1.0, lost_frames: 0, strayed_frames: 0 };
        let raw: Vec<f64> = (0..9).map(|i| 4.0 + f64::from(i % 3) * 0.1).collect();
        let share = [0.86, 0.91, 0.88, 0.93, 0.89, 0.87, 0.90, 0.92, 0.85];
        let mut cells = vec![
            Cell::new(Mode::Fastpath, 64, 1, raw.iter().zip(share).map(|(r, s)| rep(r * s)).collect()),
            Cell::new(Mode::Raw, 64, 1, raw.iter().map(|r| rep(*r)).collect()),
        ];
        add_paired_ratios(&mut cells, [Mode::Kernel, Mode::Raw, Mode::FibFwd]);
        // 9 rounds: the sign-test interval runs from the 2nd to the 8th of the sorted shares.
        let (lo, hi) = cells[0].paired_share_of_raw_95.expect("9 rounds reach 95 %");
        assert!((lo - 0.86).abs() < 1e-9 && (hi - 0.92).abs() < 1e-9, "{lo} {hi}");
        assert_eq!(cells[1].paired_share_of_raw_95.map(|(lo, hi)| (lo.round(), hi.round())), Some((1.0, 1.0)));
    }
}
