//! Turning repetitions into the printed table, bench/out/forward.json and the
//! PNG (drawn by bench/plot.py with the project's venv).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::Serialize;

use super::router::{Mode, Verdicts};

/// The target for this stage: fastpath vs kernel at 64 B.
pub const TARGET_RATIO: f64 = 2.5;
pub const TARGET_SIZE: usize = 64;
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
    pub median_mpps_per_cpu_s: f64,
    pub ratio_to_kernel_per_cpu_s: Option<f64>,
    pub median_cpu_share: f64,
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
            median_mpps_per_cpu_s: median(&per_cpu),
            ratio_to_kernel_per_cpu_s: None,
            median_cpu_share: median(&share),
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

/// Fills in each cell's ratios to the kernel cell of the same size and flows.
pub fn add_ratios(cells: &mut [Cell]) {
    let kernel: Vec<(usize, u32, f64, f64)> = cells
        .iter()
        .filter(|c| c.mode == Mode::Kernel)
        .map(|c| (c.size, c.flows, c.median_mpps, c.median_mpps_per_cpu_s))
        .collect();
    for c in cells.iter_mut() {
        let Some(&(_, _, k, kc)) = kernel.iter().find(|(s, f, _, _)| *s == c.size && *f == c.flows) else {
            continue;
        };
        c.ratio_to_kernel = (k > 0.0).then(|| c.median_mpps / k);
        c.ratio_to_kernel_per_cpu_s = (kc > 0.0).then(|| c.median_mpps_per_cpu_s / kc);
    }
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub bench: &'static str,
    pub unix_time: u64,
    pub kernel_release: String,
    pub method: &'static str,
    pub cpu: usize,
    pub sched_fifo: bool,
    pub reps: usize,
    pub duration_s: f64,
    pub results: &'a [Cell],
    /// fastpath's own counters over all its repetitions (None if not run).
    pub fastpath_verdicts: Option<&'a Verdicts>,
    pub target: Target,
}

#[derive(Debug, Serialize)]
pub struct Target {
    pub mode: &'static str,
    pub size: usize,
    pub min_ratio_to_kernel: f64,
}

pub const METHOD: &str = "generator (BPF_PROG_RUN live frames, XDP_TX) -> router -> sink (XDP count+drop), \
    all on one pinned CPU; Mpps = frames counted at the sink / generator run time; \
    sizes are Ethernet frame sizes incl. 4 B FCS (veth frames are 4 B shorter); flows = distinct UDP source ports";

fn ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into())
}

pub fn print_table(cells: &[Cell]) {
    println!();
    println!(
        "{:<9} {:>5} {:>6} {:>8} {:>7} {:>7} {:>9} | {:>9} {:>9} {:>5}",
        "mode", "size", "flows", "Mpps", "min", "max", "x kernel", "Mpps/CPU", "x kernel", "cpu%"
    );
    for c in cells {
        println!(
            "{:<9} {:>5} {:>6} {:>8.3} {:>7.3} {:>7.3} {:>9} | {:>9.3} {:>9} {:>5.0}",
            c.mode.name(),
            c.size,
            c.flows,
            c.median_mpps,
            c.min_mpps,
            c.max_mpps,
            ratio(c.ratio_to_kernel),
            c.median_mpps_per_cpu_s,
            ratio(c.ratio_to_kernel_per_cpu_s),
            c.median_cpu_share * 100.0
        );
    }
    println!("(Mpps: median over repetitions of sink frames / wall time; Mpps/CPU: per second of the bench CPU's time actually");
    println!(" spent on the traffic; cpu%: that time / wall time — below ~90% the box was busy and Mpps/CPU is the fairer figure)");
    for c in cells
        .iter()
        .filter(|c| c.mode == Mode::Fastpath && c.size == TARGET_SIZE)
    {
        let kernel = cells
            .iter()
            .find(|k| k.mode == Mode::Kernel && k.size == c.size && k.flows == c.flows);
        let busy = kernel
            .map(|k| k.median_cpu_share.min(c.median_cpu_share) < BUSY_SHARE)
            .unwrap_or(false);
        println!(
            "fastpath at {} B, {} flow(s): {} kernel by wall clock, {} per CPU-second{}; target for this stage >= {TARGET_RATIO}x",
            c.size,
            c.flows,
            ratio(c.ratio_to_kernel),
            ratio(c.ratio_to_kernel_per_cpu_s),
            if busy { " (box busy: trust the per-CPU-second figure)" } else { "" }
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

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let mut cells = vec![
            Cell::new(Mode::Kernel, 64, 1, vec![rep(1.0)]),
            Cell::new(Mode::Fastpath, 64, 1, vec![rep(3.0), rep(2.0), rep(4.0)]),
            Cell::new(Mode::Raw, 512, 1, vec![rep(3.0)]),
        ];
        add_ratios(&mut cells);
        assert_eq!(cells[0].ratio_to_kernel, Some(1.0));
        assert_eq!(cells[1].ratio_to_kernel, Some(3.0));
        assert_eq!(cells[1].ratio_to_kernel_per_cpu_s, Some(3.0));
        assert_eq!((cells[1].min_mpps, cells[1].max_mpps), (2.0, 4.0));
        assert_eq!(cells[2].ratio_to_kernel, None);
    }
}
