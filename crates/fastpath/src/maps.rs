//! The BPF maps seen from Rust: `MapWriter` applies reconcile's `Op`s to
//! them (converting to the `fp_*` structs of fastpath.h), and `Maps` offers
//! the few reads the daemon needs (counters, neighbour use marks). Handles
//! are fd duplicates, so the API thread can own its own copy.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use fastpath_bpf::intf::{
    self, fp_ct_set, fp_flow_key, fp_flow_set, fp_group, fp_group_path, fp_iface, fp_lpm4_key, fp_lpm6_key, fp_neigh, fp_neigh4_key,
    fp_neigh6_key, fp_nexthop, fp_route, fp_runtime, fp_stats,
};
use fastpath_bpf::skel::xdp_fwd::XdpFwdSkel;
use fastpath_core::tables::{GroupEntry, GroupKind, IfaceEntry, NeighEntry, NeighKey, NexthopEntry, Op, RouteAction, RouteEntry, Switches, TableWriter};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

mod dir24;
mod dir6;
mod mapped;
mod readback;

pub use dir24::DirUsage;
pub use dir6::Dir6Usage;
pub use readback::ReadBack;

pub const NREASONS: usize = intf::fp_reason::FP_R__COUNT as usize;

#[derive(Debug, thiserror::Error)]
#[error("{map}: {source}")]
pub struct MapError {
    pub map: &'static str,
    #[source]
    pub source: libbpf_rs::Error,
}

type MapResult<T> = Result<T, MapError>;

fn ctx<T>(map: &'static str, r: libbpf_rs::Result<T>) -> MapResult<T> {
    r.map_err(|source| MapError { map, source })
}

/// Views a bindgen struct of fastpath.h as the bytes the kernel expects.
/// Every such struct spells its padding out as fields, so no byte is uninit.
pub(crate) fn bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is a repr(C) plain-old-data type from fastpath.h without
    // implicit padding; the slice borrows `v` for its lifetime.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// The reverse of `bytes`, for values read back from a map.
pub(crate) fn from_bytes<T: Copy + Default>(b: &[u8]) -> T {
    if b.len() < size_of::<T>() {
        return T::default();
    }
    // SAFETY: length checked; every bit pattern is valid for these integer-only structs.
    unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) }
}

pub struct Maps {
    ifaces: MapHandle,
    fib4: MapHandle,
    fib4_dir: MapHandle,
    fib4_dir16: MapHandle,
    fib4_vals: MapHandle,
    fib6: MapHandle,
    fib6_dir16: MapHandle,
    fib6_dir: MapHandle,
    fib6_vals: MapHandle,
    nexthops: MapHandle,
    groups: MapHandle,
    res_buckets: MapHandle,
    neigh4: MapHandle,
    neigh6: MapHandle,
    src_deny4: MapHandle,
    src_bloom4: MapHandle,
    tx_ports: MapHandle,
    stats: MapHandle,
    flows: MapHandle,
    ct_flows: MapHandle,
    bss: MapHandle,
}

/// Packets and bytes per reason, summed over CPUs.
#[derive(Debug, Clone)]
pub struct Counters {
    pub packets: [u64; NREASONS],
    pub bytes: [u64; NREASONS],
    /// enum fp_flow_event
    pub flow: [u64; NFLOW],
    /// enum fp_hash_src
    pub hash_src: [u64; NHASH],
}

pub const NFLOW: usize = intf::fp_flow_event::FP_FC__COUNT as usize;
pub const NHASH: usize = intf::fp_hash_src::FP_HS__COUNT as usize;

impl Default for Counters {
    fn default() -> Self {
        Counters { packets: [0; NREASONS], bytes: [0; NREASONS], flow: [0; NFLOW], hash_src: [0; NHASH] }
    }
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        for i in 0..NREASONS {
            self.packets[i] += o.packets[i];
            self.bytes[i] += o.bytes[i];
        }
        for i in 0..NFLOW {
            self.flow[i] += o.flow[i];
        }
        for i in 0..NHASH {
            self.hash_src[i] += o.hash_src[i];
        }
    }
}

/// One cached flow as `fastpath flows` shows it (summed over CPUs).
#[derive(Debug, Clone)]
pub struct CachedFlow {
    pub key: fp_flow_key,
    /// Low 32 bits of the table generation it was computed from.
    pub generation: u32,
    pub dmac: [u8; 6],
    pub slot: u16,
    pub nh_id: u32,
    pub used: u32,
    pub packets: u64,
    /// IP bytes (as conntrack counts them); kept in stateful mode only.
    pub bytes: Option<u64>,
    /// CPUs holding it.
    pub cpus: u32,
}

fn handle(name: &'static str, m: &libbpf_rs::MapMut<'_>) -> MapResult<MapHandle> {
    ctx(name, MapHandle::try_from(m))
}

fn dup(name: &'static str, m: &MapHandle) -> MapResult<MapHandle> {
    ctx(name, MapHandle::try_from(m))
}

