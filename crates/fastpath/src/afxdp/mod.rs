//! AF_XDP user-space data path (`fastpath run --datapath afxdp`).
//!
//! The XDP program still makes every decision that can end in a punt
//! (only it can hand a frame to the kernel unmodified); for a packet it
//! would forward it redirects the untouched frame into fp_xsks with the
//! rewrite data pushed in front of it (the descriptor's first bytes,
//! struct fp_xsk_meta). Here, one thread per RX queue owns
//! one UMEM and one socket per managed interface on that queue (all
//! sharing the UMEM), so a frame goes from the ingress socket's RX ring
//! to the egress socket's TX ring by address, without a copy: parse,
//! check, rewrite in Rust (fwd.rs), batched ring work, optional prefetch
//! of frame i+k while frame i is rewritten, optional busy polling.
//!
//! For the execution-point bench: `run_forwarder` (this data path) and
//! `drop_loop` (receive and recycle, nothing else); for the forward bench's
//! ceiling: `txonly` (transmit, nothing else).

mod fwd;
mod ring;
mod socket;
pub mod txonly;
mod umem;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use fastpath_bpf::intf;

pub use socket::BindMode;
use socket::{RingSizes, Xsk};
use umem::Umem;

/// Tuning of the user-space data path.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Descriptors taken from an RX ring per round.
    pub batch: u32,
    /// Prefetch frame i+k while processing frame i (0 = off).
    pub prefetch: u32,
    /// Busy polling (SO_PREFER_BUSY_POLL): spin on the rings, never sleep in poll().
    pub busy_poll: bool,
    /// Entries per ring (a power of two).
    pub ring_size: u32,
    /// Try zero-copy first (falls back to copy mode where the driver lacks it).
    pub zero_copy: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { batch: 64, prefetch: 4, busy_poll: false, ring_size: 2048, zero_copy: true }
    }
}

/// A managed interface as the forwarder sees it.
#[derive(Debug, Clone)]
pub struct Port {
    pub slot: u32,
    pub ifindex: u32,
    pub name: String,
}

/// Live counters, summed over threads by `Forwarder::stats`.
#[derive(Debug, Default)]
pub struct Counters {
    rx: AtomicU64,
    tx: AtomicU64,
    tx_bytes: AtomicU64,
    drop_meta: AtomicU64,
    drop_parse: AtomicU64,
    drop_ttl: AtomicU64,
    drop_tx_full: AtomicU64,
}

/// What `fastpath status` shows for the AF_XDP data path.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    pub queues: u32,
    pub sockets: u32,
    pub mode: String,
    pub batch: u32,
    pub prefetch: u32,
    pub busy_poll: bool,
    /// Frames user space received from the XDP program.
    pub rx: u64,
    /// Frames it transmitted (rewritten), and their bytes.
    pub forwarded: u64,
    pub forwarded_bytes: u64,
    /// Frames it dropped, by why (all should stay 0).
    pub drop_meta: u64,
    pub drop_parse: u64,
    pub drop_ttl: u64,
    pub drop_tx_full: u64,
}

/// Handle to the running forwarder: stops and joins its threads on drop
/// (the sockets close with them, which empties their XSKMAP entries, so
/// the program punts from then on).
pub struct Forwarder {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
    info: Stats,
}

impl Forwarder {
    #[allow(dead_code)] // API for `fastpath bench`
    pub fn stats(&self) -> Stats {
        read_stats(&self.counters, &self.info)
    }

    /// The counters, for a snapshot the API thread reads.
    pub fn stats_source(&self) -> StatsSource {
        StatsSource { counters: Arc::clone(&self.counters), info: self.info.clone() }
    }
}

/// A cheap clone of the forwarder's counters for other threads.
#[derive(Debug, Clone)]
pub struct StatsSource {
    counters: Arc<Counters>,
    info: Stats,
}

impl StatsSource {
    pub fn stats(&self) -> Stats {
        read_stats(&self.counters, &self.info)
    }
}

fn read_stats(c: &Counters, info: &Stats) -> Stats {
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Stats {
        rx: r(&c.rx),
        forwarded: r(&c.tx),
        forwarded_bytes: r(&c.tx_bytes),
        drop_meta: r(&c.drop_meta),
        drop_parse: r(&c.drop_parse),
        drop_ttl: r(&c.drop_ttl),
        drop_tx_full: r(&c.drop_tx_full),
        ..info.clone()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("an AF_XDP forwarder thread panicked");
            }
        }
    }
}

