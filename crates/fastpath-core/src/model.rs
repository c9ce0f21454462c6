//! The kernel's forwarding state as fastpath mirrors it: what netlink and
//! /proc/sys told us, nothing derived. `desired` turns this into tables.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use serde::Serialize;

pub const RT_TABLE_MAIN: u32 = 254;
pub const RT_TABLE_LOCAL: u32 = 255;
pub const RT_TABLE_DEFAULT: u32 = 253;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    /// The FP_FAM_* bit of this family.
    pub fn bit(self) -> u32 {
        match self {
            Family::V4 => 1,
            Family::V6 => 2,
        }
    }
}

/// One network device (RTM_NEWLINK).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    pub ifindex: u32,
    pub name: String,
    /// IFLA_ADDRESS when it is a 6-byte Ethernet address.
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    /// IFF_UP set.
    pub admin_up: bool,
    /// IFF_RUNNING (carrier and operational) set.
    pub running: bool,
    /// ifi_type (ARPHRD_ETHER = 1, ARPHRD_LOOPBACK = 772, ...).
    pub arphrd: u16,
    /// IFLA_INFO_KIND ("veth", "vlan", "bridge", "bond", "vrf", ...).
    pub kind: Option<String>,
    /// IFLA_MASTER (bridge, bond or VRF this device is enslaved to).
    pub master: Option<u32>,
}

/// One interface address (RTM_NEWADDR).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Addr {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub prefix_len: u8,
}

/// rtm_type of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RouteKind {
    Unicast,
    Local,
    Broadcast,
    Anycast,
    Multicast,
    Blackhole,
    Unreachable,
    Prohibit,
    Throw,
    /// nat, xresolve, unspec, ...
    Other(u8),
}

/// One next hop as a route or a next-hop object carries it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct NextHop {
    /// RTA_OIF / rtnh_ifindex / NHA_OIF (0 if absent).
    pub ifindex: u32,
    /// RTA_GATEWAY / RTA_VIA / NHA_GATEWAY. May be of the other family (RFC 5549).
    pub gateway: Option<IpAddr>,
    /// rtm_flags / rtnh_flags / nhm_flags (RTNH_F_DEAD = 1, RTNH_F_LINKDOWN = 16, RTNH_F_ONLINK = 4, ...).
    pub flags: u32,
    /// rtnh_hops + 1 for multipath members, 1 otherwise.
    pub weight: u32,
}

/// Where a route sends its traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum RouteTarget {
    /// No next hop (local, blackhole, unreachable, ... routes).
    None,
    /// A single inline next hop.
    Single(NextHop),
    /// RTA_MULTIPATH with more than one member.
    Multipath(Vec<NextHop>),
    /// RTA_NH_ID: a next-hop object (or group) in `KernelState::nexthops`.
    Object(u32),
}

/// Identity of a route in the kernel (what replace/delete match on).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct RouteKey {
    pub table: u32,
    pub dst: IpAddr,
    pub prefix_len: u8,
    pub tos: u8,
    pub priority: u32,
}

/// One route (RTM_NEWROUTE), any table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    pub key: RouteKey,
    pub kind: RouteKind,
    pub target: RouteTarget,
    /// RTAX_MTU from RTA_METRICS (0 = none).
    pub mtu: u32,
    /// RTAX_LOCK has the MTU bit: learnt PMTU may apply to forwarded packets.
    pub mtu_locked: bool,
    /// RTA_ENCAP present (lwtunnel: MPLS, seg6, ...).
    pub encap: bool,
    /// IPv4 only: RTA_PREFSRC. When that address goes away the kernel
    /// flushes the route without a message (IPv6 routes keep theirs, the
    /// kernel just clears it: not kept, so the mirror never differs).
    pub prefsrc: Option<IpAddr>,
}

/// A next-hop object (RTM_NEWNEXTHOP, `ip nexthop`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NexthopObject {
    pub id: u32,
    pub blackhole: bool,
    /// For a plain next hop: its interface and gateway (weight 1).
    pub hop: Option<NextHop>,
    /// For a group: (member id, weight).
    pub group: Vec<(u32, u32)>,
    /// NHA_GROUP_TYPE resilient.
    pub resilient: bool,
    /// Resilient: NHA_RES_GROUP_BUCKETS (0 if not reported).
    pub n_buckets: u16,
    /// NHA_FDB, NHA_ENCAP or anything else we do not forward by.
    pub unsupported: bool,
}

/// One neighbour (RTM_NEWNEIGH), any NUD state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub mac: Option<[u8; 6]>,
    /// ndm_state (NUD_*).
    pub state: u16,
    /// ndm_flags (NTF_*).
    pub flags: u8,
}