impl Maps {
    pub fn from_skel(skel: &XdpFwdSkel<'_>) -> MapResult<Maps> {
        let m = &skel.maps;
        Ok(Maps {
            ifaces: handle("fp_ifaces", &m.fp_ifaces)?,
            fib4: handle("fp_fib4", &m.fp_fib4)?,
            fib4_dir: handle("fp_fib4_dir", &m.fp_fib4_dir)?,
            fib4_dir16: handle("fp_fib4_dir16", &m.fp_fib4_dir16)?,
            fib4_vals: handle("fp_fib4_vals", &m.fp_fib4_vals)?,
            fib6: handle("fp_fib6", &m.fp_fib6)?,
            fib6_dir16: handle("fp_fib6_dir16", &m.fp_fib6_dir16)?,
            fib6_dir: handle("fp_fib6_dir", &m.fp_fib6_dir)?,
            fib6_vals: handle("fp_fib6_vals", &m.fp_fib6_vals)?,
            nexthops: handle("fp_nexthops", &m.fp_nexthops)?,
            groups: handle("fp_groups", &m.fp_groups)?,
            res_buckets: handle("fp_res_buckets", &m.fp_res_buckets)?,
            neigh4: handle("fp_neigh4", &m.fp_neigh4)?,
            neigh6: handle("fp_neigh6", &m.fp_neigh6)?,
            src_deny4: handle("fp_src_deny4", &m.fp_src_deny4)?,
            src_bloom4: handle("fp_src_bloom4", &m.fp_src_bloom4)?,
            tx_ports: handle("fp_tx_ports", &m.fp_tx_ports)?,
            stats: handle("fp_stats", &m.fp_stats)?,
            flows: handle("fp_flows", &m.fp_flows)?,
            ct_flows: handle("fp_ct_flows", &m.fp_ct_flows)?,
            bss: handle(".bss", &m.bss)?,
        })
    }

    pub fn try_clone(&self) -> MapResult<Maps> {
        Ok(Maps {
            ifaces: dup("fp_ifaces", &self.ifaces)?,
            fib4: dup("fp_fib4", &self.fib4)?,
            fib4_dir: dup("fp_fib4_dir", &self.fib4_dir)?,
            fib4_dir16: dup("fp_fib4_dir16", &self.fib4_dir16)?,
            fib4_vals: dup("fp_fib4_vals", &self.fib4_vals)?,
            fib6: dup("fp_fib6", &self.fib6)?,
            fib6_dir16: dup("fp_fib6_dir16", &self.fib6_dir16)?,
            fib6_dir: dup("fp_fib6_dir", &self.fib6_dir)?,
            fib6_vals: dup("fp_fib6_vals", &self.fib6_vals)?,
            nexthops: dup("fp_nexthops", &self.nexthops)?,
            groups: dup("fp_groups", &self.groups)?,
            res_buckets: dup("fp_res_buckets", &self.res_buckets)?,
            neigh4: dup("fp_neigh4", &self.neigh4)?,
            neigh6: dup("fp_neigh6", &self.neigh6)?,
            src_deny4: dup("fp_src_deny4", &self.src_deny4)?,
            src_bloom4: dup("fp_src_bloom4", &self.src_bloom4)?,
            tx_ports: dup("fp_tx_ports", &self.tx_ports)?,
            stats: dup("fp_stats", &self.stats)?,
            flows: dup("fp_flows", &self.flows)?,
            ct_flows: dup("fp_ct_flows", &self.ct_flows)?,
            bss: dup(".bss", &self.bss)?,
        })
    }

    /// Lets the program redirect to `ifindex` through its fp_iface slot
    /// (devmap entry slot -> ifindex, no egress program).
    pub fn add_tx_port(&self, slot: u32, ifindex: u32) -> MapResult<()> {
        let mut val = vec![0u8; self.tx_ports.value_size() as usize];
        val[..4].copy_from_slice(&ifindex.to_ne_bytes());
        ctx("fp_tx_ports", self.tx_ports.update(&slot.to_ne_bytes(), &val, MapFlags::ANY))
    }

    pub fn del_tx_port(&self, slot: u32) -> MapResult<()> {
        ctx("fp_tx_ports", self.tx_ports.delete(&slot.to_ne_bytes()))
    }

