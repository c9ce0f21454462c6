//! `fastpath run --pin` and `fastpath detach`: forwarding that outlives the
//! daemon, and a restart that takes it over without a gap.
//!
//! Layout under the pin directory (a bpffs; /sys/fs/bpf/fastpath by
//! default). bpffs holds nothing but BPF objects and directories, so the
//! version stamp is the name of the one directory below it:
//!
//!   <pin-dir>/v1/maps/<map name>   every map but .rodata (per instance)
//!   <pin-dir>/v1/progs/<ifindex>   the program instance attached there
//!   <pin-dir>/v1/links/<ifindex>   its XDP bpf_link
//!
//! A restart (`run --pin` finding v1 pins) reuses the maps when every map
//! definition (type, key and value size, max_entries, flags) matches what
//! this binary would create, else refuses (or starts with fresh maps under
//! --replace). It then reads the tables back into the reconciler's shadow
//! instead of rewriting them blindly: the reconciler's ordering guarantees
//! (next hops before the routes that use them, ids never re-pointed while
//! referenced) hold only if it knows what the maps hold, and a fresh id
//! allocator would otherwise reuse ids the old routes still point at. The
//! first reconcile is thus the minimal, safely ordered diff, and removes
//! whatever the dead daemon left that the kernel no longer has. Meanwhile
//! the old programs keep forwarding on the same maps; last, each link is
//! switched to its new program with bpf_link_update (atomic, no detached
//! moment), and interfaces not asked for any more are detached.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use fastpath_core::desired::Ids;
use fastpath_core::reconcile::Reconciler;
use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::Skel;
use libbpf_rs::MapCore;
use log::{info, warn};

use crate::loader::{self, Attachment, Instance, LoadOpts, MapDef};
use crate::maps::{MapWriter, Maps};
use crate::preflight::Iface;
use crate::RunArgs;

pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/fastpath";
/// Bump when the meaning of a map changes without its sizes changing.
const LAYOUT: &str = "v1";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
const BPFFS_ROOT: &str = "/sys/fs/bpf";

#[derive(Debug, Clone, clap::Args)]
pub struct DetachArgs {
    /// Where `fastpath run --pin` pinned its objects.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

/// What a previous `run --pin` left, and where this run pins.
pub struct Pins {
    /// <pin-dir>/<LAYOUT>
    dir: PathBuf,
    /// Pinned maps by name, when they are reused (compatible, no --replace).
    maps: Option<BTreeMap<String, OwnedFd>>,
    /// Live pinned XDP links by ifindex.
    links: BTreeMap<u32, OwnedFd>,
    /// Interfaces the old maps served that this run does not: ifindex -> slot.
    retired: BTreeMap<u32, u32>,
}

/// bpffs refuses names with a dot (libbpf's internal maps are
/// `<object>.bss`): the pin name of a map, also the key of `Pins::maps`.
pub fn pin_name(map: &str) -> String {
    map.replace('.', "_")
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).with_context(|| format!("path {} contains a NUL byte", p.display()))
}

fn obj_get(p: &Path) -> Result<OwnedFd> {
    let c = cpath(p)?;
    // SAFETY: plain syscall wrapper on a NUL-terminated path we own.
    let fd = unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd)).with_context(|| format!("opening pinned {}", p.display()));
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn obj_pin(fd: BorrowedFd<'_>, p: &Path) -> Result<()> {
    let c = cpath(p)?;
    // SAFETY: plain syscall wrapper; the fd is valid for the call.
    let rc = unsafe { libbpf_sys::bpf_obj_pin(fd.as_raw_fd(), c.as_ptr()) };
    if rc < 0 {
        return Err(std::io::Error::from_raw_os_error(-rc)).with_context(|| format!("pinning {}", p.display()));
    }
    Ok(())
}

