//! The zebra side of one FPM connection, for `fastpath bench fpm`: routes
//! as netlink messages packed many to an FPM frame (as dplane_fpm_nl does
//! when it has a backlog), and a reader thread that takes in the daemon's
//! status replies (RTM_NEWROUTE with RTM_F_OFFLOAD / RTM_F_OFFLOAD_FAILED)
//! as they come, so the daemon's writes never block on us, and keeps, per
//! prefix, the time and kind of the last one.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fastpath_core::parse::{self, push_attr, request, RTM_DELROUTE, RTM_NEWROUTE};

use super::topo;
use crate::fpm::frame::{self, Decoder, MAX_PAYLOAD, TYPE_NETLINK};
use crate::fpm::status::{RTM_F_OFFLOAD, RTM_F_OFFLOAD_FAILED};

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_CREATE: u16 = 0x400;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_TABLE: u16 = 15;
const RT_TABLE_MAIN: u8 = 254;
/// zebra's protocol number for BGP routes.
const RTPROT_BGP: u8 = 186;
const RTN_UNICAST: u8 = 1;
/// zebra's metric for (e)BGP routes.
const METRIC: u32 = 20;
/// Sends are cut into writes of about this size, so a stop is noticed.
const WRITE_CHUNK: usize = 4 << 20;

/// One route as zebra sends it: prefix, gateway and the gateway's device.
#[derive(Debug, Clone, Copy)]
pub(super) struct Route {
    pub(super) dst: IpAddr,
    pub(super) len: u8,
    pub(super) gw: IpAddr,
    pub(super) oif: u32,
}

fn family(a: &IpAddr) -> u8 {
    match a {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn octets(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// rtmsg (family, dst_len, src_len, tos, table, protocol, scope universe,
/// type unicast, flags) with RTA_DST, RTA_PRIORITY and RTA_TABLE.
fn rtmsg(dst: &IpAddr, len: u8) -> Vec<u8> {
    let mut p = vec![family(dst), len, 0, 0, RT_TABLE_MAIN, RTPROT_BGP, 0, RTN_UNICAST, 0, 0, 0, 0];
    push_attr(&mut p, RTA_DST, &octets(dst));
    push_attr(&mut p, RTA_PRIORITY, &METRIC.to_ne_bytes());
    push_attr(&mut p, RTA_TABLE, &u32::from(RT_TABLE_MAIN).to_ne_bytes());
    p
}

/// RTM_NEWROUTE for `r` in the main table.
pub(super) fn add_msg(r: &Route, seq: u32) -> Vec<u8> {
    let mut p = rtmsg(&r.dst, r.len);
    push_attr(&mut p, RTA_GATEWAY, &octets(&r.gw));
    push_attr(&mut p, RTA_OIF, &r.oif.to_ne_bytes());
    request(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_CREATE, seq, &p)
}

/// RTM_DELROUTE for prefix `dst`/`len` in the main table.
pub(super) fn del_msg(dst: IpAddr, len: u8, seq: u32) -> Vec<u8> {
    request(RTM_DELROUTE, NLM_F_REQUEST, seq, &rtmsg(&dst, len))
}

/// Netlink messages packed into as few FPM frames as fit (65535 bytes each).
pub(super) fn frames(msgs: impl IntoIterator<Item = Vec<u8>>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut payload = Vec::with_capacity(MAX_PAYLOAD);
    for m in msgs {
        if payload.len() + m.len() > MAX_PAYLOAD {
            out.extend(frame::encode(&payload)?);
            payload.clear();
        }
        payload.extend(m);
    }
    if !payload.is_empty() {
        out.extend(frame::encode(&payload)?);
    }
    Ok(out)
}

/// The last status reply for one prefix.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reply {
    pub(super) at: Instant,
    pub(super) offloaded: bool,
}

#[derive(Default)]
pub(super) struct ReplyState {
    /// Per (prefix, length): the last status and when it arrived.
    pub(super) last: HashMap<(IpAddr, u8), Reply>,
    pub(super) offload_msgs: u64,
    pub(super) failed_msgs: u64,
    /// Messages that were not route status replies.
    pub(super) other_msgs: u64,
    /// Why the reader stopped (None while it runs).
    pub(super) ended: Option<String>,
}

#[derive(Default)]
pub(super) struct Replies {
    state: Mutex<ReplyState>,
    cv: Condvar,
}

impl Replies {
    pub(super) fn lock(&self) -> MutexGuard<'_, ReplyState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Waits (at most `timeout`) for the next batch of replies.
    fn wait_a_bit(&self, timeout: Duration) {
        let g = self.lock();
        let _ = self.cv.wait_timeout(g, timeout);
    }

    /// Waits until `n` prefixes have a status, or none came for `quiet`,
    /// or `timeout` since `t0` passed. Returns the state's count of
    /// prefixes with a status and, once all `n` have one, the time since
    /// `t0` of the last one to arrive.
    pub(super) fn wait_all(&self, n: usize, t0: Instant, quiet: Duration, timeout: Duration, stop: &AtomicBool) -> Result<TableStatus> {
        let mut seen = 0;
        let mut progress = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            let st = {
                let g = self.lock();
                TableStatus {
                    prefixes: g.last.len(),
                    offloaded: g.last.values().filter(|r| r.offloaded).count(),
                    last: (g.last.len() >= n)
                        .then(|| g.last.values().map(|r| r.at.saturating_duration_since(t0)).max().unwrap_or_default()),
                }
            };
            if st.prefixes >= n || progress.elapsed() > quiet || t0.elapsed() > timeout {
                return Ok(st);
            }
            if st.prefixes > seen {
                seen = st.prefixes;
                progress = Instant::now();
            }
            self.wait_a_bit(Duration::from_millis(100));
        }
    }

    /// Time from `t` until an OFFLOAD status for `key` arrived (after `t`);
    /// None if none came within `limit`.
    pub(super) fn wait_offloaded(&self, key: (IpAddr, u8), t: Instant, limit: Duration) -> Option<Duration> {
        loop {
            if let Some(r) = self.lock().last.get(&key) {
                if r.offloaded && r.at >= t {
                    return Some(r.at - t);
                }
            }
            if t.elapsed() > limit {
                return None;
            }
            self.wait_a_bit(Duration::from_millis(5));
        }
    }
}

/// What `Replies::wait_all` found.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TableStatus {
    /// Prefixes with a status.
    pub(super) prefixes: usize,
    /// Of those, offloaded.
    pub(super) offloaded: usize,
    /// Since the first route was sent, until the last status arrived (None: not all came).
    pub(super) last: Option<Duration>,
}

