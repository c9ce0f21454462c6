//! `fastpath bench hints`: what a flow hash costs when the program parses
//! the packet for it, when a NIC hands it over in the metadata area, and
//! the floor of an XDP program that does nothing (the hints paper's XDP1,
//! XDP_HINTS and XDP3), in ns per packet, with BPF_PROG_RUN.
//!
//! BPF_PROG_RUN reports the mean run time in whole nanoseconds, too coarse
//! for programs that take a few; the bench also divides the calling
//! thread's CPU time by the repeat count, which keeps the fraction (the
//! call's fixed set-up is noise over millions of runs, and the
//! synchronize_rcu() of entering the XDP dispatcher sleeps, so it costs no
//! CPU time).

use std::mem::MaybeUninit;

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf::{fp_rx_hint, FP_HINT_L4, FP_HINT_MAGIC};
use fastpath_bpf::skel::hints::{HintsSkel, HintsSkelBuilder};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{ProgramInput, ProgramMut};
use serde::Serialize;

use super::report::median;
use super::traffic::{self, Placement, HINT_LEN};

const XDP_DROP: u32 = 1;

/// The hint path's cost as a share of the parse path's: the target.
pub const TARGET_HINT_TO_PARSE: f64 = 0.8;

#[derive(Clone, Debug, Serialize)]
pub struct HintRow {
    /// Name in the hints paper.
    pub program: &'static str,
    pub what: &'static str,
    /// Median over repetitions of thread CPU time / runs.
    pub ns_per_packet: f64,
    pub min_ns: f64,
    pub max_ns: f64,
    /// Median of the kernel's own figure (whole ns per run).
    pub kernel_ns: f64,
    pub reps_ns: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HintsReport {
    pub repeat: u32,
    pub reps: usize,
    pub frame_bytes: usize,
    pub rows: Vec<HintRow>,
    /// XDP_HINTS / XDP1, whole program, medians.
    pub hint_to_parse: f64,
    /// The same from the minima (the least disturbed runs on a shared box).
    pub hint_to_parse_min: f64,
    /// (XDP_HINTS - XDP3) / (XDP1 - XDP3): the flow-hash work alone.
    pub hint_to_parse_above_floor: Option<f64>,
    pub target_max_hint_to_parse: f64,
}

#[derive(Clone, Copy)]
enum Prog {
    Parse,
    Hints,
    None,
}

impl Prog {
    const ALL: [Prog; 3] = [Prog::Parse, Prog::Hints, Prog::None];

    fn program(self) -> &'static str {
        match self {
            Prog::Parse => "XDP1",
            Prog::Hints => "XDP_HINTS",
            Prog::None => "XDP3",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Prog::Parse => "parse Ethernet/IPv4/UDP + software flow hash",
            Prog::Hints => "flow hash from fp_rx_hint in the metadata",
            Prog::None => "no work (floor)",
        }
    }

    fn of<'a>(self, skel: &'a HintsSkel<'_>) -> &'a ProgramMut<'a> {
        match self {
            Prog::Parse => &skel.progs.fp_bench_xdp1_parse,
            Prog::Hints => &skel.progs.fp_bench_xdp_hints,
            Prog::None => &skel.progs.fp_bench_xdp3_none,
        }
    }
}

/// The bench's 64 B frame with the hint the generator would put in front.
fn input() -> Result<Vec<u8>> {
    let hint = fp_rx_hint {
        hash: 0x1234_5678,
        flags: FP_HINT_L4 as u16,
        magic: FP_HINT_MAGIC as u16,
    };
    let mut data = Vec::with_capacity(HINT_LEN + 64);
    data.extend_from_slice(&hint.hash.to_ne_bytes());
    data.extend_from_slice(&hint.flags.to_ne_bytes());
    data.extend_from_slice(&hint.magic.to_ne_bytes());
    data.extend_from_slice(&traffic::frame(64)?);
    Ok(data)
}

/// struct xdp_md for BPF_PROG_RUN: metadata = the first HINT_LEN bytes of
/// data_in (net/bpf/test_run.c: data_meta must be 0, data = metadata length).
fn ctx(data_len: usize) -> [u8; 24] {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
    let mut c = [0u8; 24];
    c[0..4].copy_from_slice(&(HINT_LEN as u32).to_ne_bytes());
    c[4..8].copy_from_slice(&(data_len as u32).to_ne_bytes());
    c
}

/// (CPU ns per run, kernel's ns per run) of one BPF_PROG_RUN call.
fn time_one(prog: &ProgramMut<'_>, data: &[u8], repeat: u32) -> Result<(f64, f64)> {
    let mut c = ctx(data.len());
    let c0 = traffic::thread_cpu_time()?;
    let out = prog
        .test_run(ProgramInput {
            data_in: Some(data),
            context_in: Some(&mut c),
            repeat,
            ..Default::default()
        })
        .context("BPF_PROG_RUN")?;
    let cpu = traffic::thread_cpu_time()?.saturating_sub(c0);
    if out.return_value != XDP_DROP {
        bail!("returned {} instead of XDP_DROP: it did not get its flow hash", out.return_value);
    }
    Ok((
        cpu.as_nanos() as f64 / f64::from(repeat),
        out.duration.as_nanos() as f64,
    ))
}

