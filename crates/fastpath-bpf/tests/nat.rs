//! `bpf/lib/nat.h` against the kernel's own NAT.
//!
//! A router namespace (this test thread's) NATs real packets with an nft
//! ruleset: a client and a server namespace inject frames through AF_PACKET
//! and capture what the router sends. Then the same input frame goes
//! through `bpf/test/nat_test.bpf.c` with BPF_PROG_RUN in the router
//! namespace: it finds the conntrack entry the kernel created with
//! bpf_xdp_ct_lookup, fills an fp_nat from it, rewrites and decrements the
//! TTL. The L3/L4 bytes must equal the kernel's exactly (MACs aside: the
//! test program does not forward).
//!
//! Scenarios: SNAT with a port range, masquerade, DNAT, port forwarding,
//! DNAT + masquerade; IPv4 and IPv6; TCP (handshake, data both ways) and
//! UDP; packets crafted so that the outgoing L4 checksum (and the IPv4
//! header checksum) folds to zero, an input TCP checksum written as 0xffff,
//! and UDP without a checksum (IPv4, and IPv6 where it is not allowed).
//!
//! Needs root; skips without it unless CI=true.
//!
//!   cargo test --release -p fastpath-bpf --test nat

#[allow(dead_code)] // each test binary uses its own part of the support code
mod support;

use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use fastpath_bpf::intf::{FP_NAT_DST, FP_NAT_SRC};
use fastpath_bpf::skel::nat_test::{NatTestSkel, NatTestSkelBuilder};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, ProgramInput};

use support::netns::require_root;
use support::packet::{eth, Mac, ETH_P_IP, ETH_P_IPV6};

const XDP_PASS: u32 = 2;
const TCP: u8 = 6;
const UDP: u8 = 17;

const MAC_R0: Mac = [0x02, 0, 0, 0, 0x01, 0x0a];
const MAC_R1: Mac = [0x02, 0, 0, 0, 0x01, 0x0b];
const MAC_C: Mac = [0x02, 0, 0, 0, 0, 0xc1];
const MAC_S: Mac = [0x02, 0, 0, 0, 0, 0x51];

// ---------------------------------------------------------------- syscalls

const CLONE_NEWNET: i32 = 0x4000_0000;
const AF_PACKET: i32 = 17;
const SOCK_RAW: i32 = 3;
const ETH_P_ALL: u16 = 0x0003;
const SOL_SOCKET: i32 = 1;
const SO_RCVTIMEO: i32 = 20;
const MSG_DONTWAIT: i32 = 0x40;
const PACKET_OUTGOING: u8 = 4;

#[repr(C)]
#[derive(Default)]
struct SockaddrLl {
    family: u16,
    protocol: u16,
    ifindex: i32,
    hatype: u16,
    pkttype: u8,
    halen: u8,
    addr: [u8; 8],
}

#[repr(C)]
struct Timeval {
    sec: i64,
    usec: i64,
}

extern "C" {
    fn unshare(flags: i32) -> i32;
    fn setns(fd: i32, nstype: i32) -> i32;
    fn socket(domain: i32, ty: i32, proto: i32) -> i32;
    fn bind(fd: i32, addr: *const SockaddrLl, len: u32) -> i32;
    fn setsockopt(fd: i32, level: i32, name: i32, val: *const Timeval, len: u32) -> i32;
    fn send(fd: i32, buf: *const u8, len: usize, flags: i32) -> isize;
    fn recvfrom(fd: i32, buf: *mut u8, len: usize, flags: i32, addr: *mut SockaddrLl, alen: *mut u32) -> isize;
    fn if_nametoindex(name: *const std::os::raw::c_char) -> u32;
}

fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<()> {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(text.as_bytes()).context("writing stdin")?;
    }
    let out = child.wait_with_output().context("waiting")?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// A raw socket on one device of a named namespace: sends frames as they
/// are, receives the frames the device gets (its own sends skipped).
struct Port {
    fd: OwnedFd,
}

