//! What the router namespace runs in each mode: nothing (kernel forwarding),
//! the bpf_fib_lookup reference forwarder, the fastpath daemon as a child
//! process (cache on or off, with or without the generator's hints), or the
//! raw redirect (the limit).

use std::fs::File;
use std::mem::MaybeUninit;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf::{self, fp_reason, fp_stats, reason_name};
use fastpath_bpf::skel::fib_fwd::{FibFwdSkel, FibFwdSkelBuilder};
use fastpath_bpf::skel::raw_fwd::{RawFwdSkel, RawFwdSkelBuilder};
use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{libbpf_sys, Link, MapCore, MapFlags, MapHandle, OpenObject};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use super::topo::{self, Topology};
use crate::maps::read_u64;

/// Declaration order is the order of measurement and of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Linux forwarding, no XDP on the router (r0 accepts XDP frames through GRO).
    Kernel,
    /// bpf_fib_lookup() + devmap redirect (xdp-forward's design): the reference XDP router.
    FibFwd,
    /// `fastpath run --flow-timeout 0`: every packet takes the full lookup.
    FastpathNocache,
    /// `fastpath run -i r0 -i r1` in the router namespace, flow cache on.
    Fastpath,
    /// As `fastpath`, with the generator supplying the flow hash in the XDP metadata.
    FastpathHint,
    /// `fastpath bench stateful` only: Linux forwarding through conntrack and an nft forward ruleset.
    #[value(skip)]
    KernelCt,
    /// `fastpath bench stateful` only: ct_fwd.bpf.c, bpf_xdp_ct_lookup() on every packet.
    #[value(skip)]
    CtRef,
    /// `fastpath bench stateful` only: `fastpath run --mode stateful` behind the same ruleset.
    #[value(skip)]
    FastpathStateful,
    /// MAC rewrite + devmap redirect, no lookups: the ceiling for any XDP router here.
    Raw,
    /// `fastpath run --datapath afxdp`: XDP decides, user space (AF_XDP) rewrites and sends.
    Afxdp,
    /// As `afxdp` without the forward prefetch of frame i+k (`--afxdp-prefetch 0`).
    AfxdpNoprefetch,
    /// AF_XDP transmit alone: user space sends ready frames out of r1, nothing received or looked up: the ceiling for an AF_XDP forwarder here.
    AfxdpTx,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::FibFwd => "fib-fwd",
            Mode::FastpathNocache => "fastpath-nocache",
            Mode::Fastpath => "fastpath",
            Mode::FastpathHint => "fastpath-hint",
            Mode::KernelCt => "kernel-ct",
            Mode::CtRef => "ct-ref",
            Mode::FastpathStateful => "fastpath-stateful",
            Mode::Raw => "raw",
            Mode::Afxdp => "afxdp",
            Mode::AfxdpNoprefetch => "afxdp-noprefetch",
            Mode::AfxdpTx => "afxdp-tx",
        }
    }

    /// The generator marks its metadata as a valid fp_rx_hint.
    pub fn hint(self) -> bool {
        self == Mode::FastpathHint
    }

    /// The daemon forwards with its AF_XDP data path (a thread on another CPU).
    pub fn afxdp(self) -> bool {
        matches!(self, Mode::Afxdp | Mode::AfxdpNoprefetch)
    }

    /// `fastpath run` options that make this mode what it is.
    pub fn daemon_args(self) -> Vec<String> {
        match self {
            Mode::FastpathNocache => vec!["--flow-timeout".into(), "0".into()],
            Mode::Afxdp => vec!["--datapath".into(), "afxdp".into()],
            Mode::AfxdpNoprefetch => ["--datapath", "afxdp", "--afxdp-prefetch", "0"].map(String::from).to_vec(),
            _ => Vec::new(),
        }
    }
}

/// fib_fwd.bpf.c on r0, with r0 and r1 as its TX ports.
pub struct FibFwd<'obj> {
    _skel: FibFwdSkel<'obj>,
    _link: Link,
}

impl<'obj> FibFwd<'obj> {
    pub fn attach(storage: &'obj mut MaybeUninit<OpenObject>, t: &Topology) -> Result<Self> {
        let skel = FibFwdSkelBuilder::default()
            .open(storage)
            .context("opening fib_fwd.bpf.o")?
            .load()
            .context("loading fib_fwd.bpf.o")?;
        let r0 = t.ifindex(&t.router, topo::R0)?;
        let r1 = t.ifindex(&t.router, topo::R1)?;
        for dev in [r0, r1] {
            // The kernel resolves a devmap's ifindex in the writer's namespace.
            topo::in_netns(&t.router, || {
                skel.maps
                    .fib_tx
                    .update(&dev.to_ne_bytes(), &dev.to_ne_bytes(), MapFlags::ANY)
            })?
            .with_context(|| format!("setting fib_tx[{dev}]"))?;
        }
        let link = topo::in_netns(&t.router, || skel.progs.fp_bench_fib_fwd.attach_xdp(r0 as i32))?
            .context("attaching fib_fwd to r0")?;
        Ok(FibFwd {
            _skel: skel,
            _link: link,
        })
    }
}

