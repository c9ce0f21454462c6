//! Netlink mirror: dump the kernel's forwarding state, then follow it.
//!
//! Synchronous on purpose: an overrun of the event socket (ENOBUFS) means
//! events were lost, and we must see that ourselves to resync. The event
//! socket subscribes before the first dump, so nothing is missed; events that
//! queue up during a dump are applied afterwards (they are idempotent by key).
//!
//! The kernel does not notify every change: IPv4 flushes routes silently when
//! a link goes down or an address goes away, IPv6 marks or drops routes on
//! link down, deleting one member of an IPv6 multipath route announces only
//! that member, and deleting a next-hop object takes its routes with it. Those
//! events make us re-dump routes, next-hop objects and neighbours (a deleted
//! object only when a route or group in the state still used it).
//!
//! Resilient next-hop groups: the kernel's upkeep announces each bucket it
//! migrates in the background (RTM_NEWNEXTHOPBUCKET on RTNLGRP_NEXTHOP,
//! nh_res_table_upkeep_dw), but the buckets it moves while a group is
//! replaced or loses a member are not announced one by one (only the group
//! is, and not at all when a device going down removes the member). So the
//! buckets are re-dumped after every change of a resilient group, with
//! every FIB re-dump, and periodically (`refresh_buckets`).

use std::cell::RefCell;
use indexmap::map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use crate::model::{
    Family, IfSysctl, KernelState, Link, Neighbour, Route, RouteKey, RouteKind, RouteTarget, NUD_USABLE, RT_TABLE_LOCAL,
};
use crate::parse::{self, Msg};
use crate::sysctl::SysctlReader;

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("netlink: {0}")]
    Io(#[from] std::io::Error),
    #[error("netlink: {0}")]
    Protocol(String),
}

/// What one `poll` did to the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollOutcome {
    /// Nothing arrived before the timeout, or nothing that changed the state.
    Idle,
    /// Events were applied to the state.
    Changed,
    /// The socket overran (ENOBUFS); the state was replaced by a fresh full dump.
    Resynced,
}

const GROUPS: [u32; 11] = [
    libc::RTNLGRP_LINK,
    libc::RTNLGRP_NEIGH,
    libc::RTNLGRP_IPV4_IFADDR,
    libc::RTNLGRP_IPV6_IFADDR,
    libc::RTNLGRP_IPV4_ROUTE,
    libc::RTNLGRP_IPV6_ROUTE,
    libc::RTNLGRP_IPV4_RULE,
    libc::RTNLGRP_IPV6_RULE,
    libc::RTNLGRP_NEXTHOP,
    libc::RTNLGRP_IPV4_NETCONF,
    libc::RTNLGRP_IPV6_NETCONF,
];

/// Big enough for any single rtnetlink message and for a dump batch (<= 32 KiB).
const RECV_BUF: usize = 256 * 1024;
const DUMP_RETRIES: usize = 16;
/// Datagrams applied per `poll`, so a storm cannot hold the caller forever.
const DRAIN_LIMIT: usize = 8192;
/// Datagrams discarded at most before a resync dump (see `resync`).
const RESYNC_DRAIN_LIMIT: usize = 1 << 22;
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
const NEIGH_ACK_TIMEOUT: Duration = Duration::from_secs(1);

const AF_UNSPEC: u8 = libc::AF_UNSPEC as u8;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;
const NLM_F_REQUEST: u16 = libc::NLM_F_REQUEST as u16;
const NLM_F_ACK: u16 = libc::NLM_F_ACK as u16;
const NLM_F_DUMP: u16 = libc::NLM_F_DUMP as u16;
const NTF_USE: u8 = 0x01;
const NDA_DST: u16 = 1;

/// What the kernel may have changed without telling us, collected while
/// applying a batch of events and acted upon once at the end.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Followups {
    /// Re-dump routes, next-hop objects and neighbours.
    pub fib: bool,
    /// Re-dump the policy rules.
    pub rules: bool,
    /// Re-dump the buckets of resilient groups.
    pub buckets: bool,
    /// Re-read the sysctls of every link.
    pub all_sysctls: bool,
    /// Re-read the sysctls of these links.
    pub link_sysctls: BTreeSet<u32>,
    /// Re-dump everything (an event we could not decode).
    pub full: bool,
    /// Next-hop objects deleted: re-dump (`fib`) only if a route or group
    /// still uses one once the batch is in (`settle`).
    pub gone_objects: Vec<u32>,
    /// IPv4 addresses deleted from an interface that keeps another one
    /// (`Mirror::settle_sources`).
    pub gone_sources: Vec<IpAddr>,
    /// Interfaces that lost their last IPv4 address: the kernel flushed
    /// every IPv4 route through them, unannounced (`fib` re-dumps them).
    pub v4_flushed: Vec<u32>,
}

impl Followups {
    /// After a batch. Deleting a next-hop object takes the routes using it
    /// with it, and takes it out of its groups, without a message each; so
    /// the routes are re-dumped when the state still has a route or group
    /// using a deleted object. Otherwise nothing went unannounced: FRR
    /// deletes a group only once no route uses it any more (and a member
    /// once its groups are gone), and re-dumping a full table for each such
    /// delete took seconds.
    pub fn settle(&mut self, state: &KernelState) {
        if self.fib || self.gone_objects.is_empty() {
            return;
        }
        let gone: HashSet<u32> = self.gone_objects.iter().copied().collect();
        self.fib = state.nexthops.values().any(|o| o.group.iter().any(|(m, _)| gone.contains(m)))
            || state.routes.values().any(|r| matches!(r.target, RouteTarget::Object(id) if gone.contains(&id)));
    }
}