/// RX queues of a device, from sysfs (1 if it cannot tell).
pub fn rx_queues(name: &str) -> u32 {
    let dir = std::path::Path::new("/sys/class/net").join(name).join("queues");
    let n = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with("rx-")).count())
        .unwrap_or(1);
    (n as u32).max(1)
}

/// The key of (slot, queue) in fp_xsks.
pub fn xsk_key(slot: u32, queue: u32) -> u32 {
    slot * intf::FP_XSK_MAX_QUEUES + queue
}

/// One queue's sockets and UMEM. Sockets drop before the UMEM (field order).
struct Queue {
    socks: Vec<Xsk>,
    /// fp_ifaces slot -> index into socks.
    by_slot: Vec<Option<u16>>,
    umem: Umem,
}

// SAFETY: the rings' raw pointers refer to mappings owned by this value,
// which moves into exactly one thread and is used only there.
unsafe impl Send for Queue {}

fn open_queue(cfg: &Config, ports: &[(u32, u32)], queue: u32) -> Result<Queue> {
    let sizes = RingSizes { rx: cfg.ring_size, tx: cfg.ring_size, fill: cfg.ring_size, comp: cfg.ring_size };
    // Enough for every fill ring full plus every TX ring full.
    let frames = ports.len() as u32 * cfg.ring_size * 2;
    let mut umem = Umem::new(frames).context("allocating the UMEM")?;
    let mut socks: Vec<Xsk> = Vec::new();
    let mut by_slot = vec![None; intf::FP_MAX_IFACES as usize];
    for &(slot, ifindex) in ports {
        let x = match socks.first() {
            Some(owner) => Xsk::open(&umem, Some(owner), ifindex, queue, sizes, false)?,
            None if cfg.zero_copy => match Xsk::open(&umem, None, ifindex, queue, sizes, true) {
                Ok(x) => x,
                Err(e) => {
                    log::debug!("AF_XDP zero-copy refused ({e:#}); using copy mode");
                    Xsk::open(&umem, None, ifindex, queue, sizes, false)?
                }
            },
            None => Xsk::open(&umem, None, ifindex, queue, sizes, false)?,
        };
        if cfg.busy_poll {
            x.busy_poll(cfg.batch)?;
        }
        by_slot[slot as usize] = Some(socks.len() as u16);
        socks.push(x);
    }
    // Half of the frames wait in the fill rings; the rest cover TX.
    for s in &mut socks {
        let n = s.fill.free(cfg.ring_size).min(cfg.ring_size / 2);
        for _ in 0..n {
            match umem.alloc() {
                Some(a) => s.fill.push(a),
                None => break,
            }
        }
        s.fill.submit();
    }
    Ok(Queue { socks, by_slot, umem })
}

/// Starts the forwarder: one thread per RX queue (up to FP_XSK_MAX_QUEUES),
/// each with a socket per port on that queue, registered in `xskmap`.
pub fn run_forwarder(cfg: &Config, ports: &[Port], xskmap: &libbpf_rs::MapHandle) -> Result<Forwarder> {
    let queues = ports.iter().map(|p| rx_queues(&p.name)).max().unwrap_or(1).min(intf::FP_XSK_MAX_QUEUES);
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let mut threads = Vec::new();
    let mut fwd = Forwarder {
        stop: Arc::clone(&stop),
        threads: Vec::new(),
        counters: Arc::clone(&counters),
        info: Stats { queues, batch: cfg.batch, prefetch: cfg.prefetch, busy_poll: cfg.busy_poll, ..Default::default() },
    };
    for q in 0..queues {
        let on_q: Vec<(u32, u32)> = ports.iter().filter(|p| rx_queues(&p.name) > q).map(|p| (p.slot, p.ifindex)).collect();
        let queue = open_queue(cfg, &on_q, q).with_context(|| format!("AF_XDP sockets of queue {q}"))?;
        for (s, &(slot, _)) in queue.socks.iter().zip(&on_q) {
            socket::register(xskmap, xsk_key(slot, q), s)?;
        }
        fwd.info.sockets += queue.socks.len() as u32;
        if let Some(s) = queue.socks.first() {
            fwd.info.mode = match s.mode {
                BindMode::ZeroCopy => "zero-copy",
                BindMode::Copy => "copy",
            }
            .into();
        }
        let (cfg, stop, counters) = (*cfg, Arc::clone(&stop), Arc::clone(&counters));
        let t = std::thread::Builder::new()
            .name(format!("fp-afxdp-q{q}"))
            .spawn(move || forward_loop(queue, cfg, &stop, &counters))
            .context("starting an AF_XDP thread")?;
        threads.push(t);
    }
    fwd.threads = threads;
    log::info!(
        "AF_XDP data path: {} sockets on {queues} queue(s), {} mode, batch {}, prefetch {}, busy poll {}",
        fwd.info.sockets,
        fwd.info.mode,
        cfg.batch,
        cfg.prefetch,
        if cfg.busy_poll { "on" } else { "off" }
    );
    Ok(fwd)
}

