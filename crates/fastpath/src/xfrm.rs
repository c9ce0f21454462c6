//! IPsec (xfrm) policies the fast path would bypass.
//!
//! The kernel checks every forwarded packet against the xfrm policies of
//! its family: a `fwd` policy may drop it (`action block`, or templates a
//! packet in clear does not satisfy), an `out` policy encrypts it (or holds
//! it until an SA is negotiated), and the default policy (`ip xfrm policy
//! setdefault`) may block whatever no policy matches. An XDP redirect skips
//! all of that: next to IPsec a fast path would forward in clear what the
//! kernel encrypts or drops. So while a family has any `out` or `fwd`
//! policy, that family is punted (both while a default blocks forwarded or
//! outgoing packets), counted as `policy_routing`, and the kernel decides.
//! `in` policies and socket policies never see forwarded packets.
//!
//! Punting the whole family is coarse (an IPsec gateway loses the fast path
//! for its clear traffic too) but needs no copy of the kernel's selector
//! matching. The policies are dumped at start and again as soon as the
//! kernel reports a policy change (XFRMNLGRP_POLICY).

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use anyhow::{Context, Result};
use log::{info, warn};
use netlink_sys::{protocols::NETLINK_XFRM, Socket, SocketAddr};

use crate::nlraw::{
    error_code, messages, put_header, recv, Events, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, NLM_F_DUMP, NLM_F_MULTI,
    NLM_F_REQUEST,
};
use fastpath_core::model::Family;

const XFRM_MSG_NEWPOLICY: u16 = 19;
const XFRM_MSG_GETPOLICY: u16 = 21;
const XFRM_MSG_GETDEFAULT: u16 = 40;
const XFRMNLGRP_POLICY: u32 = 4;

/// struct xfrm_userpolicy_info: the selector's family, then dir and action.
const POLICY_FAMILY_OFF: usize = 40;
const POLICY_DIR_OFF: usize = 160;
const POLICY_INFO_LEN: usize = 168;
const XFRM_POLICY_OUT: u8 = 1;
const XFRM_POLICY_FWD: u8 = 2;
/// struct xfrm_userpolicy_default { in, fwd, out }.
const XFRM_USERPOLICY_BLOCK: u8 = 1;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// What the policies make the data path punt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Family bits (`Family::bit`) to punt.
    pub families: u32,
    /// One line per reason, for `fastpath status`.
    pub why: Vec<String>,
}

/// Counts of forwarding-path policies and the default policy, as dumped.
#[derive(Debug, Default, PartialEq, Eq)]
struct Policies {
    /// [v4, v6] x [fwd, out].
    counts: [[u32; 2]; 2],
    /// The default policy blocks forwarded / outgoing packets.
    default_blocks: [bool; 2],
}

impl Policies {
    /// One XFRM_MSG_NEWPOLICY payload.
    fn add(&mut self, info: &[u8]) {
        if info.len() < POLICY_INFO_LEN {
            return;
        }
        let family = u16::from_ne_bytes([info[POLICY_FAMILY_OFF], info[POLICY_FAMILY_OFF + 1]]);
        let fam = match family {
            AF_INET => 0,
            AF_INET6 => 1,
            _ => return,
        };
        match info[POLICY_DIR_OFF] {
            XFRM_POLICY_FWD => self.counts[fam][0] += 1,
            XFRM_POLICY_OUT => self.counts[fam][1] += 1,
            _ => {}
        }
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let blocks: Vec<&str> = [("forwarded", self.default_blocks[0]), ("outgoing", self.default_blocks[1])]
            .iter()
            .filter_map(|(w, b)| b.then_some(*w))
            .collect();
        if !blocks.is_empty() {
            f.families = Family::V4.bit() | Family::V6.bit();
            f.why.push(format!(
                "IPsec default policy blocks {} packets (ip xfrm policy setdefault): IPv4 and IPv6 punted",
                blocks.join(" and ")
            ));
        }
        for (i, fam, name) in [(0, Family::V4, "IPv4"), (1, Family::V6, "IPv6")] {
            let [fwd, out] = self.counts[i];
            if fwd + out > 0 {
                f.families |= fam.bit();
                f.why.push(format!(
                    "IPsec (xfrm) policies on the forwarding path ({fwd} fwd, {out} out): {name} punted"
                ));
            }
        }
        f
    }
}

/// Follows the xfrm policies of the daemon's network namespace.
pub struct Watcher {
    /// None: the kernel has no xfrm netlink, so no IPsec policy to bypass.
    socks: Option<Socks>,
    current: Findings,
    /// The last dump failed: dump again at the next poll, event or not.
    retry: bool,
}