/// raw_fwd.bpf.c on r0, redirecting to r1 with the sink's MAC.
pub struct RawFwd<'obj> {
    _skel: RawFwdSkel<'obj>,
    _link: Link,
}

impl<'obj> RawFwd<'obj> {
    pub fn attach(storage: &'obj mut MaybeUninit<OpenObject>, t: &Topology) -> Result<Self> {
        let r0 = t.ifindex(&t.router, topo::R0)?;
        let r1 = t.ifindex(&t.router, topo::R1)?;
        Self::attach_in(storage, &t.router, r0, r1, topo::MAC_S0, topo::MAC_R1, t.family)
            .context("attaching raw_fwd to r0")
    }

    /// Every frame of `family` arriving at `ingress` in namespace `ns`
    /// leaves through `egress` with destination MAC `dst` and source `src`.
    pub fn attach_in(
        storage: &'obj mut MaybeUninit<OpenObject>,
        ns: &str,
        ingress: u32,
        egress: u32,
        dst: [u8; 6],
        src: [u8; 6],
        family: topo::Family,
    ) -> Result<Self> {
        let mut open = RawFwdSkelBuilder::default()
            .open(storage)
            .context("opening raw_fwd.bpf.o")?;
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("raw_fwd.bpf.o has no .rodata")?;
        let macs: Vec<u8> = dst.iter().chain(src.iter()).copied().collect();
        for (i, w) in macs.chunks(2).enumerate() {
            ro.raw_macs[i] = u16::from_ne_bytes([w[0], w[1]]);
        }
        let v6 = family == topo::Family::V6;
        open.progs.fp_bench_raw_fwd.set_autoload(!v6);
        open.progs.fp_bench_raw_fwd6.set_autoload(v6);
        let skel = open.load().context("loading raw_fwd.bpf.o")?;
        // The kernel resolves a devmap's ifindex in the writer's namespace.
        topo::in_netns(ns, || {
            skel.maps
                .raw_tx
                .update(&0u32.to_ne_bytes(), &egress.to_ne_bytes(), MapFlags::ANY)
        })?
        .with_context(|| format!("setting raw_tx[0] = ifindex {egress} in {ns}"))?;
        let prog = if v6 { &skel.progs.fp_bench_raw_fwd6 } else { &skel.progs.fp_bench_raw_fwd };
        let link = topo::in_netns(ns, || prog.attach_xdp(ingress as i32))?
            .with_context(|| format!("attaching raw_fwd to ifindex {ingress} in {ns}"))?;
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
    /// `fastpath run` on the router with more options (table capacities, ...).
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

    /// CPU time (user + system) the daemon has used so far, from /proc.
    pub fn cpu_time(&self) -> Option<Duration> {
        process_cpu_time(self.child.id())
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

/// fastpath's counters over a span of the bench, straight from its fp_stats
/// map: verdicts by reason, flow-cache events and where flow hashes came from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verdicts {
    pub forwarded: u64,
    pub punted: u64,
    pub punted_by_reason: Vec<(String, u64)>,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_stale: u64,
    pub cache_expired: u64,
    pub cache_evictions: u64,
    /// Packets sent past the cache, unlooked, while it was thrashing.
    pub cache_bypassed: u64,
    /// Flow hashes by source (only packets that looked up the cache are hashed).
    pub hash_software: u64,
    pub hash_meta: u64,
    pub hash_nic: u64,
}

impl Verdicts {
    /// Adds another run's counts (reasons matched by name).
    pub fn add(&mut self, o: &Verdicts) {
        self.forwarded += o.forwarded;
        self.punted += o.punted;
        add_by_name(&mut self.punted_by_reason, &o.punted_by_reason);
        self.cache_hits += o.cache_hits;
        self.cache_misses += o.cache_misses;
        self.cache_stale += o.cache_stale;
        self.cache_expired += o.cache_expired;
        self.cache_evictions += o.cache_evictions;
        self.cache_bypassed += o.cache_bypassed;
        self.hash_software += o.hash_software;
        self.hash_meta += o.hash_meta;
        self.hash_nic += o.hash_nic;
    }

    /// At most 1% punted: anything beyond stray packets means a figure would
    /// be the kernel's, not fastpath's.
    pub fn mostly_forwarded(&self) -> bool {
        self.forwarded > 0 && self.punted * 100 <= self.forwarded + self.punted
    }

    fn hashed(&self) -> u64 {
        self.hash_software + self.hash_meta + self.hash_nic
    }

    /// Share of hashed packets whose hash came from the metadata hint.
    pub fn meta_share(&self) -> f64 {
        match self.hashed() {
            0 => 0.0,
            n => self.hash_meta as f64 / n as f64,
        }
    }

    /// ", N% past the thrashing cache" when any packet went past it.
    pub fn bypass_note(&self) -> String {
        match self.cache_bypassed {
            0 => String::new(),
            n => format!(
                ", {:.1}% past the thrashing cache",
                n as f64 * 100.0 / (n + self.cache_hits + self.cache_misses) as f64
            ),
        }
    }

    pub fn summary(&self) -> String {
        let reasons: Vec<String> = self.punted_by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let reasons = if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join(", "))
        };
        let lookups = self.cache_hits + self.cache_misses;
        let cache = if lookups == 0 {
            "cache not used".to_string()
        } else {
            format!(
                "cache hits {:.1}% (evictions {}, stale {}, expired {}){}",
                self.cache_hits as f64 * 100.0 / lookups as f64,
                self.cache_evictions,
                self.cache_stale,
                self.cache_expired,
                self.bypass_note()
            )
        };
        let hash = if self.hashed() == 0 {
            "no flow hash".to_string()
        } else {
            format!(
                "hash from meta {} / software {} / nic {}",
                self.hash_meta, self.hash_software, self.hash_nic
            )
        };
        format!(
            "forwarded {}, punted {}{reasons}; {cache}; {hash}",
            self.forwarded, self.punted
        )
    }
}

