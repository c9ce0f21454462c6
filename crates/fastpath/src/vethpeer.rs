//! Managed veths whose peer would drop what the fast path sends.
//!
//! A frame redirected out of a veth goes straight into its peer's NAPI
//! ring (veth_xdp_xmit), which exists only while the peer has an XDP
//! program or GRO on. Without one the kernel drops every redirected frame
//! (the veth's TX drops), where its own path would have delivered it: a
//! container's veth with default settings would be a black hole. So the
//! daemon checks every managed veth's peer and marks the veth
//! (FP_IF_PEER_NO_XDP) while the peer is not ready or cannot be checked:
//! what would leave by it goes to the kernel (`egress_peer_not_ready`).
//!
//! The checks are netlink and ioctl calls, no forked tools, so that a node
//! with hundreds of container veths can afford them every second. A peer
//! in another namespace is reached through sockets made inside it, found
//! by name in /run/netns (matched to the veth's `link_netnsid` with
//! RTM_GETNSID); one of those sockets follows the namespace's link events,
//! and a GRO change sends one (a FEATURE CHANGE RTM_NEWLINK), so a peer
//! losing GRO is seen in the round of the daemon's loop it wakes, not a period.
//! An XDP program put on or taken off a peer sends no event of the peer's
//! but a FEATURE CHANGE of our end (veth adjusts its GSO features), which
//! the socket in our own namespace sees. A peer in a namespace without a name (a Docker or LXC container's)
//! is read from here (IFLA_TARGET_NETNSID), which shows its XDP program;
//! for its GRO the namespace is entered through a process in it
//! (/proc/PID/ns/net), with a socket made for that one question: it gets no
//! events, the period finds its changes.
//!
//! A socket holds its namespace alive, so a namespace's sockets are closed
//! as soon as its name is gone or it holds no managed veth's peer any
//! more: a container's namespace deleted is freed (and its veths with it)
//! at the next check.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::Socket;

use crate::links::{self, LinkFacts};
use crate::nlraw::Events;

const NETNS_DIR: &str = "/run/netns";
const RTNLGRP_LINK: u32 = 1;
/// include/uapi/linux/ethtool.h: get the GRO flag (struct ethtool_value).
const ETHTOOL_GGRO: u32 = 0x2b;

/// A managed veth kept out of the fast path's egress, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub ifindex: u32,
    pub dev: String,
    pub why: String,
}

/// Sockets made in one namespace, which they stay bound to.
struct Space {
    /// The namespace's nsfs inode (dev, ino); (0, 0) for the daemon's own.
    id: (u64, u64),
    rt: Socket,
    events: Events,
    /// Any socket will do for the ethtool ioctl, which acts in its namespace.
    ethtool: OwnedFd,
}

impl Space {
    /// In the calling thread's namespace.
    fn here(id: (u64, u64)) -> Result<Space> {
        let events = Events::open(NETLINK_ROUTE, RTNLGRP_LINK, "veth peer link").context("following link events")?;
        Ok(Space { id, rt: links::socket()?, events, ethtool: ethtool_socket()? })
    }

    /// In the namespace named `name` (/run/netns).
    fn open(name: &str, id: (u64, u64)) -> Result<Space> {
        let file = File::open(format!("{NETNS_DIR}/{name}")).with_context(|| format!("opening namespace {name}"))?;
        inside(&file, &format!("namespace {name}"), || Space::here(id))
    }

    /// Whether `dev` has GRO on.
    fn gro(&self, dev: &str) -> Result<bool> {
        gro(&self.ethtool, dev)
    }
}

/// A socket for the ethtool ioctl, which acts in the namespace it was made in.
fn ethtool_socket() -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening a socket for ethtool");
    }
    // SAFETY: fd is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Runs `f` in a thread of its own inside the namespace open as `ns`, so
/// that the daemon's threads stay where they are.
fn inside<T: Send>(ns: &File, what: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).with_context(|| format!("entering {what}"))?;
            f()
        })
        .join()
        .map_err(|_| anyhow!("{what}: thread panicked"))?
    })
}

