//! A direct decoder for the one route shape a full table is made of: a
//! unicast route with at most a gateway and an interface. Decoding it
//! straight from the bytes avoids the typed parser's attribute vector (an
//! allocation and a few dozen branches per route, a third of the dump
//! time at a million routes).
//!
//! It answers only when it is sure to agree with `parse::route` on the
//! typed message: any other attribute, flag, type, or a length the typed
//! parser might refuse, and it returns None so the caller takes the typed
//! path (whose refusals have their own fallback).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{Family, NextHop, Route, RouteKey, RouteKind, RouteTarget};

const RTMSG_LEN: usize = 12;
const RTN_UNICAST: u8 = 1;
const RTM_F_CLONED: u32 = 0x200;

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_PREFSRC: u16 = 7;
const RTA_CACHEINFO: u16 = 12;
const RTA_TABLE: u16 = 15;
const RTA_PREF: u16 = 20;
const RTA_EXPIRES: u16 = 23;
/// struct rta_cacheinfo: eight u32.
const CACHEINFO_LEN: usize = 32;

fn u32_at(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.try_into().ok()?))
}

fn unspecified(fam: Family) -> IpAddr {
    match fam {
        Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

fn addr(fam: Family, v: &[u8]) -> Option<IpAddr> {
    match fam {
        Family::V4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(v).ok()?))),
        Family::V6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v).ok()?))),
    }
}

