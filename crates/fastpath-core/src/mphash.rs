//! The kernel's ECMP hash on the forwarding path (Linux 6.18
//! `fib_multipath_hash()` / `rt6_multipath_hash()` with an skb), in plain
//! Rust: the reference `bpf/lib/mphash.h` is tested against, and what the
//! kernel test checks real forwarding decisions with.
//!
//! The kernel builds a zeroed `struct flow_keys`, fills the policy's fields,
//! orders addresses and ports (`__flow_hash_consistentify()`), and takes
//! SipHash-2-4 of the struct from its `basic` member (48 bytes for IPv4,
//! 72 for IPv6) keyed by `seed << 32 | seed` twice; the low 32 bits, 0 made 1,
//! shifted right once. The seed is `net.ipv4.fib_multipath_hash_seed` for
//! both families. See `bpf/lib/mphash.h` for what a caller must punt.

use std::hash::Hasher;
use std::net::{Ipv4Addr, Ipv6Addr};

use siphasher::sip::SipHasher24;

/// Offsets inside the hashed part of `struct flow_keys` (from `basic`).
const IP_PROTO: usize = 2;
const FLOW_LABEL: usize = 4;
const PORTS: usize = 28;
const ADDRS: usize = 36;
const LEN4: usize = 48;
const LEN6: usize = 72;

/// Hash policies fastpath reproduces (`fib_multipath_hash_policy`).
pub const POLICY_L3: u32 = 0;
pub const POLICY_L4: u32 = 1;
/// L3, or the inner packet's L3 when there is one. Reproduced for packets
/// without one: the flow dissector (flags 0) then finds the outer header's
/// fields, for IPv4 those of policy 0; for IPv6 also the flow label, but in
/// host order (the dissector's `ntohl()`, where policy 0 stores the header's
/// word as it is) and the dissector's ip_proto.
pub const POLICY_L3_INNER: u32 = 2;

/// Custom fields (`fib_multipath_hash_fields`): `custom4` / `custom6`.
pub const POLICY_CUSTOM: u32 = 3;

/// `fib_multipath_hash_fields` bits (FIB_MULTIPATH_HASH_FIELD_*,
/// include/net/ip_fib.h): the outer header's, then the inner one's.
pub const FIELD_SRC_IP: u32 = 1 << 0;
pub const FIELD_DST_IP: u32 = 1 << 1;
pub const FIELD_IP_PROTO: u32 = 1 << 2;
/// IPv6 only (IPv4 ignores it).
pub const FIELD_FLOWLABEL: u32 = 1 << 3;
pub const FIELD_SRC_PORT: u32 = 1 << 4;
pub const FIELD_DST_PORT: u32 = 1 << 5;
pub const FIELDS_OUTER: u32 = 0x3F;
pub const FIELDS_INNER: u32 = 0xFC0;
/// The kernel's default: addresses, protocol and ports of the outer header.
pub const FIELDS_DEFAULT: u32 = FIELD_SRC_IP | FIELD_DST_IP | FIELD_IP_PROTO | FIELD_SRC_PORT | FIELD_DST_PORT;

/// The `fib_multipath_hash_policy` values the data path hashes by (all four
/// the kernel has: 0, 1, 2, 3); multipath routes under any other are punted.
pub fn reproduced(policy: u8) -> bool {
    u32::from(policy) <= POLICY_CUSTOM
}

/// Policy 3 takes the L4 ports under `fields` (a flow key must keep them).
pub fn custom_uses_ports(fields: u32) -> bool {
    fields & (FIELD_SRC_PORT | FIELD_DST_PORT) != 0
}

/// IP protocols the flow dissector walks into under policy 2 (or might: a
/// GRE payload, IP in IP, IPv6 in IP, Ethernet in IP, MPLS in IP): the
/// kernel would hash an inner header, which is not reproduced.
pub fn policy2_encap(proto: u8) -> bool {
    matches!(proto, 4 | 41 | 47 | 97 | 137)
}

fn siphash(seed: u32, bytes: &[u8]) -> u32 {
    siphash_low(seed, bytes) >> 1
}

/// `fib_multipath_hash_from_keys()`: SipHash-2-4 keyed by the seed, stored
/// in a u32 (the low half), 0 made 1.
fn siphash_low(seed: u32, bytes: &[u8]) -> u32 {
    let k = (u64::from(seed) << 32) | u64::from(seed);
    let mut h = SipHasher24::new_with_keys(k, k);
    h.write(bytes);
    let v = h.finish() as u32;
    if v == 0 {
        1
    } else {
        v
    }
}

