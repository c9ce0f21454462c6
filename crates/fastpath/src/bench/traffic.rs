//! Both ends of the measurement: the generator (`bpf/bench/gen.bpf.c`, XDP
//! on g1, fed back by the sink) and the sink (`bpf/bench/sink.bpf.c`, XDP on
//! s0, per-CPU counters, sending every frame back out of s1): a loop of
//! frames (gen.bpf.c says why), or for routers that drop, a spring of
//! frames inside the generator namespace; `drive` runs either (the DNS
//! bench's spring too).

use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fastpath_bpf::skel::gen::{GenSkel, GenSkelBuilder};
use fastpath_bpf::skel::sink::{SinkSkel, SinkSkelBuilder};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};
use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use super::topo;
use crate::maps::read_u64;

const HDR_LEN: usize = 42;
/// Ethernet + IPv6 + UDP (gen.bpf.c's GEN6_HDR_WORDS).
const HDR6_LEN: usize = 62;
const FCS_LEN: usize = 4;
const UDP_DPORT: u16 = 9;
pub const SPORT_BASE: u16 = 10000;
/// Flows per destination port (gen.bpf.c's GEN_SPORT_BITS): flow i has
/// source port SPORT_BASE + i % SPORTS and destination port UDP_DPORT + i / SPORTS.
pub const SPORTS: u32 = 1 << 15;
/// Flows at most: 16.7 M, destination ports 9..=520.
pub const MAX_FLOWS: u32 = SPORTS << 9;
/// Bytes of struct fp_rx_hint the generator puts in front of every frame.
pub const HINT_LEN: usize = std::mem::size_of::<fastpath_bpf::intf::fp_rx_hint>();

/// A zeroed frame of `len` bytes (no FCS) from g0 to r0 of `ethertype`,
/// with the generator's UDP header (first flow's ports, length) after an IP
/// header of `ip_hlen` bytes; the IP header and UDP checksum are the
/// caller's.
fn udp_frame(len: usize, ethertype: u16, ip_hlen: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&topo::MAC_R0);
    f[6..12].copy_from_slice(&topo::MAC_G0);
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let udp_len = (len - 14 - ip_hlen) as u16;
    let udp = &mut f[14 + ip_hlen..14 + ip_hlen + 8];
    udp[0..2].copy_from_slice(&SPORT_BASE.to_be_bytes());
    udp[2..4].copy_from_slice(&UDP_DPORT.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    f
}

/// A frame of `size` bytes as counted on Ethernet (FCS included, as RFC 2544
/// sizes are): veth carries no FCS, so the generator emits `size - 4` bytes.
pub fn frame(size: usize) -> Result<Vec<u8>> {
    if !(64..=1518).contains(&size) {
        bail!("frame size {size} outside 64..=1518");
    }
    let len = size - FCS_LEN;
    // UDP checksum 0: "none" is legal for IPv4 and independent of the port.
    let mut f = udp_frame(len, 0x0800, 20);
    let ip_len = (len - 14) as u16;
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&topo::IP_G0);
    ip[16..20].copy_from_slice(&topo::IP_S0);
    let csum = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    Ok(f)
}

/// An Ethernet/IPv6/UDP frame of `size` bytes (FCS included) from the
/// generator's IPv6 address to the sink's, with a valid UDP checksum (IPv6
/// has no "none"); gen.bpf.c keeps it valid as it changes the ports.
pub fn frame6(size: usize) -> Result<Vec<u8>> {
    let min = HDR6_LEN + FCS_LEN;
    if !(min..=1518).contains(&size) {
        bail!("IPv6 frame size {size} outside {min}..=1518 (Ethernet, IPv6 and UDP headers and the FCS take {min} B)");
    }
    let len = size - FCS_LEN;
    let mut f = udp_frame(len, 0x86dd, 40);
    let payload_len = (len - 54) as u16;
    let ip = &mut f[14..54];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&payload_len.to_be_bytes());
    ip[6] = 17; // UDP
    ip[7] = 64; // hop limit
    ip[8..24].copy_from_slice(&topo::IP6_G0);
    ip[24..40].copy_from_slice(&topo::IP6_S0);
    let csum = udp6_checksum(&topo::IP6_G0, &topo::IP6_S0, &f[54..]);
    f[60..62].copy_from_slice(&csum.to_be_bytes());
    Ok(f)
}

/// A frame of `size` bytes of `family`'s traffic.
pub fn frame_for(size: usize, family: topo::Family) -> Result<Vec<u8>> {
    match family {
        topo::Family::V4 => frame(size),
        topo::Family::V6 => frame6(size),
    }
}

