//! The bench's own lab: generator – router – sink in three network namespaces
//! joined by two veth pairs, torn down on drop whatever happened; a third
//! pair, s1 – g1, takes the sink's frames back to the generator, whose
//! frames go round (gen.bpf.c).
//!
//! ```text
//!  gen ns            router ns                 sink ns
//!  g0 192.0.2.2 ── r0 192.0.2.1 | r1 198.51.100.1 ── s0 198.51.100.2
//!  g1 ─────────────────────────────────────────────── s1
//! ```
//!
//! An IPv6 lab (`fastpath bench --family 6`) adds 2001:db8:0:1::1/64 on r0
//! and 2001:db8:0:2::1/64 on r1, IPv6 forwarding, and the generator's and
//! sink's IPv6 addresses (::2 of each) as permanent neighbours; the
//! generator and sink themselves need none, as they never use their stack.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use nix::sched::{setns, CloneFlags};

use crate::api::fmt_mac;

pub const G0: &str = "g0";
pub const R0: &str = "r0";
pub const R1: &str = "r1";
pub const S0: &str = "s0";
/// The loop back from the sink (s1) to the generator (g1); no addresses.
pub const S1: &str = "s1";
pub const G1: &str = "g1";
/// A veth pair inside the generator namespace: the generator's spring, for
/// benches whose router drops the frames (gen.bpf.c), with two queues so
/// that each of two CPUs keeps a spring of its own; the DNS generator's
/// attachment that keeps it in the kernel's XDP dispatcher (dns.rs).
pub const GX0: &str = "gx0";
pub const GX1: &str = "gx1";

/// Fixed, locally administered MACs so the generator's template and the raw
/// forwarder's rewrite are known before anything is up.
pub const MAC_G0: [u8; 6] = [0x02, 0xfb, 0, 0, 0, 0x01];
pub const MAC_R0: [u8; 6] = [0x02, 0xfb, 0, 0, 1, 0x00];
pub const MAC_R1: [u8; 6] = [0x02, 0xfb, 0, 0, 1, 0x01];
pub const MAC_S0: [u8; 6] = [0x02, 0xfb, 0, 0, 2, 0x00];

pub const IP_G0: [u8; 4] = [192, 0, 2, 2];
pub const IP_S0: [u8; 4] = [198, 51, 100, 2];
pub const IP6_G0: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2];
pub const IP6_S0: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2];

/// The IP version of the bench's traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Family {
    /// IPv4/UDP (the default).
    #[default]
    #[value(name = "4", alias = "ipv4")]
    #[serde(rename = "ipv4")]
    V4,
    /// IPv6/UDP: the router gets IPv6 addresses, forwarding and neighbours.
    #[value(name = "6", alias = "ipv6")]
    #[serde(rename = "ipv6")]
    V6,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

