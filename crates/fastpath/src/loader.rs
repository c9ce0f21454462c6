//! Loads one instance of the forwarding program per interface (its own
//! .rodata config, every table shared with the first instance) with the
//! capacities asked for, and attaches them through bpf_links. At start the
//! tables are created first, by an object with no program, and the
//! instances then load side by side: each load is a whole verifier run
//! (~2 s for a stateful instance on the development VM), and one after the
//! other they made a start take that times the number of ports. Dropping an
//! `Attachment` closes its link, which detaches the program unless `pin`
//! pinned it (`fastpath run --pin`).

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf;
use fastpath_bpf::skel::xdp_fwd::{XdpFwdSkel, XdpFwdSkelBuilder};
use fastpath_core::tables::Capacities;
use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, OpenObject, PrintLevel};

use crate::links::{self, XdpAttach};
use crate::preflight::Iface;
use crate::XdpMode;

/// Loads that are only probes (the device-bound variant, which many
/// devices refuse), counted since they run in parallel: libbpf's
/// complaints meanwhile are debug output, the caller says in one line what
/// it concluded. (libbpf's callback cannot tell whose load a line is
/// from, so a plain load's warning during a probe is demoted too.)
static PROBING: AtomicUsize = AtomicUsize::new(0);

/// libbpf's own messages go through `log` like everything else.
pub fn bridge_libbpf_log() {
    fn print(level: PrintLevel, msg: String) {
        let msg = msg.trim_end();
        match level {
            PrintLevel::Warn if PROBING.load(Ordering::Relaxed) > 0 => log::debug!(target: "libbpf", "{msg}"),
            PrintLevel::Warn => log::warn!(target: "libbpf", "{msg}"),
            PrintLevel::Info => log::info!(target: "libbpf", "{msg}"),
            PrintLevel::Debug => log::debug!(target: "libbpf", "{msg}"),
        }
    }
    let level = if log::log_enabled!(target: "libbpf", log::Level::Debug) { PrintLevel::Debug } else { PrintLevel::Info };
    libbpf_rs::set_print(Some((level, print)));
}

/// Flow-cache and RX-hash settings fixed at load.
#[derive(Debug, Clone, Copy)]
pub struct LoadOpts {
    /// fp_flows sets per CPU (a power of two), 0 = no cache.
    pub flow_sets: u32,
    /// Try the device-bound variant (RX metadata: the NIC's hash, a
    /// stripped VLAN tag).
    pub nic_hash: bool,
    /// Ask virtual devices (veth) for their RX hash too (`--rx-hash nic`).
    pub nic_hash_virtual: bool,
    /// Stateful mode (fp_config.stateful): the conntrack gate and its
    /// per-flow verdict cache (fp_ct_flows, sized like fp_flows). Without a
    /// flow cache it stays correct, looking conntrack up for every packet.
    pub stateful: bool,
    /// AF_XDP data path (fp_config.afxdp): forwarded packets go to the
    /// user-space forwarder (crate::afxdp) instead of the devmap.
    pub afxdp: bool,
    /// `--flow-key addresses` (fp_config.flow_key_addrs).
    pub flow_key_addrs: bool,
    /// fp_ct_icmp's keys (two per ICMP echo entry; 1 when stateless).
    pub ct_icmp_keys: u32,
    /// The /24 index in front of fp_fib4 (fp_config.fib4_dir; `--fib4-index`).
    pub fib4_dir: bool,
    /// The multibit index in front of fp_fib6 (fp_config.fib6_dir; `--fib6-index`).
    pub fib6_dir: bool,
}

/// fp_fib6_dir's buckets for an IPv6 FIB of `fib6` routes: eight slots a
/// route, a power of two (a full table's mix takes about five entries a
/// route: a /44 is 16 /48 blocks, a /33 128 /40s; two-choice buckets fill
/// well past half before one refuses). A /16 whose entries do not fit
/// sends its lookups to the trie.
pub fn fib6_dir_buckets(fib6: u32) -> u32 {
    let slots = u64::from(fib6) * 8;
    (slots / intf::FP_DIR6_WAYS as u64).next_power_of_two().clamp(1024, 1 << 26) as u32
}

/// Sets per CPU for at least `entries` flows: FP_FLOW_WAYS per set, a
/// power of two of sets.
pub fn flow_sets(entries: u32) -> u32 {
    if entries == 0 {
        return 0;
    }
    entries.div_ceil(intf::FP_FLOW_WAYS).next_power_of_two()
}