/// The Internet checksum of `parts` taken as one run of bytes (each part an
/// even length but the last): the ones' complement of their 16-bit ones'
/// complement sum.
fn inet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for p in parts {
        for w in p.chunks(2) {
            sum += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP checksum of `udp` (header and payload; its checksum field is
/// skipped) between `src` and `dst` (RFC 8200's pseudo-header); 0 is sent
/// as 0xffff.
pub(super) fn udp6_checksum(src: &[u8; 16], dst: &[u8; 16], udp: &[u8]) -> u16 {
    let len = (udp.len() as u32).to_be_bytes();
    match inet_checksum(&[src, dst, &len, &[0, 0, 0, 17], &udp[..6], &udp[8..]]) {
        0 => 0xffff,
        c => c,
    }
}

/// Per-flow destinations (`fastpath bench fullrate`): flow i goes to the
/// i-th address, of the lab's family.
#[derive(Clone, Copy, Debug)]
pub enum Dsts<'a> {
    V4(&'a [Ipv4Addr]),
    V6(&'a [Ipv6Addr]),
}

impl Dsts<'_> {
    pub fn len(&self) -> usize {
        match self {
            Dsts::V4(d) => d.len(),
            Dsts::V6(d) => d.len(),
        }
    }

    pub fn family(&self) -> topo::Family {
        match self {
            Dsts::V4(_) => topo::Family::V4,
            Dsts::V6(_) => topo::Family::V6,
        }
    }

    /// The first `n` as text (reports).
    pub fn sample(&self, n: usize) -> Vec<String> {
        match self {
            Dsts::V4(d) => d.iter().take(n).map(|a| a.to_string()).collect(),
            Dsts::V6(d) => d.iter().take(n).map(|a| a.to_string()).collect(),
        }
    }
}

/// gen.bpf.c's struct gen6_dst for flow `i` of the IPv6 `frame` sent to
/// `dst`: the destination in wire order and the UDP checksum that flow's
/// ports and that destination give.
fn dst6_entry(frame: &[u8], i: u32, dst: Ipv6Addr) -> [u8; 20] {
    let mut udp = frame[54..].to_vec();
    udp[0..2].copy_from_slice(&(SPORT_BASE + (i % SPORTS) as u16).to_be_bytes());
    udp[2..4].copy_from_slice(&(UDP_DPORT + (i / SPORTS) as u16).to_be_bytes());
    let src: [u8; 16] = frame[22..38].try_into().expect("an IPv6 frame has a source address");
    let csum = udp6_checksum(&src, &dst.octets(), &udp);
    let mut e = [0u8; 20];
    e[0..16].copy_from_slice(&dst.octets());
    e[16..18].copy_from_slice(&csum.to_be_bytes());
    e
}

/// gen.bpf.c's struct gen_dst for `frame` sent to `dst`: the destination and
/// the header checksum that goes with it, both in wire order.
fn dst_entry(frame: &[u8], dst: Ipv4Addr) -> [u8; 8] {
    let mut ip = [0u8; 20];
    ip.copy_from_slice(&frame[14..34]);
    ip[16..20].copy_from_slice(&dst.octets());
    ip[10..12].fill(0);
    let csum = ipv4_checksum(&ip);
    let mut e = [0u8; 8];
    e[0..4].copy_from_slice(&dst.octets());
    e[4..6].copy_from_slice(&csum.to_be_bytes());
    e
}

pub(super) fn ipv4_checksum(hdr: &[u8]) -> u16 {
    inet_checksum(&[hdr])
}

/// The generator program, loaded with one frame template and flow count and
/// attached to g1, where the sink's frames come back.
pub struct Generator<'obj> {
    skel: GenSkel<'obj>,
    /// What goes into the loop (the generator rewrites its header anyway).
    frame: Vec<u8>,
    /// Where frames enter the loop: s1 in the sink namespace, or gx0 in the
    /// generator's for the spring.
    inject_ns: String,
    inject_ifindex: u32,
    _links: Vec<Link>,
}

pub struct GenRun {
    pub sent: u64,
    pub elapsed: Duration,
    /// CPU time of the generator thread, which includes the router's and the
    /// sink's softirq work done in its context: on a busy box this, not
    /// `elapsed`, is the time the packets actually got.
    pub cpu_time: Duration,
    /// Frames of the LOOP_FRAMES put in that did not come round again on
    /// the placement's CPU when the run was stopped: dropped on the way (by
    /// a router that punts or loses them; never replaced, so the loop ran
    /// with fewer), or gone round on another CPU (`strayed`). Either way
    /// the repetition did not measure what it claims.
    pub lost: u64,
    /// Of `lost`, those that came round on another CPU instead: the loop
    /// left the bench CPU (counted only for a single placement).
    pub strayed: u64,
    /// Frames sent on by the generator on every CPU, and every CPU's busy
    /// time: the figures for a loop that goes round another CPU by design
    /// (the AF_XDP modes, whose forwarder sends from there).
    pub sent_all: u64,
    pub busy_all: Duration,
}

impl GenRun {
    /// What `lost` and `strayed` say, for a note about a run on `cpu`.
    pub fn missing(&self, cpu: usize) -> String {
        format!(
            "{} of the {LOOP_FRAMES} frames going round did not come round again on CPU {cpu} ({} came round on \
             another CPU, the rest were lost on the way)",
            self.lost, self.strayed
        )
    }
}

impl<'obj> Generator<'obj> {
    pub fn load(
        storage: &'obj mut MaybeUninit<OpenObject>,
        t: &topo::Topology,
        size: usize,
        flows: u32,
        hint: bool,
    ) -> Result<Self> {
        Self::load_with(storage, t, size, flows, hint, None, false)
    }

    /// As `load`, for a router that drops what it gets: the frames go round
    /// the generator's spring (gx1 – gx0) and a copy of each goes to the
    /// router every round (gen.bpf.c), so none has to come back.
    pub fn load_spring(
        storage: &'obj mut MaybeUninit<OpenObject>,
        t: &topo::Topology,
        size: usize,
        flows: u32,
    ) -> Result<Self> {
        Self::load_with(storage, t, size, flows, false, None, true)
    }

    /// As `load`, but flow i is sent to `dsts[i]` (one flow per address):
    /// `fp_bench_gen_dst` (`fp_bench_gen6_dst`), which takes the destination
    /// and header (UDP) checksum of each flow from the `gen_dsts`
    /// (`gen6_dsts`) map filled here.
    pub fn load_dsts(
        storage: &'obj mut MaybeUninit<OpenObject>,
        t: &topo::Topology,
        size: usize,
        dsts: Dsts<'_>,
        hint: bool,
    ) -> Result<Self> {
        let flows = u32::try_from(dsts.len()).context("too many destinations")?;
        Self::load_with(storage, t, size, flows, hint, Some(dsts), false)
    }

    fn load_with(
        storage: &'obj mut MaybeUninit<OpenObject>,
        t: &topo::Topology,
        size: usize,
        flows: u32,
        hint: bool,
        dsts: Option<Dsts<'_>>,
        spring: bool,
    ) -> Result<Self> {
        if flows == 0 || flows > MAX_FLOWS {
            bail!("flows must be 1..={MAX_FLOWS}");
        }
        let v6 = t.family == topo::Family::V6;
        if v6 && spring {
            bail!("the generator's spring sends IPv4 only");
        }
        if let Some(d) = dsts {
            if d.family() != t.family {
                bail!("{} destinations in an {} lab", d.family().name(), t.family.name());
            }
        }
        let frame = frame_for(size, t.family)?;
        let mut open = GenSkelBuilder::default().open(storage).context("opening gen.bpf.o")?;
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("gen.bpf.o has no .rodata")?;
        for (i, w) in frame[..if v6 { HDR6_LEN } else { HDR_LEN }].chunks(2).enumerate() {
            // The program stores the words as they are in memory: keep wire order.
            ro.gen_hdr[i] = u16::from_ne_bytes([w[0], w[1]]);
        }
        ro.gen_sport_base = SPORT_BASE;
        ro.gen_flows = flows;
        ro.gen_hint_magic = if hint { fastpath_bpf::intf::FP_HINT_MAGIC as u16 } else { 0 };
        ro.gen_out_ifindex = t.ifindex(&t.gen, topo::G0)?;
        ro.loop_frame_len = frame.len() as u32;
        let gx0 = t.ifindex(&t.gen, topo::GX0)?;
        ro.loop_bounce_ifindex = gx0;
        // Only the entry points in use are loaded: the default bench's start-up stays as it was,
        // and a kernel that refuses bpf_xdp_adjust_meta still loads the others.
        let (plain, per_dst) = (dsts.is_none() && !spring, dsts.is_some());
        open.progs.fp_bench_gen.set_autoload(plain && !hint && !v6);
        open.progs.fp_bench_gen6.set_autoload(plain && !hint && v6);
        open.progs.fp_bench_gen_dst.set_autoload(per_dst && !hint && !v6);
        open.progs.fp_bench_gen6_dst.set_autoload(per_dst && !hint && v6);
        open.progs.fp_bench_gen_hint.set_autoload(plain && hint && !v6);
        open.progs.fp_bench_gen6_hint.set_autoload(plain && hint && v6);
        open.progs.fp_bench_gen_dst_hint.set_autoload(per_dst && hint && !v6);
        open.progs.fp_bench_gen6_dst_hint.set_autoload(per_dst && hint && v6);
        open.progs.fp_bench_gen_spring.set_autoload(spring);
        open.progs.fp_bench_gen_bounce.set_autoload(spring);
        match dsts {
            Some(Dsts::V4(_)) => open.maps.gen_dsts.set_max_entries(flows).context("sizing gen_dsts")?,
            Some(Dsts::V6(_)) => open.maps.gen6_dsts.set_max_entries(flows).context("sizing gen6_dsts")?,
            None => {}
        }
        let skel = open.load().context("loading gen.bpf.o")?;
        match dsts {
            Some(Dsts::V4(dsts)) => {
                for (i, d) in dsts.iter().enumerate() {
                    skel.maps
                        .gen_dsts
                        .update(&(i as u32).to_ne_bytes(), &dst_entry(&frame, *d), MapFlags::ANY)
                        .context("filling gen_dsts")?;
                }
            }
            Some(Dsts::V6(dsts)) => {
                for (i, d) in dsts.iter().enumerate() {
                    skel.maps
                        .gen6_dsts
                        .update(&(i as u32).to_ne_bytes(), &dst6_entry(&frame, i as u32, *d), MapFlags::ANY)
                        .context("filling gen6_dsts")?;
                }
            }
            None => {}
        }
        if spring {
            let links = attach_spring(
                t,
                &skel.maps.loop_ports,
                &skel.progs.fp_bench_gen_spring,
                &skel.progs.fp_bench_gen_bounce,
            )?;
            return Ok(Generator {
                skel,
                frame,
                inject_ns: t.gen.clone(),
                inject_ifindex: gx0,
                _links: links,
            });
        }
        let g1 = t.ifindex(&t.gen, topo::G1)?;
        let prog = match (per_dst, hint, v6) {
            (false, false, false) => &skel.progs.fp_bench_gen,
            (false, false, true) => &skel.progs.fp_bench_gen6,
            (true, false, false) => &skel.progs.fp_bench_gen_dst,
            (true, false, true) => &skel.progs.fp_bench_gen6_dst,
            (false, true, false) => &skel.progs.fp_bench_gen_hint,
            (false, true, true) => &skel.progs.fp_bench_gen6_hint,
            (true, true, false) => &skel.progs.fp_bench_gen_dst_hint,
            (true, true, true) => &skel.progs.fp_bench_gen6_dst_hint,
        };
        let pin = topo::in_netns(&t.gen, || prog.attach_xdp(g1 as i32))?
            .context("attaching the generator to g1")?;
        Ok(Generator {
            skel,
            frame,
            inject_ns: t.sink.clone(),
            inject_ifindex: t.ifindex(&t.sink, topo::S1)?,
            _links: vec![pin],
        })
    }

    /// Runs the loop for `duration` on `place.cpu`: LOOP_FRAMES frames put
    /// in from a thread on that CPU, after which the generator, router and
    /// sink all run in that CPU's softirq work (a veth hands a frame to
    /// its peer's NAPI on the sending CPU).
    pub fn run(&self, place: Placement, duration: Duration, stop: &AtomicBool) -> Result<GenRun> {
        let mut runs = self.run_loops(&[place], duration, stop)?;
        Ok(runs.remove(0))
    }

    /// As `run`, with one loop per placement at the same time (`fastpath
    /// bench points` on 2 cores: a veth picks the receiving queue by the
    /// sending CPU, so each loop keeps to its own queue and CPU).
    pub fn run_parallel(&self, places: &[Placement], duration: Duration, stop: &AtomicBool) -> Result<Vec<GenRun>> {
        self.run_loops(places, duration, stop)
    }

    fn run_loops(&self, places: &[Placement], duration: Duration, stop: &AtomicBool) -> Result<Vec<GenRun>> {
        let maps = LoopMaps { stop: &self.skel.maps.loop_stop, stats: &self.skel.maps.loop_stats };
        drive(&maps, &self.frame, &self.inject_ns, self.inject_ifindex, places, duration, stop)
    }
}

/// Whether the generator of the `fastpath-hint` mode can load: it needs
/// `bpf_xdp_adjust_meta` (fastpath_bpf::xdp_adjust_meta_allowed).
pub fn hint_supported() -> Result<bool> {
    fastpath_bpf::xdp_adjust_meta_allowed().context("asking the kernel about bpf_xdp_adjust_meta for XDP")
}

/// Sets a spring going in `t`'s generator namespace: loop_ports (loop.h)
/// slot 0 = gx1 (round again, to gx0's bounce), slot 1 = g0 (to the
/// router), filled from inside the namespace since a devmap takes the
/// updater's ifindexes; `spring` attached to gx1, `bounce` to gx0.
pub(super) fn attach_spring<M: MapCore>(
    t: &topo::Topology,
    ports: &M,
    spring: &libbpf_rs::ProgramMut<'_>,
    bounce: &libbpf_rs::ProgramMut<'_>,
) -> Result<Vec<Link>> {
    let (g0, gx0, gx1) = (t.ifindex(&t.gen, topo::G0)?, t.ifindex(&t.gen, topo::GX0)?, t.ifindex(&t.gen, topo::GX1)?);
    topo::in_netns(&t.gen, || -> Result<Vec<Link>> {
        for (k, dev) in [(0u32, gx1), (1, g0)] {
            ports
                .update(&k.to_ne_bytes(), &dev.to_ne_bytes(), MapFlags::ANY)
                .context("filling loop_ports")?;
        }
        Ok(vec![
            spring.attach_xdp(gx1 as i32).context("attaching the spring to gx1")?,
            bounce.attach_xdp(gx0 as i32).context("attaching the bounce to gx0")?,
        ])
    })?
}

/// A loop's (or spring's) controls in its generator program: slot 0 of
/// `stop` (an array of u32) ends a run, slot 0 of `stats` (per CPU) counts
/// the frames sent first (u64 at offset 0).
pub(super) struct LoopMaps<'a, M: MapCore> {
    pub stop: &'a M,
    pub stats: &'a M,
}

impl<M: MapCore> LoopMaps<'_, M> {
    fn set_stop(&self, on: bool) -> Result<()> {
        self.stop
            .update(&0u32.to_ne_bytes(), &u32::from(on).to_ne_bytes(), MapFlags::ANY)
            .context("setting the generator's stop flag")
    }

    /// Frames sent on and frames stopped (struct loop_count), per CPU.
    fn counts(&self) -> Result<Vec<(u64, u64)>> {
        let vals = self
            .stats
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .context("reading the generator's counters")?
            .context("the generator's counters have no slot 0")?;
        Ok(vals.iter().map(|v| (read_u64(v, 0), read_u64(v, 8))).collect())
    }
}

