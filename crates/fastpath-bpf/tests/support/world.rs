//! The table contents of one case: a small, fixed topology that each case
//! bends a little (drop a neighbour, flip a flag, ...).
//!
//! Topology (router ports `a` = ingress, `b` = egress):
//!   a: 192.0.2.0/24, 2001:db8:a::/64, router 192.0.2.1 / 2001:db8:a::1, client .10
//!   b: 198.51.100.0/24, 2001:db8:b::/64, router 198.51.100.254, gateways
//!      198.51.100.1 and 2001:db8:b::1 (and fe80::d6 for v4-via-v6)
//!   203.0.113.0/24 and 2001:db8:2::/48 via those gateways.

use std::mem::size_of;

use anyhow::{Context, Result};
use fastpath_bpf::intf::*;
use fastpath_bpf::skel::xdp_fwd::XdpFwdSkel;
use fastpath_core::dir6::table::{self, Buckets, Slot, VecBuckets, WAYS};
use fastpath_core::dir6::{Dir6, Dir6Sink, Key, TOPS, TRIE};
use libbpf_rs::{MapCore, MapFlags};

use super::packet::{v4, v6, Mac};

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;

pub const MAC_A: Mac = [0x02, 0, 0, 0, 0x01, 0x0a];
pub const MAC_B: Mac = [0x02, 0, 0, 0, 0x01, 0x0b];
pub const MAC_CLIENT: Mac = [0x02, 0, 0, 0, 0, 0xc1];
pub const MAC_GW4: Mac = [0x02, 0, 0, 0, 0, 0xd4];
pub const MAC_GW6: Mac = [0x02, 0, 0, 0, 0, 0xd6];
pub const MAC_GW6LL: Mac = [0x02, 0, 0, 0, 0, 0xe6];
pub const MAC_HOST_B: Mac = [0x02, 0, 0, 0, 0, 0xb7];

pub const SLOT_A: u32 = 1;
pub const SLOT_B: u32 = 2;

pub const NH_GW4: u32 = 1;
pub const NH_ONLINK_A: u32 = 2;
pub const NH_ONLINK_B: u32 = 3;
pub const NH_GW6: u32 = 4;
pub const NH_V4_VIA_V6: u32 = 5;

/// Byte view of a bindgen struct. All interface structs have explicit
/// padding fields, so there are no uninitialised bytes to read.
pub fn raw<T: Copy>(v: &T) -> &[u8] {
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

pub fn from_raw<T: Copy + Default>(b: &[u8]) -> T {
    assert_eq!(b.len(), size_of::<T>());
    let mut v = T::default();
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), (&mut v as *mut T).cast::<u8>(), b.len()) };
    v
}

pub fn route(type_: fp_route_type, nh_id: u32) -> fp_route {
    fp_route { type_: type_ as u8, nh_id, ..Default::default() }
}

pub fn punt_route(reason: u8) -> fp_route {
    fp_route { type_: fp_route_type::FP_RT_PUNT as u8, punt_reason: reason, ..Default::default() }
}

pub fn lpm4(addr: &str, len: u32) -> fp_lpm4_key {
    fp_lpm4_key { prefixlen: len, addr: u32::from_ne_bytes(v4(addr)) }
}

pub fn lpm6(addr: &str, len: u32) -> fp_lpm6_key {
    fp_lpm6_key { prefixlen: len, addr: v6(addr) }
}

pub fn gw_nh(ifindex: u32, family: u8, gw: &[u8]) -> fp_nexthop {
    let mut nh = fp_nexthop { ifindex, gw_family: family, ..Default::default() };
    nh.gw[..gw.len()].copy_from_slice(gw);
    nh
}

/// A neighbour as the daemon sees it; `apply` writes it to fp_neigh4 or
/// fp_neigh6 by family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighKey {
    V4(fp_neigh4_key),
    V6(fp_neigh6_key),
}

