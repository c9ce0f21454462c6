//! Every BPF program builds and loads on this kernel with the clang we
//! support (clang-19, which the build uses), compiled here with the same
//! flags rather than taken from whatever build.rs happened to run.
//!
//! Each `bpf/**/*.bpf.c` is compiled with the flags of build.rs (plus what
//! libbpf-cargo adds: `-g -O2 -target bpf -fno-stack-protector` and its
//! vendored libbpf headers) and loaded through libbpf as one object: the
//! `*_hw` programs (the NIC-metadata variants) bound to a veth as the daemon
//! binds them, everything else as is. The verifier runs on every program.
//! It walks only what the load-time settings (`fp_cfg` in .rodata) leave
//! reachable, so xdp_fwd is loaded once per configuration the daemon uses
//! (no flow cache, flow cache, stateful, AF_XDP, NIC RX hash): a path that
//! only one of them reaches, and its stack, are verified too.
//!
//! Every map lookup (and update, delete, redirect...) of a loaded program
//! must be bound to its map: a call of the generic helper, such as
//! bpf_map_lookup_elem, in the verified image means clang merged the calls
//! on two maps into one (maps.h, fp_lookup_apart), which costs an indirect
//! call where the map's own code, often inlined, belongs.
//!
//! Older compilers build every object, but their frames for xdp_fwd are
//! larger: with the flow cache on (the default) clang-14 needs 560 bytes of
//! stack for the entry point and the general path together, clang-16 528,
//! over the verifier's 512 (clang-19: 64 + 448). This test, which used to
//! load xdp_fwd with its .rodata defaults (no flow cache, so that path was
//! never verified), had them pass.
//!
//! Needs root. `FASTPATH_COMPAT_CLANGS` overrides the compilers (space
//! separated, e.g. "clang-16 clang-19"); a missing one skips, or fails
//! under CI=true.
//!
//!   CARGO_TARGET_DIR=/work/tgt-hard cargo test --release -p fastpath-bpf --test clang_compat

#[allow(dead_code)]
mod support;

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf::fp_config;
use libbpf_rs::libbpf_sys;
use libbpf_rs::ObjectBuilder;

use support::netns::{require_root, Lab};

/// A scratch directory that is removed again, also when the test panics.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<Self> {
        let p = std::env::temp_dir().join(format!("fastpath-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sources() -> Result<Vec<PathBuf>> {
    let bpf = repo().join("bpf");
    let mut v = Vec::new();
    for dir in [bpf.clone(), bpf.join("bench"), bpf.join("test")] {
        for e in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".bpf.c")) {
                v.push(p);
            }
        }
    }
    v.sort();
    Ok(v)
}

/// libbpf's bpf_helpers.h & co., the same copy libbpf-cargo hands to clang.
fn write_libbpf_headers(dir: &Path) -> Result<PathBuf> {
    let inc = dir.join("include");
    fs::create_dir_all(inc.join("bpf"))?;
    for (name, text) in libbpf_sys::API_HEADERS.iter() {
        fs::write(inc.join("bpf").join(name), text).with_context(|| format!("writing {name}"))?;
    }
    Ok(inc)
}

fn compile(clang: &str, src: &Path, out: &Path, libbpf_inc: &Path) -> Result<()> {
    let bpf = repo().join("bpf");
    let o = Command::new(clang)
        // keep in step with crates/fastpath-bpf/build.rs
        .args(["-O2", "-g", "-Wall", "-Werror", "-mcpu=v3", "-D__TARGET_ARCH_x86"])
        .arg(format!("-I{}", bpf.join("include").display()))
        .arg(format!("-I{}", bpf.join("lib").display()))
        .arg("-I")
        .arg(libbpf_inc)
        .args(["-fno-stack-protector", "-target", "bpf", "-c"])
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .with_context(|| format!("running {clang}"))?;
    if !o.status.success() {
        bail!("{clang} {}:\n{}", src.display(), String::from_utf8_lossy(&o.stderr));
    }
    Ok(())
}