impl Port {
    /// Opens the socket inside `ns`, then returns the thread to `home`.
    fn open(ns: &str, dev: &str, home: &File) -> Result<Port> {
        let target = File::open(format!("/run/netns/{ns}")).with_context(|| format!("netns {ns}"))?;
        if unsafe { setns(target.as_raw_fd(), CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error()).context("setns into peer");
        }
        let port = Self::open_here(dev);
        if unsafe { setns(home.as_raw_fd(), CLONE_NEWNET) } != 0 {
            // The thread would run the rest in the wrong namespace.
            panic!("setns back to the router namespace: {}", io::Error::last_os_error());
        }
        port
    }

    fn open_here(dev: &str) -> Result<Port> {
        let name = std::ffi::CString::new(dev)?;
        let ifindex = unsafe { if_nametoindex(name.as_ptr()) };
        ensure!(ifindex != 0, "no device {dev}");
        let raw = unsafe { socket(AF_PACKET, SOCK_RAW, i32::from(ETH_P_ALL.to_be())) };
        if raw < 0 {
            return Err(io::Error::last_os_error()).context("socket(AF_PACKET)");
        }
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sll = SockaddrLl {
            family: AF_PACKET as u16,
            protocol: ETH_P_ALL.to_be(),
            ifindex: ifindex as i32,
            ..Default::default()
        };
        if unsafe { bind(raw, &sll, std::mem::size_of::<SockaddrLl>() as u32) } != 0 {
            return Err(io::Error::last_os_error()).context("bind(AF_PACKET)");
        }
        let tv = Timeval { sec: 0, usec: 100_000 };
        if unsafe { setsockopt(raw, SOL_SOCKET, SO_RCVTIMEO, &tv, std::mem::size_of::<Timeval>() as u32) } != 0 {
            return Err(io::Error::last_os_error()).context("SO_RCVTIMEO");
        }
        Ok(Port { fd })
    }

    fn recv(&self, flags: i32) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        let mut sll = SockaddrLl::default();
        let mut alen = std::mem::size_of::<SockaddrLl>() as u32;
        loop {
            let n = unsafe { recvfrom(self.fd.as_raw_fd(), buf.as_mut_ptr(), buf.len(), flags, &mut sll, &mut alen) };
            if n < 0 {
                return None;
            }
            if sll.pkttype == PACKET_OUTGOING {
                continue;
            }
            buf.truncate(n as usize);
            return Some(buf);
        }
    }

    fn drain(&self) {
        while self.recv(MSG_DONTWAIT).is_some() {}
    }

    fn send(&self, frame: &[u8]) -> Result<()> {
        let n = unsafe { send(self.fd.as_raw_fd(), frame.as_ptr(), frame.len(), 0) };
        ensure!(n == frame.len() as isize, "send: {}", io::Error::last_os_error());
        Ok(())
    }

    /// The next TCP or UDP frame the device receives (router noise such as
    /// MLD is skipped).
    fn expect_l4(&self, what: &str) -> Result<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let Some(f) = self.recv(0) else { continue };
            if l4_proto(&f).is_some() {
                return Ok(f);
            }
        }
        bail!("{what}: the router sent nothing")
    }
}

fn l4_proto(f: &[u8]) -> Option<u8> {
    let et = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    let p = match et {
        ETH_P_IP => *f.get(14 + 9)?,
        ETH_P_IPV6 => *f.get(14 + 6)?,
        _ => return None,
    };
    (p == TCP || p == UDP).then_some(p)
}

// ---------------------------------------------------------------- the lab

/// Router = this thread's own fresh namespace; client and server are named
/// namespaces with one veth each. Field order is drop order: sockets, then
/// the namespaces.
struct Lab {
    c: Port,
    s: Port,
    _peers: Peers,
}