pub fn neigh_key(ifindex: u32, family: u8, addr: &[u8]) -> NeighKey {
    if family == AF_INET {
        let mut a = [0u8; 4];
        a.copy_from_slice(addr);
        NeighKey::V4(fp_neigh4_key { ifindex, addr: u32::from_ne_bytes(a) })
    } else {
        let mut k = fp_neigh6_key { ifindex, ..Default::default() };
        k.addr.copy_from_slice(addr);
        NeighKey::V6(k)
    }
}

pub fn neigh(mac: Mac) -> fp_neigh {
    fp_neigh { mac, ..Default::default() }
}

#[derive(Clone)]
pub struct World {
    pub a: u32,
    pub b: u32,
    /// Managed interfaces by ifindex (the slot is `slots`'s).
    pub ifaces: Vec<(u32, fp_iface)>,
    /// ifindex -> slot, as the daemon hands them out.
    pub slots: Vec<(u32, u32)>,
    pub fib4: Vec<(fp_lpm4_key, fp_route)>,
    pub fib6: Vec<(fp_lpm6_key, fp_route)>,
    pub nexthops: Vec<(u32, fp_nexthop)>,
    pub neigh: Vec<(NeighKey, fp_neigh)>,
    /// fp_groups: group id -> ECMP group.
    pub groups: Vec<(u32, fp_group)>,
    /// fp_res_buckets: (group << 16) | bucket -> next-hop id.
    pub buckets: Vec<(u32, u32)>,
    /// Ingress ifindexes in the devmap, each under its fp_iface slot.
    pub tx_ports: Vec<u32>,
    /// fp_src_deny4: source address -> reason (what desired derives from the FIB).
    pub src_deny4: Vec<([u8; 4], u32)>,
    /// Leave fp_src_bloom4 empty (the daemon always sets the bits).
    pub no_bloom: bool,
    pub rt: fp_runtime,
    /// Load the program in stateful mode (fp_config.stateful).
    pub stateful: bool,
    /// Load it with `--flow-key addresses` (fp_config.flow_key_addrs).
    pub flow_key_addrs: bool,
    /// The /24 index in front of fp_fib4 (fp_config.fib4_dir), painted
    /// from `fib4` by the daemon's own fastpath_core::dir24.
    pub fib4_dir: bool,
    /// The multibit index in front of fp_fib6 (fp_config.fib6_dir), built
    /// from `fib6` by the daemon's own fastpath_core::dir6.
    pub fib6_dir: bool,
    /// Conntrack entries of the test's namespace, each the arguments of one
    /// `conntrack -I` (the table is flushed first when there are any).
    pub conntrack: Vec<String>,
}