/// The payload (struct rtmsg + attributes) of an RTM_NEWROUTE/RTM_DELROUTE
/// -> what `parse::route` would make of it, or None when unsure.
pub fn plain_route(p: &[u8]) -> Option<(Family, Route)> {
    let hdr = p.get(..RTMSG_LEN)?;
    let fam = match hdr[0] {
        x if x == libc::AF_INET as u8 => Family::V4,
        x if x == libc::AF_INET6 as u8 => Family::V6,
        _ => return None,
    };
    let (dst_len, src_len, tos, table, kind) = (hdr[1], hdr[2], hdr[3], hdr[4], hdr[7]);
    let flags = u32::from_ne_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]);
    if kind != RTN_UNICAST || src_len != 0 || flags & RTM_F_CLONED != 0 {
        return None;
    }
    let mut key = RouteKey { table: u32::from(table), dst: unspecified(fam), prefix_len: dst_len, tos, priority: 0 };
    let mut oif = 0;
    let mut gateway = None;
    let mut prefsrc = None;
    let mut rest = &p[RTMSG_LEN..];
    while !rest.is_empty() {
        let len = usize::from(u16::from_ne_bytes([*rest.first()?, *rest.get(1)?]));
        let ty = u16::from_ne_bytes([*rest.get(2)?, *rest.get(3)?]);
        // Nested/byte-order flag bits or a malformed length: not ours to judge.
        if len < 4 || len > rest.len() || ty & 0xc000 != 0 {
            return None;
        }
        let v = &rest[4..len];
        match ty {
            RTA_DST => key.dst = addr(fam, v)?,
            RTA_GATEWAY => gateway = Some(addr(fam, v)?),
            RTA_OIF => oif = u32_at(v)?,
            RTA_PRIORITY => key.priority = u32_at(v)?,
            // IPv4 only, as `parse::route` keeps it.
            RTA_PREFSRC => prefsrc = Some(addr(fam, v)?).filter(|_| fam == Family::V4),
            RTA_TABLE => key.table = u32_at(v)?,
            RTA_EXPIRES => {
                u32_at(v)?;
            }
            RTA_PREF if v.len() == 1 => {}
            RTA_CACHEINFO if v.len() >= CACHEINFO_LEN => {}
            _ => return None,
        }
        // Like NlasIterator: a last attribute may lack its padding.
        rest = rest.get((len + 3) & !3..).unwrap_or(&[]);
    }
    let target = if oif != 0 || gateway.is_some() {
        RouteTarget::Single(NextHop { ifindex: oif, gateway, flags, weight: 1 })
    } else {
        RouteTarget::None
    };
    Some((fam, Route { key, kind: RouteKind::Unicast, target, mtu: 0, mtu_locked: false, encap: false, prefsrc }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;
    use netlink_packet_core::{Emitable, ParseableParametrized};
    use netlink_packet_route::route::{
        RouteAddress, RouteAttribute, RouteCacheInfo, RouteFlags, RouteHeader, RouteLwEnCapType, RouteMessage, RouteMetric,
        RoutePreference, RouteProtocol, RouteScope, RouteType,
    };
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

    fn bytes(m: &RouteMessage) -> Vec<u8> {
        let mut b = vec![0; m.buffer_len()];
        m.emit(&mut b);
        b
    }

    /// What the typed parser makes of the bytes (outer None: it refused them).
    fn typed(p: &[u8]) -> Option<Option<(Family, Route)>> {
        match RouteNetlinkMessage::parse_with_param(p, parse::RTM_NEWROUTE) {
            Ok(RouteNetlinkMessage::NewRoute(m)) => Some(parse::route(&m)),
            _ => None,
        }
    }

    fn msg(fam: AddressFamily, kind: RouteType, len: u8, attrs: Vec<RouteAttribute>) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header = RouteHeader {
            address_family: fam,
            destination_prefix_length: len,
            table: RouteHeader::RT_TABLE_MAIN,
            protocol: RouteProtocol::Boot,
            kind,
            scope: RouteScope::Universe,
            ..Default::default()
        };
        m.attributes = attrs;
        m
    }

    fn v4(s: &str) -> RouteAddress {
        RouteAddress::Inet(s.parse().unwrap())
    }
    fn v6(s: &str) -> RouteAddress {
        RouteAddress::Inet6(s.parse().unwrap())
    }

    /// The shapes `ip route` dumps for a full table, and a few it must leave alone.
    fn samples() -> Vec<(RouteMessage, bool)> {
        use RouteAttribute as A;
        let mut raw = [0u8; 32];
        raw[8] = 7;
        let cache = RouteCacheInfo::parse(&raw).unwrap();
        let mut linkdown = msg(AddressFamily::Inet, RouteType::Unicast, 24, vec![A::Destination(v4("192.0.2.0")), A::Oif(3)]);
        linkdown.header.flags = RouteFlags::Linkdown | RouteFlags::Onlink;
        linkdown.header.tos = 8;
        let mut src = msg(AddressFamily::Inet6, RouteType::Unicast, 48, vec![A::Destination(v6("2001:db8:1::")), A::Oif(3)]);
        src.header.source_prefix_length = 64;
        let mut cloned = msg(AddressFamily::Inet, RouteType::Unicast, 32, vec![A::Destination(v4("192.0.2.9")), A::Oif(3)]);
        cloned.header.flags = RouteFlags::Cloned;
        vec![
            (
                msg(
                    AddressFamily::Inet,
                    RouteType::Unicast,
                    24,
                    vec![A::Table(254), A::Destination(v4("198.51.100.0")), A::Gateway(v4("192.0.2.10")), A::Oif(3)],
                ),
                true,
            ),
            (msg(AddressFamily::Inet, RouteType::Unicast, 0, vec![A::Table(254), A::Gateway(v4("192.0.2.1")), A::Oif(2)]), true),
            (
                msg(
                    AddressFamily::Inet6,
                    RouteType::Unicast,
                    48,
                    vec![
                        A::Table(254),
                        A::Destination(v6("2001:db8:5::")),
                        A::Priority(1024),
                        A::Gateway(v6("2001:db8:0:1::10")),
                        A::Oif(3),
                        A::CacheInfo(cache),
                        A::Preference(RoutePreference::Medium),
                    ],
                ),
                true,
            ),
            (
                msg(
                    AddressFamily::Inet6,
                    RouteType::Unicast,
                    64,
                    vec![A::Table(100_000), A::Destination(v6("2001:db8::")), A::Priority(256), A::Oif(4), A::Expires(30)],
                ),
                true,
            ),
            (linkdown, true),
            (msg(AddressFamily::Inet, RouteType::Unicast, 24, vec![A::Destination(v4("192.0.2.0"))]), true),
            // Left to the typed parser.
            (msg(AddressFamily::Inet, RouteType::Local, 32, vec![A::Table(255), A::Destination(v4("192.0.2.1")), A::Oif(3)]), false),
            (msg(AddressFamily::Inet, RouteType::BlackHole, 8, vec![A::Destination(v4("10.0.0.0"))]), false),
            (
                msg(
                    AddressFamily::Inet,
                    RouteType::Unicast,
                    24,
                    vec![A::Destination(v4("192.0.2.0")), A::Oif(3), A::PrefSource(v4("192.0.2.1"))],
                ),
                true,
            ),
            (
                msg(
                    AddressFamily::Inet6,
                    RouteType::Unicast,
                    64,
                    vec![A::Destination(v6("2001:db8:1::")), A::Oif(3), A::PrefSource(v6("2001:db8:1::1"))],
                ),
                true,
            ),
            (
                msg(
                    AddressFamily::Inet,
                    RouteType::Unicast,
                    24,
                    vec![A::Destination(v4("192.0.2.0")), A::Oif(3), A::Metrics(vec![RouteMetric::Mtu(1400)])],
                ),
                false,
            ),
            (
                msg(
                    AddressFamily::Inet,
                    RouteType::Unicast,
                    24,
                    vec![A::Destination(v4("192.0.2.0")), A::Oif(3), A::EncapType(RouteLwEnCapType::Mpls)],
                ),
                false,
            ),
            (msg(AddressFamily::Inet, RouteType::Unicast, 24, vec![A::Destination(v4("192.0.2.0")), A::NhId(7)]), false),
            (src, false),
            (cloned, false),
        ]
    }

    #[test]
    fn keeps_the_preferred_source_of_ipv4_routes_only() {
        use RouteAttribute as A;
        let v4m = msg(AddressFamily::Inet, RouteType::Unicast, 24, vec![A::Destination(v4("192.0.2.0")), A::Oif(3), A::PrefSource(v4("192.0.2.1"))]);
        let v6m = msg(AddressFamily::Inet6, RouteType::Unicast, 64, vec![A::Destination(v6("2001:db8:1::")), A::Oif(3), A::PrefSource(v6("2001:db8:1::1"))]);
        let src = |m: &RouteMessage| plain_route(&bytes(m)).map(|(_, r)| r.prefsrc);
        assert_eq!(src(&v4m), Some(Some("192.0.2.1".parse().unwrap())));
        assert_eq!(src(&v6m), Some(None));
    }

    #[test]
    fn agrees_with_the_typed_parser() {
        for (m, fast) in samples() {
            let b = bytes(&m);
            let got = plain_route(&b);
            assert_eq!(got.is_some(), fast, "{m:?}");
            if let Some(got) = got {
                assert_eq!(typed(&b), Some(Some(got)), "{m:?}");
            }
        }
    }

    #[test]
    fn decode_takes_the_direct_path_with_the_same_result() {
        for (m, _) in samples() {
            let b = bytes(&m);
            let want = match typed(&b).flatten() {
                Some((f, r)) => parse::Msg::NewRoute(f, r),
                None => parse::Msg::Ignored,
            };
            assert_eq!(parse::decode(parse::RTM_NEWROUTE, &b).unwrap(), want, "{m:?}");
        }
    }

    /// Damaged messages: whenever the direct decoder answers, the typed
    /// parser accepts the bytes and says the same.
    #[test]
    fn never_disagrees_on_damaged_bytes() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut answered = 0;
        for (m, _) in samples() {
            let base = bytes(&m);
            for _ in 0..4000 {
                let mut b = base.clone();
                for _ in 0..1 + next() % 3 {
                    let i = (next() % b.len() as u64) as usize;
                    b[i] = match next() % 4 {
                        0 => 0,
                        1 => 0xff,
                        _ => next() as u8,
                    };
                }
                if next() % 8 == 0 {
                    b.truncate((next() % b.len() as u64) as usize);
                }
                if let Some(got) = plain_route(&b) {
                    answered += 1;
                    assert_eq!(typed(&b), Some(Some(got)), "bytes {b:?}");
                }
            }
        }
        assert!(answered > 1000, "the mutations hardly ever kept a decodable route ({answered})");
    }
}