/// Whether `dev` in the namespace of socket `sock` has GRO on
/// (ETHTOOL_GGRO, as `ethtool -k` reads it).
fn gro(sock: &OwnedFd, dev: &str) -> Result<bool> {
    #[repr(C)]
    struct Value {
        cmd: u32,
        data: u32,
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut Value,
        _rest: [u8; 16],
    }
    if dev.len() >= libc::IFNAMSIZ {
        bail!("device name {dev} too long");
    }
    let mut v = Value { cmd: ETHTOOL_GGRO, data: 0 };
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], data: &mut v, _rest: [0; 16] };
    req.name[..dev.len()].copy_from_slice(dev.as_bytes());
    // SAFETY: req is a valid struct ifreq whose data points at v, both live across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("reading {dev}'s GRO (ETHTOOL_GGRO)"));
    }
    Ok(v.data != 0)
}

/// For each namespace without a name that a process is in, by the id ours
/// gives it: that process's /proc/PID/ns/net.
fn by_process(own: &Socket) -> HashMap<i32, PathBuf> {
    let mut out = HashMap::new();
    let mut seen = HashSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
        // Processes come and go while we look: whatever fails is skipped.
        let Ok(md) = std::fs::metadata(&path) else { continue };
        if !seen.insert((md.dev(), md.ino())) {
            continue;
        }
        let Ok(file) = File::open(&path) else { continue };
        if let Ok(Some(nsid)) = links::nsid_of(own, file.as_fd()) {
            out.insert(nsid, path);
        }
    }
    out
}

/// The current blocks, probed again every period, as soon as the managed
/// ports change (a reload adds a veth: it must be held from its first
/// table write, not from the next period), and on a link event in a
/// namespace holding a managed veth or its peer.
pub struct Watcher {
    current: Vec<Block>,
    ports: Vec<(String, u32)>,
    own: Option<Space>,
    /// By namespace name.
    spaces: HashMap<String, Space>,
    /// The ids our namespace gives the named ones, by their inodes.
    nsids: HashMap<(u64, u64), i32>,
}

impl Watcher {
    /// Probes `ports` now, before the first tables are written.
    pub fn new(ports: &[(String, u32)]) -> Self {
        let mut w = Watcher {
            current: Vec::new(),
            ports: ports.to_vec(),
            own: None,
            spaces: HashMap::new(),
            nsids: HashMap::new(),
        };
        w.current = w.probe(ports);
        w
    }

    /// Whether `refresh` probes without an event: on a period, or for
    /// ports other than those probed last.
    fn due(&self, period: bool, ports: &[(String, u32)]) -> bool {
        period || ports != self.ports.as_slice()
    }

    /// Probes again when due or told of a link change; true if the
    /// blocked veths or reasons changed.
    /// The link event sockets, which wake the daemon's loop (`refresh`
    /// drains them).
    pub fn wake_fds(&self, out: &mut Vec<RawFd>) {
        out.extend(self.own.iter().chain(self.spaces.values()).map(|s| s.events.fd()));
    }

    pub fn refresh(&mut self, period: bool, ports: impl FnOnce() -> Vec<(String, u32)>) -> bool {
        let mut evented = false;
        for s in self.own.iter_mut().chain(self.spaces.values_mut()) {
            evented |= s.events.drain();
        }
        let ports = ports();
        if !evented && !self.due(period, &ports) {
            return false;
        }
        let now = self.probe(&ports);
        self.ports = ports;
        let changed = now != self.current;
        self.current = now;
        changed
    }

    pub fn blocking(&self) -> &[Block] {
        &self.current
    }

    /// The managed veths (`ports`: name, ifindex) whose peer is not ready.
    fn probe(&mut self, ports: &[(String, u32)]) -> Vec<Block> {
        let block = |ifindex: u32, dev: &str, why: String| Block { ifindex, dev: dev.to_string(), why };
        let ours = match links::dump() {
            Ok(l) => l,
            // Nothing known about any port: the veths cannot be told apart, so
            // every port is held (only a veth needs it, but which is which?).
            Err(e) => return ports.iter().map(|(d, i)| block(*i, d, format!("cannot list links: {e:#}"))).collect(),
        };
        let veths: Vec<&LinkFacts> =
            ours.iter().filter(|l| l.veth && ports.iter().any(|(_, i)| *i == l.ifindex)).collect();
        if veths.is_empty() {
            self.own = None;
            self.spaces.clear();
            return Vec::new();
        }
        if self.own.is_none() {
            self.own = Space::here((0, 0)).map_err(|e| log::warn!("veth peer check: {e:#}")).ok();
        }
        let named = if veths.iter().any(|v| v.link_netnsid.is_some()) { self.named() } else { HashMap::new() };
        let (mut used, mut unnamed, mut failed) = (HashSet::new(), None, false);
        let blocks = veths
            .into_iter()
            .filter_map(|v| match self.peer_problem(v, &named, &mut used, &mut unnamed) {
                Ok(None) => None,
                Ok(Some(why)) => Some(block(v.ifindex, &v.name, why)),
                Err(e) => {
                    failed = true;
                    Some(block(v.ifindex, &v.name, format!("cannot check its peer: {e:#}")))
                }
            })
            .collect();
        self.spaces.retain(|name, _| used.contains(name));
        // A failed exchange may leave a reply behind that the next request
        // would take for its own: the next probe starts on new sockets.
        if failed {
            self.own = None;
            self.spaces.clear();
            self.nsids.clear();
        }
        blocks
    }