pub fn measure(place: Placement, repeat: u32, reps: usize) -> Result<HintsReport> {
    if repeat == 0 || reps == 0 {
        bail!("hints: --repeat and --reps must be at least 1");
    }
    // Pinned and, where allowed, SCHED_FIFO like the generator: other tasks
    // then wait instead of landing in the middle of a run.
    std::thread::spawn(move || -> Result<HintsReport> {
        place.apply()?;
        let mut obj = MaybeUninit::uninit();
        let skel = HintsSkelBuilder::default()
            .open(&mut obj)
            .context("opening hints.bpf.o")?
            .load()
            .context("loading hints.bpf.o")?;
        let data = input()?;
        let mut cpu: [Vec<f64>; 3] = Default::default();
        let mut kern: [Vec<f64>; 3] = Default::default();
        // Warm-up, and a check that each program takes the path it names.
        for p in Prog::ALL {
            time_one(p.of(&skel), &data, repeat / 10 + 1).with_context(|| p.program())?;
        }
        // Interleaved, so drift on a shared box spreads over all three.
        for _ in 0..reps {
            for (i, p) in Prog::ALL.into_iter().enumerate() {
                let (c, k) = time_one(p.of(&skel), &data, repeat).with_context(|| p.program())?;
                cpu[i].push(c);
                kern[i].push(k);
            }
        }
        let rows: Vec<HintRow> = Prog::ALL
            .into_iter()
            .enumerate()
            .map(|(i, p)| HintRow {
                program: p.program(),
                what: p.what(),
                ns_per_packet: median(&cpu[i]),
                min_ns: cpu[i].iter().copied().fold(f64::INFINITY, f64::min),
                max_ns: cpu[i].iter().copied().fold(0.0, f64::max),
                kernel_ns: median(&kern[i]),
                reps_ns: cpu[i].clone(),
            })
            .collect();
        let (parse, hint, floor) = (rows[0].ns_per_packet, rows[1].ns_per_packet, rows[2].ns_per_packet);
        Ok(HintsReport {
            repeat,
            reps,
            frame_bytes: data.len() - HINT_LEN,
            hint_to_parse: if parse > 0.0 { hint / parse } else { 0.0 },
            hint_to_parse_min: if rows[0].min_ns > 0.0 { rows[1].min_ns / rows[0].min_ns } else { 0.0 },
            hint_to_parse_above_floor: (parse - floor > 0.0).then(|| (hint - floor).max(0.0) / (parse - floor)),
            target_max_hint_to_parse: TARGET_HINT_TO_PARSE,
            rows,
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("hints thread panicked"))?
}

pub fn print_table(r: &HintsReport) {
    println!();
    println!(
        "ns per packet, BPF_PROG_RUN x {} ({} reps, 60 B frame + {HINT_LEN} B metadata, one CPU):",
        r.repeat, r.reps
    );
    println!("{:<10} {:>7} {:>7} {:>7} {:>8}  work", "program", "ns/pkt", "min", "max", "kernel");
    for row in &r.rows {
        println!(
            "{:<10} {:>7.2} {:>7.2} {:>7.2} {:>8.0}  {}",
            row.program, row.ns_per_packet, row.min_ns, row.max_ns, row.kernel_ns, row.what
        );
    }
    println!("(ns/pkt: the CPU thread's time / runs; kernel: BPF_PROG_RUN's own figure, whole ns)");
    let above = r
        .hint_to_parse_above_floor
        .map(|x| format!("{x:.2}x"))
        .unwrap_or_else(|| "-".into());
    println!(
        "hint path / parse path: {:.2}x whole program (minima: {:.2}x), {above} above the XDP3 floor; target <= {:.1}x",
        r.hint_to_parse, r.hint_to_parse_min, r.target_max_hint_to_parse
    );
}

/// Standalone `fastpath bench hints`: prints and writes hints.json.
pub fn run(place: Placement, repeat: u32, reps: usize, out: &std::path::Path) -> Result<()> {
    println!(
        "fastpath bench hints: XDP1 / XDP_HINTS / XDP3 on CPU {}{}",
        place.cpu,
        if place.fifo { " (SCHED_FIFO)" } else { "" }
    );
    let r = measure(place, repeat, reps)?;
    print_table(&r);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("hints.json");
    let text = serde_json::to_string_pretty(&r).context("serialising the hints report")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each program takes the path it is named after on the bench's input,
    /// and XDP_HINTS refuses a frame without a valid hint.
    #[test]
    fn programs_drop_with_hint_and_hints_needs_one() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "needs root; CI=true makes a skip a failure");
            eprintln!("programs_drop_with_hint_and_hints_needs_one: skipped, needs root");
            return;
        }
        let mut obj = MaybeUninit::uninit();
        let skel = HintsSkelBuilder::default().open(&mut obj).unwrap().load().unwrap();
        let data = input().unwrap();
        for p in Prog::ALL {
            time_one(p.of(&skel), &data, 10).unwrap();
        }
        let mut bad = data.clone();
        bad[6..8].copy_from_slice(&0u16.to_ne_bytes());
        assert!(time_one(Prog::Hints.of(&skel), &bad, 1).is_err(), "hint without magic taken");
        let plain = traffic::frame(64).unwrap();
        let ret = skel
            .progs
            .fp_bench_xdp_hints
            .test_run(ProgramInput {
                data_in: Some(&plain),
                ..Default::default()
            })
            .unwrap()
            .return_value;
        assert_eq!(ret, 2, "no metadata: XDP_PASS");
    }
}