struct Job {
    clang: String,
    src: PathBuf,
    stem: String,
    out: PathBuf,
}

/// Runs the compilers on as many CPUs as there are: compiling, one clang
/// process per object, was most of this test's time. Results in job order.
fn compile_all(jobs: &[Job], libbpf_inc: &Path) -> Vec<Result<()>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<()>>>> = Mutex::new(jobs.iter().map(|_| None).collect());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(j) = jobs.get(i) else { break };
                let r = compile(&j.clang, &j.src, &j.out, libbpf_inc);
                results.lock().expect("a compile worker panicked")[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .expect("a compile worker panicked")
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("not compiled"))))
        .collect()
}

/// The fp_config values xdp_fwd is loaded with, as the daemon would set them.
fn configs() -> Vec<(&'static str, fp_config)> {
    let cache = fp_config { ingress_ifindex: 1, ingress_slot: 1, flow_sets: 1024, ..Default::default() };
    vec![
        ("no flow cache", fp_config { flow_sets: 0, ..cache }),
        ("flow cache", cache),
        ("stateful", fp_config { stateful: 1, ..cache }),
        ("afxdp", fp_config { afxdp: 1, ..cache }),
        ("fib4 dir24", fp_config { fib4_dir: 1, ..cache }),
        // fib6_dir: fp_fib6_dir's bucket count, the daemon's smallest.
        ("fib6 multibit", fp_config { fib6_dir: 1024, ..cache }),
        // The most the verifier walks: both indexes' lookups ahead of conntrack.
        ("stateful, both indexes", fp_config { stateful: 1, fib4_dir: 1, fib6_dir: 1024, ..cache }),
        ("nic rx hash", fp_config { nic_rx_hash: 1, nic_hash_is_skb_hash: 1, ..cache }),
    ]
}

/// Where `fp_cfg` sits in the object's .rodata (its symbol's value).
fn fp_cfg_offset(obj: &Path) -> Result<usize> {
    let o = Command::new("llvm-objdump-19").arg("-t").arg(obj).output().context("running llvm-objdump-19")?;
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(".rodata") && l.split_whitespace().last() == Some("fp_cfg"))
        .with_context(|| format!("no fp_cfg in the symbols of {}", obj.display()))?;
    let value = line.split_whitespace().next().context("symbol line")?;
    Ok(usize::from_str_radix(value, 16)?)
}

/// The helpers that take a map and that the verifier replaces, for a
/// JIT'd program, with the map's own code wherever it can tell the map: a
/// call of one of them left in the verified image was reached with two
/// maps (README, "How it is tested", Compilers).
const GENERIC_MAP_HELPERS: &[&str] = &[
    "bpf_map_lookup_elem",
    "bpf_map_update_elem",
    "bpf_map_delete_elem",
    "bpf_map_push_elem",
    "bpf_map_pop_elem",
    "bpf_map_peek_elem",
    "bpf_map_lookup_percpu_elem",
    "bpf_for_each_map_elem",
    "bpf_xdp_redirect_map",
];

/// What the verifier writes into a helper call's imm for each generic map
/// helper: its address relative to __bpf_call_base.
fn generic_helper_imms() -> Result<Vec<(&'static str, i32)>> {
    let syms = fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?;
    let addr = |name: &str| -> Result<u64> {
        let a = syms
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (a, _, n) = (f.next()?, f.next()?, f.next()?);
                (n == name).then(|| u64::from_str_radix(a, 16).ok()).flatten()
            })
            .with_context(|| format!("{name} not in /proc/kallsyms"))?;
        if a == 0 {
            bail!("/proc/kallsyms hides addresses (kernel.kptr_restrict)");
        }
        Ok(a)
    };
    let base = addr("__bpf_call_base")? as i64;
    let mut v = Vec::new();
    for &h in GENERIC_MAP_HELPERS {
        match addr(h) {
            Ok(a) => v.push((h, i32::try_from(a as i64 - base).context("helper offset out of range")?)),
            // The others only where this kernel has them (an older one lacks some).
            Err(e) if h == "bpf_map_lookup_elem" => return Err(e),
            Err(_) => {}
        }
    }
    Ok(v)
}