    /// Zeroes one fp_stats slot on every CPU: a slot a reload hands to an
    /// interface may hold the counts of one removed earlier.
    pub fn reset_counters(&self, slot: u32) -> MapResult<()> {
        let cpus = ctx("fp_stats", self.stats.lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY))?.unwrap_or_default();
        let zero: Vec<Vec<u8>> = cpus.iter().map(|v| vec![0u8; v.len()]).collect();
        ctx("fp_stats", self.stats.update_percpu(&slot.to_ne_bytes(), &zero, MapFlags::ANY))
    }

    /// Counters of one fp_stats slot, summed over CPUs.
    pub fn counters(&self, slot: u32) -> MapResult<Counters> {
        let mut c = Counters::default();
        let per_cpu = ctx("fp_stats", self.stats.lookup_percpu(&slot.to_ne_bytes(), MapFlags::ANY))?;
        for v in per_cpu.unwrap_or_default() {
            let st: fp_stats = from_bytes(&v);
            for i in 0..NREASONS {
                c.packets[i] += st.packets[i];
                c.bytes[i] += st.bytes[i];
            }
            for i in 0..NFLOW {
                c.flow[i] += st.flow[i];
            }
            for i in 0..NHASH {
                c.hash_src[i] += st.hash_src[i];
            }
        }
        Ok(c)
    }

    /// Every filled flow-cache way of every CPU, merged by key. Reads the
    /// whole cache (one syscall per set and CPU): for the CLI, not the hot loop.
    pub fn flows(&self) -> MapResult<Vec<CachedFlow>> {
        let mut merged: BTreeMap<Vec<u8>, CachedFlow> = BTreeMap::new();
        // One entry per set of each CPU's slice (bpf/lib/maps.h).
        let entries = self.flows.info().map(|i| i.info.max_entries).unwrap_or(0);
        // Stateful mode sizes fp_ct_flows like fp_flows; otherwise it has no bytes to show.
        let with_bytes = entries > 1 && self.ct_flows.info().map(|i| i.info.max_entries).unwrap_or(0) == entries;
        for idx in 0..entries {
            let key = idx.to_ne_bytes();
            let Some(v) = ctx("fp_flows", self.flows.lookup(&key, MapFlags::ANY))? else {
                continue;
            };
            let set: fp_flow_set = from_bytes(&v);
            let ct_set: Option<fp_ct_set> = if with_bytes {
                ctx("fp_ct_flows", self.ct_flows.lookup(&key, MapFlags::ANY))?.map(|b| from_bytes(&b))
            } else {
                None
            };
            for (w, f) in set.way.iter().enumerate() {
                let way = fastpath_bpf::flow_way(&set, w);
                let (generation, used) = (way.generation, way.used);
                if generation == 0 {
                    continue;
                }
                let e = merged.entry(bytes(&way.key).to_vec()).or_insert_with(|| CachedFlow {
                    key: way.key,
                    generation,
                    dmac: f.dmac,
                    slot: f.slot,
                    nh_id: f.nh_id,
                    used,
                    packets: 0,
                    bytes: ct_set.map(|_| 0),
                    cpus: 0,
                });
                e.packets += u64::from(way.packets);
                if let (Some(b), Some(c)) = (e.bytes.as_mut(), ct_set.as_ref()) {
                    *b += fastpath_bpf::flow_ct(&way, c, w).bytes;
                }
                e.cpus += 1;
                // The newest CPU copy describes the flow.
                if generation > e.generation || (generation == e.generation && used > e.used) {
                    e.generation = generation;
                    e.dmac = f.dmac;
                    e.slot = f.slot;
                    e.nh_id = f.nh_id;
                    e.used = used;
                }
            }
        }
        Ok(merged.into_values().collect())
    }

    /// Last fast-path use of a neighbour as coarse monotonic ns (0 = never):
    /// the start of the keep-alive tick in which a packet last went to it,
    /// so it is up to one tick (~1 s) early.
    pub fn neigh_used_ns(&self, key: &NeighKey) -> MapResult<Option<u64>> {
        let (name, map, k) = self.neigh_map(key);
        let v = ctx(name, map.lookup(&k, MapFlags::ANY))?;
        Ok(v.map(|v| clock_to_ns(from_bytes::<fp_neigh>(&v).used)))
    }

    /// Every neighbour entry with the neigh_clock of its last use (0 = never).
    pub fn neigh_uses(&self) -> Vec<(NeighKey, u32)> {
        let mut out = Vec::new();
        for (map, v6) in [(&self.neigh4, false), (&self.neigh6, true)] {
            for k in map.keys() {
                let Ok(Some(v)) = map.lookup(&k, MapFlags::ANY) else { continue };
                let nk = if v6 { decode_neigh6_key(&from_bytes(&k)) } else { decode_neigh4_key(&from_bytes(&k)) };
                out.push((nk, from_bytes::<fp_neigh>(&v).used));
            }
        }
        out
    }

    /// The map a neighbour lives in (by its address family) and its key bytes there.
    fn neigh_map(&self, k: &NeighKey) -> (&'static str, &MapHandle, Vec<u8>) {
        match k.addr {
            IpAddr::V4(a) => ("fp_neigh4", &self.neigh4, bytes(&neigh4_key(k.ifindex, a)).to_vec()),
            IpAddr::V6(a) => ("fp_neigh6", &self.neigh6, bytes(&neigh6_key(k.ifindex, a)).to_vec()),
        }
    }

    /// Advances fp_runtime.neigh_clock, leaving the rest of the .bss as it
    /// is. Only the daemon thread writes the .bss (here and in MapWriter),
    /// so the read-modify-write cannot lose a switch update.
    pub fn set_neigh_clock(&self, clock: u32) -> MapResult<()> {
        let mut val = self.read_bss()?;
        let mut rt: fp_runtime = from_bytes(&val);
        rt.neigh_clock = clock;
        val[..size_of::<fp_runtime>()].copy_from_slice(bytes(&rt));
        ctx(".bss", self.bss.update(&0u32.to_ne_bytes(), &val, MapFlags::ANY))
    }

    /// The whole .bss value, at least as long as fp_runtime.
    fn read_bss(&self) -> MapResult<Vec<u8>> {
        let size = self.bss.value_size() as usize;
        let mut val = ctx(".bss", self.bss.lookup(&0u32.to_ne_bytes(), MapFlags::ANY))?.unwrap_or_default();
        val.resize(size.max(size_of::<fp_runtime>()), 0);
        Ok(val)
    }
}

/// neigh_clock value (CLOCK_MONOTONIC_COARSE seconds + 1) as coarse ns;
/// 0 stays 0 (never).
pub fn clock_to_ns(clock: u32) -> u64 {
    u64::from(clock.saturating_sub(1)) * 1_000_000_000 * u64::from(clock != 0)
}

/// A native-endian u64 at `off` of a map value (0 if out of range).
pub fn read_u64(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map(|s| u64::from_ne_bytes(s.try_into().unwrap_or([0; 8]))).unwrap_or(0)
}

