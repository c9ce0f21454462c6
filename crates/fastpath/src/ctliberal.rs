//! Stateful mode: the data path's requests for liberal TCP window tracking.
//!
//! The XDP program refuses to fast-path a marked TCP entry whose window
//! tracking is strict, and once such an entry has lived long enough to be
//! worth it (bpf/lib/ct.h, fp_ct_want_liberal) it posts the entry's original
//! tuple on the fp_ct_liberal_req ring buffer. Here the requests are read
//! and turned into the tuple attribute of a ctnetlink update; ctwatch sends
//! them. Short connections, which end before they could gain anything from
//! the fast path, so never cost the kernel an update.

use std::cell::RefCell;
use std::mem::offset_of;
use std::os::fd::RawFd;
use std::rc::Rc;

use fastpath_bpf::intf::fp_flow_key;
use libbpf_rs::{MapHandle, RingBuffer, RingBufferBuilder};
use crate::ctnl::*;

/// One request: the entry's original tuple, as the data path read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub family: u8,
    pub proto: u8,
    /// Network order, as on the wire.
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

impl Request {
    /// A ring record (a struct fp_flow_key); None if short or of an unknown family.
    pub fn parse(b: &[u8]) -> Option<Request> {
        if b.len() < std::mem::size_of::<fp_flow_key>() {
            return None;
        }
        let arr = |off: usize| -> [u8; 16] { b[off..off + 16].try_into().unwrap_or([0; 16]) };
        let port = |off: usize| [b[off], b[off + 1]];
        let r = Request {
            family: b[offset_of!(fp_flow_key, family)],
            proto: b[offset_of!(fp_flow_key, proto)],
            sport: port(offset_of!(fp_flow_key, sport)),
            dport: port(offset_of!(fp_flow_key, dport)),
            saddr: arr(offset_of!(fp_flow_key, saddr)),
            daddr: arr(offset_of!(fp_flow_key, daddr)),
        };
        matches!(r.family, AF_INET | AF_INET6).then_some(r)
    }

    /// The CTA_TUPLE_ORIG attribute naming the entry (zone 0: the data path
    /// looks up no other).
    pub fn tuple_attr(&self) -> Vec<u8> {
        let mut proto = Vec::with_capacity(24);
        nla(&mut proto, CTA_PROTO_NUM, &[self.proto]);
        nla(&mut proto, CTA_PROTO_SRC_PORT, &self.sport);
        nla(&mut proto, CTA_PROTO_DST_PORT, &self.dport);
        tuple_nest(CTA_TUPLE_ORIG, self.family, &self.saddr, &self.daddr, &proto)
    }
}

/// The nested tuple attribute `ty` (CTA_TUPLE_ORIG, _REPLY): the addresses
/// of `family` (IPv4 in the first 4 bytes) and the encoded protocol part.
pub(crate) fn tuple_nest(ty: u16, family: u8, src: &[u8; 16], dst: &[u8; 16], proto: &[u8]) -> Vec<u8> {
    let mut ip = Vec::with_capacity(40);
    if family == AF_INET {
        nla(&mut ip, CTA_IP_V4_SRC, &src[..4]);
        nla(&mut ip, CTA_IP_V4_DST, &dst[..4]);
    } else {
        nla(&mut ip, CTA_IP_V6_SRC, src);
        nla(&mut ip, CTA_IP_V6_DST, dst);
    }
    let mut tuple = Vec::with_capacity(ip.len() + proto.len() + 8);
    nla(&mut tuple, CTA_TUPLE_IP | NLA_F_NESTED, &ip);
    nla(&mut tuple, CTA_TUPLE_PROTO | NLA_F_NESTED, proto);
    let mut out = Vec::with_capacity(tuple.len() + 4);
    nla(&mut out, ty | NLA_F_NESTED, &tuple);
    out
}

/// Appends one netlink attribute, padded to 4 bytes.
pub(crate) fn nla(out: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    out.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize((out.len() + 3) & !3, 0);
}

