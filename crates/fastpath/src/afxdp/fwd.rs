//! The user-space half of forwarding one frame: parse it, check it against
//! the XDP program's verdict (struct fp_xsk_meta in front of the frame),
//! and rewrite it exactly as the kernel (and the XDP path) would: MACs,
//! TTL / hop limit - 1 with the IPv4 checksum updated incrementally, and
//! the Ethernet padding cut.

use fastpath_bpf::intf;

pub const META_LEN: usize = std::mem::size_of::<intf::fp_xsk_meta>();
const ETH_HLEN: usize = 14;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// Why a frame handed to user space is not transmitted. None of these
/// should happen (the program checked the same things); each is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// No fp_xsk_meta in front of the frame (another program's redirect?).
    Meta,
    /// The frame does not parse as what the metadata says.
    Parse,
    /// TTL / hop limit would reach 0.
    Ttl,
}

/// Transmit `len` bytes of the (rewritten) frame on `slot`'s socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tx {
    pub slot: u16,
    pub len: u32,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// `buf` = an RX descriptor's bytes: fp_xsk_meta, then the frame as
/// received. The frame to transmit starts META_LEN bytes in.
pub fn forward(buf: &mut [u8]) -> Result<Tx, Drop> {
    if buf.len() < META_LEN + ETH_HLEN {
        return Err(Drop::Parse);
    }
    let (meta, frame) = buf.split_at_mut(META_LEN);
    // SAFETY: fp_xsk_meta is plain integers and byte arrays (any bit
    // pattern is valid); read_unaligned copes with any address.
    let m: intf::fp_xsk_meta = unsafe { std::ptr::read_unaligned(meta.as_ptr() as *const intf::fp_xsk_meta) };
    if m.magic != intf::FP_XSK_META_MAGIC {
        return Err(Drop::Meta);
    }
    let l2_len = match (m.family, be16(frame, 12)) {
        (AF_INET, 0x0800) => ip4(&mut frame[ETH_HLEN..])?,
        (AF_INET6, 0x86DD) => ip6(&mut frame[ETH_HLEN..])?,
        _ => return Err(Drop::Parse),
    } + ETH_HLEN;
    frame[0..6].copy_from_slice(&m.dmac);
    frame[6..12].copy_from_slice(&m.smac);
    Ok(Tx { slot: m.egress_slot, len: l2_len as u32 })
}

/// Returns the datagram length.
fn ip4(ip: &mut [u8]) -> Result<usize, Drop> {
    if ip.len() < 20 || ip[0] != 0x45 {
        return Err(Drop::Parse);
    }
    let tot = be16(ip, 2) as usize;
    if tot < 20 || tot > ip.len() {
        return Err(Drop::Parse);
    }
    if ip[8] <= 1 {
        return Err(Drop::Ttl);
    }
    // The kernel's ip_decrease_ttl(): the TTL is the high byte of its
    // 16-bit word, so the checksum rises by 0x0100 with end-around carry.
    // Same arithmetic on the raw (network-order) word, so the same one of
    // 0x0000/0xffff comes out.
    let mut check = u16::from_ne_bytes([ip[10], ip[11]]) as u32;
    check += 0x0100u16.to_be() as u32;
    let check = (check + u32::from(check >= 0xFFFF)) as u16;
    ip[10..12].copy_from_slice(&check.to_ne_bytes());
    ip[8] -= 1;
    Ok(tot)
}

fn ip6(ip: &mut [u8]) -> Result<usize, Drop> {
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Err(Drop::Parse);
    }
    let len = 40 + be16(ip, 4) as usize;
    if len > ip.len() {
        return Err(Drop::Parse);
    }
    if ip[7] <= 1 {
        return Err(Drop::Ttl);
    }
    ip[7] -= 1;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DMAC: [u8; 6] = [2, 0, 0, 0, 2, 2];
    const SMAC: [u8; 6] = [2, 0, 0, 0, 2, 1];

    fn meta(family: u16) -> Vec<u8> {
        let m = intf::fp_xsk_meta { dmac: DMAC, smac: SMAC, egress_slot: 3, family, magic: intf::FP_XSK_META_MAGIC };
        // SAFETY: reading a plain-integer struct as bytes.
        unsafe { std::slice::from_raw_parts(&m as *const _ as *const u8, META_LEN) }.to_vec()
    }

    fn csum(h: &[u8]) -> u16 {
        let mut s: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        while s > 0xFFFF {
            s = (s & 0xFFFF) + (s >> 16);
        }
        !(s as u16)
    }

    fn ip4_frame(ttl: u8, pad: usize) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 1, 1, 0x02, 0, 0, 0, 1, 2, 0x08, 0x00];
        let mut ip = vec![0x45, 0, 0, 28, 0x12, 0x34, 0x40, 0, ttl, 17, 0, 0, 192, 0, 2, 2, 198, 51, 100, 2];
        let c = csum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend(ip);
        f.extend([0x30, 0x39, 0x00, 0x35, 0, 8, 0, 0]);
        f.extend(vec![0u8; pad]);
        f
    }

    #[test]
    fn ipv4_rewrite_matches_a_full_checksum() {
        for ttl in [2u8, 64, 255] {
            let mut buf = meta(AF_INET);
            buf.extend(ip4_frame(ttl, 18));
            let tx = forward(&mut buf).expect("forwarded");
            assert_eq!(tx, Tx { slot: 3, len: 14 + 28 });
            let f = &buf[META_LEN..];
            assert_eq!(&f[0..6], &DMAC);
            assert_eq!(&f[6..12], &SMAC);
            assert_eq!(f[14 + 8], ttl - 1);
            assert_eq!(csum(&f[14..34]), 0, "header checksum still valid");
        }
    }

    #[test]
    fn ipv6_hop_limit_and_trim() {
        let mut buf = meta(AF_INET6);
        buf.extend([2, 0, 0, 0, 1, 1, 2, 0, 0, 0, 1, 2, 0x86, 0xDD]);
        let mut ip = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        ip.extend([0u8; 32]);
        buf.extend(ip);
        buf.extend([0u8; 8 + 10]);
        let tx = forward(&mut buf).expect("forwarded");
        assert_eq!(tx.len, 14 + 48);
        assert_eq!(buf[META_LEN + 14 + 7], 63);
    }

    #[test]
    fn refuses_what_the_program_should_have_punted() {
        let mut buf = meta(AF_INET);
        buf.extend(ip4_frame(1, 0));
        assert_eq!(forward(&mut buf), Err(Drop::Ttl));
        let mut buf = meta(AF_INET6);
        buf.extend(ip4_frame(64, 0));
        assert_eq!(forward(&mut buf), Err(Drop::Parse));
        let mut buf = vec![0u8; META_LEN];
        buf.extend(ip4_frame(64, 0));
        assert_eq!(forward(&mut buf), Err(Drop::Meta));
    }
}