fn family_of(a: &IpAddr) -> u8 {
    match a {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// Network-order bytes in a 16-byte field, IPv4 in the first four.
fn addr16(a: &IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match a {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out = v6.octets(),
    }
    out
}

fn neigh4_key(ifindex: u32, a: Ipv4Addr) -> fp_neigh4_key {
    fp_neigh4_key { ifindex, addr: u32::from_ne_bytes(a.octets()) }
}

fn neigh6_key(ifindex: u32, a: Ipv6Addr) -> fp_neigh6_key {
    fp_neigh6_key { ifindex, addr: a.octets() }
}

fn decode_neigh4_key(k: &fp_neigh4_key) -> NeighKey {
    NeighKey { ifindex: k.ifindex, addr: IpAddr::V4(Ipv4Addr::from(k.addr.to_ne_bytes())) }
}

fn decode_neigh6_key(k: &fp_neigh6_key) -> NeighKey {
    NeighKey { ifindex: k.ifindex, addr: IpAddr::V6(Ipv6Addr::from(k.addr)) }
}

fn lpm4(addr: Ipv4Addr, len: u8) -> fp_lpm4_key {
    let len = len.min(32);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
    let masked = u32::from(addr) & mask;
    fp_lpm4_key { prefixlen: len as u32, addr: u32::from_ne_bytes(masked.to_be_bytes()) }
}

fn lpm6(addr: Ipv6Addr, len: u8) -> fp_lpm6_key {
    let len = len.min(128);
    let mask = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
    let masked = u128::from(addr) & mask;
    fp_lpm6_key { prefixlen: len as u32, addr: masked.to_be_bytes() }
}

fn route(e: &RouteEntry) -> fp_route {
    use intf::fp_route_type as T;
    let (ty, reason, nh) = match e.action {
        RouteAction::Forward { nh_id } => (T::FP_RT_FORWARD, 0, nh_id),
        RouteAction::Local => (T::FP_RT_LOCAL, 0, 0),
        RouteAction::Blackhole => (T::FP_RT_BLACKHOLE, 0, 0),
        RouteAction::Unreachable => (T::FP_RT_UNREACHABLE, 0, 0),
        RouteAction::Prohibit => (T::FP_RT_PROHIBIT, 0, 0),
        RouteAction::Punt { reason } => (T::FP_RT_PUNT, reason, 0),
        RouteAction::Multipath { group } => (T::FP_RT_MULTIPATH, 0, group),
    };
    fp_route { type_: ty as u8, punt_reason: reason, _pad: 0, mtu: e.mtu, nh_id: nh }
}

/// `slot`: the egress interface's fp_ifaces slot, 0 when it is not managed.
fn nexthop(e: &NexthopEntry, slot: u32) -> fp_nexthop {
    let (fam, gw) = match &e.gateway {
        None => (0, [0u8; 16]),
        Some(a) => (family_of(a), addr16(a)),
    };
    // Slots are < FP_MAX_IFACES (256): the u16 cannot truncate.
    fp_nexthop { ifindex: e.ifindex, gw_family: fam, _pad: 0, slot: slot as u16, gw }
}

/// fp_group; `desired` never makes more than FP_GROUP_MAX_PATHS paths.
fn group(e: &GroupEntry) -> fp_group {
    let mut g = fp_group {
        kind: match e.kind {
            GroupKind::HashThreshold => intf::fp_group_kind::FP_GRP_HASH_THRESHOLD as u8,
            GroupKind::Resilient => intf::fp_group_kind::FP_GRP_RESILIENT as u8,
        },
        n_buckets: e.n_buckets,
        ..Default::default()
    };
    for (slot, p) in g.paths.iter_mut().zip(&e.paths) {
        *slot = fp_group_path { upper_bound: p.upper_bound, nh_id: p.nh_id };
    }
    g.n_paths = e.paths.len().min(g.paths.len()) as u8;
    g
}

fn iface(ifindex: u32, e: &IfaceEntry) -> fp_iface {
    fp_iface { mac: e.mac, flags: e.flags | intf::FP_IF_PRESENT as u16, mtu: e.mtu, mtu6: e.mtu6, ifindex }
}

/// The fp_src_bloom4 bit of a source address (FP_SRC_BLOOM_* in fastpath.h).
pub fn src_bloom_bit(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets()).wrapping_mul(intf::FP_SRC_BLOOM_MUL) >> (32 - intf::FP_SRC_BLOOM_BITS)
}

/// Applies reconcile's ops to the maps. Owns fp_runtime: the switches come
/// from SetSwitches, the generation counts BumpGeneration ops. Also owns
/// fp_src_bloom4, derived from the deny entries it writes.
pub struct MapWriter {
    maps: Maps,
    rt: fp_runtime,
    /// Deny entries written, and how many of them sit on each bloom bit.
    deny: BTreeSet<Ipv4Addr>,
    bloom_refs: BTreeMap<u32, u32>,
    slots: BTreeMap<u32, u32>,
    /// Slots of interfaces a previous daemon managed and this one does not
    /// (adopted pinned maps): only their fp_ifaces entries are cleared.
    retired: BTreeMap<u32, u32>,
    /// Cleared when the kernel refuses batch calls; single writes from then on.
    batching: bool,
    /// A group or bucket was written since the last generation bump (and
    /// fp_runtime.group_generation raised ahead of it).
    groups_dirty: bool,
    /// The /24 index kept beside fp_fib4 (`--fib4-index dir24`).
    dir: Option<dir24::Fib4Dir>,
    /// The multibit index kept beside fp_fib6 (`--fib6-index multibit`).
    dir6: Option<dir6::Fib6Dir>,
}

impl MapWriter {
    /// `slots`: ifindex -> fp_ifaces slot of every managed interface, fixed
    /// for the daemon's life (next hops carry their egress slot).
    pub fn new(maps: Maps, slots: BTreeMap<u32, u32>) -> MapWriter {
        MapWriter {
            maps,
            rt: fp_runtime::default(),
            deny: BTreeSet::new(),
            bloom_refs: BTreeMap::new(),
            slots,
            retired: BTreeMap::new(),
            batching: true,
            groups_dirty: false,
            dir: None,
            dir6: None,
        }
    }

    /// Keeps the /24 index from now on (before the first route is written,
    /// or `adopt` seeds it from the routes already there).
    pub fn enable_fib4_dir(&mut self) -> anyhow::Result<()> {
        use anyhow::Context;
        self.dir = Some(
            dir24::Fib4Dir::new(&self.maps.fib4_dir, &self.maps.fib4_dir16, &self.maps.fib4_vals).context("mapping the /24 index fp_fib4_dir")?,
        );
        Ok(())
    }

    /// Keeps the IPv6 multibit index from now on (before the first route
    /// is written, or `adopt` seeds it from the routes already there).
    pub fn enable_fib6_dir(&mut self) -> anyhow::Result<()> {
        use anyhow::Context;
        self.dir6 = Some(
            dir6::Fib6Dir::new(&self.maps.fib6_dir16, &self.maps.fib6_dir, &self.maps.fib6_vals)
                .context("mapping the IPv6 index fp_fib6_dir16 and fp_fib6_dir")?,
        );
        Ok(())
    }

    /// The IPv6 index's occupancy (None: it is off).
    pub fn fib6_dir_usage(&self) -> Option<Dir6Usage> {
        self.dir6.as_ref().map(|d| d.usage())
    }

    /// The IPv6 index takes what changed since the last flush. Before every
    /// generation bump: a flow cached after the bump must be computed
    /// from the new table, index included.
    fn flush_dir6(&mut self) {
        if let Some(d) = self.dir6.as_mut() {
            d.flush();
        }
    }

    /// Deletes what rested long enough (between reconciles nothing is
    /// pending, so this changes no answer).
    pub fn tidy(&mut self) {
        self.flush_dir6();
    }

    /// The /24 index's occupancy (None: it is off).
    pub fn fib4_dir_usage(&self) -> Option<DirUsage> {
        self.dir.as_ref().map(|d| d.usage())
    }

    /// A route write to fp_fib4 landed: the index follows.
    fn paint(&mut self, op: &Op) {
        if let Some(d) = self.dir6.as_mut() {
            match op {
                Op::UpsertRoute6(a, l, e) => d.upsert(*a, *l, &route(e)),
                Op::DeleteRoute6(a, l) => d.delete(*a, *l),
                _ => {}
            }
        }
        let Some(d) = self.dir.as_mut() else {
            return;
        };
        match op {
            Op::UpsertRoute4(a, l, e) => d.upsert(*a, *l, &route(e)),
            Op::DeleteRoute4(a, l) => d.delete(*a, *l),
            _ => {}
        }
    }

    /// A reload changed the managed set: interfaces leaving it become
    /// retired, so the reconcile that deletes their fp_ifaces entries still
    /// finds their slots.
    pub fn set_slots(&mut self, slots: BTreeMap<u32, u32>) {
        for (ifindex, slot) in &self.slots {
            if !slots.contains_key(ifindex) {
                self.retired.insert(*ifindex, *slot);
            }
        }
        for ifindex in slots.keys() {
            self.retired.remove(ifindex);
        }
        self.slots = slots;
    }

    /// Slots a new interface must not get: in use, or retired with their
    /// fp_ifaces entry possibly still written.
    pub fn taken_slots(&self) -> BTreeSet<u32> {
        self.slots.values().chain(self.retired.values()).copied().collect()
    }

    /// Forgets retired interfaces whose fp_ifaces entry is gone (`written`:
    /// what the reconciler says the map holds): their slots are free again.
    pub fn forget_retired<V>(&mut self, written: &BTreeMap<u32, V>) {
        self.retired.retain(|ifindex, _| written.contains_key(ifindex));
    }

    /// Seconds without a heartbeat before the data path punts everything
    /// (0 = never), written with the next runtime update.
    pub fn set_orphan_grace(&mut self, secs: u32) {
        self.rt.orphan_grace = secs;
    }

    /// Continues from what a dead daemon wrote (pinned maps): its
    /// generation (so no cached flow of an older table can match a new
    /// one), its switches until the reconciler changes them, and the
    /// bitmap references of its deny entries. `retired`: ifindex -> slot of
    /// interfaces it managed that this daemon does not.
    pub fn adopt(&mut self, old: &ReadBack, retired: BTreeMap<u32, u32>) {
        let (flow_timeout, orphan_grace) = (self.rt.flow_timeout, self.rt.orphan_grace);
        self.rt = old.rt;
        self.rt.flow_timeout = flow_timeout;
        self.rt.orphan_grace = orphan_grace;
        self.deny.clear();
        self.bloom_refs.clear();
        for a in old.tables.src_deny4.keys() {
            self.deny.insert(*a);
            *self.bloom_refs.entry(src_bloom_bit(*a)).or_insert(0) += 1;
        }
        self.retired = retired;
        if let Some(d) = self.dir.as_mut() {
            d.adopt(old.tables.fib4.iter().map(|((a, l), e)| (*a, *l, route(e))));
        }
        if let Some(d) = self.dir6.as_mut() {
            d.adopt(old.tables.fib6.iter().map(|((a, l), e)| (*a, *l, route(e))));
        }
    }

    /// Rewrites next hop `id` in place when it was written with another
    /// egress slot than this daemon's: the interface left the managed set
    /// (slot 0: its packets punt) or joined it.
    pub fn fix_nexthop_slot(&mut self, id: u32, e: &NexthopEntry, written: u16) -> MapResult<bool> {
        if u32::from(written) == self.slot(e.ifindex) {
            return Ok(false);
        }
        self.apply(&Op::UpsertNexthop(id, e.clone()))?;
        Ok(true)
    }

    /// Idle timeout of cached flows (0 = cache off), written with the next
    /// runtime update.
    pub fn set_flow_timeout(&mut self, secs: u32) {
        self.rt.flow_timeout = secs;
    }

    /// Writes runtime settings changed since the last write (a reload).
    pub fn flush_runtime(&self) -> MapResult<()> {
        self.write_runtime()
    }

    fn slot(&self, ifindex: u32) -> u32 {
        self.slots.get(&ifindex).copied().unwrap_or(0)
    }

    /// Writes the bitmap word holding `bit` as `bloom_refs` says it is.
    fn write_bloom_word(&self, bit: u32) -> MapResult<()> {
        let word = bit / 64;
        let mut v = 0u64;
        for (b, _) in self.bloom_refs.range(word * 64..(word + 1) * 64) {
            v |= 1u64 << (b % 64);
        }
        ctx("fp_src_bloom4", self.maps.src_bloom4.update(&word.to_ne_bytes(), &v.to_ne_bytes(), MapFlags::ANY))
    }

    /// The bit goes up before the entry is added: until then the entry is
    /// absent anyway, and once it is there it is always seen.
    fn upsert_deny(&mut self, a: Ipv4Addr, reason: u8) -> MapResult<()> {
        if !self.deny.contains(&a) {
            let bit = src_bloom_bit(a);
            *self.bloom_refs.entry(bit).or_insert(0) += 1;
            if let Err(e) = self.write_bloom_word(bit) {
                self.unref_bloom(bit);
                return Err(e);
            }
        }
        ctx("fp_src_deny4", self.maps.src_deny4.update(&a.octets(), &u32::from(reason).to_ne_bytes(), MapFlags::ANY))?;
        self.deny.insert(a);
        Ok(())
    }

    /// The bit comes down only after the last entry on it is gone. A
    /// failed bitmap write leaves the bit set: that only costs lookups.
    fn delete_deny(&mut self, a: Ipv4Addr) -> MapResult<()> {
        ignore_missing(ctx("fp_src_deny4", self.maps.src_deny4.delete(&a.octets())))?;
        if self.deny.remove(&a) {
            let bit = src_bloom_bit(a);
            if self.unref_bloom(bit) {
                self.write_bloom_word(bit)?;
            }
        }
        Ok(())
    }

    /// Drops one reference; true if the bit is now clear.
    fn unref_bloom(&mut self, bit: u32) -> bool {
        match self.bloom_refs.get_mut(&bit) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.bloom_refs.remove(&bit);
                true
            }
        }
    }

    /// The .bss is one array element holding `fp_rt` at offset 0; written
    /// whole so generation and switches change together. neigh_clock
    /// belongs to the keep-alive and is carried over as it is.
    fn write_runtime(&self) -> MapResult<()> {
        let mut val = self.maps.read_bss()?;
        let mut rt = self.rt;
        rt.neigh_clock = from_bytes::<fp_runtime>(&val).neigh_clock;
        val[..size_of::<fp_runtime>()].copy_from_slice(bytes(&rt));
        ctx(".bss", self.maps.bss.update(&0u32.to_ne_bytes(), &val, MapFlags::ANY))
    }

    // ---- stateful mode (issue #4): the conntrack fields of fp_runtime ----

    /// Mark bits, revalidation interval and timeouts, written with the next
    /// runtime update (or `write_ct`).
    pub fn set_ct(&mut self, marks: crate::ctwatch::CtMarks, revalidate_ms: u32, t: crate::ctwatch::CtTimeouts) {
        self.rt.ct_mark = marks.orig;
        self.rt.ct_mark_reply = marks.reply;
        self.rt.ct_revalidate_ms = t.revalidate_cap_ms(revalidate_ms);
        self.rt.ct_timeout_tcp = t.tcp;
        self.rt.ct_timeout_udp = t.udp;
        self.rt.ct_timeout_udp_stream = t.udp_stream;
        self.rt.ct_tcp_liberal = u32::from(t.tcp_liberal);
    }

    pub fn write_ct(&self) -> MapResult<()> {
        self.write_runtime()
    }

    /// Every cached conntrack verdict is re-checked on its next packet. On
    /// a failed write the new value stays here and goes out with the next
    /// runtime write; it never goes backwards.
    pub fn bump_ct_generation(&mut self) -> MapResult<u32> {
        self.rt.ct_generation = self.rt.ct_generation.wrapping_add(1).max(1);
        self.write_runtime()?;
        Ok(self.rt.ct_generation)
    }

    pub fn ct_generation(&self) -> u32 {
        self.rt.ct_generation
    }

    fn set_switches(&mut self, s: &Switches) -> MapResult<()> {
        if (s.mp_policy4, s.mp_policy6, s.mp_fields4, s.mp_fields6, s.mp_seed)
            != (self.rt.mp_policy4, self.rt.mp_policy6, self.rt.mp_fields4, self.rt.mp_fields6, self.rt.mp_seed)
        {
            // Every plan that sets switches ends with a generation bump:
            // flows cached from that one on were hashed the new way.
            self.rt.mp_generation = (self.rt.generation as u32).wrapping_add(1);
        }
        self.rt.table_full = s.table_full;
        self.rt.policy_punt = s.policy_punt;
        self.rt.src_lpm = s.src_lpm;
        self.rt.mp_policy4 = s.mp_policy4;
        self.rt.mp_policy6 = s.mp_policy6;
        self.rt.mp_fields4 = s.mp_fields4;
        self.rt.mp_fields6 = s.mp_fields6;
        self.rt.mp_seed = s.mp_seed;
        self.write_runtime()
    }
}

