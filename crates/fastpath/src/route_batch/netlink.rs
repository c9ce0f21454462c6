//! Adding and removing the batch's routes in the kernel (main table), one
//! RTM_NEWROUTE / RTM_DELROUTE at a time, each acknowledged before the next.

use std::io;
use std::net::IpAddr;

use anyhow::{Context, Result};
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use super::parse::{Line, Via};

pub struct Rtnl {
    sock: Socket,
    seq: u32,
}

/// What the kernel needs besides the line: the resolved output device.
pub struct Resolved<'a> {
    pub line: &'a Line,
    pub oif: Option<u32>,
}

impl Rtnl {
    pub fn open() -> Result<Rtnl> {
        let mut sock = Socket::new(NETLINK_ROUTE).context("opening rtnetlink socket")?;
        sock.bind_auto().context("binding rtnetlink socket")?;
        sock.connect(&SocketAddr::new(0, 0)).context("connecting rtnetlink socket")?;
        Ok(Rtnl { sock, seq: 0 })
    }

    pub fn add(&mut self, r: &Resolved) -> io::Result<()> {
        let m = message(r, false);
        self.call(RouteNetlinkMessage::NewRoute(m), NLM_F_CREATE | NLM_F_EXCL)
    }

    pub fn del(&mut self, r: &Resolved) -> io::Result<()> {
        let m = message(r, true);
        self.call(RouteNetlinkMessage::DelRoute(m), 0)
    }

    fn call(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.seq;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        loop {
            let (data, _) = self.sock.recv_from_full()?;
            let mut off = 0;
            while off < data.len() {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decoding netlink reply: {e}")))?;
                let len = msg.header.length as usize;
                if let NetlinkPayload::Error(e) = msg.payload {
                    if msg.header.sequence_number == self.seq {
                        return match e.code {
                            None => Ok(()),
                            Some(_) => Err(e.to_io()),
                        };
                    }
                }
                if len == 0 {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "malformed netlink message (length 0)"));
                }
                off += (len + 3) & !3;
            }
        }
    }
}

/// The message `ip route add|del` would send for the line. A delete names
/// only what the line names (kernel matching: unset fields match anything).
fn message(r: &Resolved, delete: bool) -> RouteMessage {
    let l = r.line;
    let mut m = RouteMessage::default();
    m.header.address_family = if l.dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    m.header.destination_prefix_length = l.len;
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    let blackhole = l.via == Via::Blackhole;
    if delete {
        m.header.protocol = RouteProtocol::Unspec;
        m.header.scope = RouteScope::NoWhere;
        m.header.kind = if blackhole { RouteType::BlackHole } else { RouteType::Unspec };
    } else {
        m.header.protocol = RouteProtocol::Boot;
        m.header.scope = match l.via {
            Via::Dev(_) => RouteScope::Link,
            _ => RouteScope::Universe,
        };
        m.header.kind = if blackhole { RouteType::BlackHole } else { RouteType::Unicast };
    }
    if l.len != 0 {
        m.attributes.push(RouteAttribute::Destination(addr(l.dst)));
    }
    if let Via::Gateway { gw, .. } = &l.via {
        m.attributes.push(RouteAttribute::Gateway(addr(*gw)));
    }
    if let Some(oif) = r.oif {
        m.attributes.push(RouteAttribute::Oif(oif));
    }
    m
}

fn addr(a: IpAddr) -> RouteAddress {
    match a {
        IpAddr::V4(v) => RouteAddress::Inet(v),
        IpAddr::V6(v) => RouteAddress::Inet6(v),
    }
}
