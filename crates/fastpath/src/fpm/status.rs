//! Offload status sent back to zebra, the way FRR >= 8.5 reads it
//! (dplane_fpm_nl's fpm_read): one netlink message per FPM frame, an
//! RTM_NEWROUTE with NLM_F_REQUEST set, naming the same prefix and next
//! hops zebra sent, with RTM_F_OFFLOAD or RTM_F_OFFLOAD_FAILED in rtm_flags.
//! Echoing zebra's own message with only the flags changed is the surest
//! way to name "the same route". FRR 8.4 reads and discards it.

use std::net::IpAddr;

use fastpath_core::model::Family;
use fastpath_core::parse::{self, RTM_NEWROUTE};
use fastpath_core::tables::Desired;
use serde::Serialize;

pub const RTM_F_OFFLOAD: u32 = 0x4000;
pub const RTM_F_TRAP: u32 = 0x8000;
pub const RTM_F_OFFLOAD_FAILED: u32 = 0x2000_0000;
const NLM_F_REQUEST: u16 = 0x1;
/// rtm_flags sits after family, dst_len, src_len, tos, table, protocol, scope, type.
const RTM_FLAGS_AT: usize = 8;
const RTMSG_LEN: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Offload {
    Offloaded,
    Failed,
}

impl Offload {
    pub fn rtm_flag(self) -> u32 {
        match self {
            Offload::Offloaded => RTM_F_OFFLOAD,
            Offload::Failed => RTM_F_OFFLOAD_FAILED,
        }
    }
}

/// Whether a route FPM delivered is in the fast path. The per-route
/// "offload failed" bookkeeping of the reconciler (issue #5, no-blackhole
/// overflow) plugs in here by implementing this for its own type.
pub trait OffloadCheck {
    fn offload(&self, fam: Family, dst: IpAddr, prefix_len: u8, table: u32) -> Offload;
}

/// Default check: the route's table is one the FIB merges (main) and its
/// prefix has an entry in the FIB maps (`tables`: what they hold now) and
/// is not among the last full compute's failed routes (`offload`).
pub struct InFib<'a> {
    pub tables: &'a Desired,
    pub offload: &'a fastpath_core::overflow::Offload,
}

impl OffloadCheck for InFib<'_> {
    fn offload(&self, _fam: Family, dst: IpAddr, prefix_len: u8, table: u32) -> Offload {
        if table != fastpath_core::model::RT_TABLE_MAIN {
            return Offload::Failed;
        }
        // A route the overflow handling left out (or punts for want of a
        // next-hop slot) is failed even when its prefix has an entry. A
        // punted cover still has its own entry: it stays offloaded.
        let (d, o) = (self.tables, self.offload);
        let present = match dst {
            IpAddr::V4(a) => d.fib4.contains_key(&(a, prefix_len)) && !o.failed4.contains(&(a, prefix_len)),
            IpAddr::V6(a) => d.fib6.contains_key(&(a, prefix_len)) && !o.failed6.contains(&(a, prefix_len)),
        };
        if present {
            Offload::Offloaded
        } else {
            Offload::Failed
        }
    }
}

/// The netlink message (header included) reporting `status` for the route
/// zebra sent as `rtmsg` (the RTM_NEWROUTE payload, without nlmsghdr).
/// None if `rtmsg` is too short to be a route.
pub fn reply(rtmsg: &[u8], status: Offload, seq: u32) -> Option<Vec<u8>> {
    if rtmsg.len() < RTMSG_LEN {
        return None;
    }
    let mut body = rtmsg.to_vec();
    let at = RTM_FLAGS_AT..RTM_FLAGS_AT + 4;
    let old = u32::from_ne_bytes(body[at.clone()].try_into().ok()?);
    let flags = (old & !(RTM_F_OFFLOAD | RTM_F_TRAP | RTM_F_OFFLOAD_FAILED)) | status.rtm_flag();
    body[at].copy_from_slice(&flags.to_ne_bytes());
    Some(parse::request(RTM_NEWROUTE, NLM_F_REQUEST, seq, &body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn rtmsg(flags: u32) -> Vec<u8> {
        let mut m = vec![2, 24, 0, 0, 254, 196, 0, 1];
        m.extend_from_slice(&flags.to_ne_bytes());
        parse::push_attr(&mut m, 1, &[198, 51, 100, 0]);
        m
    }

    #[test]
    fn reply_echoes_the_route_with_only_the_offload_flag_changed() {
        let orig = rtmsg(0x4 | RTM_F_TRAP);
        let r = reply(&orig, Offload::Failed, 7).expect("long enough");
        let f: Vec<_> = parse::frames(&r).map(|f| f.expect("valid")).collect();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].msg_type, RTM_NEWROUTE);
        assert_eq!(f[0].flags, NLM_F_REQUEST);
        assert_eq!(f[0].seq, 7);
        assert_eq!(&f[0].payload[..8], &orig[..8]);
        assert_eq!(&f[0].payload[12..], &orig[12..]);
        let flags = u32::from_ne_bytes(f[0].payload[8..12].try_into().expect("4 bytes"));
        assert_eq!(flags, 0x4 | RTM_F_OFFLOAD_FAILED);
        let ok = reply(&orig, Offload::Offloaded, 8).expect("long enough");
        let flags = u32::from_ne_bytes(ok[16 + 8..16 + 12].try_into().expect("4 bytes"));
        assert_eq!(flags, 0x4 | RTM_F_OFFLOAD);
        assert!(reply(&orig[..11], Offload::Offloaded, 1).is_none());
    }

    #[test]
    fn default_check_is_presence_in_the_fib_of_the_main_table() {
        let mut d = Desired::default();
        let a = Ipv4Addr::new(198, 51, 100, 0);
        d.fib4.insert(
            (a, 24),
            fastpath_core::tables::RouteEntry {
                action: fastpath_core::tables::RouteAction::Punt { reason: 17 },
                mtu: 0,
            },
        );
        let mut o = fastpath_core::overflow::Offload::default();
        let c = InFib { tables: &d, offload: &o };
        assert_eq!(c.offload(Family::V4, a.into(), 24, 254), Offload::Offloaded);
        assert_eq!(c.offload(Family::V4, a.into(), 25, 254), Offload::Failed);
        assert_eq!(c.offload(Family::V4, a.into(), 24, 100), Offload::Failed);
        o.failed4.insert((a, 24));
        let c = InFib { tables: &d, offload: &o };
        assert_eq!(c.offload(Family::V4, a.into(), 24, 254), Offload::Failed);
    }
}
