//! Root-only: `fastpath_core::mphash` against the running kernel's ECMP
//! choice on the real forwarding path.
//!
//! `ip route get ... iif` is not enough: for IPv6 it looks the route up
//! without an skb (inet6_rtm_getroute() passes NULL to the input lookup), so
//! it exercises a different branch of rt6_multipath_hash(). Instead real
//! frames are forwarded. One private namespace (the test thread unshares
//! it, so it disappears with the thread) holds:
//!
//!   s0 ──veth── r0 [router] r1 ──veth── r1p
//!
//! Frames are written on s0 with a packet socket (so the skb carries no
//! socket hash: skb->l4_hash stays clear, as for a NIC without RSS hints),
//! the kernel forwards them out of r1 to one of three gateways whose
//! permanent neighbour entries have distinct MACs, and a packet socket on
//! r1p reads which MAC — which next hop — each flow went to. For every flow
//! the Rust reference's hash plus the hash-threshold rule (`select` below)
//! must name the same next hop: IPv4 and IPv6, policies 0, 1, 2 and 3
//! with several hash field sets (not for the encapsulations policy 2, or
//! policy 3 with inner fields, would look into), weighted
//! multipath routes and `ip nexthop` groups, several protocols.
//!
//!   CARGO_TARGET_DIR=/work/tgt-mphash cargo test -p fastpath-core --test mphash_kernel -- --nocapture

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;

mod support;

use support::{have_root, in_new_netns, out, sh};

use fastpath_core::mphash::{custom4, custom6, hash4, hash6, policy2_encap, select, upper_bounds, FIELDS_DEFAULT, FIELDS_INNER};

const FLOWS: usize = 1200;
const GW_MACS: [[u8; 6]; 3] = [[2, 0, 0, 0, 1, 1], [2, 0, 0, 0, 1, 2], [2, 0, 0, 0, 1, 3]];
const WEIGHTS: [u32; 3] = [1, 2, 3];
const S0_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x10];
const R0_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x20];






/// splitmix64: reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

#[derive(Clone, Copy, Debug)]
enum Addrs {
    V4(Ipv4Addr, Ipv4Addr),
    V6(Ipv6Addr, Ipv6Addr, u32),
}

#[derive(Clone, Copy, Debug)]
struct Flow {
    addrs: Addrs,
    proto: u8,
    /// The first four L4 bytes: ports for TCP/UDP, anything for the rest.
    l4: [u8; 4],
}

impl Flow {
    /// Ports as the dissector would read them (only TCP/UDP here).
    fn ports(&self) -> (u16, u16) {
        match self.proto {
            6 | 17 => (u16::from_be_bytes([self.l4[0], self.l4[1]]), u16::from_be_bytes([self.l4[2], self.l4[3]])),
            _ => (0, 0),
        }
    }

    /// None: the reference declines (an encapsulation under policy 2, or
    /// under policy 3 with inner fields). `fields`: policy 3's.
    fn hash(&self, policy: u32, fields: u32, seed: u32) -> Option<u32> {
        let (sp, dp) = self.ports();
        match (self.addrs, policy) {
            (Addrs::V4(s, d), 3) => custom4(fields, seed, s, d, self.proto, sp, dp),
            (Addrs::V6(s, d, fl), 3) => custom6(fields, seed, s, d, fl, self.proto, sp, dp),
            (Addrs::V4(s, d), _) => hash4(policy, seed, s, d, self.proto, sp, dp),
            (Addrs::V6(s, d, fl), _) => hash6(policy, seed, s, d, fl, self.proto, sp, dp),
        }
    }

