//! The FPM server: zebra (`-M dplane_fpm_nl`, `fpm address 127.0.0.1`)
//! connects, and every route and next-hop object it selects arrives as
//! netlink messages in FPM frames. They are decoded by the same parser as
//! the kernel's and replace the kernel's routes and next hops in the state
//! `desired` computes from (`overlay`); links, addresses, neighbours, rules
//! and the local table keep coming from the kernel.
//!
//! One thread owns the socket and the received table; the daemon loop
//! takes a consistent copy before each reconcile and reports each route's
//! offload status back afterwards.
//!
//! Connection life: zebra has one connection; a new one replaces it (a
//! restarted zebra). On connect zebra replays everything it has; entries
//! not replayed are dropped once the stream has been quiet for `SETTLE`.
//! When the connection is lost, the routes keep forwarding for the grace
//! period (zebra retries every 3 s), then they are flushed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fastpath_core::model::{Family, KernelState, NexthopObject, Route, RT_TABLE_LOCAL, RT_TABLE_MAIN};
use fastpath_core::parse::{self, Msg};
use log::{debug, info, warn};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::frame::{self, Decoder, TYPE_NETLINK};
use super::status::{self, Offload, OffloadCheck};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:2620";
/// How often the server thread looks at its timers when nothing arrives.
const TICK: Duration = Duration::from_millis(100);
/// zebra replays its whole table right after connecting; this long without
/// a message means the replay is over and what it did not repeat is stale.
const SETTLE: Duration = Duration::from_secs(1);
/// A zebra that stops reading must not stall the daemon loop for long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum FpmError {
    #[error("listening for FPM on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("FPM server set-up: {0}")]
    Setup(#[from] std::io::Error),
}

/// What zebra replaces and deletes by: it keeps one selected route per
/// prefix and table, and an update's delete may carry the new metric.
type RouteId = (Family, u32, IpAddr, u8, u8);

struct Stored {
    fam: Family,
    route: Route,
    /// zebra's RTM_NEWROUTE payload, echoed back with the status flags.
    rtmsg: Vec<u8>,
    /// Table version that last changed it.
    version: u64,
    /// Connection that last sent it.
    conn: u64,
    /// Last status sent on the current connection.
    reported: Option<Offload>,
}

#[derive(Default)]
struct Table {
    routes: HashMap<RouteId, Stored>,
    nexthops: BTreeMap<u32, (NexthopObject, u64)>,
    version: u64,
    conn: u64,
    connected: bool,
    writer: Option<TcpStream>,
    /// Connected: time of the last message (or the connect). Disconnected:
    /// when the connection was lost.
    since: Option<Instant>,
    /// A replay is (maybe) under way: sweep what it did not repeat once quiet.
    sweep_pending: bool,
    stats: Counters,
    warned_decode: bool,
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

/// `route_source` in `fastpath status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SourceStatus {
    pub kind: String,
    pub listen: String,
    pub connected: bool,
    pub grace_s: u64,
    pub routes: usize,
    pub nexthops: usize,
    /// Routes last reported offloaded / offload failed.
    pub offloaded: usize,
    pub offload_failed: usize,
    pub counters: Counters,
}

