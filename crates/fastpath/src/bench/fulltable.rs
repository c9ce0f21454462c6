//! A synthetic full routing table: deterministic, seeded sets of IPv4 and
//! IPv6 prefixes with today's BGP prefix-length mix, written as `ip -batch`
//! input. Pure functions; `tablesync` loads them into a lab router.
//!
//! The prefixes are random public-looking space (never private, special or
//! documentation ranges, so they cannot collide with the lab's own
//! addresses); the next hops are documentation addresses, spread round-robin
//! over the gateways given. Inside a private namespace nothing is ever sent.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{bail, Context, Result};

/// (prefix length, weight in per-mille). IPv4: ~60 % /24, ~20 % /22-/23,
/// ~17 % /16-/21, ~3 % shorter, roughly the shape of the public table.
pub const MIX4: &[(u8, u32)] = &[
    (24, 600),
    (23, 90),
    (22, 110),
    (21, 50),
    (20, 45),
    (19, 35),
    (18, 15),
    (17, 10),
    (16, 15),
    // Weighted above 3 % because the generator rejects more of the short
    // prefixes (they overlap reserved space more often).
    (15, 9),
    (14, 11),
    (13, 8),
    (12, 5),
    (11, 4),
    (10, 3),
    (9, 2),
    (8, 2),
];

/// IPv6: mostly /48, then /32-/44, some /64.
pub const MIX6: &[(u8, u32)] = &[
    (48, 600),
    (44, 80),
    (40, 70),
    (36, 50),
    (33, 10),
    (32, 120),
    (29, 20),
    (64, 50),
];

/// Space the generator never uses: special-purpose, private and
/// documentation ranges, so generated routes never cover or split the
/// lab's connected networks or the addresses a test sends to.
const RESERVED4: &[(u32, u8)] = &[
    (0x0000_0000, 8),  // this network
    (0x0A00_0000, 8),  // private
    (0x6440_0000, 10), // shared address space
    (0x7F00_0000, 8),  // loopback
    (0xA9FE_0000, 16), // link local
    (0xAC10_0000, 12), // private
    (0xC000_0000, 24), // IETF protocol assignments
    (0xC000_0200, 24), // TEST-NET-1
    (0xC0A8_0000, 16), // private
    (0xC612_0000, 15), // benchmarking
    (0xC633_6400, 24), // TEST-NET-2
    (0xCB00_7100, 24), // TEST-NET-3
    (0xE000_0000, 3),  // multicast, reserved, broadcast
];

/// IPv6 prefixes are drawn from 2000::/3 minus these.
const RESERVED6: &[(u128, u8)] = &[
    (0x2001_0db8 << 96, 32), // documentation
    (0x2001_0000 << 96, 23), // IETF protocol assignments
    (0x2002 << 112, 16),     // 6to4
];

/// A small deterministic generator (splitmix64): the same seed gives the
/// same table on every machine and version, which a crate RNG would not promise.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0); the modulo bias is irrelevant here.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

fn pick_len(rng: &mut Rng, mix: &[(u8, u32)]) -> u8 {
    let total: u32 = mix.iter().map(|(_, w)| w).sum();
    let mut r = rng.below(u64::from(total)) as u32;
    for (len, w) in mix {
        if r < *w {
            return *len;
        }
        r -= w;
    }
    mix[0].0
}

fn mask4(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

fn mask6(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    }
}

/// Two prefixes overlap when one contains the other.
fn overlaps4(a: u32, alen: u8, b: u32, blen: u8) -> bool {
    let m = mask4(alen.min(blen));
    a & m == b & m
}

fn overlaps6(a: u128, alen: u8, b: u128, blen: u8) -> bool {
    let m = mask6(alen.min(blen));
    a & m == b & m
}

/// `n` distinct IPv4 prefixes (host bits zero) with the `MIX4` lengths.
pub fn prefixes4(seed: u64, n: usize) -> Vec<(Ipv4Addr, u8)> {
    let mut rng = Rng::new(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let len = pick_len(&mut rng, MIX4);
        let a = (rng.next_u64() as u32) & mask4(len);
        if RESERVED4.iter().any(|(r, rl)| overlaps4(a, len, *r, *rl)) {
            continue;
        }
        if seen.insert((a, len)) {
            out.push((Ipv4Addr::from(a), len));
        }
    }
    out
}

/// `n` distinct IPv6 prefixes in 2000::/3 with the `MIX6` lengths.
pub fn prefixes6(seed: u64, n: usize) -> Vec<(Ipv6Addr, u8)> {
    // Another stream than IPv4's for the same seed.
    let mut rng = Rng::new(seed ^ 0x6666_6666_6666_6666);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let len = pick_len(&mut rng, MIX6);
        let raw = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
        let a = ((raw >> 3) | (1u128 << 125)) & mask6(len); // 001x... = 2000::/3
        if RESERVED6.iter().any(|(r, rl)| overlaps6(a, len, *r, *rl)) {
            continue;
        }
        if seen.insert((a, len)) {
            out.push((Ipv6Addr::from(a), len));
        }
    }
    out
}

/// A gateway and the device it is reached on (`ADDR@DEV`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    pub addr: IpAddr,
    pub dev: String,
}

impl std::str::FromStr for Gateway {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Gateway> {
        let (a, dev) = s.split_once('@').context("expected ADDR@DEV")?;
        if dev.is_empty() {
            bail!("{s}: empty device name");
        }
        let addr = a.parse().with_context(|| format!("{a}: not an IP address"))?;
        Ok(Gateway { addr, dev: dev.to_string() })
    }
}

/// What one table holds.
#[derive(Debug, Clone)]
pub struct Spec {
    pub seed: u64,
    pub v4: usize,
    pub v6: usize,
    pub gw4: Vec<Gateway>,
    pub gw6: Vec<Gateway>,
}