impl World {
    pub fn new(a: u32, b: u32) -> Self {
        let up_fwd = (FP_IF_UP | FP_IF_FWD4 | FP_IF_FWD6) as u16;
        let iface = |mac, ifindex| fp_iface { mac, flags: up_fwd, mtu: 1500, mtu6: 1500, ifindex };
        World {
            a,
            b,
            ifaces: vec![(a, iface(MAC_A, a)), (b, iface(MAC_B, b))],
            slots: vec![(a, SLOT_A), (b, SLOT_B)],
            fib4: vec![
                (lpm4("192.0.2.0", 24), route(fp_route_type::FP_RT_FORWARD, NH_ONLINK_A)),
                (lpm4("192.0.2.1", 32), route(fp_route_type::FP_RT_LOCAL, 0)),
                (lpm4("198.51.100.0", 24), route(fp_route_type::FP_RT_FORWARD, NH_ONLINK_B)),
                (lpm4("198.51.100.254", 32), route(fp_route_type::FP_RT_LOCAL, 0)),
                (lpm4("203.0.113.0", 24), route(fp_route_type::FP_RT_FORWARD, NH_GW4)),
            ],
            fib6: vec![
                (lpm6("2001:db8:a::", 64), route(fp_route_type::FP_RT_FORWARD, NH_ONLINK_A)),
                (lpm6("2001:db8:a::1", 128), route(fp_route_type::FP_RT_LOCAL, 0)),
                (lpm6("2001:db8:b::", 64), route(fp_route_type::FP_RT_FORWARD, NH_ONLINK_B)),
                (lpm6("2001:db8:2::", 48), route(fp_route_type::FP_RT_FORWARD, NH_GW6)),
            ],
            nexthops: vec![
                (NH_GW4, gw_nh(b, AF_INET, &v4("198.51.100.1"))),
                (NH_ONLINK_A, gw_nh(a, 0, &[])),
                (NH_ONLINK_B, gw_nh(b, 0, &[])),
                (NH_GW6, gw_nh(b, AF_INET6, &v6("2001:db8:b::1"))),
                (NH_V4_VIA_V6, gw_nh(b, AF_INET6, &v6("fe80::d6"))),
            ],
            neigh: vec![
                (neigh_key(b, AF_INET, &v4("198.51.100.1")), neigh(MAC_GW4)),
                (neigh_key(b, AF_INET, &v4("198.51.100.7")), neigh(MAC_HOST_B)),
                (neigh_key(b, AF_INET6, &v6("2001:db8:b::1")), neigh(MAC_GW6)),
                (neigh_key(b, AF_INET6, &v6("fe80::d6")), neigh(MAC_GW6LL)),
                (neigh_key(a, AF_INET, &v4("192.0.2.10")), neigh(MAC_CLIENT)),
            ],
            groups: vec![],
            buckets: vec![],
            tx_ports: vec![a, b],
            src_deny4: vec![
                (v4("192.0.2.1"), fp_reason::FP_R_MARTIAN as u32),
                (v4("198.51.100.254"), fp_reason::FP_R_MARTIAN as u32),
            ],
            no_bloom: false,
            // Generation 0 is what an empty flow-cache way carries.
            rt: fp_runtime { generation: 1, ..Default::default() },
            stateful: false,
            flow_key_addrs: false,
            fib4_dir: false,
            fib6_dir: false,
            conntrack: vec![],
        }
    }

    /// The slot of a managed interface, 0 when it is not managed.
    pub fn slot(&self, ifindex: u32) -> u32 {
        if !self.ifaces.iter().any(|(i, _)| *i == ifindex) {
            return 0;
        }
        self.slots.iter().find(|(i, _)| *i == ifindex).map(|(_, s)| *s).unwrap_or(0)
    }

    pub fn set_slot(&mut self, ifindex: u32, slot: u32) {
        self.slots.retain(|(i, _)| *i != ifindex);
        self.slots.push((ifindex, slot));
    }

    pub fn iface_mut(&mut self, ifindex: u32) -> &mut fp_iface {
        &mut self.ifaces.iter_mut().find(|(i, _)| *i == ifindex).expect("iface in world").1
    }

    pub fn nexthop_mut(&mut self, id: u32) -> &mut fp_nexthop {
        &mut self.nexthops.iter_mut().find(|(i, _)| *i == id).expect("nexthop in world").1
    }

    /// Replaces the route for exactly this prefix, or adds it.
    pub fn set_route4(&mut self, key: fp_lpm4_key, rt: fp_route) {
        self.fib4.retain(|(k, _)| *k != key);
        self.fib4.push((key, rt));
    }

    pub fn set_route6(&mut self, key: fp_lpm6_key, rt: fp_route) {
        self.fib6.retain(|(k, _)| *k != key);
        self.fib6.push((key, rt));
    }

    /// Adds an ECMP group: hash-threshold (`n_buckets` 0) with these
    /// (upper bound, next hop) paths, or resilient with `n_buckets`.
    pub fn set_group(&mut self, id: u32, n_buckets: u16, paths: &[(i32, u32)]) {
        let kind = if n_buckets == 0 { fp_group_kind::FP_GRP_HASH_THRESHOLD } else { fp_group_kind::FP_GRP_RESILIENT };
        let mut g = fp_group { kind: kind as u8, n_paths: paths.len() as u8, n_buckets, ..Default::default() };
        for (slot, (upper_bound, nh_id)) in g.paths.iter_mut().zip(paths) {
            *slot = fp_group_path { upper_bound: *upper_bound, nh_id: *nh_id };
        }
        self.groups.retain(|(k, _)| *k != id);
        self.groups.push((id, g));
    }