impl TableWriter for MapWriter {
    type Error = MapError;

    fn apply(&mut self, op: &Op) -> Result<(), MapError> {
        let group_op = matches!(op, Op::UpsertGroup(..) | Op::DeleteGroup(..) | Op::UpsertBucket(..) | Op::DeleteBucket(..));
        if group_op && !self.groups_dirty {
            // Ahead of the first group write: a flow cached from then on
            // until the bump may have been hashed by the old group.
            self.rt.group_generation = (self.rt.generation as u32).wrapping_add(1);
            self.write_runtime()?;
            self.groups_dirty = true;
        }
        let m = &self.maps;
        let any = MapFlags::ANY;
        match op {
            Op::SetSwitches(s) => self.set_switches(s),
            Op::UpsertIface(ifindex, e) => {
                ctx("fp_ifaces", m.ifaces.update(&e.slot.to_ne_bytes(), bytes(&iface(*ifindex, e)), any))
            }
            // An array cannot delete: an all-zero entry lacks FP_IF_PRESENT.
            Op::DeleteIface(ifindex) => match self.slots.get(ifindex).or(self.retired.get(ifindex)) {
                Some(slot) => ctx("fp_ifaces", m.ifaces.update(&slot.to_ne_bytes(), bytes(&fp_iface::default()), any)),
                None => Ok(()),
            },
            Op::UpsertNexthop(id, e) => {
                let val = nexthop(e, self.slot(e.ifindex));
                ctx("fp_nexthops", m.nexthops.update(&id.to_ne_bytes(), bytes(&val), any))
            }
            // An array cannot delete: zero it so a stale reference finds ifindex 0 (not managed).
            Op::DeleteNexthop(id) => {
                ctx("fp_nexthops", m.nexthops.update(&id.to_ne_bytes(), bytes(&fp_nexthop::default()), any))
            }
            Op::UpsertNeigh(k, NeighEntry { mac }) => {
                let (name, map, key) = m.neigh_map(k);
                // The data path owns `used`; a MAC change must not reset keep-alive.
                let used = ctx(name, map.lookup(&key, any))?.map(|v| from_bytes::<fp_neigh>(&v).used).unwrap_or(0);
                let val = fp_neigh { mac: *mac, _pad: 0, used };
                ctx(name, map.update(&key, bytes(&val), any))
            }
            Op::DeleteNeigh(k) => {
                let (name, map, key) = m.neigh_map(k);
                ignore_missing(ctx(name, map.delete(&key)))
            }
            Op::UpsertGroup(id, e) => ctx("fp_groups", m.groups.update(&id.to_ne_bytes(), bytes(&group(e)), any)),
            // An array cannot delete: kind 0 makes a stale reference punt.
            Op::DeleteGroup(id) => {
                ctx("fp_groups", m.groups.update(&id.to_ne_bytes(), bytes(&fp_group::default()), any))
            }
            Op::UpsertBucket(k, nh) => ctx("fp_res_buckets", m.res_buckets.update(&k.to_ne_bytes(), &nh.to_ne_bytes(), any)),
            Op::DeleteBucket(k) => ignore_missing(ctx("fp_res_buckets", m.res_buckets.delete(&k.to_ne_bytes()))),
            Op::UpsertRoute4(a, l, e) => {
                ctx("fp_fib4", m.fib4.update(bytes(&lpm4(*a, *l)), bytes(&route(e)), any))?;
                self.paint(op);
                Ok(())
            }
            Op::DeleteRoute4(a, l) => {
                ignore_missing(ctx("fp_fib4", m.fib4.delete(bytes(&lpm4(*a, *l)))))?;
                self.paint(op);
                Ok(())
            }
            Op::UpsertRoute6(a, l, e) => {
                ctx("fp_fib6", m.fib6.update(bytes(&lpm6(*a, *l)), bytes(&route(e)), any))?;
                self.paint(op);
                Ok(())
            }
            Op::DeleteRoute6(a, l) => {
                ignore_missing(ctx("fp_fib6", m.fib6.delete(bytes(&lpm6(*a, *l)))))?;
                self.paint(op);
                Ok(())
            }
            Op::UpsertSrcDeny4(a, reason) => self.upsert_deny(*a, *reason),
            Op::DeleteSrcDeny4(a) => self.delete_deny(*a),
            Op::BumpGeneration => {
                self.flush_dir6();
                self.rt.generation += 1;
                self.groups_dirty = false;
                self.write_runtime()
            }
        }
    }