/// Of `cpu`'s counts, what happened between `before` and `after`.
fn delta(before: &[(u64, u64)], after: &[(u64, u64)], cpu: usize) -> (u64, u64) {
    let (b, a) = (before.get(cpu).copied().unwrap_or_default(), after.get(cpu).copied().unwrap_or_default());
    (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1))
}

/// How long the frames still going round at a stop may take to come back
/// (a round is well under a millisecond even through the kernel's path).
const HOMECOMING: Duration = Duration::from_millis(200);

/// Runs a loop or spring for `duration` from each of `places`: LOOP_FRAMES
/// copies of `frame` put in out of `inject_ifindex` (in `inject_ns`) from a
/// thread on the placement's CPU, after which everything runs in that CPU's
/// softirq work (a veth hands a frame to its peer's NAPI on the sending CPU).
/// Per placement: frames the generator sent, and that CPU's busy time.
pub(super) fn drive<M: MapCore>(
    maps: &LoopMaps<'_, M>,
    frame: &[u8],
    inject_ns: &str,
    inject_ifindex: u32,
    places: &[Placement],
    duration: Duration,
    stop: &AtomicBool,
) -> Result<Vec<GenRun>> {
    maps.set_stop(false)?;
    let before = maps.counts()?;
    let cpu_before = super::points::cpustat::read()?;
    let start = Instant::now();
    std::thread::scope(|s| {
        let threads: Vec<_> = places
            .iter()
            .map(|&place| {
                s.spawn(move || -> Result<()> {
                    topo::enter_netns(inject_ns)?;
                    pin_to(place.cpu)?;
                    inject(inject_ifindex, frame, LOOP_FRAMES)
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().map_err(|_| anyhow::anyhow!("injecting thread panicked"))?)
    })?;
    while start.elapsed() < duration && !stop.load(Ordering::Relaxed) {
        std::thread::sleep((duration - start.elapsed().min(duration)).min(Duration::from_millis(10)));
    }
    let after = maps.counts()?;
    let cpu_after = super::points::cpustat::read()?;
    let elapsed = start.elapsed();
    // What is still going round comes back once more and stops there: all
    // LOOP_FRAMES of each placement, unless some were lost on the way.
    maps.set_stop(true)?;
    let home = |counts: &[(u64, u64)]| places.iter().map(|p| delta(&before, counts, p.cpu).1).collect::<Vec<_>>();
    let all_home = |counts: &[(u64, u64)]| (0..counts.len()).map(|c| delta(&before, counts, c).1).sum::<u64>();
    let t = Instant::now();
    let mut counts = maps.counts()?;
    // On any CPU: a loop that went round another one (by design, in the
    // AF_XDP modes) is home too, and counted apart below.
    while all_home(&counts) < (LOOP_FRAMES * places.len()) as u64 && t.elapsed() < HOMECOMING {
        std::thread::sleep(Duration::from_millis(2));
        counts = maps.counts()?;
    }
    let sent_all: u64 = (0..after.len()).map(|c| delta(&before, &after, c).0).sum();
    let busy_all = super::points::cpustat::busy_all_between(&cpu_before, &cpu_after)?;
    let elsewhere: u64 = (0..counts.len())
        .filter(|&c| places.iter().all(|p| p.cpu != c))
        .map(|c| delta(&before, &counts, c).1)
        .sum();
    places
        .iter()
        .zip(home(&counts))
        .map(|(p, home)| {
            let lost = (LOOP_FRAMES as u64).saturating_sub(home);
            Ok(GenRun {
                sent: delta(&before, &after, p.cpu).0,
                elapsed,
                cpu_time: super::points::cpustat::busy_between(&cpu_before, &cpu_after, p.cpu)?,
                lost,
                strayed: if places.len() == 1 { lost.min(elsewhere) } else { 0 },
                sent_all,
                busy_all,
            })
        })
        .collect()
}

/// Frames a loop holds: fewer than a veth ring's 256 slots, so no ring on
/// the way can ever be full however the frames bunch up, and enough for
/// full NAPI batches.
const LOOP_FRAMES: usize = 192;

/// Puts `n` copies of `frame` into the loop: sent by a packet socket out of
/// s1 (the calling thread in the sink namespace) or gx0 (the spring, in the
/// generator's), they arrive at g1's generator or gx1's spring, which sends
/// them round from then on.
fn inject(dev: u32, frame: &[u8], n: usize) -> Result<()> {
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("packet socket");
    }
    // SAFETY: fd was just returned by socket(2) and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Past the qdisc, a packet socket's frame takes the TX queue of the
    // sending CPU (packet_pick_tx_queue), and veth hands it to the peer's
    // RX queue of that number: with two queues (the spring), each CPU's
    // frames start on their own queue, whose NAPI then runs on that CPU.
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one c_int we own.
    if unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error()).context("PACKET_QDISC_BYPASS");
    }
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    sll.sll_ifindex = dev as i32;
    sll.sll_halen = 6;
    for i in 0..n {
        // SAFETY: frame and sll are live for the call, with their true sizes.
        let rc = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("putting frame {i} into the loop"));
        }
    }
    Ok(())
}