/// One FPM connection to the daemon.
pub(super) struct Client {
    stream: TcpStream,
    replies: Arc<Replies>,
    reader: Option<JoinHandle<()>>,
    seq: u32,
}

impl Client {
    /// Connects from inside network namespace `ns` (the daemon's), retrying
    /// for `timeout` while nothing listens yet.
    pub(super) fn connect(ns: &str, addr: SocketAddr, timeout: Duration) -> Result<Client> {
        let start = Instant::now();
        let stream = loop {
            match topo::in_netns(ns, || TcpStream::connect_timeout(&addr, Duration::from_secs(1)))? {
                Ok(s) => break s,
                Err(e) if start.elapsed() > timeout => {
                    return Err(e).with_context(|| format!("connecting to the daemon's FPM server on {addr} in {ns}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        // A single change goes out at once, not after the previous one's ack.
        stream.set_nodelay(true).context("TCP_NODELAY on the FPM connection")?;
        let replies = Arc::new(Replies::default());
        let reader = {
            let (s, r) = (stream.try_clone().context("cloning the FPM socket")?, Arc::clone(&replies));
            std::thread::Builder::new()
                .name("fpm-replies".into())
                .spawn(move || read_replies(s, &r))
                .context("starting the FPM reply reader")?
        };
        Ok(Client { stream, replies, reader: Some(reader), seq: 0 })
    }

    pub(super) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    pub(super) fn replies(&self) -> &Replies {
        &self.replies
    }

    /// Writes ready FPM frames (`frames`'s output).
    pub(super) fn send(&mut self, bytes: &[u8], stop: &AtomicBool) -> Result<()> {
        for chunk in bytes.chunks(WRITE_CHUNK) {
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            self.stream.write_all(chunk).context("writing to the FPM connection")?;
        }
        Ok(())
    }

    /// One frame with messages `msgs` (one change: one message).
    pub(super) fn send_msgs(&mut self, msgs: Vec<Vec<u8>>) -> Result<()> {
        let f = frames(msgs)?;
        self.stream.write_all(&f).context("writing to the FPM connection")
    }

    /// Closes the connection (zebra going away) and stops the reader.
    pub(super) fn close(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(h) = self.reader.take() {
            if h.join().is_err() {
                log::warn!("the FPM reply reader panicked");
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shut();
    }
}

fn read_replies(mut s: TcpStream, replies: &Replies) {
    let mut buf = vec![0u8; 1 << 20];
    let mut dec = Decoder::default();
    let end = loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break "closed".to_string(),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => break e.to_string(),
        };
        let now = Instant::now();
        dec.push(&buf[..n]);
        let mut st = replies.lock();
        let mut bad = None;
        while let Some(f) = dec.next_frame() {
            match f {
                Ok(f) if f.msg_type == TYPE_NETLINK => take_frame(&mut st, &f.payload, now),
                Ok(_) => st.other_msgs += 1,
                Err(e) => {
                    bad = Some(format!("lost FPM framing: {e}"));
                    break;
                }
            }
        }
        drop(st);
        replies.cv.notify_all();
        if let Some(why) = bad {
            break why;
        }
    };
    replies.lock().ended = Some(end);
    replies.cv.notify_all();
}

fn take_frame(st: &mut ReplyState, payload: &[u8], now: Instant) {
    for m in parse::frames(payload) {
        let Ok(m) = m else {
            st.other_msgs += 1;
            return;
        };
        match (m.msg_type == RTM_NEWROUTE).then(|| status_of(m.payload)).flatten() {
            Some((key, flags)) => {
                let offloaded = flags & RTM_F_OFFLOAD != 0;
                if offloaded {
                    st.offload_msgs += 1;
                } else if flags & RTM_F_OFFLOAD_FAILED != 0 {
                    st.failed_msgs += 1;
                }
                st.last.insert(key, Reply { at: now, offloaded });
            }
            None => st.other_msgs += 1,
        }
    }
}

/// (prefix, length) and rtm_flags of an RTM_NEWROUTE payload.
fn status_of(p: &[u8]) -> Option<((IpAddr, u8), u32)> {
    if p.len() < 12 {
        return None;
    }
    let (fam, len) = (p[0], p[1]);
    let flags = u32::from_ne_bytes(p[8..12].try_into().ok()?);
    let mut dst: IpAddr = if fam == libc::AF_INET as u8 {
        IpAddr::from([0u8; 4])
    } else if fam == libc::AF_INET6 as u8 {
        IpAddr::from([0u8; 16])
    } else {
        return None;
    };
    let mut at = 12;
    while at + 4 <= p.len() {
        let alen = usize::from(u16::from_ne_bytes([p[at], p[at + 1]]));
        let kind = u16::from_ne_bytes([p[at + 2], p[at + 3]]);
        if alen < 4 || at + alen > p.len() {
            break;
        }
        let v = &p[at + 4..at + alen];
        if kind == RTA_DST {
            dst = match v.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(v).ok()?),
                16 => IpAddr::from(<[u8; 16]>::try_from(v).ok()?),
                _ => return None,
            };
        }
        at += (alen + 3) & !3;
    }
    Some(((dst, len), flags))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fpm::status::{reply, Offload};

    #[test]
    fn frames_pack_many_messages_and_replies_parse_back() {
        let r = Route { dst: "2001:db8:fff::".parse().expect("addr"), len: 48, gw: "2001:db8:0:2::10".parse().expect("addr"), oif: 3 };
        let msgs: Vec<Vec<u8>> = (0..2000).map(|i| add_msg(&r, i)).collect();
        let bytes = frames(msgs.clone()).expect("fits");
        let mut dec = Decoder::default();
        dec.push(&bytes);
        let mut n = 0;
        let mut count = 0;
        while let Some(f) = dec.next_frame() {
            let f = f.expect("valid");
            assert!(f.payload.len() <= MAX_PAYLOAD);
            n += parse::frames(&f.payload).count();
            count += 1;
        }
        assert_eq!(n, 2000);
        assert!(count > 1 && count < 5, "{count} frames");

        let nl = parse::frames(&msgs[0]).next().expect("one").expect("valid");
        let back = reply(nl.payload, Offload::Offloaded, 9).expect("route");
        let mut st = ReplyState::default();
        take_frame(&mut st, &back, Instant::now());
        assert_eq!(st.offload_msgs, 1);
        assert!(st.last[&(r.dst, 48)].offloaded);
        let failed = reply(nl.payload, Offload::Failed, 10).expect("route");
        take_frame(&mut st, &failed, Instant::now());
        assert_eq!((st.offload_msgs, st.failed_msgs), (1, 1));
        assert!(!st.last[&(r.dst, 48)].offloaded);
    }
}