    /// fp_fib4_dir, fp_fib4_dir16 and fp_fib4_vals for `fib4`, routes in
    /// their order (a later one of the same prefix replaces the earlier, as
    /// in the trie), from an all-NONE index as the daemon starts.
    fn paint_dir24(&self, skel: &XdpFwdSkel<'_>) -> Result<()> {
        let m = &skel.maps;
        let map_id = m.fp_fib4_dir.info().context("fp_fib4_dir info")?.info.id;
        let routes: Vec<u8> = self.fib4.iter().flat_map(|(k, v)| raw(k).iter().chain(raw(v)).copied().collect::<Vec<u8>>()).collect();
        DIR24_MEMO.with(|memo| -> Result<()> {
            let mut memo = memo.borrow_mut();
            let same = matches!(&*memo, Some(p) if p.map_id == map_id && p.routes == routes);
            if !same {
                let p = Painted::of(&self.fib4, map_id, routes);
                // Most cases of a test share their routes: the 32 MiB go
                // in once (reset leaves the index alone).
                with_dir24_mem(skel, |d| d.copy_from_slice(&p.mem.blocks))?;
                *memo = Some(p);
            }
            let p = memo.as_ref().expect("just set");
            for (slot, v) in &p.mem.vals {
                m.fp_fib4_vals.update(&u32::from(*slot).to_ne_bytes(), v, MapFlags::ANY).context("fp_fib4_vals")?;
            }
            let n = FP_DIR16_ELEMS;
            let keys: Vec<u8> = (0..n).flat_map(u32::to_ne_bytes).collect();
            let tops: Vec<u8> = p.mem.top.iter().flat_map(|e| e.to_ne_bytes()).collect();
            m.fp_fib4_dir16.update_batch(&keys, &tops, n, MapFlags::ANY, MapFlags::ANY).context("fp_fib4_dir16")
        })
    }

    pub fn apply(&self, skel: &XdpFwdSkel<'_>) -> Result<()> {
        let m = &skel.maps;
        for (k, v) in &self.ifaces {
            let v = fp_iface { flags: v.flags | FP_IF_PRESENT as u16, ..*v };
            m.fp_ifaces.update(&self.slot(*k).to_ne_bytes(), raw(&v), MapFlags::ANY).context("fp_ifaces")?;
        }
        for (k, v) in &self.fib4 {
            m.fp_fib4.update(raw(k), raw(v), MapFlags::ANY).context("fp_fib4")?;
        }
        if self.fib4_dir {
            self.paint_dir24(skel)?;
        }
        for (k, v) in &self.fib6 {
            m.fp_fib6.update(raw(k), raw(v), MapFlags::ANY).context("fp_fib6")?;
        }
        if self.fib6_dir {
            Dir6Mem::memo(&self.fib6).write(skel)?;
        }
        for (k, v) in &self.nexthops {
            // As the daemon writes them: the egress slot, 0 when not managed.
            let v = fp_nexthop { slot: self.slot(v.ifindex) as u16, ..*v };
            m.fp_nexthops.update(&k.to_ne_bytes(), raw(&v), MapFlags::ANY).context("fp_nexthops")?;
        }
        for (k, v) in &self.neigh {
            match k {
                NeighKey::V4(k) => m.fp_neigh4.update(raw(k), raw(v), MapFlags::ANY).context("fp_neigh4")?,
                NeighKey::V6(k) => m.fp_neigh6.update(raw(k), raw(v), MapFlags::ANY).context("fp_neigh6")?,
            }
        }
        for (k, v) in &self.groups {
            m.fp_groups.update(&k.to_ne_bytes(), raw(v), MapFlags::ANY).context("fp_groups")?;
        }
        for (k, v) in &self.buckets {
            m.fp_res_buckets.update(&k.to_ne_bytes(), &v.to_ne_bytes(), MapFlags::ANY).context("fp_res_buckets")?;
        }
        for ifindex in &self.tx_ports {
            // Without an fp_ifaces entry the program never gets as far as the devmap.
            let slot = self.slot(*ifindex);
            if slot == 0 {
                continue;
            }
            // struct bpf_devmap_val: ifindex, then a program fd (0: none).
            let mut val = [0u8; 8];
            val[..4].copy_from_slice(&ifindex.to_ne_bytes());
            m.fp_tx_ports.update(&slot.to_ne_bytes(), &val, MapFlags::ANY).context("fp_tx_ports")?;
        }
        let mut words = std::collections::BTreeMap::<u32, u64>::new();
        for (a, r) in &self.src_deny4 {
            m.fp_src_deny4.update(a, &r.to_ne_bytes(), MapFlags::ANY).context("fp_src_deny4")?;
            let bit = u32::from_ne_bytes(*a).wrapping_mul(FP_SRC_BLOOM_MUL) >> (32 - FP_SRC_BLOOM_BITS);
            *words.entry(bit / 64).or_default() |= 1u64 << (bit % 64);
        }
        if !self.no_bloom {
            for (w, v) in words {
                m.fp_src_bloom4.update(&w.to_ne_bytes(), &v.to_ne_bytes(), MapFlags::ANY).context("fp_src_bloom4")?;
            }
        }
        // A stateful case starts from exactly its own entries.
        if self.stateful || !self.conntrack.is_empty() {
            super::conntrack::flush()?;
            for entry in &self.conntrack {
                super::conntrack::insert(entry)?;
            }
        }
        // The daemon's way: the whole .bss as one value at key 0.
        m.bss.update(&0u32.to_ne_bytes(), raw(&self.rt), MapFlags::ANY).context(".bss (fp_rt)")?;
        Ok(())
    }
}