/// Where an instance's flow hash comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HashVariant {
    /// Device-bound program asking the driver (bpf_xdp_metadata_rx_hash),
    /// falling back per packet to a metadata hint or software.
    NicRxHash,
    /// Device-bound program (stripped VLAN tags) on a virtual device: its
    /// RX hash would be a software one, so a metadata hint or software.
    DeviceBound,
    /// Metadata hint when an upstream program left one, else software.
    MetaOrSoftware,
}

impl HashVariant {
    pub fn name(self) -> &'static str {
        match self {
            HashVariant::NicRxHash => "nic rx-hash",
            HashVariant::DeviceBound => "meta hint / software (device-bound)",
            HashVariant::MetaOrSoftware => "meta hint / software",
        }
    }
}

/// One loaded program instance, bound to one interface's config.
pub struct Instance {
    pub ifindex: u32,
    pub name: String,
    pub hash: HashVariant,
    /// Stateful or AF_XDP: the plain entry point with the general path
    /// inlined (fp_xdp_fwd_full); the device-bound one serves every mode.
    full: bool,
    // Field order is drop order: the skeleton before the object it borrows.
    pub skel: XdpFwdSkel<'static>,
    _obj: Box<MaybeUninit<OpenObject>>,
}

impl Instance {
    /// The program attached as variant `v`.
    pub fn attached_prog(&self, v: HashVariant) -> &libbpf_rs::Program<'_> {
        self.prog(v)
    }

    /// The entry point of a variant. A device-bound instance has only the
    /// device-bound one loaded (see `open_one`).
    fn prog(&self, v: HashVariant) -> &libbpf_rs::Program<'_> {
        let p = &self.skel.progs;
        match (v, self.full) {
            (HashVariant::NicRxHash | HashVariant::DeviceBound, _) => &p.fp_xdp_fwd_hw,
            (HashVariant::MetaOrSoftware, false) => &p.fp_xdp_fwd,
            (HashVariant::MetaOrSoftware, true) => &p.fp_xdp_fwd_full,
        }
    }
}

/// A real NIC fills skb->hash from the same RX hash the program reads; a
/// virtual device (veth: no `device` link in sysfs) computes it on demand
/// (skb_get_hash, only for frames that came as skbs).
fn hash_is_skb_hash(name: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(name).join("device").exists()
}

