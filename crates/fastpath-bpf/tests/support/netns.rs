//! A private network namespace per test thread, with one veth pair in it.
//!
//! BPF_PROG_RUN resolves `ingress_ifindex` and devmap entries in the caller's
//! namespace, so the test needs real devices; a namespace of its own keeps
//! them away from the host and from other tests running in parallel (each
//! libtest thread unshares separately). Teardown: the veth is deleted on
//! drop, and the namespace itself disappears when its last thread leaves it,
//! so nothing outlives the test even when it panics.

use std::ffi::CString;
use std::io;
use std::process::Command;

use anyhow::{bail, Context, Result};

const CLONE_NEWNET: i32 = 0x4000_0000;

extern "C" {
    fn unshare(flags: i32) -> i32;
    fn geteuid() -> u32;
    fn if_nametoindex(name: *const std::os::raw::c_char) -> u32;
}

/// Whether the test may run. Without root it is skipped, except in CI where
/// a skipped root test counts as a failure.
pub fn require_root(test: &str) -> bool {
    if unsafe { geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root (BPF_PROG_RUN, netns); CI=true makes a skip a failure");
    }
    eprintln!("{test}: skipped, needs root (BPF_PROG_RUN, network namespaces)");
    false
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name)?;
    // if_nametoindex asks through a socket, so it sees this thread's namespace.
    let idx = unsafe { if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(io::Error::last_os_error()).with_context(|| format!("ifindex of {name}"));
    }
    Ok(idx)
}

/// Two connected ports of the "router": `a` is the ingress, `b` the egress.
pub struct Lab {
    pub a: u32,
    pub b: u32,
}

impl Lab {
    /// Moves the calling thread into a fresh namespace and creates the veth.
    pub fn new() -> Result<Self> {
        if unsafe { unshare(CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error()).context("unshare(CLONE_NEWNET)");
        }
        ip(&["link", "set", "lo", "up"])?;
        ip(&["link", "add", "fpt-a", "type", "veth", "peer", "name", "fpt-b"])?;
        let lab = Lab { a: ifindex("fpt-a")?, b: ifindex("fpt-b")? };
        ip(&["link", "set", "fpt-a", "up"])?;
        ip(&["link", "set", "fpt-b", "up"])?;
        Ok(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting one end removes the pair; the namespace goes with the thread.
        let _ = ip(&["link", "del", "fpt-a"]);
    }
}

/// A namespace with its veth pair that outlives the thread that made it, so
/// that later test threads can join it (`enter`). It goes away, veth and all,
/// when the process exits and closes the last reference to it.
pub struct Kept {
    pub lab: Lab,
    ns: std::fs::File,
}

impl Kept {
    /// `Lab::new`, keeping a handle on the namespace it made.
    pub fn new() -> Result<Self> {
        let lab = Lab::new()?;
        let ns = std::fs::File::open("/proc/thread-self/ns/net").context("opening the new netns")?;
        Ok(Kept { lab, ns })
    }

    /// Moves the calling thread into the kept namespace.
    pub fn enter(&self) -> Result<()> {
        use std::os::fd::AsRawFd;
        if unsafe { libc::setns(self.ns.as_raw_fd(), CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error()).context("setns into the shared netns");
        }
        Ok(())
    }
}