/// Ports in the kernel's order: swapped when dst < src as host-order u16 of
/// the network-order values (the struct member compared as stored).
fn ordered_ports(sport: u16, dport: u16) -> ([u8; 2], [u8; 2]) {
    let (s, d) = (sport.to_be_bytes(), dport.to_be_bytes());
    if u16::from_ne_bytes(d) < u16::from_ne_bytes(s) {
        (d, s)
    } else {
        (s, d)
    }
}

/// IPv4 ECMP hash as the forwarding path computes it; `None` for policies
/// other than 0 (L3), 1 (L4) and 2 (L3 or inner L3), and for policy 2 on a
/// protocol the dissector may walk into (`policy2_encap`). Policies 0 and 2
/// ignore proto and ports.
pub fn hash4(policy: u32, seed: u32, saddr: Ipv4Addr, daddr: Ipv4Addr, proto: u8, sport: u16, dport: u16) -> Option<u32> {
    let (proto, sport, dport) = match policy {
        POLICY_L3 => (0, 0, 0),
        POLICY_L4 => (proto, sport, dport),
        POLICY_L3_INNER if !policy2_encap(proto) => (0, 0, 0),
        _ => return None,
    };
    Some(siphash(seed, &keys4(saddr.octets(), daddr.octets(), proto, sport, dport)))
}

/// The hashed bytes of an IPv4 `struct flow_keys` holding these fields,
/// addresses and ports ordered as `__flow_hash_consistentify()` orders them.
fn keys4(mut s: [u8; 4], mut d: [u8; 4], proto: u8, sport: u16, dport: u16) -> [u8; LEN4] {
    if u32::from_ne_bytes(d) < u32::from_ne_bytes(s) {
        std::mem::swap(&mut s, &mut d);
    }
    let (ps, pd) = ordered_ports(sport, dport);
    let mut b = [0u8; LEN4];
    b[IP_PROTO] = proto;
    b[PORTS..PORTS + 2].copy_from_slice(&ps);
    b[PORTS + 2..PORTS + 4].copy_from_slice(&pd);
    b[ADDRS..ADDRS + 4].copy_from_slice(&s);
    b[ADDRS + 4..ADDRS + 8].copy_from_slice(&d);
    b
}

/// The same for IPv6, with the flow label's 4 bytes as the policy stores them.
fn keys6(mut s: [u8; 16], mut d: [u8; 16], label: [u8; 4], proto: u8, sport: u16, dport: u16) -> [u8; LEN6] {
    // memcmp(dst, src) < 0: byte-wise, which is how arrays compare.
    if d < s {
        std::mem::swap(&mut s, &mut d);
    }
    let (ps, pd) = ordered_ports(sport, dport);
    let mut b = [0u8; LEN6];
    b[IP_PROTO] = proto;
    b[FLOW_LABEL..FLOW_LABEL + 4].copy_from_slice(&label);
    b[PORTS..PORTS + 2].copy_from_slice(&ps);
    b[PORTS + 2..PORTS + 4].copy_from_slice(&pd);
    b[ADDRS..ADDRS + 16].copy_from_slice(&s);
    b[ADDRS + 16..ADDRS + 32].copy_from_slice(&d);
    b
}

/// IPv6 ECMP hash as the forwarding path computes it; `None` as for
/// `hash4`. `flowlabel` is the 20-bit label (host order, higher bits
/// ignored); policies 0 and 2 use label and proto (the header's nexthdr; the
/// label stored in the order each policy stores it), policy 1 proto and
/// ports.
#[allow(clippy::too_many_arguments)]
pub fn hash6(
    policy: u32,
    seed: u32,
    saddr: Ipv6Addr,
    daddr: Ipv6Addr,
    flowlabel: u32,
    proto: u8,
    sport: u16,
    dport: u16,
) -> Option<u32> {
    // ip6_flowlabel() keeps the header's network-order word (policy 0); the
    // flow dissector stores the label in host order (policy 2).
    let (label, sport, dport) = match policy {
        POLICY_L3 => ((flowlabel & 0x000F_FFFF).to_be_bytes(), 0, 0),
        POLICY_L4 => ([0; 4], sport, dport),
        POLICY_L3_INNER if !policy2_encap(proto) => ((flowlabel & 0x000F_FFFF).to_ne_bytes(), 0, 0),
        _ => return None,
    };
    Some(siphash(seed, &keys6(saddr.octets(), daddr.octets(), label, proto, sport, dport)))
}