    /// The named namespaces by the id ours gives them, with their inodes.
    /// A name's inode is a live namespace (the name keeps it alive), whose
    /// id does not change: ids are asked once per inode, not every probe.
    fn named(&mut self) -> HashMap<i32, (String, (u64, u64))> {
        let (Some(own), Ok(dir)) = (&self.own, std::fs::read_dir(NETNS_DIR)) else {
            return HashMap::new();
        };
        let (mut out, mut ids) = (HashMap::new(), HashMap::new());
        for e in dir.flatten() {
            let Ok(name) = e.file_name().into_string() else { continue };
            let Ok(md) = std::fs::metadata(e.path()) else { continue };
            let id = (md.dev(), md.ino());
            let nsid = match self.nsids.get(&id) {
                Some(n) => Some(*n),
                None => File::open(e.path()).ok().and_then(|f| links::nsid_of(&own.rt, f.as_fd()).ok().flatten()),
            };
            if let Some(nsid) = nsid {
                ids.insert(id, nsid);
                out.insert(nsid, (name, id));
            }
        }
        self.nsids = ids;
        out
    }

    /// The sockets of namespace `name`, made again if the name now stands
    /// for another namespace.
    fn space(&mut self, name: &str, id: (u64, u64)) -> Result<&Space> {
        if self.spaces.get(name).is_none_or(|s| s.id != id) {
            self.spaces.remove(name);
            self.spaces.insert(name.to_string(), Space::open(name, id)?);
        }
        Ok(&self.spaces[name])
    }

    /// As `peer_problem`, for peer `index` in the namespace without a name
    /// that ours calls `nsid`.
    fn unnamed_peer_problem(
        &self,
        index: u32,
        nsid: i32,
        unnamed: &mut Option<HashMap<i32, PathBuf>>,
    ) -> Result<Option<String>> {
        let own = self.own.as_ref().ok_or_else(|| anyhow!("no socket in this namespace"))?;
        let Some(peer) = links::get_on(&own.rt, index, Some(nsid))? else {
            return Ok(Some("its peer was not found".into()));
        };
        if peer.xdp_native {
            return Ok(None);
        }
        let Some(path) = unnamed.get_or_insert_with(|| by_process(&own.rt)).get(&nsid) else {
            return Ok(Some(format!(
                "its peer {} is in a namespace without a name or process (nsid {nsid}): its GRO cannot be \
                 checked (name the namespace with `ip netns attach`, or give the peer an XDP program)",
                peer.name
            )));
        };
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let what = format!("the namespace of {}", path.display());
        if inside(&file, &what, || gro(&ethtool_socket()?, &peer.name))? {
            return Ok(None);
        }
        Ok(Some(format!(
            "its peer {} in {what} (nsid {nsid}, no name) has neither an XDP program nor GRO, so the kernel \
             would drop redirected frames (`ethtool -K {} gro on` there makes it fast)",
            peer.name, peer.name
        )))
    }

