//! Stateful mode, daemon side: conntrack and ruleset events that may revoke
//! a fast verdict the data path has cached.
//!
//! The XDP program caches "conntrack says established and marked" per flow
//! and trusts it until `fp_runtime.ct_generation` changes or
//! `ct_revalidate_ms` passes. This module bumps the generation whenever
//! the kernel tells us such a verdict may have become wrong:
//!
//! - a conntrack entry carrying the fast-path mark is destroyed
//!   (`conntrack -D`, timeout, TCP close);
//! - an update leaves an entry unmarked, not established or dying
//!   (`conntrack -U --mark 0`, a FIN moving TCP out of ESTABLISHED);
//! - the event socket overran (ENOBUFS): whatever we missed, every cached
//!   verdict is re-checked against conntrack itself;
//! - the nftables ruleset changed: the mark means "the ruleset approved
//!   this connection", and entries keep it after that ruleset is gone, so
//!   the fast-path bits are cleared on every entry first. Every connection
//!   then passes the new ruleset once before it can go fast again.
//!
//! It also keeps conntrack able to follow a connection it no longer sees
//! packet by packet: a marked TCP entry's window tracking is made liberal in
//! both directions (as the kernel's own flowtable does when it offloads a
//! flow) when the data path asks for it (ctliberal.rs): the data path
//! fast-paths no TCP entry before that. Otherwise the FIN or RST that ends a
//! fast-pathed connection, or the first packet after a revocation, would lie
//! far beyond the window conntrack last saw, be classed invalid, and be
//! dropped by the usual `ct state invalid drop`. It asks only for
//! connections that outlive a few milliseconds: an update for every
//! connection, as its mark event arrived, cost short connections more than
//! the fast path could give them back.
//!
//! ctnetlink is spoken directly (a few attributes, a dump and updates that
//! copy the tuple attribute back verbatim): netlink-packet-netfilter 0.4
//! decodes conntrack messages but not nftables ones, and re-encoding a
//! tuple is more code and more risk than copying its bytes.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::time::Duration;

use log::{info, warn};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use serde::{Deserialize, Serialize};

use crate::{cticmp, ctliberal};
use crate::nlraw::{
    align4, messages, put_header, recv, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_MULTI, NLM_F_REQUEST,
};
use crate::maps::MapWriter;
use crate::CtAb;
use crate::ctnl::*;

pub(crate) const NFGENMSG_LEN: usize = 4;

/// Datagrams read per socket per round; a busier socket stays readable and
/// is read again on the next round.
const DRAIN_LIMIT: usize = 4096;
const RECV_BUF: usize = 256 << 10;
/// Event datagrams per recvmmsg() call, and the room for each (a
/// conntrack or nftables event is at most a page).
const EVENT_BATCH: usize = 32;
const EVENT_SLOT: usize = 16 << 10;
/// Mark updates sent per datagram during a clear.
const UPDATE_BATCH: usize = 128;
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// After a conntrack event wakes us, let more queue up before reading
/// (unless a route or ruleset change comes first): every short connection
/// sends events, and each round (read, generation bump, status) costs the
/// CPU the connections run on. At 5 ms rounds under a few thousand
/// connections per second that was ~10 % of the kernel's connection rate
/// (bench stateful --ab full vs no-events); at 50 ms it is within the noise,
/// and a revocation still lands far inside its 1 s bound.
const EVENT_COALESCE: Duration = Duration::from_millis(50);

/// Waits up to `timeout` for any of `urgent` (the route socket, the
/// daemon's other watchers, ruleset events) or `lazy` (conntrack events,
/// liberal requests) to be readable. When only `lazy` ones are, waits up to
/// `coalesce` more for others to queue up, unless an urgent one becomes
/// readable first.
fn wait_coalesced(urgent: &[RawFd], lazy: &[RawFd], timeout: Duration, coalesce: Duration) {
    let fds: Vec<RawFd> = urgent.iter().chain(lazy).copied().collect();
    let p = crate::nlraw::wait_any(&fds, timeout);
    let (u, l) = p.split_at(urgent.len());
    if l.iter().any(|q| q.revents != 0) && u.iter().all(|q| q.revents == 0) {
        crate::nlraw::wait_any(urgent, coalesce);
    }
}

/// The fast-path mark bits of each direction (`--ct-mark`,
/// `--ct-mark-reply`): the ruleset sets a direction's bits when it accepts
/// a packet of that direction, and the data path requires them of that
/// direction's packets only (see fp_runtime.ct_mark_reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtMarks {
    pub orig: u32,
    pub reply: u32,
}

impl CtMarks {
    /// Every bit either direction needs: what the daemon clears.
    pub fn all(&self) -> u32 {
        self.orig | self.reply
    }

    /// Whether `mark` lets some direction's packets go fast, so that a
    /// verdict cached for it may rest on this mark.
    pub fn fast_somewhere(&self, mark: u32) -> bool {
        mark & self.orig == self.orig || mark & self.reply == self.reply
    }
}

/// What one ctnetlink event says about its entry; attributes the kernel
/// left out of the message are None (it omits the mark when it is 0 and
/// did not change, and the TCP state when it did not change).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtEvent {
    pub destroy: bool,
    pub status: Option<u32>,
    pub mark: Option<u32>,
    pub tcp_state: Option<u8>,
    pub proto: Option<u8>,
    /// Both directions' TCP window tracking is liberal (from the protoinfo).
    pub liberal: Option<bool>,
}

impl CtEvent {
    /// Whether a verdict cached for this entry may now be wrong. An entry
    /// without the mark attribute has mark 0 and had it before, so it was
    /// never fast: its set-up and timeout events cost the data path nothing.
    /// A mark that still lets one direction go fast revokes nothing when the
    /// entry stays established: the event cannot tell a direction's bits
    /// being set from the other's being cleared (a user clearing one
    /// direction's bits by hand waits for the revalidation; the daemon's
    /// own clearing bumps anyway).
    pub fn revokes(&self, marks: CtMarks) -> bool {
        let Some(mark) = self.mark else { return false };
        let marked = marks.fast_somewhere(mark);
        if self.destroy {
            return marked;
        }
        let status = self.status.unwrap_or(0);
        let established = status & IPS_SEEN_REPLY != 0
            && status & IPS_DYING == 0
            && self.tcp_state.is_none_or(|s| s == TCP_CONNTRACK_ESTABLISHED);
        !(marked && established)
    }