/// Pins `fd` at `p` unless the same object is pinned there already.
fn repin(fd: BorrowedFd<'_>, p: &Path) -> Result<()> {
    if let Ok(old) = obj_get(p) {
        if fdinfo(old.as_fd()).id() == fdinfo(fd).id() {
            return Ok(());
        }
    }
    remove_file(p)?;
    obj_pin(fd, p)
}

fn remove_file(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_context(|| format!("removing {}", p.display())),
        _ => Ok(()),
    }
}

/// The kernel's description of a BPF fd (/proc/self/fdinfo): which kind of
/// object it is and its ids, without a union to decode per kind.
#[derive(Debug, Default)]
struct FdInfo {
    fields: BTreeMap<String, String>,
}

fn fdinfo(fd: BorrowedFd<'_>) -> FdInfo {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap_or_default();
    let fields = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    FdInfo { fields }
}

impl FdInfo {
    fn num(&self, k: &str) -> Option<u32> {
        self.fields.get(k).and_then(|v| v.parse().ok())
    }
    fn is_link(&self) -> bool {
        self.fields.contains_key("link_type")
    }
    fn is_map(&self) -> bool {
        self.fields.contains_key("map_type")
    }
    /// The object's own id (link, map or program).
    fn id(&self) -> Option<u32> {
        self.num("link_id").or_else(|| self.num("map_id")).or_else(|| if self.is_link() { None } else { self.num("prog_id") })
    }
    /// XDP link: the device it is attached to, 0 once the device is gone
    /// or the link was detached.
    fn ifindex(&self) -> u32 {
        self.num("ifindex").unwrap_or(0)
    }
}

fn is_bpffs(p: &Path) -> bool {
    let Ok(c) = cpath(p) else { return false };
    // SAFETY: statfs fills the struct we own from a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// The pin directory must be on a bpffs; the usual one is mounted when a
/// minimal system has not.
fn ensure_bpffs(dir: &Path) -> Result<()> {
    let mut probe = dir;
    while !probe.exists() {
        probe = probe.parent().unwrap_or(Path::new("/"));
    }
    if is_bpffs(probe) {
        return Ok(());
    }
    if !dir.starts_with(BPFFS_ROOT) {
        bail!("pin directory {} is not on a bpffs (mount one, or use a directory under {BPFFS_ROOT})", dir.display());
    }
    std::fs::create_dir_all(BPFFS_ROOT).with_context(|| format!("creating {BPFFS_ROOT}"))?;
    let (src, target, fstype) = (CString::new("bpf")?, cpath(Path::new(BPFFS_ROOT))?, CString::new("bpf")?);
    // SAFETY: NUL-terminated strings we own; no mount data.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context(format!("mounting bpffs on {BPFFS_ROOT}"));
    }
    info!("mounted bpffs on {BPFFS_ROOT}");
    // `ip netns exec` and some service managers give a private mount
    // namespace: a bpffs mounted there dies with it, and the pins with it.
    let ns = |p: &str| std::fs::read_link(p).ok();
    if ns("/proc/self/ns/mnt") != ns("/proc/1/ns/mnt") {
        warn!(
            "running in a private mount namespace: the bpffs just mounted on {BPFFS_ROOT} (and every pin) goes away with this process; mount bpffs in the host's namespace or use --pin-dir on one"
        );
    }
    Ok(())
}

/// True if `ifindex`'s XDP program `prog_id` is the one our pinned link
/// holds: the interface is ours to take over, not someone else's.
pub fn owns_xdp(args: &RunArgs, ifindex: u32, prog_id: Option<u32>) -> bool {
    if !args.pin {
        return false;
    }
    let Ok(link) = obj_get(&args.pin_dir.join(LAYOUT).join("links").join(ifindex.to_string())) else {
        return false;
    };
    let fi = fdinfo(link.as_fd());
    fi.ifindex() == ifindex && prog_id.is_some_and(|p| fi.num("prog_id") == Some(p))
}

/// Files below `dir`, deepest first, then the directories themselves.
fn walk(dir: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            walk(&p, files, dirs)?;
            dirs.push(p);
        } else {
            files.push(p);
        }
    }
    Ok(())
}