/// A map as this binary would create it, to compare with a pinned one.
#[derive(Debug, Clone)]
pub struct MapDef {
    pub name: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

/// Every shared map (all but .rodata) as `load_all` would create it.
pub fn map_defs(caps: &Capacities, opts: &LoadOpts) -> Result<Vec<MapDef>> {
    let mut obj: Box<MaybeUninit<OpenObject>> = Box::new(MaybeUninit::uninit());
    let mut open = XdpFwdSkelBuilder::default().open(&mut obj).context("opening the XDP program")?;
    size_maps(&mut open, caps, opts)?;
    Ok(open
        .open_object_mut()
        .maps()
        .filter(|m| !m.name().to_string_lossy().ends_with(".rodata"))
        .map(|m| MapDef {
            name: m.name().to_string_lossy().into_owned(),
            map_type: m.map_type() as u32,
            key_size: m.key_size(),
            value_size: m.value_size(),
            max_entries: m.max_entries(),
            flags: m.map_flags(),
        })
        .collect())
}

/// Where an instance's shared maps come from.
enum Share<'a> {
    /// Another loaded object's: the map holder's at start, a running
    /// instance's on a reload.
    Skel(&'a XdpFwdSkel<'a>),
    /// Pinned by a previous daemon (checked compatible by `pin`).
    Pinned(&'a BTreeMap<String, OwnedFd>),
}

fn size_maps(open: &mut fastpath_bpf::skel::xdp_fwd::OpenXdpFwdSkel<'_>, caps: &Capacities, opts: &LoadOpts) -> Result<()> {
    let flows = if opts.flow_sets == 0 {
        1
    } else {
        fastpath_bpf::flow_cache_entries(opts.flow_sets).map_err(anyhow::Error::msg).context("sizing the flow cache")?
    };
    let sizes = [
        (&mut open.maps.fp_fib4, caps.fib4, "fp_fib4"),
        // Its entries are a subset of fib4's /32s plus our own addresses;
        // the reconciler falls back to src_lpm when they do not fit.
        (&mut open.maps.fp_src_deny4, caps.fib4, "fp_src_deny4"),
        (&mut open.maps.fp_fib6, caps.fib6, "fp_fib6"),
        (&mut open.maps.fp_nexthops, caps.nexthops, "fp_nexthops"),
        (&mut open.maps.fp_groups, caps.groups, "fp_groups"),
        (&mut open.maps.fp_res_buckets, caps.buckets, "fp_res_buckets"),
        // One map per family, each big enough for every neighbour: the
        // reconciler counts both families against caps.neigh together.
        (&mut open.maps.fp_neigh4, caps.neigh, "fp_neigh4"),
        (&mut open.maps.fp_neigh6, caps.neigh, "fp_neigh6"),
        // An array map needs at least one entry even with the cache off.
        (&mut open.maps.fp_flows, flows, "fp_flows"),
        // Parallel to fp_flows; never touched (one entry) when stateless.
        (&mut open.maps.fp_ct_flows, if opts.stateful { flows } else { 1 }, "fp_ct_flows"),
        (&mut open.maps.fp_ct_icmp, opts.ct_icmp_keys, "fp_ct_icmp"),
        // 32 MiB and 1 MiB: one entry each unless asked for.
        (&mut open.maps.fp_fib4_dir, if opts.fib4_dir { intf::FP_DIR24_ELEMS } else { 1 }, "fp_fib4_dir"),
        (&mut open.maps.fp_fib4_dir16, if opts.fib4_dir { intf::FP_DIR16_ELEMS } else { 1 }, "fp_fib4_dir16"),
        (&mut open.maps.fp_fib4_vals, if opts.fib4_dir { intf::FP_DIR24_VALS } else { 1 }, "fp_fib4_vals"),
        // 512 KiB, 768 KiB, and hash entries allocated as used.
        (&mut open.maps.fp_fib6_dir16, if opts.fib6_dir { intf::FP_DIR6_TOPS } else { 1 }, "fp_fib6_dir16"),
        (&mut open.maps.fp_fib6_vals, if opts.fib6_dir { intf::FP_DIR6_VALS } else { 1 }, "fp_fib6_vals"),
        (&mut open.maps.fp_fib6_dir, if opts.fib6_dir { fib6_dir_buckets(caps.fib6) } else { 1 }, "fp_fib6_dir"),
    ];
    for (map, n, name) in sizes {
        if n == 0 {
            bail!("{name}: capacity must be at least 1");
        }
        map.set_max_entries(n).with_context(|| format!("sizing {name} to {n} entries"))?;
    }
    Ok(())
}

/// Opens one instance: tables sized from `caps`, config for `iface`, and
/// every map but .rodata reused from `share`.
fn open_one(iface: &Iface, caps: &Capacities, opts: &LoadOpts, variant: HashVariant, share: Share<'_>) -> Result<Instance> {
    let mut obj: Box<MaybeUninit<OpenObject>> = Box::new(MaybeUninit::uninit());
    // SAFETY: the skeleton borrows the boxed object; the box never moves its
    // contents and `Instance` drops the skeleton before the box (field order).
    let obj_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *(obj.as_mut() as *mut _) };
    let mut open = XdpFwdSkelBuilder::default().open(obj_ref).context("opening the XDP program")?;
    size_maps(&mut open, caps, opts)?;
    let cfg = &mut open.maps.rodata_data.as_deref_mut().context("the program has no .rodata")?.fp_cfg;
    cfg.ingress_ifindex = iface.ifindex;
    cfg.ingress_slot = iface.slot;
    cfg.flow_sets = opts.flow_sets;
    cfg.stateful = u32::from(opts.stateful);
    cfg.afxdp = u32::from(opts.afxdp);
    cfg.flow_key_addrs = u32::from(opts.flow_key_addrs);
    cfg.fib4_dir = u32::from(opts.fib4_dir);
    cfg.fib6_dir = if opts.fib6_dir { fib6_dir_buckets(caps.fib6) } else { 0 };
    cfg.nic_hash_is_skb_hash = u32::from(hash_is_skb_hash(&iface.name));
    cfg.nic_rx_hash = u32::from(variant == HashVariant::NicRxHash);
    // Only the one entry point this instance attaches: each load is a full
    // verifier run (seconds on a busy box), and a device-bound instance's
    // plain replacement is needed only when the kernel refuses to attach
    // it; attach_all loads that then.
    let full = opts.stateful || opts.afxdp;
    let bound = variant != HashVariant::MetaOrSoftware;
    let p = &mut open.progs;
    for (prog, used) in [
        (&mut p.fp_xdp_fwd, !bound && !full),
        (&mut p.fp_xdp_fwd_hw, bound),
        (&mut p.fp_xdp_fwd_full, !bound && full),
    ] {
        prog.set_autoload(used);
        if used && bound {
            prog.set_ifindex(iface.ifindex);
            prog.set_flags(libbpf_sys::BPF_F_XDP_DEV_BOUND_ONLY);
        }
    }
    for mut m in open.open_object_mut().maps_mut() {
        let name = m.name().to_string_lossy().into_owned();
        if name.ends_with(".rodata") {
            continue;
        }
        match &share {
            Share::Skel(first) => {
                let src = first
                    .object()
                    .maps()
                    .find(|f| f.name() == m.name())
                    .with_context(|| format!("map {name} missing from the first instance"))?;
                m.reuse_fd(src.as_fd()).with_context(|| format!("sharing map {name}"))?;
            }
            Share::Pinned(maps) => {
                let fd = maps.get(&crate::pin::pin_name(&name)).with_context(|| format!("map {name} is not pinned"))?;
                m.reuse_fd(fd.as_fd()).with_context(|| format!("reusing pinned map {name}"))?;
            }
        }
    }
    let skel = open.load().with_context(|| format!("loading the XDP program for {}", iface.name))?;
    Ok(Instance { ifindex: iface.ifindex, name: iface.name.clone(), hash: variant, full, skel, _obj: obj })
}

