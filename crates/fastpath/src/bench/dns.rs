//! `fastpath bench dns` (issue #6, workloads c and d): DNS responders at the
//! execution points available here — XDP in the driver (native, veth),
//! XDP in generic (skb) mode, and a user-space UDP socket server as the
//! baseline — answering every query NXDOMAIN (c) or from a record set, small
//! (~20 KiB) or large (~26 MiB) (d).
//!
//! Throughput: bpf/bench/dns_gen.bpf.c sends queries from the generator
//! namespace as fast as one CPU can (from a spring of frames, as the
//! execution-point bench does: gen.bpf.c), the responder on the router namespace's r0 answers, and the sink
//! program on g0 counts the answers coming back. Answers per second of wall
//! time, and per CPU-second (the generator thread, in whose softirq the XDP
//! responder runs, plus the socket server's threads).
//!
//! Response time against offered rate: a Rust UDP client in the generator
//! namespace sends queries at fixed rates and timestamps each answer in user
//! space (CLOCK_MONOTONIC around the client's own socket calls; no hardware
//! timestamps here), so the figure includes the client's kernel UDP path
//! and wake-ups, the same for every point.
//!
//! `run_dns_nxdomain` and `run_dns_map` are the entry points for `fastpath
//! bench points`; `fastpath bench dns-serve` runs one responder until
//! SIGTERM (tests/test_dns.py).

use std::io::Write;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf::{FP_DNS_C_ANSWER, FP_DNS_C_NXDOMAIN, FP_DNS_C__COUNT};
use fastpath_bpf::skel::dns_gen::{DnsGenSkel, DnsGenSkelBuilder};
use fastpath_bpf::skel::dns_map::{DnsMapSkel, DnsMapSkelBuilder};
use fastpath_bpf::skel::dns_nxdomain::{DnsNxdomainSkel, DnsNxdomainSkelBuilder};
use fastpath_bpf::skel::sink::{SinkSkel, SinkSkelBuilder};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};
use serde::Serialize;

use super::dns_records::{self, RecordSet, Zone};
use super::dns_wire::{self, Responder};
use super::topo::{self, Topology};
use super::traffic::{self, Placement};
use crate::maps::read_u64;

/// The server's address in the bench lab (r0).
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const GEN_SPORT: u16 = 33333;
/// The target: the XDP responder at least this many times the socket server.
pub const TARGET_XDP_TO_SOCKET: f64 = 5.0;
/// Outcome counter names in FP_DNS_C_* order (fastpath.h).
const COUNTER_NAMES: [&str; FP_DNS_C__COUNT as usize] =
    ["answer", "nodata", "nxdomain", "formerr", "notimp", "refused", "drop", "pass", "punt"];

/// Where the responder runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DnsPoint {
    /// XDP in the driver (native XDP on veth here).
    Xdp,
    /// XDP in generic (skb) mode.
    XdpGeneric,
    /// User-space UDP socket server (std UdpSocket, one socket per thread, SO_REUSEPORT).
    Socket,
}

impl DnsPoint {
    pub fn name(self) -> &'static str {
        match self {
            DnsPoint::Xdp => "xdp",
            DnsPoint::XdpGeneric => "xdp-generic",
            DnsPoint::Socket => "socket",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Every query answered NXDOMAIN (the paper's "DNS ping").
    Nxdomain,
    /// Answers from the small record set (~20 KiB).
    Small,
    /// Answers from the large record set (~26 MiB).
    Large,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Nxdomain => "nxdomain",
            Workload::Small => "map-small",
            Workload::Large => "map-large",
        }
    }

    fn set(self) -> Option<RecordSet> {
        match self {
            Workload::Nxdomain => None,
            Workload::Small => Some(RecordSet::Small),
            Workload::Large => Some(RecordSet::Large),
        }
    }

    /// Distinct queries the generator cycles over: A and AAAA of every name.
    fn queries(self) -> u32 {
        2 * self.set().unwrap_or(RecordSet::Small).names()
    }

    /// The outcome counter every generated query should land in.
    fn expected(self) -> u32 {
        match self {
            Workload::Nxdomain => FP_DNS_C_NXDOMAIN,
            _ => FP_DNS_C_ANSWER,
        }
    }
}