/// What `remove_all` did.
#[derive(Debug, Default)]
struct Removed {
    links: Vec<String>,
    maps: usize,
    progs: usize,
}

/// Unpins everything under `dir` (any layout): links are detached first
/// (even if a process still holds them), devmap entries cleared, then maps
/// and programs unpinned, so that nothing keeps them alive.
fn remove_all(dir: &Path) -> Result<Removed> {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(dir, &mut files, &mut dirs)?;
    let mut out = Removed::default();
    let mut objs: Vec<(PathBuf, Option<OwnedFd>, FdInfo)> = files
        .into_iter()
        .map(|p| match obj_get(&p) {
            Ok(fd) => {
                let fi = fdinfo(fd.as_fd());
                (p, Some(fd), fi)
            }
            Err(_) => (p, None, FdInfo::default()),
        })
        .collect();
    // Links first: once they are gone no program runs on the maps.
    objs.sort_by_key(|(_, _, fi)| if fi.is_link() { 0 } else if fi.is_map() { 1 } else { 2 });
    for (p, fd, fi) in &objs {
        if let Some(fd) = fd {
            if fi.is_link() {
                let ifindex = fi.ifindex();
                // SAFETY: plain syscall wrapper on a link fd we own.
                let rc = unsafe { libbpf_sys::bpf_link_detach(fd.as_raw_fd()) };
                if rc < 0 && ifindex != 0 {
                    warn!("detaching link {}: {}", p.display(), std::io::Error::from_raw_os_error(-rc));
                }
                if ifindex != 0 {
                    out.links.push(ifname(ifindex));
                }
            } else if fi.is_map() {
                if fi.fields.get("map_type").is_some_and(|t| t == "14") {
                    clear_devmap(p);
                }
                out.maps += 1;
            } else {
                out.progs += 1;
            }
        }
        remove_file(p)?;
    }
    for d in dirs {
        std::fs::remove_dir(&d).with_context(|| format!("removing {}", d.display()))?;
    }
    Ok(out)
}

/// Deletes every entry of a devmap (BPF_MAP_TYPE_DEVMAP = 14), dropping
/// its references to the devices at once rather than when the map is freed.
fn clear_devmap(p: &Path) {
    let Ok(m) = libbpf_rs::MapHandle::from_pinned_path(p) else { return };
    let n = m.info().map(|i| i.info.max_entries).unwrap_or(0);
    for k in 0..n {
        let _ = m.delete(&k.to_ne_bytes());
    }
}

/// The name of `ifindex` in this network namespace (links do not say
/// which namespace their device is in: run detach where the daemon ran).
fn ifname(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: if_indextoname writes at most IF_NAMESIZE bytes into buf.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return format!("ifindex {ifindex}");
    }
    // SAFETY: on success buf holds a NUL-terminated name.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// `fastpath detach`.
pub fn detach(args: &DetachArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("must run as root (removes BPF objects)");
    }
    let dir = &args.pin_dir;
    let empty = std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(true);
    if empty {
        println!("nothing pinned under {}: no fastpath to detach", dir.display());
        if dir.exists() {
            let _ = std::fs::remove_dir(dir);
        }
        return Ok(());
    }
    let r = remove_all(dir)?;
    std::fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
    println!(
        "detached XDP from {}; removed {} programs and {} maps pinned under {}",
        if r.links.is_empty() { "no interface".to_string() } else { r.links.join(", ") },
        r.progs,
        r.maps,
        dir.display()
    );
    Ok(())
}