    /// Runs of consecutive route upserts or deletes on one FIB go to the
    /// kernel as one batch call each (in order, so reconcile's ordering
    /// holds entry by entry); everything else, and the entry a batch
    /// stopped at, goes through `apply`, which also gives the error its
    /// usual form and forgives deleting a missing route.
    fn apply_many(&mut self, ops: &[Op]) -> (usize, Result<(), MapError>) {
        let mut done = 0;
        while done < ops.len() {
            let rest = &ops[done..];
            let run = match RunKind::of(&rest[0]) {
                Some(k) if self.batching => rest.iter().take(BATCH_MAX).take_while(|o| RunKind::of(o) == Some(k)).count(),
                _ => 0,
            };
            if run >= BATCH_MIN {
                let out = self.write_run(&rest[..run]);
                for op in &rest[..out.landed] {
                    self.paint(op);
                }
                done += out.landed;
                match out.error {
                    None => continue,
                    Some(e) if out.unsupported() => {
                        log::info!("batched map writes refused ({e}), writing entries one by one");
                        self.batching = false;
                    }
                    Some(e) => log::debug!("batch stopped after {} of {run} entries: {e}", out.landed),
                }
            }
            if let Err(e) = self.apply(&ops[done]) {
                self.flush_dir6();
                return (done, Err(e));
            }
            done += 1;
        }
        self.flush_dir6();
        (done, Ok(()))
    }
}