    /// A marked TCP entry whose window tracking may still be strict: the
    /// kernel must be told to be liberal before the fast path starves it of
    /// sequence numbers. Without the protoinfo in the event we cannot tell,
    /// and ask anyway (the update is idempotent, and its own event says liberal).
    pub fn needs_liberal(&self, marks: CtMarks) -> bool {
        !self.destroy
            && self.proto == Some(IPPROTO_TCP)
            && self.mark.is_some_and(|m| marks.fast_somewhere(m))
            && self.liberal != Some(true)
    }
}

/// Attributes of a netlink attribute stream: (type without flags, payload).
pub(crate) fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[align4(len).min(b.len())..];
        Some((ty, payload))
    })
}

/// The whole attribute (header included) of type `ty`, for copying back.
fn raw_attr(mut b: &[u8], ty: u16) -> Option<&[u8]> {
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        if len < 4 || len > b.len() {
            return None;
        }
        if u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK == ty {
            return Some(&b[..len]);
        }
        b = &b[align4(len).min(b.len())..];
    }
    None
}

pub(crate) fn be32(p: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(..4)?.try_into().ok()?))
}

/// The event in a ctnetlink message's attributes (after the nfgenmsg).
pub fn parse_ct_event(attrs_buf: &[u8], destroy: bool) -> CtEvent {
    let mut ev = CtEvent { destroy, ..Default::default() };
    for (ty, p) in attrs(attrs_buf) {
        match ty {
            CTA_STATUS => ev.status = be32(p),
            CTA_MARK => ev.mark = be32(p),
            CTA_PROTOINFO => {
                for (t, tcp) in attrs(p) {
                    if t != CTA_PROTOINFO_TCP {
                        continue;
                    }
                    let mut liberal = [false; 2];
                    for (t, v) in attrs(tcp) {
                        match t {
                            CTA_PROTOINFO_TCP_STATE => ev.tcp_state = v.first().copied(),
                            CTA_PROTOINFO_TCP_FLAGS_ORIGINAL | CTA_PROTOINFO_TCP_FLAGS_REPLY => {
                                liberal[usize::from(t == CTA_PROTOINFO_TCP_FLAGS_REPLY)] =
                                    v.first().is_some_and(|f| f & IP_CT_TCP_FLAG_BE_LIBERAL != 0);
                            }
                            _ => {}
                        }
                    }
                    ev.liberal = Some(liberal[0] && liberal[1]);
                }
            }
            CTA_TUPLE_ORIG => {
                ev.proto = attrs(p)
                    .find(|(t, _)| *t == CTA_TUPLE_PROTO)
                    .and_then(|(_, pr)| attrs(pr).find(|(t, _)| *t == CTA_PROTO_NUM))
                    .and_then(|(_, n)| n.first().copied());
            }
            _ => {}
        }
    }
    ev
}

/// Appends one nfnetlink request: header, nfgenmsg, attributes.
pub(crate) fn put_msg(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) {
    put_header(out, NLMSG_HDRLEN + NFGENMSG_LEN + attrs.len(), ty, flags, seq);
    out.extend_from_slice(&[family, 0, 0, 0]);
    out.extend_from_slice(attrs);
    out.resize(align4(out.len()), 0);
}

pub(crate) fn put_be32_attr(out: &mut Vec<u8>, ty: u16, v: u32) {
    out.extend_from_slice(&8u16.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&v.to_be_bytes());
}

