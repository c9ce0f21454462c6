//! Link facts straight from rtnetlink (one RTM_GETLINK dump). Used before
//! anything is attached (preflight) and right after attaching (which XDP
//! mode the kernel really chose), so it must not depend on the mirror.
//! The veth peer check (vethpeer.rs) asks the same in other namespaces,
//! over sockets made there.

use anyhow::{bail, Context, Result};
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage, LinkXdp, XdpAttached};
use netlink_packet_route::nsid::{NsidAttribute, NsidMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// How an XDP program sits on a device, as IFLA_XDP_ATTACHED says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpAttach {
    None,
    Native,
    Generic,
    Offload,
    Multi,
}

impl XdpAttach {
    pub fn name(self) -> &'static str {
        match self {
            XdpAttach::None => "none",
            XdpAttach::Native => "native",
            XdpAttach::Generic => "generic",
            XdpAttach::Offload => "offload",
            XdpAttach::Multi => "multi",
        }
    }
}

#[derive(Debug, Clone)]
pub struct LinkFacts {
    pub ifindex: u32,
    pub name: String,
    pub arphrd: u16,
    pub master: Option<u32>,
    pub xdp: XdpAttach,
    /// IFLA_XDP_PROG_ID (or the first per-mode id when several are attached).
    pub xdp_prog_id: Option<u32>,
    /// A driver-mode program is attached (alone or beside others).
    pub xdp_native: bool,
    pub veth: bool,
    /// IFLA_LINK: a veth's peer's ifindex, in `link_netnsid`'s namespace if set.
    pub link: Option<u32>,
    pub link_netnsid: Option<i32>,
}

pub const ARPHRD_ETHER: u16 = 1;

/// A request socket in the caller's namespace.
pub fn socket() -> Result<Socket> {
    let mut sock = Socket::new(NETLINK_ROUTE).context("opening rtnetlink socket")?;
    sock.bind_auto().context("binding rtnetlink socket")?;
    sock.connect(&SocketAddr::new(0, 0)).context("connecting rtnetlink socket")?;
    Ok(sock)
}

pub fn dump() -> Result<Vec<LinkFacts>> {
    dump_on(&socket()?)
}

fn send(sock: &Socket, flags: u16, m: LinkMessage) -> Result<()> {
    request(sock, flags, RouteNetlinkMessage::GetLink(m)).context("sending RTM_GETLINK")
}

fn request(sock: &Socket, flags: u16, m: RouteNetlinkMessage) -> std::io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(m));
    req.finalize();
    let mut buf = vec![0u8; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0).map(|_| ())
}

/// The id the namespace of `sock` gives the namespace open as `ns_fd`
/// (what `link_netnsid` says of a veth's peer there), or None while it has
/// given it none (RTM_GETNSID, as `ip netns list-id`).
pub fn nsid_of(sock: &Socket, ns_fd: std::os::fd::BorrowedFd) -> Result<Option<i32>> {
    use std::os::fd::AsRawFd;
    let mut m = NsidMessage::default();
    m.attributes.push(NsidAttribute::Fd(ns_fd.as_raw_fd() as u32));
    request(sock, NLM_F_REQUEST, RouteNetlinkMessage::GetNsId(m)).context("sending RTM_GETNSID")?;
    let (data, _) = sock.recv_from_full().context("receiving RTM_GETNSID reply")?;
    let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data)
        .map_err(|e| anyhow::anyhow!("decoding RTM_GETNSID reply: {e}"))?;
    match msg.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(m)) => Ok(m.attributes.iter().find_map(|a| match a {
            NsidAttribute::Id(id) if *id >= 0 => Some(*id),
            _ => None,
        })),
        NetlinkPayload::Error(e) => bail!("RTM_GETNSID: {e}"),
        _ => bail!("RTM_GETNSID: unexpected reply"),
    }
}

/// Every link of the namespace `sock` was made in.
pub fn dump_on(sock: &Socket) -> Result<Vec<LinkFacts>> {
    send(sock, NLM_F_REQUEST | NLM_F_DUMP, LinkMessage::default())?;
    let mut links = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full().context("receiving RTM_GETLINK dump")?;
        let mut off = 0;
        while off < data.len() {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                .map_err(|e| anyhow::anyhow!("decoding RTM_GETLINK reply: {e}"))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(links),
                NetlinkPayload::Error(e) => bail!("RTM_GETLINK dump failed: {e}"),
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => links.push(facts(&m)),
                _ => {}
            }
            if len == 0 {
                bail!("malformed netlink message (length 0)");
            }
            off += (len + 3) & !3;
        }
    }
}

/// Link `index` of the namespace `sock` was made in, or with `nsid` of the
/// namespace that `nsid` names from there (IFLA_TARGET_NETNSID); None if
/// there is no such link.
pub fn get_on(sock: &Socket, index: u32, nsid: Option<i32>) -> Result<Option<LinkFacts>> {
    let mut m = LinkMessage::default();
    m.header.index = index;
    if let Some(id) = nsid {
        m.attributes.push(LinkAttribute::IfNetnsId(id));
    }
    send(sock, NLM_F_REQUEST, m)?;
    let (data, _) = sock.recv_from_full().context("receiving RTM_GETLINK reply")?;
    let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data)
        .map_err(|e| anyhow::anyhow!("decoding RTM_GETLINK reply: {e}"))?;
    match msg.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) if m.header.index == index => Ok(Some(facts(&m))),
        NetlinkPayload::Error(e) if e.raw_code() == -libc::ENODEV => Ok(None),
        NetlinkPayload::Error(e) => bail!("RTM_GETLINK {index}: {e}"),
        _ => bail!("RTM_GETLINK {index}: unexpected reply"),
    }
}

fn facts(m: &LinkMessage) -> LinkFacts {
    let mut f = LinkFacts {
        ifindex: m.header.index,
        name: String::new(),
        arphrd: u16::from(m.header.link_layer_type),
        master: None,
        xdp: XdpAttach::None,
        xdp_prog_id: None,
        xdp_native: false,
        veth: false,
        link: None,
        link_netnsid: None,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => f.name = n.clone(),
            LinkAttribute::Controller(c) if *c != 0 => f.master = Some(*c),
            LinkAttribute::Link(l) => f.link = Some(*l),
            LinkAttribute::LinkNetNsId(id) => f.link_netnsid = Some(*id),
            LinkAttribute::LinkInfo(infos) => f.veth |= infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth))),
            LinkAttribute::Xdp(xs) => {
                for x in xs {
                    match x {
                        LinkXdp::Attached(att) => {
                            f.xdp_native |= *att == XdpAttached::Driver;
                            f.xdp = match att {
                                XdpAttached::None => XdpAttach::None,
                                XdpAttached::Driver => XdpAttach::Native,
                                XdpAttached::SocketBuffer => XdpAttach::Generic,
                                XdpAttached::Hardware => XdpAttach::Offload,
                                _ => XdpAttach::Multi,
                            }
                        }
                        LinkXdp::DrvProgId(id) if *id != 0 => {
                            f.xdp_native = true;
                            f.xdp_prog_id.get_or_insert(*id);
                        }
                        LinkXdp::ProgId(id) | LinkXdp::DrvProgId(id) | LinkXdp::SkbProgId(id) | LinkXdp::HwProgId(id)
                            if *id != 0 && f.xdp_prog_id.is_none() =>
                        {
                            f.xdp_prog_id = Some(*id)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    f
}