/// The plain (meta hint / software hash) instance for `iface`, sharing the
/// maps of `first`: what replaces a device-bound instance the kernel
/// refused to attach.
pub fn load_plain(iface: &Iface, caps: &Capacities, opts: &LoadOpts, first: &Instance) -> Result<Instance> {
    open_one(iface, caps, opts, HashVariant::MetaOrSoftware, Share::Skel(&first.skel))
}

/// Loads one instance per interface, all sharing one set of maps: those a
/// previous daemon pinned (`pinned`, checked compatible) or else new ones,
/// created first by an object with no program. The instances load in
/// parallel (`load_parallel`); what did load when one failed is dropped
/// again: nothing is attached yet.
/// With `opts.nic_hash`, each interface first tries the device-bound
/// variant and falls back to the plain one when the kernel refuses it
/// (no metadata support, generic mode).
pub fn load_all(
    ifaces: &[Iface],
    caps: &Capacities,
    opts: &LoadOpts,
    pinned: Option<&BTreeMap<String, OwnedFd>>,
) -> Result<Vec<Instance>> {
    let holder = match pinned {
        Some(p) => Err(p),
        None => Ok(MapHolder::load(caps, opts)?),
    };
    let share = || match &holder {
        Ok(h) => Share::Skel(&h.skel),
        Err(p) => Share::Pinned(p),
    };
    load_parallel(ifaces, caps, opts, &share)
}

/// `load_one` for each of `ifaces`, as many at a time as there are CPUs
/// (each verifier run holds its own states in memory), in their order; the
/// first error in that order once every load has ended.
fn load_parallel<'a, F: Fn() -> Share<'a> + Sync>(
    ifaces: &[Iface],
    caps: &Capacities,
    opts: &LoadOpts,
    share: &F,
) -> Result<Vec<Instance>> {
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out: Vec<Instance> = Vec::with_capacity(ifaces.len());
    for batch in ifaces.chunks(at_once) {
        let loaded: Vec<Result<Instance>> = std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|iface| s.spawn(move || load_one(iface, caps, opts, share)))
                .collect();
            handles
                .into_iter()
                .zip(batch)
                .map(|(h, iface)| {
                    h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("loading the XDP program for {}: the loader thread panicked", iface.name)))
                })
                .collect()
        });
        for inst in loaded {
            out.push(inst?);
        }
    }
    Ok(out)
}

/// Every map of the program, created by loading the object with none of
/// its programs: what the instances of a fresh start share. Dropped once
/// they are loaded; each instance holds its own descriptors of the maps.
struct MapHolder {
    // Field order is drop order: the skeleton before the object it borrows.
    skel: XdpFwdSkel<'static>,
    _obj: Box<MaybeUninit<OpenObject>>,
}