impl Pins {
    /// Finds what a previous `run --pin` left under --pin-dir. `ifaces` get
    /// the slots they had then (counters and next hops stay put); new ones
    /// get slots nobody used.
    pub fn open(args: &RunArgs, ifaces: &mut [Iface], caps: &fastpath_core::tables::Capacities, opts: &LoadOpts) -> Result<Pins> {
        ensure_bpffs(&args.pin_dir)?;
        std::fs::create_dir_all(&args.pin_dir).with_context(|| format!("creating {}", args.pin_dir.display()))?;
        let dir = args.pin_dir.join(LAYOUT);
        let others: Vec<String> = std::fs::read_dir(&args.pin_dir)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != LAYOUT)
            .collect();
        if !others.is_empty() {
            if !args.replace {
                bail!(
                    "{} holds pins of another layout ({}), this fastpath uses {LAYOUT}: run `fastpath detach --pin-dir {}` first, or start with --replace",
                    args.pin_dir.display(),
                    others.join(", "),
                    args.pin_dir.display()
                );
            }
            for o in &others {
                let p = args.pin_dir.join(o);
                warn!("--replace: removing pins of layout {o} (interfaces detached until attached again)");
                if p.is_dir() {
                    remove_all(&p)?;
                    std::fs::remove_dir(&p).with_context(|| format!("removing {}", p.display()))?;
                } else {
                    remove_file(&p)?;
                }
            }
        }
        let mut pins = Pins { dir, maps: None, links: BTreeMap::new(), retired: BTreeMap::new() };
        pins.open_links()?;
        pins.open_maps(args, caps, opts)?;
        pins.keep_slots(ifaces)?;
        Ok(pins)
    }

    fn open_links(&mut self) -> Result<()> {
        let d = self.dir.join("links");
        let Ok(rd) = std::fs::read_dir(&d) else { return Ok(()) };
        for e in rd {
            let p = e?.path();
            let fd = obj_get(&p)?;
            let fi = fdinfo(fd.as_fd());
            let named: Option<u32> = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok());
            // The device went away (and took the attachment with it).
            if !fi.is_link() || fi.ifindex() == 0 || named != Some(fi.ifindex()) {
                info!("dropping stale pin {}", p.display());
                remove_file(&p)?;
                continue;
            }
            self.links.insert(fi.ifindex(), fd);
        }
        Ok(())
    }

    fn open_maps(&mut self, args: &RunArgs, caps: &fastpath_core::tables::Capacities, opts: &LoadOpts) -> Result<()> {
        let d = self.dir.join("maps");
        let Ok(rd) = std::fs::read_dir(&d) else { return Ok(()) };
        let mut found = BTreeMap::new();
        for e in rd {
            let e = e?;
            found.insert(e.file_name().to_string_lossy().into_owned(), obj_get(&e.path())?);
        }
        if found.is_empty() {
            return Ok(());
        }
        let want = loader::map_defs(caps, opts)?;
        let mismatches = mismatches(&want, &found);
        if mismatches.is_empty() {
            info!("adopting {} pinned maps from {}", found.len(), d.display());
            self.maps = Some(found);
            return Ok(());
        }
        if !args.replace {
            bail!(
                "pinned maps under {} do not match this configuration: {}; start with the same table sizes, or pass --replace to start with fresh tables (or `fastpath detach` first)",
                d.display(),
                mismatches.join("; ")
            );
        }
        warn!("--replace: pinned maps incompatible ({}); starting with fresh tables", mismatches.join("; "));
        Ok(())
    }

    /// Slots in the old fp_ifaces: kept for interfaces managed again, and
    /// never handed to a new one (a next hop may still name them until
    /// the first reconcile).
    fn keep_slots(&mut self, ifaces: &mut [Iface]) -> Result<()> {
        if !self.maps.as_ref().is_some_and(|m| m.contains_key("fp_ifaces")) {
            return Ok(());
        }
        let m = libbpf_rs::MapHandle::from_pinned_path(self.dir.join("maps").join("fp_ifaces"))
            .context("opening pinned fp_ifaces")?;
        let mut old: BTreeMap<u32, u32> = BTreeMap::new();
        for slot in 1..intf_max_ifaces() {
            let Ok(Some(v)) = m.lookup(&slot.to_ne_bytes(), libbpf_rs::MapFlags::ANY) else { continue };
            let e: fastpath_bpf::intf::fp_iface = crate::maps::from_bytes(&v);
            if u32::from(e.flags) & fastpath_bpf::intf::FP_IF_PRESENT != 0 {
                old.insert(e.ifindex, slot);
            }
        }
        let used: BTreeSet<u32> = old.values().copied().collect();
        let mut next = 1;
        for i in ifaces.iter_mut() {
            i.slot = match old.get(&i.ifindex) {
                Some(s) => *s,
                None => {
                    while used.contains(&next) {
                        next += 1;
                    }
                    next += 1;
                    next - 1
                }
            };
        }
        if ifaces.iter().map(|i| i.slot).collect::<BTreeSet<_>>().len() != ifaces.len()
            || ifaces.iter().any(|i| i.slot >= intf_max_ifaces())
        {
            bail!("no free interface slot left in the pinned tables; `fastpath detach` and start again");
        }
        let managed: BTreeSet<u32> = ifaces.iter().map(|i| i.ifindex).collect();
        self.retired = old.into_iter().filter(|(k, _)| !managed.contains(k)).collect();
        Ok(())
    }

    /// The maps to load the programs on, if adopted.
    pub fn maps(&self) -> Option<&BTreeMap<String, OwnedFd>> {
        self.maps.as_ref()
    }

    /// Makes the reconciler, id allocators and writer continue from what
    /// the maps hold (see the module comment).
    pub fn adopt_tables(&self, maps: &Maps, r: &mut Reconciler, w: &mut MapWriter, ids: &mut Ids) -> Result<()> {
        if self.maps.is_none() {
            return Ok(());
        }
        let old = maps.read_back().context("reading the pinned tables back")?;
        w.adopt(&old, self.retired.clone());
        let mut fixed = 0;
        for (id, e) in &old.tables.nexthops {
            let written = old.nh_slots.get(id).copied().unwrap_or(0);
            if w.fix_nexthop_slot(*id, e, written).context("re-slotting a pinned next hop")? {
                fixed += 1;
            }
        }
        info!(
            "pinned tables: {} IPv4 and {} IPv6 routes, {} next hops ({fixed} re-slotted), {} neighbours, generation {}",
            old.tables.fib4.len(),
            old.tables.fib6.len(),
            old.tables.nexthops.len(),
            old.tables.neigh.len(),
            old.rt.generation
        );
        r.adopt(old.tables, old.rt.generation);
        ids.release_unused(r.applied());
        Ok(())
    }

    /// Pinned links to switch to the new programs, by ifindex.
    pub fn take_links(&mut self, wanted: &[Iface]) -> BTreeMap<u32, OwnedFd> {
        let keep: BTreeSet<u32> = wanted.iter().map(|i| i.ifindex).collect();
        let all = std::mem::take(&mut self.links);
        let (take, rest): (BTreeMap<_, _>, BTreeMap<_, _>) = all.into_iter().partition(|(k, _)| keep.contains(k));
        self.links = rest;
        take
    }

    /// After the take-over: pins what this run uses, detaches interfaces
    /// not asked for any more, and clears their devmap slots.
    pub fn commit(&mut self, first: &Instance, instances: &[Instance], att: &[Attachment], maps: &Maps) -> Result<()> {
        for sub in ["maps", "progs", "links"] {
            let d = self.dir.join(sub);
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        for m in first.skel.object().maps() {
            let name = m.name().to_string_lossy().into_owned();
            if name.ends_with(".rodata") {
                continue;
            }
            repin(m.as_fd(), &self.dir.join("maps").join(pin_name(&name)))?;
        }
        let mut pinned_ifaces = BTreeSet::new();
        for (i, a) in instances.iter().zip(att) {
            repin(i.attached_prog(a.hash).as_fd(), &self.dir.join("progs").join(i.ifindex.to_string()))?;
            repin(a.link_fd(), &self.dir.join("links").join(a.ifindex.to_string()))?;
            pinned_ifaces.insert(a.ifindex);
        }
        for (ifindex, link) in std::mem::take(&mut self.links) {
            // SAFETY: plain syscall wrapper on a link fd we own.
            let rc = unsafe { libbpf_sys::bpf_link_detach(link.as_raw_fd()) };
            if rc < 0 {
                warn!("detaching {}: {}", ifname(ifindex), std::io::Error::from_raw_os_error(-rc));
            }
            remove_file(&self.dir.join("links").join(ifindex.to_string()))?;
            info!("{}: not asked for this time, XDP detached", ifname(ifindex));
        }
        for (ifindex, slot) in std::mem::take(&mut self.retired) {
            if let Err(e) = maps.del_tx_port(slot) {
                log::debug!("devmap slot {slot} of ifindex {ifindex}: {e}");
            }
        }
        if let Ok(rd) = std::fs::read_dir(self.dir.join("progs")) {
            for e in rd.flatten() {
                let n: Option<u32> = e.file_name().to_str().and_then(|s| s.parse().ok());
                if !n.is_some_and(|n| pinned_ifaces.contains(&n)) {
                    remove_file(&e.path())?;
                }
            }
        }
        info!("pinned under {}: forwarding continues if the daemon stops (`fastpath detach` removes it)", self.dir.display());
        Ok(())
    }

    /// An interface a reload attached: pinned like the ones at start, so a
    /// restart takes it over.
    pub fn pin_iface(&self, inst: &Instance, att: &Attachment) -> Result<()> {
        repin(inst.attached_prog(att.hash).as_fd(), &self.dir.join("progs").join(att.ifindex.to_string()))?;
        repin(att.link_fd(), &self.dir.join("links").join(att.ifindex.to_string()))
    }

    /// An interface a reload dropped (or attached and rolled back): its
    /// pins go, so neither the link nor a restart keeps it.
    pub fn unpin_iface(&self, ifindex: u32) -> Result<()> {
        remove_file(&self.dir.join("links").join(ifindex.to_string()))?;
        remove_file(&self.dir.join("progs").join(ifindex.to_string()))
    }
}

