//! The FPM server: zebra (`-M dplane_fpm_nl`, `fpm address 127.0.0.1`)
//! connects, and every route and next-hop object it selects arrives as
//! netlink messages in FPM frames. They are decoded by the same parser as
//! the kernel's and replace the kernel's routes and next hops in the state
//! `desired` computes from (`overlay`); links, addresses, neighbours, rules
//! and the local table keep coming from the kernel.
//!
//! One thread owns the socket and the received table (fpm::table); the
//! daemon loop takes in what changed before each reconcile (fpm::overlay)
//! and reports the offload status of what it took in afterwards.
//!
//! Connection life: zebra has one connection; a new one replaces it (a
//! restarted zebra). On connect zebra replays everything it has; entries
//! not replayed are dropped once the stream has been quiet for `SETTLE`.
//! When the connection is lost, the routes keep forwarding for the grace
//! period (zebra retries every 3 s), then they are flushed.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fastpath_core::mirror::Touched;
use fastpath_core::model::KernelState;
use log::{debug, info, warn};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::frame::{self, Decoder, TYPE_NETLINK};
use super::overlay::{overlay_all, overlay_changes};
use super::status::{self, OffloadCheck};
pub use super::table::Counters;
use super::table::{apply, timers, RouteId, Stored, Table};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:2620";
/// How often the server thread looks at its timers when nothing arrives.
const TICK: Duration = Duration::from_millis(100);
/// A zebra that stops reading must not stall the daemon loop for long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum FpmError {
    #[error("listening for FPM on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("FPM server set-up: {0}")]
    Setup(#[from] std::io::Error),
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
    pub sources: Sources,
}

/// Which prefixes zebra sent, read from the server's own table (a copy per
/// change would cost a pass over a full table).
#[derive(Clone)]
pub struct Sources(Arc<Mutex<Table>>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

impl Sources {
    /// Holds the server's table (and so its thread) until dropped.
    pub fn read(&self) -> SourcesRead<'_> {
        SourcesRead(lock(&self.0))
    }
}

pub struct SourcesRead<'a>(MutexGuard<'a, Table>);

impl SourcesRead<'_> {
    /// zebra sent a main-table route for `dst`/`len`.
    pub fn sent(&self, dst: IpAddr, len: u8) -> bool {
        self.0.has_main(dst, len)
    }
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
    /// The state holds a whole overlay (changes can follow).
    based: bool,
    /// What the next report checks: every route, or these and their
    /// prefixes' other routes (overlaid since the last report).
    report_all: bool,
    report_ids: Vec<RouteId>,
    listen: SocketAddr,
    grace: Duration,
    seq: u32,
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
            based: false,
            report_all: false,
            report_ids: Vec::new(),
            listen,
            grace,
            seq: 0,
        })
    }

    /// Readable when FPM changed something, until `take_changed`.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
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

    /// Puts zebra's routes (all tables but local) and next-hop objects in
    /// `state` in place of the kernel's: all of them (`everything`, needed
    /// whenever `state` was rebuilt from a dump, and the first time:
    /// returns None), else just what changed since the last overlay, and
    /// then returns which route keys and objects changed, or None when so
    /// many did that only a full recompute makes sense.
    pub fn overlay(&mut self, state: &mut KernelState, everything: bool) -> Option<Touched> {
        let mut t = lock(&self.table);
        self.overlaid = t.version;
        if everything || !self.based {
            overlay_all(&mut t, state);
            self.based = true;
            self.report_all = true;
            return None;
        }
        self.report_ids.extend(t.dirty.routes.iter().copied());
        self.report_ids.append(&mut t.dirty.unreported);
        let touched = overlay_changes(&mut t, state);
        // Beyond this a delta costs more than the recompute.
        if touched.routes.len() > state.routes.len() / 8 + 4096 {
            self.report_all = true;
            return None;
        }
        Some(touched)
    }

    /// Tells zebra, for the routes overlaid since the last report (all of
    /// them with `everything`) whose status is new or changed, whether they
    /// are in the fast path.
    pub fn report(&mut self, check: &dyn OffloadCheck, everything: bool) {
        let all = std::mem::take(&mut self.report_all) || everything;
        let ids = std::mem::take(&mut self.report_ids);
        let mut out = Vec::new();
        let writer = {
            let mut t = lock(&self.table);
            let t = &mut *t;
            let writer = t.writer.as_ref().and_then(|w| w.try_clone().ok());
            // A delta rewrites a prefix's FIB entry: every route with that
            // prefix may change status.
            let mut set = HashSet::new();
            if !all {
                for (fam, table, dst, len, _) in ids {
                    set.extend(t.prefix_ids(fam, table, dst, len));
                }
            }
            let counts = &mut t.counts;
            let mut visit = |s: &mut Stored| {
                if s.version > self.overlaid {
                    return;
                }
                let k = &s.route.key;
                let st = check.offload(s.fam, k.dst, k.prefix_len, k.table);
                counts.moved(s.status.replace(st), Some(st));
                if s.reported == Some(st) || writer.is_none() {
                    return;
                }
                self.seq = self.seq.wrapping_add(1);
                if let Some(m) = status::reply(&s.rtmsg, st, self.seq).and_then(|m| frame::encode(&m).ok()) {
                    out.push(m);
                }
                s.reported = Some(st);
            };
            if all {
                t.routes.values_mut().for_each(&mut visit);
            } else {
                for id in &set {
                    if let Some(s) = t.routes.get_mut(id) {
                        visit(s);
                    }
                }
            }
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
                offloaded: t.counts.offloaded,
                offload_failed: t.counts.failed,
                counters: t.stats.clone(),
            },
            sources: Sources(Arc::clone(&self.table)),
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