impl Lab {
    fn new() -> Result<Lab> {
        if unsafe { unshare(CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error()).context("unshare(CLONE_NEWNET)");
        }
        let home = File::open("/proc/thread-self/ns/net").context("own netns")?;
        let tag = format!("fpnat{}", std::process::id());
        let (nc, ns) = (format!("{tag}-c"), format!("{tag}-s"));
        let mut peers = Vec::new();
        for n in [&nc, &ns] {
            run("ip", &["netns", "add", n], None)?;
            peers.push(n.clone());
        }
        // From here on a failure still deletes the namespaces (Drop).
        let guard = Peers(peers);
        let mac = |m: Mac| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        let ip = |args: &[&str]| run("ip", args, None);
        ip(&["link", "set", "lo", "up"])?;
        for (r, rmac, p, pmac, pns) in [("r0", MAC_R0, "c0", MAC_C, &nc), ("r1", MAC_R1, "s0", MAC_S, &ns)] {
            ip(&["link", "add", r, "address", &mac(rmac), "type", "veth", "peer", "name", p, "address", &mac(pmac), "netns", pns])?;
            // The peers only inject and capture: no addresses, no IPv6 chatter.
            run("ip", &["netns", "exec", pns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"], None)?;
            ip(&["-n", pns, "link", "set", p, "up"])?;
            ip(&["link", "set", r, "up"])?;
        }
        for (a, dev) in [("192.0.2.1/24", "r0"), ("198.51.100.1/24", "r1")] {
            ip(&["addr", "add", a, "dev", dev])?;
        }
        for (a, dev) in [("2001:db8:a::1/64", "r0"), ("2001:db8:b::1/64", "r1")] {
            ip(&["addr", "add", a, "dev", dev, "nodad"])?;
        }
        for (a, m, dev) in [
            ("192.0.2.10", MAC_C, "r0"),
            ("2001:db8:a::10", MAC_C, "r0"),
            ("198.51.100.20", MAC_S, "r1"),
            ("2001:db8:b::20", MAC_S, "r1"),
        ] {
            ip(&["neigh", "add", a, "lladdr", &mac(m), "dev", dev, "nud", "permanent"])?;
        }
        // All per-namespace. Liberal window tracking: the test's TCP
        // segments need not satisfy conntrack's window checks.
        run(
            "sysctl",
            &[
                "-qw",
                "net.ipv4.ip_forward=1",
                "net.ipv6.conf.all.forwarding=1",
                "net.netfilter.nf_conntrack_tcp_be_liberal=1",
            ],
            None,
        )?;
        let c = Port::open(&nc, "c0", &home)?;
        let s = Port::open(&ns, "s0", &home)?;
        Ok(Lab { c, s, _peers: guard })
    }
}

/// Deletes named namespaces on drop (their veth ends go with them).
struct Peers(Vec<String>);

impl Drop for Peers {
    fn drop(&mut self) {
        for n in self.0.iter().rev() {
            let _ = run("ip", &["netns", "del", n], None);
        }
    }
}

// ---------------------------------------------------------------- packets

fn addr(s: &str) -> Vec<u8> {
    match s.parse::<std::net::IpAddr>().expect("test address literal") {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Ones' complement sum of big-endian 16-bit words, folded, not complemented.
/// An odd length is padded with a zero byte, as the checksum rules say.
fn sum16(parts: &[&[u8]]) -> u16 {
    let mut all = parts.concat();
    if all.len() % 2 == 1 {
        all.push(0);
    }
    let mut s: u64 = all.chunks(2).map(|w| u64::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while s > 0xFFFF {
        s = (s & 0xFFFF) + (s >> 16);
    }
    s as u16
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Csum {
    /// Full checksum as a sender computes it (UDP: zero sent as 0xffff).
    Full,
    /// UDP without a checksum.
    None,
    /// Zero written as 0xffff (the input must sum to zero; TCP).
    NegZero,
}

#[derive(Clone, Debug)]
struct Tuple {
    src: Vec<u8>,
    dst: Vec<u8>,
    sport: u16,
    dport: u16,
}

impl Tuple {
    fn reversed(&self) -> Tuple {
        Tuple { src: self.dst.clone(), dst: self.src.clone(), sport: self.dport, dport: self.sport }
    }

    fn of_frame(f: &[u8]) -> Tuple {
        let (src, dst, l4) = if f[12..14] == ETH_P_IP.to_be_bytes() {
            (f[26..30].to_vec(), f[30..34].to_vec(), 34)
        } else {
            (f[22..38].to_vec(), f[38..54].to_vec(), 54)
        };
        let port = |o: usize| u16::from_be_bytes([f[l4 + o], f[l4 + o + 1]]);
        Tuple { src, dst, sport: port(0), dport: port(2) }
    }
}

#[derive(Clone, Debug)]
struct Pkt {
    t: Tuple,
    proto: u8,
    /// TCP: seq, ack, flags.
    tcp: (u32, u32, u8),
    payload: Vec<u8>,
    csum: Csum,
    ip_id: u16,
    /// The L4 (and IPv4 header) checksum the router must send, when the
    /// case is about an edge value.
    want_sent: Option<(u16, Option<u16>)>,
}

impl Pkt {
    fn v6(&self) -> bool {
        self.t.src.len() == 16
    }

    fn pseudo(&self, l4_len: usize) -> Vec<u8> {
        let mut p = [self.t.src.as_slice(), self.t.dst.as_slice()].concat();
        if self.v6() {
            p.extend_from_slice(&(l4_len as u32).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, self.proto]);
        } else {
            p.extend_from_slice(&[0, self.proto]);
            p.extend_from_slice(&(l4_len as u16).to_be_bytes());
        }
        p
    }

    /// L4 header and payload with a zero checksum field.
    fn l4_raw(&self) -> Vec<u8> {
        let mut l4 = Vec::new();
        l4.extend_from_slice(&self.t.sport.to_be_bytes());
        l4.extend_from_slice(&self.t.dport.to_be_bytes());
        if self.proto == TCP {
            let (seq, ack, flags) = self.tcp;
            l4.extend_from_slice(&seq.to_be_bytes());
            l4.extend_from_slice(&ack.to_be_bytes());
            l4.extend_from_slice(&[5 << 4, flags, 0xFF, 0xFF, 0, 0, 0, 0]);
        } else {
            l4.extend_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        }
        l4.extend_from_slice(&self.payload);
        l4
    }

    fn check_at(&self) -> usize {
        if self.proto == TCP {
            16
        } else {
            6
        }
    }

    /// The ones' complement sum the checksum must cancel.
    fn l4_sum(&self) -> u16 {
        let l4 = self.l4_raw();
        sum16(&[&self.pseudo(l4.len()), &l4])
    }

    fn l4(&self) -> Vec<u8> {
        let mut l4 = self.l4_raw();
        let full = !self.l4_sum();
        let c = match self.csum {
            Csum::None => 0,
            Csum::Full if self.proto == UDP && full == 0 => 0xFFFF,
            Csum::Full => full,
            Csum::NegZero => {
                assert_eq!(full, 0, "NegZero needs an input that sums to zero");
                0xFFFF
            }
        };
        let at = self.check_at();
        l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
        l4
    }

    fn ip4_header(&self, ttl: u8, l4_len: usize) -> Vec<u8> {
        let mut h = vec![0x45, 0];
        h.extend_from_slice(&((20 + l4_len) as u16).to_be_bytes());
        h.extend_from_slice(&self.ip_id.to_be_bytes());
        h.extend_from_slice(&[0x40, 0, ttl, self.proto, 0, 0]);
        h.extend_from_slice(&self.t.src);
        h.extend_from_slice(&self.t.dst);
        h
    }

    fn frame(&self, dmac: Mac, smac: Mac) -> Vec<u8> {
        let l4 = self.l4();
        if self.v6() {
            let mut f = eth(dmac, smac, ETH_P_IPV6);
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            f.extend_from_slice(&[self.proto, 64]);
            f.extend_from_slice(&self.t.src);
            f.extend_from_slice(&self.t.dst);
            f.extend(l4);
            f
        } else {
            let mut h = self.ip4_header(64, l4.len());
            let c = !sum16(&[&h]);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            let mut f = eth(dmac, smac, ETH_P_IP);
            f.extend(h);
            f.extend(l4);
            f
        }
    }

    /// Sets the payload's last word so this packet, sent as `out`, carries an
    /// L4 sum of zero (checksum 0x0000 for TCP, 0xffff for UDP), and for IPv4
    /// the IP ID so the header checksum after the TTL decrement is 0x0000.
    fn tune_out_zero(&mut self, out: &Tuple) {
        let n = self.payload.len();
        self.payload[n - 2..].copy_from_slice(&[0, 0]);
        let o = Pkt { t: out.clone(), ..self.clone() };
        let w = 0xFFFF - o.l4_sum();
        self.payload[n - 2..].copy_from_slice(&w.to_be_bytes());
        if !self.v6() {
            self.ip_id = 0;
            let o = Pkt { t: out.clone(), ..self.clone() };
            let h = o.ip4_header(63, o.l4_raw().len());
            self.ip_id = 0xFFFF - sum16(&[&h]);
        }
        let l4 = if self.proto == TCP { 0x0000 } else { 0xFFFF };
        self.want_sent = Some((l4, (!self.v6()).then_some(0x0000)));
    }

    /// Makes the input itself sum to zero (for NegZero).
    fn tune_in_zero(&mut self) {
        let n = self.payload.len();
        self.payload[n - 2..].copy_from_slice(&[0, 0]);
        let w = 0xFFFF - self.l4_sum();
        self.payload[n - 2..].copy_from_slice(&w.to_be_bytes());
    }
}

// ---------------------------------------------------------------- scenarios

struct Scenario {
    name: &'static str,
    /// nft ruleset (both families).
    rules: &'static str,
    /// Where the client sends (IPv4, IPv6) and to which port.
    dst4: &'static str,
    dst6: &'static str,
    dport: u16,
    /// What the server must see: source (None = unchanged), destination, port.
    out_src4: Option<&'static str>,
    out_src6: Option<&'static str>,
    out_dport: u16,
    /// Accepted source ports after SNAT (None = unchanged).
    out_sports: Option<(u16, u16)>,
    /// fp_nat flags of an original-direction packet.
    flags: u32,
}

const SERVER4: &str = "198.51.100.20";
const SERVER6: &str = "2001:db8:b::20";
const CLIENT4: &str = "192.0.2.10";
const CLIENT6: &str = "2001:db8:a::10";

const SNAT: &str = r#"
table ip fpnat { chain post { type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto { tcp, udp } snat to 198.51.100.100:40000-40099
  }
}
table ip6 fpnat { chain post { type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto { tcp, udp } snat to [2001:db8:b::100]:40000-40099
  }
}
"#;

const MASQ: &str = r#"
table ip fpnat { chain post { type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" masquerade
  }
}
table ip6 fpnat { chain post { type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" masquerade
  }
}
"#;

const DNAT: &str = r#"
table ip fpnat { chain pre { type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip daddr 192.0.2.1 dnat to 198.51.100.20
  }
}
table ip6 fpnat { chain pre { type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip6 daddr 2001:db8:a::1 dnat to 2001:db8:b::20
  }
}
"#;

const PORTFWD: &str = r#"
table ip fpnat { chain pre { type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip daddr 192.0.2.1 meta l4proto { tcp, udp } th dport 8080 dnat to 198.51.100.20:80
  }
}
table ip6 fpnat { chain pre { type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip6 daddr 2001:db8:a::1 meta l4proto { tcp, udp } th dport 8080 dnat to [2001:db8:b::20]:80
  }
}
"#;

const BOTH: &str = r#"
table ip fpnat {
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip daddr 192.0.2.1 meta l4proto { tcp, udp } th dport 8080 dnat to 198.51.100.20:80
  }
  chain post { type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto { tcp, udp } masquerade to :50000-50099
  }
}
table ip6 fpnat {
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip6 daddr 2001:db8:a::1 meta l4proto { tcp, udp } th dport 8080 dnat to [2001:db8:b::20]:80
  }
  chain post { type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto { tcp, udp } masquerade to :50000-50099
  }
}
"#;

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "snat",
            rules: SNAT,
            dst4: SERVER4,
            dst6: SERVER6,
            dport: 7000,
            out_src4: Some("198.51.100.100"),
            out_src6: Some("2001:db8:b::100"),
            out_dport: 7000,
            out_sports: Some((40000, 40099)),
            flags: FP_NAT_SRC,
        },
        Scenario {
            name: "masquerade",
            rules: MASQ,
            dst4: SERVER4,
            dst6: SERVER6,
            dport: 7000,
            out_src4: Some("198.51.100.1"),
            out_src6: Some("2001:db8:b::1"),
            out_dport: 7000,
            out_sports: None,
            flags: FP_NAT_SRC,
        },
        Scenario {
            name: "dnat",
            rules: DNAT,
            dst4: "192.0.2.1",
            dst6: "2001:db8:a::1",
            dport: 7000,
            out_src4: None,
            out_src6: None,
            out_dport: 7000,
            out_sports: None,
            flags: FP_NAT_DST,
        },
        Scenario {
            name: "port-forward",
            rules: PORTFWD,
            dst4: "192.0.2.1",
            dst6: "2001:db8:a::1",
            dport: 8080,
            out_src4: None,
            out_src6: None,
            out_dport: 80,
            out_sports: None,
            flags: FP_NAT_DST,
        },
        Scenario {
            name: "port-forward+masquerade",
            rules: BOTH,
            dst4: "192.0.2.1",
            dst6: "2001:db8:a::1",
            dport: 8080,
            out_src4: Some("198.51.100.1"),
            out_src6: Some("2001:db8:b::1"),
            out_dport: 80,
            out_sports: Some((50000, 50099)),
            flags: FP_NAT_SRC | FP_NAT_DST,
        },
    ]
}