/// The kernel's `jhash_2words(a, b, 0)` (include/linux/jhash.h).
fn jhash_2words(a: u32, b: u32) -> u32 {
    let init = 0xdead_beef_u32.wrapping_add(2 << 2);
    let (mut a, mut b, mut c) = (a.wrapping_add(init), b.wrapping_add(init), init);
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

/// Policy 3's last step (`fib_multipath_custom_hash_skb()` and its IPv6
/// twin): the outer fields' flow hash (0 when no outer field is chosen) and
/// the inner one's (0 here: no inner header, or no inner field chosen)
/// through `jhash_2words()`, shifted right once. `keyed`: the outer hash.
fn custom_finish(fields: u32, keyed: impl FnOnce() -> u32) -> u32 {
    let outer = if fields & FIELDS_OUTER != 0 { keyed() } else { 0 };
    jhash_2words(outer, 0) >> 1
}

/// The IPv4 hash under policy 3 with `fields`, for a packet with these L4
/// ports (0, 0 where the dissector finds none, as for `hash4`). `None`
/// when the kernel would hash an inner header: an inner field is chosen and
/// the packet may encapsulate one (`policy2_encap()`).
pub fn custom4(fields: u32, seed: u32, saddr: Ipv4Addr, daddr: Ipv4Addr, proto: u8, sport: u16, dport: u16) -> Option<u32> {
    if fields & FIELDS_INNER != 0 && policy2_encap(proto) {
        return None;
    }
    let pick = |bit: u32, v: u16| if fields & bit != 0 { v } else { 0 };
    let b = keys4(
        if fields & FIELD_SRC_IP != 0 { saddr.octets() } else { [0; 4] },
        if fields & FIELD_DST_IP != 0 { daddr.octets() } else { [0; 4] },
        if fields & FIELD_IP_PROTO != 0 { proto } else { 0 },
        pick(FIELD_SRC_PORT, sport),
        pick(FIELD_DST_PORT, dport),
    );
    Some(custom_finish(fields, || siphash_low(seed, &b)))
}

/// The IPv6 hash under policy 3 with `fields`: as `custom4`, plus the flow
/// label (`flowlabel`, the 20 bits as a host-order number, higher bits
/// ignored), which the dissector stores in host order as under policy 2.
#[allow(clippy::too_many_arguments)]
pub fn custom6(
    fields: u32,
    seed: u32,
    saddr: Ipv6Addr,
    daddr: Ipv6Addr,
    flowlabel: u32,
    proto: u8,
    sport: u16,
    dport: u16,
) -> Option<u32> {
    if fields & FIELDS_INNER != 0 && policy2_encap(proto) {
        return None;
    }
    let pick = |bit: u32, v: u16| if fields & bit != 0 { v } else { 0 };
    let label = if fields & FIELD_FLOWLABEL != 0 { flowlabel & 0x000F_FFFF } else { 0 };
    let b = keys6(
        if fields & FIELD_SRC_IP != 0 { saddr.octets() } else { [0; 16] },
        if fields & FIELD_DST_IP != 0 { daddr.octets() } else { [0; 16] },
        label.to_ne_bytes(),
        if fields & FIELD_IP_PROTO != 0 { proto } else { 0 },
        pick(FIELD_SRC_PORT, sport),
        pick(FIELD_DST_PORT, dport),
    );
    Some(custom_finish(fields, || siphash_low(seed, &b)))
}

/// Upper bounds of a hash-threshold group with these weights, in path order:
/// `DIV_ROUND_CLOSEST_ULL((u64)cumulative_weight << 31, total) - 1`
/// (fib_rebalance(), rt6_upper_bound_set(), nh_hthr_group_rebalance()).
pub fn upper_bounds(weights: &[u32]) -> Vec<i32> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    let mut cum = 0u64;
    weights
        .iter()
        .map(|&w| {
            cum += u64::from(w);
            // DIV_ROUND_CLOSEST_ULL: (x + d/2) / d; the result fits in 31 bits.
            let b = ((cum << 31) + total / 2) / total;
            (b as i64 - 1) as i32
        })
        .collect()
}