struct Socks {
    events: Events,
    req: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Watcher {
    /// Subscribes, then dumps (a change in between is then seen twice,
    /// never missed). An error here means the policies cannot be known:
    /// the daemon does not start.
    pub fn open() -> Result<Self> {
        let events = match Events::open(NETLINK_XFRM, XFRMNLGRP_POLICY, "xfrm policy") {
            Ok(e) => e,
            Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => {
                info!("the kernel has no xfrm netlink (no IPsec): nothing to check");
                return Ok(Watcher { socks: None, current: Findings::default(), retry: false });
            }
            Err(e) => return Err(e).context("subscribing to xfrm policy events"),
        };
        let mut req = Socket::new(NETLINK_XFRM).context("opening an xfrm netlink socket")?;
        req.bind_auto().context("binding the xfrm request socket")?;
        req.connect(&SocketAddr::new(0, 0)).context("connecting the xfrm request socket")?;
        let mut socks = Socks { events, req, seq: 0, buf: vec![0; 64 * 1024] };
        let current = socks.probe().context("dumping the xfrm (IPsec) policies")?.findings();
        Ok(Watcher { socks: Some(socks), current, retry: false })
    }

    /// What must be punted now.
    pub fn findings(&self) -> &Findings {
        &self.current
    }

    /// The event socket, which wakes the daemon's loop (`poll` drains it).
    pub fn wake_fds(&self, out: &mut Vec<RawFd>) {
        out.extend(self.socks.as_ref().map(|s| s.events.fd()));
    }

    /// Takes the pending policy events without blocking; after any (or an
    /// overrun) dumps again. True if what must be punted changed. A failed
    /// dump proves nothing about the policies, so both families are punted
    /// until a dump succeeds (tried again at every poll).
    pub fn poll(&mut self) -> bool {
        let Some(s) = &mut self.socks else {
            return false;
        };
        if !s.events.drain() && !self.retry {
            return false;
        }
        let f = match s.probe() {
            Ok(p) => {
                self.retry = false;
                p.findings()
            }
            Err(e) => {
                if !self.retry {
                    warn!("dumping the xfrm (IPsec) policies: {e}; IPv4 and IPv6 punted until a dump succeeds");
                }
                self.retry = true;
                Findings {
                    families: Family::V4.bit() | Family::V6.bit(),
                    why: vec![format!("cannot read the IPsec (xfrm) policies ({e}): IPv4 and IPv6 punted")],
                }
            }
        };
        let moved = f != self.current;
        self.current = f;
        moved
    }
}

impl Socks {
    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn probe(&mut self) -> io::Result<Policies> {
        let mut p = Policies::default();
        let seq = self.next_seq();
        let mut out = Vec::with_capacity(NLMSG_HDRLEN);
        put_header(&mut out, NLMSG_HDRLEN, XFRM_MSG_GETPOLICY, NLM_F_REQUEST | NLM_F_DUMP, seq);
        self.req.send(&out, 0)?;
        self.read(|ty, payload| {
            if ty == XFRM_MSG_NEWPOLICY {
                p.add(payload);
            }
        })?;
        // struct xfrm_userpolicy_default, ignored in a request but required.
        let seq = self.next_seq();
        out.clear();
        put_header(&mut out, NLMSG_HDRLEN + 4, XFRM_MSG_GETDEFAULT, NLM_F_REQUEST, seq);
        out.extend_from_slice(&[0; 4]);
        self.req.send(&out, 0)?;
        let got = self.read(|ty, payload| {
            if ty == XFRM_MSG_GETDEFAULT && payload.len() >= 3 {
                p.default_blocks = [payload[1] == XFRM_USERPOLICY_BLOCK, payload[2] == XFRM_USERPOLICY_BLOCK];
            }
        });
        match got {
            // Before 5.16 there is no default policy: everything is accepted.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            other => other?,
        }
        Ok(p)
    }

    /// Reads the answer to the request just sent, to its end (one request
    /// at a time on this socket, so nothing else can be in it).
    fn read(&mut self, mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        loop {
            let n = recv(self.req.as_raw_fd(), &mut self.buf, 0)?.min(self.buf.len());
            let mut done = false;
            for (ty, flags, payload) in messages(&self.buf[..n]) {
                match ty {
                    NLMSG_DONE => done = true,
                    NLMSG_ERROR => {
                        let code = error_code(payload);
                        if code != 0 {
                            return Err(io::Error::from_raw_os_error(code));
                        }
                        done = true;
                    }
                    _ => {
                        each(ty, payload);
                        if flags & NLM_F_MULTI == 0 {
                            done = true;
                        }
                    }
                }
            }
            if done {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(family: u16, dir: u8) -> Vec<u8> {
        let mut b = vec![0u8; POLICY_INFO_LEN];
        b[POLICY_FAMILY_OFF..POLICY_FAMILY_OFF + 2].copy_from_slice(&family.to_ne_bytes());
        b[POLICY_DIR_OFF] = dir;
        b
    }

    #[test]
    fn only_fwd_and_out_policies_punt_their_family() {
        let mut p = Policies::default();
        p.add(&policy(AF_INET, 0)); // in: local delivery only
        p.add(&policy(AF_INET6, 3)); // a socket policy
        assert_eq!(p.findings(), Findings::default());
        p.add(&policy(AF_INET, XFRM_POLICY_FWD));
        p.add(&policy(AF_INET, XFRM_POLICY_OUT));
        p.add(&policy(AF_INET, XFRM_POLICY_OUT));
        let f = p.findings();
        assert_eq!(f.families, Family::V4.bit());
        assert_eq!(f.why, ["IPsec (xfrm) policies on the forwarding path (1 fwd, 2 out): IPv4 punted"]);
        p.add(&policy(AF_INET6, XFRM_POLICY_OUT));
        assert_eq!(p.findings().families, Family::V4.bit() | Family::V6.bit());
    }

    #[test]
    fn a_blocking_default_punts_both_families() {
        let p = Policies { default_blocks: [true, false], ..Default::default() };
        let f = p.findings();
        assert_eq!(f.families, Family::V4.bit() | Family::V6.bit());
        assert!(f.why[0].contains("blocks forwarded packets"), "{:?}", f.why);
        let p = Policies { default_blocks: [true, true], ..Default::default() };
        assert!(p.findings().why[0].contains("forwarded and outgoing"));
    }

    #[test]
    fn short_or_foreign_payloads_are_ignored() {
        let mut p = Policies::default();
        p.add(&policy(AF_INET, XFRM_POLICY_FWD)[..POLICY_INFO_LEN - 1]);
        p.add(&policy(7, XFRM_POLICY_FWD));
        assert_eq!(p, Policies::default());
    }
}