fn intf_max_ifaces() -> u32 {
    fastpath_bpf::intf::FP_MAX_IFACES
}

/// Map flags the kernel adds on its own (BPF_F_RDONLY_PROG on devmaps).
const KERNEL_SET_FLAGS: u32 = libbpf_sys::BPF_F_RDONLY_PROG;

/// Every difference between the maps this binary would create and the
/// pinned ones, named.
fn mismatches(want: &[MapDef], found: &BTreeMap<String, OwnedFd>) -> Vec<String> {
    let mut out = Vec::new();
    for w in want {
        let Some(fd) = found.get(&pin_name(&w.name)) else {
            out.push(format!("map {} is not pinned", w.name));
            continue;
        };
        let info = match libbpf_rs::MapInfo::new(fd.as_fd()) {
            Ok(i) => i.info,
            Err(e) => {
                out.push(format!("map {}: {e}", w.name));
                continue;
            }
        };
        for (what, mine, theirs) in [
            ("type", w.map_type, info.type_),
            ("key size", w.key_size, info.key_size),
            ("value size", w.value_size, info.value_size),
            ("max_entries", w.max_entries, info.max_entries),
            // The kernel makes every devmap read-only for programs itself.
            ("flags", w.flags & !KERNEL_SET_FLAGS, info.map_flags & !KERNEL_SET_FLAGS),
        ] {
            if mine != theirs {
                out.push(format!("{} {what} is {theirs}, this run needs {mine}", w.name));
            }
        }
    }
    let names: BTreeSet<String> = want.iter().map(|w| pin_name(&w.name)).collect();
    for n in found.keys() {
        if !names.contains(n) {
            out.push(format!("map {n} is pinned but unknown to this fastpath"));
        }
    }
    out
}

