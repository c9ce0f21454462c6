//! Link facts straight from rtnetlink (one RTM_GETLINK dump). Used before
//! anything is attached (preflight) and right after attaching (which XDP
//! mode the kernel really chose), so it must not depend on the mirror.

use anyhow::{bail, Context, Result};
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached};
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
}

pub const ARPHRD_ETHER: u16 = 1;

pub fn dump() -> Result<Vec<LinkFacts>> {
    let mut sock = Socket::new(NETLINK_ROUTE).context("opening rtnetlink socket")?;
    sock.bind_auto().context("binding rtnetlink socket")?;
    sock.connect(&SocketAddr::new(0, 0)).context("connecting rtnetlink socket")?;

    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetLink(LinkMessage::default())));
    req.finalize();
    let mut buf = vec![0u8; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0).context("sending RTM_GETLINK")?;

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

fn facts(m: &LinkMessage) -> LinkFacts {
    let mut f = LinkFacts {
        ifindex: m.header.index,
        name: String::new(),
        arphrd: u16::from(m.header.link_layer_type),
        master: None,
        xdp: XdpAttach::None,
        xdp_prog_id: None,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => f.name = n.clone(),
            LinkAttribute::Controller(c) if *c != 0 => f.master = Some(*c),
            LinkAttribute::Xdp(xs) => {
                for x in xs {
                    match x {
                        LinkXdp::Attached(att) => {
                            f.xdp = match att {
                                XdpAttached::None => XdpAttach::None,
                                XdpAttached::Driver => XdpAttach::Native,
                                XdpAttached::SocketBuffer => XdpAttach::Generic,
                                XdpAttached::Hardware => XdpAttach::Offload,
                                _ => XdpAttach::Multi,
                            }
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