/// The gateways the bench lab can reach (topo.rs, plus the IPv6 subnets
/// tablesync adds): two per router interface and family.
pub fn lab_gateways() -> (Vec<Gateway>, Vec<Gateway>) {
    let v4 = |a: [u8; 4], dev: &str| Gateway { addr: IpAddr::from(a), dev: dev.into() };
    let v6 = |net: u16, host: u16, dev: &str| Gateway {
        addr: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, net, 0, 0, 0, host)),
        dev: dev.into(),
    };
    (
        vec![v4([192, 0, 2, 10], "r0"), v4([192, 0, 2, 11], "r0"), v4([198, 51, 100, 10], "r1"), v4([198, 51, 100, 11], "r1")],
        vec![v6(1, 0x10, "r0"), v6(1, 0x11, "r0"), v6(2, 0x10, "r1"), v6(2, 0x11, "r1")],
    )
}

fn route_line(out: &mut String, verb: &str, prefix: &str, gw: Option<&Gateway>) {
    // Writing to a String cannot fail.
    let _ = match gw {
        Some(g) => writeln!(out, "route {verb} {prefix} via {} dev {}", g.addr, g.dev),
        None => writeln!(out, "route {verb} {prefix}"),
    };
}

/// The `ip -batch` text that adds (`verb` "add") or deletes ("del") every
/// route of `spec`; IPv4 first. Next hops go round-robin over the gateways.
pub fn batch(spec: &Spec, verb: &str) -> Result<String> {
    if (spec.v4 > 0 && spec.gw4.is_empty()) || (spec.v6 > 0 && spec.gw6.is_empty()) {
        bail!("every family with routes needs at least one gateway");
    }
    let mut out = String::with_capacity((spec.v4 + spec.v6) * 56);
    for (i, (a, l)) in prefixes4(spec.seed, spec.v4).iter().enumerate() {
        let gw = (verb != "del").then(|| &spec.gw4[i % spec.gw4.len()]);
        route_line(&mut out, verb, &format!("{a}/{l}"), gw);
    }
    for (i, (a, l)) in prefixes6(spec.seed, spec.v6).iter().enumerate() {
        let gw = (verb != "del").then(|| &spec.gw6[i % spec.gw6.len()]);
        route_line(&mut out, verb, &format!("{a}/{l}"), gw);
    }
    Ok(out)
}

/// Share of each prefix length in `lens`, for the printed summary.
pub fn length_histogram(lens: impl Iterator<Item = u8>) -> Vec<(u8, usize)> {
    let mut h = [0usize; 129];
    for l in lens {
        h[usize::from(l)] += 1;
    }
    h.iter().enumerate().filter(|(_, n)| **n > 0).map(|(l, n)| (l as u8, *n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct() {
        let a = prefixes4(7, 20_000);
        assert_eq!(a, prefixes4(7, 20_000));
        assert_ne!(a, prefixes4(8, 20_000));
        let set: HashSet<_> = a.iter().collect();
        assert_eq!(set.len(), a.len());
        let b = prefixes6(7, 5_000);
        assert_eq!(b, prefixes6(7, 5_000));
        assert_eq!(b.iter().collect::<HashSet<_>>().len(), b.len());
    }

    #[test]
    fn host_bits_zero_and_no_reserved_space() {
        for (a, l) in prefixes4(1, 50_000) {
            let a = u32::from(a);
            assert_eq!(a & !mask4(l), 0);
            assert!(!RESERVED4.iter().any(|(r, rl)| overlaps4(a, l, *r, *rl)), "{a:x}/{l}");
        }
        for (a, l) in prefixes6(1, 20_000) {
            let a = u128::from(a);
            assert_eq!(a & !mask6(l), 0);
            assert_eq!(a >> 125, 1, "inside 2000::/3");
            assert!(!RESERVED6.iter().any(|(r, rl)| overlaps6(a, l, *r, *rl)));
        }
    }

    #[test]
    fn length_mix_matches_the_spec() {
        // At full size: short prefixes saturate (there are few /8s to draw).
        let n = 1_000_000;
        let v4 = prefixes4(3, n);
        let share = |f: &dyn Fn(u8) -> bool| v4.iter().filter(|(_, l)| f(*l)).count() as f64 / n as f64;
        assert!((share(&|l| l == 24) - 0.60).abs() < 0.02);
        assert!((share(&|l| l == 22 || l == 23) - 0.20).abs() < 0.02);
        assert!((share(&|l| (16..=21).contains(&l)) - 0.17).abs() < 0.02);
        assert!((share(&|l| l < 16) - 0.03).abs() < 0.005);
        let v6 = prefixes6(3, 20_000);
        let s48 = v6.iter().filter(|(_, l)| *l == 48).count() as f64 / 20_000.0;
        assert!((s48 - 0.60).abs() < 0.03);
    }

    #[test]
    fn batch_lines() {
        let (gw4, gw6) = lab_gateways();
        let spec = Spec { seed: 1, v4: 3, v6: 2, gw4, gw6 };
        let text = batch(&spec, "add").unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("route add ") && lines[0].ends_with(" via 192.0.2.10 dev r0"));
        assert!(lines[1].ends_with(" via 192.0.2.11 dev r0"));
        assert!(lines[4].ends_with(" via 2001:db8:0:1::11 dev r0"));
        let del = batch(&spec, "del").unwrap();
        assert!(del.lines().all(|l| l.starts_with("route del ") && !l.contains("via")));
        assert!("198.51.100.10@r1".parse::<Gateway>().is_ok());
        assert!("198.51.100.10".parse::<Gateway>().is_err());
    }
}
