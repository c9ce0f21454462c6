//! Netlink messages -> model types. Pure functions: no sockets here, so every
//! decision can be unit-tested with messages built by netlink-packet-route.
//!
//! netlink-packet-route 0.34 has no next-hop object or netconf messages, so
//! those are decoded from raw attributes. When the typed parser rejects a
//! route message (an attribute it does not know how to read), we still need
//! the route's key: a route we silently dropped would let a less specific one
//! forward its traffic, so such routes are kept as opaque punt entries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NlasIterator, ParseableParametrized, NLA_TYPE_MASK};
use netlink_packet_route::{
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage},
    route::{
        RouteAddress, RouteAttribute, RouteFlags, RouteLwEnCapType, RouteMessage, RouteMetric,
        RouteNextHop, RouteType, RouteVia,
    },
    rule::{RuleAttribute, RuleFlags, RuleMessage},
    AddressFamily, RouteNetlinkMessage,
};

use crate::model::{
    Addr, Family, Link, Neighbour, NextHop, NexthopObject, Route, RouteKey, RouteKind, RouteTarget,
    Rule,
};

pub const NLMSG_NOOP: u16 = 1;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLMSG_OVERRUN: u16 = 4;

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_DELROUTE: u16 = 25;
pub const RTM_GETROUTE: u16 = 26;
pub const RTM_NEWNEIGH: u16 = 28;
pub const RTM_DELNEIGH: u16 = 29;
pub const RTM_GETNEIGH: u16 = 30;
pub const RTM_NEWRULE: u16 = 32;
pub const RTM_DELRULE: u16 = 33;
pub const RTM_GETRULE: u16 = 34;
pub const RTM_NEWNETCONF: u16 = 80;
pub const RTM_DELNETCONF: u16 = 81;
pub const RTM_NEWNEXTHOP: u16 = 104;
pub const RTM_DELNEXTHOP: u16 = 105;
pub const RTM_GETNEXTHOP: u16 = 106;

pub const NLM_F_DUMP_INTR: u16 = 0x10;

const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;

/// RTAX_MTU's bit in RTAX_LOCK.
const RTAX_MTU_LOCK: u32 = 1 << 2;

// include/uapi/linux/nexthop.h
const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_GROUP_TYPE: u16 = 3;
const NHA_BLACKHOLE: u16 = 4;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
const NHA_ENCAP_TYPE: u16 = 7;
const NHA_ENCAP: u16 = 8;
const NHA_FDB: u16 = 11;
const NEXTHOP_GRP_TYPE_RES: u16 = 1;

// Raw offsets for the fallback decoders.
const RTA_DST: u16 = 1;
const RTA_PRIORITY: u16 = 6;
const RTA_TABLE: u16 = 15;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_MASTER: u16 = 10;

#[derive(Debug, thiserror::Error)]
#[error("netlink message type {msg_type}: {reason}")]
pub struct ParseError {
    pub msg_type: u16,
    pub reason: String,
}

fn perr(msg_type: u16, reason: impl Into<String>) -> ParseError {
    ParseError { msg_type, reason: reason.into() }
}

/// One kernel message, reduced to what the mirror applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    NewLink(Link),
    DelLink(u32),
    NewAddr(Addr),
    DelAddr(Addr),
    NewRoute(Family, Route),
    DelRoute(Family, Route),
    NewNexthop(NexthopObject),
    DelNexthop(u32),
    NewNeigh(Neighbour),
    DelNeigh(u32, IpAddr),
    NewRule(Rule),
    DelRule(Rule),
    /// A netconf (per-device sysctl) change: re-read /proc/sys.
    Netconf,
    /// Something we do not mirror (other families, proxy entries, cache routes, ...).
    Ignored,
}

/// One netlink message inside a datagram.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
    pub payload: &'a [u8],
}

/// Splits a received datagram into netlink messages.
pub fn frames(buf: &[u8]) -> Frames<'_> {
    Frames { buf }
}

pub struct Frames<'a> {
    buf: &'a [u8],
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, ParseError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.len() < 16 {
            return None;
        }
        let len = u32::from_ne_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        let msg_type = u16::from_ne_bytes([self.buf[4], self.buf[5]]);
        if len < 16 || len > self.buf.len() {
            self.buf = &[];
            return Some(Err(perr(msg_type, format!("bad nlmsg_len {len}"))));
        }
        let frame = Frame {
            msg_type,
            flags: u16::from_ne_bytes([self.buf[6], self.buf[7]]),
            seq: u32::from_ne_bytes([self.buf[8], self.buf[9], self.buf[10], self.buf[11]]),
            pid: u32::from_ne_bytes([self.buf[12], self.buf[13], self.buf[14], self.buf[15]]),
            payload: &self.buf[16..len],
        };
        let next = (len + 3) & !3;
        self.buf = if next >= self.buf.len() { &[] } else { &self.buf[next..] };
        Some(Ok(frame))
    }
}

