//! What zebra sent: the routes and next-hop objects of the FPM stream, and
//! what changed since the state last took them in (`overlay`), so that a
//! BGP update costs the prefixes it touches rather than a pass over a
//! full table. Owned by the server thread, behind the server's mutex.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use fastpath_core::model::{Family, NexthopObject, Route, RouteKey, RT_TABLE_MAIN};
use fastpath_core::parse::{self, Msg};
use log::{debug, info, warn};
use serde::{Deserialize, Serialize};

use super::status::Offload;

/// zebra replays its whole table right after connecting; this long without
/// a message means the replay is over and what it did not repeat is stale.
pub(super) const SETTLE: Duration = Duration::from_secs(1);

/// What zebra replaces and deletes by: it keeps one selected route per
/// prefix and table, and an update's delete may carry the new metric.
pub(super) type RouteId = (Family, u32, IpAddr, u8, u8);

pub(super) struct Stored {
    pub fam: Family,
    pub route: Route,
    /// zebra's RTM_NEWROUTE payload, echoed back with the status flags.
    pub rtmsg: Vec<u8>,
    /// Table version that last changed it.
    pub version: u64,
    /// Connection that last sent it.
    pub conn: u64,
    /// Status the last report found (None: not checked yet).
    pub status: Option<Offload>,
    /// Last status sent on the current connection.
    pub reported: Option<Offload>,
}

/// What changed since the last overlay.
#[derive(Debug, Default)]
pub(super) struct Dirty {
    /// Routes added, replaced or deleted.
    pub routes: HashSet<RouteId>,
    /// Keys the state may still hold a replaced or deleted route under (a
    /// replacement may come with another metric, which is in the key).
    pub old_keys: Vec<(Family, RouteKey)>,
    /// Objects added, replaced or deleted.
    pub nexthops: BTreeSet<u32>,
    /// Routes sent again unchanged on a connection that has not had their
    /// status yet (zebra's replay after a reconnect): only reported.
    pub unreported: Vec<RouteId>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counters {
    pub connections: u64,
    /// Netlink messages received.
    pub messages: u64,
    /// Messages we could not decode (skipped).
    pub decode_errors: u64,
    /// Messages we do not use (MAC/FDB, MPLS, other families).
    pub ignored: u64,
    /// Routes dropped because the grace period ran out or a replay left them out.
    pub flushed: u64,
    /// Status messages sent to zebra.
    pub status_sent: u64,
}

/// Routes whose last status was offloaded / failed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct StatusCounts {
    pub offloaded: usize,
    pub failed: usize,
}

impl StatusCounts {
    /// A route's status went from `old` to `new` (None: unchecked, or gone).
    pub fn moved(&mut self, old: Option<Offload>, new: Option<Offload>) {
        if old == new {
            return;
        }
        match old {
            Some(Offload::Offloaded) => self.offloaded -= 1,
            Some(Offload::Failed) => self.failed -= 1,
            None => {}
        }
        match new {
            Some(Offload::Offloaded) => self.offloaded += 1,
            Some(Offload::Failed) => self.failed += 1,
            None => {}
        }
    }
}

#[derive(Default)]
pub(super) struct Table {
    pub routes: HashMap<RouteId, Stored>,
    pub nexthops: BTreeMap<u32, (NexthopObject, u64)>,
    pub dirty: Dirty,
    /// Every tos a route came with: a prefix's routes are found by probing these.
    pub tos_seen: BTreeSet<u8>,
    pub counts: StatusCounts,
    pub version: u64,
    pub conn: u64,
    pub connected: bool,
    pub writer: Option<std::net::TcpStream>,
    /// Connected: time of the last message (or the connect). Disconnected:
    /// when the connection was lost.
    pub since: Option<Instant>,
    /// A replay is (maybe) under way: sweep what it did not repeat once quiet.
    pub sweep_pending: bool,
    pub stats: Counters,
    pub warned_decode: bool,
}

impl Table {
    fn put_route(&mut self, id: RouteId, s: Stored) {
        let old = match self.routes.entry(id) {
            Entry::Occupied(mut e) if e.get().route == s.route => {
                // A replay of a full table is mostly this: no change to take
                // in, only the status to send again.
                let old = e.get_mut();
                old.conn = s.conn;
                old.rtmsg = s.rtmsg;
                if old.reported.is_none() {
                    self.dirty.unreported.push(id);
                }
                return;
            }
            Entry::Occupied(mut e) => Some(e.insert(s)),
            Entry::Vacant(v) => {
                v.insert(s);
                None
            }
        };
        if let Some(old) = old {
            self.forget(old);
        }
        self.tos_seen.insert(id.4);
        self.dirty.routes.insert(id);
    }