/// `f` on fp_fib4_dir's entries, mapped as the daemon maps them.
pub fn with_dir24_mem(skel: &XdpFwdSkel<'_>, f: impl FnOnce(&mut [u16])) -> Result<()> {
    with_mapped(&skel.maps.fp_fib4_dir, fastpath_core::dir24::BLOCKS, f).context("fp_fib4_dir")
}

/// `f` on the first `n` elements of an mmapable array map (T the size of
/// its values, a multiple of 8 as the kernel lays them out), mapped shared.
pub fn with_mapped<T: Copy, R>(map: &impl std::os::fd::AsFd, n: usize, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
    use std::os::fd::AsRawFd;
    let len = n * size_of::<T>();
    // SAFETY: maps `len` bytes of the map, shared; the kernel refuses more
    // than the map holds; unmapped below.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, map.as_fd().as_raw_fd(), 0)
    };
    anyhow::ensure!(p != libc::MAP_FAILED, "mapping {len} bytes: {}", std::io::Error::last_os_error());
    // SAFETY: page-aligned, `len` bytes, ours alone until unmapped (the
    // program only reads it, and runs only between our calls).
    let r = f(unsafe { std::slice::from_raw_parts_mut(p.cast::<T>(), n) });
    // SAFETY: exactly what mmap returned.
    unsafe { libc::munmap(p, len) };
    Ok(r)
}

/// An index painted by fastpath_core::dir24, and for which routes and map.
struct Painted {
    map_id: u32,
    routes: Vec<u8>,
    mem: fastpath_core::dir24::MemSink<[u8; size_of::<fp_route>()]>,
}

impl Painted {
    fn of(fib4: &[(fp_lpm4_key, fp_route)], map_id: u32, routes: Vec<u8>) -> Painted {
        use fastpath_core::dir24::{Dir24, MemSink};
        let mut mem = MemSink::new();
        let mut dir = Dir24::new(std::time::Duration::ZERO);
        let now = std::time::Instant::now();
        dir.sweep(&mut mem);
        for (k, v) in fib4 {
            let addr = u32::from_be_bytes(k.addr.to_ne_bytes());
            dir.upsert(addr, k.prefixlen as u8, raw(v).try_into().expect("an fp_route"), now, &mut mem);
        }
        Painted { map_id, routes, mem }
    }
}

thread_local! {
    /// What this thread last wrote into a program's fp_fib4_dir.
    static DIR24_MEMO: std::cell::RefCell<Option<Painted>> = const { std::cell::RefCell::new(None) };
}