/// Applies one decoded message to `state`; true if the state changed.
/// Work the message implies beyond itself is recorded in `f`.
pub fn apply(state: &mut KernelState, msg: Msg, f: &mut Followups) -> bool {
    match msg {
        Msg::NewLink(link) => {
            let idx = link.ifindex;
            f.link_sysctls.insert(idx);
            match state.links.insert(idx, link.clone()) {
                Some(old) => {
                    let carrier_back = old.admin_up && link.admin_up && !old.running && link.running && old.mtu == link.mtu;
                    if carrier_back && !objects_on(state, idx) {
                        // Carrier back, nothing else: the kernel clears
                        // RTNH_F_LINKDOWN on every next hop through the link
                        // (fib_sync_up, fib6_ifup) and says nothing more, so
                        // clearing it here is the whole re-dump (1-2 s with
                        // a full table). Objects are left to the re-dump.
                        clear_linkdown(state, idx);
                    } else if old.admin_up != link.admin_up || old.running != link.running || old.mtu != link.mtu {
                        // IPv4/IPv6 flush or mark routes and neighbours on these without a message each.
                        f.fib = true;
                    }
                    old != link
                }
                None => true,
            }
        }
        Msg::DelLink(idx) => {
            let mut changed = state.links.remove(&idx).is_some();
            let addrs = state.addrs.len();
            state.addrs.retain(|a, _| a.ifindex != idx);
            let neighs = state.neighbours.len();
            state.neighbours.retain(|(i, _), _| *i != idx);
            changed |= addrs != state.addrs.len() || neighs != state.neighbours.len();
            changed |= state.if_sysctl.remove(&idx).is_some();
            f.link_sysctls.remove(&idx);
            f.fib = true;
            changed
        }
        Msg::NewAddr(a) => {
            // disable_ipv6 switched either way shows as its addresses
            // going or coming; no message says so (`ipv6_switched`).
            if a.addr.is_ipv6() {
                f.link_sysctls.insert(a.ifindex);
            }
            state.addrs.insert(a, ()).is_none()
        }
        Msg::DelAddr(a) => {
            if a.addr.is_ipv6() {
                f.link_sysctls.insert(a.ifindex);
            }
            let changed = state.addrs.remove(&a).is_some();
            // IPv4 flushes, unannounced, the routes whose preferred source
            // the address was, and with an interface's last address every
            // route through it (fib_del_ifaddr, fib_disable_ip). Only the
            // former can be told from the state, once the burst (with the
            // announced deletion of the address's own routes) is in:
            // `Mirror::settle_sources`. IPv6 announces the deletion of the
            // address's local, anycast and prefix routes and only clears
            // other routes' preferred source (not kept): nothing to re-dump.
            match a.addr {
                IpAddr::V4(_) if state.addrs.keys().any(|o| o.ifindex == a.ifindex && o.addr.is_ipv4()) => {
                    f.gone_sources.push(a.addr)
                }
                IpAddr::V4(_) => {
                    f.fib = true;
                    f.v4_flushed.push(a.ifindex);
                }
                IpAddr::V6(_) => {}
            }
            changed
        }
        Msg::NewRoute(fam, route) => insert_route(state, fam, route),
        Msg::AddRoute(fam, route) => {
            match state.routes.entry((fam, route.key.clone())) {
                Entry::Occupied(mut old) if *old.get() != route => {
                    // A second, different route under a key we hold. IPv4: aliases
                    // (append/prepend), the kernel uses the first. IPv6: not only
                    // multipath siblings — the kernel keeps equal-metric device
                    // routes side by side (the same subnet on two interfaces gives
                    // two `proto kernel` routes) and may pick either. Either way
                    // one entry cannot say what the kernel does: punt the prefix and
                    // let a re-dump tell what really exists (a multipath set comes
                    // back from the dump as one RTA_MULTIPATH message).
                    if !parse::is_opaque(old.get()) {
                        old.insert(alias_marker(route.key.clone()));
                        f.fib = true;
                        return true;
                    }
                    false
                }
                Entry::Occupied(_) => false,
                Entry::Vacant(v) => {
                    v.insert(route);
                    true
                }
            }
        }
        Msg::DelRoute(fam, route) => {
            let key = (fam, route.key.clone());
            match state.routes.get(&key) {
                None => false,
                Some(old) if old.kind == route.kind && old.target == route.target => {
                    // An opaque entry may have been hiding a plain route with the same key.
                    if parse::is_opaque(old) {
                        f.fib = true;
                    }
                    state.routes.swap_remove(&key);
                    true
                }
                Some(_) => {
                    // One member of a multipath route, or a route we hold differently: ask the kernel.
                    f.fib = true;
                    false
                }
            }
        }
        Msg::NewNexthop(nh) => {
            let changed = state.nexthops.get(&nh.id) != Some(&nh);
            if nh.resilient && changed {
                f.buckets = true;
            }
            if !nh.resilient {
                state.res_buckets.remove(&nh.id);
            }
            state.nexthops.insert(nh.id, nh);
            changed
        }
        Msg::DelNexthop(id) => {
            // Routes using the object vanish with it, not always with a message.
            f.gone_objects.push(id);
            state.res_buckets.remove(&id);
            state.nexthops.remove(&id).is_some()
        }
        Msg::NewBucket { group, index, nh_id } => {
            state.res_buckets.entry(group).or_default().insert(index, nh_id) != Some(nh_id)
        }
        Msg::NewNeigh(n) => {
            // The tables depend on a neighbour's MAC and on whether its state
            // is usable, nothing else; moves among REACHABLE/STALE/DELAY/PROBE
            // (the keep-alive causes a few per neighbour per second) are
            // stored but need no recompute.
            let key = (n.ifindex, n.addr);
            let forwarding = |m: &Neighbour| (m.mac, m.state & NUD_USABLE != 0);
            let changed = state.neighbours.get(&key).map(forwarding) != Some(forwarding(&n));
            state.neighbours.insert(key, n);
            changed
        }
        Msg::DelNeigh(ifindex, addr) => state.neighbours.remove(&(ifindex, addr)).is_some(),
        Msg::NewRule(_) | Msg::DelRule(_) => {
            // Our Rule drops the selectors, so distinct kernel rules can look alike;
            // the few rules there are get re-dumped instead of patched.
            f.rules = true;
            false
        }
        Msg::Netconf => {
            f.all_sysctls = true;
            false
        }
        Msg::Ignored => false,
    }
}

/// Which of the kernel's routes and next-hop objects the mirror keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteScope {
    #[default]
    All,
    /// Only the local table's routes (the router's own addresses), no
    /// next-hop objects: another source (FPM) provides the rest, and the
    /// kernel's copy of it (zebra programs the kernel too, others may add
    /// routes there) must neither enter the state nor replace it.
    LocalTable,
}

impl RouteScope {
    /// Whether `msg` is one the mirror applies.
    pub fn takes(self, msg: &Msg) -> bool {
        match (self, msg) {
            (RouteScope::All, _) => true,
            (_, Msg::NewRoute(_, r) | Msg::AddRoute(_, r) | Msg::DelRoute(_, r)) => r.key.table == RT_TABLE_LOCAL,
            (_, Msg::NewNexthop(_) | Msg::DelNexthop(_) | Msg::NewBucket { .. }) => false,
            _ => true,
        }
    }
}

/// What the state took in since the daemon last asked (`Mirror::take_touched`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Touched {
    /// Keys of routes that route messages added, replaced or deleted.
    pub routes: Vec<(Family, RouteKey)>,
    /// Neighbour messages changed a MAC or whether a neighbour is usable.
    pub neighbours: bool,
    /// Next-hop objects replaced (`route_delta::object_users` finds the
    /// routes that use them). A new object needs nothing: no route or group
    /// can use it before it exists; a deleted one neither, unless routes
    /// used it, and then they are re-dumped (`other`).
    pub nexthops: Vec<u32>,
    /// Next-hop objects deleted: the routes using them vanish, unannounced
    /// (if any did, `other` is set too: they are re-dumped).
    pub gone_nexthops: Vec<u32>,
    /// Links whose carrier came back and nothing else changed, where that
    /// changes nothing but their interface entry (`carrier_back_only`).
    pub carrier_back: Vec<u32>,
    /// Anything else changed (links, addresses, next hops, rules, sysctls,
    /// a re-dump): only a full recompute is exact.
    pub other: bool,
}

/// What `Mirror::poll` shows its `ahead` hook besides the state.
#[derive(Debug, Clone, Copy)]
pub struct Ahead<'a> {
    /// Keys of the routes this poll's messages touched.
    pub routes: &'a [(Family, RouteKey)],
    /// More than routes, next-hop objects and neighbours changed since the
    /// last `take_touched`.
    pub other: bool,
    /// Next-hop objects this poll's messages deleted (their routes are
    /// still in the state: the re-dump that drops them comes after).
    pub gone_nexthops: &'a [u32],
    /// Interfaces whose last IPv4 address this poll's messages deleted
    /// (the routes the kernel flushed with it are still in the state).
    pub v4_flushed: &'a [u32],
}

