//! FPM framing (FRR's fpm/fpm.h): every message on the TCP stream is a
//! 4-byte header — version (1), type (1 = netlink), total length as a u16
//! in network byte order, header included — followed by the payload, here
//! one or more netlink messages in host byte order.

use thiserror::Error;

pub const HEADER_LEN: usize = 4;
pub const VERSION: u8 = 1;
pub const TYPE_NETLINK: u8 = 1;
/// The length field is a u16 and counts the header.
pub const MAX_PAYLOAD: usize = u16::MAX as usize - HEADER_LEN;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("FPM frame version {0} (only version 1 exists)")]
    Version(u8),
    #[error("FPM frame length {0} is shorter than its header")]
    Length(usize),
    #[error("FPM payload of {0} bytes does not fit one frame")]
    TooLong(usize),
}

/// One received frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub msg_type: u8,
    pub payload: Vec<u8>,
}

/// Wraps `payload` (netlink messages) into one FPM frame.
pub fn encode(payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(FrameError::TooLong(payload.len()));
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(VERSION);
    out.push(TYPE_NETLINK);
    out.extend_from_slice(&((HEADER_LEN + payload.len()) as u16).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Reassembles frames from a byte stream that TCP cuts anywhere.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out (compacted lazily).
    start: usize,
}

impl Decoder {
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, None when more bytes are needed. An error
    /// means the stream lost sync; the connection must be dropped.
    pub fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        let rest = &self.buf[self.start..];
        if rest.len() < HEADER_LEN {
            self.compact();
            return None;
        }
        if rest[0] != VERSION {
            return Some(Err(FrameError::Version(rest[0])));
        }
        let len = u16::from_be_bytes([rest[2], rest[3]]) as usize;
        if len < HEADER_LEN {
            return Some(Err(FrameError::Length(len)));
        }
        if rest.len() < len {
            self.compact();
            return None;
        }
        let frame = Frame { msg_type: rest[1], payload: rest[HEADER_LEN..len].to_vec() };
        self.start += len;
        Some(Ok(frame))
    }

    /// Bytes received but not yet part of a complete frame.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(d: &mut Decoder) -> Vec<Result<Frame, FrameError>> {
        std::iter::from_fn(|| d.next_frame()).collect()
    }

    #[test]
    fn header_is_version_type_and_big_endian_length_with_header() {
        let f = encode(&[0xaa; 300]).expect("fits");
        assert_eq!(&f[..4], &[1, 1, 0x01, 0x30]);
        assert_eq!(f.len(), 304);
    }

    #[test]
    fn frames_split_at_every_byte_reassemble() {
        let mut stream = encode(b"first").expect("fits");
        stream.extend(encode(b"").expect("fits"));
        stream.extend(encode(&[7u8; 1000]).expect("fits"));
        for cut in 0..stream.len() {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            d.push(&stream[..cut]);
            got.extend(all(&mut d));
            d.push(&stream[cut..]);
            got.extend(all(&mut d));
            let got: Vec<Frame> = got.into_iter().map(|r| r.expect("valid")).collect();
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert_eq!(got[0].payload, b"first");
            assert!(got[1].payload.is_empty());
            assert_eq!(got[2].payload, vec![7u8; 1000]);
            assert!(got.iter().all(|f| f.msg_type == TYPE_NETLINK));
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn byte_by_byte_keeps_a_partial_frame_pending() {
        let f = encode(b"abc").expect("fits");
        let mut d = Decoder::default();
        for b in &f[..f.len() - 1] {
            d.push(std::slice::from_ref(b));
            assert!(d.next_frame().is_none());
        }
        assert_eq!(d.pending(), f.len() - 1);
        d.push(&f[f.len() - 1..]);
        assert_eq!(d.next_frame(), Some(Ok(Frame { msg_type: 1, payload: b"abc".to_vec() })));
    }

    #[test]
    fn bad_version_and_short_length_are_errors() {
        let mut d = Decoder::default();
        d.push(&[2, 1, 0, 8, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Some(Err(FrameError::Version(2))));
        let mut d = Decoder::default();
        d.push(&[1, 1, 0, 3]);
        assert_eq!(d.next_frame(), Some(Err(FrameError::Length(3))));
    }

    #[test]
    fn oversized_payload_is_refused() {
        assert_eq!(encode(&vec![0; MAX_PAYLOAD + 1]), Err(FrameError::TooLong(MAX_PAYLOAD + 1)));
        assert_eq!(encode(&vec![0; MAX_PAYLOAD]).map(|f| f.len()), Ok(65535));
    }
}