#[derive(Clone, Debug)]
pub struct DnsOpts {
    pub reps: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// The generator's CPU (and with it the XDP responder's softirq work).
    pub place: Placement,
    /// Where the socket server's threads run.
    pub server_cpu: usize,
    pub server_threads: usize,
    /// Offered rates (queries/s) for the response-time runs; empty: none.
    pub rates: Vec<u32>,
    pub rate_duration: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputRep {
    pub answers_per_s: f64,
    pub offered_per_s: f64,
    pub answers_per_cpu_s: f64,
    pub cpu_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LatencyPoint {
    pub rate: u32,
    /// What the client actually managed (sent / time spent sending).
    pub achieved_rate: f64,
    pub sent: u64,
    pub answered: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DnsResult {
    pub point: DnsPoint,
    pub workload: Workload,
    pub reps: Vec<ThroughputRep>,
    pub median_answers_per_s: f64,
    pub median_answers_per_cpu_s: f64,
    /// The XDP responder's outcome counters over the throughput runs, or
    /// the socket server's answers (as "answer") for the socket point.
    pub outcomes: Vec<(String, u64)>,
    pub latency: Vec<LatencyPoint>,
}

/// Workload (c) or (d) at one point.
pub fn run_dns(point: DnsPoint, w: Workload, opts: &DnsOpts, stop: &AtomicBool) -> Result<DnsResult> {
    match w.set() {
        None => run_dns_nxdomain(point, opts, stop),
        Some(set) => run_dns_map(point, set, opts, stop),
    }
}

/// Workload (c) at one point.
pub fn run_dns_nxdomain(point: DnsPoint, opts: &DnsOpts, stop: &AtomicBool) -> Result<DnsResult> {
    run_workload(point, Workload::Nxdomain, opts, stop)
}

/// Workload (d) at one point, with the small or the large record set.
pub fn run_dns_map(point: DnsPoint, set: RecordSet, opts: &DnsOpts, stop: &AtomicBool) -> Result<DnsResult> {
    let w = match set {
        RecordSet::Small => Workload::Small,
        RecordSet::Large => Workload::Large,
    };
    run_workload(point, w, opts, stop)
}

// ---------------------------------------------------------------- responders

enum XdpSkel<'o> {
    Nx(DnsNxdomainSkel<'o>),
    Map(DnsMapSkel<'o>),
}

/// One XDP responder, loaded (map filled) and attached; detached on drop.
pub struct XdpResponder<'o> {
    _link: OwnedFd,
    skel: XdpSkel<'o>,
}

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: bindgen plain-old-data structs, viewed as their bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

impl<'o> XdpResponder<'o> {
    /// Loads the responder for `w` and attaches it to `ifindex` in the
    /// calling thread's network namespace.
    pub fn start(obj: &'o mut MaybeUninit<OpenObject>, w: Workload, ifindex: u32, generic: bool) -> Result<Self> {
        let skel = match w.set() {
            None => XdpSkel::Nx(
                DnsNxdomainSkelBuilder::default()
                    .open(obj)
                    .context("opening dns_nxdomain.bpf.o")?
                    .load()
                    .context("loading dns_nxdomain.bpf.o")?,
            ),
            Some(set) => {
                let mut open = DnsMapSkelBuilder::default().open(obj).context("opening dns_map.bpf.o")?;
                open.maps.dns_records.set_max_entries(set.entries()).context("sizing dns_records")?;
                let skel = open.load().context("loading dns_map.bpf.o")?;
                for r in dns_records::records(set) {
                    skel.maps
                        .dns_records
                        .update(bytes_of(&r.key()), bytes_of(&r.value()), MapFlags::NO_EXIST)
                        .context("filling dns_records")?;
                }
                XdpSkel::Map(skel)
            }
        };
        let fd = match &skel {
            XdpSkel::Nx(s) => s.progs.fp_dns_nxdomain.as_fd().as_raw_fd(),
            XdpSkel::Map(s) => s.progs.fp_dns_map.as_fd().as_raw_fd(),
        };
        let flags = if generic { libbpf_rs::libbpf_sys::XDP_FLAGS_SKB_MODE } else { libbpf_rs::libbpf_sys::XDP_FLAGS_DRV_MODE };
        let link = crate::loader::link_xdp(fd, ifindex, flags)
            .with_context(|| format!("attaching the DNS responder to ifindex {ifindex}"))?;
        Ok(XdpResponder { _link: link, skel })
    }

    /// Outcome counters (FP_DNS_C_*), summed over CPUs.
    pub fn counters(&self) -> Result<Vec<u64>> {
        let map = match &self.skel {
            XdpSkel::Nx(s) => &s.maps.dns_stats,
            XdpSkel::Map(s) => &s.maps.dns_stats,
        };
        (0..FP_DNS_C__COUNT)
            .map(|i| {
                let per_cpu = map
                    .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)
                    .context("reading dns_stats")?
                    .context("dns_stats slot missing")?;
                Ok(per_cpu.iter().map(|v| read_u64(v, 0)).sum())
            })
            .collect()
    }
}

fn named(c: &[u64]) -> Vec<(String, u64)> {
    COUNTER_NAMES.iter().zip(c).filter(|(_, v)| **v > 0).map(|(n, v)| (n.to_string(), *v)).collect()
}

/// The user-space baseline: `threads` blocking UDP sockets bound with
/// SO_REUSEPORT to one address, each served by its own thread with
/// recv_from / respond / send_to.
pub struct SocketServer {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    cpu_ns: Arc<AtomicU64>,
    threads: Vec<JoinHandle<Result<()>>>,
}

fn reuseport_socket(addr: SocketAddr) -> Result<UdpSocket> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2); the fd is owned right below.
    let fd = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket");
    }
    // SAFETY: a fresh fd nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one c_int we own.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("SO_REUSEPORT");
    }
    let sock = UdpSocket::from(fd);
    let sa: nix::sys::socket::SockaddrStorage = addr.into();
    nix::sys::socket::bind(sock.as_raw_fd(), &sa).with_context(|| format!("binding {addr}"))?;
    Ok(sock)
}