/// What the API shows: the status, and which FIB prefixes came from FPM.
#[derive(Debug, Clone)]
pub struct Published {
    pub status: SourceStatus,
    /// Rebuilt by each overlay, shared (not copied) by every publish.
    pub prefixes: Arc<HashSet<(IpAddr, u8)>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changes {
    pub table: bool,
    pub status: bool,
}

pub struct Server {
    table: Arc<Mutex<Table>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    wake: UnixStream,
    /// Table version the state was last overlaid with.
    overlaid: u64,
    listen: SocketAddr,
    grace: Duration,
    seq: u32,
    prefixes: Arc<HashSet<(IpAddr, u8)>>,
    offloaded: usize,
    failed: usize,
}

fn lock(t: &Mutex<Table>) -> MutexGuard<'_, Table> {
    // A panic elsewhere cannot leave the table half-updated in a way that
    // matters more than stopping the route source would.
    match t.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Server {
    pub fn start(listen: SocketAddr, grace: Duration) -> Result<Server, FpmError> {
        let listener = TcpListener::bind(listen).map_err(|source| FpmError::Listen { addr: listen, source })?;
        let listen = listener.local_addr()?;
        let (wake, wake_tx) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        let table = Arc::new(Mutex::new(Table::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (table, stop) = (Arc::clone(&table), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("fpm".into())
                .spawn(move || serve(listener, &table, &stop, wake_tx, grace))?
        };
        info!("FPM route source listening on {listen} (routes and next hops from zebra, not the kernel)");
        Ok(Server {
            table,
            stop,
            thread: Some(thread),
            wake,
            overlaid: 0,
            listen,
            grace,
            seq: 0,
            prefixes: Arc::default(),
            offloaded: 0,
            failed: 0,
        })
    }

    /// Waits until `other` is readable, FPM changed something, or `timeout`.
    pub fn wait(&self, other: RawFd, timeout: Duration) {
        let mut fds = [other, self.wake.as_raw_fd()].map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: a valid array of pollfds and its length; EINTR only ends the wait early.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }

    /// What happened since the last call: the table changed since the last
    /// `overlay`, and/or the server woke the loop (a change, a connect or a
    /// disconnect: the status to publish).
    pub fn take_changed(&mut self) -> Changes {
        let mut buf = [0u8; 64];
        let mut woke = false;
        while matches!((&self.wake).read(&mut buf), Ok(n) if n > 0) {
            woke = true;
        }
        Changes { table: lock(&self.table).version != self.overlaid, status: woke }
    }

    /// Replaces the kernel's routes (all tables but local) and next-hop
    /// objects in `state` with what zebra sent.
    pub fn overlay(&mut self, state: &mut KernelState) {
        let t = lock(&self.table);
        state.routes.retain(|(_, k), _| k.table == RT_TABLE_LOCAL);
        let mut prefixes = HashSet::with_capacity(t.routes.len());
        for s in t.routes.values() {
            // The local table follows the addresses, and the kernel owns those.
            if s.route.key.table == RT_TABLE_LOCAL {
                continue;
            }
            if s.route.key.table == RT_TABLE_MAIN {
                prefixes.insert((s.route.key.dst, s.route.key.prefix_len));
            }
            state.routes.insert((s.fam, s.route.key.clone()), s.route.clone());
        }
        state.nexthops = t.nexthops.iter().map(|(id, (nh, _))| (*id, nh.clone())).collect();
        // zebra's groups carry no bucket table: resilient ones punt.
        state.res_buckets.clear();
        self.prefixes = Arc::new(prefixes);
        self.overlaid = t.version;
    }

    /// Tells zebra, for every route in the last overlay whose status is
    /// new or changed, whether it is in the fast path.
    pub fn report(&mut self, check: &dyn OffloadCheck) {
        let mut out = Vec::new();
        let writer = {
            let mut t = lock(&self.table);
            let writer = t.writer.as_ref().and_then(|w| w.try_clone().ok());
            let (mut ok, mut failed) = (0, 0);
            for s in t.routes.values_mut() {
                if s.version > self.overlaid {
                    continue;
                }
                let k = &s.route.key;
                let st = check.offload(s.fam, k.dst, k.prefix_len, k.table);
                match st {
                    Offload::Offloaded => ok += 1,
                    Offload::Failed => failed += 1,
                }
                if s.reported == Some(st) || writer.is_none() {
                    continue;
                }
                self.seq = self.seq.wrapping_add(1);
                let msg = status::reply(&s.rtmsg, st, self.seq).and_then(|m| frame::encode(&m).ok());
                if let Some(m) = msg {
                    out.push(m);
                }
                s.reported = Some(st);
            }
            self.offloaded = ok;
            self.failed = failed;
            t.stats.status_sent += out.len() as u64;
            writer
        };
        let (Some(mut w), false) = (writer, out.is_empty()) else {
            return;
        };
        // One write for the whole batch: FRR reads frames from a stream.
        let all: Vec<u8> = out.concat();
        if let Err(e) = w.write_all(&all) {
            // The reader side sees the broken connection and cleans up.
            warn!("FPM: sending {} route status messages: {e}", out.len());
        }
    }

    pub fn published(&self) -> Published {
        let t = lock(&self.table);
        Published {
            status: SourceStatus {
                kind: "fpm".into(),
                listen: self.listen.to_string(),
                connected: t.connected,
                grace_s: self.grace.as_secs(),
                routes: t.routes.len(),
                nexthops: t.nexthops.len(),
                offloaded: self.offloaded,
                offload_failed: self.failed,
                counters: t.stats.clone(),
            },
            prefixes: Arc::clone(&self.prefixes),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.take() {
            if h.join().is_err() {
                warn!("FPM server thread panicked");
            }
        }
    }
}

fn serve(listener: TcpListener, table: &Mutex<Table>, stop: &AtomicBool, mut wake: UnixStream, grace: Duration) {
    let mut conn: Option<(TcpStream, Decoder)> = None;
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = vec![libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        if let Some((s, _)) = &conn {
            fds.push(libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        // SAFETY: a valid array of pollfds and its length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, TICK.as_millis() as libc::c_int) };
        // Table changes, connects and disconnects all wake the daemon loop.
        let mut changed = false;

        if fds[0].revents & libc::POLLIN != 0 {
            match listener.accept() {
                Ok((s, peer)) => {
                    if conn.is_some() {
                        warn!("FPM: new connection from {peer} replaces the current one");
                    } else {
                        info!("FPM: zebra connected from {peer}");
                    }
                    let writer = s.try_clone().and_then(|w| w.set_write_timeout(Some(WRITE_TIMEOUT)).map(|()| w));
                    let _ = s.set_nodelay(true);
                    let mut t = lock(table);
                    t.conn += 1;
                    t.connected = true;
                    t.since = Some(Instant::now());
                    t.sweep_pending = true;
                    t.stats.connections += 1;
                    t.writer = writer.map_err(|e| warn!("FPM: no status replies on this connection: {e}")).ok();
                    // The replay is reported afresh.
                    for r in t.routes.values_mut() {
                        r.reported = None;
                    }
                    conn = Some((s, Decoder::default()));
                    changed = true;
                }
                Err(e) => warn!("FPM: accept: {e}"),
            }
        }

        if let (Some((s, dec)), Some(p)) = (&mut conn, fds.get(1)) {
            let mut lost = None;
            if p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                // poll said readable: this read does not block.
                match s.read(&mut buf) {
                    Ok(0) => lost = Some("closed by zebra".to_string()),
                    Ok(n) => {
                        dec.push(&buf[..n]);
                        let mut t = lock(table);
                        t.since = Some(Instant::now());
                        while let Some(f) = dec.next_frame() {
                            match f {
                                Ok(f) if f.msg_type == TYPE_NETLINK => changed |= apply(&mut t, &f.payload),
                                Ok(f) => {
                                    debug!("FPM: ignoring frame of type {}", f.msg_type);
                                    t.stats.ignored += 1;
                                }
                                Err(e) => {
                                    lost = Some(e.to_string());
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => lost = Some(e.to_string()),
                }
            }
            if let Some(why) = lost {
                warn!("FPM: connection lost ({why}); keeping its routes for {} s", grace.as_secs());
                let _ = s.shutdown(std::net::Shutdown::Both);
                conn = None;
                let mut t = lock(table);
                t.connected = false;
                t.writer = None;
                t.sweep_pending = false;
                t.since = Some(Instant::now());
                changed = true;
            }
        }

        changed |= timers(&mut lock(table), grace);
        if changed {
            // Full pipe: the loop is already due to look.
            let _ = wake.write(&[1]);
        }
    }
}

/// Sweep after a replay, flush after the grace period. True if anything went.
fn timers(t: &mut Table, grace: Duration) -> bool {
    let Some(since) = t.since else { return false };
    let before = t.routes.len() + t.nexthops.len();
    if t.connected && t.sweep_pending && since.elapsed() >= SETTLE {
        t.sweep_pending = false;
        let conn = t.conn;
        t.routes.retain(|_, s| s.conn == conn);
        t.nexthops.retain(|_, (_, c)| *c == conn);
        let gone = before - t.routes.len() - t.nexthops.len();
        if gone > 0 {
            info!("FPM: dropped {gone} routes and next hops zebra did not replay");
        }
    } else if !t.connected && since.elapsed() >= grace && before > 0 {
        warn!("FPM: no zebra for {} s: flushing {} routes and {} next hops", grace.as_secs(), t.routes.len(), t.nexthops.len());
        t.routes.clear();
        t.nexthops.clear();
    }
    let gone = before - t.routes.len() - t.nexthops.len();
    if gone > 0 {
        t.stats.flushed += gone as u64;
        t.version += 1;
    }
    gone > 0
}

/// Applies the netlink messages of one FPM frame. True if the table changed.
fn apply(t: &mut Table, payload: &[u8]) -> bool {
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
                t.routes.insert(id, Stored { fam, route, rtmsg, version, conn, reported: None });
                changed = true;
            }
            Ok(Msg::DelRoute(fam, route)) => {
                let k = &route.key;
                changed |= t.routes.remove(&(fam, k.table, k.dst, k.prefix_len, k.tos)).is_some();
            }
            Ok(Msg::NewNexthop(nh)) => {
                t.nexthops.insert(nh.id, (nh, conn));
                changed = true;
            }
            Ok(Msg::DelNexthop(id)) => changed |= t.nexthops.remove(&id).is_some(),
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
mod tests {
    use super::*;
    use fastpath_core::model::RouteTarget;
    use fastpath_core::parse::{push_attr, request, RTM_DELROUTE, RTM_NEWNEXTHOP, RTM_NEWROUTE};
    use std::net::Ipv4Addr;

    fn route_msg(kind: u16, dst: [u8; 4], len: u8, metric: u32, nh_id: Option<u32>) -> Vec<u8> {
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

    fn nexthop_msg(id: u32) -> Vec<u8> {
        let mut p = vec![2, 0, 0, 0, 0, 0, 0, 0];
        push_attr(&mut p, 1, &id.to_ne_bytes());
        push_attr(&mut p, 5, &7u32.to_ne_bytes());
        push_attr(&mut p, 6, &[192, 0, 2, 1]);
        request(RTM_NEWNEXTHOP, 0x1, 1, &p)
    }

    #[test]
    fn routes_and_nexthops_replace_the_kernels_but_not_the_local_table() {
        let mut t = Table::default();
        let mut frame = nexthop_msg(42);
        frame.extend(route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, Some(42)));
        frame.extend(route_msg(RTM_NEWROUTE, [203, 0, 113, 0], 24, 20, None));
        assert!(apply(&mut t, &frame));
        assert_eq!((t.routes.len(), t.nexthops.len()), (2, 1));

        // An update arrives as delete (new metric) + add in one frame.
        let mut upd = route_msg(RTM_DELROUTE, [203, 0, 113, 0], 24, 30, None);
        upd.extend(route_msg(RTM_NEWROUTE, [203, 0, 113, 0], 24, 30, None));
        assert!(apply(&mut t, &upd));
        assert_eq!(t.routes.len(), 2);

        let table = Arc::new(Mutex::new(t));
        let mut srv = Server {
            table,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
            wake: UnixStream::pair().expect("socketpair").0,
            overlaid: 0,
            listen: "127.0.0.1:0".parse().expect("addr"),
            grace: Duration::from_secs(1),
            seq: 0,
            prefixes: Arc::default(),
            offloaded: 0,
            failed: 0,
        };
        let mut st = KernelState::default();
        let local = fastpath_core::model::RouteKey {
            table: RT_TABLE_LOCAL,
            dst: Ipv4Addr::new(192, 0, 2, 254).into(),
            prefix_len: 32,
            tos: 0,
            priority: 0,
        };
        let kernel_main = fastpath_core::model::RouteKey { table: RT_TABLE_MAIN, prefix_len: 8, ..local.clone() };
        for k in [&local, &kernel_main] {
            let r = Route {
                key: k.clone(),
                kind: fastpath_core::model::RouteKind::Local,
                target: RouteTarget::None,
                mtu: 0,
                mtu_locked: false,
                encap: false,
            };
            st.routes.insert((Family::V4, k.clone()), r);
        }
        srv.overlay(&mut st);
        assert!(st.routes.contains_key(&(Family::V4, local)));
        assert!(!st.routes.contains_key(&(Family::V4, kernel_main)));
        assert_eq!(st.routes.len(), 3);
        assert!(st.nexthops.contains_key(&42));
        let r = st.routes.values().find(|r| r.key.prefix_len == 24 && r.key.dst == IpAddr::from([198, 51, 100, 0]));
        assert_eq!(r.map(|r| r.target.clone()), Some(RouteTarget::Object(42)));
        let r = st.routes.values().find(|r| r.key.dst == IpAddr::from([203, 0, 113, 0])).expect("route");
        assert_eq!(r.key.priority, 30);
        assert_eq!(srv.prefixes.len(), 2);
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
        // Reconnect: only one route replayed.
        t.conn = 2;
        t.sweep_pending = true;
        t.since = Some(Instant::now());
        apply(&mut t, &route_msg(RTM_NEWROUTE, [198, 51, 100, 0], 24, 20, None));
        assert!(!timers(&mut t, Duration::from_secs(10)), "still settling");
        t.since = Some(Instant::now() - SETTLE);
        assert!(timers(&mut t, Duration::from_secs(10)));
        assert_eq!(t.routes.len(), 1);
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
}