/// Serialises one netlink request: header followed by `payload`.
pub fn request(msg_type: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = 16 + payload.len();
    let mut out = Vec::with_capacity((len + 3) & !3);
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&msg_type.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(payload);
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

/// Appends one attribute (header, value, padding) to `out`.
pub fn push_attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

/// The NLMSG_ERROR / NLMSG_DONE status code (0 or a negative errno).
pub fn status_code(payload: &[u8]) -> i32 {
    if payload.len() < 4 {
        return 0;
    }
    i32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]])
}

/// Decodes the payload of one rtnetlink message of type `msg_type`.
pub fn decode(msg_type: u16, payload: &[u8]) -> Result<Msg, ParseError> {
    match msg_type {
        RTM_NEWNETCONF | RTM_DELNETCONF => return Ok(Msg::Netconf),
        RTM_NEWNEXTHOP => return nexthop(payload).map(Msg::NewNexthop),
        RTM_DELNEXTHOP => return nexthop(payload).map(|nh| Msg::DelNexthop(nh.id)),
        RTM_NEWLINK | RTM_DELLINK | RTM_NEWADDR | RTM_DELADDR | RTM_NEWROUTE | RTM_DELROUTE
        | RTM_NEWNEIGH | RTM_DELNEIGH | RTM_NEWRULE | RTM_DELRULE => {}
        _ => return Ok(Msg::Ignored),
    }
    let parsed = match RouteNetlinkMessage::parse_with_param(payload, msg_type) {
        Ok(m) => m,
        Err(e) => return fallback(msg_type, payload, e.to_string()),
    };
    Ok(match parsed {
        RouteNetlinkMessage::NewLink(m) => link(&m).map_or(Msg::Ignored, Msg::NewLink),
        RouteNetlinkMessage::DelLink(m) => link(&m).map_or(Msg::Ignored, |l| Msg::DelLink(l.ifindex)),
        RouteNetlinkMessage::NewAddress(m) => addr(&m).map_or(Msg::Ignored, Msg::NewAddr),
        RouteNetlinkMessage::DelAddress(m) => addr(&m).map_or(Msg::Ignored, Msg::DelAddr),
        RouteNetlinkMessage::NewRoute(m) => route(&m).map_or(Msg::Ignored, |(f, r)| Msg::NewRoute(f, r)),
        RouteNetlinkMessage::DelRoute(m) => route(&m).map_or(Msg::Ignored, |(f, r)| Msg::DelRoute(f, r)),
        RouteNetlinkMessage::NewNeighbour(m) => neighbour(&m).map_or(Msg::Ignored, Msg::NewNeigh),
        RouteNetlinkMessage::DelNeighbour(m) => {
            neighbour(&m).map_or(Msg::Ignored, |n| Msg::DelNeigh(n.ifindex, n.addr))
        }
        RouteNetlinkMessage::NewRule(m) => rule(&m).map_or(Msg::Ignored, Msg::NewRule),
        RouteNetlinkMessage::DelRule(m) => rule(&m).map_or(Msg::Ignored, Msg::DelRule),
        _ => Msg::Ignored,
    })
}

/// Last resort when the typed parser refused a message we cannot afford to lose.
fn fallback(msg_type: u16, payload: &[u8], why: String) -> Result<Msg, ParseError> {
    match msg_type {
        RTM_NEWROUTE | RTM_DELROUTE => match route_fallback(payload) {
            Some(None) => Ok(Msg::Ignored),
            Some(Some((fam, r))) => {
                log::warn!("route message not fully understood ({why}); keeping it as a punt entry");
                Ok(if msg_type == RTM_NEWROUTE { Msg::NewRoute(fam, r) } else { Msg::DelRoute(fam, r) })
            }
            None => Err(perr(msg_type, why)),
        },
        RTM_NEWLINK | RTM_DELLINK => match link_fallback(payload) {
            Some(None) => Ok(Msg::Ignored),
            Some(Some(l)) => {
                log::warn!("link message for {} not fully understood ({why})", l.ifindex);
                Ok(if msg_type == RTM_NEWLINK { Msg::NewLink(l) } else { Msg::DelLink(l.ifindex) })
            }
            None => Err(perr(msg_type, why)),
        },
        _ => Err(perr(msg_type, why)),
    }
}