    fn remove_route(&mut self, id: &RouteId) -> bool {
        let Some(old) = self.routes.remove(id) else { return false };
        self.forget(old);
        self.dirty.routes.insert(*id);
        true
    }

    fn forget(&mut self, old: Stored) {
        self.counts.moved(old.status, None);
        self.dirty.old_keys.push((old.fam, old.route.key));
    }

    fn put_nexthop(&mut self, nh: NexthopObject, conn: u64) {
        self.dirty.nexthops.insert(nh.id);
        self.nexthops.insert(nh.id, (nh, conn));
    }

    fn remove_nexthop(&mut self, id: u32) -> bool {
        self.dirty.nexthops.insert(id);
        self.nexthops.remove(&id).is_some()
    }

    /// Ids of the routes in `table` with the prefix `dst`/`len`, one per tos.
    pub fn prefix_ids(&self, fam: Family, table: u32, dst: IpAddr, len: u8) -> impl Iterator<Item = RouteId> + '_ {
        self.tos_seen.iter().map(move |tos| (fam, table, dst, len, *tos)).filter(|id| self.routes.contains_key(id))
    }

    /// Whether zebra sent a main-table route for `dst`/`len`.
    pub fn has_main(&self, dst: IpAddr, len: u8) -> bool {
        let fam = if dst.is_ipv4() { Family::V4 } else { Family::V6 };
        self.prefix_ids(fam, RT_TABLE_MAIN, dst, len).next().is_some()
    }

    fn drop_routes(&mut self, gone: impl Fn(&Stored) -> bool) {
        let ids: Vec<RouteId> = self.routes.iter().filter(|(_, s)| gone(s)).map(|(id, _)| *id).collect();
        for id in &ids {
            self.remove_route(id);
        }
    }

    fn drop_nexthops(&mut self, gone: impl Fn(u64) -> bool) {
        let ids: Vec<u32> = self.nexthops.iter().filter(|(_, (_, c))| gone(*c)).map(|(id, _)| *id).collect();
        for id in ids {
            self.remove_nexthop(id);
        }
    }
}

/// Sweep after a replay, flush after the grace period. True if anything went.
pub(super) fn timers(t: &mut Table, grace: Duration) -> bool {
    let Some(since) = t.since else { return false };
    let before = t.routes.len() + t.nexthops.len();
    if t.connected && t.sweep_pending && since.elapsed() >= SETTLE {
        t.sweep_pending = false;
        let conn = t.conn;
        t.drop_routes(|s| s.conn != conn);
        t.drop_nexthops(|c| c != conn);
        let gone = before - t.routes.len() - t.nexthops.len();
        if gone > 0 {
            info!("FPM: dropped {gone} routes and next hops zebra did not replay");
        }
    } else if !t.connected && since.elapsed() >= grace && before > 0 {
        warn!("FPM: no zebra for {} s: flushing {} routes and {} next hops", grace.as_secs(), t.routes.len(), t.nexthops.len());
        t.drop_routes(|_| true);
        t.drop_nexthops(|_| true);
    }
    let gone = before - t.routes.len() - t.nexthops.len();
    if gone > 0 {
        t.stats.flushed += gone as u64;
        t.version += 1;
    }
    gone > 0
}

