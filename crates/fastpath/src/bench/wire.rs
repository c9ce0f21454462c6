//! NIC-like ingress for the connection-rate part: the hosts' TCP segments
//! reach the router's veths as XDP frames, as a NIC's receive ring hands
//! them over, instead of as the sending socket's own skbs.
//!
//! Why: a veth whose receiver has an XDP program must copy every skb a
//! local socket built (cloned for retransmission, too little headroom)
//! into a fresh page before the program may see it (`skb_pp_cow_data`).
//! That copy exists only between namespaces on one machine; a NIC's frames
//! are already in pages. Measured from the sockets directly, it charged
//! every XDP mode ~6 % of its connection rate that kernel-ct, with no
//! program on the router, never paid (`--ab xdp-pass`: 0.93-0.94x).
//!
//! ```text
//!  gen ns:  sockets -> hc0 ==veth== hc1 [raw_fwd: redirect] -> g0 ==veth== r0
//!  sink ns: server  -> hs0 ==veth== hs1 [raw_fwd: redirect] -> s0 ==veth== r1
//! ```
//!
//! The copy now happens once on the sending host's side (hc1, hs1), the
//! same in every mode; replies still arrive on g0 / s0 and are delivered
//! locally. Checksum offload is off on hc0 / hs0: a redirected frame
//! keeps whatever checksum the socket left in it.

use std::mem::MaybeUninit;

use anyhow::{Context, Result};
use libbpf_rs::OpenObject;

use super::ctlab;
use super::router::RawFwd;
use super::topo::{self, Topology};

const GEN_OUT: &str = "hc0";
const GEN_WIRE: &str = "hc1";
const SINK_OUT: &str = "hs0";
const SINK_WIRE: &str = "hs1";

/// Which way the hosts' segments enter the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ingress {
    /// As XDP frames, like a NIC's (this module).
    Frames,
    /// As the sockets' own skbs straight from g0 / s0 (veth's copy for XDP included).
    Skbs,
}

/// The two redirecting hops; on drop the hosts route through g0 / s0 again.
pub struct Wire<'obj> {
    topo: &'obj Topology,
    _gen: RawFwd<'obj>,
    _sink: RawFwd<'obj>,
}

struct Side<'a> {
    ns: &'a str,
    out: &'a str,
    wire: &'a str,
    lan: &'a str,
    /// The host's address, the far network and the router's address and MAC on this side.
    host: &'a str,
    far: &'a str,
    gw: &'a str,
    gw_mac: [u8; 6],
    host_mac: [u8; 6],
}

fn gen_side(t: &Topology) -> Side<'_> {
    Side {
        ns: t.gen.as_str(),
        out: GEN_OUT,
        wire: GEN_WIRE,
        lan: topo::G0,
        host: ctlab::GEN,
        far: "198.51.100.0/24",
        gw: "192.0.2.1",
        gw_mac: topo::MAC_R0,
        host_mac: topo::MAC_G0,
    }
}

fn sink_side(t: &Topology) -> Side<'_> {
    Side {
        ns: t.sink.as_str(),
        out: SINK_OUT,
        wire: SINK_WIRE,
        lan: topo::S0,
        host: ctlab::SINK,
        far: "192.0.2.0/24",
        gw: "198.51.100.1",
        gw_mac: topo::MAC_R1,
        host_mac: topo::MAC_S0,
    }
}

impl<'obj> Wire<'obj> {
    /// Builds both hops and moves the hosts' routes onto them.
    pub fn attach(
        gen_obj: &'obj mut MaybeUninit<OpenObject>,
        sink_obj: &'obj mut MaybeUninit<OpenObject>,
        t: &'obj Topology,
    ) -> Result<Self> {
        let gen = build(gen_obj, t, &gen_side(t)).context("building the generator's NIC-like hop")?;
        let sink = match build(sink_obj, t, &sink_side(t)) {
            Ok(s) => s,
            Err(e) => {
                drop(gen);
                restore(&gen_side(t));
                return Err(e.context("building the sink's NIC-like hop"));
            }
        };
        Ok(Wire {
            topo: t,
            _gen: gen,
            _sink: sink,
        })
    }
}

fn build<'obj>(obj: &'obj mut MaybeUninit<OpenObject>, t: &Topology, s: &Side<'_>) -> Result<RawFwd<'obj>> {
    let ns = s.ns;
    ctlab::run(ns, &["ip", "link", "add", s.out, "type", "veth", "peer", "name", s.wire])?;
    let fwd = hop(obj, t, s);
    if fwd.is_err() {
        let _ = ctlab::run(ns, &["ip", "link", "del", s.out]);
    }
    fwd
}

/// The hop's veth pair exists; everything else on it.
fn hop<'obj>(obj: &'obj mut MaybeUninit<OpenObject>, t: &Topology, s: &Side<'_>) -> Result<RawFwd<'obj>> {
    let ns = s.ns;
    for dev in [s.out, s.wire] {
        ctlab::run(ns, &["ip", "link", "set", "dev", dev, "up"])?;
    }
    ctlab::run(ns, &["ethtool", "-K", s.out, "tx", "off"])?;
    // Replies come back on the LAN veth although the route points at the
    // hop: no reverse-path filter may drop them.
    for k in ["all", "default", s.lan, s.out] {
        ctlab::run(ns, &["sysctl", "-qw", &format!("net.ipv4.conf.{k}.rp_filter=0")])?;
    }
    ctlab::run(ns, &[
        "ip", "neigh", "replace", s.gw, "lladdr", &crate::api::fmt_mac(&s.gw_mac), "dev", s.out, "nud", "permanent",
    ])?;
    let fwd = RawFwd::attach_in(obj, ns, t.ifindex(ns, s.wire)?, t.ifindex(ns, s.lan)?, s.gw_mac, s.host_mac, topo::Family::V4)?;
    ctlab::run(ns, &["ip", "route", "replace", s.far, "via", s.gw, "dev", s.out, "onlink", "src", s.host])?;
    Ok(fwd)
}

/// The side's hop gone, its host routes through its LAN veth again.
fn restore(s: &Side<'_>) {
    let _ = ctlab::run(s.ns, &["ip", "link", "del", s.out]);
    if let Err(e) = ctlab::run(s.ns, &["ip", "route", "replace", s.far, "via", s.gw, "dev", s.lan]) {
        log::warn!("restoring the route to {} in {}: {e:#}", s.far, s.ns);
    }
}

impl Drop for Wire<'_> {
    fn drop(&mut self) {
        restore(&gen_side(self.topo));
        restore(&sink_side(self.topo));
    }
}