fn family_of(af: AddressFamily) -> Option<Family> {
    match af {
        AddressFamily::Inet => Some(Family::V4),
        AddressFamily::Inet6 => Some(Family::V6),
        _ => None,
    }
}

fn unspecified(fam: Family) -> IpAddr {
    match fam {
        Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn via_addr(v: &RouteVia) -> Option<IpAddr> {
    match v {
        RouteVia::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteVia::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

pub fn route_kind(t: RouteType) -> RouteKind {
    match t {
        RouteType::Unicast => RouteKind::Unicast,
        RouteType::Local => RouteKind::Local,
        RouteType::Broadcast => RouteKind::Broadcast,
        RouteType::Anycast => RouteKind::Anycast,
        RouteType::Multicast => RouteKind::Multicast,
        RouteType::BlackHole => RouteKind::Blackhole,
        RouteType::Unreachable => RouteKind::Unreachable,
        RouteType::Prohibit => RouteKind::Prohibit,
        RouteType::Throw => RouteKind::Throw,
        other => RouteKind::Other(u8::from(other)),
    }
}

/// Routes the model cannot express (IPv6 source-specific routes, routes the
/// typed parser refused) are stored as `RouteKind::Other(rtm_type)` with a
/// forwarding rtm_type. Real `Other` kinds are unspec/nat/xresolve (0, 10, 11),
/// so the two never collide. Such an entry must win over a plain route with
/// the same key: the plain one does not apply to all traffic.
pub fn is_opaque(route: &Route) -> bool {
    matches!(route.kind, RouteKind::Other(t) if (1..=9).contains(&t))
}

fn hop_gateway(attrs: &[RouteAttribute]) -> Option<IpAddr> {
    attrs.iter().find_map(|a| match a {
        RouteAttribute::Gateway(g) => route_addr(g),
        RouteAttribute::Via(v) => via_addr(v),
        _ => None,
    })
}

fn multipath_member(h: &RouteNextHop) -> NextHop {
    NextHop {
        ifindex: h.interface_index,
        gateway: hop_gateway(&h.attributes),
        flags: u32::from(h.flags.bits()),
        weight: u32::from(h.hops) + 1,
    }
}

/// RTM_NEWROUTE / RTM_DELROUTE -> (family, route). None for routes we do not
/// mirror: other families and cache clones.
pub fn route(m: &RouteMessage) -> Option<(Family, Route)> {
    let fam = family_of(m.header.address_family)?;
    if m.header.flags.contains(RouteFlags::Cloned) {
        return None;
    }
    let mut table = u32::from(m.header.table);
    let mut dst = None;
    let mut priority = 0;
    let mut oif = 0;
    let mut gateway = None;
    let mut multipath = None;
    let mut nh_id = None;
    let mut mtu = 0;
    let mut lock = 0;
    let mut encap = false;
    for attr in &m.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = route_addr(a),
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Priority(p) => priority = *p,
            RouteAttribute::Oif(i) => oif = *i,
            RouteAttribute::Gateway(a) => gateway = route_addr(a),
            RouteAttribute::Via(v) => gateway = via_addr(v),
            RouteAttribute::MultiPath(hops) => multipath = Some(hops),
            RouteAttribute::NhId(id) => nh_id = Some(*id),
            RouteAttribute::Metrics(metrics) => {
                for metric in metrics {
                    match metric {
                        RouteMetric::Mtu(v) => mtu = *v,
                        RouteMetric::Lock(v) => lock = *v,
                        _ => {}
                    }
                }
            }
            RouteAttribute::Encap(_) => encap = true,
            RouteAttribute::EncapType(t) if *t != RouteLwEnCapType::None => encap = true,
            _ => {}
        }
    }
    let key = RouteKey {
        table,
        dst: dst.unwrap_or_else(|| unspecified(fam)),
        prefix_len: m.header.destination_prefix_length,
        tos: m.header.tos,
        priority,
    };
    let mut kind = route_kind(m.header.kind);
    if m.header.source_prefix_length > 0 {
        // The model has no source prefix: keep the route, but opaque (punted).
        kind = RouteKind::Other(u8::from(m.header.kind));
    }
    let target = if kind != RouteKind::Unicast {
        RouteTarget::None
    } else if let Some(id) = nh_id {
        RouteTarget::Object(id)
    } else if let Some(hops) = multipath {
        let mut members: Vec<NextHop> = hops.iter().map(multipath_member).collect();
        match members.len() {
            0 => RouteTarget::None,
            1 => RouteTarget::Single(members.remove(0)),
            _ => RouteTarget::Multipath(members),
        }
    } else if oif != 0 || gateway.is_some() {
        RouteTarget::Single(NextHop { ifindex: oif, gateway, flags: m.header.flags.bits(), weight: 1 })
    } else {
        RouteTarget::None
    };
    Some((fam, Route { key, kind, target, mtu, mtu_locked: lock & RTAX_MTU_LOCK != 0, encap }))
}

fn raw_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

fn raw_ip(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(v[0], v[1], v[2], v[3]))),
        16 => {
            let b: [u8; 16] = v.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

/// The key of a route message the typed parser refused. Outer None: not even
/// the header is readable; inner None: a route we do not mirror.
fn route_fallback(p: &[u8]) -> Option<Option<(Family, Route)>> {
    if p.len() < 12 {
        return None;
    }
    let fam = match p[0] {
        AF_INET => Family::V4,
        AF_INET6 => Family::V6,
        _ => return Some(None),
    };
    let flags = raw_u32(&p[8..12])?;
    if flags & 0x200 != 0 {
        return Some(None); // RTM_F_CLONED
    }
    let mut key =
        RouteKey { table: u32::from(p[4]), dst: unspecified(fam), prefix_len: p[1], tos: p[3], priority: 0 };
    for nla in NlasIterator::new(&p[12..]) {
        let Ok(nla) = nla else { break };
        match nla.kind() & NLA_TYPE_MASK {
            RTA_DST => key.dst = raw_ip(nla.value())?,
            RTA_PRIORITY => key.priority = raw_u32(nla.value())?,
            RTA_TABLE => key.table = raw_u32(nla.value())?,
            _ => {}
        }
    }
    // A forwarding rtm_type keeps it opaque (see is_opaque); others are punted anyway.
    let kind = RouteKind::Other(p[7]);
    Some(Some((fam, Route { key, kind, target: RouteTarget::None, mtu: 0, mtu_locked: false, encap: true })))
}

/// RTM_NEWLINK / RTM_DELLINK -> Link. None for the per-family link messages
/// (AF_INET6 carries a subset of attributes, AF_BRIDGE DELLINK only means "left
/// the bridge"); every real change also comes as an AF_UNSPEC message.
pub fn link(m: &LinkMessage) -> Option<Link> {
    if m.header.interface_family != AddressFamily::Unspec {
        return None;
    }
    let mut l = Link {
        ifindex: m.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        admin_up: m.header.flags.contains(LinkFlags::Up),
        running: m.header.flags.contains(LinkFlags::Running),
        arphrd: u16::from(m.header.link_layer_type),
        kind: None,
        master: None,
    };
    for attr in &m.attributes {
        match attr {
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Address(a) => l.mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
            LinkAttribute::Mtu(v) => l.mtu = *v,
            LinkAttribute::Controller(v) if *v != 0 => l.master = Some(*v),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    if let LinkInfo::Kind(k) = info {
                        l.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    Some(l)
}

fn link_fallback(p: &[u8]) -> Option<Option<Link>> {
    if p.len() < 16 {
        return None;
    }
    if p[0] != 0 {
        return Some(None);
    }
    let flags = raw_u32(&p[8..12])?;
    let mut l = Link {
        ifindex: raw_u32(&p[4..8])?,
        name: String::new(),
        mac: None,
        mtu: 0,
        admin_up: flags & libc::IFF_UP as u32 != 0,
        running: flags & libc::IFF_RUNNING as u32 != 0,
        arphrd: u16::from_ne_bytes([p[2], p[3]]),
        kind: None,
        master: None,
    };
    for nla in NlasIterator::new(&p[16..]) {
        let Ok(nla) = nla else { break };
        let v = nla.value();
        match nla.kind() & NLA_TYPE_MASK {
            IFLA_IFNAME => l.name = String::from_utf8_lossy(v).trim_end_matches('\0').to_string(),
            IFLA_ADDRESS => l.mac = <[u8; 6]>::try_from(v).ok(),
            IFLA_MTU => l.mtu = raw_u32(v).unwrap_or(0),
            IFLA_MASTER => l.master = raw_u32(v).filter(|m| *m != 0),
            _ => {}
        }
    }
    Some(Some(l))
}

/// RTM_NEWADDR / RTM_DELADDR -> Addr. IFA_LOCAL is the interface's own address
/// on point-to-point links (IFA_ADDRESS is then the peer).
pub fn addr(m: &AddressMessage) -> Option<Addr> {
    family_of(m.header.family)?;
    let mut local = None;
    let mut address = None;
    for attr in &m.attributes {
        match attr {
            AddressAttribute::Local(a) => local = Some(*a),
            AddressAttribute::Address(a) => address = Some(*a),
            _ => {}
        }
    }
    Some(Addr { ifindex: m.header.index, addr: local.or(address)?, prefix_len: m.header.prefix_len })
}

/// RTM_NEWNEIGH / RTM_DELNEIGH -> Neighbour (any state). None for other
/// families (bridge fdb) and proxy entries.
pub fn neighbour(m: &NeighbourMessage) -> Option<Neighbour> {
    family_of(m.header.family)?;
    if m.header.flags.contains(NeighbourFlags::Proxy) {
        return None;
    }
    let mut dst = None;
    let mut mac = None;
    for attr in &m.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => dst = Some(IpAddr::V4(*a)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => dst = Some(IpAddr::V6(*a)),
            NeighbourAttribute::LinkLayerAddress(a) => mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
            _ => {}
        }
    }
    Some(Neighbour {
        ifindex: m.header.ifindex,
        addr: dst?,
        mac,
        state: u16::from(m.header.state),
        flags: m.header.flags.bits(),
    })
}

/// RTM_NEWRULE / RTM_DELRULE -> Rule.
pub fn rule(m: &RuleMessage) -> Option<Rule> {
    let family = family_of(m.header.family)?;
    let mut priority = 0;
    let mut table = u32::from(m.header.table);
    let mut has_selectors = m.header.src_len > 0 || m.header.dst_len > 0 || m.header.tos != 0;
    for attr in &m.attributes {
        match attr {
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::SuppressPrefixLen(v) | RuleAttribute::SuppressIfGroup(v) => {
                has_selectors |= *v != u32::MAX
            }
            RuleAttribute::L3MDev(on) => has_selectors |= *on,
            RuleAttribute::Iifname(_)
            | RuleAttribute::Oifname(_)
            | RuleAttribute::FwMark(_)
            | RuleAttribute::FwMask(_)
            | RuleAttribute::Goto(_)
            | RuleAttribute::Realm(_)
            | RuleAttribute::TunId(_)
            | RuleAttribute::UidRange(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_)
            // Newer selectors this crate does not know (dscp, flowlabel, port masks, ...).
            | RuleAttribute::Other(_) => has_selectors = true,
            _ => {}
        }
    }
    Some(Rule {
        family,
        priority,
        table,
        action: u8::from(m.header.action),
        has_selectors,
        invert: m.header.flags.contains(RuleFlags::Invert),
    })
}

/// RTM_NEWNEXTHOP / RTM_DELNEXTHOP payload (struct nhmsg + NHA_*) -> object.
pub fn nexthop(p: &[u8]) -> Result<NexthopObject, ParseError> {
    let msg_type = RTM_NEWNEXTHOP;
    if p.len() < 8 {
        return Err(perr(msg_type, "short nhmsg"));
    }
    let flags = raw_u32(&p[4..8]).unwrap_or(0);
    let mut obj =
        NexthopObject { id: 0, blackhole: false, hop: None, group: Vec::new(), resilient: false, unsupported: false };
    let mut oif = 0;
    let mut gateway = None;
    for nla in NlasIterator::new(&p[8..]) {
        let nla = nla.map_err(|e| perr(msg_type, e.to_string()))?;
        let v = nla.value();
        match nla.kind() & NLA_TYPE_MASK {
            NHA_ID => obj.id = raw_u32(v).ok_or_else(|| perr(msg_type, "bad NHA_ID"))?,
            NHA_GROUP => {
                // struct nexthop_grp { u32 id; u8 weight; u8 weight_high; u16 resvd2; }: weight - 1.
                for g in v.chunks_exact(8) {
                    let id = raw_u32(g).unwrap_or(0);
                    let w = (u32::from(g[5]) << 8 | u32::from(g[4])) + 1;
                    obj.group.push((id, w));
                }
            }
            NHA_GROUP_TYPE => {
                obj.resilient = v.len() >= 2 && u16::from_ne_bytes([v[0], v[1]]) == NEXTHOP_GRP_TYPE_RES
            }
            NHA_BLACKHOLE => obj.blackhole = true,
            NHA_OIF => oif = raw_u32(v).unwrap_or(0),
            NHA_GATEWAY => gateway = raw_ip(v),
            NHA_ENCAP_TYPE | NHA_ENCAP | NHA_FDB => obj.unsupported = true,
            _ => {}
        }
    }
    if obj.group.is_empty() && !obj.blackhole {
        obj.hop = Some(NextHop { ifindex: oif, gateway, flags, weight: 1 });
    }
    Ok(obj)
}