impl SocketServer {
    /// Starts the threads (in `netns` if given, pinned to `cpu` if given)
    /// and returns once every socket is bound.
    pub fn start(netns: Option<&str>, addr: SocketAddr, w: Workload, threads: usize, cpu: Option<usize>) -> Result<Self> {
        let zone = Arc::new(w.set().map(Zone::new));
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let cpu_ns = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel::<Result<()>>();
        let mut handles = Vec::new();
        for _ in 0..threads.max(1) {
            let (zone, stop, answered, cpu_ns, tx) =
                (Arc::clone(&zone), Arc::clone(&stop), Arc::clone(&answered), Arc::clone(&cpu_ns), tx.clone());
            let netns = netns.map(str::to_string);
            handles.push(std::thread::spawn(move || -> Result<()> {
                let setup = (|| -> Result<UdpSocket> {
                    if let Some(ns) = &netns {
                        topo::enter_netns(ns)?;
                    }
                    if let Some(c) = cpu {
                        Placement { cpu: c, fifo: false }.apply()?;
                    }
                    let s = reuseport_socket(addr)?;
                    s.set_read_timeout(Some(Duration::from_millis(50))).context("SO_RCVTIMEO")?;
                    Ok(s)
                })();
                let sock = match setup {
                    Ok(s) => {
                        let _ = tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::anyhow!("{e:#}")));
                        return Err(e);
                    }
                };
                let resp = match zone.as_ref() {
                    Some(z) => Responder::Zone(z),
                    None => Responder::Nxdomain,
                };
                serve_socket(&sock, &resp, &stop, &answered, &cpu_ns)
            }));
        }
        drop(tx);
        let server = SocketServer { stop, answered, cpu_ns, threads: handles };
        for _ in 0..server.threads.len() {
            rx.recv().context("socket server thread died")??;
        }
        Ok(server)
    }

    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// CPU time of the server threads so far (updated every 1024 queries and when idle).
    pub fn cpu_time(&self) -> Duration {
        Duration::from_nanos(self.cpu_ns.load(Ordering::Relaxed))
    }

    pub fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            h.join().map_err(|_| anyhow::anyhow!("socket server thread panicked"))??;
        }
        Ok(())
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn serve_socket(sock: &UdpSocket, resp: &Responder<'_>, stop: &AtomicBool, answered: &AtomicU64, cpu_ns: &AtomicU64) -> Result<()> {
    let mut buf = [0u8; 2048];
    let mut cpu_seen = traffic::thread_cpu_time()?;
    let mut n = 0u32;
    let publish = |seen: &mut Duration| -> Result<()> {
        let now = traffic::thread_cpu_time()?;
        cpu_ns.fetch_add(now.saturating_sub(*seen).as_nanos() as u64, Ordering::Relaxed);
        *seen = now;
        Ok(())
    };
    while !stop.load(Ordering::Relaxed) {
        match sock.recv_from(&mut buf) {
            Ok((len, src)) => {
                if src.port() != 0 {
                    if let Some(a) = dns_wire::respond(&buf[..len], resp) {
                        // A full socket buffer on the way back loses the
                        // answer, as it would for any UDP server.
                        if sock.send_to(&a, src).is_ok() {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                n += 1;
                if n.is_multiple_of(1024) {
                    publish(&mut cpu_seen)?;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                publish(&mut cpu_seen)?;
            }
            Err(e) => return Err(e).context("recv_from"),
        }
    }
    publish(&mut cpu_seen)
}

// ---------------------------------------------------------------- generator

/// The query frame template: Ethernet g0 -> r0, IPv4 192.0.2.2 -> 192.0.2.1,
/// UDP GEN_SPORT -> 53 (checksum 0), a query for name 0, type A, ID 0.
fn gen_template() -> Vec<u8> {
    let mut dns = vec![0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    dns.extend_from_slice(&dns_records::wire_name(&dns_records::name(0)));
    dns.extend_from_slice(&[0, 1, 0, 1]);
    let udp_len = 8 + dns.len();
    let mut f = Vec::with_capacity(14 + 20 + udp_len);
    f.extend_from_slice(&topo::MAC_R0);
    f.extend_from_slice(&topo::MAC_G0);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&((20 + udp_len) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&topo::IP_G0);
    ip.extend_from_slice(&SERVER_IP.octets());
    let c = ip4_csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&GEN_SPORT.to_be_bytes());
    f.extend_from_slice(&53u16.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&dns);
    f
}

fn ip4_csum(h: &[u8]) -> u16 {
    let mut s: u32 = h.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

const GEN_DNS: usize = 42;

/// The query generator's spring on gx1 – gx0 (dns_gen.bpf.c).
struct DnsGen<'o> {
    skel: DnsGenSkel<'o>,
    /// The query template: what goes into the spring.
    frame: Vec<u8>,
    gx0: u32,
    _links: Vec<Link>,
}

impl<'o> DnsGen<'o> {
    fn load(obj: &'o mut MaybeUninit<OpenObject>, t: &Topology, queries: u32) -> Result<Self> {
        let tmpl = gen_template();
        let mut open = DnsGenSkelBuilder::default().open(obj).context("opening dns_gen.bpf.o")?;
        open.progs.fp_dns_pass.set_autoload(false);
        open.progs.fp_dns_gen.set_autoload(false);
        let ro = open.maps.rodata_data.as_deref_mut().context("dns_gen.bpf.o has no .rodata")?;
        if tmpl.len() > ro.dg_tmpl.len() {
            bail!("query template of {} bytes does not fit dns_gen's {}", tmpl.len(), ro.dg_tmpl.len());
        }
        ro.dg_tmpl[..tmpl.len()].copy_from_slice(&tmpl);
        ro.dg_len = tmpl.len() as u32;
        ro.dg_id = GEN_DNS as u32;
        ro.dg_digits = (GEN_DNS + 12 + dns_records::NAME_DIGITS) as u32;
        ro.dg_qtype = (GEN_DNS + 12 + dns_records::NAME_WIRE_LEN) as u32;
        ro.dg_queries = queries.max(1);
        let gx0 = t.ifindex(&t.gen, topo::GX0)?;
        ro.loop_bounce_ifindex = gx0;
        ro.loop_frame_len = tmpl.len() as u32;
        let skel = open.load().context("loading dns_gen.bpf.o")?;
        let links =
            traffic::attach_spring(t, &skel.maps.loop_ports, &skel.progs.fp_dns_gen_spring, &skel.progs.fp_dns_bounce)?;
        Ok(DnsGen { skel, frame: tmpl, gx0, _links: links })
    }

    fn run(&self, t: &Topology, place: Placement, d: Duration, stop: &AtomicBool) -> Result<traffic::GenRun> {
        let maps = traffic::LoopMaps { stop: &self.skel.maps.loop_stop, stats: &self.skel.maps.loop_stats };
        let mut runs = traffic::drive(&maps, &self.frame, &t.gen, self.gx0, &[place], d, stop)?;
        Ok(runs.remove(0))
    }
}

/// fp_dns_pass on the client's veth, in `netns` (see dns_gen.bpf.c for why).
pub struct ClientPass<'o> {
    _skel: DnsGenSkel<'o>,
    _link: Link,
}

impl<'o> ClientPass<'o> {
    pub fn attach(obj: &'o mut MaybeUninit<OpenObject>, netns: &str, dev: &str) -> Result<Self> {
        let mut open = DnsGenSkelBuilder::default().open(obj).context("opening dns_gen.bpf.o")?;
        open.progs.fp_dns_gen.set_autoload(false);
        open.progs.fp_dns_gen_spring.set_autoload(false);
        open.progs.fp_dns_bounce.set_autoload(false);
        let skel = open.load().context("loading dns_gen.bpf.o")?;
        let link = topo::in_netns(netns, || -> Result<Link> {
            let ifindex = nix::net::if_::if_nametoindex(dev).with_context(|| format!("no {dev} in {netns}"))?;
            skel.progs.fp_dns_pass.attach_xdp(ifindex as i32).with_context(|| format!("attaching XDP_PASS to {dev}"))
        })??;
        Ok(ClientPass { _skel: skel, _link: link })
    }
}

/// The sink program on g0: counts the answers arriving back, drops them.
struct AnswerSink<'o> {
    skel: SinkSkel<'o>,
    _link: Link,
}

impl<'o> AnswerSink<'o> {
    fn attach(obj: &'o mut MaybeUninit<OpenObject>, t: &Topology) -> Result<Self> {
        let skel = SinkSkelBuilder::default().open(obj).context("opening sink.bpf.o")?.load().context("loading sink.bpf.o")?;
        let g0 = t.ifindex(&t.gen, topo::G0)?;
        let link = topo::in_netns(&t.gen, || skel.progs.fp_bench_sink.attach_xdp(g0 as i32))?
            .context("attaching the answer sink to g0")?;
        Ok(AnswerSink { skel, _link: link })
    }

    fn read(&self) -> Result<u64> {
        let vals = self
            .skel
            .maps
            .sink_stats
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .context("reading sink_stats")?
            .context("sink_stats has no slot 0")?;
        Ok(vals.iter().map(|v| read_u64(v, 0)).sum())
    }
}

// ---------------------------------------------------------------- measurement

fn ethtool(ns: &str, args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "ethtool"])
        .args(args)
        .output()
        .context("running ethtool")?;
    if !out.status.success() {
        bail!("ethtool {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

fn run_workload(point: DnsPoint, w: Workload, opts: &DnsOpts, stop: &AtomicBool) -> Result<DnsResult> {
    let topo = Topology::create()?;
    // The client's queries leave g0 with full checksums, as from a NIC.
    ethtool(&topo.gen, &["-K", topo::G0, "tx", "off"])?;
    let r0 = topo.ifindex(&topo.router, topo::R0)?;
    let mut robj = MaybeUninit::uninit();
    let (xdp, server) = match point {
        DnsPoint::Xdp | DnsPoint::XdpGeneric => {
            let generic = point == DnsPoint::XdpGeneric;
            let r = topo::in_netns(&topo.router, || XdpResponder::start(&mut robj, w, r0, generic))??;
            (Some(r), None)
        }
        DnsPoint::Socket => {
            let addr = SocketAddr::V4(SocketAddrV4::new(SERVER_IP, 53));
            let s = SocketServer::start(Some(&topo.router), addr, w, opts.server_threads, Some(opts.server_cpu))?;
            (None, Some(s))
        }
    };
    let before = match &xdp {
        Some(x) => x.counters()?,
        None => vec![0; FP_DNS_C__COUNT as usize],
    };
    let served_before = server.as_ref().map(|s| s.answered()).unwrap_or(0);

    let mut reps = Vec::new();
    {
        let mut sobj = MaybeUninit::uninit();
        let sink = AnswerSink::attach(&mut sobj, &topo)?;
        let mut gobj = MaybeUninit::uninit();
        let gen = DnsGen::load(&mut gobj, &topo, w.queries())?;
        gen.run(&topo, opts.place, opts.warmup, stop)?;
        for _ in 0..opts.reps {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            std::thread::sleep(Duration::from_millis(60));
            let (got0, scpu0) = (sink.read()?, server.as_ref().map(|s| s.cpu_time()).unwrap_or_default());
            let run = gen.run(&topo, opts.place, opts.duration, stop)?;
            // Answers still queued (socket buffers, veth rings) arrive within
            // the pause; the server's CPU counter is refreshed when it idles.
            std::thread::sleep(Duration::from_millis(60));
            let got = sink.read()? - got0;
            let scpu = server.as_ref().map(|s| s.cpu_time()).unwrap_or_default().saturating_sub(scpu0);
            if got == 0 {
                bail!("{} {}: no answer reached the client (generator sent {})", point.name(), w.name(), run.sent);
            }
            let secs = run.elapsed.as_secs_f64();
            let cpu = (run.cpu_time + scpu).as_secs_f64().max(1e-9);
            reps.push(ThroughputRep {
                answers_per_s: got as f64 / secs,
                offered_per_s: run.sent as f64 / secs,
                answers_per_cpu_s: got as f64 / cpu,
                cpu_s: cpu,
            });
        }
    }
    let outcomes = match &xdp {
        Some(x) => {
            let after = x.counters()?;
            let d: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            let total: u64 = d.iter().sum();
            let right = d[w.expected() as usize];
            // The generator only sends well-formed queries with the expected
            // outcome: anything else means the figure measures something else.
            if (right as f64) < 0.999 * total as f64 {
                bail!("{} {}: outcomes {:?}, expected all {}", point.name(), w.name(), named(&d), COUNTER_NAMES[w.expected() as usize]);
            }
            named(&d)
        }
        None => vec![("answer".to_string(), server.as_ref().map(|s| s.answered()).unwrap_or(0) - served_before)],
    };

    let mut latency = Vec::new();
    let mut pobj = MaybeUninit::uninit();
    let _pass = if opts.rates.is_empty() { None } else { Some(ClientPass::attach(&mut pobj, &topo.gen, topo::G0)?) };
    for &rate in &opts.rates {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        latency.push(paced_client(&topo.gen, rate, opts.rate_duration, w)?);
    }
    if let Some(x) = &xdp {
        let c = x.counters()?;
        let punts = c[fastpath_bpf::intf::FP_DNS_C_PUNT as usize] - before[fastpath_bpf::intf::FP_DNS_C_PUNT as usize];
        if punts > 0 {
            println!("   note: {punts} queries punted for lack of tailroom (lost: no server behind XDP here)");
        }
    }
    if let Some(s) = server {
        s.stop()?;
    }
    drop(xdp);
    let mut a: Vec<f64> = reps.iter().map(|r| r.answers_per_s).collect();
    let mut c: Vec<f64> = reps.iter().map(|r| r.answers_per_cpu_s).collect();
    Ok(DnsResult {
        point,
        workload: w,
        median_answers_per_s: median(&mut a),
        median_answers_per_cpu_s: median(&mut c),
        reps,
        outcomes,
        latency,
    })
}

/// A query as the client sends it: ID `id`, RD, name `n`, A or AAAA.
fn client_query(id: u16, n: u32, aaaa: bool) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    q.extend_from_slice(&dns_records::wire_name(&dns_records::name(n)));
    q.extend_from_slice(&[0, if aaaa { 28 } else { 1 }, 0, 1]);
    q
}

/// Sends `rate` queries/s for `d` from the generator namespace and times
/// each answer (right ID, QR set, the workload's RCODE) in user space.
///
/// Type A only: a socket's query reaches a veth's XDP in an skb-sized
/// buffer with about 49 bytes of tailroom, enough for three A records but
/// not for two AAAA, which XDP would punt to a kernel with no server behind
/// it in the bench (a NIC's page-sized buffers have no such limit, and the
/// throughput runs' XDP frames neither).
fn paced_client(ns: &str, rate: u32, d: Duration, w: Workload) -> Result<LatencyPoint> {
    let n = ((f64::from(rate) * d.as_secs_f64()) as usize).clamp(1, 65536);
    let names = w.queries() / 2;
    let want_rcode = if w == Workload::Nxdomain { dns_wire::RCODE_NXDOMAIN } else { dns_wire::RCODE_NOERROR };
    let sock = topo::in_netns(ns, || -> Result<UdpSocket> {
        let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::from(topo::IP_G0), 0)).context("binding the client")?;
        s.connect(SocketAddrV4::new(SERVER_IP, 53)).context("connecting the client")?;
        Ok(s)
    })??;
    sock.set_read_timeout(Some(Duration::from_millis(20))).context("SO_RCVTIMEO")?;
    // Room for a few hundred ms of answers, so a receiver thread that a busy
    // box keeps off the CPU for a while delays answers instead of losing them.
    let size: libc::c_int = 16 << 20;
    // SAFETY: setsockopt reads one c_int we own.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("SO_RCVBUFFORCE on the client");
    }
    let sent_at: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);
    let t0 = Instant::now();
    let rx_sock = sock.try_clone().context("cloning the client socket")?;
    let (sent, send_time, rtts) = std::thread::scope(|s| -> Result<(u64, Duration, Vec<f64>)> {
        let receiver = s.spawn(|| -> Vec<f64> {
            let mut rtts = Vec::with_capacity(n);
            let mut buf = [0u8; 1024];
            let mut idle_since: Option<Instant> = None;
            loop {
                match rx_sock.recv(&mut buf) {
                    Ok(len) if len >= 12 => {
                        let now = t0.elapsed().as_nanos() as u64;
                        let id = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
                        let flags = u16::from_be_bytes([buf[2], buf[3]]);
                        if id < n && flags & 0x8000 != 0 && flags & 0xf == want_rcode {
                            let at = sent_at[id].swap(0, Ordering::Relaxed);
                            if at != 0 {
                                rtts.push((now.saturating_sub(at - 1)) as f64 / 1e3);
                            }
                        }
                        idle_since = None;
                    }
                    Ok(_) => {}
                    Err(_) => {
                        if done.load(Ordering::Relaxed) {
                            let since = *idle_since.get_or_insert_with(Instant::now);
                            if since.elapsed() > Duration::from_millis(200) {
                                return rtts;
                            }
                        }
                    }
                }
            }
        });
        let interval = 1e9 / f64::from(rate);
        let mut sent = 0u64;
        for (k, at) in sent_at.iter().enumerate() {
            let target = Duration::from_nanos((k as f64 * interval) as u64);
            loop {
                let now = t0.elapsed();
                if now >= target {
                    break;
                }
                let left = target - now;
                if left > Duration::from_micros(200) {
                    std::thread::sleep(left - Duration::from_micros(100));
                } else {
                    std::hint::spin_loop();
                }
            }
            let q = client_query(k as u16, k as u32 % names.max(1), false);
            at.store(t0.elapsed().as_nanos() as u64 + 1, Ordering::Relaxed);
            if sock.send(&q).is_ok() {
                sent += 1;
            } else {
                at.store(0, Ordering::Relaxed);
            }
        }
        let send_time = t0.elapsed();
        done.store(true, Ordering::Relaxed);
        let rtts = receiver.join().map_err(|_| anyhow::anyhow!("client receiver panicked"))?;
        Ok((sent, send_time, rtts))
    })?;
    let mut r = rtts;
    r.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| if r.is_empty() { f64::NAN } else { r[((r.len() - 1) as f64 * p) as usize] };
    Ok(LatencyPoint {
        rate,
        achieved_rate: sent as f64 / send_time.as_secs_f64().max(1e-9),
        sent,
        answered: r.len() as u64,
        p50_us: pct(0.5),
        p90_us: pct(0.9),
        p99_us: pct(0.99),
        max_us: pct(1.0),
    })
}