/// Where the generator thread (and with it the whole path) runs.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    pub cpu: usize,
    /// SCHED_FIFO at the lowest real-time priority: on a shared box the
    /// ordinary tasks on that CPU then wait for the end of a repetition
    /// instead of taking a different share of each mode's time, which would
    /// skew the wall-clock ratios between modes measured one after another.
    pub fifo: bool,
}

impl Placement {
    /// Tries the placement on a throw-away thread (the caller must not be
    /// pinned: its children, the daemon among them, would inherit it). A bad
    /// CPU is an error; no real-time scheduling is a note.
    pub fn check(cpu: usize, fifo: bool) -> Result<Self> {
        let p = Placement { cpu, fifo };
        let fifo_ok = std::thread::spawn(move || -> Result<bool> {
            pin_to(cpu).context("--cpu")?;
            Ok(!fifo || set_fifo().is_ok())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("placement check thread panicked"))??;
        if !fifo_ok {
            println!("note: cannot use SCHED_FIFO here; measuring with normal scheduling (see cpu% in the table)");
        }
        Ok(Placement {
            fifo: fifo && fifo_ok,
            ..p
        })
    }

    pub fn apply(&self) -> Result<()> {
        pin_to(self.cpu)?;
        if self.fifo {
            set_fifo()?;
        }
        Ok(())
    }
}

fn pin_to(cpu: usize) -> Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu).with_context(|| format!("CPU {cpu} out of range"))?;
    sched_setaffinity(Pid::from_raw(0), &set).with_context(|| format!("pinning to CPU {cpu}"))
}