/// Sleep in poll() on every RX ring, or spin with busy polling.
fn wait(q: &Queue, cfg: &Config, idle_ms: i32) {
    if cfg.busy_poll {
        for s in &q.socks {
            s.kick_rx();
        }
        return;
    }
    let mut fds: Vec<libc::pollfd> = q
        .socks
        .iter()
        .map(|s| libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&s.fd()), events: libc::POLLIN, revents: 0 })
        .collect();
    // SAFETY: fds is a live array of the length passed.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, idle_ms) };
}

/// Completed TX frames back to the free list, free frames into the fill rings.
fn recycle(q: &mut Queue, cfg: &Config) {
    for s in &mut q.socks {
        let n = s.comp.available(cfg.ring_size);
        for i in 0..n {
            q.umem.free(s.comp.get(i));
        }
        if n > 0 {
            s.comp.release(n);
        }
    }
    for s in &mut q.socks {
        let want = s.fill.free(cfg.batch).min(q.umem.free_count() as u32);
        if want == 0 {
            continue;
        }
        for _ in 0..want {
            if let Some(a) = q.umem.alloc() {
                s.fill.push(a);
            }
        }
        s.fill.submit();
        if s.fill.needs_wakeup() {
            s.kick_rx();
        }
    }
}

fn forward_loop(mut q: Queue, cfg: Config, stop: &AtomicBool, c: &Counters) {
    let batch = cfg.batch.max(1);
    let k = cfg.prefetch;
    let mut pending_tx = vec![false; q.socks.len()];
    while !stop.load(Ordering::Relaxed) {
        let mut got = 0u32;
        let (mut tx, mut bytes, mut d_meta, mut d_parse, mut d_ttl, mut d_full) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        for si in 0..q.socks.len() {
            let n = q.socks[si].rx.available(batch);
            if n == 0 {
                continue;
            }
            got += n;
            if k > 0 {
                for i in 0..k.min(n) {
                    q.umem.prefetch(q.socks[si].rx.get(i).addr);
                }
            }
            for i in 0..n {
                if k > 0 && i + k < n {
                    let ahead = q.socks[si].rx.get(i + k).addr;
                    q.umem.prefetch(ahead);
                }
                let d = q.socks[si].rx.get(i);
                // The descriptor holds fp_xsk_meta, then the frame (xsk.h).
                let verdict = match q.umem.frame_mut(d.addr, d.len as usize) {
                    Some(buf) => fwd::forward(buf),
                    None => Err(fwd::Drop::Parse),
                };
                let out = match verdict {
                    Ok(t) => q.by_slot.get(t.slot as usize).copied().flatten().map(|o| (o as usize, t.len)),
                    Err(fwd::Drop::Meta) => {
                        d_meta += 1;
                        None
                    }
                    Err(fwd::Drop::Parse) => {
                        d_parse += 1;
                        None
                    }
                    Err(fwd::Drop::Ttl) => {
                        d_ttl += 1;
                        None
                    }
                };
                match out {
                    Some((o, len)) if q.socks[o].tx.free(1) > 0 => {
                        q.socks[o].tx.push(libc::xdp_desc { addr: d.addr + fwd::META_LEN as u64, len, options: 0 });
                        pending_tx[o] = true;
                        tx += 1;
                        bytes += u64::from(len);
                    }
                    Some(_) => {
                        d_full += 1;
                        q.umem.free(d.addr);
                    }
                    None => q.umem.free(d.addr),
                }
            }
            q.socks[si].rx.release(n);
        }
        for (o, p) in pending_tx.iter_mut().enumerate() {
            let s = &mut q.socks[o];
            if *p {
                s.tx.submit();
                *p = false;
            }
            // Copy mode transmits inside sendto(); zero-copy only when asked.
            if s.tx.needs_wakeup() && s.tx.outstanding() > 0 {
                s.kick_tx();
            }
        }
        recycle(&mut q, &cfg);
        if got > 0 {
            c.rx.fetch_add(u64::from(got), Ordering::Relaxed);
            c.tx.fetch_add(tx, Ordering::Relaxed);
            c.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
            for (ctr, v) in [(&c.drop_meta, d_meta), (&c.drop_parse, d_parse), (&c.drop_ttl, d_ttl), (&c.drop_tx_full, d_full)] {
                if v > 0 {
                    ctr.fetch_add(v, Ordering::Relaxed);
                }
            }
        } else {
            // Frames in flight (TX not yet completed): look again soon.
            let busy = q.socks.iter_mut().any(|s| s.tx.outstanding() > 0);
            wait(&q, &cfg, if busy { 1 } else { 100 });
        }
    }
}

