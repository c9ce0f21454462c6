//! The DNS record sets of `fastpath bench dns` (issue #6, workload d), made
//! deterministically here so the XDP map loader and the socket server answer
//! from the same data.
//!
//! Name i is `h<6 hex digits of i>.dns.example` (all names the same length,
//! which the query generator relies on) with 1-3 A records and 1-2 AAAA
//! records from the documentation ranges, TTL 300, plus its "exists" marker
//! (QTYPE 0) so other types get NODATA. A set's size is what its map holds,
//! key and value bytes: the small one ~20 KiB, the large one ~26 MiB, as in
//! the paper's two response sets.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use fastpath_bpf::intf::{fp_dns_answer, fp_dns_key, FP_DNS_ANS_MAX, FP_DNS_KEY_NAME, FP_DNS_QTYPE_NAME};

pub const TYPE_A: u16 = 1;
pub const TYPE_AAAA: u16 = 28;
const TTL: u32 = 300;
/// Wire bytes of every generated name; the generator writes the digits at
/// NAME_DIGITS within it.
pub const NAME_WIRE_LEN: usize = 21;
pub const NAME_DIGITS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum RecordSet {
    /// ~20 KiB of map entries.
    Small,
    /// ~26 MiB of map entries.
    Large,
}

/// Map bytes per (key, value) entry, and entries per name (A, AAAA, marker).
pub const ENTRY_BYTES: usize = std::mem::size_of::<fp_dns_key>() + std::mem::size_of::<fp_dns_answer>();
const ENTRIES_PER_NAME: usize = 3;

impl RecordSet {
    pub fn target_bytes(self) -> usize {
        match self {
            RecordSet::Small => 20 << 10,
            RecordSet::Large => 26 << 20,
        }
    }

    /// Names in the set: as many as fit in the target size.
    pub fn names(self) -> u32 {
        (self.target_bytes() / (ENTRY_BYTES * ENTRIES_PER_NAME)) as u32
    }

    pub fn entries(self) -> u32 {
        self.names() * ENTRIES_PER_NAME as u32
    }
}

pub fn name(i: u32) -> String {
    format!("h{i:06x}.dns.example")
}

/// `name` in wire format (lowercase as given; at most 255 bytes is the caller's business).
pub fn wire_name(name: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(name.len() + 2);
    for l in name.trim_end_matches('.').split('.').filter(|l| !l.is_empty()) {
        v.push(l.len() as u8);
        v.extend_from_slice(l.as_bytes());
    }
    v.push(0);
    v
}

fn rr(rtype: u16, rdata: &[u8]) -> Vec<u8> {
    let mut r = vec![0xc0, 0x0c];
    r.extend_from_slice(&rtype.to_be_bytes());
    r.extend_from_slice(&1u16.to_be_bytes());
    r.extend_from_slice(&TTL.to_be_bytes());
    r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    r.extend_from_slice(rdata);
    r
}

pub fn a_addrs(i: u32) -> Vec<Ipv4Addr> {
    let nets = [[203, 0, 113], [198, 51, 100], [192, 0, 2]];
    (0..1 + i % 3)
        .map(|k| {
            let n = nets[k as usize];
            Ipv4Addr::new(n[0], n[1], n[2], (i % 251) as u8 + 1)
        })
        .collect()
}

pub fn aaaa_addrs(i: u32) -> Vec<Ipv6Addr> {
    (0..1 + i % 2)
        .map(|k| Ipv6Addr::new(0x2001, 0xdb8, 0xd5, k as u16, 0, 0, (i >> 16) as u16, i as u16))
        .collect()
}

/// One map entry: (wire name, QTYPE) -> (ANCOUNT, answer RR bytes).
pub struct Record {
    pub name: Vec<u8>,
    pub qtype: u16,
    pub ancount: u16,
    pub rrs: Vec<u8>,
}

impl Record {
    pub fn key(&self) -> fp_dns_key {
        let mut k = fp_dns_key::default();
        k.name[..self.name.len()].copy_from_slice(&self.name);
        k.qtype = self.qtype;
        k
    }