/// Applies the netlink messages of one FPM frame. True if the table changed.
pub(super) fn apply(t: &mut Table, payload: &[u8]) -> bool {
    let mut changed = false;
    let (version, conn) = (t.version + 1, t.conn);
    for nl in parse::frames(payload) {
        let nl = match nl {
            Ok(nl) => nl,
            Err(e) => {
                t.stats.decode_errors += 1;
                warn!("FPM: bad netlink message: {e}");
                break;
            }
        };
        t.stats.messages += 1;
        match parse::decode(nl.msg_type, nl.payload) {
            Ok(Msg::NewRoute(fam, route) | Msg::AddRoute(fam, route)) => {
                let k = &route.key;
                let id = (fam, k.table, k.dst, k.prefix_len, k.tos);
                let rtmsg = nl.payload.to_vec();
                t.put_route(id, Stored { fam, route, rtmsg, version, conn, status: None, reported: None });
                changed = true;
            }
            Ok(Msg::DelRoute(fam, route)) => {
                let k = &route.key;
                changed |= t.remove_route(&(fam, k.table, k.dst, k.prefix_len, k.tos));
            }
            Ok(Msg::NewNexthop(nh)) => {
                t.put_nexthop(nh, conn);
                changed = true;
            }
            Ok(Msg::DelNexthop(id)) => changed |= t.remove_nexthop(id),
            Ok(_) => t.stats.ignored += 1,
            Err(e) => {
                t.stats.decode_errors += 1;
                // Once per run at warn: a zebra feature we do not decode repeats for every route.
                if !std::mem::replace(&mut t.warned_decode, true) {
                    warn!("FPM: skipping a message we cannot decode (further ones at debug): {e}");
                } else {
                    debug!("FPM: skipping a message we cannot decode: {e}");
                }
            }
        }
    }
    if changed {
        t.version = version;
    }
    changed
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use fastpath_core::model::RouteTarget;
    use fastpath_core::parse::{push_attr, request, RTM_DELROUTE, RTM_NEWNEXTHOP, RTM_NEWROUTE};

    pub fn route_msg(kind: u16, dst: [u8; 4], len: u8, metric: u32, nh_id: Option<u32>) -> Vec<u8> {
        // family, dst_len, src_len, tos, table, protocol (static), scope, type (unicast), flags
        let mut p = vec![2, len, 0, 0, 254, 196, 0, 1, 0, 0, 0, 0];
        push_attr(&mut p, 1, &dst);
        push_attr(&mut p, 6, &metric.to_ne_bytes());
        match nh_id {
            Some(id) => push_attr(&mut p, 30, &id.to_ne_bytes()),
            None => {
                push_attr(&mut p, 5, &[192, 0, 2, 1]);
                push_attr(&mut p, 4, &7u32.to_ne_bytes());
            }
        }
        request(kind, 0x1 | 0x400, 1, &p)
    }

    /// A next-hop object via 192.0.2.`gw` on ifindex 7.
    pub fn nexthop_msg(id: u32, gw: u8) -> Vec<u8> {
        let mut p = vec![2, 0, 0, 0, 0, 0, 0, 0];
        push_attr(&mut p, 1, &id.to_ne_bytes());
        push_attr(&mut p, 5, &7u32.to_ne_bytes());
        push_attr(&mut p, 6, &[192, 0, 2, gw]);
        request(RTM_NEWNEXTHOP, 0x1, 1, &p)
    }

    /// What a report does when it finds `st` for route `id`.
    fn set_status(t: &mut Table, id: &RouteId, st: Offload) {
        let s = t.routes.get_mut(id).expect("stored");
        t.counts.moved(s.status.replace(st), Some(st));
    }

    fn unhex(h: &str) -> Vec<u8> {
        (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex")).collect()
    }

    #[test]
    fn what_zebra_8_4_4_sends_decodes() {
        // Captured from zebra 8.4.4 -M dplane_fpm_nl (x86-64): next-hop
        // objects first, then routes naming them by RTA_NH_ID.
        let mut t = Table::default();
        let msgs = [
            (RTM_NEWNEXTHOP, 0x501, "02000b000000000008000100060000000800050002000000"),
            (RTM_NEWNEXTHOP, 0x501, "0a000b0000000000080001000a00000014000600fe8000000000000000000000000000010800050003000000"),
            (RTM_NEWROUTE, 0x501, "02180000fe0200010000000008000100c6336400080006001400000008001e0006000000"),
            (RTM_NEWROUTE, 0x401, "0a400000fec40001000000001400010020010db8000300000000000000000000080006001400000008001e000a000000"),
        ];
        for (ty, flags, hex) in msgs {
            assert!(apply(&mut t, &request(ty, flags, 0, &unhex(hex))), "{hex}");
        }
        assert_eq!(t.stats.decode_errors, 0);
        let (nh6, _) = &t.nexthops[&6];
        assert_eq!(nh6.hop.as_ref().map(|h| (h.ifindex, h.gateway)), Some((2, None)));
        let (nh10, _) = &t.nexthops[&10];
        let gw: IpAddr = "fe80::1".parse().expect("addr");
        assert_eq!(nh10.hop.as_ref().map(|h| (h.ifindex, h.gateway)), Some((3, Some(gw))));
        let v4 = &t.routes[&(Family::V4, RT_TABLE_MAIN, IpAddr::from([198, 51, 100, 0]), 24, 0)];
        assert_eq!(v4.route.target, RouteTarget::Object(6));
        let v6: IpAddr = "2001:db8:3::".parse().expect("addr");
        let v6 = &t.routes[&(Family::V6, RT_TABLE_MAIN, v6, 64, 0)];
        assert_eq!(v6.route.target, RouteTarget::Object(10));
        assert_eq!(v6.route.key.priority, 20);
    }

    #[test]
    fn replay_sweeps_what_was_not_repeated_and_grace_flushes() {
        let mut t = Table { conn: 1, connected: true, ..Default::default() };
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, None));
        apply(&mut t, &route_msg(RTM_NEWROUTE, [203, 0, 113, 0], 24, 20, None));
        t.dirty = Dirty::default();
        // Reconnect: only one route replayed.
        t.conn = 2;
        t.sweep_pending = true;
        t.since = Some(Instant::now());
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, None));
        assert!(!timers(&mut t, Duration::from_secs(10)), "still settling");
        t.since = Some(Instant::now() - SETTLE);
        assert!(timers(&mut t, Duration::from_secs(10)));
        assert_eq!(t.routes.len(), 1);
        // The swept route is a change the next overlay takes in.
        let swept = (Family::V4, RT_TABLE_MAIN, IpAddr::from([203, 0, 113, 0]), 24, 0);
        assert!(t.dirty.routes.contains(&swept));
        assert!(t.dirty.old_keys.iter().any(|(_, k)| k.dst == swept.2), "{:?}", t.dirty.old_keys);
        // Lost: kept through the grace, flushed after it.
        t.connected = false;
        t.since = Some(Instant::now());
        assert!(!timers(&mut t, Duration::from_secs(10)));
        assert_eq!(t.routes.len(), 1);
        t.since = Some(Instant::now() - Duration::from_secs(10));
        assert!(timers(&mut t, Duration::from_secs(10)));
        assert!(t.routes.is_empty());
        assert_eq!(t.stats.flushed, 2);
    }

    #[test]
    fn an_unchanged_route_sent_again_is_no_change_but_is_reported_again() {
        let mut t = Table { conn: 1, ..Default::default() };
        let a = (Family::V4, RT_TABLE_MAIN, IpAddr::from([198, 51, 100, 0]), 24, 0);
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, None));
        t.dirty = Dirty::default();
        set_status(&mut t, &a, Offload::Offloaded);
        t.routes.get_mut(&a).expect("stored").reported = Some(Offload::Offloaded);
        // Sent again on the same connection: nothing at all.
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, None));
        assert!(t.dirty.routes.is_empty() && t.dirty.old_keys.is_empty() && t.dirty.unreported.is_empty());
        // Replayed on a new connection (status not sent there yet): only reported.
        t.conn = 2;
        t.routes.get_mut(&a).expect("stored").reported = None;
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, None));
        assert!(t.dirty.routes.is_empty() && t.dirty.old_keys.is_empty());
        assert_eq!(t.dirty.unreported, vec![a]);
        assert_eq!((t.routes[&a].conn, t.counts.offloaded), (2, 1));
        // Changed: a change.
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, Some(9)));
        assert!(t.dirty.routes.contains(&a));
    }

    #[test]
    fn status_counts_follow_replacements_and_deletes() {
        let mut t = Table::default();
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, None));
        apply(&mut t, &route_msg(RTM_NEWROUTE, [203, 0, 113, 0], 24, 20, None));
        let a = (Family::V4, RT_TABLE_MAIN, IpAddr::from([198, 51, 100, 0]), 24, 0);
        let b = (Family::V4, RT_TABLE_MAIN, IpAddr::from([203, 0, 113, 0]), 24, 0);
        set_status(&mut t, &a, Offload::Offloaded);
        set_status(&mut t, &b, Offload::Failed);
        set_status(&mut t, &b, Offload::Failed);
        assert_eq!(t.counts, StatusCounts { offloaded: 1, failed: 1 });
        set_status(&mut t, &b, Offload::Offloaded);
        assert_eq!(t.counts, StatusCounts { offloaded: 2, failed: 0 });
        // Replaced: not checked yet.
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 30, None));
        assert_eq!(t.counts, StatusCounts { offloaded: 1, failed: 0 });
        apply(&mut t, &route_msg(RTM_DELROUTE, [203, 0, 113, 0], 24, 20, None));
        assert_eq!(t.counts, StatusCounts::default());
        assert!(t.has_main(a.2, 24) && !t.has_main(b.2, 24));
    }
}