    /// Why the peer of `veth` cannot take XDP frames; None when it can.
    /// `used`: the namespaces whose sockets this check needed; `unnamed`:
    /// the namespaces without a name, looked for once per probe.
    fn peer_problem(
        &mut self,
        veth: &LinkFacts,
        named: &HashMap<i32, (String, (u64, u64))>,
        used: &mut HashSet<String>,
        unnamed: &mut Option<HashMap<i32, PathBuf>>,
    ) -> Result<Option<String>> {
        let Some(index) = veth.link else {
            return Ok(Some("its peer was not found".into()));
        };
        let (space, at) = match veth.link_netnsid {
            None => (self.own.as_ref().ok_or_else(|| anyhow!("no socket in this namespace"))?, String::new()),
            Some(nsid) => match named.get(&nsid) {
                Some((name, id)) => {
                    used.insert(name.clone());
                    (self.space(name, *id)?, format!(" in namespace {name}"))
                }
                None => return self.unnamed_peer_problem(index, nsid, unnamed),
            },
        };
        let Some(peer) = links::get_on(&space.rt, index, None)? else {
            return Ok(Some("its peer was not found".into()));
        };
        if peer.xdp_native || space.gro(&peer.name)? {
            return Ok(None);
        }
        Ok(Some(format!(
            "its peer {}{at} has neither an XDP program nor GRO, so the kernel would drop redirected frames \
             (`ethtool -K {} gro on` there makes it fast)",
            peer.name, peer.name
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_changed_port_set_is_probed_at_once() {
        let w = Watcher {
            current: Vec::new(),
            ports: vec![("r0".into(), 4), ("r1".into(), 5)],
            own: None,
            spaces: HashMap::new(),
            nsids: HashMap::new(),
        };
        let same = [("r0".to_string(), 4), ("r1".to_string(), 5)];
        assert!(!w.due(false, &same));
        assert!(w.due(true, &same));
        assert!(w.due(false, &[("r0".into(), 4), ("r1".into(), 5), ("veth7".into(), 9)]), "a port added");
        assert!(w.due(false, &[("r0".into(), 4), ("r1".into(), 6)]), "a device created again");
        assert!(w.due(false, &[("r0".into(), 4), ("wan".into(), 5)]), "a port renamed");
    }

    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("running ip");
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn gro(ns: &str, dev: &str, on: bool) {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "ethtool", "-K", dev, "gro", if on { "on" } else { "off" }])
            .output()
            .expect("running ethtool");
        assert!(out.status.success(), "ethtool: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Namespaces of this test, deleted whatever happens.
    struct Spaces(Vec<String>);

    impl Drop for Spaces {
        fn drop(&mut self) {
            for n in self.0.iter().rev() {
                let _ = Command::new("ip").args(["netns", "del", n]).stderr(std::process::Stdio::null()).status();
            }
        }
    }

    /// Router side in namespace "r", peer in "h": the watcher runs in "r"
    /// (a thread of its own), as a daemon there would.
    #[test]
    fn a_peer_is_checked_over_netlink_and_its_gro_change_is_an_event() {
        if !crate::bench::test_root("a_peer_is_checked_over_netlink_and_its_gro_change_is_an_event") {
            return;
        }
        let tag = format!("fpvp{}", std::process::id());
        let (r, h, u, q) = (format!("{tag}r"), format!("{tag}h"), format!("{tag}u"), format!("{tag}q"));
        let _spaces = Spaces(vec![r.clone(), h.clone(), u.clone(), q.clone()]);
        for n in [&r, &h, &u, &q] {
            ip(&["netns", "add", n]);
        }
        ip(&["-n", &r, "link", "add", "fpv6", "type", "veth", "peer", "name", "fpv7", "netns", &q]);
        // A process keeps q alive once its name is gone, as a container's does.
        let mut holder = Command::new("ip").args(["netns", "exec", &q, "sleep", "60"]).spawn().expect("sleep in q");
        struct Reap<'a>(&'a mut std::process::Child);
        impl Drop for Reap<'_> {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let holder = Reap(&mut holder);
        let pid = holder.0.id().to_string();
        ip(&["-n", &r, "link", "add", "fpv0", "type", "veth", "peer", "name", "fpv1", "netns", &h]);
        ip(&["-n", &r, "link", "add", "fpv2", "type", "veth", "peer", "name", "fpv3", "netns", &u]);
        ip(&["-n", &r, "link", "add", "fpv4", "type", "veth", "peer", "name", "fpv5"]);
        // A veth's GRO is off until asked for.
        gro(&h, "fpv1", false);
        let file = File::open(format!("{NETNS_DIR}/{r}")).unwrap();
        let (h2, u2, r2, q2) = (h.clone(), u.clone(), r.clone(), q.clone());
        std::thread::spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let dump = links::dump().unwrap();
            let idx = |n: &str| dump.iter().find(|l| l.name == n).unwrap().ifindex;
            let ports = vec![("fpv0".to_string(), idx("fpv0"))];
            let mut w = Watcher::new(&ports);
            assert_eq!(w.blocking().len(), 1, "{:?}", w.blocking());
            let why = &w.blocking()[0].why;
            assert!(why.contains(&format!("its peer fpv1 in namespace {h2} has neither")), "{why}");
            assert!(!w.refresh(false, || ports.clone()), "nothing changed, nothing due");

            gro(&h2, "fpv1", true);
            assert!(w.refresh(false, || ports.clone()), "the feature change's event probes at once");
            assert!(w.blocking().is_empty(), "{:?}", w.blocking());
            gro(&h2, "fpv1", false);
            assert!(w.refresh(false, || ports.clone()));
            assert_eq!(w.blocking().len(), 1);

            // An XDP program on the peer gives it NAPI, and taking it off
            // sends no event of the peer's own but a FEATURE CHANGE of our
            // end: also seen at once, not left to the period.
            {
                use fastpath_bpf::skel::xdp_pass::XdpPassSkelBuilder;
                use libbpf_rs::skel::{OpenSkel, SkelBuilder};
                let into = |ns: &str| {
                    let f = File::open(format!("{NETNS_DIR}/{ns}")).unwrap();
                    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                };
                let mut storage = std::mem::MaybeUninit::uninit();
                let skel = XdpPassSkelBuilder::default().open(&mut storage).unwrap().load().unwrap();
                into(&h2);
                let peer = links::dump().unwrap().iter().find(|l| l.name == "fpv1").unwrap().ifindex;
                let link = skel.progs.fp_bench_xdp_pass.attach_xdp(peer as i32);
                into(&r2);
                let link = link.unwrap();
                assert!(w.refresh(false, || ports.clone()), "the program put on is an event");
                assert!(w.blocking().is_empty(), "{:?}", w.blocking());
                drop(link);
                assert!(w.refresh(false, || ports.clone()), "the program taken off is an event");
                assert_eq!(w.blocking().len(), 1, "held again");
            }

            // A peer whose namespace lost its name: XDP visible, GRO not.
            // And a peer in the daemon's own namespace.
            let two = vec![
                ("fpv0".to_string(), idx("fpv0")),
                ("fpv2".to_string(), idx("fpv2")),
                ("fpv4".to_string(), idx("fpv4")),
            ];
            let keep = File::open(format!("{NETNS_DIR}/{u2}")).unwrap();
            gro(&u2, "fpv3", true);
            ip(&["netns", "del", &u2]);
            assert!(w.refresh(false, || two.clone()), "a port added");
            let b = w.blocking().iter().find(|b| b.dev == "fpv2").expect("fpv2 held");
            assert!(b.why.contains("without a name"), "{}", b.why);
            let b = w.blocking().iter().find(|b| b.dev == "fpv4").expect("fpv4 held");
            assert!(b.why.contains("its peer fpv5 has neither"), "{}", b.why);
            gro(&r2, "fpv5", true);
            assert!(w.refresh(false, || two.clone()), "an event in the daemon's own namespace");
            assert!(!w.blocking().iter().any(|b| b.dev == "fpv4"), "{:?}", w.blocking());
            assert_eq!(w.spaces.keys().collect::<Vec<_>>(), vec![&h2], "sockets only where a peer is checked");
            drop(keep);

            // A namespace without a name that a process is in: its GRO is
            // read through the process (no events from there: a period).
            let three = vec![("fpv0".to_string(), idx("fpv0")), ("fpv6".to_string(), idx("fpv6"))];
            let lost = |w: &Watcher| w.blocking().iter().find(|b| b.dev == "fpv6").map(|b| b.why.clone());
            ip(&["netns", "del", &q2]);
            assert!(w.refresh(false, || three.clone()), "a port added");
            let why = lost(&w).expect("fpv6 held while its peer has no GRO");
            assert!(why.contains("its peer fpv7 in the namespace of /proc/") && why.contains("has neither"), "{why}");
            let out = Command::new("nsenter")
                .args(["-t", &pid, "-n", "ethtool", "-K", "fpv7", "gro", "on"])
                .output()
                .expect("nsenter");
            assert!(out.status.success(), "nsenter: {}", String::from_utf8_lossy(&out.stderr));
            assert!(w.refresh(true, || three.clone()));
            assert_eq!(lost(&w), None, "{:?}", w.blocking());
        })
        .join()
        .unwrap();
        drop(holder);
    }
}