/// The consumer side of a ring of struct fp_flow_key records
/// (fp_ct_liberal_req, fp_ct_icmp_req).
pub struct Ring {
    ring: RingBuffer<'static>,
    /// Filled by the ring's callback during consume(); None: a record we do not understand.
    got: Rc<RefCell<Vec<Option<Request>>>>,
    /// Records that were not a request we understand.
    pub malformed: u64,
    // The ring maps the map's memory; kept open with it.
    _map: MapHandle,
}

impl Ring {
    pub fn open(map: MapHandle) -> libbpf_rs::Result<Ring> {
        let got: Rc<RefCell<Vec<Option<Request>>>> = Rc::default();
        let sink = Rc::clone(&got);
        let mut b = RingBufferBuilder::new();
        b.add(&map, move |data: &[u8]| {
            sink.borrow_mut().push(Request::parse(data));
            0
        })?;
        let ring = b.build()?;
        Ok(Ring { ring, got, malformed: 0, _map: map })
    }

    /// Readable when requests are waiting (for poll()).
    pub fn fd(&self) -> RawFd {
        self.ring.epoll_fd()
    }

    /// Everything posted so far, without blocking.
    pub fn take(&mut self) -> libbpf_rs::Result<Vec<Request>> {
        self.ring.consume()?;
        let got = std::mem::take(&mut *self.got.borrow_mut());
        let n = got.len();
        let reqs: Vec<Request> = got.into_iter().flatten().collect();
        self.malformed += (n - reqs.len()) as u64;
        Ok(reqs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(family: u8, saddr: &[u8], daddr: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; std::mem::size_of::<fp_flow_key>()];
        b[offset_of!(fp_flow_key, family)] = family;
        b[offset_of!(fp_flow_key, proto)] = 6;
        b[offset_of!(fp_flow_key, sport)..][..2].copy_from_slice(&1234u16.to_be_bytes());
        b[offset_of!(fp_flow_key, dport)..][..2].copy_from_slice(&80u16.to_be_bytes());
        b[offset_of!(fp_flow_key, saddr)..][..saddr.len()].copy_from_slice(saddr);
        b[offset_of!(fp_flow_key, daddr)..][..daddr.len()].copy_from_slice(daddr);
        b
    }

    #[test]
    fn ipv4_request_becomes_an_orig_tuple() {
        let r = Request::parse(&record(AF_INET, &[192, 0, 2, 1], &[198, 51, 100, 2])).unwrap();
        let a = r.tuple_attr();
        let want: Vec<u8> = [
            // CTA_TUPLE_ORIG (nested), 52 bytes
            &[52, 0, 1, 0x80][..],
            // CTA_TUPLE_IP (nested): v4 src, v4 dst
            &[20, 0, 1, 0x80],
            &[8, 0, 1, 0, 192, 0, 2, 1],
            &[8, 0, 2, 0, 198, 51, 100, 2],
            // CTA_TUPLE_PROTO (nested): proto 6, ports 1234 -> 80
            &[28, 0, 2, 0x80],
            &[5, 0, 1, 0, 6, 0, 0, 0],
            &[6, 0, 2, 0, 0x04, 0xd2, 0, 0],
            &[6, 0, 3, 0, 0, 80, 0, 0],
        ]
        .concat();
        assert_eq!(a, want);
    }

    #[test]
    fn ipv6_request_carries_whole_addresses() {
        let s: Vec<u8> = (1..=16).collect();
        let d: Vec<u8> = (17..=32).collect();
        let a = Request::parse(&record(AF_INET6, &s, &d)).unwrap().tuple_attr();
        assert_eq!(a.len(), 4 + 4 + 20 + 20 + 28);
        assert_eq!(&a[8..12], &[20, 0, 3, 0]);
        assert_eq!(&a[12..28], &s[..]);
        assert_eq!(&a[32..48], &d[..]);
    }

    #[test]
    fn short_or_foreign_records_are_refused() {
        assert_eq!(Request::parse(&[2, 6, 0, 0]), None);
        assert_eq!(Request::parse(&record(7, &[1], &[2])), None);
    }
}
