//! The printed tables (in the style of bench/report.rs), points.json and the
//! PNG drawn by bench/plot_points.py.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{Cell, Point, PointsReport};

pub fn cell_line(c: &Cell) -> String {
    format!(
        "   {:<8} {:<4} N={:<3} {:>5} flow(s) {} core(s): {} Mpps",
        c.point.name(),
        format!("{:?}", c.workload).to_lowercase(),
        c.n,
        c.flows,
        c.cores,
        c.mpps
            .iter()
            .map(|m| format!("{m:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn ratio(x: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{:.2}x", x / b),
        _ => "-".into(),
    }
}

/// The native-XDP cell's (Mpps, Mpps per CPU-s) for the same variant.
fn native_of(cells: &[Cell], c: &Cell) -> Option<(f64, f64)> {
    cells
        .iter()
        .find(|k| {
            k.point == Point::Native && k.n == c.n && k.flows == c.flows && k.cores == c.cores
        })
        .map(|k| (k.median_mpps, k.mpps_per_cpu_s))
}

fn cpu_cols(c: &Cell) -> String {
    format!(
        "{:>4.0} {:>4.0} {:>4.0} {:>4.0} | {:>6.0} {:>6.0} {:>6.0} {:>6.0}",
        c.cpu.user * 100.0,
        c.cpu.system * 100.0,
        c.cpu.softirq * 100.0,
        c.cpu.idle * 100.0,
        c.ns_per_packet_user,
        c.ns_per_packet_system,
        c.ns_per_packet_softirq,
        c.ns_per_packet_total
    )
}

const CPU_HEAD: &str = " usr% sys% sirq idle |  ns/pkt: usr    sys   sirq    all";

pub fn print(r: &PointsReport) {
    println!();
    if !r.drop.is_empty() {
        println!("(a) drop everything, 64 B");
        println!(
            "{:<8} {:>6} {:>5} {:>7} {:>6} {:>6} {:>7} {:>8} {:>7} |{CPU_HEAD}",
            "point", "flows", "cores", "Mpps", "min", "max", "xnative", "Mpps/CPU", "xnative"
        );
        for c in &r.drop {
            println!(
                "{:<8} {:>6} {:>5} {:>7.3} {:>6.3} {:>6.3} {:>7} {:>8.3} {:>7} | {}",
                c.point.name(),
                c.flows,
                c.cores,
                c.median_mpps,
                c.min_mpps,
                c.max_mpps,
                ratio(c.median_mpps, native_of(&r.drop, c).map(|k| k.0)),
                c.mpps_per_cpu_s,
                ratio(c.mpps_per_cpu_s, native_of(&r.drop, c).map(|k| k.1)),
                cpu_cols(c)
            );
        }
        println!();
    }
    if !r.csum.is_empty() {
        println!("(b) N IPv4 header checksums per frame, then drop (1 flow, 1 core)");
        println!(
            "{:<8} {:>4} {:>7} {:>6} {:>6} {:>7} {:>8} {:>7} |{CPU_HEAD}",
            "point", "N", "Mpps", "min", "max", "xnative", "Mpps/CPU", "xnative"
        );
        for c in &r.csum {
            println!(
                "{:<8} {:>4} {:>7.3} {:>6.3} {:>6.3} {:>7} {:>8.3} {:>7} | {}",
                c.point.name(),
                c.n,
                c.median_mpps,
                c.min_mpps,
                c.max_mpps,
                ratio(c.median_mpps, native_of(&r.csum, c).map(|k| k.0)),
                c.mpps_per_cpu_s,
                ratio(c.mpps_per_cpu_s, native_of(&r.csum, c).map(|k| k.1)),
                cpu_cols(c)
            );
        }
        println!();
    }
    let afxdp: Vec<&Cell> = r
        .drop
        .iter()
        .chain(&r.csum)
        .filter(|c| c.afxdp_work_ns_per_packet.is_some())
        .collect();
    if !afxdp.is_empty() {
        println!(
            "afxdp user loop, ns of work per frame (the rest of its CPU is polling): {}",
            afxdp
                .iter()
                .map(|c| format!(
                    "{} N={} {} flow(s): {:.0}",
                    format!("{:?}", c.workload).to_lowercase(),
                    c.n,
                    c.flows,
                    c.afxdp_work_ns_per_packet.unwrap_or(0.0)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !r.drop.is_empty() || !r.csum.is_empty() {
        println!("Mpps: frames handled / wall time; Mpps/CPU: per second of the generator CPUs' busy time (the spring,");
        println!("the point and everything in their softirq work, from /proc/stat) plus the AF_XDP loop's — the fairer");
        println!("figure on a shared box.");
        println!("(f) usr/sys/sirq/idle: shares of the CPUs the cell used (AF_XDP: both; 100 = one CPU) from /proc/stat,");
        println!("    so other tasks on those CPUs show up too; ns/pkt: that CPU time per handled frame. The generator's");
        println!("    own work (the spring's round and the copy it sends, gen.bpf.c) is softirq time on its CPU in every");
        println!("    cell, so differences between points are the points' costs.");
        println!();
    }
    if !r.maps.is_empty() {
        println!("(e) map updates from user space (16 B values; bpf-map = what native, generic and TC programs read)");
        println!(
            "{:<8} {:<5} {:>8} {:<7} {:>14} {:>8}",
            "point", "map", "entries", "method", "updates/s", "xsingle"
        );
        for m in &r.maps {
            let single = r
                .maps
                .iter()
                .find(|k| {
                    k.point == m.point
                        && k.map == m.map
                        && k.entries == m.entries
                        && k.method == "single"
                })
                .map(|k| k.updates_per_s);
            match &m.error {
                Some(e) => println!(
                    "{:<8} {:<5} {:>8} {:<7} {e}",
                    m.point, m.map, m.entries, m.method
                ),
                None => println!(
                    "{:<8} {:<5} {:>8} {:<7} {:>14.0} {:>8}",
                    m.point,
                    m.map,
                    m.entries,
                    m.method,
                    m.updates_per_s,
                    ratio(m.updates_per_s, single)
                ),
            }
        }
        println!();
    }
    for s in &r.skipped {
        println!(
            "skipped: {:?} {} {} flow(s) {} core(s): {}",
            s.workload,
            s.point.name(),
            s.flows,
            s.cores,
            s.why
        );
    }
    if !r.nic_offload.is_empty() {
        println!("nic offload: {}", r.nic_offload);
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}

pub fn write_json(r: &PointsReport, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(r).context("serialising the report")?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Draws the PNG with bench/plot_points.py and the project's venv; without
/// them it is a note: the JSON is the result.
pub fn plot(json: &Path, png: &Path) -> Option<PathBuf> {
    let root = super::super::repo_root();
    let python = root.join(".venv/bin/python");
    let script = root.join("bench/plot_points.py");
    if !python.exists() || !script.exists() {
        println!(
            "note: no PNG: {} or {} missing",
            python.display(),
            script.display()
        );
        return None;
    }
    // --json elsewhere leaves --out's directory uncreated.
    if let Some(dir) = png.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            println!("note: no PNG: creating {}: {e}", dir.display());
            return None;
        }
    }
    match Command::new(&python)
        .arg(&script)
        .arg(json)
        .arg(png)
        .output()
    {
        Ok(o) if o.status.success() => Some(png.to_path_buf()),
        Ok(o) => {
            println!(
                "note: no PNG: plot_points.py failed: {}",
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
