//! The socket server's DNS logic: the rules of `bpf/lib/dns.h` applied to a
//! UDP payload, so the user-space baseline gives the XDP responders' answers
//! byte for byte (header, question, answer section) and rejects the same
//! malformed queries the same way. IP and UDP are the kernel's here.

use super::dns_records::{Found, Zone};
use fastpath_bpf::intf::FP_DNS_KEY_NAME;

const HDR: usize = 12;
const MAX_QUERY: usize = 512;
const MAX_NAME: usize = 255;
const F_QR: u16 = 0x8000;
const F_OPCODE: u16 = 0x7800;
const F_RD: u16 = 0x0100;
const F_RA: u16 = 0x0080;
pub const RCODE_NOERROR: u16 = 0;
pub const RCODE_FORMERR: u16 = 1;
pub const RCODE_NXDOMAIN: u16 = 3;
pub const RCODE_NOTIMP: u16 = 4;
pub const RCODE_REFUSED: u16 = 5;
const TYPE_OPT: u8 = 41;

/// How a responder answers a well-formed question.
pub enum Responder<'z> {
    /// Every name NXDOMAIN (workload c).
    Nxdomain,
    /// From the record set (workload d).
    Zone(&'z Zone),
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The question name's wire length, or None if malformed (as dns_walk_name).
fn walk_name(msg: &[u8], off: usize) -> Option<usize> {
    let mut pos = 0;
    loop {
        if pos >= MAX_NAME {
            return None;
        }
        let c = *msg.get(off + pos)?;
        if c == 0 {
            return Some(pos + 1);
        }
        if c > 63 {
            return None;
        }
        pos += usize::from(c) + 1;
    }
}

fn header(q: &[u8], rcode: u16, qdcount: u16, ancount: u16) -> Vec<u8> {
    let flags = F_QR | (be16(q, 2) & (F_OPCODE | F_RD)) | F_RA | rcode;
    let mut h = Vec::with_capacity(HDR + 64);
    h.extend_from_slice(&q[0..2]);
    h.extend_from_slice(&flags.to_be_bytes());
    for c in [qdcount, ancount, 0, 0] {
        h.extend_from_slice(&c.to_be_bytes());
    }
    h
}

/// The answer to UDP payload `q`, or None when the rules say no answer.
pub fn respond(q: &[u8], r: &Responder<'_>) -> Option<Vec<u8>> {
    if q.len() < HDR || q.len() > MAX_QUERY {
        return None;
    }
    let flags = be16(q, 2);
    if flags & F_QR != 0 {
        return None;
    }
    if flags & F_OPCODE != 0 {
        return Some(header(q, RCODE_NOTIMP, 0, 0));
    }
    let formerr = Some(header(q, RCODE_FORMERR, 0, 0));
    let arcount = be16(q, 10);
    if be16(q, 4) != 1 || be16(q, 6) != 0 || be16(q, 8) != 0 || arcount > 1 {
        return formerr;
    }
    let Some(name_len) = walk_name(q, HDR) else {
        return formerr;
    };
    let qend = HDR + name_len + 4;
    if qend > q.len() {
        return formerr;
    }
    let rest = &q[qend..];
    if arcount == 0 {
        if !rest.is_empty() {
            return formerr;
        }
    } else if rest.len() < 11 || rest[0] != 0 || rest[1] != 0 || rest[2] != TYPE_OPT || 11 + usize::from(be16(rest, 9)) != rest.len() {
        return formerr;
    }
    let qtype = be16(q, qend - 4);
    let qclass = be16(q, qend - 2);
    let question = &q[HDR..qend];
    let (rcode, ancount, rrs): (u16, u16, &[u8]) = if qclass != 1 {
        (RCODE_REFUSED, 0, &[])
    } else {
        match r {
            Responder::Nxdomain => (RCODE_NXDOMAIN, 0, &[]),
            Responder::Zone(_) if name_len > FP_DNS_KEY_NAME as usize => (RCODE_NXDOMAIN, 0, &[]),
            Responder::Zone(z) => {
                let name = q[HDR..HDR + name_len].to_ascii_lowercase();
                match z.lookup(&name, qtype) {
                    Found::Records { ancount, rrs } => (RCODE_NOERROR, ancount, rrs),
                    Found::NoData => (RCODE_NOERROR, 0, &[]),
                    Found::NxDomain => (RCODE_NXDOMAIN, 0, &[]),
                }
            }
        }
    };
    let mut a = header(q, rcode, 1, ancount);
    a.extend_from_slice(question);
    a.extend_from_slice(rrs);
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::super::dns_records::{name, wire_name, RecordSet, TYPE_A};
    use super::*;

    fn query(id: u16, flags: u16, counts: [u16; 4], body: &[u8]) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        for c in counts {
            m.extend_from_slice(&c.to_be_bytes());
        }
        m.extend_from_slice(body);
        m
    }

    fn question(n: &str, qtype: u16) -> Vec<u8> {
        let mut q = wire_name(n);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    #[test]
    fn nxdomain_echoes_id_and_question() {
        let q = query(0xbeef, 0x0100, [1, 0, 0, 0], &question("Foo.Example", 1));
        let a = respond(&q, &Responder::Nxdomain).unwrap();
        assert_eq!(&a[..12], &[0xbe, 0xef, 0x81, 0x83, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&a[12..], &q[12..]);
    }

    #[test]
    fn zone_is_case_insensitive_and_drops_opt() {
        let z = Zone::new(RecordSet::Small);
        let n = name(7).to_uppercase();
        let mut body = question(&n, TYPE_A);
        body.extend_from_slice(&[0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0]);
        let q = query(1, 0x0100, [1, 0, 0, 1], &body);
        let a = respond(&q, &Responder::Zone(&z)).unwrap();
        assert_eq!(be16(&a, 2), 0x8180);
        assert_eq!(be16(&a, 6), 2);
        assert_eq!(&a[12..12 + body.len() - 11], &body[..body.len() - 11]);
        assert_eq!(a.len(), 12 + body.len() - 11 + 32);
    }

    #[test]
    fn malformed_get_formerr_notimp_or_nothing() {
        let good = question("a.example", 1);
        assert!(respond(&[1, 2, 3], &Responder::Nxdomain).is_none());
        assert!(respond(&query(1, 0x8000, [1, 0, 0, 0], &good), &Responder::Nxdomain).is_none());
        let notimp = respond(&query(1, 0x1000, [1, 0, 0, 0], &good), &Responder::Nxdomain).unwrap();
        assert_eq!((be16(&notimp, 2), notimp.len()), (0x9084, 12));
        let mut trailing = good.clone();
        trailing.push(0);
        let mut ptr = vec![1, b'a', 0xc0, 12];
        ptr.extend_from_slice(&[0, 1, 0, 1]);
        for bad in [
            query(1, 0, [2, 0, 0, 0], &[good.clone(), good.clone()].concat()),
            query(1, 0, [1, 0, 0, 0], &trailing),
            query(1, 0, [1, 0, 0, 0], &ptr),
            query(1, 0, [1, 0, 0, 0], &[64, b'x']),
            query(1, 0, [1, 0, 0, 0], &good[..good.len() - 1]),
        ] {
            let a = respond(&bad, &Responder::Nxdomain).unwrap();
            assert_eq!((be16(&a, 2), a.len()), (0x8081, 12));
        }
    }
}
