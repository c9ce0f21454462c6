//! Managed veths whose peer would drop what the fast path sends.
//!
//! A frame redirected out of a veth goes straight into its peer's NAPI
//! ring (veth_xdp_xmit), which exists only while the peer has an XDP
//! program or GRO on. Without one the kernel drops every redirected frame
//! (the veth's TX drops), where its own path would have delivered it: a
//! container's veth with default settings would be a black hole. So the
//! daemon checks every managed veth's peer at start and every period, and
//! marks the veth (FP_IF_PEER_NO_XDP) while the peer is not ready or
//! cannot be checked: what would leave by it goes to the kernel
//! (`egress_peer_not_ready`). The peer may live in another namespace; it
//! is found through `ip netns list-id` (named namespaces, /run/netns).
//! A peer in a namespace without a name cannot be checked and stays
//! marked. Peers' settings send no event here: a peer's GRO turned off
//! while its veth is fast drops frames until the next period (1 s).

use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// A managed veth kept out of the fast path's egress, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub ifindex: u32,
    pub dev: String,
    pub why: String,
}

#[derive(Deserialize)]
struct LinkInfo {
    info_kind: Option<String>,
}

#[derive(Deserialize)]
struct Link {
    ifindex: u32,
    ifname: String,
    /// The peer's name, when it is in the same namespace.
    link: Option<String>,
    link_index: Option<u32>,
    link_netnsid: Option<i32>,
    linkinfo: Option<LinkInfo>,
    xdp: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct NsId {
    nsid: i32,
    name: Option<String>,
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    String::from_utf8(out.stdout).context("non-UTF-8 output")
}

/// `ip -d link show` in `ns` (None: the daemon's own).
fn links(ns: Option<&str>) -> Result<Vec<Link>> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let json = output(cmd.args(["-j", "-d", "link", "show"]))?;
    serde_json::from_str(&json).context("parsing `ip -j -d link show`")
}

/// Whether `dev` in `ns` has GRO on (`ethtool -k`).
fn gro_on(ns: Option<&str>, dev: &str) -> Result<bool> {
    let text = match ns {
        Some(ns) => output(Command::new("ip").args(["netns", "exec", ns, "ethtool", "-k", dev]))?,
        None => output(Command::new("ethtool").args(["-k", dev]))?,
    };
    parse_gro(&text).with_context(|| format!("no generic-receive-offload line in `ethtool -k {dev}`"))
}

fn parse_gro(ethtool_k: &str) -> Option<bool> {
    ethtool_k
        .lines()
        .find_map(|l| l.trim().strip_prefix("generic-receive-offload:"))
        .map(|v| v.trim().starts_with("on"))
}

/// Whether `ip -j`'s "xdp" object holds a native (driver mode) program:
/// only that gives a veth its NAPI ring; a generic-mode one does not.
fn native_xdp(xdp: &serde_json::Value) -> bool {
    const XDP_ATTACHED_DRV: u64 = 1;
    let drv = |v: &serde_json::Value| v.get("mode").and_then(|m| m.as_u64()) == Some(XDP_ATTACHED_DRV);
    drv(xdp) || xdp.get("attached").and_then(|a| a.as_array()).is_some_and(|a| a.iter().any(drv))
}

/// Why the peer of `veth` cannot take XDP frames; None when it can.
fn peer_problem(veth: &Link, names: &[NsId]) -> Result<Option<String>> {
    let ns = match veth.link_netnsid {
        None => None,
        Some(id) => match names.iter().find(|n| n.nsid == id).and_then(|n| n.name.clone()) {
            Some(name) => Some(name),
            None => return Ok(Some(format!("its peer is in a namespace without a name (nsid {id}): cannot check it"))),
        },
    };
    let peers = links(ns.as_deref())?;
    let peer = peers.iter().find(|p| match (veth.link_netnsid, veth.link_index, &veth.link) {
        (Some(_), Some(i), _) => p.ifindex == i,
        (None, _, Some(name)) => &p.ifname == name,
        _ => false,
    });
    let Some(peer) = peer else {
        return Ok(Some("its peer was not found".into()));
    };
    if peer.xdp.as_ref().is_some_and(native_xdp) || gro_on(ns.as_deref(), &peer.ifname)? {
        return Ok(None);
    }
    let at = ns.map(|n| format!(" in namespace {n}")).unwrap_or_default();
    Ok(Some(format!(
        "its peer {}{at} has neither an XDP program nor GRO, so the kernel would drop redirected frames \
         (`ethtool -K {} gro on` there makes it fast)",
        peer.ifname, peer.ifname
    )))
}