// ---------------------------------------------------------------- the comparison

struct Prog {
    skel: NatTestSkel<'static>,
    _obj: Box<MaybeUninit<OpenObject>>,
}

impl Prog {
    fn load() -> Result<Prog> {
        let mut obj = Box::new(MaybeUninit::uninit());
        // The box outlives the skeleton (field order) and keeps its address.
        let obj_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *(obj.as_mut() as *mut _) };
        let open = NatTestSkelBuilder::default().open(obj_ref).context("open nat_test")?;
        let skel = open.load().context("load nat_test (verifier)")?;
        Ok(Prog { skel, _obj: obj })
    }

    /// The rewrite of `frame` and the fp_nat flags used.
    fn run(&mut self, frame: &[u8]) -> Result<(Vec<u8>, u32)> {
        let mut out = vec![0u8; frame.len()];
        let res = self
            .skel
            .progs
            .fp_nat_test
            .test_run(ProgramInput { data_in: Some(frame), data_out: Some(&mut out), ..Default::default() })
            .context("BPF_PROG_RUN")?;
        let bss = self.skel.maps.bss_data.as_deref().context("bss not mmapped")?;
        ensure!(
            res.return_value == XDP_PASS,
            "nat_test refused: out_err {} ct_err {} status {:#x}",
            bss.out_err,
            bss.out_ct_err,
            bss.out_status
        );
        let data = res.data.context("no data out")?.to_vec();
        Ok((data, bss.out_nat.flags))
    }
}

