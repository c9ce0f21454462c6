//! Packet builders. Checksums are computed here from scratch, independently
//! of the program's incremental update, so a forwarded packet's expected
//! bytes are a full recomputation.

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88A8;

pub type Mac = [u8; 6];

/// RFC 1071 ones' complement sum, complemented.
pub fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from(c[0]) << 8 };
        sum += u32::from(w);
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

pub fn eth(dst: Mac, src: Mac, proto: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(&dst);
    v.extend_from_slice(&src);
    v.extend_from_slice(&proto.to_be_bytes());
    v
}

/// A small UDP datagram; the program never looks at L4, so checksum 0.
pub fn udp(len: usize) -> Vec<u8> {
    let total = 8 + len;
    let mut v = vec![0x30, 0x39, 0x00, 0x35];
    v.extend_from_slice(&(total as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend((0..len).map(|i| (i * 7 + 1) as u8));
    v
}

#[derive(Clone)]
pub struct Ip4 {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub ttl: u8,
    pub proto: u8,
    pub id: u16,
    pub tos: u8,
    /// Flags and fragment offset as on the wire (DF = 0x4000, MF = 0x2000).
    pub frag: u16,
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Ip4 {
    pub fn new(src: [u8; 4], dst: [u8; 4]) -> Self {
        Ip4 { src, dst, ttl: 64, proto: 17, id: 0x1234, tos: 0, frag: 0x4000, options: vec![], payload: udp(18) }
    }

    pub fn bytes(&self) -> Vec<u8> {
        assert_eq!(self.options.len() % 4, 0, "options are whole 32-bit words");
        let hlen = 20 + self.options.len();
        let tot = hlen + self.payload.len();
        let mut h = vec![0x40 | (hlen / 4) as u8, self.tos];
        h.extend_from_slice(&(tot as u16).to_be_bytes());
        h.extend_from_slice(&self.id.to_be_bytes());
        h.extend_from_slice(&self.frag.to_be_bytes());
        h.extend_from_slice(&[self.ttl, self.proto, 0, 0]);
        h.extend_from_slice(&self.src);
        h.extend_from_slice(&self.dst);
        h.extend_from_slice(&self.options);
        let c = csum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(&self.payload);
        h
    }

    pub fn frame(&self, dst: Mac, src: Mac) -> Vec<u8> {
        let mut f = eth(dst, src, ETH_P_IP);
        f.extend(self.bytes());
        f
    }
}

#[derive(Clone)]
pub struct Ip6 {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub hop: u8,
    pub nexthdr: u8,
    pub payload: Vec<u8>,
}

impl Ip6 {
    pub fn new(src: [u8; 16], dst: [u8; 16]) -> Self {
        Ip6 { src, dst, hop: 64, nexthdr: 17, payload: udp(18) }
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut h = vec![0x60, 0x01, 0x23, 0x45];
        h.extend_from_slice(&(self.payload.len() as u16).to_be_bytes());
        h.extend_from_slice(&[self.nexthdr, self.hop]);
        h.extend_from_slice(&self.src);
        h.extend_from_slice(&self.dst);
        h.extend_from_slice(&self.payload);
        h
    }

    pub fn frame(&self, dst: Mac, src: Mac) -> Vec<u8> {
        let mut f = eth(dst, src, ETH_P_IPV6);
        f.extend(self.bytes());
        f
    }
}

/// Ethernet minimum frame (without FCS): what a NIC pads short frames to.
pub fn pad_to(mut f: Vec<u8>, len: usize, byte: u8) -> Vec<u8> {
    if f.len() < len {
        f.resize(len, byte);
    }
    f
}

/// Rewrites a byte range of a frame in place; for malformed inputs.
pub fn patch(mut f: Vec<u8>, at: usize, bytes: &[u8]) -> Vec<u8> {
    f[at..at + bytes.len()].copy_from_slice(bytes);
    f
}

pub fn v6(s: &str) -> [u8; 16] {
    s.parse::<std::net::Ipv6Addr>().expect("test IPv6 literal").octets()
}

pub fn v4(s: &str) -> [u8; 4] {
    s.parse::<std::net::Ipv4Addr>().expect("test IPv4 literal").octets()
}