// ---------------------------------------------------------------- CLI

#[derive(Debug, clap::Args)]
pub struct DnsArgs {
    /// Execution points to measure.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![DnsPoint::Xdp, DnsPoint::XdpGeneric, DnsPoint::Socket])]
    pub points: Vec<DnsPoint>,
    /// Workloads: nxdomain (c), small and large record sets (d).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Workload::Nxdomain, Workload::Small, Workload::Large])]
    pub workloads: Vec<Workload>,
    /// Throughput repetitions per point and workload; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seconds per throughput repetition.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// Offered rates (queries/s) for the response-time runs (empty: none).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1_000u32, 10_000, 50_000, 100_000, 200_000])]
    pub rates: Vec<u32>,
    /// Seconds per offered rate (at most 65536 queries are sent).
    #[arg(long, default_value_t = 0.3)]
    pub rate_duration: f64,
    /// Socket server threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// The generator's CPU (the XDP responder's work runs there too).
    #[arg(long, default_value_t = 0)]
    pub cpu: usize,
    /// The socket server's CPU (default: the next one after --cpu).
    #[arg(long)]
    pub server_cpu: Option<usize>,
    /// Normal scheduling for the generator instead of SCHED_FIFO.
    #[arg(long)]
    pub no_rt: bool,
    /// Short run: 1 repetition of 0.5 s, rates 1000 and 50000.
    #[arg(long)]
    pub quick: bool,
    /// Directory for dns.json.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ServeKind {
    XdpNxdomain,
    XdpMap,
    SocketNxdomain,
    SocketMap,
}

