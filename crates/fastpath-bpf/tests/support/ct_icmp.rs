//! ICMP echo in stateful mode: echo messages with full checksums, and the
//! daemon's copies of conntrack's echo entries (fp_ct_icmp) written the way
//! `crates/fastpath/src/cticmp.rs` writes them.

use fastpath_bpf::intf::{fp_ct_icmp, fp_flow_key, fp_nat, fp_reason};
use libbpf_rs::{MapCore, MapFlags};

use super::packet::csum;
use super::runner::Loaded;
use super::world::{from_raw, raw};

/// An ICMP message: type, code, echo id, sequence 1, then `data`, with its
/// checksum; ICMPv6 (`pseudo`: its addresses) sums the pseudo-header too.
pub fn icmp_msg(ty: u8, code: u8, id: u16, data: &[u8], pseudo: Option<(&[u8; 16], &[u8; 16])>) -> Vec<u8> {
    let mut m = vec![ty, code, 0, 0];
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&1u16.to_be_bytes());
    m.extend_from_slice(data);
    let mut summed = Vec::new();
    if let Some((s, d)) = pseudo {
        summed.extend_from_slice(s);
        summed.extend_from_slice(d);
        summed.extend_from_slice(&(m.len() as u32).to_be_bytes());
        summed.extend_from_slice(&[0, 0, 0, 58]);
    }
    summed.extend_from_slice(&m);
    let c = csum(&summed);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// The fp_ct_icmp key of an echo packet: its own tuple (code 0).
pub fn echo_key(family: u8, proto: u8, (src, dst): (&[u8], &[u8]), ty: u8, id: u16) -> fp_flow_key {
    let mut k = fp_flow_key { family, proto, sport: u16::from_ne_bytes([ty, 0]), dport: id.to_be(), ..Default::default() };
    k.saddr[..src.len()].copy_from_slice(src);
    k.daddr[..dst.len()].copy_from_slice(dst);
    k
}

/// CLOCK_MONOTONIC_COARSE, the data path's bpf_ktime_get_coarse_ns().
pub fn now_coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) }, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the daemon writes for the packets with key `k` after a GET `age_ms` ago.
pub fn put_copy(l: &Loaded, k: &fp_flow_key, reason: fp_reason, nat: fp_nat, age_ms: u64) {
    let v = fp_ct_icmp { checked: now_coarse_ns() - age_ms * 1_000_000, reason: reason as u32, nat, ..Default::default() };
    l.skel.maps.fp_ct_icmp.update(raw(k), raw(&v), MapFlags::ANY).expect("fp_ct_icmp");
}

pub fn copy_of(l: &Loaded, k: &fp_flow_key) -> Option<fp_ct_icmp> {
    l.skel.maps.fp_ct_icmp.lookup(raw(k), MapFlags::ANY).expect("fp_ct_icmp").map(|v| from_raw(&v))
}