/// The calls of generic map helpers (`imms`) in a loaded program's
/// verified image (helper calls: code BPF_JMP|BPF_CALL, src_reg 0).
fn generic_helper_calls(fd: BorrowedFd<'_>, imms: &[(&'static str, i32)]) -> Result<Vec<&'static str>> {
    let info_len = |info: &mut libbpf_sys::bpf_prog_info| -> Result<()> {
        let mut len = size_of::<libbpf_sys::bpf_prog_info>() as u32;
        // SAFETY: info is a whole bpf_prog_info; the kernel writes at most len bytes
        // and, when xlated_prog_insns is set, at most xlated_prog_len bytes there.
        let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), info, &mut len) };
        if rc != 0 {
            bail!("bpf_prog_get_info_by_fd: {}", std::io::Error::from_raw_os_error(-rc));
        }
        Ok(())
    };
    let mut info = libbpf_sys::bpf_prog_info::default();
    info_len(&mut info)?;
    let mut insns = vec![0u8; info.xlated_prog_len as usize];
    let mut info = libbpf_sys::bpf_prog_info {
        xlated_prog_len: insns.len() as u32,
        xlated_prog_insns: insns.as_mut_ptr() as u64,
        ..Default::default()
    };
    info_len(&mut info)?;
    Ok(insns
        .chunks_exact(8)
        .filter(|i| i[0] == 0x85 && i[1] >> 4 == 0)
        .filter_map(|i| {
            let imm = i32::from_le_bytes([i[4], i[5], i[6], i[7]]);
            imms.iter().find(|&&(_, h)| h == imm).map(|&(n, _)| n)
        })
        .collect())
}