impl MapHolder {
    fn load(caps: &Capacities, opts: &LoadOpts) -> Result<Self> {
        let mut obj: Box<MaybeUninit<OpenObject>> = Box::new(MaybeUninit::uninit());
        // SAFETY: as in open_one.
        let obj_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *(obj.as_mut() as *mut _) };
        let mut open = XdpFwdSkelBuilder::default().open(obj_ref).context("opening the XDP program")?;
        size_maps(&mut open, caps, opts)?;
        let p = &mut open.progs;
        for prog in [&mut p.fp_xdp_fwd, &mut p.fp_xdp_fwd_hw, &mut p.fp_xdp_fwd_full] {
            prog.set_autoload(false);
        }
        let skel = open.load().context("creating the program's maps")?;
        Ok(MapHolder { skel, _obj: obj })
    }
}

/// The instances for interfaces added by a reload, sharing the maps of
/// `first` (any running instance), each chosen as `load_all` would, loaded
/// side by side as there.
pub fn load_more(ifaces: &[Iface], caps: &Capacities, opts: &LoadOpts, first: &Instance) -> Result<Vec<Instance>> {
    load_parallel(ifaces, caps, opts, &|| Share::Skel(&first.skel))
}

fn load_one<'a>(iface: &Iface, caps: &Capacities, opts: &LoadOpts, share: &dyn Fn() -> Share<'a>) -> Result<Instance> {
    if !opts.nic_hash {
        return open_one(iface, caps, opts, HashVariant::MetaOrSoftware, share());
    }
    let variant = if opts.nic_hash_virtual || hash_is_skb_hash(&iface.name) {
        HashVariant::NicRxHash
    } else {
        HashVariant::DeviceBound
    };
    PROBING.fetch_add(1, Ordering::Relaxed);
    let probe = open_one(iface, caps, opts, variant, share());
    PROBING.fetch_sub(1, Ordering::Relaxed);
    match probe {
        Ok(i) => Ok(i),
        Err(e) => {
            log::info!("{}: no device-bound RX-hash program ({e:#}); using the plain one", iface.name);
            open_one(iface, caps, opts, HashVariant::MetaOrSoftware, share())
        }
    }
}

/// One interface the program is attached to.
pub struct Attachment {
    pub ifindex: u32,
    pub name: String,
    /// What the kernel actually did (native or generic).
    pub mode: XdpAttach,
    pub hash: HashVariant,
    link: OwnedFd,
}

impl Attachment {
    pub fn link_fd(&self) -> BorrowedFd<'_> {
        self.link.as_fd()
    }

    /// The device went away under the link: the kernel detached it (a
    /// device created again under the name, even with the same ifindex,
    /// starts without a program).
    pub fn defunct(&self) -> bool {
        // SAFETY: a plain C struct, zero is a valid value of every field.
        let mut info: libbpf_sys::bpf_link_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&info) as u32;
        // SAFETY: `info` has `len` writable bytes; the fd is our own link's.
        let rc = unsafe { libbpf_sys::bpf_link_get_info_by_fd(self.link.as_raw_fd(), &mut info, &mut len) };
        // SAFETY: an XDP link's info is the union's xdp member.
        rc == 0 && info.type_ == libbpf_sys::BPF_LINK_TYPE_XDP && unsafe { info.__bindgen_anon_1.xdp.ifindex } == 0
    }

    /// Detaches now, whoever else holds the link (a pin): a reload that
    /// drops the interface.
    pub fn detach(self) -> std::io::Result<()> {
        // SAFETY: plain syscall wrapper on a link fd we own.
        let rc = unsafe { libbpf_sys::bpf_link_detach(self.link.as_raw_fd()) };
        if rc < 0 {
            return Err(std::io::Error::from_raw_os_error(-rc));
        }
        Ok(())
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // Debug only: a refused start must print nothing but its one error line.
        log::debug!("detaching XDP from {} (link fd {})", self.name, self.link.as_raw_fd());
    }
}