/// `apply`, noting in `t` what changed.
pub fn apply_noting(state: &mut KernelState, msg: Msg, f: &mut Followups, t: &mut Touched) -> bool {
    let key = match &msg {
        Msg::NewRoute(fam, r) | Msg::AddRoute(fam, r) | Msg::DelRoute(fam, r) => Some((*fam, r.key.clone())),
        _ => None,
    };
    let neighbour = matches!(msg, Msg::NewNeigh(_) | Msg::DelNeigh(..));
    let object = match &msg {
        Msg::NewNexthop(nh) => Some(state.nexthops.contains_key(&nh.id).then_some(nh.id)),
        // Touches no route: if any used it, they are re-dumped (`Followups::settle`).
        Msg::DelNexthop(_) => Some(None),
        _ => None,
    };
    if let Msg::DelNexthop(id) = &msg {
        t.gone_nexthops.push(*id);
    }
    let carrier = match &msg {
        Msg::NewLink(l) => state.links.get(&l.ifindex).is_some_and(|old| carrier_back_only(old, l, state)).then_some(l.ifindex),
        _ => None,
    };
    let changed = apply(state, msg, f);
    if changed {
        match (key, object, carrier) {
            (Some(k), _, _) => t.routes.push(k),
            (None, Some(replaced), _) => t.nexthops.extend(replaced),
            (None, None, Some(idx)) => {
                t.carrier_back.push(idx);
                // A multipath member that was marked down was a path the
                // data plane punts: those routes change too.
                t.routes.extend(multipath_through(state, idx));
            }
            _ if neighbour => t.neighbours = true,
            _ => t.other = true,
        }
    }
    changed
}

/// A next-hop object has a hop through `ifindex`.
fn objects_on(state: &KernelState, ifindex: u32) -> bool {
    state.nexthops.values().any(|o| o.hop.as_ref().is_some_and(|h| h.ifindex == ifindex))
}

/// `new` is `old` with its carrier back and nothing else, `apply` clears
/// the link-down marks itself (no next-hop object on the link), and the
/// marks never counted (ignore_routes_with_linkdown off for both
/// families): then what `desired` makes of the routes is the same before
/// and after, but for multipath routes with a member through the link
/// (a marked member is a punted path: `multipath_through`), and the link's
/// interface entry.
pub fn carrier_back_only(old: &Link, new: &Link, state: &KernelState) -> bool {
    let back = Link { running: true, ..old.clone() };
    let ignored = state.sysctl.ignore_linkdown4_all
        || state.if_sysctl.get(&new.ifindex).is_none_or(|s| s.ignore_linkdown4 || s.ignore_linkdown6);
    !old.running && old.admin_up && back == *new && !ignored && !objects_on(state, new.ifindex)
}

/// Keys of the multipath routes with a member through `ifindex`.
fn multipath_through(state: &KernelState, ifindex: u32) -> Vec<(Family, RouteKey)> {
    state
        .routes
        .iter()
        .filter(|(_, r)| matches!(&r.target, RouteTarget::Multipath(hs) if hs.iter().any(|h| h.ifindex == ifindex)))
        .map(|(k, _)| k.clone())
        .collect()
}

/// RTNH_F_LINKDOWN off every route next hop through `ifindex`.
fn clear_linkdown(state: &mut KernelState, ifindex: u32) {
    const RTNH_F_LINKDOWN: u32 = 16;
    for r in state.routes.values_mut() {
        let hops = match &mut r.target {
            RouteTarget::Single(h) => std::slice::from_mut(h),
            RouteTarget::Multipath(hs) => hs.as_mut_slice(),
            RouteTarget::None | RouteTarget::Object(_) => continue,
        };
        for h in hops.iter_mut().filter(|h| h.ifindex == ifindex) {
            h.flags &= !RTNH_F_LINKDOWN;
        }
    }
}

/// The opaque (punted) entry standing for several routes under one key.
fn alias_marker(key: RouteKey) -> Route {
    Route {
        key,
        kind: RouteKind::Other(1),
        target: RouteTarget::None,
        mtu: 0,
        mtu_locked: false,
        encap: false,
        prefsrc: None,
    }
}

/// One hash lookup per route: at a million routes the second one shows.
fn insert_route(state: &mut KernelState, fam: Family, route: Route) -> bool {
    match state.routes.entry((fam, route.key.clone())) {
        Entry::Occupied(mut old) => {
            if *old.get() == route || (parse::is_opaque(old.get()) && !parse::is_opaque(&route)) {
                return false;
            }
            old.insert(route);
        }
        Entry::Vacant(v) => {
            v.insert(route);
        }
    }
    true
}

fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes; MSG_TRUNC makes the return value
    // the real datagram length, which we compare against buf.len().
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags | libc::MSG_TRUNC,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn set_recv_timeout(fd: RawFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: passes a pointer to a live timeval and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Waits until `fd` is readable or `timeout` passes; true if it may be readable.
fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        // A signal: let the caller drain (non-blocking) and come back.
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(true)
        } else {
            Err(e)
        };
    }
    Ok(rc > 0)
}

fn request_socket() -> io::Result<Socket> {
    let mut s = Socket::new(NETLINK_ROUTE)?;
    s.bind_auto()?;
    set_recv_timeout(s.as_raw_fd(), REPLY_TIMEOUT)?;
    Ok(s)
}

fn errno_error(code: i32) -> MirrorError {
    MirrorError::Io(io::Error::from_raw_os_error(-code))
}

/// A link whose disable_ipv6 changed. Turning IPv6 off takes the link's
/// IPv6 routes with it, and on again brings its link-local ones back,
/// unannounced when net.ipv6.route.skip_notify_on_dev_down is set: the
/// routes are re-dumped whatever that sysctl says (it is rarely done).
fn ipv6_switched(before: &BTreeMap<u32, IfSysctl>, after: &BTreeMap<u32, IfSysctl>) -> bool {
    after.iter().any(|(i, s)| before.get(i).is_some_and(|o| o.disable_ipv6 != s.disable_ipv6))
}

pub struct Mirror {
    events: Socket,
    dumper: Socket,
    seq: u32,
    resyncs: u64,
    buf: Vec<u8>,
    sysctl: SysctlReader,
    touched: Touched,
    scope: RouteScope,
    /// IPv4 addresses deleted since the last re-dump (`settle_sources`).
    gone_sources: Vec<IpAddr>,
    redumps: u64,
}

impl Mirror {
    /// Opens the event socket, subscribed to every group we follow, with this receive buffer.
    pub fn open(rcvbuf: usize) -> Result<Mirror, MirrorError> {
        let mut events = Socket::new(NETLINK_ROUTE)?;
        let size = libc::c_int::try_from(rcvbuf).unwrap_or(libc::c_int::MAX);
        // SO_RCVBUFFORCE ignores rmem_max but needs CAP_NET_ADMIN.
        if let Err(e) = setsockopt_int(
            events.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            size,
        ) {
            log::debug!(
                "SO_RCVBUFFORCE: {e}; falling back to SO_RCVBUF (capped by net.core.rmem_max)"
            );
            events.set_rx_buf_sz(size)?;
        }
        events.bind_auto()?;
        for group in GROUPS {
            // NEXTHOP is group 32: beyond the bind() bitmask, so always by membership.
            events.add_membership(group)?;
        }
        Ok(Mirror {
            events,
            dumper: request_socket()?,
            seq: 0,
            resyncs: 0,
            buf: vec![0; RECV_BUF],
            sysctl: SysctlReader::default(),
            touched: Touched::default(),
            scope: RouteScope::All,
            gone_sources: Vec::new(),
            redumps: 0,
        })
    }

    /// Set before the first dump.
    pub fn set_scope(&mut self, scope: RouteScope) {
        self.scope = scope;
    }