/// The managed veths (`ports`: name, ifindex) whose peer is not ready.
pub fn probe(ports: &[(String, u32)]) -> Vec<Block> {
    let block = |ifindex: u32, dev: &str, why: String| Block { ifindex, dev: dev.to_string(), why };
    let ours = match links(None) {
        Ok(l) => l,
        // Nothing known about any port: the veths cannot be told apart, so
        // every port is held (only a veth needs it, but which is which?).
        Err(e) => return ports.iter().map(|(d, i)| block(*i, d, format!("cannot list links: {e:#}"))).collect(),
    };
    let veths: Vec<&Link> = ours
        .iter()
        .filter(|l| ports.iter().any(|(_, i)| *i == l.ifindex))
        .filter(|l| l.linkinfo.as_ref().and_then(|k| k.info_kind.as_deref()) == Some("veth"))
        .collect();
    if veths.is_empty() {
        return Vec::new();
    }
    let names: Vec<NsId> = output(Command::new("ip").args(["-j", "netns", "list-id"]))
        .ok()
        .and_then(|j| serde_json::from_str(&j).ok())
        .unwrap_or_default();
    veths
        .into_iter()
        .filter_map(|v| match peer_problem(v, &names) {
            Ok(None) => None,
            Ok(Some(why)) => Some(block(v.ifindex, &v.ifname, why)),
            Err(e) => Some(block(v.ifindex, &v.ifname, format!("cannot check its peer: {e:#}"))),
        })
        .collect()
}

/// The current blocks, probed again every period and as soon as the
/// managed ports change (a reload adds a veth: it must be held from its
/// first table write, not from the next period).
pub struct Watcher {
    current: Vec<Block>,
    ports: Vec<(String, u32)>,
}

impl Watcher {
    /// Probes `ports` now, before the first tables are written.
    pub fn new(ports: &[(String, u32)]) -> Self {
        Watcher { current: probe(ports), ports: ports.to_vec() }
    }

    /// Whether `refresh` probes: on a period, or for ports other than those
    /// probed last.
    fn due(&self, period: bool, ports: &[(String, u32)]) -> bool {
        period || ports != self.ports.as_slice()
    }

    /// Probes again when due; true if the blocked veths or reasons changed.
    pub fn refresh(&mut self, period: bool, ports: impl FnOnce() -> Vec<(String, u32)>) -> bool {
        let ports = ports();
        if !self.due(period, &ports) {
            return false;
        }
        let now = probe(&ports);
        self.ports = ports;
        let changed = now != self.current;
        self.current = now;
        changed
    }

    pub fn blocking(&self) -> &[Block] {
        &self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_port_set_is_probed_at_once() {
        let w = Watcher { current: Vec::new(), ports: vec![("r0".into(), 4), ("r1".into(), 5)] };
        let same = [("r0".to_string(), 4), ("r1".to_string(), 5)];
        assert!(!w.due(false, &same));
        assert!(w.due(true, &same));
        assert!(w.due(false, &[("r0".into(), 4), ("r1".into(), 5), ("veth7".into(), 9)]), "a port added");
        assert!(w.due(false, &[("r0".into(), 4), ("r1".into(), 6)]), "a device created again");
        assert!(w.due(false, &[("r0".into(), 4), ("wan".into(), 5)]), "a port renamed");
    }

    #[test]
    fn gro_state_from_ethtool_k() {
        let on = "Features for s0:\nrx-checksumming: on\ngeneric-receive-offload: on\nlarge-receive-offload: off [fixed]\n";
        let off = "Features for s0:\ngeneric-receive-offload: off\n";
        assert_eq!(parse_gro(on), Some(true));
        assert_eq!(parse_gro(off), Some(false));
        assert_eq!(parse_gro("Features for s0:\n"), None);
    }

    #[test]
    fn link_json_of_a_veth_in_another_namespace() {
        let json = r#"[{"ifindex":2,"link_index":3,"ifname":"r1","flags":["UP"],"link_netnsid":0,
            "linkinfo":{"info_kind":"veth"}},{"ifindex":1,"ifname":"lo"},
            {"ifindex":4,"ifname":"s0","link":"r9","xdp":{"mode":1,"prog":{"id":7}},"linkinfo":{"info_kind":"veth"}}]"#;
        let l: Vec<Link> = serde_json::from_str(json).unwrap();
        assert_eq!((l[0].link_index, l[0].link_netnsid), (Some(3), Some(0)));
        assert!(l[1].linkinfo.is_none() && l[1].xdp.is_none());
        assert_eq!(l[2].link.as_deref(), Some("r9"));
        assert!(l[2].xdp.as_ref().is_some_and(native_xdp));
        let generic: serde_json::Value = serde_json::from_str(r#"{"mode":2,"prog":{"id":9}}"#).unwrap();
        let multi: serde_json::Value =
            serde_json::from_str(r#"{"mode":3,"attached":[{"mode":2,"prog":{"id":9}},{"mode":1,"prog":{"id":7}}]}"#).unwrap();
        assert!(!native_xdp(&generic) && native_xdp(&multi));
        // A peer in a namespace nobody named cannot be checked: held.
        let why = peer_problem(&l[0], &[NsId { nsid: 0, name: None }]).unwrap().unwrap();
        assert!(why.contains("without a name"), "{why}");
    }
}