    /// An Ethernet frame to r0 carrying this flow, tagged with `id` in the
    /// L4 bytes 4..8 so the forwarded copy can be recognised.
    fn frame(&self, id: u32) -> Vec<u8> {
        let mut l4 = Vec::from(self.l4);
        l4.extend_from_slice(&id.to_be_bytes());
        l4.resize(20, 0);
        let mut f = Vec::from(R0_MAC);
        f.extend_from_slice(&S0_MAC);
        match self.addrs {
            Addrs::V4(s, d) => {
                f.extend_from_slice(&[0x08, 0x00]);
                let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, self.proto, 0, 0];
                ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
                ip.extend_from_slice(&s.octets());
                ip.extend_from_slice(&d.octets());
                let mut sum: u32 = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
                while sum > 0xFFFF {
                    sum = (sum & 0xFFFF) + (sum >> 16);
                }
                ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
                f.extend_from_slice(&ip);
            }
            Addrs::V6(s, d, fl) => {
                f.extend_from_slice(&[0x86, 0xDD]);
                f.extend_from_slice(&(0x6000_0000 | (fl & 0xF_FFFF)).to_be_bytes());
                f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
                f.extend_from_slice(&[self.proto, 64]);
                f.extend_from_slice(&s.octets());
                f.extend_from_slice(&d.octets());
            }
        }
        f.extend_from_slice(&l4);
        f
    }
}

/// The tag and the gateway index of a frame seen on r1p, if it is one of ours.
fn parse_forwarded(f: &[u8]) -> Option<(u32, usize)> {
    let gw = GW_MACS.iter().position(|m| f.len() >= 6 && &f[..6] == m)?;
    let l4 = match u16::from_be_bytes([*f.get(12)?, *f.get(13)?]) {
        0x0800 => 14 + usize::from(f.get(14)? & 0x0F) * 4,
        0x86DD => 14 + 40,
        _ => return None,
    };
    let tag = f.get(l4 + 4..l4 + 8)?;
    Some((u32::from_be_bytes([tag[0], tag[1], tag[2], tag[3]]), gw))
}

struct PacketSocket(OwnedFd);

impl PacketSocket {
    fn bind(ifname: &str) -> Self {
        let name = std::ffi::CString::new(ifname).expect("name");
        // SAFETY: plain syscalls on a socket we own; the sockaddr and the
        // timeval live across the calls that read them.
        unsafe {
            let ifindex = libc::if_nametoindex(name.as_ptr());
            assert_ne!(ifindex, 0, "no interface {ifname}");
            let proto = (libc::ETH_P_ALL as u16).to_be();
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto));
            assert!(fd >= 0, "socket(AF_PACKET): {}", std::io::Error::last_os_error());
            let fd = OwnedFd::from_raw_fd(fd);
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex as i32;
            let rc = libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(rc, 0, "bind {ifname}: {}", std::io::Error::last_os_error());
            let tv = libc::timeval { tv_sec: 2, tv_usec: 0 };
            let rc = libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
            assert_eq!(rc, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
            PacketSocket(fd)
        }
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
        assert_eq!(n, frame.len() as isize, "send: {}", std::io::Error::last_os_error());
    }

    /// One frame, or None after the receive timeout.
    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        (n >= 0).then_some(n as usize)
    }
}

fn mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn gw4(i: usize) -> String {
    format!("198.51.100.{}", i + 1)
}

fn gw6(i: usize) -> String {
    format!("2001:db8:1::{}", i + 1)
}

fn setup() {
    // One queue each: with several TX queues the kernel would hash the skb
    // to pick one, and that software hash (l4_hash set) is what policy 1
    // would then reuse instead of computing its own.
    sh("ip link add s0 numtxqueues 1 numrxqueues 1 type veth peer name r0 numtxqueues 1 numrxqueues 1");
    sh("ip link add r1 numtxqueues 1 numrxqueues 1 type veth peer name r1p numtxqueues 1 numrxqueues 1");
    sh(&format!("ip link set s0 address {}", mac(&S0_MAC)));
    sh(&format!("ip link set r0 address {}", mac(&R0_MAC)));
    for d in ["s0", "r1p"] {
        sh(&format!("sysctl -qw net.ipv6.conf.{d}.disable_ipv6=1"));
    }
    for d in ["s0", "r0", "r1", "r1p"] {
        sh(&format!("ip link set {d} up"));
    }
    sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1");
    sh("sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.r0.rp_filter=0");
    sh("ip addr add 192.0.2.254/24 dev r0");
    sh("ip addr add 198.51.100.254/24 dev r1");
    sh("ip -6 addr add 2001:db8:2::fe/64 dev r0 nodad");
    sh("ip -6 addr add 2001:db8:1::fe/64 dev r1 nodad");
    for (i, m) in GW_MACS.iter().enumerate() {
        sh(&format!("ip neigh add {} lladdr {} dev r1 nud permanent", gw4(i), mac(m)));
        sh(&format!("ip -6 neigh add {} lladdr {} dev r1 nud permanent", gw6(i), mac(m)));
        sh(&format!("ip nexthop add id {} via {} dev r1", i + 1, gw4(i)));
        sh(&format!("ip nexthop add id {} via {} dev r1", i + 4, gw6(i)));
    }
    let group = |base: usize| {
        (0..3).map(|i| format!("{},{}", base + i, WEIGHTS[i])).collect::<Vec<_>>().join("/")
    };
    sh(&format!("ip nexthop add id 10 group {}", group(1)));
    sh(&format!("ip nexthop add id 20 group {}", group(4)));
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Multipath,
    NexthopGroup,
}

