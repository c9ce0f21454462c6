//! Netlink framing shared by the daemon's raw netlink users (ctnetlink,
//! xfrm): the families netlink-packet-route does not cover.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use log::warn;
use netlink_sys::Socket;

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_CREATE: u16 = 0x400;

pub fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends a netlink header for a message of `len` bytes in all.
pub fn put_header(out: &mut Vec<u8>, len: usize, ty: u16, flags: u16, seq: u32) {
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
}

/// The error code of an NLMSG_ERROR payload (0 = an ack), negated as errno.
pub fn error_code(payload: &[u8]) -> i32 {
    payload.get(..4).map(|b| -i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0)
}

/// Netlink messages of one datagram: (type, flags, payload after the header).
pub fn messages(b: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    messages_seq(b).map(|(ty, flags, _, payload)| (ty, flags, payload))
}

/// The same with each message's sequence number: (type, flags, seq, payload).
pub fn messages_seq(mut b: &[u8]) -> impl Iterator<Item = (u16, u16, u32, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(b[0..4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes([b[4], b[5]]);
        let flags = u16::from_ne_bytes([b[6], b[7]]);
        let seq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
        if len < NLMSG_HDRLEN || len > b.len() {
            return None;
        }
        let payload = &b[NLMSG_HDRLEN..len];
        b = &b[align4(len).min(b.len())..];
        Some((ty, flags, seq, payload))
    })
}

pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A non-blocking socket subscribed to one multicast group, read only to
/// learn that something changed (the caller then dumps what it needs).
pub struct Events {
    sock: Socket,
    buf: Vec<u8>,
    what: &'static str,
}

impl Events {
    /// `what` names the events in log lines.
    pub fn open(protocol: isize, group: u32, what: &'static str) -> io::Result<Self> {
        let mut sock = Socket::new(protocol)?;
        sock.bind_auto()?;
        sock.add_membership(group)?;
        sock.set_non_blocking(true)?;
        Ok(Events { sock, buf: vec![0; 64 * 1024], what })
    }

    /// For the daemon's wait: readable until `drain`ed.
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Reads whatever is pending; true if anything came (an overrun counts:
    /// events were lost, so something changed).
    pub fn drain(&mut self) -> bool {
        let mut any = false;
        loop {
            match recv(self.sock.as_raw_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(_) => any = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return any,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => any = true,
                Err(e) => {
                    warn!("reading {} events: {e}", self.what);
                    return any;
                }
            }
        }
    }
}

/// Sleeps until one of `fds` is readable or `timeout` passes (negative fds
/// are skipped); the callers then read without blocking. EINTR just ends
/// the wait early.
pub fn wait_any(fds: &[RawFd], timeout: std::time::Duration) -> Vec<libc::pollfd> {
    let mut p: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: a valid array of pollfds and its length.
    unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    p
}