pub struct Topology {
    pub gen: String,
    pub router: String,
    pub sink: String,
    /// What the lab routes: IPv4 always, IPv6 as well for `Family::V6`.
    pub family: Family,
    created: Vec<String>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Topology {
    /// Builds the lab under names unique to this process so parallel runs and
    /// leftovers of a crashed run never collide.
    pub fn create() -> Result<Self> {
        Self::create_tagged("")
    }

    /// As `create`, for one of several labs of one process: `suffix` tells them apart.
    pub fn create_tagged(suffix: &str) -> Result<Self> {
        Self::create_with(suffix, Family::V4)
    }

    /// As `create_tagged`, routing `family`'s traffic.
    pub fn create_tagged_for(suffix: &str, family: Family) -> Result<Self> {
        Self::create_with(suffix, family)
    }

    /// As `create`, routing `family`'s traffic.
    pub fn create_for(family: Family) -> Result<Self> {
        Self::create_with("", family)
    }

    fn create_with(suffix: &str, family: Family) -> Result<Self> {
        let tag = format!("fpbench{}{suffix}", std::process::id());
        let mut t = Topology {
            gen: format!("{tag}-gen"),
            router: format!("{tag}-rtr"),
            sink: format!("{tag}-sink"),
            family,
            created: Vec::new(),
        };
        for ns in [t.gen.clone(), t.router.clone(), t.sink.clone()] {
            ip(&["netns", "add", &ns])?;
            t.created.push(ns);
        }
        t.build().context("building the bench topology")?;
        if family == Family::V6 {
            t.build_v6().context("giving the bench topology IPv6")?;
        }
        Ok(t)
    }

    /// The router's half of an IPv6 lab. `nodad`: the addresses are usable
    /// at once, and no neighbour solicitation goes out during a measurement.
    fn build_v6(&self) -> Result<()> {
        let r = self.router.as_str();
        ip(&["-n", r, "addr", "add", "2001:db8:0:1::1/64", "dev", R0, "nodad"])?;
        ip(&["-n", r, "addr", "add", "2001:db8:0:2::1/64", "dev", R1, "nodad"])?;
        self.sysctl(r, "net/ipv6/conf/all/forwarding", "1")?;
        for (addr, mac, dev) in [(IP6_S0, MAC_S0, R1), (IP6_G0, MAC_G0, R0)] {
            let addr = std::net::Ipv6Addr::from(addr).to_string();
            ip(&["-n", r, "neigh", "replace", &addr, "lladdr", &fmt_mac(&mac), "dev", dev, "nud", "permanent"])?;
        }
        Ok(())
    }

    fn build(&self) -> Result<()> {
        let (g, r, s) = (self.gen.as_str(), self.router.as_str(), self.sink.as_str());
        // No IPv6 chatter (DAD, router solicitations) in a measurement.
        for ns in [g, s] {
            self.sysctl(ns, "net/ipv6/conf/all/disable_ipv6", "1")?;
            self.sysctl(ns, "net/ipv6/conf/default/disable_ipv6", "1")?;
        }
        ip(&[
            "-n",
            g,
            "link",
            "add",
            G0,
            "address",
            &fmt_mac(&MAC_G0),
            "type",
            "veth",
            "peer",
            "name",
            R0,
            "address",
            &fmt_mac(&MAC_R0),
            "netns",
            r,
        ])?;
        ip(&[
            "-n",
            r,
            "link",
            "add",
            R1,
            "address",
            &fmt_mac(&MAC_R1),
            "type",
            "veth",
            "peer",
            "name",
            S0,
            "address",
            &fmt_mac(&MAC_S0),
            "netns",
            s,
        ])?;

        ip(&[
            "-n", g, "link", "add", GX0, "numtxqueues", "2", "numrxqueues", "2", "type", "veth", "peer", "name", GX1,
            "numtxqueues", "2", "numrxqueues", "2",
        ])?;
        ip(&["-n", s, "link", "add", S1, "type", "veth", "peer", "name", G1, "netns", g])?;

        ip(&["-n", g, "addr", "add", "192.0.2.2/24", "dev", G0])?;
        ip(&["-n", r, "addr", "add", "192.0.2.1/24", "dev", R0])?;
        ip(&["-n", r, "addr", "add", "198.51.100.1/24", "dev", R1])?;
        ip(&["-n", s, "addr", "add", "198.51.100.2/24", "dev", S0])?;

        for k in ["all", "default", R0, R1] {
            self.sysctl(r, &format!("net/ipv4/conf/{k}/rp_filter"), "0")?;
            self.sysctl(r, &format!("net/ipv4/conf/{k}/forwarding"), "1")?;
        }
        // The loop carries the generator's frames only: no IPv6 autoconf
        // or ND of its own.
        for (ns, dev) in [(g, G1), (s, S1), (g, GX0), (g, GX1)] {
            self.sysctl(ns, &format!("net/ipv6/conf/{dev}/disable_ipv6"), "1")?;
        }
        for (ns, dev) in [(g, "lo"), (g, G0), (g, G1), (g, GX0), (g, GX1), (r, "lo"), (r, R0), (r, R1), (s, "lo"), (s, S0), (s, S1)] {
            ip(&["-n", ns, "link", "set", "dev", dev, "up"])?;
        }
        // Permanent neighbours: no ARP inside a measurement, and a usable NUD
        // state for fastpath to mirror.
        ip(&[
            "-n",
            r,
            "neigh",
            "replace",
            "198.51.100.2",
            "lladdr",
            &fmt_mac(&MAC_S0),
            "dev",
            R1,
            "nud",
            "permanent",
        ])?;
        ip(&[
            "-n",
            r,
            "neigh",
            "replace",
            "192.0.2.2",
            "lladdr",
            &fmt_mac(&MAC_G0),
            "dev",
            R0,
            "nud",
            "permanent",
        ])?;

        // Kernel mode has no XDP program on r0; a veth only accepts the
        // generator's XDP_TX frames when its peer has XDP or GRO, so GRO it is.
        let out = Command::new("ip")
            .args(["netns", "exec", r, "ethtool", "-K", R0, "gro", "on"])
            .output()
            .context("running ethtool")?;
        if !out.status.success() {
            bail!(
                "ethtool -K {R0} gro on: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn sysctl(&self, ns: &str, key: &str, value: &str) -> Result<()> {
        in_netns(ns, || {
            std::fs::write(format!("/proc/sys/{key}"), value).with_context(|| format!("sysctl {key}={value} in {ns}"))
        })?
    }

    pub fn ifindex(&self, ns: &str, dev: &str) -> Result<u32> {
        in_netns(ns, || {
            nix::net::if_::if_nametoindex(dev).with_context(|| format!("no {dev} in {ns}"))
        })?
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Deleting the namespaces removes the veths and everything attached.
        for ns in self.created.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                log::warn!("tearing down {ns}: {e:#}");
            }
        }
    }
}

pub fn netns_path(ns: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(ns)
}

/// Runs `f` with this thread inside network namespace `ns`, then returns the
/// thread to where it was (netlink, ifindex lookups and XDP attach all act on
/// the calling thread's namespace).
pub fn in_netns<T>(ns: &str, f: impl FnOnce() -> T) -> Result<T> {
    let home = File::open("/proc/thread-self/ns/net").context("opening own network namespace")?;
    let target = File::open(netns_path(ns)).with_context(|| format!("opening netns {ns}"))?;
    setns(&target, CloneFlags::CLONE_NEWNET).with_context(|| format!("entering netns {ns}"))?;
    let r = f();
    // Failing to return would leave the caller's later work in the wrong
    // namespace; nothing sensible can continue from there.
    if let Err(e) = setns(&home, CloneFlags::CLONE_NEWNET) {
        panic!("cannot return to the original network namespace: {e}");
    }
    Ok(r)
}

/// Moves the calling thread into `ns` for good (used by the generator thread).
pub fn enter_netns(ns: &str) -> Result<()> {
    let target = File::open(netns_path(ns)).with_context(|| format!("opening netns {ns}"))?;
    setns(&target, CloneFlags::CLONE_NEWNET).with_context(|| format!("entering netns {ns}"))
}