/// A route value as fastpath_core::dir6 keeps it: the fp_route's bytes.
pub type Route6 = [u8; size_of::<fp_route>()];

/// fp_fib6_dir's buckets in these tests (fp_config.fib6_dir): room for a
/// few hundred routes' entries in the several versions a test leaves
/// resting as the daemon's quarantine does, so that no /16's entries are
/// refused (leaving it to the trie, untested); the tests check none is.
pub const DIR6_BUCKETS: u32 = 1 << 15;

/// fp_fib6_vals's slots in these tests: the daemon has FP_DIR6_VALS, but a
/// test's tables hold dozens of values, and zeroing 65535 of them at every
/// reset was a third of a case's time. A value past them finds no slot,
/// which the tests check never happens (`Usage::unslotted`).
pub const DIR6_VALS: u32 = 1024;

/// A bucket as the data path reads it (struct fp_dir6_bucket).
fn bucket_bytes(b: &[Slot; WAYS]) -> Vec<u8> {
    b.iter().flat_map(|s| raw(&fp_dir6_slot { hi: s.hi, tag: s.tag, entry: s.entry }).to_vec()).collect()
}

/// fp_fib6_dir16, fp_fib6_dir and fp_fib6_vals as fastpath_core::dir6
/// writes them for one table, collected first and written whole.
struct Dir6Mem {
    vals: std::collections::BTreeMap<u16, Route6>,
    buckets: VecBuckets,
    tops: Vec<u64>,
    /// `buckets` as fp_fib6_dir's bytes, once built (and `buckets` dropped).
    image: Vec<u8>,
}

impl Dir6Sink<Route6> for Dir6Mem {
    fn set_val(&mut self, slot: u16, v: &Route6) -> bool {
        self.vals.insert(slot, *v);
        true
    }
    fn put(&mut self, entries: &[(Key, u32)]) -> bool {
        entries.iter().all(|(k, e)| table::insert(&mut self.buckets, k, *e))
    }
    fn del(&mut self, keys: &[Key]) {
        for k in keys {
            table::remove(&mut self.buckets, k);
        }
    }
    fn set_top(&mut self, top: u16, word: u64) {
        self.tops[usize::from(top)] = word;
    }
}

impl Dir6Mem {
    /// The index of `fib6`, routes in their order (a later one of the same
    /// prefix replaces the earlier, as in the trie). Every /16 is built,
    /// not only those a route touches: a word never written (TRIE) would
    /// send its lookups to the trie and test nothing of the index.
    fn of(fib6: &[(fp_lpm6_key, fp_route)]) -> Dir6Mem {
        let mut mem = Dir6Mem {
            vals: Default::default(),
            buckets: VecBuckets::new(DIR6_BUCKETS as usize),
            tops: vec![u64::from(TRIE); TOPS],
            image: Vec::new(),
        };
        let mut dir = Dir6::new(std::time::Duration::ZERO);
        let now = std::time::Instant::now();
        for (k, v) in fib6 {
            let v: Route6 = raw(v).try_into().expect("an fp_route");
            dir.upsert(u128::from_be_bytes(k.addr), k.prefixlen as u8, v, now, &mut mem);
        }
        dir.mark_all();
        dir.flush(now, &mut mem);
        // A /16 whose entries found no room asks the trie: right, but untested.
        let u = dir.usage();
        assert!(u.trie_tops == 0 && u.unslotted == 0, "a world's table does not fit the index: {u:?}");
        mem.image = mem.buckets.0.iter().flat_map(bucket_bytes).collect();
        mem.buckets = VecBuckets::new(1);
        mem
    }

    /// `of`, computed once per table and thread: most cases of a test
    /// share their routes, and building all 65536 /16s costs milliseconds.
    fn memo(fib6: &[(fp_lpm6_key, fp_route)]) -> std::rc::Rc<Dir6Mem> {
        let routes: Vec<u8> = fib6.iter().flat_map(|(k, v)| raw(k).iter().chain(raw(v)).copied().collect::<Vec<u8>>()).collect();
        DIR6_MEMO.with(|memo| {
            let mut memo = memo.borrow_mut();
            match &*memo {
                Some((r, mem)) if *r == routes => mem.clone(),
                _ => {
                    let mem = std::rc::Rc::new(Dir6Mem::of(fib6));
                    *memo = Some((routes, mem.clone()));
                    mem
                }
            }
        })
    }