/// Installs the route and returns the gateway index and weight of each
/// path in the order the kernel holds them (as it dumps them).
fn install(v6: bool, kind: Kind) -> Vec<(usize, u32)> {
    let (fam, prefix, gw): (&str, &str, fn(usize) -> String) =
        if v6 { ("-6", "2001:db8:100::/64", gw6) } else { ("-4", "203.0.113.0/24", gw4) };
    // A multipath route and a nexthop-object route do not replace each other.
    let _ = Command::new("sh").arg("-c").arg(format!("ip {fam} route del {prefix} 2>/dev/null")).status();
    match kind {
        Kind::Multipath => {
            let hops: String =
                (0..3).map(|i| format!(" nexthop via {} dev r1 weight {}", gw(i), WEIGHTS[i])).collect();
            sh(&format!("ip {fam} route add {prefix}{hops}"));
            let shown = out(&format!("ip {fam} route show {prefix}"));
            let toks: Vec<&str> = shown.split_whitespace().collect();
            let order: Vec<(usize, u32)> = toks
                .windows(2)
                .filter(|w| w[0] == "via")
                .map(|w| {
                    let i = (0..3).find(|&i| gw(i) == w[1]).unwrap_or_else(|| panic!("gateway {} in {shown}", w[1]));
                    (i, WEIGHTS[i])
                })
                .collect();
            assert_eq!(order.len(), 3, "three paths in {shown}");
            order
        }
        Kind::NexthopGroup => {
            let (id, base) = if v6 { (20, 4) } else { (10, 1) };
            sh(&format!("ip {fam} route add {prefix} nhid {id}"));
            let shown = out(&format!("ip nexthop show id {id}"));
            let toks: Vec<&str> = shown.split_whitespace().collect();
            let spec = toks.windows(2).find(|w| w[0] == "group").map(|w| w[1]).expect("group in nexthop show");
            spec.split('/')
                .map(|e| {
                    let mut it = e.split(',');
                    let nh: usize = it.next().and_then(|s| s.parse().ok()).expect("nexthop id");
                    let w: u32 = it.next().map_or(1, |s| s.parse().expect("weight"));
                    (nh - base, w)
                })
                .collect()
        }
    }
}

fn flows(v6: bool, rng: &mut Rng) -> Vec<Flow> {
    let protos: &[u8] = if v6 { &[17, 17, 17, 6, 6, 58, 47, 89, 253] } else { &[17, 17, 17, 6, 6, 1, 47, 89, 253] };
    (0..FLOWS)
        .map(|_| {
            let proto = rng.pick(protos);
            let r = rng.next();
            let mut l4 = (r as u32).to_be_bytes();
            if proto == 1 || proto == 58 {
                // An echo request: not an error, so the outer header counts.
                l4[0] = if proto == 1 { 8 } else { 128 };
                l4[1] = 0;
            }
            let addrs = if v6 {
                let s = Ipv6Addr::from(0x2001_0db8_0002_0000_0000_0000_0000_0000u128 | u128::from(rng.next() as u16));
                let d = Ipv6Addr::from(0x2001_0db8_0100_0000_0000_0000_0000_0000u128 | u128::from(rng.next()));
                Addrs::V6(s, d, (r >> 32) as u32 & 0xF_FFFF)
            } else {
                let s = Ipv4Addr::new(192, 0, 2, 1 + (rng.next() % 250) as u8);
                let d = Ipv4Addr::new(203, 0, 113, (rng.next() % 256) as u8);
                Addrs::V4(s, d)
            };
            Flow { addrs, proto, l4 }
        })
        .collect()
}