/// Loads the programs of the object (with `cfg` written over `fp_cfg`,
/// only the entry points the daemon loads with it: fp_xdp_fwd_full* for
/// stateful and AF_XDP instances, fp_xdp_fwd* otherwise); returns their names.
/// Without `meta`, the `*_hint` entry points (bpf_xdp_adjust_meta) stay unloaded.
/// A program that still calls a generic map helper (`generic`) fails.
fn load(
    obj: &Path,
    bind_to: u32,
    cfg: Option<&fp_config>,
    meta: bool,
    generic: &[(&'static str, i32)],
) -> Result<Vec<String>> {
    let mut open = ObjectBuilder::default().open_file(obj).context("open")?;
    if !meta {
        for mut p in open.progs_mut() {
            if p.name().to_string_lossy().ends_with("_hint") {
                p.set_autoload(false);
            }
        }
    }
    if let Some(cfg) = cfg {
        let full = cfg.stateful != 0 || cfg.afxdp != 0;
        for mut p in open.progs_mut() {
            let name = p.name().to_string_lossy().into_owned();
            p.set_autoload(name.starts_with("fp_xdp_fwd_full") == full);
        }
        let at = fp_cfg_offset(obj)?;
        // SAFETY: fp_config is a plain C struct (bindgen) of u32 fields.
        let bytes =
            unsafe { std::slice::from_raw_parts((cfg as *const fp_config).cast::<u8>(), size_of::<fp_config>()) };
        let mut rodata = open
            .maps_mut()
            .find(|m| m.name().to_string_lossy().ends_with(".rodata"))
            .context("no .rodata map")?;
        let init = rodata.initial_value_mut().context(".rodata has no initial value")?;
        init.get_mut(at..at + bytes.len()).context("fp_cfg outside .rodata")?.copy_from_slice(bytes);
    }
    let mut names = Vec::new();
    for mut p in open.progs_mut() {
        if !p.autoload() {
            continue;
        }
        let name = p.name().to_string_lossy().into_owned();
        if name.ends_with("_hw") {
            p.set_ifindex(bind_to);
            p.set_flags(libbpf_sys::BPF_F_XDP_DEV_BOUND_ONLY);
        }
        names.push(name);
    }
    let loaded = open.load().context("load (verifier)")?;
    let fds = loaded.progs().filter(|p| p.autoload()).count();
    if fds != names.len() {
        bail!("{} of {} programs loaded", fds, names.len());
    }
    for p in loaded.progs().filter(|p| p.autoload()) {
        let calls = generic_helper_calls(p.as_fd(), generic)?;
        if !calls.is_empty() {
            bail!(
                "{}: calls of generic map helpers ({}): calls on two maps merged into one \
                 (use fp_lookup_apart, bpf/lib/maps.h, or the like), or the BPF JIT is off",
                p.name().to_string_lossy(),
                calls.join(", ")
            );
        }
    }
    Ok(names)
}

fn clangs() -> Vec<String> {
    std::env::var("FASTPATH_COMPAT_CLANGS")
        .unwrap_or_else(|_| "clang-19".into())
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn have(clang: &str) -> bool {
    Command::new(clang).arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn programs_build_and_load_with_every_supported_clang() {
    if !require_root("programs_build_and_load_with_every_supported_clang") {
        return;
    }
    let lab = Lab::new().expect("private netns with a veth pair");
    let tmp = TempDir::new("clang-compat").expect("scratch dir");
    let inc = write_libbpf_headers(&tmp.0).expect("libbpf headers");
    let srcs = sources().expect("bpf sources");
    // Only the generator's *_hint entry points call bpf_xdp_adjust_meta;
    // the bench leaves them unloaded where it is refused, and so does this.
    let meta = fastpath_bpf::xdp_adjust_meta_allowed().expect("libbpf helper probe");
    if !meta {
        eprintln!("this kernel refuses bpf_xdp_adjust_meta to XDP programs: the *_hint entry points are not loaded");
    }
    assert!(srcs.len() >= 2, "no bpf/**/*.bpf.c found");
    let generic = generic_helper_imms().expect("the generic map helpers' addresses");

    let mut failed = Vec::new();
    let mut skipped = Vec::new();
    let mut jobs = Vec::new();
    for clang in clangs() {
        if !have(&clang) {
            skipped.push(clang);
            continue;
        }
        for src in &srcs {
            let stem = src.file_name().and_then(|n| n.to_str()).unwrap_or("x").trim_end_matches(".bpf.c");
            let out = tmp.0.join(format!("{stem}.{clang}.o"));
            jobs.push(Job { clang: clang.clone(), src: src.clone(), stem: stem.to_owned(), out });
        }
    }
    // Loading stays on this thread: the `_hw` programs bind to the veth of
    // its namespace.
    for (job, compiled) in jobs.iter().zip(compile_all(&jobs, &inc)) {
        let Job { clang, src, stem, out } = job;
        if let Err(e) = compiled {
            failed.push(format!("{clang}: {}: {e:#}", src.display()));
            continue;
        }
        let cfgs: Vec<(&str, Option<fp_config>)> = if stem == "xdp_fwd" {
            configs().into_iter().map(|(n, c)| (n, Some(c))).collect()
        } else {
            vec![("as built", None)]
        };
        for (name, cfg) in cfgs {
            match load(out, lab.a, cfg.as_ref(), meta, &generic) {
                Ok(progs) => eprintln!("{clang}: {stem} ({name}): loaded {}", progs.join(", ")),
                Err(e) => failed.push(format!("{clang}: {} ({name}): {e:#}", src.display())),
            }
        }
    }
    assert!(failed.is_empty(), "{} failures:\n{}", failed.len(), failed.join("\n"));
    if !skipped.is_empty() {
        let msg = format!("compilers not installed (scripts/setup.sh installs them): {}", skipped.join(", "));
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}; CI=true makes a skip a failure");
        eprintln!("skipped: {msg}");
    }
}