/// The attributes of an update that makes both directions' TCP window
/// tracking liberal, touching no other flag.
fn liberal_attrs(tuple: &[u8], zone: Option<&[u8]>) -> Vec<u8> {
    let mut a = Vec::with_capacity(tuple.len() + 32);
    a.extend_from_slice(tuple);
    a.resize(align4(a.len()), 0);
    if let Some(z) = zone {
        a.extend_from_slice(z);
        a.resize(align4(a.len()), 0);
    }
    let flags = [IP_CT_TCP_FLAG_BE_LIBERAL, IP_CT_TCP_FLAG_BE_LIBERAL];
    let mut tcp = Vec::new();
    for ty in [CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, CTA_PROTOINFO_TCP_FLAGS_REPLY] {
        tcp.extend_from_slice(&6u16.to_ne_bytes());
        tcp.extend_from_slice(&ty.to_ne_bytes());
        tcp.extend_from_slice(&flags);
        tcp.resize(align4(tcp.len()), 0);
    }
    let nested = |ty: u16, inner: &[u8]| {
        let mut v = Vec::with_capacity(inner.len() + 4);
        v.extend_from_slice(&((4 + inner.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        v.extend_from_slice(inner);
        v
    };
    a.extend(nested(CTA_PROTOINFO, &nested(CTA_PROTOINFO_TCP, &tcp)));
    a
}

/// The attributes of an update that clears `mask` in an entry's mark and
/// leaves its other bits alone (the kernel computes (mark & ~mask) ^ 0).
fn clear_mark_attrs(tuple: &[u8], zone: Option<&[u8]>, mask: u32) -> Vec<u8> {
    let mut a = Vec::with_capacity(tuple.len() + 24);
    a.extend_from_slice(tuple);
    a.resize(align4(a.len()), 0);
    if let Some(z) = zone {
        a.extend_from_slice(z);
        a.resize(align4(a.len()), 0);
    }
    put_be32_attr(&mut a, CTA_MARK, 0);
    put_be32_attr(&mut a, CTA_MARK_MASK, mask);
    a
}

/// Reads up to `buf.len() / EVENT_SLOT` datagrams without blocking, one per
/// EVENT_SLOT bytes of `buf`; `got` says each one's length and whether it
/// was cut short. One system call for a burst of events instead of one each.
fn recv_batch(fd: RawFd, buf: &mut [u8], got: &mut Vec<(usize, bool)>) -> io::Result<()> {
    got.clear();
    let mut iov: Vec<libc::iovec> = buf
        .chunks_exact_mut(EVENT_SLOT)
        .map(|c| libc::iovec { iov_base: c.as_mut_ptr().cast(), iov_len: c.len() })
        .collect();
    let mut hdrs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty header.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = v;
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    // SAFETY: every header points at one live iovec over its own slot of buf.
    let n = unsafe {
        libc::recvmmsg(fd, hdrs.as_mut_ptr(), hdrs.len() as libc::c_uint, libc::MSG_DONTWAIT, std::ptr::null_mut())
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    got.extend(hdrs[..n as usize].iter().map(|h| (h.msg_len as usize, h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0)));
    Ok(())
}

fn set_rcvbuf(s: &mut Socket, size: usize) -> io::Result<()> {
    let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    // SAFETY: a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        // Without CAP_NET_ADMIN: capped by net.core.rmem_max.
        s.set_rx_buf_sz(size)?;
    }
    Ok(())
}

pub(crate) fn set_recv_timeout(s: &Socket, t: Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: a pointer to a live timeval and its size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
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

/// What one round of events asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// A cached verdict may be wrong: bump ct_generation.
    pub revoke: bool,
    /// The ruleset changed: clear the marks, then bump.
    pub ruleset: bool,
    /// Events were lost: whatever they said is unknown.
    pub lost: bool,
}

/// Counters shown by `fastpath status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtCounters {
    /// ctnetlink update/destroy events read.
    pub events: u64,
    /// ct_generation bumps (each re-checks every cached verdict).
    pub bumps: u64,
    /// ENOBUFS on the event sockets: events were lost, every verdict re-checked.
    pub overruns: u64,
    /// nftables commits seen (each clears the fast-path marks).
    pub ruleset_changes: u64,
    /// Conntrack entries whose fast-path mark bits we cleared.
    pub marks_cleared: u64,
    /// Clears that failed part-way (the revalidation interval still bounds them).
    pub clear_errors: u64,
    /// Marked TCP entries whose window tracking we made liberal.
    #[serde(default)]
    pub liberal: u64,
    /// Requests for that read from the data path (at most one per entry
    /// per revalidation interval, for connections that outlived a few ms).
    #[serde(default)]
    pub liberal_requests: u64,
    /// ICMP echo entries whose copies the data path has (cticmp.rs).
    #[serde(default)]
    pub icmp_tracked: u64,
    /// ICMP echo tuples the data path asked about (it found no current copy).
    #[serde(default)]
    pub icmp_requests: u64,
    /// ICMP entries whose timeout we refreshed for fast-pathed echoes.
    #[serde(default)]
    pub icmp_refreshes: u64,
    /// ICMP entries left uncopied: fp_ct_icmp was full.
    #[serde(default)]
    pub icmp_full: u64,
    /// Failed ctnetlink lookups or refreshes of ICMP entries.
    #[serde(default)]
    pub icmp_errors: u64,
}

/// The event sockets and the request socket of the stateful mode.
pub struct Watch {
    /// NFNLGRP_CONNTRACK_UPDATE and _DESTROY.
    ct: Socket,
    /// NFNLGRP_NFTABLES, on its own socket: conntrack churn can overrun the
    /// other, and a lost ruleset change would be the expensive kind to miss.
    rules: Socket,
    /// Dumps and updates; no groups, so replies never mix with events.
    req: Socket,
    marks: CtMarks,
    seq: u32,
    buf: Vec<u8>,
    /// EVENT_BATCH slots for the event sockets' datagrams.
    ev_buf: Vec<u8>,
    /// Updates making marked TCP entries liberal, sent after the drain.
    liberal: Vec<(u8, Vec<u8>)>,
    /// No liberal updates: the netns is liberal already
    /// (nf_conntrack_tcp_be_liberal), or a bench A/B leaves them out.
    skip_liberal: bool,
    /// The data path's liberal requests (None: no ring, e.g. a bench A/B).
    ring: Option<ctliberal::Ring>,
    /// Bench A/B: an update for every marked TCP entry as its event
    /// arrives, instead of the data path's requests.
    eager_liberal: bool,
    /// ICMP entries events destroyed or revoked this round: (family,
    /// original tuple attribute payload, destroyed), for cticmp.
    icmp_touched: Vec<(u8, Vec<u8>, bool)>,
    pub counters: CtCounters,
}

impl Watch {
    pub fn open(marks: CtMarks, rcvbuf: usize, ab: CtAb, ring: Option<ctliberal::Ring>) -> io::Result<Watch> {
        let mut ct = Socket::new(NETLINK_NETFILTER)?;
        set_rcvbuf(&mut ct, rcvbuf)?;
        ct.bind_auto()?;
        if ab != CtAb::NoEvents {
            ct.add_membership(NFNLGRP_CONNTRACK_UPDATE)?;
            ct.add_membership(NFNLGRP_CONNTRACK_DESTROY)?;
        }
        let mut rules = Socket::new(NETLINK_NETFILTER)?;
        set_rcvbuf(&mut rules, 1 << 20)?;
        rules.bind_auto()?;
        rules.add_membership(NFNLGRP_NFTABLES)?;
        let mut req = Socket::new(NETLINK_NETFILTER)?;
        set_rcvbuf(&mut req, 4 << 20)?;
        req.bind_auto()?;
        set_recv_timeout(&req, REPLY_TIMEOUT)?;
        Ok(Watch {
            ct,
            rules,
            req,
            marks,
            seq: 0,
            buf: vec![0; RECV_BUF],
            ev_buf: vec![0; EVENT_BATCH * EVENT_SLOT],
            liberal: Vec::new(),
            skip_liberal: ab == CtAb::NoLiberal,
            ring,
            eager_liberal: ab == CtAb::EagerLiberal,
            icmp_touched: Vec::new(),
            counters: CtCounters::default(),
        })
    }

    /// Sleeps until one of `others`, of our sockets or `rings` is readable, or `timeout`.
    pub fn wait(&self, others: &[RawFd], rings: &[RawFd], timeout: Duration) {
        // No ring: -1, which poll() skips.
        let ring = self.ring.as_ref().map_or(-1, |r| r.fd());
        let urgent: Vec<RawFd> = others.iter().copied().chain([self.rules.as_raw_fd()]).collect();
        let lazy: Vec<RawFd> = [self.ct.as_raw_fd(), ring].into_iter().chain(rings.iter().copied()).collect();
        wait_coalesced(&urgent, &lazy, timeout, EVENT_COALESCE);
    }

    /// Reads everything queued on both event sockets without blocking.
    pub fn drain(&mut self) -> Round {
        let mut r = Round::default();
        let mut buf = std::mem::take(&mut self.ev_buf);
        let mut got = Vec::with_capacity(EVENT_BATCH);
        for rules in [false, true] {
            let fd = if rules { self.rules.as_raw_fd() } else { self.ct.as_raw_fd() };
            let mut read = 0;
            // Bounded in calls too: errors (an overrun, EINTR) read nothing.
            for _ in 0..DRAIN_LIMIT {
                if read >= DRAIN_LIMIT {
                    break;
                }
                match recv_batch(fd, &mut buf, &mut got) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        // Keep reading: the kernel resumes delivery once the queue is empty.
                        self.counters.overruns += 1;
                        r.revoke = true;
                        r.lost = true;
                        r.ruleset |= rules;
                        warn!("{} event socket overran; re-checking every cached verdict", if rules { "nftables" } else { "conntrack" });
                        continue;
                    }
                    Err(e) => {
                        warn!("reading netfilter events: {e}");
                        r.revoke = true;
                        r.lost = true;
                        break;
                    }
                }
                read += got.len();
                for (i, &(n, truncated)) in got.iter().enumerate() {
                    if truncated {
                        // Never for events this size; were it so, what it said is unknown.
                        r.revoke = true;
                        r.lost = true;
                        r.ruleset |= rules;
                    }
                    let slot = &buf[i * EVENT_SLOT..(i + 1) * EVENT_SLOT];
                    self.take_datagram(&slot[..n.min(EVENT_SLOT)], &mut r);
                }
            }
        }
        self.ev_buf = buf;
        self.take_requests();
        r
    }

    /// The events of one datagram, into `r`.
    fn take_datagram(&mut self, data: &[u8], r: &mut Round) {
        for (ty, flags, payload) in messages(data) {
            let (subsys, msg) = (ty >> 8, ty & 0xff);
            if subsys == NFNL_SUBSYS_NFTABLES {
                r.ruleset = true;
                continue;
            }
            if subsys != NFNL_SUBSYS_CTNETLINK || payload.len() < NFGENMSG_LEN {
                continue;
            }
            let destroy = match msg {
                IPCTNL_MSG_CT_DELETE => true,
                IPCTNL_MSG_CT_NEW if flags & NLM_F_CREATE == 0 => false,
                _ => continue,
            };
            self.counters.events += 1;
            let a = &payload[NFGENMSG_LEN..];
            let ev = parse_ct_event(a, destroy);
            let revokes = ev.revokes(self.marks);
            if revokes {
                r.revoke = true;
            }
            if matches!(ev.proto, Some(cticmp::IPPROTO_ICMP | cticmp::IPPROTO_ICMPV6)) && (destroy || revokes) {
                if let Some((_, tuple)) = attrs(a).find(|(t, _)| *t == CTA_TUPLE_ORIG) {
                    self.icmp_touched.push((payload[0], tuple.to_vec(), destroy));
                }
            }
            if self.eager_liberal && !self.skip_liberal && ev.needs_liberal(self.marks) {
                if let Some(tuple) = raw_attr(a, CTA_TUPLE_ORIG) {
                    self.liberal.push((payload[0], liberal_attrs(tuple, raw_attr(a, CTA_ZONE))));
                }
            }
        }
    }

    /// Queues a liberal update for every entry the data path asked about.
    fn take_requests(&mut self) {
        let Some(ring) = &mut self.ring else { return };
        let reqs = match ring.take() {
            Ok(r) => r,
            Err(e) => {
                warn!("reading the data path's liberal-window requests: {e}");
                return;
            }
        };
        self.counters.liberal_requests += reqs.len() as u64;
        if self.skip_liberal || self.eager_liberal {
            return;
        }
        for q in reqs {
            self.liberal.push((q.family, liberal_attrs(&q.tuple_attr(), None)));
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Clears the fast-path mark bits on every conntrack entry holding any
    /// of them: a dump, then one update per entry (batched). Returns how
    /// many entries were updated; entries gone meanwhile are not errors.
    pub fn clear_marks(&mut self) -> io::Result<u64> {
        let targets = self.dump_marked()?;
        let (cleared, err) = self.update_all(&targets)?;
        self.counters.marks_cleared += cleared;
        match err {
            Some(e) => Err(e),
            None => Ok(cleared),
        }
    }

    /// Sends the queued liberal-window updates.
    pub fn flush_liberal(&mut self) -> io::Result<u64> {
        if self.liberal.is_empty() {
            return Ok(0);
        }
        let targets = std::mem::take(&mut self.liberal);
        let (n, err) = self.update_all(&targets)?;
        self.counters.liberal += n;
        match err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// ctnetlink updates of existing entries, batched: (done, first error).
    fn update_all(&mut self, targets: &[(u8, Vec<u8>)]) -> io::Result<(u64, Option<io::Error>)> {
        let mut cleared = 0u64;
        let mut first_err: Option<io::Error> = None;
        for chunk in targets.chunks(UPDATE_BATCH) {
            let mut out = Vec::new();
            for (family, attrs) in chunk {
                let seq = self.next_seq();
                put_msg(&mut out, NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW, NLM_F_REQUEST | NLM_F_ACK, seq, *family, attrs);
            }
            self.req.send(&out, 0)?;
            let (ok, err) = self.read_acks(chunk.len())?;
            cleared += ok;
            if first_err.is_none() {
                first_err = err;
            }
        }
        Ok((cleared, first_err))
    }

    /// (family, update attributes) of every entry with any bit of the mask.
    fn dump_marked(&mut self) -> io::Result<Vec<(u8, Vec<u8>)>> {
        let seq = self.next_seq();
        let mut out = Vec::new();
        put_msg(&mut out, NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, 0, &[]);
        self.req.send(&out, 0)?;
        let mut targets = Vec::new();
        loop {
            let n = recv(self.req.as_raw_fd(), &mut self.buf, 0)?;
            let n = n.min(self.buf.len());
            let mut done = false;
            for (ty, flags, payload) in messages(&self.buf[..n]) {
                match ty {
                    NLMSG_DONE => done = true,
                    NLMSG_ERROR => {
                        let code = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
                        if code != 0 {
                            return Err(io::Error::from_raw_os_error(-code));
                        }
                        done = true;
                    }
                    _ if payload.len() >= NFGENMSG_LEN => {
                        let a = &payload[NFGENMSG_LEN..];
                        let mark = attrs(a).find(|(t, _)| *t == CTA_MARK).and_then(|(_, p)| be32(p)).unwrap_or(0);
                        if mark & self.marks.all() == 0 {
                            continue;
                        }
                        let Some(tuple) = raw_attr(a, CTA_TUPLE_ORIG) else { continue };
                        targets.push((payload[0], clear_mark_attrs(tuple, raw_attr(a, CTA_ZONE), self.marks.all())));
                    }
                    _ => {}
                }
                if flags & NLM_F_MULTI == 0 && ty != NLMSG_DONE && ty != NLMSG_ERROR {
                    // A single-part answer ends the dump too.
                    done = true;
                }
            }
            if done {
                return Ok(targets);
            }
        }
    }

    /// Reads `n` acks: (successes, first real error). ENOENT is an entry
    /// that died between the dump and the update: nothing left to clear.
    fn read_acks(&mut self, n: usize) -> io::Result<(u64, Option<io::Error>)> {
        let (mut seen, mut ok, mut err) = (0usize, 0u64, None);
        while seen < n {
            let got = recv(self.req.as_raw_fd(), &mut self.buf, 0)?;
            for (ty, _, payload) in messages(&self.buf[..got.min(self.buf.len())]) {
                if ty != NLMSG_ERROR {
                    continue;
                }
                seen += 1;
                let code = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
                match -code {
                    0 => ok += 1,
                    libc::ENOENT => {}
                    e => {
                        if err.is_none() {
                            err = Some(io::Error::from_raw_os_error(e));
                        }
                    }
                }
            }
        }
        Ok((ok, err))
    }
}

/// Conntrack timeouts the data path refreshes fast-pathed entries with
/// (seconds), from the router namespace's sysctls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtTimeouts {
    pub tcp: u32,
    pub udp: u32,
    pub udp_stream: u32,
    /// nf_conntrack_icmp_timeout, nf_conntrack_icmpv6_timeout: what an
    /// echo entry is refreshed to (cticmp.rs).
    #[serde(default = "default_icmp_timeout")]
    pub icmp: u32,
    #[serde(default = "default_icmp_timeout")]
    pub icmpv6: u32,
    /// nf_conntrack_tcp_be_liberal: every TCP entry's window tracking is
    /// liberal (read with the timeouts; not one, so kept out of `timeouts_s`).
    #[serde(skip)]
    pub tcp_liberal: bool,
}

impl CtTimeouts {
    /// The revalidation interval the data path may use: at most half the
    /// shortest timeout a fast entry lives on (TCP established, assured
    /// UDP). Each validation refreshes the entry's timeout; a longer
    /// interval would let a busy flow's entry expire between two, and an
    /// idle flow's verdict outlive its entry until the kernel collects it.
    /// (ICMP echo entries, refreshed by the daemon, count too.)
    pub fn revalidate_cap_ms(&self, revalidate_ms: u32) -> u32 {
        let shortest = self.tcp.min(self.udp_stream).min(self.icmp).min(self.icmpv6);
        revalidate_ms.min(shortest.saturating_mul(500))
    }
}

impl Default for CtTimeouts {
    /// The kernel's own defaults, for when the sysctls cannot be read.
    fn default() -> Self {
        CtTimeouts { tcp: 432_000, udp: 30, udp_stream: 120, icmp: 30, icmpv6: 30, tcp_liberal: false }
    }
}

fn default_icmp_timeout() -> u32 {
    30
}

fn read_u32(root: &Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(root.join(name)).ok()?.trim().parse().ok()
}

/// /proc/sys/net/netfilter is per network namespace, seen through the
/// reading thread's: the daemon thread lives in the router's.
pub fn read_timeouts(root: &Path) -> Option<CtTimeouts> {
    Some(CtTimeouts {
        tcp: read_u32(root, "nf_conntrack_tcp_timeout_established")?,
        udp: read_u32(root, "nf_conntrack_udp_timeout")?,
        udp_stream: read_u32(root, "nf_conntrack_udp_timeout_stream")?,
        icmp: read_u32(root, "nf_conntrack_icmp_timeout").unwrap_or_else(default_icmp_timeout),
        icmpv6: read_u32(root, "nf_conntrack_icmpv6_timeout").unwrap_or_else(default_icmp_timeout),
        tcp_liberal: read_u32(root, "nf_conntrack_tcp_be_liberal").is_some_and(|v| v != 0),
    })
}

const NETFILTER_SYSCTL: &str = "/proc/sys/net/netfilter";

/// What `fastpath status` shows about the stateful mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtStatus {
    /// The original direction's bits (`--ct-mark`).
    pub mark: u32,
    /// The reply direction's bits (`--ct-mark-reply`).
    pub mark_reply: u32,
    pub revalidate_ms: u32,
    /// What the data path uses: `revalidate_ms`, or half the shortest
    /// conntrack timeout of fast entries when that is shorter.
    pub revalidate_effective_ms: u32,
    pub generation: u32,
    pub timeouts_s: CtTimeouts,
    /// net.netfilter.nf_conntrack_events is not 0: the kernel sends events.
    pub events_enabled: bool,
    /// ICMP echo entries that can be copied (--ct-icmp-entries).
    #[serde(default)]
    pub icmp_capacity: u64,
    #[serde(flatten)]
    pub counters: CtCounters,
}

/// Both directions on the same bits is the user's choice, but not a safe one.
fn warn_capped(revalidate_ms: u32, t: CtTimeouts) {
    let cap = t.revalidate_cap_ms(revalidate_ms);
    if cap < revalidate_ms {
        warn!(
            "ct revalidation every {revalidate_ms} ms outlasts half the conntrack timeouts ({} s TCP established, {} s assured UDP, {}/{} s ICMP/ICMPv6): cached verdicts are re-checked every {cap} ms instead, so that no fast entry expires between two checks",
            t.tcp, t.udp_stream, t.icmp, t.icmpv6
        );
    }
}

fn warn_one_mark(m: CtMarks) {
    if m.orig & m.reply != 0 {
        warn!(
            "ct mark {:#x} and ct mark reply {:#x} share bits: a packet the ruleset accepts in one direction then vouches for the other, so a rule dropping one direction of an established connection is bypassed once the other is marked",
            m.orig, m.reply
        );
    }
}

/// The maps the daemon side of the stateful mode works on.
pub struct StatefulMaps {
    /// fp_ct_liberal_req: TCP entries to make liberal.
    pub liberal_req: libbpf_rs::MapHandle,
    /// fp_ct_icmp: the ICMP echo entries' copies.
    pub icmp: libbpf_rs::MapHandle,
    /// fp_ct_icmp_req: ICMP tuples the data path asks about.
    pub icmp_req: libbpf_rs::MapHandle,
}

/// The stateful mode as the daemon loop drives it.
pub struct Stateful {
    watch: Watch,
    /// Conntrack's ICMP echo entries for the data path.
    icmp: cticmp::Mirror,
    timeouts: CtTimeouts,
    marks: CtMarks,
    revalidate_ms: u32,
    events_enabled: bool,
    ab: CtAb,
}

impl Stateful {
    /// Subscribes first, so nothing that happens from here on is missed;
    /// then writes the ct settings into fp_runtime and clears the marks
    /// set before we watched (they vouch for a ruleset we never saw).
    pub fn start(
        marks: CtMarks,
        revalidate_ms: u32,
        rcvbuf: usize,
        ab: CtAb,
        maps: StatefulMaps,
        writer: &mut MapWriter,
    ) -> anyhow::Result<Stateful> {
        use anyhow::Context;
        if ab != CtAb::Full {
            warn!("--ct-ab {ab:?}: conntrack work left out or done otherwise for a measurement; revocations are not guaranteed");
        }
        let ring = ctliberal::Ring::open(maps.liberal_req).context("opening the data path's liberal-window request ring (fp_ct_liberal_req)")?;
        let icmp = cticmp::Mirror::open(maps.icmp, maps.icmp_req)?;
        let watch = Watch::open(marks, rcvbuf, ab, Some(ring)).context("subscribing to conntrack and nftables events")?;
        let root = Path::new(NETFILTER_SYSCTL);
        let timeouts = read_timeouts(root).unwrap_or_else(|| {
            warn!("cannot read the conntrack timeouts in {NETFILTER_SYSCTL}; using the kernel defaults");
            CtTimeouts::default()
        });
        let events_enabled = read_u32(root, "nf_conntrack_events").is_none_or(|v| v != 0);
        if !events_enabled {
            warn!("net.netfilter.nf_conntrack_events is 0: only entries the ruleset gives an event mask (`ct event set`, as the example ruleset does) send conntrack events; the others' revocations wait for the {revalidate_ms} ms revalidation");
        }
        writer.set_ct(marks, revalidate_ms, timeouts);
        let mut s = Stateful { watch, icmp, timeouts, marks, revalidate_ms, events_enabled, ab };
        s.watch.skip_liberal = s.skip_liberal();
        s.clear_marks();
        s.bump(writer);
        info!(
            "stateful mode: ct mark {:#x} (original direction), {:#x} (reply), revalidation every {revalidate_ms} ms, timeouts {timeouts:?}",
            marks.orig, marks.reply
        );
        warn_one_mark(marks);
        warn_capped(revalidate_ms, timeouts);
        Ok(s)
    }

    pub fn wait(&self, others: &[RawFd], timeout: Duration) {
        let timeout = self.icmp.until_poll().map_or(timeout, |p| p.min(timeout));
        self.watch.wait(others, &[self.icmp.fd()], timeout);
    }

    /// A netns-wide liberal window tracking makes every entry liberal: the
    /// data path then checks no entry's own flags, and an update per
    /// connection would only cost the kernel and us. (Should the sysctl go
    /// back to strict, entries marked meanwhile punt until marked again.)
    fn skip_liberal(&self) -> bool {
        self.ab == CtAb::NoLiberal || self.timeouts.tcp_liberal
    }

    /// One round: read the events, clear marks on a ruleset change, read
    /// the ICMP entries due (all of them after a ruleset change or lost
    /// events: their copies must say what conntrack says before the bump
    /// sends the cached verdicts back to them), bump.
    pub fn step(&mut self, writer: &mut MapWriter) {
        let r = self.watch.drain();
        if r.ruleset {
            self.watch.counters.ruleset_changes += 1;
            self.clear_marks();
        }
        let icmp_revoked = self.icmp_step(r.ruleset || r.lost);
        if r.revoke || r.ruleset || icmp_revoked {
            self.bump(writer);
        }
        if let Err(e) = self.watch.flush_liberal() {
            warn!("making conntrack's TCP window tracking liberal for fast-pathed connections: {e}");
        }
    }

    /// True if a forwarding ICMP copy was taken back (see cticmp).
    fn icmp_step(&mut self, all: bool) -> bool {
        let touched = std::mem::take(&mut self.watch.icmp_touched);
        let revalidate = self.timeouts.revalidate_cap_ms(self.revalidate_ms);
        self.icmp.step(&touched, all, self.marks, self.timeouts, revalidate, &mut self.watch.counters)
    }

    fn clear_marks(&mut self) {
        match self.watch.clear_marks() {
            Ok(n) if n > 0 => info!("cleared the fast-path mark on {n} conntrack entries"),
            Ok(_) => {}
            Err(e) => {
                self.watch.counters.clear_errors += 1;
                warn!("clearing the fast-path conntrack marks: {e}; verdicts still expire after {} ms", self.revalidate_ms);
            }
        }
    }

    fn bump(&mut self, writer: &mut MapWriter) {
        self.watch.counters.bumps += 1;
        if let Err(e) = writer.bump_ct_generation() {
            // The bump is kept in the writer's copy and goes out with the next write.
            warn!("writing ct_generation: {e}");
        }
    }

    /// A reload's new mark bits. Entries carrying the new bits were marked
    /// under rules we did not watch for that meaning, so they are cleared
    /// as at start; then every cached verdict is re-checked against the
    /// new mask. (Bits only the old mask had are the user's again.)
    pub fn marks(&self) -> CtMarks {
        self.marks
    }

    pub fn set_marks(&mut self, marks: CtMarks, writer: &mut MapWriter) -> Result<(), String> {
        let old = self.marks;
        writer.set_ct(marks, self.revalidate_ms, self.timeouts);
        if let Err(e) = writer.write_ct() {
            writer.set_ct(old, self.revalidate_ms, self.timeouts);
            return Err(format!("writing fp_runtime: {e}"));
        }
        self.marks = marks;
        self.watch.marks = marks;
        self.clear_marks();
        let _ = self.icmp_step(true); // bumped below either way
        self.bump(writer);
        info!(
            "stateful mode: ct mark {:#x}/{:#x} -> {:#x}/{:#x} (original/reply)",
            old.orig, old.reply, marks.orig, marks.reply
        );
        warn_one_mark(marks);
        Ok(())
    }

    /// A reload's new revalidation interval; the data path compares each
    /// verdict's age with it on the next packet.
    pub fn set_revalidate_ms(&mut self, ms: u32, writer: &mut MapWriter) -> Result<(), String> {
        writer.set_ct(self.marks, ms, self.timeouts);
        if let Err(e) = writer.write_ct() {
            writer.set_ct(self.marks, self.revalidate_ms, self.timeouts);
            return Err(format!("writing fp_runtime: {e}"));
        }
        self.revalidate_ms = ms;
        warn_capped(ms, self.timeouts);
        Ok(())
    }

    /// The periodic sysctl pass: timeouts may be changed at any time.
    pub fn refresh_sysctls(&mut self, writer: &mut MapWriter) {
        let Some(t) = read_timeouts(Path::new(NETFILTER_SYSCTL)) else { return };
        if t != self.timeouts {
            info!("conntrack timeouts changed: {t:?}");
            warn_capped(self.revalidate_ms, t);
            self.timeouts = t;
            self.watch.skip_liberal = self.skip_liberal();
            writer.set_ct(self.marks, self.revalidate_ms, t);
            if let Err(e) = writer.write_ct() {
                warn!("writing the conntrack timeouts: {e}");
            }
        }
    }

    pub fn status(&self, writer: &MapWriter) -> CtStatus {
        CtStatus {
            mark: self.marks.orig,
            mark_reply: self.marks.reply,
            revalidate_ms: self.revalidate_ms,
            revalidate_effective_ms: self.timeouts.revalidate_cap_ms(self.revalidate_ms),
            generation: writer.ct_generation(),
            timeouts_s: self.timeouts,
            events_enabled: self.events_enabled,
            icmp_capacity: self.icmp.capacity() as u64,
            counters: self.watch.counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn pipe() -> (std::fs::File, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: pipe() fills the two-element array we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors are fresh and owned by nothing else.
        unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) }
    }

    /// One call reads a burst of datagrams into their own slots, each with
    /// its length, and flags the one too big for its slot.
    #[test]
    fn a_burst_of_datagrams_in_one_call() {
        let mut sv = [0; 2];
        // SAFETY: socketpair() fills the two-element array we own.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, sv.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors are fresh and owned by nothing else.
        let (rx, tx) = unsafe { (std::fs::File::from_raw_fd(sv[0]), std::fs::File::from_raw_fd(sv[1])) };
        let sizes = [5usize, 300, EVENT_SLOT + 100, 7];
        for (i, n) in sizes.iter().enumerate() {
            let msg = vec![i as u8 + 1; *n];
            // SAFETY: msg is valid for its length.
            let sent = unsafe { libc::send(tx.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
            assert_eq!(sent, *n as isize);
        }
        let mut buf = vec![0u8; EVENT_BATCH * EVENT_SLOT];
        let mut got = Vec::new();
        recv_batch(rx.as_raw_fd(), &mut buf, &mut got).expect("recvmmsg");
        assert_eq!(got, vec![(5, false), (300, false), (EVENT_SLOT, true), (7, false)]);
        assert!(buf[EVENT_SLOT..EVENT_SLOT + 300].iter().all(|b| *b == 2));
        assert_eq!(buf[3 * EVENT_SLOT], 4);
        let e = recv_batch(rx.as_raw_fd(), &mut buf, &mut got).expect_err("nothing left");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    /// Conntrack events alone are left to queue up for the coalescing time...
    #[test]
    fn conntrack_events_alone_wait_to_coalesce() {
        use std::io::Write;
        let (route, _route_w) = pipe();
        let (ct, mut ct_w) = pipe();
        ct_w.write_all(b"e").unwrap();
        let t = std::time::Instant::now();
        wait_coalesced(&[route.as_raw_fd(), -1], &[ct.as_raw_fd(), -1], Duration::from_secs(5), Duration::from_millis(200));
        assert!(t.elapsed() >= Duration::from_millis(150), "returned after {:?}", t.elapsed());
    }

    /// ...but a route change arriving meanwhile ends the wait at once, and
    /// so does any of the other urgent sockets (the daemon's watchers: a
    /// firewall rule must not wait behind conntrack's coalescing).
    #[test]
    fn a_route_change_ends_the_coalescing_wait() {
        use std::io::Write;
        for urgent in 0..2 {
            let (route, route_w) = pipe();
            let (watcher, watcher_w) = pipe();
            let (ct, mut ct_w) = pipe();
            ct_w.write_all(b"e").unwrap();
            let mut w = if urgent == 0 { route_w } else { watcher_w };
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                w.write_all(b"r").unwrap();
                w
            });
            let t = std::time::Instant::now();
            wait_coalesced(&[route.as_raw_fd(), watcher.as_raw_fd()], &[ct.as_raw_fd(), -1], Duration::from_secs(5), Duration::from_secs(30));
            assert!(t.elapsed() < Duration::from_secs(10), "socket {urgent}'s change waited {:?}", t.elapsed());
            drop(writer.join().unwrap());
        }
    }

    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(payload);
        v.resize(align4(v.len()), 0);
        v
    }

    fn event_attrs(status: u32, mark: Option<u32>, tcp: Option<u8>) -> Vec<u8> {
        let mut a = nla(CTA_TUPLE_ORIG | 0x8000, &nla(2 | 0x8000, &nla(1, &[6])));
        a.extend(nla(CTA_STATUS, &status.to_be_bytes()));
        if let Some(s) = tcp {
            let tcp = nla(CTA_PROTOINFO_TCP | 0x8000, &nla(CTA_PROTOINFO_TCP_STATE, &[s]));
            a.extend(nla(CTA_PROTOINFO | 0x8000, &tcp));
        }
        if let Some(m) = mark {
            a.extend(nla(CTA_MARK, &m.to_be_bytes()));
        }
        a
    }

    const EST: u32 = IPS_SEEN_REPLY | (1 << 2) | (1 << 3);

    #[test]
    fn parses_status_mark_and_tcp_state() {
        let ev = parse_ct_event(&event_attrs(EST, Some(0x11), Some(4)), false);
        assert_eq!(
            ev,
            CtEvent { destroy: false, status: Some(EST), mark: Some(0x11), tcp_state: Some(4), proto: Some(6), liberal: Some(false) }
        );
        let ev = parse_ct_event(&event_attrs(EST, None, None), true);
        assert_eq!((ev.mark, ev.tcp_state, ev.destroy), (None, None, true));
    }

    const DIRS: CtMarks = CtMarks { orig: 0x1, reply: 0x2 };

    #[test]
    fn what_revokes() {
        let ev = |status, mark, tcp, destroy| CtEvent { destroy, status: Some(status), mark, tcp_state: tcp, ..Default::default() };
        // Destroy: only of an entry one of whose directions could be fast.
        assert!(ev(EST, Some(0x1), None, true).revokes(DIRS));
        assert!(ev(EST, Some(0x2), None, true).revokes(DIRS));
        assert!(!ev(EST, Some(0x4), None, true).revokes(DIRS));
        assert!(!ev(EST, None, None, true).revokes(DIRS));
        // Updates of an established entry marked for a direction or both: still fast.
        assert!(!ev(EST, Some(0x1), Some(TCP_CONNTRACK_ESTABLISHED), false).revokes(DIRS));
        assert!(!ev(EST, Some(0x2), None, false).revokes(DIRS));
        assert!(!ev(EST, Some(0x7), None, false).revokes(DIRS));
        // Mark cleared (attribute present, bits gone), or no direction's bits complete.
        assert!(ev(EST, Some(0), None, false).revokes(DIRS));
        assert!(ev(EST, Some(0x4), None, false).revokes(DIRS));
        assert!(ev(EST, Some(0x1), None, false).revokes(CtMarks { orig: 0x3, reply: 0xc }));
        // One mask for both directions, as before directions had their own.
        assert!(!ev(EST, Some(0x1), None, false).revokes(CtMarks { orig: 0x1, reply: 0x1 }));
        // TCP leaving ESTABLISHED, dying.
        assert!(ev(EST, Some(0x1), Some(4), false).revokes(DIRS));
        assert!(ev(EST | IPS_DYING, Some(0x2), None, false).revokes(DIRS));
        // Set-up events of a never-marked entry cost nothing.
        assert!(!ev(IPS_SEEN_REPLY, None, Some(2), false).revokes(DIRS));
    }

    #[test]
    fn revalidation_is_capped_at_half_the_shortest_fast_timeout() {
        let t = CtTimeouts { tcp: 432000, udp: 30, udp_stream: 120, icmp: 30, icmpv6: 30, tcp_liberal: false };
        assert_eq!(t.revalidate_cap_ms(1000), 1000);
        assert_eq!(t.revalidate_cap_ms(600_000), 15_000, "icmp 30 s (the daemon's refresh follows the interval)");
        assert_eq!(CtTimeouts { icmp: 300, ..t }.revalidate_cap_ms(600_000), 15_000, "icmpv6 30 s");
        assert_eq!(CtTimeouts { icmp: 300, icmpv6: 300, ..t }.revalidate_cap_ms(600_000), 60_000, "udp_stream 120 s");
        assert_eq!(t.revalidate_cap_ms(0), 0, "0 stays: every packet looked up");
        // The unassured UDP timeout never holds a fast entry.
        let t = CtTimeouts { udp: 1, udp_stream: 3, ..t };
        assert_eq!(t.revalidate_cap_ms(60_000), 1500);
        let t = CtTimeouts { tcp: 2, ..t };
        assert_eq!(t.revalidate_cap_ms(60_000), 1000);
    }

    #[test]
    fn marks_of_both_directions() {
        assert_eq!(DIRS.all(), 0x3);
        assert!(DIRS.fast_somewhere(0x1) && DIRS.fast_somewhere(0x2) && DIRS.fast_somewhere(0x13));
        assert!(!DIRS.fast_somewhere(0) && !DIRS.fast_somewhere(0x4));
    }

    #[test]
    fn clear_update_copies_tuple_and_zone() {
        let tuple = nla(CTA_TUPLE_ORIG | 0x8000, &nla(2 | 0x8000, &nla(1, &[17])));
        let zone = nla(CTA_ZONE, &7u16.to_be_bytes());
        let a = clear_mark_attrs(&tuple, Some(&zone), 0x1);
        let got: Vec<(u16, Vec<u8>)> = attrs(&a).map(|(t, p)| (t, p.to_vec())).collect();
        assert_eq!(got.len(), 4);
        assert_eq!(raw_attr(&a, CTA_TUPLE_ORIG), Some(&tuple[..]));
        assert_eq!(got[1], (CTA_ZONE, vec![0, 7]));
        assert_eq!(got[2], (CTA_MARK, vec![0; 4]));
        assert_eq!(got[3], (CTA_MARK_MASK, vec![0, 0, 0, 1]));
    }

    #[test]
    fn message_framing_round_trips() {
        let mut out = Vec::new();
        put_msg(&mut out, 0x100, NLM_F_REQUEST | NLM_F_ACK, 9, 2, &nla(CTA_MARK, &5u32.to_be_bytes()));
        put_msg(&mut out, 0x101, NLM_F_REQUEST | NLM_F_DUMP, 10, 0, &[]);
        let msgs: Vec<_> = messages(&out).collect();
        assert_eq!(msgs.len(), 2);
        assert_eq!((msgs[0].0, msgs[0].1), (0x100, NLM_F_REQUEST | NLM_F_ACK));
        assert_eq!(msgs[0].2[0], 2);
        assert_eq!(be32(attrs(&msgs[0].2[4..]).next().unwrap().1), Some(5));
        assert_eq!(msgs[1].2.len(), NFGENMSG_LEN);
    }

    #[test]
    fn marked_tcp_entries_are_made_liberal_once() {
        let mut a = event_attrs(EST, Some(1), Some(3));
        let ev = parse_ct_event(&a, false);
        assert_eq!((ev.proto, ev.liberal), (Some(6), Some(false)));
        assert!(ev.needs_liberal(DIRS));
        assert!(!ev.needs_liberal(CtMarks { orig: 0x2, reply: 0x4 }));
        assert!(!CtEvent { destroy: true, ..ev }.needs_liberal(DIRS));
        // Our own update's event: protoinfo says liberal both ways.
        let upd = liberal_attrs(raw_attr(&a, CTA_TUPLE_ORIG).unwrap(), None);
        a.truncate(0);
        a.extend(upd);
        a.extend(nla(CTA_MARK, &1u32.to_be_bytes()));
        let ev = parse_ct_event(&a, false);
        assert_eq!((ev.proto, ev.liberal), (Some(6), Some(true)));
        assert!(!ev.needs_liberal(DIRS));
        // Its flags attributes: BE_LIBERAL in both flags and mask.
        let (_, pi) = attrs(&a).find(|(t, _)| *t == CTA_PROTOINFO).unwrap();
        let (_, tcp) = attrs(pi).next().unwrap();
        let f: Vec<_> = attrs(tcp).map(|(t, v)| (t, v.to_vec())).collect();
        assert_eq!(f, vec![(4, vec![8, 8]), (5, vec![8, 8])]);
    }

    #[test]
    fn truncated_input_stops_cleanly() {
        assert_eq!(attrs(&[8, 0, 1, 0, 1]).count(), 0);
        assert_eq!(messages(&[0u8; 10]).count(), 0);
        assert_eq!(parse_ct_event(&[0xff; 3], false), CtEvent::default());
    }

    #[test]
    fn timeouts_from_sysctl_files() {
        let dir = std::env::temp_dir().join(format!("fp-ct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_timeouts(&dir), None);
        std::fs::write(dir.join("nf_conntrack_tcp_timeout_established"), "60\n").unwrap();
        std::fs::write(dir.join("nf_conntrack_udp_timeout"), "5\n").unwrap();
        std::fs::write(dir.join("nf_conntrack_udp_timeout_stream"), "10\n").unwrap();
        assert_eq!(read_timeouts(&dir), Some(CtTimeouts { tcp: 60, udp: 5, udp_stream: 10, icmp: 30, icmpv6: 30, tcp_liberal: false }));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
