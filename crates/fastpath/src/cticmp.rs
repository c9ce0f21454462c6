//! Stateful mode: conntrack's ICMP and ICMPv6 echo entries, copied for the
//! data path.
//!
//! The conntrack kfuncs look up TCP and UDP only, so the XDP program cannot
//! ask conntrack about a ping. It asks us instead: an echo packet that finds
//! no current copy of its entry in `fp_ct_icmp` is punted and its tuple
//! posted on `fp_ct_icmp_req`. Here each such tuple is looked up with a
//! ctnetlink GET (either direction's tuple finds the entry), and the entry
//! is judged as bpf/lib/ct.h judges a TCP or UDP one: confirmed, reply
//! seen, not dying, no helper or expectation, the direction's mark bits,
//! and the NAT `nf_nat_packet()` would do for each direction. Both
//! directions' keys are written with the verdict and the time of the GET;
//! the data path trusts a copy for `ct_revalidate_ms` after that time.
//!
//! While packets look at an entry's copies (the data path stamps them
//! `used`; within the last 5 s, or one and a half intervals if longer) it
//! is read again every half revalidation interval, so a live flow's copy
//! never goes stale; after that, once they are stale, it is forgotten. It is read at once when
//! a conntrack event destroys or revokes it, or the ruleset changes (after
//! the marks were cleared), before the generation bump that makes the data
//! path re-check its cached verdicts. A GET that finds the entry gone
//! forgets it. Conntrack never sees the fast-pathed echoes, so an entry
//! whose copies the data path used since the last refresh has its timeout
//! set to the namespace's `nf_conntrack_icmp(v6)_timeout` again, as the
//! kernel's per-packet refresh would (unless it is a fixed timeout).

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use fastpath_bpf::intf::{fp_ct_icmp, fp_flow_key, fp_nat, fp_reason, FP_NAT_DST, FP_NAT_SRC};
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use log::warn;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use crate::ctliberal;
use crate::ctliberal::nla;
use crate::ctwatch::{attrs, be32, put_be32_attr, put_msg, CtCounters, CtMarks, CtTimeouts, NFGENMSG_LEN};
use crate::keepalive::now_coarse_ns;
use crate::maps::{bytes, from_bytes};
use crate::nlraw::{error_code, messages_seq, recv, NLMSG_ERROR, NLM_F_ACK, NLM_F_REQUEST};
use crate::ctnl::*;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

/// Requests answered per round at most (the ring holds fewer anyway).
const REQUESTS_PER_ROUND: usize = 1024;
/// How long the data path trusts a "no entry" copy: long enough that a
/// flood of echoes the kernel never makes an entry for (dropped by the
/// ruleset) costs one GET per tuple and tenth of a second, short enough
/// that an entry made just after our GET (the kernel confirms it as the
/// punted packet leaves, which may be after we looked) is found soon.
const ABSENT_TRUST_MS: u64 = 100;
/// How long after the last packet that looked at an entry's copies (or one
/// and a half revalidation intervals, if longer) we keep them current:
/// echoes that far apart (a monitoring ping every few seconds) stay fast.
const LOOKED_AT_MS: u64 = 5000;
const RECV_BUF: usize = 64 << 10;
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// One direction's tuple of an ICMP echo entry, as conntrack keeps it and
/// as the packets of that direction carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub family: u8,
    /// IPv4 in the first 4 bytes, the rest 0.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Network order.
    pub id: [u8; 2],
    pub ty: u8,
    pub code: u8,
}

impl Tuple {
    fn proto(&self) -> u8 {
        if self.family == AF_INET {
            IPPROTO_ICMP
        } else {
            IPPROTO_ICMPV6
        }
    }

    /// A request the data path posted; None if it is not an echo of the family's ICMP.
    pub fn from_request(q: &ctliberal::Request) -> Option<Tuple> {
        let t = Tuple { family: q.family, src: q.saddr, dst: q.daddr, id: q.dport, ty: q.sport[0], code: q.sport[1] };
        (q.proto == t.proto() && t.code == 0 && is_echo(t.family, t.ty)).then_some(t)
    }