    /// Into maps the runner's reset left empty: values and entries before
    /// the top words that lead to them, as the daemon orders them. The two
    /// arrays through a mapping, as the daemon writes them: a batch update
    /// of the 65536 words took longer than the rest of a case.
    fn write(&self, skel: &XdpFwdSkel<'_>) -> Result<()> {
        let m = &skel.maps;
        for (slot, v) in &self.vals {
            m.fp_fib6_vals.update(&u32::from(*slot).to_ne_bytes(), v, MapFlags::ANY).context("fp_fib6_vals")?;
        }
        with_mapped(&m.fp_fib6_dir, self.image.len(), |d: &mut [u8]| d.copy_from_slice(&self.image)).context("fp_fib6_dir")?;
        with_mapped(&m.fp_fib6_dir16, self.tops.len(), |d: &mut [u64]| d.copy_from_slice(&self.tops)).context("fp_fib6_dir16")
    }
}

thread_local! {
    /// The last table `Dir6Mem::memo` built on this thread, and what it built.
    static DIR6_MEMO: std::cell::RefCell<Option<(Vec<u8>, std::rc::Rc<Dir6Mem>)>> = const { std::cell::RefCell::new(None) };
}

/// fastpath_core::dir6 writing into a loaded program's maps as it goes, in
/// the order it calls (each changed bucket, value and word at once): what
/// the daemon does between packets, for tests that change a table under a
/// live index. Starts from the empty maps of a reset.
pub struct Dir6Maps<'a> {
    skel: &'a XdpFwdSkel<'a>,
    /// What fp_fib6_dir holds: only this writes it.
    pub buckets: VecBuckets,
}

impl<'a> Dir6Maps<'a> {
    pub fn new(skel: &'a XdpFwdSkel<'a>) -> Self {
        Dir6Maps { skel, buckets: VecBuckets::new(DIR6_BUCKETS as usize) }
    }
}

impl Buckets for Dir6Maps<'_> {
    fn n_buckets(&self) -> usize {
        self.buckets.n_buckets()
    }
    fn slot(&self, bucket: usize, way: usize) -> Slot {
        self.buckets.slot(bucket, way)
    }
    fn fill(&mut self, bucket: usize, way: usize, s: Slot) {
        self.buckets.fill(bucket, way, s);
        let b = bucket_bytes(&self.buckets.0[bucket]);
        self.skel.maps.fp_fib6_dir.update(&(bucket as u32).to_ne_bytes(), &b, MapFlags::ANY).expect("fp_fib6_dir update");
    }
    fn clear(&mut self, bucket: usize, way: usize) {
        self.buckets.clear(bucket, way);
        let b = bucket_bytes(&self.buckets.0[bucket]);
        self.skel.maps.fp_fib6_dir.update(&(bucket as u32).to_ne_bytes(), &b, MapFlags::ANY).expect("fp_fib6_dir update");
    }
}

impl Dir6Sink<Route6> for Dir6Maps<'_> {
    fn set_val(&mut self, slot: u16, v: &Route6) -> bool {
        self.skel.maps.fp_fib6_vals.update(&u32::from(slot).to_ne_bytes(), v, MapFlags::ANY).is_ok()
    }
    fn put(&mut self, entries: &[(Key, u32)]) -> bool {
        entries.iter().all(|(k, e)| table::insert(self, k, *e))
    }
    fn del(&mut self, keys: &[Key]) {
        for k in keys {
            table::remove(self, k);
        }
    }
    fn set_top(&mut self, top: u16, word: u64) {
        let r = self.skel.maps.fp_fib6_dir16.update(&u32::from(top).to_ne_bytes(), &word.to_ne_bytes(), MapFlags::ANY);
        r.expect("fp_fib6_dir16 update");
    }
}