    /// A full dump of links, addresses, routes (all tables), next-hop objects,
    /// neighbours, rules and the sysctls we need.
    pub fn dump(&mut self) -> Result<KernelState, MirrorError> {
        let mut st = KernelState::default();
        let mut f = Followups::default();
        self.gone_sources.clear();
        for m in self.dump_msgs(parse::RTM_GETLINK, AF_UNSPEC, 16)? {
            apply(&mut st, m, &mut f);
        }
        for m in self.dump_msgs(parse::RTM_GETADDR, AF_UNSPEC, 8)? {
            apply(&mut st, m, &mut f);
        }
        self.dump_fib_into(&mut st)?;
        st.rules = self.dump_rules()?;
        let (per_link, global) = self.sysctl.read_all(&st.links);
        st.if_sysctl = per_link;
        st.sysctl = global;
        Ok(st)
    }

    /// Waits up to `timeout` for events and applies them all to `state`.
    /// `ahead` sees the state once the events (and the sysctls and rules they point
    /// to) are in, before the re-dumps they may need, with the keys of the
    /// routes this call's events touched and whether anything but routes and
    /// neighbours changed since the last `take_touched`: with a full table a
    /// re-dump, or the full recompute that follows, takes seconds, and what
    /// a change takes away must not wait for it (`iface_restrict`,
    /// `local_ahead`).
    pub fn poll(
        &mut self,
        state: &mut KernelState,
        timeout: Duration,
        ahead: &mut dyn FnMut(&KernelState, &Ahead),
    ) -> Result<PollOutcome, MirrorError> {
        if !wait_readable(self.events.as_raw_fd(), timeout)? {
            return Ok(PollOutcome::Idle);
        }
        let first_route = self.touched.routes.len();
        let first_gone = self.touched.gone_nexthops.len();
        let mut changed = false;
        let mut f = Followups::default();
        for _ in 0..DRAIN_LIMIT {
            let n = match recv(self.events.as_raw_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    log::warn!("netlink event socket overran; full resync");
                    self.touched.other = true;
                    *state = self.resync()?;
                    self.resyncs += 1;
                    return Ok(PollOutcome::Resynced);
                }
                Err(e) => return Err(e.into()),
            };
            if n > self.buf.len() {
                log::warn!("netlink event of {n} bytes truncated; full re-dump");
                f.full = true;
                continue;
            }
            for frame in parse::frames(&self.buf[..n]) {
                let frame = match frame {
                    Ok(fr) => fr,
                    Err(e) => {
                        log::warn!("bad netlink datagram ({e}); full re-dump");
                        f.full = true;
                        break;
                    }
                };
                match parse::decode_frame(&frame) {
                    Ok(m) if !self.scope.takes(&m) => {}
                    Ok(m) => changed |= apply_noting(state, m, &mut f, &mut self.touched),
                    Err(e) => {
                        log::warn!("undecodable event ({e}); full re-dump");
                        f.full = true;
                    }
                }
            }
        }
        f.settle(state);
        // Every follow-up re-reads more than a route; the link sysctls
        // only matter if they changed (below).
        if f.full || f.fib || f.buckets || f.rules || f.all_sysctls {
            self.touched.other = true;
        }
        if f.all_sysctls {
            let before = state.if_sysctl.clone();
            changed |= self.refresh_sysctls_only(state);
            f.fib |= ipv6_switched(&before, &state.if_sysctl);
        } else if !f.link_sysctls.is_empty() {
            let all_rp = self.sysctl.all_rp_filter();
            for idx in std::mem::take(&mut f.link_sysctls) {
                let Some(link) = state.links.get(&idx) else {
                    continue;
                };
                let s = self.sysctl.link(&link.name, all_rp);
                if state.if_sysctl.get(&idx) != Some(&s) {
                    f.fib |= state.if_sysctl.get(&idx).is_some_and(|o| o.disable_ipv6 != s.disable_ipv6);
                    state.if_sysctl.insert(idx, s);
                    changed = true;
                    self.touched.other = true;
                }
            }
        }
        // Rules are few: read before `ahead` too.
        if f.rules {
            let rules = self.dump_rules()?;
            if rules != state.rules {
                state.rules = rules;
                changed = true;
            }
        }
        if self.touched.other || self.touched.routes.len() > first_route {
            let a = Ahead {
                routes: &self.touched.routes[first_route..],
                other: self.touched.other,
                gone_nexthops: &self.touched.gone_nexthops[first_gone..],
                v4_flushed: &f.v4_flushed,
            };
            ahead(state, &a);
        }
        if f.full {
            let fresh = self.resync()?;
            let changed = *state != fresh;
            *state = fresh;
            return Ok(if changed {
                PollOutcome::Changed
            } else {
                PollOutcome::Idle
            });
        }
        self.gone_sources.append(&mut f.gone_sources);
        if f.fib {
            changed |= self.refresh_fib(state)?;
        }
        if f.buckets && !f.fib {
            changed |= self.refresh_buckets(state)?;
        }
        Ok(if changed {
            PollOutcome::Changed
        } else {
            PollOutcome::Idle
        })
    }

    /// After a burst of events (the caller polled until the kernel went
    /// quiet): re-dumps the routes if an IPv4 address deleted meanwhile is
    /// still some route's preferred source. The kernel flushed those routes
    /// without a message; the address's own local, broadcast and subnet
    /// routes it deleted with one, and those are in by now. True if the
    /// re-dump changed the state.
    pub fn settle_sources(&mut self, state: &mut KernelState) -> Result<bool, MirrorError> {
        if self.gone_sources.is_empty() {
            return Ok(false);
        }
        let gone: HashSet<IpAddr> = self.gone_sources.iter().copied().collect();
        if !state.routes.values().any(|r| r.prefsrc.is_some_and(|a| gone.contains(&a))) {
            self.gone_sources.clear();
            return Ok(false);
        }
        self.touched.other = true;
        self.refresh_fib(state)
    }

    /// Route re-dumps so far.
    pub fn redumps(&self) -> u64 {
        self.redumps
    }

    /// What `poll` and the refreshes changed since the last call.
    pub fn take_touched(&mut self) -> Touched {
        std::mem::take(&mut self.touched)
    }

    /// Re-reads every sysctl we keep into `state`; true if one changed. IPv6 switched
    /// on or off on a link re-dumps the routes too (`ipv6_switched`).
    pub fn refresh_sysctls(&mut self, state: &mut KernelState) -> Result<bool, MirrorError> {
        let before = state.if_sysctl.clone();
        let changed = self.refresh_sysctls_only(state);
        if ipv6_switched(&before, &state.if_sysctl) {
            if let Err(e) = self.refresh_fib(state) {
                // Found switched, and re-dumped, again the next time.
                state.if_sysctl = before;
                return Err(e);
            }
        }
        Ok(changed)
    }

    fn refresh_sysctls_only(&mut self, state: &mut KernelState) -> bool {
        let (per_link, global) = self.sysctl.read_all(&state.links);
        let changed = per_link != state.if_sysctl || global != state.sysctl;
        self.touched.other |= changed;
        state.if_sysctl = per_link;
        state.sysctl = global;
        changed
    }

    /// Full resyncs done after overruns.
    pub fn resyncs(&self) -> u64 {
        self.resyncs
    }

    pub fn fd(&self) -> RawFd {
        self.events.as_raw_fd()
    }

    /// Drops what is queued (older than the dump we are about to take), then dumps.
    ///
    /// The drain must reach an empty queue: after an overrun the kernel
    /// keeps the socket marked congested, and drops further events without
    /// reporting ENOBUFS again, until a read finds the queue empty
    /// (netlink_rcv_wake). Stopping early while a route storm keeps the
    /// queue full loses events silently, and a full table load is such a
    /// storm. Reading without decoding outpaces the kernel's notifications,
    /// so this ends; the cap only guards against a kernel that never stops.
    fn resync(&mut self) -> Result<KernelState, MirrorError> {
        let mut emptied = false;
        for _ in 0..RESYNC_DRAIN_LIMIT {
            match recv(self.events.as_raw_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    emptied = true;
                    break;
                }
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !emptied {
            log::warn!("netlink event queue never ran empty while resyncing; later overruns may go unreported");
        }
        self.dump()
    }

    /// Re-dumps routes, next-hop objects and neighbours; true if they changed.
    fn refresh_fib(&mut self, state: &mut KernelState) -> Result<bool, MirrorError> {
        let mut fresh = KernelState::default();
        self.dump_fib_into(&mut fresh)?;
        self.redumps += 1;
        // The dump has whatever a deleted address took with it.
        self.gone_sources.clear();
        if self.scope == RouteScope::LocalTable {
            // What the other source put in the state stays.
            let local = |k: &(Family, RouteKey)| k.1.table == RT_TABLE_LOCAL;
            let changed = state.routes.iter().filter(|(k, _)| local(k)).count() != fresh.routes.len()
                || fresh.routes.iter().any(|(k, r)| state.routes.get(k) != Some(r))
                || fresh.neighbours != state.neighbours;
            state.routes.retain(|k, _| !local(k));
            state.routes.extend(fresh.routes);
            state.neighbours = fresh.neighbours;
            return Ok(changed);
        }
        let changed = fresh.routes != state.routes
            || fresh.nexthops != state.nexthops
            || fresh.res_buckets != state.res_buckets
            || fresh.neighbours != state.neighbours;
        state.routes = fresh.routes;
        state.nexthops = fresh.nexthops;
        state.res_buckets = fresh.res_buckets;
        state.neighbours = fresh.neighbours;
        Ok(changed)
    }

    /// A dump of something older kernels lack (next-hop objects, buckets):
    /// their refusal means "none".
    fn dump_optional(&mut self, msg_type: u16, what: &str) -> Result<Vec<Msg>, MirrorError> {
        match self.dump_msgs(msg_type, AF_UNSPEC, 8) {
            Err(MirrorError::Io(e))
                if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL | libc::EAFNOSUPPORT)) =>
            {
                log::debug!("no {what} in this kernel: {e}");
                Ok(Vec::new())
            }
            other => other,
        }
    }

    /// Re-dumps the buckets of every resilient group; true if they changed.
    /// Cheap when there is none: the dump is then empty.
    pub fn refresh_buckets(&mut self, state: &mut KernelState) -> Result<bool, MirrorError> {
        if self.scope == RouteScope::LocalTable {
            return Ok(false);
        }
        let fresh = self.dump_buckets()?;
        let changed = fresh != state.res_buckets;
        self.touched.other |= changed;
        state.res_buckets = fresh;
        Ok(changed)
    }

    fn dump_buckets(&mut self) -> Result<std::collections::BTreeMap<u32, std::collections::BTreeMap<u16, u32>>, MirrorError> {
        let mut out: std::collections::BTreeMap<u32, std::collections::BTreeMap<u16, u32>> = Default::default();
        let msgs = self.dump_optional(parse::RTM_GETNEXTHOPBUCKET, "next-hop buckets")?;
        for m in msgs {
            if let Msg::NewBucket { group, index, nh_id } = m {
                out.entry(group).or_default().insert(index, nh_id);
            }
        }
        Ok(out)
    }

    fn dump_fib_into(&mut self, st: &mut KernelState) -> Result<(), MirrorError> {
        let mut f = Followups::default();
        if self.scope == RouteScope::All {
            let nexthops = self.dump_optional(parse::RTM_GETNEXTHOP, "next-hop objects")?;
            for m in nexthops {
                apply(st, m, &mut f);
            }
            st.res_buckets = self.dump_buckets()?;
        }
        for family in [AF_INET, AF_INET6] {
            let msgs = self.dump_msgs(parse::RTM_GETROUTE, family, 12)?;
            // Grown once instead of rehashing its way up to a full table.
            st.routes.reserve(msgs.len());
            for m in msgs.into_iter().filter(|m| self.scope.takes(m)) {
                apply(st, m, &mut f);
            }
        }
        for family in [AF_INET, AF_INET6] {
            for m in self.dump_msgs(parse::RTM_GETNEIGH, family, 12)? {
                apply(st, m, &mut f);
            }
        }
        Ok(())
    }

    fn dump_rules(&mut self) -> Result<Vec<crate::model::Rule>, MirrorError> {
        let mut rules = Vec::new();
        for family in [AF_INET, AF_INET6] {
            for m in self.dump_msgs(parse::RTM_GETRULE, family, 12)? {
                if let Msg::NewRule(r) = m {
                    rules.push(r);
                }
            }
        }
        Ok(rules)
    }

    /// One dump request; redone while the kernel flags it inconsistent (NLM_F_DUMP_INTR).
    fn dump_msgs(
        &mut self,
        msg_type: u16,
        family: u8,
        hdr_len: usize,
    ) -> Result<Vec<Msg>, MirrorError> {
        let mut hdr = vec![0u8; hdr_len];
        hdr[0] = family;
        for _ in 0..DUMP_RETRIES {
            self.seq = self.seq.wrapping_add(1);
            let seq = self.seq;
            let req = parse::request(msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, &hdr);
            self.dumper.send_to(&req, &SocketAddr::new(0, 0), 0)?;
            let mut out = Vec::new();
            let mut interrupted = false;
            'recv: loop {
                let n = match recv(self.dumper.as_raw_fd(), &mut self.buf, 0) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Err(MirrorError::Protocol(format!(
                            "dump type {msg_type}: no reply from the kernel"
                        )))
                    }
                    Err(e) => return Err(e.into()),
                };
                if n > self.buf.len() {
                    return Err(MirrorError::Protocol(format!(
                        "dump type {msg_type}: {n}-byte reply truncated"
                    )));
                }
                for frame in parse::frames(&self.buf[..n]) {
                    let frame = frame.map_err(|e| MirrorError::Protocol(e.to_string()))?;
                    if frame.seq != seq {
                        continue; // a late reply to an earlier, abandoned request
                    }
                    if frame.flags & parse::NLM_F_DUMP_INTR != 0 {
                        interrupted = true;
                    }
                    match frame.msg_type {
                        parse::NLMSG_DONE => {
                            let code = parse::status_code(frame.payload);
                            if code < 0 {
                                return Err(errno_error(code));
                            }
                            break 'recv;
                        }
                        parse::NLMSG_ERROR => {
                            let code = parse::status_code(frame.payload);
                            if code < 0 {
                                return Err(errno_error(code));
                            }
                        }
                        parse::NLMSG_NOOP | parse::NLMSG_OVERRUN => {}
                        _ => match parse::decode_frame(&frame) {
                            Ok(m) => out.push(m),
                            Err(e) => log::warn!("dump: skipping undecodable message ({e})"),
                        },
                    }
                }
            }
            if !interrupted {
                return Ok(out);
            }
            log::debug!("dump type {msg_type} family {family} interrupted by a change; redoing it");
        }
        Err(MirrorError::Protocol(format!(
            "dump type {msg_type} interrupted {DUMP_RETRIES} times in a row"
        )))
    }
}