/// Attaches each instance to its interface, or none: on any failure the
/// links made so far are dropped (detached) before the error is returned.
/// An interface in `takeover` (a pinned link of a previous daemon) gets
/// its program swapped atomically in that link instead: no moment without
/// a program, and the link keeps its mode.
/// `plain(k, first)` loads the plain instance for `instances[k]` (see
/// `load_plain`); it replaces a device-bound instance that does not attach.
pub fn attach_all(
    instances: &mut [Instance],
    mode: XdpMode,
    mut takeover: BTreeMap<u32, OwnedFd>,
    plain: &dyn Fn(usize, &Instance) -> Result<Instance>,
) -> Result<Vec<Attachment>> {
    let flags = match mode {
        XdpMode::Auto => 0,
        XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
        XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
    };
    let mut done: Vec<Attachment> = Vec::new();
    for k in 0..instances.len() {
        let old = takeover.remove(&instances[k].ifindex);
        let attach = |prog: &libbpf_rs::Program<'_>| match &old {
            Some(link) => update_link(link, prog.as_fd().as_raw_fd()).and_then(|()| link.try_clone()),
            None => link_xdp(prog.as_fd().as_raw_fd(), instances[k].ifindex, flags),
        };
        let mut res = attach(instances[k].prog(instances[k].hash));
        if let (Err(e), HashVariant::NicRxHash | HashVariant::DeviceBound) = (&res, instances[k].hash) {
            log::info!("{}: device-bound RX-hash program not attachable ({e}); using the plain one", instances[k].name);
            let replacement = plain(k, &instances[0])?;
            res = attach(replacement.prog(HashVariant::MetaOrSoftware));
            instances[k] = replacement;
        }
        let i = &instances[k];
        let hash = i.hash;
        if old.is_some() && res.is_ok() {
            log::info!("{}: took over the pinned XDP link (program swapped in place)", i.name);
        }
        let link = res.map_err(|e| {
            let why = match (e.raw_os_error(), mode) {
                (Some(libc::EOPNOTSUPP), XdpMode::Native) => {
                    "the driver has no native XDP (use --xdp-mode auto or generic)".to_string()
                }
                (Some(libc::EBUSY) | Some(libc::EEXIST), _) => "another XDP program got attached meanwhile".to_string(),
                // The program takes frames in pieces (xdp.frags); a driver
                // without multi-buffer XDP still needs each frame in one buffer.
                (Some(libc::ERANGE), _) => {
                    format!("{e}: its MTU is too large for this driver's XDP (no multi-buffer support); lower it")
                }
                _ => e.to_string(),
            };
            anyhow::anyhow!("attaching XDP to {}: {why}", i.name)
        })?;
        done.push(Attachment { ifindex: i.ifindex, name: i.name.clone(), mode: XdpAttach::None, hash, link });
    }

    let facts = links::dump().context("querying XDP attach mode")?;
    for a in &mut done {
        a.mode = facts.iter().find(|f| f.ifindex == a.ifindex).map(|f| f.xdp).unwrap_or(XdpAttach::None);
        match (a.mode, mode) {
            (XdpAttach::Generic, XdpMode::Auto) => {
                log::warn!("{}: driver has no native XDP, running in generic mode (much slower)", a.name)
            }
            (XdpAttach::None, _) => bail!("{}: XDP link created but the kernel reports no program attached", a.name),
            _ => log::info!("{}: XDP attached in {} mode", a.name, a.mode.name()),
        }
    }
    Ok(done)
}

/// Swaps the program of an XDP link (bpf_link_update: one pointer
/// exchange in the kernel, the device never runs without a program).
fn update_link(link: &OwnedFd, prog_fd: i32) -> std::io::Result<()> {
    // SAFETY: plain syscall wrapper; null opts = unconditional update.
    let rc = unsafe { libbpf_sys::bpf_link_update(link.as_raw_fd(), prog_fd, std::ptr::null()) };
    if rc < 0 {
        return Err(std::io::Error::from_raw_os_error(-rc));
    }
    Ok(())
}

/// bpf_link_create(BPF_XDP) with explicit mode flags, which
/// `Program::attach_xdp` does not take.
pub(crate) fn link_xdp(prog_fd: i32, ifindex: u32, flags: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: an all-zero bpf_link_create_opts is the documented "no options"
    // value (null pointers, zero counts); we then set its size and flags.
    let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.flags = flags;
    // SAFETY: plain syscall wrapper; opts lives across the call.
    let fd = unsafe { libbpf_sys::bpf_link_create(prog_fd, ifindex as i32, libbpf_sys::BPF_XDP, &opts) };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: libbpf returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