    pub fn value(&self) -> fp_dns_answer {
        let mut v = fp_dns_answer::default();
        v.rr[..self.rrs.len()].copy_from_slice(&self.rrs);
        v.len = self.rrs.len() as u16;
        v.ancount = self.ancount;
        v
    }
}

/// The records of name i.
pub fn records_of(i: u32) -> [Record; 3] {
    let wn = wire_name(&name(i));
    let a = a_addrs(i);
    let aaaa = aaaa_addrs(i);
    [
        Record {
            name: wn.clone(),
            qtype: TYPE_A,
            ancount: a.len() as u16,
            rrs: a.iter().flat_map(|x| rr(TYPE_A, &x.octets())).collect(),
        },
        Record {
            name: wn.clone(),
            qtype: TYPE_AAAA,
            ancount: aaaa.len() as u16,
            rrs: aaaa.iter().flat_map(|x| rr(TYPE_AAAA, &x.octets())).collect(),
        },
        Record { name: wn, qtype: FP_DNS_QTYPE_NAME as u16, ancount: 0, rrs: Vec::new() },
    ]
}

pub fn records(set: RecordSet) -> impl Iterator<Item = Record> {
    (0..set.names()).flat_map(records_of)
}

/// What a lookup found.
pub enum Found<'a> {
    Records { ancount: u16, rrs: &'a [u8] },
    NoData,
    NxDomain,
}

/// The record set as the socket server holds it.
pub struct Zone {
    map: HashMap<(Vec<u8>, u16), (u16, Vec<u8>)>,
}

impl Zone {
    pub fn new(set: RecordSet) -> Self {
        let map = records(set).map(|r| ((r.name, r.qtype), (r.ancount, r.rrs))).collect();
        Zone { map }
    }

    /// `name`: wire format, already lowercased.
    pub fn lookup(&self, name: &[u8], qtype: u16) -> Found<'_> {
        if let Some((ancount, rrs)) = self.map.get(&(name.to_vec(), qtype)) {
            return Found::Records { ancount: *ancount, rrs };
        }
        if qtype != FP_DNS_QTYPE_NAME as u16 && self.map.contains_key(&(name.to_vec(), FP_DNS_QTYPE_NAME as u16)) {
            return Found::NoData;
        }
        Found::NxDomain
    }
}

// The BPF map cannot hold what these would not fit.
const _: () = assert!(NAME_WIRE_LEN <= FP_DNS_KEY_NAME as usize);
// The largest answers made: three A records (48 bytes), two AAAA (56).
const _: () = assert!(3 * 16 <= FP_DNS_ANS_MAX as usize);
const _: () = assert!(2 * 28 <= FP_DNS_ANS_MAX as usize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_have_the_papers_sizes() {
        let small = RecordSet::Small.entries() as usize * ENTRY_BYTES;
        let large = RecordSet::Large.entries() as usize * ENTRY_BYTES;
        assert!((19 << 10..=20 << 10).contains(&small), "{small}");
        assert!((25 << 20..=26 << 20).contains(&large), "{large}");
    }

    #[test]
    fn names_have_one_length_and_records_fit() {
        for i in [0, 1, 0xabcdef, RecordSet::Large.names() - 1] {
            assert_eq!(wire_name(&name(i)).len(), NAME_WIRE_LEN);
            assert_eq!(&wire_name(&name(i))[NAME_DIGITS..NAME_DIGITS + 6], format!("{i:06x}").as_bytes());
            for r in records_of(i) {
                assert!(r.rrs.len() <= FP_DNS_ANS_MAX as usize);
                assert_eq!(r.value().ancount, r.ancount);
            }
        }
    }

    #[test]
    fn zone_answers_nodata_and_nxdomain() {
        let z = Zone::new(RecordSet::Small);
        let n = wire_name(&name(4));
        match z.lookup(&n, TYPE_A) {
            Found::Records { ancount, rrs } => {
                assert_eq!(ancount, 2);
                assert_eq!(rrs.len(), 32);
                assert_eq!(&rrs[12..16], &[203, 0, 113, 5]);
            }
            _ => panic!("A of name 4"),
        }
        assert!(matches!(z.lookup(&n, 15), Found::NoData));
        assert!(matches!(z.lookup(&wire_name("nope.dns.example"), TYPE_A), Found::NxDomain));
    }
}