/// Tells the kernel a neighbour is in use (RTM_NEWNEIGH with NTF_USE), so it
/// keeps it alive and re-probes it exactly as if it had sent traffic to it.
///
/// The kernel (neigh_add) calls neigh_event_send() for NTF_USE instead of
/// updating the entry: it refreshes `used`, and a STALE entry goes to DELAY,
/// then PROBE (unicast) and back to REACHABLE when the neighbour answers.
/// Without NLM_F_CREATE a missing entry is ENOENT rather than created.
pub fn neigh_use(ifindex: u32, addr: IpAddr) -> Result<(), MirrorError> {
    thread_local! {
        static SOCK: RefCell<Option<Socket>> = const { RefCell::new(None) };
    }
    static SEQ: AtomicU32 = AtomicU32::new(1);

    let (family, dst): (u8, Vec<u8>) = match addr {
        IpAddr::V4(a) => (AF_INET, a.octets().to_vec()),
        IpAddr::V6(a) => (AF_INET6, a.octets().to_vec()),
    };
    // struct ndmsg { u8 family, pad1; u16 pad2; s32 ifindex; u16 state; u8 flags; u8 type; }
    let mut body = vec![family, 0, 0, 0];
    body.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    body.extend_from_slice(&0u16.to_ne_bytes());
    body.push(NTF_USE);
    body.push(0);
    parse::push_attr(&mut body, NDA_DST, &dst);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let req = parse::request(parse::RTM_NEWNEIGH, NLM_F_REQUEST | NLM_F_ACK, seq, &body);

    SOCK.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let s = request_socket()?;
            set_recv_timeout(s.as_raw_fd(), NEIGH_ACK_TIMEOUT)?;
            *slot = Some(s);
        }
        let Some(sock) = slot.as_ref() else {
            return Err(MirrorError::Protocol("no netlink socket".into()));
        };
        let result = send_and_ack(sock, &req, seq);
        if matches!(result, Err(MirrorError::Io(_))) {
            // Drop a socket in an unknown state; the next call opens a fresh one.
            *slot = None;
        }
        result
    })
}