struct Flow<'a> {
    lab: &'a Lab,
    prog: &'a mut Prog,
    sc: &'a Scenario,
    proto: u8,
    orig_in: Tuple,
    orig_out: Option<Tuple>,
    steps: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Dir {
    Orig,
    Reply,
}

impl Flow<'_> {
    fn tuples(&self, d: Dir) -> (Tuple, Tuple) {
        let out = self.orig_out.clone().expect("first packet goes original");
        match d {
            Dir::Orig => (self.orig_in.clone(), out),
            Dir::Reply => (out.reversed(), self.orig_in.reversed()),
        }
    }

    fn pkt(&self, d: Dir, tcp: (u32, u32, u8), payload: usize) -> Pkt {
        let t = match (d, &self.orig_out) {
            (Dir::Orig, _) => self.orig_in.clone(),
            (Dir::Reply, Some(o)) => o.reversed(),
            (Dir::Reply, None) => panic!("reply before the first packet"),
        };
        let payload = (0..payload).map(|i| (i as u8).wrapping_mul(37).wrapping_add(self.steps as u8)).collect();
        Pkt { t, proto: self.proto, tcp, payload, csum: Csum::Full, ip_id: 0x1000 + self.steps as u16, want_sent: None }
    }

    /// Sends `p` through the kernel and through nat.h; both must agree.
    fn step(&mut self, what: &str, d: Dir, p: &Pkt) -> Result<()> {
        self.steps += 1;
        let ctx = || format!("{} {} {}: {what}", self.sc.name, if self.proto == TCP { "tcp" } else { "udp" }, if p.v6() { "v6" } else { "v4" });
        let (tx, rx, frame) = match d {
            Dir::Orig => (&self.lab.c, &self.lab.s, p.frame(MAC_R0, MAC_C)),
            Dir::Reply => (&self.lab.s, &self.lab.c, p.frame(MAC_R1, MAC_S)),
        };
        rx.drain();
        tx.send(&frame).with_context(ctx)?;
        let kernel = rx.expect_l4(&ctx())?;
        if self.orig_out.is_none() {
            let out = Tuple::of_frame(&kernel);
            self.check_mapping(&out).with_context(ctx)?;
            self.orig_out = Some(out);
        }
        let (_, want_out) = self.tuples(d);
        let seen = Tuple::of_frame(&kernel);
        ensure!(
            seen.src == want_out.src && seen.dst == want_out.dst && seen.sport == want_out.sport && seen.dport == want_out.dport,
            "{}: kernel sent {seen:?}, expected {want_out:?}",
            ctx()
        );
        if let Some((l4, ip)) = p.want_sent {
            let (l3, at) = (if p.v6() { 54 } else { 34 }, p.check_at());
            let sent = u16::from_be_bytes([kernel[l3 + at], kernel[l3 + at + 1]]);
            ensure!(sent == l4, "{}: the kernel sent L4 checksum {sent:#06x}, the case wants {l4:#06x}", ctx());
            if let Some(ip) = ip {
                let sent = u16::from_be_bytes([kernel[24], kernel[25]]);
                ensure!(sent == ip, "{}: the kernel sent IP checksum {sent:#06x}, the case wants {ip:#06x}", ctx());
            }
        }
        let (bpf, flags) = self.prog.run(&frame).with_context(ctx)?;
        let want_flags = match d {
            Dir::Orig => self.sc.flags,
            // A reply undoes each manip on the other end of the tuple.
            Dir::Reply => ((self.sc.flags & FP_NAT_SRC) << 1) | ((self.sc.flags & FP_NAT_DST) >> 1),
        };
        ensure!(flags == want_flags, "{}: fp_nat flags {flags:#x}, expected {want_flags:#x}", ctx());
        ensure!(
            bpf[14..] == kernel[14..],
            "{}: bytes differ\n kernel {}\n nat.h  {}",
            ctx(),
            hex(&kernel[14..]),
            hex(&bpf[14..])
        );
        Ok(())
    }

    fn check_mapping(&self, out: &Tuple) -> Result<()> {
        let v6 = self.orig_in.src.len() == 16;
        let want_src = match if v6 { self.sc.out_src6 } else { self.sc.out_src4 } {
            Some(a) => addr(a),
            None => self.orig_in.src.clone(),
        };
        let want_dst = addr(if v6 { SERVER6 } else { SERVER4 });
        ensure!(out.src == want_src && out.dst == want_dst, "kernel NATed to {out:?}");
        ensure!(out.dport == self.sc.out_dport, "kernel sent to port {}", out.dport);
        match self.sc.out_sports {
            Some((lo, hi)) => ensure!((lo..=hi).contains(&out.sport), "source port {} outside {lo}-{hi}", out.sport),
            None => ensure!(out.sport == self.orig_in.sport, "source port changed to {}", out.sport),
        }
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH_ACK: u8 = 0x18;

fn tcp_flow(f: &mut Flow) -> Result<()> {
    let (c_isn, s_isn) = (0x1000_0000u32, 0x7000_0000u32);
    let (mut cs, mut ss) = (c_isn + 1, s_isn + 1);
    let syn = f.pkt(Dir::Orig, (c_isn, 0, SYN), 0);
    f.step("SYN", Dir::Orig, &syn)?;
    let synack = f.pkt(Dir::Reply, (s_isn, cs, SYN | ACK), 0);
    f.step("SYN-ACK", Dir::Reply, &synack)?;
    let ack = f.pkt(Dir::Orig, (cs, ss, ACK), 0);
    f.step("ACK", Dir::Orig, &ack)?;

    for round in 0..2 {
        let tuned = round == 1;
        let mut p = f.pkt(Dir::Orig, (cs, ss, PSH_ACK), 40);
        if tuned {
            p.tune_out_zero(&f.tuples(Dir::Orig).1);
        }
        f.step(if tuned { "data, sent checksums fold to 0" } else { "data" }, Dir::Orig, &p)?;
        cs += 40;
        let mut p = f.pkt(Dir::Reply, (ss, cs, PSH_ACK), 30);
        if tuned {
            p.tune_out_zero(&f.tuples(Dir::Reply).1);
        }
        f.step(if tuned { "reply data, sent checksums fold to 0" } else { "reply data" }, Dir::Reply, &p)?;
        ss += 30;
    }
    // Zero written as 0xffff by the sender: the kernel's arithmetic takes it
    // as zero, and so must ours.
    for d in [Dir::Orig, Dir::Reply] {
        let (seq, ack) = if d == Dir::Orig { (cs, ss) } else { (ss, cs) };
        let mut p = f.pkt(d, (seq, ack, PSH_ACK), 20);
        p.tune_in_zero();
        p.csum = Csum::NegZero;
        f.step("checksum 0xffff in", d, &p)?;
        if d == Dir::Orig {
            cs += 20;
        } else {
            ss += 20;
        }
    }
    Ok(())
}

fn udp_flow(f: &mut Flow) -> Result<()> {
    let p = f.pkt(Dir::Orig, (0, 0, 0), 24);
    f.step("datagram", Dir::Orig, &p)?;
    let p = f.pkt(Dir::Reply, (0, 0, 0), 33);
    f.step("reply", Dir::Reply, &p)?;
    for d in [Dir::Orig, Dir::Reply] {
        let mut p = f.pkt(d, (0, 0, 0), 24);
        p.tune_out_zero(&f.tuples(d).1);
        f.step("sent checksum folds to 0 (0xffff on the wire)", d, &p)?;
        let mut p = f.pkt(d, (0, 0, 0), 24);
        p.tune_in_zero();
        f.step("checksum 0xffff in", d, &p)?;
    }
    // IPv6 forbids it, but the kernel forwards and NATs it all the same.
    for d in [Dir::Orig, Dir::Reply] {
        let mut p = f.pkt(d, (0, 0, 0), 17);
        p.csum = Csum::None;
        f.step("no checksum", d, &p)?;
    }
    Ok(())
}

#[test]
fn nat_matches_kernel() {
    if !require_root("nat_matches_kernel") {
        return;
    }
    let lab = Lab::new().expect("lab");
    let mut prog = Prog::load().expect("nat_test");
    let mut sport = 20000u16;
    let mut done = 0;
    for sc in scenarios() {
        run("nft", &["flush", "ruleset"], None).expect("nft flush");
        run("nft", &["-f", "-"], Some(sc.rules)).unwrap_or_else(|e| panic!("{}: {e:#}", sc.name));
        for v6 in [false, true] {
            for proto in [TCP, UDP] {
                sport += 1;
                let (src, dst) = if v6 { (CLIENT6, sc.dst6) } else { (CLIENT4, sc.dst4) };
                let mut f = Flow {
                    lab: &lab,
                    prog: &mut prog,
                    sc: &sc,
                    proto,
                    orig_in: Tuple { src: addr(src), dst: addr(dst), sport, dport: sc.dport },
                    orig_out: None,
                    steps: 0,
                };
                let r = if proto == TCP { tcp_flow(&mut f) } else { udp_flow(&mut f) };
                r.unwrap_or_else(|e| panic!("{e:#}"));
                done += f.steps;
            }
        }
    }
    eprintln!("{done} packets: nat.h wrote the kernel's bytes");
}