fn set_fifo() -> Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: applies to the calling thread only; reads one sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(std::io::Error::last_os_error()).context("SCHED_FIFO");
    }
    Ok(())
}

/// struct xdp_md for BPF_PROG_RUN of `input`, whose first `meta` bytes are
/// the metadata area (net/bpf/test_run.c: data_meta 0, data = its length).
#[cfg(test)]
fn meta_ctx(input: &[u8], meta: usize, ifindex: u32) -> [u8; 24] {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
    let mut ctx = [0u8; 24];
    ctx[0..4].copy_from_slice(&(meta as u32).to_ne_bytes());
    ctx[4..8].copy_from_slice(&(input.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    ctx
}

pub fn thread_cpu_time() -> Result<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Err(std::io::Error::last_os_error()).context("CLOCK_THREAD_CPUTIME_ID");
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The sink: XDP on s0 counting everything and sending it back to the
/// generator.
pub struct Sink<'obj> {
    skel: SinkSkel<'obj>,
    _link: Link,
}

impl<'obj> Sink<'obj> {
    pub fn attach(storage: &'obj mut MaybeUninit<OpenObject>, topo: &topo::Topology) -> Result<Self> {
        Self::attach_expecting(storage, topo, None)
    }

    /// As `attach`; with `source`, frames from any other IPv4 source are
    /// counted apart (`strays`).
    pub fn attach_expecting(
        storage: &'obj mut MaybeUninit<OpenObject>,
        topo: &topo::Topology,
        source: Option<std::net::Ipv4Addr>,
    ) -> Result<Self> {
        let mut open = SinkSkelBuilder::default().open(storage).context("opening sink.bpf.o")?;
        let ro = open.maps.rodata_data.as_deref_mut().context("sink.bpf.o has no .rodata")?;
        if let Some(src) = source {
            ro.expect_saddr = u32::from_ne_bytes(src.octets());
        }
        ro.loop_ifindex = topo.ifindex(&topo.sink, topo::S1)?;
        let v6 = topo.family == topo::Family::V6;
        if v6 && source.is_some() {
            bail!("the sink checks IPv4 sources only");
        }
        open.progs.fp_bench_sink.set_autoload(!v6);
        open.progs.fp_bench_sink6.set_autoload(v6);
        let skel = open.load().context("loading sink.bpf.o")?;
        let ifindex = topo.ifindex(&topo.sink, topo::S0)?;
        let prog = if v6 { &skel.progs.fp_bench_sink6 } else { &skel.progs.fp_bench_sink };
        let link = topo::in_netns(&topo.sink, || prog.attach_xdp(ifindex as i32))?
            .context("attaching the sink to s0")?;
        Ok(Sink { skel, _link: link })
    }

    /// Slot 0 of a per-CPU map of the sink, one value per CPU.
    fn per_cpu(map: &impl MapCore, what: &str) -> Result<Vec<Vec<u8>>> {
        map.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("reading {what}"))?
            .with_context(|| format!("{what} has no slot 0"))
    }

    /// (packets, bytes) over all CPUs.
    pub fn read(&self) -> Result<(u64, u64)> {
        let vals = Self::per_cpu(&self.skel.maps.sink_stats, "sink_stats")?;
        let mut total = (0u64, 0u64);
        for v in vals {
            total.0 += read_u64(&v, 0);
            total.1 += read_u64(&v, 8);
        }
        Ok(total)
    }

    /// Frames from another source than the expected one, since the attach.
    pub fn strays(&self) -> Result<u64> {
        let vals = Self::per_cpu(&self.skel.maps.sink_strays, "sink_strays")?;
        Ok(vals.iter().map(|v| read_u64(v, 0)).sum())
    }

    pub fn zero(&self) -> Result<()> {
        let ncpu = libbpf_rs::num_possible_cpus().context("counting CPUs")?;
        let zeros = vec![vec![0u8; 16]; ncpu];
        self.skel
            .maps
            .sink_stats
            .update_percpu(&0u32.to_ne_bytes(), &zeros, MapFlags::ANY)
            .context("zeroing sink_stats")
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::test_root as root;
    use fastpath_bpf::skel::gen::OpenGenSkel;
    use libbpf_rs::ProgramInput;

    const XDP_DROP: u32 = 1;
    const XDP_PASS: u32 = 2;
    const XDP_TX: u32 = 3;


    /// The generator opened as `Generator::load` opens it (header template
    /// `tmpl`, `flows` flows), without the lab. The _hint entry points stay
    /// unloaded unless a test turns them on: a kernel may refuse their
    /// bpf_xdp_adjust_meta.
    fn open_gen<'o>(obj: &'o mut MaybeUninit<OpenObject>, tmpl: &[u8], flows: u32) -> OpenGenSkel<'o> {
        let mut open = GenSkelBuilder::default().open(obj).unwrap();
        let ro = open.maps.rodata_data.as_deref_mut().unwrap();
        let hdr = if tmpl[12..14] == [0x86, 0xdd] { HDR6_LEN } else { HDR_LEN };
        for (i, w) in tmpl[..hdr].chunks(2).enumerate() {
            ro.gen_hdr[i] = u16::from_ne_bytes([w[0], w[1]]);
        }
        ro.gen_sport_base = SPORT_BASE;
        ro.gen_flows = flows;
        open.progs.fp_bench_gen_hint.set_autoload(false);
        open.progs.fp_bench_gen_dst_hint.set_autoload(false);
        open.progs.fp_bench_gen6_hint.set_autoload(false);
        open.progs.fp_bench_gen6_dst_hint.set_autoload(false);
        open
    }

    /// As `open_gen`, loaded, with the hint magic when `hint`.
    fn gen_skel<'o>(obj: &'o mut MaybeUninit<OpenObject>, tmpl: &[u8], flows: u32, hint: bool) -> GenSkel<'o> {
        let mut open = open_gen(obj, tmpl, flows);
        let ro = open.maps.rodata_data.as_deref_mut().unwrap();
        ro.gen_hint_magic = if hint { fastpath_bpf::intf::FP_HINT_MAGIC as u16 } else { 0 };
        open.load().unwrap()
    }

    /// Runs the generator once on `frame` with an empty hint area in front,
    /// as `generate` does; returns its verdict and output (BPF_PROG_RUN
    /// hands back the metadata area in front of the frame).
    fn gen_once(skel: &GenSkel<'_>, frame: &[u8], repeat: u32) -> (u32, Vec<u8>) {
        gen_run(&skel.progs.fp_bench_gen, frame, repeat)
    }

    fn gen_run(prog: &libbpf_rs::ProgramMut<'_>, frame: &[u8], repeat: u32) -> (u32, Vec<u8>) {
        run_with_meta(prog, frame, &[0; HINT_LEN], repeat)
    }

    /// BPF_PROG_RUN of `prog` on `frame` with `meta` as its metadata area
    /// (none when empty); its verdict and output, metadata area first.
    fn run_with_meta(prog: &libbpf_rs::ProgramMut<'_>, frame: &[u8], meta: &[u8], repeat: u32) -> (u32, Vec<u8>) {
        let input = [meta, frame].concat();
        let mut ctx = meta_ctx(&input, meta.len(), 0);
        let mut out = vec![0u8; input.len() + 512];
        let res = prog
            .test_run(ProgramInput {
                data_in: Some(&input),
                context_in: Some(&mut ctx),
                data_out: Some(&mut out),
                repeat,
                ..Default::default()
            })
            .unwrap();
        let (ret, n) = (res.return_value, res.data.map(|d| d.len()).unwrap());
        out.truncate(n);
        (ret, out)
    }

    fn hint_of(out: &[u8]) -> (u32, u16, u16) {
        (
            u32::from_ne_bytes(out[0..4].try_into().unwrap()),
            u16::from_ne_bytes(out[4..6].try_into().unwrap()),
            u16::from_ne_bytes(out[6..8].try_into().unwrap()),
        )
    }

    /// A hint goes only where there is room for exactly one: a frame
    /// without a metadata area (as in the loop) or with a wider one is sent
    /// without, its area untouched.
    #[test]
    fn gen_writes_a_hint_only_into_room_for_one() {
        if !root("gen_writes_a_hint_only_into_room_for_one") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame(64).unwrap();
        let mut obj = MaybeUninit::uninit();
        let skel = gen_skel(&mut obj, &tmpl, 1, true);
        let mut out = vec![0u8; tmpl.len() + 64];
        let bare = skel
            .progs
            .fp_bench_gen
            .test_run(ProgramInput { data_in: Some(&tmpl), data_out: Some(&mut out), ..Default::default() })
            .unwrap();
        assert_eq!(bare.return_value, XDP_TX);
        assert_eq!(bare.data.unwrap().len(), tmpl.len(), "no metadata in front");
        let (ret, wide) = run_with_meta(&skel.progs.fp_bench_gen, &tmpl, &[0x5a; 2 * HINT_LEN], 1);
        assert_eq!(ret, XDP_TX);
        assert!(wide[..2 * HINT_LEN].iter().all(|&b| b == 0x5a), "wider area left alone");
        let (ret, out) = gen_once(&skel, &tmpl, 1);
        assert_eq!(ret, XDP_TX);
        assert_eq!(hint_of(&out).2, fastpath_bpf::intf::FP_HINT_MAGIC as u16);
    }

    /// The _hint entry points (`fastpath-hint`): whatever metadata area a
    /// frame comes with (none, as it enters the loop; one hint, as it comes
    /// round; a wider one), it leaves with exactly one hint, the magic set,
    /// and the frame as the plain entry point makes it. Where the kernel
    /// refuses bpf_xdp_adjust_meta, hint_supported() says so and the
    /// entry points do not load.
    #[test]
    fn gen_hint_entries_make_room_for_exactly_one_hint() {
        if !root("gen_hint_entries_make_room_for_exactly_one_hint") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame(64).unwrap();
        let supported = hint_supported().unwrap();
        let mut obj = MaybeUninit::uninit();
        let mut open = open_gen(&mut obj, &tmpl, 2);
        open.maps.rodata_data.as_deref_mut().unwrap().gen_hint_magic = fastpath_bpf::intf::FP_HINT_MAGIC as u16;
        open.progs.fp_bench_gen_hint.set_autoload(true);
        open.progs.fp_bench_gen_dst_hint.set_autoload(true);
        open.maps.gen_dsts.set_max_entries(2).unwrap();
        let dst = Ipv4Addr::new(203, 0, 113, 9);
        let loaded = open.load();
        if !supported {
            assert!(loaded.is_err(), "hint_supported() said no, yet bpf_xdp_adjust_meta loaded");
            return;
        }
        let skel = loaded.unwrap();
        skel.maps.gen_dsts.update(&0u32.to_ne_bytes(), &dst_entry(&tmpl, dst), MapFlags::ANY).unwrap();
        skel.maps.gen_dsts.update(&1u32.to_ne_bytes(), &dst_entry(&tmpl, dst), MapFlags::ANY).unwrap();
        for prog in [&skel.progs.fp_bench_gen_hint, &skel.progs.fp_bench_gen_dst_hint] {
            let mut hashes = Vec::new();
            for meta in [0, HINT_LEN, 2 * HINT_LEN, 0] {
                let (ret, out) = run_with_meta(prog, &tmpl, &vec![0x5a; meta], 1);
                assert_eq!(ret, XDP_TX, "{} with {meta} B of metadata", prog.name().to_string_lossy());
                assert_eq!(out.len(), HINT_LEN + tmpl.len(), "exactly one hint in front, from {meta} B");
                let (hash, flags, magic) = hint_of(&out);
                assert_eq!((flags, magic), (fastpath_bpf::intf::FP_HINT_L4 as u16, fastpath_bpf::intf::FP_HINT_MAGIC as u16));
                hashes.push(hash);
                assert_eq!(&out[HINT_LEN + 12..HINT_LEN + 24], &tmpl[12..24], "the header is the template's");
            }
            assert_eq!((hashes[0], hashes[1]), (hashes[2], hashes[3]), "a flow keeps its hash");
            assert_ne!(hashes[0], hashes[1], "two flows, two hashes");
        }
    }

    /// In the loop: frames of another length are not the generator's (the
    /// stack gets them), and under loop_stop the loop's frames are dropped
    /// and counted, not sent.
    #[test]
    fn gen_passes_strangers_and_drops_under_stop() {
        if !root("gen_passes_strangers_and_drops_under_stop") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame(64).unwrap();
        let mut obj = MaybeUninit::uninit();
        let mut open = open_gen(&mut obj, &tmpl, 1);
        open.maps.rodata_data.as_deref_mut().unwrap().loop_frame_len = tmpl.len() as u32;
        let skel = open.load().unwrap();
        let run = |data: &[u8]| {
            skel.progs
                .fp_bench_gen
                .test_run(ProgramInput { data_in: Some(data), ..Default::default() })
                .unwrap()
                .return_value
        };
        let longer = frame(128).unwrap();
        assert_eq!(run(&longer), XDP_PASS);
        assert_eq!(run(&tmpl), XDP_TX);
        skel.maps.loop_stop.update(&0u32.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY).unwrap();
        assert_eq!(run(&tmpl), XDP_DROP);
        let per_cpu = skel.maps.loop_stats.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY).unwrap().unwrap();
        let (sent, stopped): (u64, u64) = per_cpu.iter().fold((0, 0), |(a, b), v| (a + read_u64(v, 0), b + read_u64(v, 8)));
        assert_eq!((sent, stopped), (1, 1));
    }

    /// Frames come round the loop with the router's edits in them: the
    /// generator must restore the whole header, and cycle the source port.
    /// Every frame carries a hint, with the magic only in hint mode.
    #[test]
    fn gen_rewrites_whole_header_and_cycles_ports() {
        if !root("gen_rewrites_whole_header_and_cycles_ports") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame(64).unwrap();
        let mut dirty = tmpl.clone();
        dirty[..HDR_LEN].fill(0xee);
        for hint in [false, true] {
            let mut obj = MaybeUninit::uninit();
            let skel = gen_skel(&mut obj, &tmpl, 3, hint);
            let mut hashes = Vec::new();
            for port in [SPORT_BASE, SPORT_BASE + 1, SPORT_BASE + 2, SPORT_BASE] {
                let (ret, out) = gen_once(&skel, &dirty, 1);
                assert_eq!(ret, XDP_TX);
                assert_eq!(out.len(), HINT_LEN + tmpl.len());
                let (hash, flags, magic) = hint_of(&out);
                let want_magic = if hint { fastpath_bpf::intf::FP_HINT_MAGIC as u16 } else { 0 };
                assert_eq!((flags, magic), (fastpath_bpf::intf::FP_HINT_L4 as u16, want_magic));
                hashes.push(hash);
                let mut want = tmpl.clone();
                want[34..36].copy_from_slice(&port.to_be_bytes());
                assert_eq!(&out[HINT_LEN..], &want[..], "port {port}");
            }
            assert_eq!(hashes[0], hashes[3], "a flow keeps its hash");
            assert!(hashes[0] != hashes[1] && hashes[1] != hashes[2]);
        }
    }

    /// Past SPORTS flows the destination port steps, so a million flows stay
    /// distinct 5-tuples.
    #[test]
    fn gen_steps_destination_port_after_sports_flows() {
        if !root("gen_steps_destination_port_after_sports_flows") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame(64).unwrap();
        let mut obj = MaybeUninit::uninit();
        let skel = gen_skel(&mut obj, &tmpl, SPORTS + 2, false);
        // Flows 0..SPORTS-1 in one call (the counter lives in a map).
        gen_once(&skel, &tmpl, SPORTS);
        for (sport, dport) in [(SPORT_BASE, UDP_DPORT + 1), (SPORT_BASE + 1, UDP_DPORT + 1), (SPORT_BASE, UDP_DPORT)] {
            let (_, out) = gen_once(&skel, &tmpl, 1);
            let f = &out[HINT_LEN..];
            assert_eq!(
                (u16::from_be_bytes([f[34], f[35]]), u16::from_be_bytes([f[36], f[37]])),
                (sport, dport)
            );
        }
    }

    /// fp_bench_gen6: the IPv6 header restored on every frame, the ports
    /// cycled as the IPv4 generator cycles them, and the UDP checksum right
    /// for every flow (the destination port stepping too).
    #[test]
    fn gen6_cycles_ports_and_keeps_the_udp_checksum_valid() {
        if !root("gen6_cycles_ports_and_keeps_the_udp_checksum_valid") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame6(84).unwrap();
        assert_eq!(tmpl.len(), 80);
        assert_eq!(udp6_checksum(&topo::IP6_G0, &topo::IP6_S0, &tmpl[54..]), u16::from_be_bytes([tmpl[60], tmpl[61]]));
        let mut dirty = tmpl.clone();
        dirty[..HDR6_LEN].fill(0xee);
        let mut obj = MaybeUninit::uninit();
        let skel = gen_skel(&mut obj, &tmpl, SPORTS + 2, false);
        let prog = &skel.progs.fp_bench_gen6;
        let check = |out: &[u8], sport: u16, dport: u16| {
            let f = &out[HINT_LEN..];
            assert_eq!(f.len(), tmpl.len());
            let mut want = tmpl.clone();
            want[54..56].copy_from_slice(&sport.to_be_bytes());
            want[56..58].copy_from_slice(&dport.to_be_bytes());
            let csum = udp6_checksum(&topo::IP6_G0, &topo::IP6_S0, &want[54..]);
            want[60..62].copy_from_slice(&csum.to_be_bytes());
            assert_eq!(f, &want[..], "ports {sport} {dport}");
        };
        for sport in [SPORT_BASE, SPORT_BASE + 1, SPORT_BASE + 2] {
            let (ret, out) = gen_run(prog, &dirty, 1);
            assert_eq!(ret, XDP_TX);
            check(&out, sport, UDP_DPORT);
        }
        // On to the last flow with this destination port, then the next two.
        gen_run(prog, &tmpl, SPORTS - 4);
        for (sport, dport) in [(SPORT_BASE + (SPORTS - 1) as u16, UDP_DPORT), (SPORT_BASE, UDP_DPORT + 1), (SPORT_BASE + 1, UDP_DPORT + 1), (SPORT_BASE, UDP_DPORT)] {
            let (_, out) = gen_run(prog, &dirty, 1);
            check(&out, sport, dport);
        }
    }

    /// fp_bench_gen6_dst: flow i carries dsts[i] and the UDP checksum its
    /// ports and destination give; the rest is fp_bench_gen6's frame.
    #[test]
    fn gen6_dst_sends_each_flow_to_its_destination() {
        if !root("gen6_dst_sends_each_flow_to_its_destination") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame6(84).unwrap();
        let dsts: [Ipv6Addr; 3] = ["2001:db8:1::1".parse().unwrap(), "2a00:1450::77".parse().unwrap(), "3fff:ffff::1".parse().unwrap()];
        let mut obj = MaybeUninit::uninit();
        let mut open = open_gen(&mut obj, &tmpl, dsts.len() as u32);
        open.maps.gen6_dsts.set_max_entries(dsts.len() as u32).unwrap();
        let skel = open.load().unwrap();
        for (i, d) in dsts.iter().enumerate() {
            let e = dst6_entry(&tmpl, i as u32, *d);
            skel.maps.gen6_dsts.update(&(i as u32).to_ne_bytes(), &e, MapFlags::ANY).unwrap();
        }
        let mut dirty = tmpl.clone();
        dirty[..HDR6_LEN].fill(0xee);
        for (i, d) in dsts.iter().chain(dsts.iter().take(1)).enumerate() {
            let (ret, out) = gen_run(&skel.progs.fp_bench_gen6_dst, &dirty, 1);
            assert_eq!(ret, XDP_TX);
            let f = &out[HINT_LEN..];
            let mut want = tmpl.clone();
            want[38..54].copy_from_slice(&d.octets());
            want[54..56].copy_from_slice(&(SPORT_BASE + (i % dsts.len()) as u16).to_be_bytes());
            want[60..62].fill(0);
            let csum = udp6_checksum(&topo::IP6_G0, &d.octets(), &want[54..]);
            want[60..62].copy_from_slice(&csum.to_be_bytes());
            assert_eq!(f, &want[..], "flow {i}");
        }
    }

    /// A checksum that sums to zero goes as 0xffff, and the frame builder
    /// refuses sizes an IPv6/UDP header does not fit in.
    #[test]
    fn frame6_sizes_and_checksum() {
        assert!(frame6(65).is_err() && frame6(1519).is_err());
        let f = frame6(66).unwrap();
        assert_eq!((f.len(), &f[12..14], f[20], f[21]), (62, &[0x86u8, 0xdd][..], 17, 64));
        assert_eq!(u16::from_be_bytes([f[18], f[19]]), 8);
        // The sum of a valid segment and its pseudo-header, checksum included, is 0xffff.
        let mut sum: u32 = 0;
        for b in [&topo::IP6_G0[..], &topo::IP6_S0[..], &[0, 0, 0, 8, 0, 0, 0, 17], &f[54..]] {
            for w in b.chunks(2) {
                sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
            }
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
    }

    /// fp_bench_gen_dst: flow i carries dsts[i] with a valid header checksum,
    /// and the rest of the frame is the default generator's.
    #[test]
    fn gen_dst_sends_each_flow_to_its_destination() {
        if !root("gen_dst_sends_each_flow_to_its_destination") {
            return;
        }
        pin_to(0).unwrap();
        let tmpl = frame(64).unwrap();
        let dsts = [Ipv4Addr::new(1, 2, 3, 4), Ipv4Addr::new(203, 0, 113, 77), Ipv4Addr::new(223, 255, 0, 1)];
        let mut obj = MaybeUninit::uninit();
        let mut open = open_gen(&mut obj, &tmpl, dsts.len() as u32);
        open.maps.gen_dsts.set_max_entries(dsts.len() as u32).unwrap();
        let skel = open.load().unwrap();
        for (i, d) in dsts.iter().enumerate() {
            let e = dst_entry(&tmpl, *d);
            skel.maps.gen_dsts.update(&(i as u32).to_ne_bytes(), &e, MapFlags::ANY).unwrap();
        }
        let mut dirty = tmpl.clone();
        dirty[..HDR_LEN].fill(0xee);
        for (i, d) in dsts.iter().chain(dsts.iter().take(1)).enumerate() {
            let (ret, out) = gen_run(&skel.progs.fp_bench_gen_dst, &dirty, 1);
            assert_eq!(ret, XDP_TX);
            let f = &out[HINT_LEN..HINT_LEN + tmpl.len()];
            assert_eq!(&f[30..34], &d.octets(), "flow {i}");
            assert_eq!(ipv4_checksum(&f[14..34]), 0, "flow {i}: header checksum");
            let port = SPORT_BASE + (i % dsts.len()) as u16;
            let mut want = tmpl.clone();
            want[34..36].copy_from_slice(&port.to_be_bytes());
            want[24..26].copy_from_slice(&f[24..26]);
            want[30..34].copy_from_slice(&d.octets());
            assert_eq!(f, &want[..], "flow {i}");
        }
    }

    #[test]
    fn sink_counts_and_drops_ipv4_passes_arp() {
        if !root("sink_counts_and_drops_ipv4_passes_arp") {
            return;
        }
        let mut obj = MaybeUninit::uninit();
        let skel = SinkSkelBuilder::default().open(&mut obj).unwrap().load().unwrap();
        let ipv4 = frame(64).unwrap();
        let mut arp = ipv4.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        for (pkt, verdict) in [(&ipv4, XDP_DROP), (&arp, XDP_PASS), (&ipv4, XDP_DROP)] {
            let input = ProgramInput {
                data_in: Some(pkt),
                ..Default::default()
            };
            assert_eq!(skel.progs.fp_bench_sink.test_run(input).unwrap().return_value, verdict);
        }
        let per_cpu = skel
            .maps
            .sink_stats
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .unwrap();
        let pkts: u64 = per_cpu.iter().map(|v| read_u64(v, 0)).sum();
        let bytes: u64 = per_cpu.iter().map(|v| read_u64(v, 8)).sum();
        assert_eq!((pkts, bytes), (2, 2 * ipv4.len() as u64));
    }

    #[test]
    fn sink_counts_frames_from_another_source_apart() {
        if !root("sink_counts_frames_from_another_source_apart") {
            return;
        }
        let mut obj = MaybeUninit::uninit();
        let mut open = SinkSkelBuilder::default().open(&mut obj).unwrap();
        open.maps.rodata_data.as_deref_mut().unwrap().expect_saddr = u32::from_ne_bytes([198, 51, 100, 1]);
        let skel = open.load().unwrap();
        let untranslated = frame(64).unwrap();
        let mut translated = untranslated.clone();
        translated[26..30].copy_from_slice(&[198, 51, 100, 1]);
        for pkt in [&translated, &untranslated, &translated] {
            let input = ProgramInput { data_in: Some(pkt), ..Default::default() };
            assert_eq!(skel.progs.fp_bench_sink.test_run(input).unwrap().return_value, XDP_DROP);
        }
        let strays: u64 = skel
            .maps
            .sink_strays
            .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
            .unwrap()
            .unwrap()
            .iter()
            .map(|v| read_u64(v, 0))
            .sum();
        assert_eq!(strays, 1, "the one frame from the generator's own address");
    }

    #[test]
    fn frame_has_valid_ipv4_checksum_and_lengths() {
        let f = frame(64).unwrap();
        assert_eq!(f.len(), 60);
        assert_eq!(ipv4_checksum(&f[14..34]), 0);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 46);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 26);
        let f = frame(512).unwrap();
        assert_eq!(f.len(), 508);
        assert_eq!(ipv4_checksum(&f[14..34]), 0);
    }
}
