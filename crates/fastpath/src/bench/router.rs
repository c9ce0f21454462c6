//! What the router namespace runs in each mode: nothing (kernel forwarding),
//! the fastpath daemon as a child process, or the raw redirect (the limit).

use std::fs::File;
use std::mem::MaybeUninit;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf::{fp_reason, reason_name};
use fastpath_bpf::skel::raw_fwd::{RawFwdSkel, RawFwdSkelBuilder};
use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{libbpf_sys, Link, MapCore, MapFlags, MapHandle, OpenObject};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use super::topo::{self, Topology};
use crate::maps::read_u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Linux forwarding, no XDP on the router (r0 accepts XDP frames through GRO).
    Kernel,
    /// `fastpath run -i r0 -i r1` in the router namespace.
    Fastpath,
    /// MAC rewrite + devmap redirect, no lookups: the ceiling for any XDP router here.
    Raw,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Fastpath => "fastpath",
            Mode::Raw => "raw",
        }
    }
}

/// raw_fwd.bpf.c on r0, redirecting to r1 with the sink's MAC.
pub struct RawFwd<'obj> {
    _skel: RawFwdSkel<'obj>,
    _link: Link,
}

impl<'obj> RawFwd<'obj> {
    pub fn attach(storage: &'obj mut MaybeUninit<OpenObject>, t: &Topology) -> Result<Self> {
        let mut open = RawFwdSkelBuilder::default()
            .open(storage)
            .context("opening raw_fwd.bpf.o")?;
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("raw_fwd.bpf.o has no .rodata")?;
        let macs: Vec<u8> = topo::MAC_S0.iter().chain(topo::MAC_R1.iter()).copied().collect();
        for (i, w) in macs.chunks(2).enumerate() {
            ro.raw_macs[i] = u16::from_ne_bytes([w[0], w[1]]);
        }
        let skel = open.load().context("loading raw_fwd.bpf.o")?;
        let r0 = t.ifindex(&t.router, topo::R0)?;
        let r1 = t.ifindex(&t.router, topo::R1)?;
        // The kernel resolves a devmap's ifindex in the writer's namespace.
        topo::in_netns(&t.router, || {
            skel.maps
                .raw_tx
                .update(&0u32.to_ne_bytes(), &r1.to_ne_bytes(), MapFlags::ANY)
        })?
        .context("setting raw_tx[0] = r1")?;
        let link = topo::in_netns(&t.router, || skel.progs.fp_bench_raw_fwd.attach_xdp(r0 as i32))?
            .context("attaching raw_fwd to r0")?;
        Ok(RawFwd {
            _skel: skel,
            _link: link,
        })
    }
}

/// `fastpath run` as a child in the router namespace; SIGTERM on drop.
pub struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    exe: PathBuf,
}

impl Daemon {
    pub fn spawn(t: &Topology, exe: &Path, dir: &Path) -> Result<Self> {
        Self::spawn_with(t, exe, dir, &[])
    }