fn send_and_ack(sock: &Socket, req: &[u8], seq: u32) -> Result<(), MirrorError> {
    sock.send_to(req, &SocketAddr::new(0, 0), 0)?;
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match recv(sock.as_raw_fd(), &mut buf, 0) {
            Ok(n) => n.min(buf.len()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        for frame in parse::frames(&buf[..n]) {
            let frame = frame.map_err(|e| MirrorError::Protocol(e.to_string()))?;
            if frame.seq != seq || frame.msg_type != parse::NLMSG_ERROR {
                continue;
            }
            let code = parse::status_code(frame.payload);
            return if code < 0 {
                Err(errno_error(code))
            } else {
                Ok(())
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{ip, main_route};
    use crate::model::*;

    fn route(dst: &str, len: u8, target: RouteTarget) -> Route {
        main_route(dst, len, target)
    }

    fn via(ifindex: u32, gw: &str) -> NextHop {
        NextHop {
            ifindex,
            gateway: Some(ip(gw)),
            flags: 0,
            weight: 1,
        }
    }

    fn link(ifindex: u32, up: bool, running: bool) -> Link {
        Link {
            ifindex,
            name: format!("eth{ifindex}"),
            mac: Some([2, 0, 0, 0, 0, ifindex as u8]),
            mtu: 1500,
            admin_up: up,
            running,
            arphrd: 1,
            kind: None,
            master: None,
        }
    }

    fn neigh(ifindex: u32, addr: &str, state: u16) -> Neighbour {
        Neighbour {
            ifindex,
            addr: ip(addr),
            mac: Some([2, 0, 0, 0, 0, 9]),
            state,
            flags: 0,
        }
    }

    fn run(st: &mut KernelState, msg: Msg) -> (bool, Followups) {
        let mut f = Followups::default();
        let changed = apply(st, msg, &mut f);
        (changed, f)
    }

    #[test]
    fn apply_noting_tells_route_keys_and_neighbours_from_everything_else() {
        let mut st = KernelState::default();
        let mut t = Touched::default();
        let mut f = Followups::default();
        let a = route("198.51.100.0", 24, RouteTarget::Single(via(3, "192.0.2.2")));
        assert!(apply_noting(&mut st, Msg::NewRoute(Family::V4, a.clone()), &mut f, &mut t));
        // No change, nothing noted.
        assert!(!apply_noting(&mut st, Msg::NewRoute(Family::V4, a.clone()), &mut f, &mut t));
        assert!(apply_noting(&mut st, Msg::DelRoute(Family::V4, a.clone()), &mut f, &mut t));
        let k = (Family::V4, a.key.clone());
        assert_eq!(t, Touched { routes: vec![k.clone(), k.clone()], ..Touched::default() });
        assert!(apply_noting(&mut st, Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_REACHABLE)), &mut f, &mut t));
        assert!(apply_noting(&mut st, Msg::DelNeigh(3, ip("192.0.2.2")), &mut f, &mut t));
        assert_eq!(t, Touched { routes: vec![k.clone(), k.clone()], neighbours: true, ..Touched::default() });
        // A next-hop object replaced is noted by id (a new one concerns no
        // route yet); its deletion only as gone (the routes that vanish with
        // it, unannounced, are re-dumped: `settle`).
        let obj = NexthopObject { id: 7, blackhole: false, hop: Some(via(3, "192.0.2.2")), group: vec![], resilient: false, n_buckets: 0, unsupported: false };
        assert!(apply_noting(&mut st, Msg::NewNexthop(obj.clone()), &mut f, &mut t));
        assert!(!apply_noting(&mut st, Msg::NewNexthop(obj.clone()), &mut f, &mut t));
        assert_eq!(t, Touched { routes: vec![k.clone(), k.clone()], neighbours: true, ..Touched::default() });
        let moved = NexthopObject { hop: Some(via(3, "192.0.2.3")), ..obj };
        assert!(apply_noting(&mut st, Msg::NewNexthop(moved), &mut f, &mut t));
        assert_eq!(t, Touched { routes: vec![k.clone(), k.clone()], neighbours: true, nexthops: vec![7], ..Touched::default() });
        assert!(apply_noting(&mut st, Msg::DelNexthop(7), &mut f, &mut t));
        assert!(!t.other && t.gone_nexthops == [7] && t.nexthops == [7] && f.gone_objects == [7]);
    }

    #[test]
    fn routes_new_replace_delete_by_key() {
        let mut st = KernelState::default();
        let a = route("198.51.100.0", 24, RouteTarget::Single(via(3, "192.0.2.2")));
        let k = (Family::V4, a.key.clone());
        assert_eq!(
            run(&mut st, Msg::NewRoute(Family::V4, a.clone())),
            (true, Followups::default())
        );
        assert!(!run(&mut st, Msg::NewRoute(Family::V4, a.clone())).0);
        // NLM_F_REPLACE or not: same key, last wins.
        let b = route("198.51.100.0", 24, RouteTarget::Single(via(4, "192.0.2.3")));
        assert!(run(&mut st, Msg::NewRoute(Family::V4, b.clone())).0);
        assert_eq!(st.routes[&k], b);
        // Same prefix in another table, family or metric is another route.
        let mut other = b.clone();
        other.key.priority = 10;
        run(&mut st, Msg::NewRoute(Family::V4, other.clone()));
        run(&mut st, Msg::NewRoute(Family::V6, b.clone()));
        assert_eq!(st.routes.len(), 3);
        // A delete that names exactly what we hold removes it, nothing else to do.
        assert_eq!(
            run(&mut st, Msg::DelRoute(Family::V4, b)),
            (true, Followups::default())
        );
        assert!(!st.routes.contains_key(&k));
        assert_eq!(st.routes.len(), 2);
        // Deleting what we do not hold is a no-op.
        assert_eq!(
            run(&mut st, Msg::DelRoute(Family::V4, a)),
            (false, Followups::default())
        );
    }

    #[test]
    fn ipv4_alias_is_punted_until_a_redump_says_otherwise() {
        let mut st = KernelState::default();
        let a = route("203.0.113.0", 25, RouteTarget::Single(via(3, "192.0.2.2")));
        let b = route("203.0.113.0", 25, RouteTarget::Single(via(3, "192.0.2.3")));
        let k = (Family::V4, a.key.clone());
        assert_eq!(
            run(&mut st, Msg::AddRoute(Family::V4, a.clone())),
            (true, Followups::default())
        );
        // The same add again (an event queued during a dump) changes nothing.
        assert_eq!(
            run(&mut st, Msg::AddRoute(Family::V4, a.clone())),
            (false, Followups::default())
        );
        let (changed, f) = run(&mut st, Msg::AddRoute(Family::V4, b.clone()));
        assert!(changed && f.fib);
        assert!(parse::is_opaque(&st.routes[&k]));
        assert!(!run(&mut st, Msg::AddRoute(Family::V4, b.clone())).0);
        // Deleting one alias does not match the marker: re-dump.
        let (changed, f) = run(&mut st, Msg::DelRoute(Family::V4, a));
        assert!(!changed && f.fib);
        // IPv6 too: a different second route under the key (equal-metric
        // device routes, or a sibling announced alone) is punted until re-dumped.
        let mut st = KernelState::default();
        run(
            &mut st,
            Msg::AddRoute(
                Family::V6,
                route("2001:db8::", 64, RouteTarget::Single(via(3, "fe80::2"))),
            ),
        );
        let mp = route(
            "2001:db8::",
            64,
            RouteTarget::Multipath(vec![via(3, "fe80::2"), via(3, "fe80::3")]),
        );
        let (changed, f) = run(&mut st, Msg::AddRoute(Family::V6, mp.clone()));
        assert!(changed && f.fib);
        assert!(parse::is_opaque(&st.routes[&(Family::V6, mp.key.clone())]));
    }

    #[test]
    fn multipath_member_delete_asks_for_a_redump() {
        let mut st = KernelState::default();
        let mp = route(
            "2001:db8:3::",
            64,
            RouteTarget::Multipath(vec![via(3, "fe80::2"), via(3, "fe80::3")]),
        );
        run(&mut st, Msg::NewRoute(Family::V6, mp.clone()));
        let member = route("2001:db8:3::", 64, RouteTarget::Single(via(3, "fe80::3")));
        let (changed, f) = run(&mut st, Msg::DelRoute(Family::V6, member));
        assert!(!changed && f.fib);
        assert_eq!(st.routes[&(Family::V6, mp.key.clone())], mp);
    }

    #[test]
    fn opaque_route_wins_over_a_plain_one_with_its_key() {
        let mut st = KernelState::default();
        let plain = route("::", 0, RouteTarget::Single(via(3, "fe80::1")));
        let mut src = route("::", 0, RouteTarget::None);
        src.kind = RouteKind::Other(1);
        let k = (Family::V6, plain.key.clone());
        run(&mut st, Msg::NewRoute(Family::V6, src.clone()));
        assert!(!run(&mut st, Msg::NewRoute(Family::V6, plain.clone())).0);
        assert_eq!(st.routes[&k], src);
        // Removing it re-dumps: the plain route may still be there.
        let (changed, f) = run(&mut st, Msg::DelRoute(Family::V6, src));
        assert!(changed && f.fib && !st.routes.contains_key(&k));
    }

    #[test]
    fn carrier_back_clears_linkdown_without_a_redump() {
        const LINKDOWN: u32 = 16;
        let mut st = KernelState::default();
        run(&mut st, Msg::NewLink(link(3, true, true)));
        run(&mut st, Msg::NewLink(link(4, true, true)));
        let down = |i, gw| NextHop { flags: LINKDOWN, ..via(i, gw) };
        let single = route("198.51.100.0", 24, RouteTarget::Single(down(3, "192.0.2.2")));
        let other = route("198.51.101.0", 24, RouteTarget::Single(down(4, "192.0.2.9")));
        let multi = route("203.0.113.0", 24, RouteTarget::Multipath(vec![down(3, "192.0.2.3"), down(4, "192.0.2.4")]));
        for r in [&single, &other, &multi] {
            run(&mut st, Msg::NewRoute(Family::V4, r.clone()));
        }
        let (_, f) = run(&mut st, Msg::NewLink(link(3, true, false)));
        assert!(f.fib, "carrier loss re-dumps");
        st.if_sysctl.insert(3, IfSysctl::default());
        let mut t = Touched::default();
        let mut f = Followups::default();
        assert!(apply_noting(&mut st, Msg::NewLink(link(3, true, true)), &mut f, &mut t));
        assert!(!f.fib, "carrier back is cleared here");
        let mk = (Family::V4, multi.key.clone());
        assert_eq!(t, Touched { carrier_back: vec![3], routes: vec![mk], ..Touched::default() });
        let flags = |r: &Route| match &st.routes[&(Family::V4, r.key.clone())].target {
            RouteTarget::Single(h) => vec![h.flags],
            RouteTarget::Multipath(hs) => hs.iter().map(|h| h.flags).collect(),
            t => panic!("{t:?}"),
        };
        assert_eq!((flags(&single), flags(&other), flags(&multi)), (vec![0], vec![LINKDOWN], vec![0, LINKDOWN]));
        // A next-hop object on the link: its fate is left to the re-dump.
        let obj = NexthopObject { id: 5, blackhole: false, hop: Some(via(3, "192.0.2.5")), group: vec![], resilient: false, n_buckets: 0, unsupported: false };
        run(&mut st, Msg::NewNexthop(obj));
        run(&mut st, Msg::NewLink(link(3, true, false)));
        let (_, f) = run(&mut st, Msg::NewLink(link(3, true, true)));
        assert!(f.fib);
        st.nexthops.clear();
        // Marks that count (ignore_routes_with_linkdown), or more than the
        // carrier changing: everything else.
        for (ignore4, mtu) in [(true, 1500), (false, 1400)] {
            run(&mut st, Msg::NewLink(link(3, true, false)));
            st.if_sysctl.get_mut(&3).unwrap().ignore_linkdown4 = ignore4;
            let mut back = link(3, true, true);
            back.mtu = mtu;
            let mut t = Touched::default();
            assert!(apply_noting(&mut st, Msg::NewLink(back), &mut Followups::default(), &mut t));
            assert!(t.other && t.carrier_back.is_empty(), "{ignore4} {mtu}");
            run(&mut st, Msg::NewLink(link(3, true, true)));
        }
    }

    #[test]
    fn link_state_changes_and_dellink_cleanup() {
        let mut st = KernelState::default();
        let (changed, f) = run(&mut st, Msg::NewLink(link(3, true, true)));
        assert!(changed && !f.fib && f.link_sysctls.contains(&3));
        run(&mut st, Msg::NewLink(link(4, true, true)));
        // Same link again: nothing changed, sysctls re-read anyway (a rename shows only there).
        let (changed, f) = run(&mut st, Msg::NewLink(link(3, true, true)));
        assert!(!changed && !f.fib && f.link_sysctls.contains(&3));
        // Carrier loss, admin down, MTU change: the kernel flushed or re-marked routes silently.
        for l in [link(3, true, false), link(3, false, false), {
            let mut l = link(3, false, false);
            l.mtu = 1400;
            l
        }] {
            let (changed, f) = run(&mut st, Msg::NewLink(l));
            assert!(changed && f.fib);
        }
        // A rename is a change but no re-dump.
        let mut renamed = st.links[&3].clone();
        renamed.name = "wan".into();
        let (changed, f) = run(&mut st, Msg::NewLink(renamed));
        assert!(changed && !f.fib);

        for (i, a) in [(3, "192.0.2.1"), (3, "2001:db8::1"), (4, "198.51.100.1")] {
            run(
                &mut st,
                Msg::NewAddr(Addr {
                    ifindex: i,
                    addr: ip(a),
                    prefix_len: 24,
                }),
            );
        }
        run(&mut st, Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_REACHABLE)));
        run(&mut st, Msg::NewNeigh(neigh(4, "198.51.100.2", NUD_STALE)));
        st.if_sysctl.insert(3, IfSysctl::default());
        st.if_sysctl.insert(4, IfSysctl::default());

        let (changed, f) = run(&mut st, Msg::DelLink(3));
        assert!(changed && f.fib && !f.link_sysctls.contains(&3));
        assert_eq!(st.links.keys().copied().collect::<Vec<_>>(), vec![4]);
        assert!(st.addrs.keys().all(|a| a.ifindex == 4) && st.addrs.len() == 1);
        assert_eq!(st.neighbours.len(), 1);
        assert_eq!(st.if_sysctl.keys().copied().collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn address_neighbour_nexthop_rule_netconf_followups() {
        let mut st = KernelState::default();
        let a = Addr {
            ifindex: 3,
            addr: ip("192.0.2.1"),
            prefix_len: 24,
        };
        assert_eq!(
            run(&mut st, Msg::NewAddr(a.clone())),
            (true, Followups::default())
        );
        assert!(!run(&mut st, Msg::NewAddr(a.clone())).0);
        // An interface's last IPv4 address: every route through it goes
        // without a message.
        let (changed, f) = run(&mut st, Msg::DelAddr(a.clone()));
        assert!(changed && f.fib && f.gone_sources.is_empty() && f.v4_flushed == [3]);
        // Another one stays: only the routes preferring the address as
        // source go (`settle_sources` looks for them); IPv6: nothing goes
        // unannounced.
        let vip = Addr { addr: ip("198.51.100.77"), prefix_len: 32, ..a.clone() };
        for x in [&a, &vip] {
            run(&mut st, Msg::NewAddr(x.clone()));
        }
        let (changed, f) = run(&mut st, Msg::DelAddr(vip.clone()));
        assert!(changed && !f.fib && f.gone_sources == [vip.addr] && f.v4_flushed.is_empty());
        let v6 = Addr { addr: ip("2001:db8::1"), prefix_len: 64, ..a.clone() };
        let (changed, f) = run(&mut st, Msg::NewAddr(v6.clone()));
        assert!(changed && f.link_sysctls == BTreeSet::from([3]));
        let (changed, f) = run(&mut st, Msg::DelAddr(v6));
        assert!(changed && !f.fib && f.gone_sources.is_empty() && f.v4_flushed.is_empty());
        // ... but it may be disable_ipv6 switched on: the link's sysctls are re-read.
        assert_eq!(f.link_sysctls, BTreeSet::from([3]));
        st.addrs.clear();

        // Neighbours: every state kept, last message wins.
        assert!(
            run(
                &mut st,
                Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_INCOMPLETE))
            )
            .0
        );
        assert!(run(&mut st, Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_REACHABLE))).0);
        assert!(!run(&mut st, Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_REACHABLE))).0);
        assert_eq!(st.neighbours[&(3, ip("192.0.2.2"))].state, NUD_REACHABLE);
        // Usable to usable: stored, but nothing for the tables to recompute.
        assert!(!run(&mut st, Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_DELAY))).0);
        assert_eq!(st.neighbours[&(3, ip("192.0.2.2"))].state, NUD_DELAY);
        // Usable to unusable is a change.
        assert!(run(&mut st, Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_FAILED))).0);
        assert!(run(&mut st, Msg::NewNeigh(neigh(3, "192.0.2.2", NUD_REACHABLE))).0);
        assert_eq!(
            run(&mut st, Msg::DelNeigh(3, ip("192.0.2.2"))),
            (true, Followups::default())
        );

        let nh = NexthopObject {
            id: 10,
            blackhole: false,
            hop: Some(via(3, "192.0.2.2")),
            group: vec![],
            resilient: false,
            n_buckets: 0,
            unsupported: false,
        };
        assert_eq!(
            run(&mut st, Msg::NewNexthop(nh.clone())),
            (true, Followups::default())
        );
        assert!(!run(&mut st, Msg::NewNexthop(nh)).0);
        // Routes using the object die with it, not always with a message:
        // re-dumped when the state has any.
        let (changed, mut f) = run(&mut st, Msg::DelNexthop(10));
        assert!(changed && !f.fib && f.gone_objects == [10]);
        f.settle(&st);
        assert!(!f.fib, "nothing used it");
        let user = route("203.0.113.0", 24, RouteTarget::Object(10));
        st.routes.insert((Family::V4, user.key.clone()), user.clone());
        f.settle(&st);
        assert!(f.fib, "a route used it");
        st.routes.swap_remove(&(Family::V4, user.key));
        let group = NexthopObject { id: 30, blackhole: false, hop: None, group: vec![(10, 1), (12, 1)], resilient: false, n_buckets: 0, unsupported: false };
        st.nexthops.insert(30, group);
        let mut f = Followups { gone_objects: vec![10], ..Followups::default() };
        f.settle(&st);
        assert!(f.fib, "a group had it as a member");
        st.nexthops.remove(&30);

        // Resilient groups: a changed group means buckets may have moved
        // silently; a bucket event is applied as it comes.
        let res = NexthopObject {
            id: 20,
            blackhole: false,
            hop: None,
            group: vec![(11, 1), (12, 1)],
            resilient: true,
            n_buckets: 4,
            unsupported: false,
        };
        let (changed, f) = run(&mut st, Msg::NewNexthop(res.clone()));
        assert!(changed && f.buckets);
        let (changed, f) = run(&mut st, Msg::NewNexthop(res.clone()));
        assert!(!changed && !f.buckets);
        assert!(run(&mut st, Msg::NewBucket { group: 20, index: 3, nh_id: 12 }).0);
        assert!(!run(&mut st, Msg::NewBucket { group: 20, index: 3, nh_id: 12 }).0);
        assert!(run(&mut st, Msg::NewBucket { group: 20, index: 3, nh_id: 11 }).0);
        assert_eq!(st.res_buckets[&20][&3], 11);
        let (changed, f) = run(&mut st, Msg::DelNexthop(20));
        assert!(changed && f.gone_objects == [20]);
        assert!(!st.res_buckets.contains_key(&20));

        let r = Rule {
            family: Family::V4,
            priority: 100,
            table: 100,
            action: 1,
            has_selectors: true,
            invert: false,
        };
        let (changed, f) = run(&mut st, Msg::NewRule(r.clone()));
        assert!(!changed && f.rules && !f.fib);
        assert!(run(&mut st, Msg::DelRule(r)).1.rules);
        let (changed, f) = run(&mut st, Msg::Netconf);
        assert!(!changed && f.all_sysctls);
        assert_eq!(run(&mut st, Msg::Ignored), (false, Followups::default()));
    }

    #[test]
    fn state_equality_sees_every_part() {
        // The re-dump decides "changed" by comparing whole states.
        let mut a = KernelState::default();
        let b = KernelState::default();
        assert_eq!(a, b);
        a.sysctl.forwarding6_all = true;
        assert_ne!(a, b);
    }
}