    /// Its fp_ct_icmp key: the flow key of its packets, ingress and flow label 0.
    pub fn key(&self) -> fp_flow_key {
        fp_flow_key {
            family: self.family,
            proto: self.proto(),
            ingress: 0,
            sport: u16::from_ne_bytes([self.ty, self.code]),
            dport: u16::from_ne_bytes(self.id),
            flowlabel: 0,
            saddr: self.src,
            daddr: self.dst,
        }
    }

    /// The nested tuple attribute of type `ty` naming it (a GET or an update).
    pub fn attr(&self, ty: u16) -> Vec<u8> {
        let (id, t, c) = if self.family == AF_INET {
            (CTA_PROTO_ICMP_ID, CTA_PROTO_ICMP_TYPE, CTA_PROTO_ICMP_CODE)
        } else {
            (CTA_PROTO_ICMPV6_ID, CTA_PROTO_ICMPV6_TYPE, CTA_PROTO_ICMPV6_CODE)
        };
        let mut proto = Vec::with_capacity(32);
        nla(&mut proto, CTA_PROTO_NUM, &[self.proto()]);
        nla(&mut proto, id, &self.id);
        nla(&mut proto, t, &[self.ty]);
        nla(&mut proto, c, &[self.code]);
        ctliberal::tuple_nest(ty, self.family, &self.src, &self.dst, &proto)
    }