/// Fewer entries than this are not worth building the arrays for.
const BATCH_MIN: usize = 4;
/// Bounds the packed arrays (a few hundred KiB) of one call.
const BATCH_MAX: usize = 16384;

/// The ops `MapWriter` batches: one kind per map and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunKind {
    Upsert4,
    Delete4,
    Upsert6,
    Delete6,
}

impl RunKind {
    fn of(op: &Op) -> Option<RunKind> {
        match op {
            Op::UpsertRoute4(..) => Some(RunKind::Upsert4),
            Op::DeleteRoute4(..) => Some(RunKind::Delete4),
            Op::UpsertRoute6(..) => Some(RunKind::Upsert6),
            Op::DeleteRoute6(..) => Some(RunKind::Delete6),
            _ => None,
        }
    }
}

impl MapWriter {
    /// One batch call for `ops`, all of one `RunKind`.
    fn write_run(&self, ops: &[Op]) -> crate::batch::Outcome {
        let mut keys = Vec::with_capacity(ops.len() * size_of::<fp_lpm6_key>());
        let mut vals = Vec::with_capacity(ops.len() * size_of::<fp_route>());
        let mut kind = None;
        for op in ops {
            match op {
                Op::UpsertRoute4(a, l, e) => {
                    keys.extend_from_slice(bytes(&lpm4(*a, *l)));
                    vals.extend_from_slice(bytes(&route(e)));
                }
                Op::DeleteRoute4(a, l) => keys.extend_from_slice(bytes(&lpm4(*a, *l))),
                Op::UpsertRoute6(a, l, e) => {
                    keys.extend_from_slice(bytes(&lpm6(*a, *l)));
                    vals.extend_from_slice(bytes(&route(e)));
                }
                Op::DeleteRoute6(a, l) => keys.extend_from_slice(bytes(&lpm6(*a, *l))),
                _ => {}
            }
            kind = kind.or(RunKind::of(op));
        }
        let m = &self.maps;
        let n = ops.len();
        match kind {
            Some(RunKind::Upsert4) => crate::batch::update(&m.fib4, &keys, &vals, n),
            Some(RunKind::Delete4) => crate::batch::delete(&m.fib4, &keys, n),
            Some(RunKind::Upsert6) => crate::batch::update(&m.fib6, &keys, &vals, n),
            Some(RunKind::Delete6) => crate::batch::delete(&m.fib6, &keys, n),
            None => crate::batch::Outcome { landed: 0, error: None },
        }
    }
}