/// One reading of fp_stats, summed over ingress slots and CPUs.
#[derive(Clone, Debug, Default)]
pub struct FpSnapshot {
    packets: Vec<u64>,
    flow: Vec<u64>,
    hash_src: Vec<u64>,
}

/// Finds the fp_stats map of the program fastpath attached to r0. Reading
/// the map (instead of parsing `fastpath status`) gives exact per-run deltas
/// and does not depend on the CLI's output format.
pub struct FpStats {
    map: MapHandle,
}

/// CPU time (user + system) process `pid` has used so far, from /proc.
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| Duration::from_secs_f64(ticks as f64 / hz as f64))
}

impl FpStats {
    pub fn find(t: &Topology) -> Result<Self> {
        let map = fastpath_map(t, "fp_stats")?;
        if (map.value_size() as usize) < std::mem::size_of::<fp_stats>() {
            bail!("fp_stats of the XDP program on r0 is older than this bench's fastpath.h");
        }
        Ok(FpStats { map })
    }

    pub fn read(&self) -> Result<FpSnapshot> {
        let layout = fp_stats::default();
        let (n_pkt, n_flow, n_hs) = (layout.packets.len(), layout.flow.len(), layout.hash_src.len());
        let flow_off = std::mem::offset_of!(fp_stats, flow);
        let hs_off = std::mem::offset_of!(fp_stats, hash_src);
        let mut s = FpSnapshot {
            packets: vec![0; n_pkt],
            flow: vec![0; n_flow],
            hash_src: vec![0; n_hs],
        };
        for slot in 0..self.map.max_entries() {
            let Some(vals) = self
                .map
                .lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY)
                .context("reading fp_stats")?
            else {
                continue;
            };
            for v in vals {
                for (i, c) in s.packets.iter_mut().enumerate() {
                    *c += read_u64(&v, i * 8);
                }
                for (i, c) in s.flow.iter_mut().enumerate() {
                    *c += read_u64(&v, flow_off + i * 8);
                }
                for (i, c) in s.hash_src.iter_mut().enumerate() {
                    *c += read_u64(&v, hs_off + i * 8);
                }
            }
        }
        Ok(s)
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

pub fn verdicts(before: &FpSnapshot, after: &FpSnapshot) -> Verdicts {
    let d = |a: &[u64], b: &[u64], i: usize| -> u64 {
        a.get(i).copied().unwrap_or(0).saturating_sub(b.get(i).copied().unwrap_or(0))
    };
    let mut v = Verdicts::default();
    for r in 0..after.packets.len() {
        let n = d(&after.packets, &before.packets, r);
        if r == fp_reason::FP_R_FORWARDED as usize {
            v.forwarded += n;
        } else if n > 0 {
            v.punted += n;
            v.punted_by_reason.push((reason_name(r).to_string(), n));
        }
    }
    v.punted_by_reason.sort_by_key(|r| std::cmp::Reverse(r.1));
    let flow = |e: u32| d(&after.flow, &before.flow, e as usize);
    v.cache_hits = flow(intf::fp_flow_event::FP_FC_HIT);
    v.cache_misses = flow(intf::fp_flow_event::FP_FC_MISS);
    v.cache_stale = flow(intf::fp_flow_event::FP_FC_STALE);
    v.cache_expired = flow(intf::fp_flow_event::FP_FC_EXPIRED);
    v.cache_evictions = flow(intf::fp_flow_event::FP_FC_EVICT);
    v.cache_bypassed = flow(intf::fp_flow_event::FP_FC_BYPASS);
    let hs = |e: u32| d(&after.hash_src, &before.hash_src, e as usize);
    v.hash_software = hs(intf::fp_hash_src::FP_HS_SOFTWARE);
    v.hash_meta = hs(intf::fp_hash_src::FP_HS_META);
    v.hash_nic = hs(intf::fp_hash_src::FP_HS_NIC);
    v
}

/// Adds `more` to `sum`, a list of (name, count) pairs, by name.
pub fn add_by_name(sum: &mut Vec<(String, u64)>, more: &[(String, u64)]) {
    for (name, n) in more {
        match sum.iter_mut().find(|(s, _)| s == name) {
            Some((_, c)) => *c += n,
            None => sum.push((name.clone(), *n)),
        }
    }
}
