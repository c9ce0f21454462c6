//! When the kernel announced one prefix: `bench table1` times forwarding
//! and outage from the last route's netlink message, and for routes that
//! come by BGP only the router's own route notifications tell that moment
//! (zebra installs in its own order, some time after the UPDATE).
//!
//! A thread in the router namespace listens on the IPv4 route group and
//! stamps the first RTM_NEWROUTE for the prefix; the kernel sends the
//! notification as it commits the route, the same instant an `ip` batch
//! gets its acknowledgement.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};

use super::topo::{self, Topology};

const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTM_NEWROUTE: u16 = 24;
const NLMSG_HDRLEN: usize = 16;
const RTMSG_LEN: usize = 12;
const RTA_DST: u16 = 1;

pub struct RouteWatch {
    stop: Arc<AtomicBool>,
    seen_us: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RouteWatch {
    /// Starts watching for `dst`/`len`; `now_us` is the bench's wall clock.
    pub fn start(t: &Topology, dst: [u8; 4], len: u8, now_us: fn() -> u64) -> Result<RouteWatch> {
        let s = topo::in_netns(&t.router, || -> std::io::Result<Socket> {
            let mut s = Socket::new(NETLINK_ROUTE)?;
            s.bind_auto()?;
            s.add_membership(RTNLGRP_IPV4_ROUTE)?;
            Ok(s)
        })?
        .context("subscribing to the router's IPv4 route notifications")?;
        // 10k routes arrive in a burst: a drop would lose the moment.
        s.set_rx_buf_sz(16 << 20).context("sizing the route watch buffer")?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen_us = Arc::new(AtomicU64::new(0));
        let (flag, seen) = (Arc::clone(&stop), Arc::clone(&seen_us));
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            while !flag.load(Ordering::Relaxed) && seen.load(Ordering::Relaxed) == 0 {
                let mut pfd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
                    continue;
                }
                // SAFETY: buf is valid for its length.
                let r = unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
                let at = now_us();
                if r > 0 && announces(&buf[..r as usize], dst, len) {
                    seen.store(at, Ordering::Relaxed);
                }
            }
        });
        Ok(RouteWatch { stop, seen_us, thread: Some(thread) })
    }

    /// The wall-clock µs of the prefix's first RTM_NEWROUTE, if it came.
    pub fn seen_us(&self) -> Option<u64> {
        Some(self.seen_us.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }
}

impl Drop for RouteWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether a datagram of route notifications holds an RTM_NEWROUTE for `dst`/`len`.
fn announces(mut b: &[u8], dst: [u8; 4], len: u8) -> bool {
    while b.len() >= NLMSG_HDRLEN {
        let n = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if n < NLMSG_HDRLEN || n > b.len() {
            return false;
        }
        let ty = u16::from_ne_bytes([b[4], b[5]]);
        if ty == RTM_NEWROUTE && route_is(&b[NLMSG_HDRLEN..n], dst, len) {
            return true;
        }
        b = &b[n.next_multiple_of(4).min(b.len())..];
    }
    false
}

/// struct rtmsg, then attributes: family AF_INET, dst_len `len`, RTA_DST `dst`.
fn route_is(p: &[u8], dst: [u8; 4], len: u8) -> bool {
    if p.len() < RTMSG_LEN || p[0] != libc::AF_INET as u8 || p[1] != len {
        return false;
    }
    let mut a = &p[RTMSG_LEN..];
    while a.len() >= 4 {
        let n = usize::from(u16::from_ne_bytes([a[0], a[1]]));
        if n < 4 || n > a.len() {
            return false;
        }
        if u16::from_ne_bytes([a[2], a[3]]) == RTA_DST {
            return a[4..n] == dst;
        }
        a = &a[n.next_multiple_of(4).min(a.len())..];
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, family: u8, len: u8, dst: [u8; 4]) -> Vec<u8> {
        let mut attrs = vec![8, 0, RTA_DST as u8, 0];
        attrs.extend_from_slice(&dst);
        // RTA_OIF before and after are skipped.
        let oif = [8u8, 0, 4, 0, 2, 0, 0, 0];
        let mut p = vec![family, len, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0];
        p.extend_from_slice(&oif);
        p.extend_from_slice(&attrs);
        let mut m = ((NLMSG_HDRLEN + p.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&p);
        m
    }

    #[test]
    fn finds_the_prefix_among_others() {
        let want = [10, 39, 15, 0];
        let mut d = msg(RTM_NEWROUTE, libc::AF_INET as u8, 24, [10, 39, 14, 0]);
        assert!(!announces(&d, want, 24));
        d.extend(msg(RTM_NEWROUTE, libc::AF_INET as u8, 24, want));
        assert!(announces(&d, want, 24));
        // Another length, a deletion, or IPv6 is not it.
        assert!(!announces(&msg(RTM_NEWROUTE, libc::AF_INET as u8, 23, want), want, 24));
        assert!(!announces(&msg(RTM_NEWROUTE + 1, libc::AF_INET as u8, 24, want), want, 24));
        assert!(!announces(&msg(RTM_NEWROUTE, libc::AF_INET6 as u8, 24, want), want, 24));
        // A truncated datagram is not read past its end.
        assert!(!announces(&d[..d.len() - 3], want, 24));
    }
}