    /// `spawn` with more `fastpath run` options (table capacities, ...).
    pub fn spawn_with(t: &Topology, exe: &Path, dir: &Path, extra: &[String]) -> Result<Self> {
        let socket = dir.join("fastpath.sock");
        let log = dir.join("fastpath.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating the log fd")?;
        // `ip netns exec` also mounts the namespace's own /sys, which the
        // daemon reads; it execs the daemon, so the child pid is the daemon's.
        let child = Command::new("ip")
            .args(["netns", "exec", &t.router])
            .arg(exe)
            .args(["run", "-i", topo::R0, "-i", topo::R1, "--socket"])
            .arg(&socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Own process group: a ^C at the terminal reaches only the bench,
            // which then stops the daemon itself, in order.
            .process_group(0)
            .spawn()
            .context("spawning fastpath run")?;
        Ok(Daemon {
            child,
            socket,
            log,
            exe: exe.to_path_buf(),
        })
    }

    /// Waits until `fastpath status` gets an answer over the socket.
    pub fn wait_ready(&mut self, timeout: Duration, stop: &AtomicBool) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().context("polling the daemon")? {
                bail!(
                    "fastpath run exited ({st}) before answering; its log:\n{}",
                    self.log_tail()
                );
            }
            let ok = Command::new(&self.exe)
                .args(["status", "--socket"])
                .arg(&self.socket)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return Ok(());
            }
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            if start.elapsed() > timeout {
                bail!(
                    "fastpath status got no answer within {timeout:?}; daemon log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `fastpath status` as the daemon sees it, for the report.
    pub fn status_text(&self) -> String {
        match Command::new(&self.exe)
            .args(["status", "--socket"])
            .arg(&self.socket)
            .output()
        {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("(fastpath status failed: {e})"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn stop(&mut self) -> Result<()> {
        if self.child.try_wait().context("polling the daemon")?.is_some() {
            return Ok(());
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        kill(pid, Signal::SIGTERM).context("sending SIGTERM to fastpath run")?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if self.child.try_wait().context("polling the daemon")?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        log::warn!("fastpath run ignored SIGTERM for 5 s, killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
        bail!("fastpath run did not stop on SIGTERM");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::warn!("stopping fastpath run: {e:#}");
        }
    }
}

/// fastpath's per-reason packet counters, straight from its fp_stats map.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verdicts {
    pub forwarded: u64,
    pub punted: u64,
    pub punted_by_reason: Vec<(String, u64)>,
}

impl Verdicts {
    /// At most 1% punted: anything beyond stray packets means a figure would
    /// be the kernel's, not fastpath's.
    pub fn mostly_forwarded(&self) -> bool {
        self.forwarded > 0 && self.punted * 100 <= self.forwarded + self.punted
    }

    pub fn summary(&self) -> String {
        let reasons: Vec<String> = self.punted_by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let reasons = if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        };
        format!("forwarded {}, punted {}{reasons}", self.forwarded, self.punted)
    }
}

/// Finds the fp_stats map of the program fastpath attached to r0. Reading
/// the map (instead of parsing `fastpath status`) gives exact per-run deltas
/// and does not depend on the CLI's output format.
pub struct FpStats {
    map: MapHandle,
}

impl FpStats {
    pub fn find(t: &Topology) -> Result<Self> {
        Ok(FpStats { map: fastpath_map(t, "fp_stats")? })
    }

    /// Packets per reason, summed over ingress slots and CPUs.
    pub fn read(&self) -> Result<Vec<u64>> {
        let n = fp_reason::FP_R__COUNT as usize;
        let mut per_reason = vec![0u64; n];
        for slot in 0..self.map.max_entries() {
            let Some(vals) = self
                .map
                .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)
                .context("reading fp_stats")?
            else {
                continue;
            };
            for v in vals {
                for (r, c) in per_reason.iter_mut().enumerate() {
                    *c += read_u64(&v, r * 8);
                }
            }
        }
        Ok(per_reason)
    }
}

/// The map called `name` of the XDP program fastpath attached to r0.
pub fn fastpath_map(t: &Topology, name: &str) -> Result<MapHandle> {
    fastpath_maps(t)?
        .into_iter()
        .find(|m| m.name() == name)
        .with_context(|| format!("the XDP program on r0 has no {name} map"))
}

/// Every map of the XDP program fastpath attached to r0.
pub fn fastpath_maps(t: &Topology) -> Result<Vec<MapHandle>> {
    let r0 = t.ifindex(&t.router, topo::R0)?;
    let mut prog_id = 0u32;
    // SAFETY: plain netlink query writing one u32 we own.
    let rc = topo::in_netns(&t.router, || unsafe {
        libbpf_sys::bpf_xdp_query_id(r0 as i32, 0, &mut prog_id)
    })?;
    if rc < 0 {
        bail!("querying XDP on r0: {}", std::io::Error::from_raw_os_error(-rc));
    }
    if prog_id == 0 {
        bail!("fastpath has no XDP program on r0");
    }
    let opts = ProgInfoQueryOptions::default().include_map_ids(true);
    let info = ProgInfoIter::with_query_opts(opts)
        .find(|p| p.id == prog_id)
        .with_context(|| format!("XDP program {prog_id} on r0 vanished"))?;
    Ok(info.map_ids.into_iter().filter_map(|id| MapHandle::from_map_id(id).ok()).collect())
}

pub fn verdicts(before: &[u64], after: &[u64]) -> Verdicts {
    let mut v = Verdicts::default();
    for (r, (a, b)) in after.iter().zip(before).enumerate() {
        let d = a.saturating_sub(*b);
        if r == fp_reason::FP_R_FORWARDED as usize {
            v.forwarded += d;
        } else if d > 0 {
            v.punted += d;
            v.punted_by_reason.push((reason_name(r).to_string(), d));
        }
    }
    v.punted_by_reason.sort_by_key(|r| std::cmp::Reverse(r.1));
    v
}