    /// A tuple attribute's payload, of an entry of `family`; None unless an ICMP echo tuple.
    pub fn parse(family: u8, payload: &[u8]) -> Option<Tuple> {
        let mut t = Tuple { family, src: [0; 16], dst: [0; 16], id: [0; 2], ty: 0, code: 0 };
        let (mut proto, mut have) = (None, 0u8);
        for (ty, p) in attrs(payload) {
            match ty {
                CTA_TUPLE_IP => {
                    for (a, v) in attrs(p) {
                        match (a, v.len()) {
                            (CTA_IP_V4_SRC, 4) if family == AF_INET => t.src[..4].copy_from_slice(v),
                            (CTA_IP_V4_DST, 4) if family == AF_INET => t.dst[..4].copy_from_slice(v),
                            (CTA_IP_V6_SRC, 16) if family == AF_INET6 => t.src.copy_from_slice(v),
                            (CTA_IP_V6_DST, 16) if family == AF_INET6 => t.dst.copy_from_slice(v),
                            _ => continue,
                        }
                        have |= 1;
                    }
                }
                CTA_TUPLE_PROTO => {
                    for (a, v) in attrs(p) {
                        match a {
                            CTA_PROTO_NUM => proto = v.first().copied(),
                            CTA_PROTO_ICMP_ID | CTA_PROTO_ICMPV6_ID if v.len() >= 2 => {
                                t.id = [v[0], v[1]];
                                have |= 2;
                            }
                            CTA_PROTO_ICMP_TYPE | CTA_PROTO_ICMPV6_TYPE => {
                                t.ty = *v.first()?;
                                have |= 4;
                            }
                            CTA_PROTO_ICMP_CODE | CTA_PROTO_ICMPV6_CODE => t.code = *v.first()?,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        (proto == Some(t.proto()) && have == 7 && is_echo(family, t.ty)).then_some(t)
    }
}

fn is_echo(family: u8, ty: u8) -> bool {
    match family {
        AF_INET => ty == 8 || ty == 0,
        AF_INET6 => ty == 128 || ty == 129,
        _ => false,
    }
}

/// What a GET says about an ICMP echo entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub orig: Tuple,
    pub reply: Tuple,
    pub status: u32,
    pub mark: u32,
    /// A helper (CTA_HELP), a master (an expected flow) or a zone other than 0.
    pub foreign: bool,
}

impl Entry {
    /// A ctnetlink conntrack message's attributes (after the nfgenmsg) for `family`.
    pub fn parse(family: u8, a: &[u8]) -> Option<Entry> {
        let (mut orig, mut reply, mut status) = (None, None, None);
        let (mut mark, mut foreign) = (0, false);
        for (ty, p) in attrs(a) {
            match ty {
                CTA_TUPLE_ORIG => orig = Tuple::parse(family, p),
                CTA_TUPLE_REPLY => reply = Tuple::parse(family, p),
                CTA_STATUS => status = be32(p),
                CTA_MARK => mark = be32(p).unwrap_or(0),
                CTA_HELP | CTA_TUPLE_MASTER => foreign = true,
                CTA_ZONE => foreign |= p.get(..2).is_some_and(|z| z != [0, 0]),
                _ => {}
            }
        }
        Some(Entry { orig: orig?, reply: reply?, status: status?, mark, foreign })
    }

    /// Why packets of direction `reply` stay with the kernel, or FP_R_FORWARDED.
    pub fn reason(&self, reply: bool, marks: CtMarks) -> fp_reason {
        let s = self.status;
        if self.foreign || s & (IPS_EXPECTED | IPS_HELPER | IPS_SEQ_ADJUST | IPS_OFFLOAD | IPS_HW_OFFLOAD) != 0 {
            return fp_reason::FP_R_CT_UNSUPPORTED;
        }
        if s & IPS_CONFIRMED == 0 || s & IPS_DYING != 0 || s & IPS_SEEN_REPLY == 0 {
            return fp_reason::FP_R_CT_NOT_ESTABLISHED;
        }
        let want = if reply { marks.reply } else { marks.orig };
        if self.mark & want != want {
            return fp_reason::FP_R_CT_UNMARKED;
        }
        fp_reason::FP_R_FORWARDED
    }

    /// What a packet of direction `reply` becomes, as nf_nat_packet()
    /// decides: the other direction's tuple reversed, the id as that tuple
    /// has it (both manips set it: icmp_manip_pkt), flags as in ct.h's
    /// fp_nat_from_ct().
    pub fn nat(&self, reply: bool) -> fp_nat {
        let (snat, dnat) = (self.status & IPS_SRC_NAT != 0, self.status & IPS_DST_NAT != 0);
        let (src_manip, dst_manip) = if reply { (dnat, snat) } else { (snat, dnat) };
        let other = if reply { &self.orig } else { &self.reply };
        let id = u16::from_ne_bytes(other.id);
        fp_nat {
            saddr: other.dst,
            daddr: other.src,
            sport: id,
            dport: id,
            flags: (u32::from(src_manip) * FP_NAT_SRC) | (u32::from(dst_manip) * FP_NAT_DST),
        }
    }

    /// Both directions' fp_ct_icmp keys and values, read at `checked`.
    pub fn copies(&self, marks: CtMarks, checked: u64) -> [(fp_flow_key, fp_ct_icmp); 2] {
        [false, true].map(|reply| {
            let t = if reply { &self.reply } else { &self.orig };
            let v = fp_ct_icmp {
                checked,
                used: 0,
                reason: self.reason(reply, marks) as u32,
                _pad: 0,
                nat: self.nat(reply),
            };
            (t.key(), v)
        })
    }
}

/// What a GET found.
enum Found {
    Entry(Entry),
    Gone,
}

struct Tracked {
    reply: Tuple,
    /// The latest `used` either copy had when we last refreshed the timeout.
    refreshed: u64,
    fixed_timeout: bool,
    /// When the copies were last written (the data path trusts them for an interval).
    read_at: u64,
    /// When the data path last asked for the entry (a packet found no
    /// current copy: it looked, though `used` cannot say so).
    asked_at: u64,
}

/// The copies, their tracking, and the socket that reads them.
pub struct Mirror {
    sock: Socket,
    map: MapHandle,
    ring: ctliberal::Ring,
    capacity: usize,
    seq: u32,
    buf: Vec<u8>,
    /// Tracked entries by original tuple.
    tracked: HashMap<Tuple, Tracked>,
    /// Either direction's tuple of a tracked entry -> its original tuple.
    by_key: HashMap<Tuple, Tuple>,
    /// Tuples written as "no entry" (FP_R_CT_NEW), with when.
    absent: HashMap<Tuple, u64>,
    next_poll_ns: u64,
    /// The data path's effective ct_revalidate_ms, as of the last round.
    revalidate_ms: u32,
    /// A current copy that let packets through was deleted or no longer
    /// does the same (a change found by a read, not by an event): verdicts
    /// cached from it must be re-checked (a generation bump).
    revoked: bool,
}

impl Mirror {
    /// Empties `map` (a restart may adopt an old run's copies, which no one
    /// would read again) and opens the request ring.
    pub fn open(map: MapHandle, ring: MapHandle) -> anyhow::Result<Mirror> {
        use anyhow::Context;
        let ring = ctliberal::Ring::open(ring).context("opening the data path's ICMP request ring (fp_ct_icmp_req)")?;
        let capacity = map.info().map(|i| i.info.max_entries as usize).unwrap_or(0);
        let old: Vec<Vec<u8>> = map.keys().collect();
        for k in old {
            let _ = map.delete(&k);
        }
        let mut sock = Socket::new(NETLINK_NETFILTER).context("opening a ctnetlink socket for ICMP entries")?;
        sock.bind_auto().context("binding the ctnetlink socket for ICMP entries")?;
        crate::ctwatch::set_recv_timeout(&sock, REPLY_TIMEOUT).context("setting its receive timeout")?;
        Ok(Mirror {
            sock,
            map,
            ring,
            capacity,
            seq: 0,
            buf: vec![0; RECV_BUF],
            tracked: HashMap::new(),
            by_key: HashMap::new(),
            absent: HashMap::new(),
            next_poll_ns: 0,
            revalidate_ms: 0,
            revoked: false,
        })
    }

    /// How many entries fit (two keys each).
    pub fn capacity(&self) -> usize {
        self.capacity / 2
    }

    /// Readable when the data path asked for something.
    pub fn fd(&self) -> RawFd {
        self.ring.fd()
    }

    /// How long the loop may sleep before the next read of the tracked entries.
    pub fn until_poll(&self) -> Option<Duration> {
        if self.tracked.is_empty() && self.absent.is_empty() {
            return None;
        }
        Some(Duration::from_nanos(self.next_poll_ns.saturating_sub(now_coarse_ns())))
    }

    /// One round. `touched`: ICMP entries conntrack events named (original
    /// tuple attribute payload, family, destroyed); `all`: read every
    /// tracked entry now (ruleset change, lost events, new marks).
    /// `revalidate_ms`: the data path's effective interval. True if the
    /// round took a forwarding verdict away that no event announced: the
    /// caller bumps the generation.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        touched: &[(u8, Vec<u8>, bool)],
        all: bool,
        marks: CtMarks,
        timeouts: CtTimeouts,
        revalidate_ms: u32,
        counters: &mut CtCounters,
    ) -> bool {
        let reqs = match self.ring.take() {
            Ok(r) => r,
            Err(e) => {
                warn!("reading the data path's ICMP requests: {e}");
                Vec::new()
            }
        };
        counters.icmp_requests += reqs.len() as u64;
        self.revalidate_ms = revalidate_ms;
        if revalidate_ms == 0 {
            // The data path trusts no copy: nothing to keep.
            self.forget_all();
            counters.icmp_tracked = 0;
            return std::mem::take(&mut self.revoked);
        }
        let mut check: HashSet<Tuple> = HashSet::new();
        for (family, tuple, destroyed) in touched {
            let Some(t) = Tuple::parse(*family, tuple) else { continue };
            let Some(orig) = self.by_key.get(&t).copied() else { continue };
            if *destroyed {
                self.forget(&orig);
            } else {
                check.insert(orig);
            }
        }
        let now = now_coarse_ns();
        let period = u64::from(revalidate_ms).saturating_mul(500_000).max(10_000_000);
        if all || now >= self.next_poll_ns {
            self.next_poll_ns = now + period;
            // Read again what packets looked at lately (a flow cache hit
            // consults the copy once per interval, when its verdict is due);
            // forget the rest once their copies are stale, which the data
            // path treats as no copy anyway: a burst of one-off echoes (a
            // scan, random ids) then holds its room and costs GETs for a
            // few seconds, not for the 30 s conntrack keeps the entries.
            let interval = u64::from(revalidate_ms) * 1_000_000;
            let recent = (interval + interval / 2).max(LOOKED_AT_MS * 1_000_000);
            let entries: Vec<(Tuple, Tuple, u64, u64)> =
                self.tracked.iter().map(|(o, t)| (*o, t.reply, t.read_at, t.asked_at)).collect();
            for (orig, reply, read_at, asked_at) in entries {
                let looked = self.used(&orig).max(self.used(&reply)).max(asked_at);
                if now.saturating_sub(looked) < recent {
                    check.insert(orig);
                } else if all || now.saturating_sub(read_at) >= interval {
                    // After a ruleset change or lost events a copy still
                    // current must not stand either.
                    self.forget(&orig);
                }
            }
            let stale = ABSENT_TRUST_MS * 1_000_000;
            let gone: Vec<Tuple> = self.absent.iter().filter(|(_, &at)| now.saturating_sub(at) >= stale).map(|(t, _)| *t).collect();
            for t in gone {
                self.absent.remove(&t);
                let _ = self.map.delete(bytes(&t.key()));
            }
        }
        let mut asked: Vec<Tuple> = Vec::new();
        let mut seen: HashSet<Tuple> = HashSet::new();
        for q in reqs.iter().filter_map(Tuple::from_request).take(REQUESTS_PER_ROUND) {
            if !seen.insert(q) {
                continue;
            }
            match self.by_key.get(&q).copied() {
                Some(orig) => {
                    if let Some(tr) = self.tracked.get_mut(&orig) {
                        tr.asked_at = now;
                    }
                    check.insert(orig);
                }
                None => asked.push(q),
            }
        }
        for orig in check {
            self.read(orig, false, marks, timeouts, counters);
        }
        for q in asked {
            if !self.by_key.contains_key(&q) {
                self.read(q, true, marks, timeouts, counters);
            }
        }
        counters.icmp_tracked = self.tracked.len() as u64;
        std::mem::take(&mut self.revoked)
    }

    /// Looks `t` up and writes what conntrack says. `asked`: the data path
    /// posted `t` (either direction); else `t` is a tracked original tuple.
    fn read(&mut self, t: Tuple, asked: bool, marks: CtMarks, timeouts: CtTimeouts, counters: &mut CtCounters) {
        let checked = now_coarse_ns();
        let found = match self.get(&t) {
            Ok(f) => f,
            Err(e) => {
                // Copies age out meanwhile; the next round tries again.
                counters.icmp_errors += 1;
                warn!("looking up an ICMP conntrack entry: {e}");
                return;
            }
        };
        let e = match found {
            Found::Gone => {
                if asked {
                    self.write_absent(t, checked, counters);
                } else {
                    self.forget(&t);
                }
                return;
            }
            Found::Entry(e) => e,
        };
        if !asked && e.orig != t {
            // The tuple names another entry now: this one is gone.
            self.forget(&t);
        }
        if !self.tracked.contains_key(&e.orig) && (self.tracked.len() + 1) * 2 + self.absent.len() > self.capacity {
            counters.icmp_full += 1;
            return;
        }
        let old = [self.copy(&e.orig), self.copy(&e.reply)];
        let used = old.iter().flatten().map(|c| c.used).max().unwrap_or(0);
        let mut ok = true;
        for ((k, mut v), was) in e.copies(marks, checked).into_iter().zip(old) {
            v.used = used;
            if was.is_some_and(|w| self.current_forwarding(&w) && (v.reason != w.reason || bytes(&v.nat) != bytes(&w.nat))) {
                self.revoked = true;
            }
            ok &= self.map.update(bytes(&k), bytes(&v), MapFlags::ANY).is_ok();
        }
        for side in [&e.orig, &e.reply] {
            self.absent.remove(side);
        }
        if !ok {
            counters.icmp_full += 1;
            self.forget(&e.orig);
            return;
        }
        let fixed_timeout = e.status & IPS_FIXED_TIMEOUT != 0;
        let tr = self.tracked.entry(e.orig).or_insert(Tracked {
            reply: e.reply,
            refreshed: used,
            fixed_timeout,
            read_at: checked,
            asked_at: 0,
        });
        tr.reply = e.reply;
        tr.fixed_timeout = fixed_timeout;
        tr.read_at = checked;
        if asked {
            tr.asked_at = checked;
        }
        self.by_key.insert(e.orig, e.orig);
        self.by_key.insert(e.reply, e.orig);
        let forwarded = e.reason(false, marks) == fp_reason::FP_R_FORWARDED || e.reason(true, marks) == fp_reason::FP_R_FORWARDED;
        if used > tr.refreshed && forwarded && !fixed_timeout {
            tr.refreshed = used;
            let secs = if e.orig.family == AF_INET { timeouts.icmp } else { timeouts.icmpv6 };
            match self.refresh(&e.orig, secs) {
                Ok(()) => counters.icmp_refreshes += 1,
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => self.forget(&e.orig),
                Err(err) => {
                    counters.icmp_errors += 1;
                    warn!("refreshing an ICMP conntrack entry's timeout: {err}");
                }
            }
        }
    }

    fn copy(&self, t: &Tuple) -> Option<fp_ct_icmp> {
        match self.map.lookup(bytes(&t.key()), MapFlags::ANY) {
            Ok(Some(b)) => Some(from_bytes::<fp_ct_icmp>(&b)),
            _ => None,
        }
    }

    /// The `used` stamp the data path left on `t`'s copy (0: none).
    fn used(&self, t: &Tuple) -> u64 {
        self.copy(t).map_or(0, |c| c.used)
    }

    /// Whether the data path would still let packets through on `c`.
    fn current_forwarding(&self, c: &fp_ct_icmp) -> bool {
        c.reason == fp_reason::FP_R_FORWARDED as u32
            && now_coarse_ns().saturating_sub(c.checked) < u64::from(self.revalidate_ms) * 1_000_000
    }

    fn write_absent(&mut self, t: Tuple, checked: u64, counters: &mut CtCounters) {
        if !self.absent.contains_key(&t) && self.tracked.len() * 2 + self.absent.len() + 1 > self.capacity {
            counters.icmp_full += 1;
            return;
        }
        // Dated back so that the data path's interval ends ABSENT_TRUST_MS from now.
        let back = u64::from(self.revalidate_ms).saturating_sub(ABSENT_TRUST_MS) * 1_000_000;
        let v = fp_ct_icmp {
            checked: checked.saturating_sub(back),
            used: 0,
            reason: fp_reason::FP_R_CT_NEW as u32,
            _pad: 0,
            nat: fp_nat::default(),
        };
        if self.map.update(bytes(&t.key()), bytes(&v), MapFlags::ANY).is_ok() {
            self.absent.insert(t, checked);
        } else {
            counters.icmp_full += 1;
        }
    }

    fn forget(&mut self, orig: &Tuple) {
        let Some(tr) = self.tracked.remove(orig) else { return };
        for t in [orig, &tr.reply] {
            self.by_key.remove(t);
            if self.copy(t).is_some_and(|c| self.current_forwarding(&c)) {
                self.revoked = true;
            }
            let _ = self.map.delete(bytes(&t.key()));
        }
    }

    fn forget_all(&mut self) {
        let all: Vec<Tuple> = self.tracked.keys().copied().collect();
        for t in all {
            self.forget(&t);
        }
        for (t, _) in std::mem::take(&mut self.absent) {
            let _ = self.map.delete(bytes(&t.key()));
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// A ctnetlink GET of the entry `t` belongs to (zone 0, as the data path sees).
    fn get(&mut self, t: &Tuple) -> io::Result<Found> {
        let (m, payload) = self.transact(IPCTNL_MSG_CT_GET, NLM_F_REQUEST, t.family, &t.attr(CTA_TUPLE_ORIG), |_, p| {
            p.len() >= NFGENMSG_LEN
        })?;
        if m == NLMSG_ERROR {
            return match error_code(&payload) {
                libc::ENOENT => Ok(Found::Gone),
                0 => Err(io::Error::other("an ack where the entry was expected")),
                e => Err(io::Error::from_raw_os_error(e)),
            };
        }
        match Entry::parse(payload[0], &payload[NFGENMSG_LEN..]) {
            Some(e) => Ok(Found::Entry(e)),
            None => Err(io::Error::other("an ICMP conntrack entry without its tuples")),
        }
    }

    /// Sets the entry's timeout to `secs` from now, as the kernel's refresh does.
    fn refresh(&mut self, orig: &Tuple, secs: u32) -> io::Result<()> {
        let mut a = orig.attr(CTA_TUPLE_ORIG);
        put_be32_attr(&mut a, CTA_TIMEOUT, secs);
        let (_, payload) = self.transact(IPCTNL_MSG_CT_NEW, NLM_F_REQUEST | NLM_F_ACK, orig.family, &a, |m, _| m == NLMSG_ERROR)?;
        match error_code(&payload) {
            0 => Ok(()),
            code => Err(io::Error::from_raw_os_error(code)),
        }
    }

    /// Sends one ctnetlink request and returns the first answer to it
    /// (type, payload) that `wanted` takes or that is an error; answers to
    /// earlier requests (a GET that timed out) are skipped.
    fn transact(
        &mut self,
        msg: u16,
        flags: u16,
        family: u8,
        attrs: &[u8],
        wanted: impl Fn(u16, &[u8]) -> bool,
    ) -> io::Result<(u16, Vec<u8>)> {
        let seq = self.next_seq();
        let mut out = Vec::with_capacity(128);
        put_msg(&mut out, NFNL_SUBSYS_CTNETLINK << 8 | msg, flags, seq, family, attrs);
        self.sock.send(&out, 0)?;
        loop {
            let n = recv(self.sock.as_raw_fd(), &mut self.buf, 0)?;
            let data = &self.buf[..n.min(self.buf.len())];
            for (m, _, msg_seq, payload) in messages_seq(data) {
                if msg_seq == seq && (m == NLMSG_ERROR || wanted(m, payload)) {
                    return Ok((m, payload.to_vec()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKS: CtMarks = CtMarks { orig: 1, reply: 2 };

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut x = [0; 16];
        x[..4].copy_from_slice(&a);
        x
    }

    fn tuple(src: [u8; 4], dst: [u8; 4], id: u16, ty: u8) -> Tuple {
        Tuple { family: AF_INET, src: v4(src), dst: v4(dst), id: id.to_be_bytes(), ty, code: 0 }
    }

    /// A masqueraded ping: 192.0.2.2 -> 198.51.100.2 leaves as 198.51.100.1 with id 7 instead of 4660.
    fn masqueraded(status: u32, mark: u32) -> Entry {
        Entry {
            orig: tuple([192, 0, 2, 2], [198, 51, 100, 2], 0x1234, 8),
            reply: tuple([198, 51, 100, 2], [198, 51, 100, 1], 7, 0),
            status,
            mark,
            foreign: false,
        }
    }

    const EST: u32 = IPS_CONFIRMED | IPS_SEEN_REPLY;

    #[test]
    fn tuple_attr_round_trips_through_the_parser() {
        let t = tuple([192, 0, 2, 2], [198, 51, 100, 2], 0x1234, 8);
        let a = t.attr(CTA_TUPLE_ORIG);
        let (ty, payload) = attrs(&a).next().unwrap();
        assert_eq!(ty, CTA_TUPLE_ORIG);
        assert_eq!(Tuple::parse(AF_INET, payload), Some(t));
        let mut t6 = Tuple { family: AF_INET6, src: [0x20; 16], dst: [0x30; 16], id: [0, 9], ty: 128, code: 0 };
        let a6 = t6.attr(CTA_TUPLE_REPLY);
        let (_, p6) = attrs(&a6).next().unwrap();
        assert_eq!(Tuple::parse(AF_INET6, p6), Some(t6));
        // An ICMP error type is no echo entry.
        t6.ty = 1;
        let a6 = t6.attr(CTA_TUPLE_REPLY);
        assert_eq!(Tuple::parse(AF_INET6, attrs(&a6).next().unwrap().1), None);
    }

    #[test]
    fn key_carries_type_code_and_id_as_on_the_wire() {
        let k = tuple([192, 0, 2, 2], [198, 51, 100, 2], 0x1234, 8).key();
        assert_eq!(k.proto, IPPROTO_ICMP);
        assert_eq!(k.sport.to_ne_bytes(), [8, 0]);
        assert_eq!(k.dport.to_ne_bytes(), [0x12, 0x34]);
        assert_eq!((k.ingress, k.flowlabel), (0, 0));
    }

    #[test]
    fn requests_other_than_echoes_of_the_family_are_ignored() {
        let q = |family, proto, ty| ctliberal::Request {
            family,
            proto,
            sport: [ty, 0],
            dport: [0, 1],
            saddr: [1; 16],
            daddr: [2; 16],
        };
        assert!(Tuple::from_request(&q(AF_INET, IPPROTO_ICMP, 8)).is_some());
        assert!(Tuple::from_request(&q(AF_INET6, IPPROTO_ICMPV6, 129)).is_some());
        assert!(Tuple::from_request(&q(AF_INET6, IPPROTO_ICMP, 8)).is_none());
        assert!(Tuple::from_request(&q(AF_INET, IPPROTO_ICMP, 3)).is_none());
    }

    #[test]
    fn reasons_follow_the_gate() {
        assert_eq!(masqueraded(EST, 3).reason(false, MARKS), fp_reason::FP_R_FORWARDED);
        assert_eq!(masqueraded(EST, 3).reason(true, MARKS), fp_reason::FP_R_FORWARDED);
        // Each direction needs its own bit.
        assert_eq!(masqueraded(EST, 1).reason(false, MARKS), fp_reason::FP_R_FORWARDED);
        assert_eq!(masqueraded(EST, 1).reason(true, MARKS), fp_reason::FP_R_CT_UNMARKED);
        assert_eq!(masqueraded(IPS_CONFIRMED, 3).reason(false, MARKS), fp_reason::FP_R_CT_NOT_ESTABLISHED);
        assert_eq!(masqueraded(EST | IPS_DYING, 3).reason(true, MARKS), fp_reason::FP_R_CT_NOT_ESTABLISHED);
        assert_eq!(masqueraded(EST | IPS_HELPER, 3).reason(false, MARKS), fp_reason::FP_R_CT_UNSUPPORTED);
        let mut zoned = masqueraded(EST, 3);
        zoned.foreign = true;
        assert_eq!(zoned.reason(false, MARKS), fp_reason::FP_R_CT_UNSUPPORTED);
    }

    #[test]
    fn masquerade_rewrites_source_out_and_destination_back() {
        let e = masqueraded(EST | IPS_SRC_NAT, 3);
        let out = e.nat(false);
        assert_eq!(out.flags, FP_NAT_SRC);
        assert_eq!(out.saddr, v4([198, 51, 100, 1]));
        assert_eq!(out.daddr, v4([198, 51, 100, 2]));
        assert_eq!(out.sport.to_ne_bytes(), 7u16.to_be_bytes());
        let back = e.nat(true);
        assert_eq!(back.flags, FP_NAT_DST);
        assert_eq!(back.daddr, v4([192, 0, 2, 2]));
        assert_eq!(back.sport.to_ne_bytes(), 0x1234u16.to_be_bytes());
        // Without NAT no flag is set, whatever the tuples say.
        assert_eq!(masqueraded(EST, 3).nat(false).flags, 0);
    }

    #[test]
    fn dnat_rewrites_destination_in_and_source_back() {
        let e = masqueraded(EST | IPS_DST_NAT, 3);
        assert_eq!(e.nat(false).flags, FP_NAT_DST);
        assert_eq!(e.nat(true).flags, FP_NAT_SRC);
    }

    #[test]
    fn copies_key_each_direction_by_its_own_tuple() {
        let e = masqueraded(EST | IPS_SRC_NAT, 1);
        let [(ko, vo), (kr, vr)] = e.copies(MARKS, 42);
        assert_eq!(ko.sport.to_ne_bytes(), [8, 0]);
        assert_eq!(kr.sport.to_ne_bytes(), [0, 0]);
        assert_eq!(kr.dport.to_ne_bytes(), 7u16.to_be_bytes());
        assert_eq!((vo.checked, vr.checked), (42, 42));
        assert_eq!(vo.reason, fp_reason::FP_R_FORWARDED as u32);
        assert_eq!(vr.reason, fp_reason::FP_R_CT_UNMARKED as u32);
    }

    #[test]
    fn entry_parses_from_a_get_answer() {
        let e = masqueraded(EST | IPS_SRC_NAT, 3);
        let mut a = e.orig.attr(CTA_TUPLE_ORIG);
        a.extend(e.reply.attr(CTA_TUPLE_REPLY));
        put_be32_attr(&mut a, CTA_STATUS, e.status);
        put_be32_attr(&mut a, CTA_MARK, 3);
        assert_eq!(Entry::parse(AF_INET, &a), Some(e));
        // A helper makes it foreign.
        let mut h = a.clone();
        nla(&mut h, CTA_HELP | NLA_F_NESTED, &[]);
        assert!(Entry::parse(AF_INET, &h).unwrap().foreign);
        // A zone other than 0 too; zone 0 does not.
        let mut z = a.clone();
        nla(&mut z, CTA_ZONE, &[0, 0]);
        assert!(!Entry::parse(AF_INET, &z).unwrap().foreign);
        nla(&mut z, CTA_ZONE, &[0, 5]);
        assert!(Entry::parse(AF_INET, &z).unwrap().foreign);
    }
}
