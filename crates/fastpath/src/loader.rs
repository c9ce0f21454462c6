//! Opens the forwarding program's skeleton with the capacities asked for,
//! loads it, and attaches it to interfaces through bpf_links. Dropping an
//! `Attachment` closes its link, which detaches the program: nothing is
//! pinned, so nothing outlives the daemon.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};
use fastpath_bpf::skel::xdp_fwd::{XdpFwdSkel, XdpFwdSkelBuilder};
use fastpath_core::tables::Capacities;
use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, PrintLevel};

use crate::links::{self, XdpAttach};
use crate::preflight::Iface;
use crate::XdpMode;

/// libbpf's own messages go through `log` like everything else.
pub fn bridge_libbpf_log() {
    fn print(level: PrintLevel, msg: String) {
        let msg = msg.trim_end();
        match level {
            PrintLevel::Warn => log::warn!(target: "libbpf", "{msg}"),
            PrintLevel::Info => log::info!(target: "libbpf", "{msg}"),
            PrintLevel::Debug => log::debug!(target: "libbpf", "{msg}"),
        }
    }
    let level = if log::log_enabled!(target: "libbpf", log::Level::Debug) { PrintLevel::Debug } else { PrintLevel::Info };
    libbpf_rs::set_print(Some((level, print)));
}

/// Opens and loads the program with every table sized from `caps`.
pub fn load<'obj>(storage: &'obj mut MaybeUninit<OpenObject>, caps: &Capacities) -> Result<XdpFwdSkel<'obj>> {
    let mut open = XdpFwdSkelBuilder::default().open(storage).context("opening the XDP program")?;
    let sizes = [
        (&mut open.maps.fp_fib4, caps.fib4, "fp_fib4"),
        // Its entries are a subset of fib4's /32s plus our own addresses;
        // the reconciler falls back to src_lpm when they do not fit.
        (&mut open.maps.fp_src_deny4, caps.fib4, "fp_src_deny4"),
        (&mut open.maps.fp_fib6, caps.fib6, "fp_fib6"),
        (&mut open.maps.fp_nexthops, caps.nexthops, "fp_nexthops"),
        // One map per family, each big enough for every neighbour: the
        // reconciler counts both families against caps.neigh together.
        (&mut open.maps.fp_neigh4, caps.neigh, "fp_neigh4"),
        (&mut open.maps.fp_neigh6, caps.neigh, "fp_neigh6"),
    ];
    for (map, n, name) in sizes {
        if n == 0 {
            bail!("{name}: capacity must be at least 1");
        }
        map.set_max_entries(n).with_context(|| format!("sizing {name} to {n} entries"))?;
    }
    let skel = open.load().context("loading the XDP program (see libbpf messages above)")?;
    Ok(skel)
}

/// One interface the program is attached to.
pub struct Attachment {
    pub ifindex: u32,
    pub name: String,
    /// What the kernel actually did (native or generic).
    pub mode: XdpAttach,
    link: OwnedFd,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // Debug only: a refused start must print nothing but its one error line.
        log::debug!("detaching XDP from {} (link fd {})", self.name, self.link.as_raw_fd());
    }
}

/// Attaches `prog` to every interface, or to none: on any failure the links
/// made so far are dropped (detached) before the error is returned.
pub fn attach_all(prog: &libbpf_rs::ProgramMut<'_>, ifaces: &[Iface], mode: XdpMode) -> Result<Vec<Attachment>> {
    let flags = match mode {
        XdpMode::Auto => 0,
        XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
        XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
    };
    let prog_fd = prog.as_fd().as_raw_fd();
    let mut done: Vec<Attachment> = Vec::new();
    for i in ifaces {
        let link = link_xdp(prog_fd, i.ifindex, flags).map_err(|e| {
            let why = match (e.raw_os_error(), mode) {
                (Some(libc::EOPNOTSUPP), XdpMode::Native) => {
                    "the driver has no native XDP (use --xdp-mode auto or generic)".to_string()
                }
                (Some(libc::EBUSY) | Some(libc::EEXIST), _) => "another XDP program got attached meanwhile".to_string(),
                _ => e.to_string(),
            };
            anyhow::anyhow!("attaching XDP to {}: {why}", i.name)
        })?;
        done.push(Attachment { ifindex: i.ifindex, name: i.name.clone(), mode: XdpAttach::None, link });
    }

    let facts = links::dump().context("querying XDP attach mode")?;
    for a in &mut done {
        a.mode = facts.iter().find(|f| f.ifindex == a.ifindex).map(|f| f.xdp).unwrap_or(XdpAttach::None);
        match (a.mode, mode) {
            (XdpAttach::Generic, XdpMode::Auto) => {
                log::warn!("{}: driver has no native XDP, running in generic mode (much slower)", a.name)
            }
            (XdpAttach::None, _) => bail!("{}: XDP link created but the kernel reports no program attached", a.name),
            _ => log::info!("{}: XDP attached in {} mode", a.name, a.mode.name()),
        }
    }
    Ok(done)
}

/// bpf_link_create(BPF_XDP) with explicit mode flags, which
/// `Program::attach_xdp` does not take.
fn link_xdp(prog_fd: i32, ifindex: u32, flags: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: an all-zero bpf_link_create_opts is the documented "no options"
    // value (null pointers, zero counts); we then set its size and flags.
    let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.flags = flags;
    // SAFETY: plain syscall wrapper; opts lives across the call.
    let fd = unsafe { libbpf_sys::bpf_link_create(prog_fd, ifindex as i32, libbpf_sys::BPF_XDP, &opts) };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: libbpf returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