/// Deleting what is already gone is the state we wanted.
fn ignore_missing(r: MapResult<()>) -> MapResult<()> {
    match r {
        Err(e) if e.source.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpm_keys_are_masked_network_order() {
        let k = lpm4(Ipv4Addr::new(198, 51, 100, 77), 24);
        assert_eq!(k.prefixlen, 24);
        assert_eq!(k.addr.to_ne_bytes(), [198, 51, 100, 0]);
        let k = lpm4(Ipv4Addr::new(1, 2, 3, 4), 0);
        assert_eq!(k.addr, 0);
        let k = lpm6("2001:db8:1:2::5".parse().unwrap(), 48);
        assert_eq!(Ipv6Addr::from(k.addr), "2001:db8:1::".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn neigh_key_round_trips() {
        for a in ["192.0.2.1", "2001:db8::1"] {
            let k = NeighKey { ifindex: 7, addr: a.parse().unwrap() };
            let back = match k.addr {
                IpAddr::V4(v4) => decode_neigh4_key(&neigh4_key(7, v4)),
                IpAddr::V6(v6) => decode_neigh6_key(&neigh6_key(7, v6)),
            };
            assert_eq!(back, k);
        }
    }

    #[test]
    fn src_bloom_bit_matches_the_header_formula() {
        // 192.0.2.1 read as a little- or big-endian u32, times the constant.
        let a = Ipv4Addr::new(192, 0, 2, 1);
        let raw = u32::from_ne_bytes([192, 0, 2, 1]);
        assert_eq!(src_bloom_bit(a), raw.wrapping_mul(0x9E37_79B1) >> 16);
        assert!(src_bloom_bit(a) < intf::FP_SRC_BLOOM_WORDS * 64);
    }

    #[test]
    fn neigh_clock_to_ns() {
        assert_eq!(clock_to_ns(0), 0);
        assert_eq!(clock_to_ns(1), 0);
        assert_eq!(clock_to_ns(u32::MAX), u64::from(u32::MAX - 1) * 1_000_000_000);
    }

    #[test]
    fn route_conversion() {
        let r = route(&RouteEntry { action: RouteAction::Punt { reason: 22 }, mtu: 1400 });
        assert_eq!(r.type_, intf::fp_route_type::FP_RT_PUNT as u8);
        assert_eq!(r.punt_reason, 22);
        assert_eq!(r.mtu, 1400);
        let r = route(&RouteEntry { action: RouteAction::Forward { nh_id: 5 }, mtu: 0 });
        assert_eq!((r.type_, r.nh_id), (intf::fp_route_type::FP_RT_FORWARD as u8, 5));
        let r = route(&RouteEntry { action: RouteAction::Multipath { group: 9 }, mtu: 0 });
        assert_eq!((r.type_, r.nh_id), (intf::fp_route_type::FP_RT_MULTIPATH as u8, 9));
    }

    #[test]
    fn group_conversion() {
        use fastpath_core::tables::GroupPath;
        let e = GroupEntry {
            kind: GroupKind::HashThreshold,
            paths: vec![GroupPath { upper_bound: -1, nh_id: 3 }, GroupPath { upper_bound: i32::MAX, nh_id: 4 }],
            n_buckets: 0,
            origin: 0,
        };
        let g = group(&e);
        assert_eq!((g.kind, g.n_paths), (intf::fp_group_kind::FP_GRP_HASH_THRESHOLD as u8, 2));
        assert_eq!((g.paths[0].upper_bound, g.paths[0].nh_id), (-1, 3));
        assert_eq!((g.paths[1].upper_bound, g.paths[1].nh_id), (i32::MAX, 4));
        assert_eq!(g.paths[2].nh_id, 0);
        assert_eq!(g.paths.len(), fastpath_core::desired::FP_GROUP_MAX_PATHS);
        let r = group(&GroupEntry { kind: GroupKind::Resilient, n_buckets: 512, origin: 7, paths: vec![] });
        assert_eq!((r.kind, r.n_buckets), (intf::fp_group_kind::FP_GRP_RESILIENT as u8, 512));
    }
}