/// Sends every flow through the router and checks the next hop it took.
fn check(tx: &PacketSocket, rx: &PacketSocket, flows: &[Flow], paths: &[(usize, u32)], (policy, fields, seed): (u32, u32, u32)) -> [usize; 3] {
    let weights: Vec<u32> = paths.iter().map(|p| p.1).collect();
    let mut buf = vec![0u8; 2048];
    let mut per_gw = [0usize; 3];
    for (id, flow) in flows.iter().enumerate() {
        let id = id as u32;
        tx.send(&flow.frame(id));
        let got = loop {
            let n = rx.recv(&mut buf).unwrap_or_else(|| panic!("flow {id} {flow:?} was not forwarded"));
            if let Some((tag, gw)) = parse_forwarded(&buf[..n]) {
                if tag == id {
                    break gw;
                }
            }
        };
        let bounds = upper_bounds(&weights);
        let Some(hash) = flow.hash(policy, fields, seed) else {
            let inner = policy == 2 || (policy == 3 && fields & FIELDS_INNER != 0);
            assert!(inner && policy2_encap(flow.proto), "no reference for {flow:?} (policy {policy}, fields {fields:#x})");
            per_gw[got] += 1;
            continue;
        };
        let path = select(&bounds, hash).unwrap_or_else(|| panic!("hash {hash:#x} above every bound of {weights:?}"));
        let want = paths[path].0;
        assert_eq!(
            got, want,
            "flow {id} {flow:?}: kernel chose gateway {got}, reference {want} (policy {policy}, fields {fields:#x}, seed {seed:#x})"
        );
        per_gw[got] += 1;
    }
    per_gw
}

/// (policy, fib_multipath_hash_fields, seed) per round. Fields matter to
/// policy 3 only: the default (addresses, protocol, ports), one address,
/// the ports alone, addresses with protocol and flow label (IPv4 ignores
/// the label), the default plus an inner field (encapsulations declined),
/// and an inner field alone (no outer field: one path for every flow
/// that encapsulates nothing).
const SETTINGS: [(u32, u32, u32); 12] = [
    (0, FIELDS_DEFAULT, 0x1234_5678),
    (1, FIELDS_DEFAULT, 0x1234_5678),
    (0, FIELDS_DEFAULT, 0xdead_beef),
    (1, FIELDS_DEFAULT, 7),
    (2, FIELDS_DEFAULT, 0x1234_5678),
    (2, FIELDS_DEFAULT, 7),
    (3, FIELDS_DEFAULT, 0x1234_5678),
    (3, 0x01, 7),
    (3, 0x30, 0x1234_5678),
    (3, 0x0F, 0xdead_beef),
    (3, FIELDS_DEFAULT | 0x40, 7),
    (3, 0x80, 0x1234_5678),
];

#[test]
fn reference_matches_kernel_forwarding() {
    if !have_root() {
        return;
    }
    in_new_netns(|| {
        setup();
        let tx = PacketSocket::bind("s0");
        let rx = PacketSocket::bind("r1p");
        let mut rng = Rng(0x6d70_6861_7368);
        for v6 in [false, true] {
            for kind in [Kind::Multipath, Kind::NexthopGroup] {
                let paths = install(v6, kind);
                for (policy, fields, seed) in SETTINGS {
                    let fam = if v6 { "ipv6" } else { "ipv4" };
                    sh(&format!("sysctl -qw net.{fam}.fib_multipath_hash_policy={policy}"));
                    sh(&format!("sysctl -qw net.{fam}.fib_multipath_hash_fields={fields:#x}"));
                    sh(&format!("sysctl -qw net.ipv4.fib_multipath_hash_seed={seed}"));
                    let fl = flows(v6, &mut rng);
                    let per_gw = check(&tx, &rx, &fl, &paths, (policy, fields, seed));
                    eprintln!(
                        "{fam} {kind:?} policy {policy} fields {fields:#x} seed {seed:#x}: {} flows agree, per gateway {per_gw:?}, paths {paths:?}",
                        fl.len()
                    );
                }
            }
        }
    });
}