pub const NUD_INCOMPLETE: u16 = 0x01;
pub const NUD_REACHABLE: u16 = 0x02;
pub const NUD_STALE: u16 = 0x04;
pub const NUD_DELAY: u16 = 0x08;
pub const NUD_PROBE: u16 = 0x10;
pub const NUD_FAILED: u16 = 0x20;
pub const NUD_NOARP: u16 = 0x40;
pub const NUD_PERMANENT: u16 = 0x80;
/// The states fastpath forwards to.
pub const NUD_USABLE: u16 = NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT;

/// One policy routing rule (RTM_NEWRULE).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Rule {
    pub family: Family,
    pub priority: u32,
    pub table: u32,
    /// FR_ACT_* (1 = to_tbl, 2 = goto, 3 = nop, 6 = blackhole, 7 = unreachable, 8 = prohibit).
    pub action: u8,
    /// Any selector present (from/to/iif/oif/fwmark/tos/ipproto/ports/uid/l3mdev/suppress_*...).
    pub has_selectors: bool,
    pub invert: bool,
}

/// Per-interface sysctls that change forwarding decisions (read from /proc/sys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IfSysctl {
    /// net.ipv4.conf.<dev>.forwarding
    pub forwarding4: bool,
    /// net.ipv6.conf.<dev>.forwarding
    pub forwarding6: bool,
    /// max(net.ipv4.conf.all.rp_filter, net.ipv4.conf.<dev>.rp_filter)
    pub rp_filter: u8,
    /// net.ipv6.conf.<dev>.mtu (0 if IPv6 is disabled on the device)
    pub mtu6: u32,
    /// net.ipv4.conf.<dev>.accept_local / route_localnet etc. are not forwarded by us.
    pub disable_ipv6: bool,
    /// net.ipv4.conf.<dev>.ignore_routes_with_linkdown (the kernel ORs it
    /// with `all`, see `GlobalSysctl::ignore_linkdown4_all`).
    pub ignore_linkdown4: bool,
    /// net.ipv6.conf.<dev>.ignore_routes_with_linkdown (writing `all`
    /// propagates to every device, so the device value is the one in force).
    pub ignore_linkdown6: bool,
}

/// Namespace-wide sysctls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GlobalSysctl {
    /// net.ipv6.conf.all.forwarding
    pub forwarding6_all: bool,
    /// net.ipv4.ip_forward_use_pmtu: learnt PMTU applies to forwarded IPv4 packets.
    pub ip_forward_use_pmtu: bool,
    /// net.ipv4.fib_multipath_hash_policy (0 L3, 1 L4, 2 inner L3, 3 custom).
    pub mp_policy4: u8,
    /// net.ipv6.fib_multipath_hash_policy.
    pub mp_policy6: u8,
    /// net.ipv4.fib_multipath_hash_fields: what policy 3 hashes
    /// (`mphash::FIELD_*`; the kernel's default when the sysctl is missing).
    pub mp_fields4: u32,
    /// net.ipv6.fib_multipath_hash_fields.
    pub mp_fields6: u32,
    /// net.ipv4.fib_multipath_hash_seed, the user seed both families use;
    /// 0 = the kernel's random seed (also when the sysctl does not exist).
    pub mp_seed: u32,
    /// net.ipv4.conf.all.ignore_routes_with_linkdown
    pub ignore_linkdown4_all: bool,
}

/// The routes by family and key. An IndexMap keeps its entries in one
/// dense vector (the pages past its last entry are never touched) and only
/// 8-byte indices in its hash table: with a full table (1.1M routes, 128 B
/// each) the daemon holds ~170 MB for it where a HashMap, whose 2^21
/// buckets of 128 B each were half empty, held 270 MB. Removal is
/// `swap_remove` (order means nothing here).
pub type RouteMap = indexmap::IndexMap<(Family, RouteKey), Route>;

/// Everything fastpath mirrors from one network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelState {
    pub links: BTreeMap<u32, Link>,
    pub addrs: BTreeMap<Addr, ()>,
    pub routes: RouteMap,
    pub nexthops: BTreeMap<u32, NexthopObject>,
    /// Resilient group id -> bucket index -> member next-hop id
    /// (RTM_NEWNEXTHOPBUCKET, dumped with RTM_GETNEXTHOPBUCKET).
    pub res_buckets: BTreeMap<u32, BTreeMap<u16, u32>>,
    pub neighbours: HashMap<(u32, IpAddr), Neighbour>,
    pub rules: Vec<Rule>,
    pub if_sysctl: BTreeMap<u32, IfSysctl>,
    pub sysctl: GlobalSysctl,
}