#[derive(Debug, clap::Args)]
pub struct DnsServeArgs {
    /// Which responder.
    #[arg(long, value_enum)]
    pub responder: ServeKind,
    /// Interface for the XDP responders (in this network namespace).
    #[arg(long)]
    pub dev: Option<String>,
    /// Attach the XDP responder in generic (skb) mode.
    #[arg(long)]
    pub generic: bool,
    /// Record set of the map responders.
    #[arg(long, value_enum, default_value = "small")]
    pub set: RecordSet,
    /// Address of the socket server (a v6 wildcard takes IPv4 too).
    #[arg(long, default_value = "[::]:53")]
    pub listen: SocketAddr,
    /// Socket server threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// No socket server behind an XDP responder. By default one runs on
    /// --listen as the slow path: it answers the queries XDP punts (an
    /// answer that does not fit an skb-backed buffer's tailroom).
    #[arg(long)]
    pub no_slow_path: bool,
    /// NETNS:DEV — the client's veth, which gets an XDP_PASS program so the
    /// XDP responder's answers reach it at once (a veth quirk, see dns_gen.bpf.c).
    #[arg(long, value_name = "NETNS:DEV")]
    pub client_pass: Option<String>,
}

fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// `fastpath bench dns-serve`: one responder in this namespace until
/// SIGINT/SIGTERM; prints "ready" once answering, and its counters at exit.
pub fn serve(a: &DnsServeArgs) -> Result<()> {
    let stop = stop_flag()?;
    let mut pobj = MaybeUninit::uninit();
    let _pass = match a.client_pass.as_deref() {
        Some(spec) => {
            let (ns, dev) = spec.split_once(':').context("--client-pass takes NETNS:DEV")?;
            Some(ClientPass::attach(&mut pobj, ns, dev)?)
        }
        None => None,
    };
    let w = |map: bool| if !map { Workload::Nxdomain } else if a.set == RecordSet::Small { Workload::Small } else { Workload::Large };
    let wait = || {
        println!("ready");
        let _ = std::io::stdout().flush();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    match a.responder {
        ServeKind::XdpNxdomain | ServeKind::XdpMap => {
            let dev = a.dev.as_deref().context("--dev is required for an XDP responder")?;
            let ifindex = nix::net::if_::if_nametoindex(dev).with_context(|| format!("no interface {dev}"))?;
            let mut obj = MaybeUninit::uninit();
            let wl = w(a.responder == ServeKind::XdpMap);
            let slow = if a.no_slow_path { None } else { Some(SocketServer::start(None, a.listen, wl, a.threads, None)?) };
            let r = XdpResponder::start(&mut obj, wl, ifindex, a.generic)?;
            wait();
            let slow_answers = slow.as_ref().map(|s| s.answered()).unwrap_or(0);
            println!("counters: {:?}; slow path answers: {slow_answers}", named(&r.counters()?));
            if let Some(s) = slow {
                s.stop()?;
            }
        }
        ServeKind::SocketNxdomain | ServeKind::SocketMap => {
            let s = SocketServer::start(None, a.listen, w(a.responder == ServeKind::SocketMap), a.threads, None)?;
            wait();
            println!("counters: [(\"answer\", {})]", s.answered());
            s.stop()?;
        }
    }
    Ok(())
}

/// `fastpath bench dns`.
pub fn run(a: &DnsArgs) -> Result<()> {
    let results = measure(a)?;
    let json = write_json(&results, &a.out)?;
    println!("wrote {}", json.display());
    Ok(())
}

/// Runs every point and workload of `a` and prints the tables; also what
/// `fastpath bench points` runs for its workloads (c) and (d).
pub fn measure(a: &DnsArgs) -> Result<Vec<DnsResult>> {
    let stop = stop_flag()?;
    let place = Placement::check(a.cpu, !a.no_rt)?;
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut opts = DnsOpts {
        reps: a.reps.max(1),
        duration: Duration::try_from_secs_f64(a.duration).context("--duration")?,
        warmup: Duration::from_millis(300),
        place,
        server_cpu: a.server_cpu.unwrap_or((a.cpu + 1) % ncpu),
        server_threads: a.threads.max(1),
        rates: a.rates.clone(),
        rate_duration: Duration::try_from_secs_f64(a.rate_duration).context("--rate-duration")?,
    };
    if a.quick {
        opts.reps = 1;
        opts.duration = Duration::from_millis(500);
        opts.warmup = Duration::from_millis(200);
        opts.rates = vec![1_000, 50_000];
    }
    println!(
        "fastpath bench dns: points {}, workloads {}, {} x {:.1} s, generator on CPU {}{}, socket server on CPU {} ({} thread(s)); \
         NIC offload: not available on this machine (veth)",
        a.points.iter().map(|p| p.name()).collect::<Vec<_>>().join(","),
        a.workloads.iter().map(|w| w.name()).collect::<Vec<_>>().join(","),
        opts.reps,
        opts.duration.as_secs_f64(),
        place.cpu,
        if place.fifo { " (SCHED_FIFO)" } else { "" },
        opts.server_cpu,
        opts.server_threads,
    );
    let mut results = Vec::new();
    for &w in &a.workloads {
        for &p in &a.points {
            println!("-- {} {}", p.name(), w.name());
            let r = run_dns(p, w, &opts, &stop)?;
            println!(
                "   {:.0} answers/s ({:.0} per CPU-s); outcomes {:?}",
                r.median_answers_per_s, r.median_answers_per_cpu_s, r.outcomes
            );
            results.push(r);
        }
    }
    print_tables(&results);
    Ok(results)
}

fn print_tables(results: &[DnsResult]) {
    println!();
    println!("{:<12} {:<10} {:>14} {:>14} {:>16} {:>10}", "point", "workload", "answers/s", "offered/s", "answers/CPU-s", "vs socket");
    for r in results {
        let sock = results.iter().find(|s| s.workload == r.workload && s.point == DnsPoint::Socket);
        let ratio = sock.map(|s| format!("{:.2}x", r.median_answers_per_s / s.median_answers_per_s)).unwrap_or_default();
        let mut off: Vec<f64> = r.reps.iter().map(|x| x.offered_per_s).collect();
        println!(
            "{:<12} {:<10} {:>14.0} {:>14.0} {:>16.0} {:>10}",
            r.point.name(),
            r.workload.name(),
            r.median_answers_per_s,
            median(&mut off),
            r.median_answers_per_cpu_s,
            ratio
        );
    }
    println!("target: XDP responder >= {TARGET_XDP_TO_SOCKET}x the socket server (answers/s)");
    if results.iter().any(|r| !r.latency.is_empty()) {
        println!();
        println!(
            "{:<12} {:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "point", "workload", "rate/s", "sent/s", "answered", "p50 us", "p90 us", "p99 us", "max us"
        );
        for r in results {
            for l in &r.latency {
                println!(
                    "{:<12} {:<10} {:>9} {:>9.0} {:>8.1}% {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                    r.point.name(),
                    r.workload.name(),
                    l.rate,
                    l.achieved_rate,
                    100.0 * l.answered as f64 / l.sent.max(1) as f64,
                    l.p50_us,
                    l.p90_us,
                    l.p99_us,
                    l.max_us
                );
            }
        }
    }
}

#[derive(Serialize)]
struct DnsReport<'a> {
    bench: &'static str,
    unix_time: u64,
    kernel_release: String,
    method: &'static str,
    nic_offload: &'static str,
    target_xdp_to_socket: f64,
    results: &'a [DnsResult],
}