/// Index of the path the kernel picks for `hash`: the first whose upper bound
/// is >= the hash (all paths usable). `None` only for an empty group.
pub fn select(bounds: &[i32], hash: u32) -> Option<usize> {
    bounds.iter().position(|&b| i64::from(hash) <= i64::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SipHash-2-4 reference vectors (key 00..0f, message 00..n-1) for
    /// the two lengths we hash, to pin the crate to the standard function.
    #[test]
    fn siphash_reference_vectors() {
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let msg: Vec<u8> = (0u8..64).collect();
        let run = |n: usize| {
            let mut h = SipHasher24::new_with_keys(k0, k1);
            h.write(&msg[..n]);
            h.finish()
        };
        // From the SipHash paper's vectors.h (vectors_sip64), as LE u64.
        assert_eq!(run(0), 0x726fdb47dd0e0e31);
        assert_eq!(run(8), 0x93f5f5799a932462);
    }

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn fixed_vectors() {
        // Pinned values of this implementation (checked against the running
        // kernel's next-hop choices by tests/mphash_kernel.rs and against
        // the BPF code by fastpath-bpf's tests/mphash.rs).
        let h = |p, proto, sp, dp| hash4(p, 0x12345678, v4("192.0.2.1"), v4("203.0.113.7"), proto, sp, dp).unwrap();
        let h6 = |p, fl, proto, sp, dp| {
            hash6(p, 0x12345678, v6("2001:db8::1"), v6("2001:db8:100::7"), fl, proto, sp, dp).unwrap()
        };
        let got = [h(0, 17, 1000, 53), h(1, 17, 1000, 53), h6(0, 0xabcde, 17, 1000, 53), h6(1, 0xabcde, 17, 1000, 53)];
        assert_eq!(got, FIXED, "got {got:#x?}");
    }

    const FIXED: [u32; 4] = [1584246122, 316913094, 182587674, 1509216055];

    #[test]
    fn policy_fields() {
        let (s, d) = (v4("192.0.2.1"), v4("203.0.113.7"));
        // L3 ignores everything but the addresses.
        assert_eq!(hash4(0, 7, s, d, 6, 1, 2), hash4(0, 7, s, d, 17, 3, 4));
        assert_ne!(hash4(1, 7, s, d, 6, 1, 2), hash4(1, 7, s, d, 17, 1, 2));
        assert_ne!(hash4(1, 7, s, d, 6, 1, 2), hash4(1, 7, s, d, 6, 1, 3));
        // L3 or inner L3: without an inner header, v4 is L3; an
        // encapsulation is declined.
        assert_eq!(hash4(2, 7, s, d, 6, 1, 2), hash4(0, 7, s, d, 17, 3, 4));
        assert_eq!(hash4(2, 7, s, d, 47, 0, 0), None);
        assert_eq!(hash4(3, 7, s, d, 6, 1, 2), None);
        let (s6, d6) = (v6("2001:db8::1"), v6("2001:db8::2"));
        // v6 L3 uses the label and the next header, L4 does not use the label.
        assert_ne!(hash6(0, 7, s6, d6, 1, 17, 0, 0), hash6(0, 7, s6, d6, 2, 17, 0, 0));
        assert_ne!(hash6(0, 7, s6, d6, 1, 17, 0, 0), hash6(0, 7, s6, d6, 1, 6, 0, 0));
        assert_eq!(hash6(0, 7, s6, d6, 1, 17, 5, 6), hash6(0, 7, s6, d6, 1, 17, 7, 8));
        assert_eq!(hash6(0, 7, s6, d6, 0x1_00001, 17, 0, 0), hash6(0, 7, s6, d6, 1, 17, 0, 0));
        assert_eq!(hash6(1, 7, s6, d6, 1, 17, 5, 6), hash6(1, 7, s6, d6, 2, 17, 5, 6));
        assert_eq!(hash6(3, 7, s6, d6, 1, 17, 5, 6), None);
        // v6 policy 2: label and next header as policy 0, the label stored
        // in the other byte order (a label that reads the same both ways
        // hashes the same); no ports; encapsulations declined.
        assert_ne!(hash6(2, 7, s6, d6, 1, 17, 0, 0), hash6(0, 7, s6, d6, 1, 17, 0, 0));
        assert_eq!(hash6(2, 7, s6, d6, 0, 17, 5, 6), hash6(0, 7, s6, d6, 0, 17, 0, 0));
        assert_ne!(hash6(2, 7, s6, d6, 1, 17, 0, 0), hash6(2, 7, s6, d6, 2, 17, 0, 0));
        assert_eq!(hash6(2, 7, s6, d6, 1, 41, 0, 0), None);
    }

    #[test]
    fn symmetric() {
        // Consistentify makes both directions hash alike.
        let (a, b) = (v4("192.0.2.1"), v4("203.0.113.7"));
        assert_eq!(hash4(1, 9, a, b, 6, 40000, 443), hash4(1, 9, b, a, 6, 443, 40000));
        let (a6, b6) = (v6("2001:db8::1"), v6("2001:db8:100::7"));
        assert_eq!(hash6(1, 9, a6, b6, 0, 6, 40000, 443), hash6(1, 9, b6, a6, 0, 6, 443, 40000));
        assert_eq!(hash6(0, 9, a6, b6, 5, 6, 0, 0), hash6(0, 9, b6, a6, 5, 6, 0, 0));
    }

    #[test]
    fn bounds_and_selection() {
        assert_eq!(upper_bounds(&[1, 1]), vec![(1 << 30) - 1, i32::MAX]);
        let b = upper_bounds(&[1, 2, 3]);
        assert_eq!(b[2], i32::MAX);
        assert_eq!(select(&b, 0), Some(0));
        assert_eq!(select(&b, b[0] as u32), Some(0));
        assert_eq!(select(&b, b[0] as u32 + 1), Some(1));
        assert_eq!(select(&b, i32::MAX as u32), Some(2));
    }
}
