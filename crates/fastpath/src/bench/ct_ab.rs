//! `fastpath bench stateful --ab`: where fastpath-stateful's TCP connection
//! rate goes, measured in the same run as the rows it is compared with.
//! Each variant runs only the connection-rate part, so the kernel's and the
//! daemon's per-connection work (conntrack events, liberal-window updates)
//! can be told apart from the data path's:
//!
//! - `kernel`: kernel-ct once more, for the drift since its main row;
//! - `kernel-listener`: kernel-ct with a bare ctnetlink listener on the
//!   update and destroy groups, as the daemon subscribes, reading and
//!   discarding: what event generation alone costs the kernel;
//! - `full`, `no-liberal`, `no-events`: the daemon with `--ct-ab` (its
//!   hidden A/B switch) leaving out nothing, the liberal updates, or the
//!   conntrack event subscription;
//! - `xdp-pass`: kernel-ct with an XDP program that passes every frame on
//!   both router ports (bpf/bench/xdp_pass.bpf.c): the floor of any XDP
//!   router here (with `--crr-ingress skbs` including veth's copy of each
//!   locally built skb for XDP, see wire.rs);
//! - `no-cache`: the daemon with the flow cache off (`--flow-timeout 0`):
//!   every packet pays a conntrack and a FIB lookup, as ct-ref's do, but no
//!   new connection fills (or first reads) a flow-cache line;
//! - `small-cache`: the daemon with a flow cache of 1024 entries per CPU
//!   (`--flow-entries 1024`, 80 KB: a few pages, where the default's lines
//!   are spread over megabytes): whether `no-cache`'s gain is the lines'
//!   and pages' footprint or the cache's code;
//! - `eager-liberal`: the daemon making every marked TCP entry liberal as
//!   its mark event arrives (before: one update per connection) instead of
//!   when the data path asks (`full`). Only differs from `full` with
//!   `--strict-tcp`: a liberal netns needs no update at all.

use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fastpath_bpf::skel::xdp_pass::{XdpPassSkel, XdpPassSkelBuilder};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, OpenObject};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use super::topo::{self, Topology};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// kernel-ct again, for the drift between the main rows and these.
    Kernel,
    KernelListener,
    XdpPass,
    Full,
    NoLiberal,
    NoEvents,
    EagerLiberal,
    NoCache,
    SmallCache,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Kernel => "kernel",
            Variant::KernelListener => "kernel-listener",
            Variant::XdpPass => "xdp-pass",
            Variant::Full => "full",
            Variant::NoLiberal => "no-liberal",
            Variant::NoEvents => "no-events",
            Variant::EagerLiberal => "eager-liberal",
            Variant::NoCache => "no-cache",
            Variant::SmallCache => "small-cache",
        }
    }

    /// What the variant adds to the daemon's arguments; None: no daemon (kernel-ct).
    pub fn daemon_args(self) -> Option<&'static [&'static str]> {
        match self {
            Variant::Kernel | Variant::KernelListener | Variant::XdpPass => None,
            Variant::Full => Some(&["--ct-ab", "full"]),
            Variant::NoLiberal => Some(&["--ct-ab", "no-liberal"]),
            Variant::NoEvents => Some(&["--ct-ab", "no-events"]),
            Variant::EagerLiberal => Some(&["--ct-ab", "eager-liberal"]),
            Variant::NoCache => Some(&["--flow-timeout", "0"]),
            Variant::SmallCache => Some(&["--flow-entries", "1024"]),
        }
    }
}

const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;

/// A ctnetlink listener in the router namespace that reads and drops every
/// event, on a thread of its own (not pinned: the daemon is not either).
pub struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Listener {
    pub fn start(t: &Topology) -> Result<Listener> {
        let s = topo::in_netns(&t.router, || -> std::io::Result<Socket> {
            let mut s = Socket::new(NETLINK_NETFILTER)?;
            s.bind_auto()?;
            s.add_membership(NFNLGRP_CONNTRACK_UPDATE)?;
            s.add_membership(NFNLGRP_CONNTRACK_DESTROY)?;
            Ok(s)
        })?
        .context("subscribing a ctnetlink listener in the router")?;
        s.set_rx_buf_sz(8 << 20).context("sizing the listener's buffer")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 << 10];
            let mut n = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let mut pfd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
                    continue;
                }
                // SAFETY: buf is valid for its length.
                let r = unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
                if r > 0 {
                    n += 1;
                }
            }
            n
        });
        Ok(Listener { stop, thread: Some(thread) })
    }

    /// Stops the thread; the number of datagrams it read.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `xdp-pass` variant's programs, attached to both router ports until dropped.
pub struct PassAll<'obj> {
    _links: Vec<Link>,
    _skel: XdpPassSkel<'obj>,
}

impl<'obj> PassAll<'obj> {
    pub fn attach(storage: &'obj mut MaybeUninit<OpenObject>, t: &Topology) -> Result<Self> {
        let open = XdpPassSkelBuilder::default().open(storage).context("opening xdp_pass.bpf.o")?;
        let skel = open.load().context("loading xdp_pass.bpf.o")?;
        let mut links = Vec::new();
        for dev in [topo::R0, topo::R1] {
            let ifindex = t.ifindex(&t.router, dev)?;
            let link = topo::in_netns(&t.router, || skel.progs.fp_bench_xdp_pass.attach_xdp(ifindex as i32))?
                .with_context(|| format!("attaching xdp_pass to {dev}"))?;
            links.push(link);
        }
        Ok(PassAll { _links: links, _skel: skel })
    }
}

/// Seconds of CPU per thousand connections, for the table.
pub fn cpu_ms_per_conn(cpu: Option<Duration>, conns: u64) -> Option<f64> {
    cpu.filter(|_| conns > 0).map(|c| c.as_secs_f64() * 1e3 / conns as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_map_to_daemon_switches() {
        assert_eq!(Variant::KernelListener.daemon_args(), None);
        assert_eq!(Variant::NoEvents.daemon_args(), Some(&["--ct-ab", "no-events"][..]));
        assert_eq!(Variant::EagerLiberal.daemon_args(), Some(&["--ct-ab", "eager-liberal"][..]));
        assert_eq!(Variant::NoCache.daemon_args(), Some(&["--flow-timeout", "0"][..]));
        assert_eq!(Variant::SmallCache.daemon_args(), Some(&["--flow-entries", "1024"][..]));
        assert_eq!(cpu_ms_per_conn(Some(Duration::from_secs(1)), 1000), Some(1.0));
        assert_eq!(cpu_ms_per_conn(Some(Duration::from_secs(1)), 0), None);
    }
}