/// What `drop_loop` saw.
#[allow(dead_code)] // API for `fastpath bench points`
#[derive(Debug, Clone, Copy, Default)]
pub struct DropStats {
    pub packets: u64,
    pub bytes: u64,
    pub mode: Option<BindMode>,
}

#[allow(dead_code)] // API for `fastpath bench points`
/// The AF_XDP drop workload of the execution-point bench: one socket on
/// (`ifindex`, `queue`) registered in `xskmap` at `key` (the caller's XDP
/// program redirects there), every frame received is counted and its
/// chunk goes straight back to the fill ring, until `stop` is set.
pub fn drop_loop(cfg: &Config, ifindex: u32, queue: u32, xskmap: &libbpf_rs::MapHandle, key: u32, stop: &AtomicBool) -> Result<DropStats> {
    let mut umem = Umem::new(cfg.ring_size * 2).context("allocating the UMEM")?;
    let sizes = RingSizes { rx: cfg.ring_size, tx: 64, fill: cfg.ring_size, comp: 64 };
    let mut x = match Xsk::open(&umem, None, ifindex, queue, sizes, cfg.zero_copy) {
        Ok(x) => x,
        Err(_) if cfg.zero_copy => Xsk::open(&umem, None, ifindex, queue, sizes, false)?,
        Err(e) => return Err(e),
    };
    if cfg.busy_poll {
        x.busy_poll(cfg.batch)?;
    }
    socket::register(xskmap, key, &x)?;
    for _ in 0..x.fill.free(cfg.ring_size) {
        if let Some(a) = umem.alloc() {
            x.fill.push(a);
        }
    }
    x.fill.submit();
    let mut st = DropStats { mode: Some(x.mode), ..Default::default() };
    let batch = cfg.batch.max(1);
    while !stop.load(Ordering::Relaxed) {
        let n = x.rx.available(batch);
        if n == 0 {
            if cfg.busy_poll {
                x.kick_rx();
            } else {
                let mut p = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&x.fd()), events: libc::POLLIN, revents: 0 };
                // SAFETY: one live pollfd.
                unsafe { libc::poll(&mut p, 1, 100) };
            }
            continue;
        }
        let free = x.fill.free(n);
        for i in 0..n {
            let d = x.rx.get(i);
            st.bytes += u64::from(d.len);
            if i < free {
                x.fill.push(d.addr & !(u64::from(umem::FRAME_SIZE) - 1));
            } else {
                umem.free(d.addr);
            }
        }
        st.packets += u64::from(n);
        x.rx.release(n);
        x.fill.submit();
        if x.fill.needs_wakeup() {
            x.kick_rx();
        }
    }
    Ok(st)
}

/// `fastpath run --datapath afxdp`: the forwarder on every managed
/// interface, its sockets in the program's fp_xsks.
pub fn start(args: &crate::RunArgs, ifaces: &[crate::preflight::Iface], first: &crate::loader::Instance) -> Result<Forwarder> {
    let cfg = Config { batch: args.afxdp_batch.max(1), prefetch: args.afxdp_prefetch, busy_poll: args.busy_poll, ..Config::default() };
    let ports: Vec<Port> = ifaces.iter().map(|i| Port { slot: i.slot, ifindex: i.ifindex, name: i.name.clone() }).collect();
    let map = libbpf_rs::MapHandle::try_from(&first.skel.maps.fp_xsks).context("opening fp_xsks")?;
    run_forwarder(&cfg, &ports, &map).context("starting the AF_XDP data path")
}