fn write_json(results: &[DnsResult], dir: &std::path::Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let rep = DnsReport {
        bench: "dns",
        unix_time: crate::bench::report::unix_time(),
        kernel_release: super::report::kernel_release(),
        method: "throughput: dns_gen.bpf.c spring (queries going round gx1 -> gx0, each round a broadcast copy out of g0) \
                 on one CPU -> responder on r0 -> sink.bpf.c on g0 counts answers; \
                 response time: paced Rust UDP client in the generator namespace, user-space timestamps",
        nic_offload: "not available on this machine (veth, no offload-capable NIC)",
        target_xdp_to_socket: TARGET_XDP_TO_SOCKET,
        results,
    };
    let path = dir.join("dns.json");
    let text = serde_json::to_string_pretty(&rep).context("serialising dns.json")?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_template_is_a_query_the_socket_logic_answers() {
        let t = gen_template();
        assert_eq!(ip4_csum(&t[14..34]), 0);
        assert_eq!(&t[GEN_DNS + 12 + dns_records::NAME_DIGITS..][..6], b"000000");
        let q = &t[GEN_DNS..];
        let z = Zone::new(RecordSet::Small);
        let a = dns_wire::respond(q, &Responder::Zone(&z)).unwrap();
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1, "name 0 has one A record");
        assert_eq!(client_query(0, 0, false), q.to_vec());
    }
}
