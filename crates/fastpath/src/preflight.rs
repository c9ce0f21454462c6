//! Everything `fastpath run` checks before it touches the system. Each
//! failure is one error whose message is the whole story, so the user sees
//! one clean line and nothing was attached or half-applied.

use std::collections::HashSet;
use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{bail, Context, Result};
use fastpath_bpf::intf;

use crate::links::{self, XdpAttach, ARPHRD_ETHER};
use crate::{netfilter, tcpolicy};
use crate::RunArgs;

/// An interface the daemon will manage.
#[derive(Debug, Clone)]
pub struct Iface {
    pub name: String,
    pub ifindex: u32,
    /// fp_stats slot: 1.. in command-line order (0 counts unknown ingress).
    pub slot: u32,
}

/// What the socket path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketState {
    Free,
    /// A file nobody answers on: a crashed daemon left it; safe to replace.
    Stale,
}

pub struct Checked {
    pub ifaces: Vec<Iface>,
    pub socket: SocketState,
    /// What the netfilter probe found (the daemon keeps watching).
    pub netfilter: netfilter::Findings,
    /// What the tc probe found on the managed ports (likewise).
    pub tc: tcpolicy::Findings,
}

pub fn check(args: &RunArgs) -> Result<Checked> {
    crate::config::combinable(args)?;
    if !nix::unistd::geteuid().is_root() {
        bail!("must run as root (loads BPF programs and attaches XDP)");
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!("kernel has no BTF (/sys/kernel/btf/vmlinux missing); fastpath needs CONFIG_DEBUG_INFO_BTF=y");
    }
    let ifaces = check_interfaces(&args.interfaces, &|ifindex, prog| crate::pin::owns_xdp(args, ifindex, prog))?;

    let stateful = args.mode == crate::FwdMode::Stateful;
    let nf = netfilter::probe_mode(stateful);
    if !nf.bypassed.is_empty() {
        if args.allow_netfilter_bypass {
            log::warn!(
                "netfilter rules bypassed by fast-pathed traffic (--allow-netfilter-bypass): {}",
                nf.bypassed.join(", ")
            );
        } else {
            let why = if stateful {
                "the stateful fast path still skips netdev ingress/egress chains, cannot follow iptables-legacy changes, and looks conntrack up in the default zone only"
            } else {
                "fastpath forwards statelessly (--mode stateful follows a conntrack ruleset)"
            };
            bail!(
                "netfilter rules would be bypassed by the fast path: {}; {why}, so remove them or pass --allow-netfilter-bypass if that is intended",
                nf.bypassed.join(", ")
            );
        }
    }
    // Not being able to look is no evidence of no rules: iptables-nft and
    // firewalld program nftables without the nft binary being installed.
    if let Some(why) = &nf.unchecked {
        if args.allow_netfilter_bypass {
            log::warn!("{why}; netfilter rules, if any, are bypassed by fast-pathed traffic");
        } else {
            bail!(
                "{why}: cannot tell whether netfilter rules would be bypassed by the fast path; install nftables, or pass --allow-netfilter-bypass"
            );
        }
    }

    let tc = check_tc(args, &ifaces)?;
    let socket = socket_state(&args.socket)?;
    Ok(Checked { ifaces, socket, netfilter: nf, tc })
}

/// (name, ifindex) of each managed port, as the tc probe takes them.
pub fn tc_ports(ifaces: &[Iface]) -> Vec<(String, u32)> {
    ifaces.iter().map(|i| (i.name.clone(), i.ifindex)).collect()
}

/// tc policy on a managed port only takes that port's direction out of the
/// fast path (the daemon marks it); no way to look stops the start unless
/// --allow-tc-bypass, as for netfilter.
fn check_tc(args: &RunArgs, ifaces: &[Iface]) -> Result<tcpolicy::Findings> {
    let tc = tcpolicy::probe(&tc_ports(ifaces));
    if !tc.bypassed.is_empty() {
        if args.allow_tc_bypass {
            log::warn!("tc policy bypassed by fast-pathed traffic (--allow-tc-bypass): {}", tcpolicy::describe(&tc.bypassed));
        } else {
            log::warn!("tc policy on managed ports, its traffic left to the kernel: {}", tcpolicy::describe(&tc.bypassed));
        }
    }
    if let Some(why) = &tc.unchecked {
        if args.allow_tc_bypass {
            log::warn!("{why}; tc policy, if any, is bypassed by fast-pathed traffic");
        } else {
            bail!("{why}: cannot tell whether tc policy would be bypassed by the fast path; install iproute2, or pass --allow-tc-bypass");
        }
    }
    Ok(tc)
}

/// The interfaces to run on, in order (slots 1..): given once each, known,
/// Ethernet, not a port, and free of XDP unless `xdp_ours` (a running
/// daemon holds them: `check-config` of the file it will reload).
/// `ours(ifindex, prog_id)`: an XDP program already on the interface is
/// fastpath's own (a running daemon's, or pinned by `run --pin`) and will be
/// taken over rather than refused.
pub fn check_interfaces(names: &[String], ours: &dyn Fn(u32, Option<u32>) -> bool) -> Result<Vec<Iface>> {
    if names.is_empty() {
        bail!("no interface given (use -i IFACE, once per interface)");
    }
    let max = intf::FP_MAX_IFACES as usize - 1;
    if names.len() > max {
        bail!("too many interfaces: {} given, at most {max} supported", names.len());
    }
    let mut seen = HashSet::new();
    for name in names {
        if !seen.insert(name.as_str()) {
            bail!("interface {name} given more than once");
        }
    }

    let all = links::dump().context("reading interfaces")?;
    let mut ifaces = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let Some(l) = all.iter().find(|l| &l.name == name) else {
            bail!("unknown interface {name}");
        };
        if l.arphrd != ARPHRD_ETHER {
            bail!("interface {name} does not support XDP forwarding (not an Ethernet device, link type {})", l.arphrd);
        }
        if let Some(m) = l.master {
            let master = all.iter().find(|x| x.ifindex == m).map(|x| x.name.as_str()).unwrap_or("?");
            bail!("interface {name} is a port of {master} (bridge/bond/VRF member); run fastpath on {master} or detach the port");
        }
        if !ours(l.ifindex, l.xdp_prog_id) && (l.xdp != XdpAttach::None || l.xdp_prog_id.is_some()) {
            match l.xdp_prog_id {
                Some(id) => bail!("interface {name} already has an XDP program attached (prog id {id}); detach it first"),
                None => bail!("interface {name} already has an XDP program attached; detach it first"),
            }
        }
        ifaces.push(Iface { name: name.clone(), ifindex: l.ifindex, slot: i as u32 + 1 });
    }

    Ok(ifaces)
}

/// A live daemon answers connect(); a stale file refuses it.
pub fn socket_state(path: &Path) -> Result<SocketState> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(SocketState::Free),
        Err(e) => return Err(e).with_context(|| format!("checking socket path {}", path.display())),
        Ok(md) => {
            use std::os::unix::fs::FileTypeExt;
            if !md.file_type().is_socket() {
                bail!("socket path {} exists and is not a socket; refusing to replace it", path.display());
            }
        }
    }
    match UnixStream::connect(path) {
        Ok(_) => bail!("another fastpath daemon is already serving {}", path.display()),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(SocketState::Stale),
        Err(e) => Err(e).with_context(|| format!("checking socket {}", path.display())),
    }
}
