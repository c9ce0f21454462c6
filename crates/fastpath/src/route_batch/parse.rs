//! The batch file: one route per line in a subset of `ip route` syntax,
//! `#` starts a comment.
//!
//! ```text
//! 198.51.100.0/24 via 192.0.2.1 [dev IF]
//! 203.0.113.0/25 dev IF
//! blackhole 2001:db8:1::/48
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use fastpath_core::model::Family;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    Gateway { gw: IpAddr, dev: Option<String> },
    Dev(String),
    Blackhole,
}

/// One route of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// 1-based line number in the file.
    pub no: usize,
    /// The line as written (without the comment).
    pub text: String,
    pub dst: IpAddr,
    pub len: u8,
    pub via: Via,
}

impl Line {
    /// `line N (`text`)`, how errors name the entry.
    pub fn name(&self) -> String {
        format!("line {} (`{}`)", self.no, self.text)
    }
}

fn prefix(s: &str, family_hint: Option<Family>) -> Result<(IpAddr, u8), String> {
    if s == "default" {
        return Ok(match family_hint {
            Some(Family::V6) => (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
            _ => (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        });
    }
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = a.parse().map_err(|_| format!("{a:?} is not an IP address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match l {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => return Err(format!("{l:?} is not a prefix length (0-{max})")),
        },
    };
    let masked = mask(addr, len);
    if masked != addr {
        return Err(format!("{s} has host bits set (did you mean {masked}/{len}?)"));
    }
    Ok((addr, len))
}

pub fn mask(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

fn line(no: usize, text: &str) -> Result<Line, String> {
    let mut toks: Vec<&str> = text.split_whitespace().collect();
    if toks.first() == Some(&"blackhole") {
        if toks.len() != 2 {
            return Err("want `blackhole PREFIX`".into());
        }
        let (dst, len) = prefix(toks[1], None)?;
        return Ok(Line { no, text: text.into(), dst, len, via: Via::Blackhole });
    }
    if toks.len() < 3 || toks.len().is_multiple_of(2) {
        return Err("want `PREFIX via ADDR [dev IF]`, `PREFIX dev IF` or `blackhole PREFIX`".into());
    }
    let dst_tok = toks.remove(0);
    let (mut gw, mut dev) = (None, None);
    for kv in toks.chunks(2) {
        match kv[0] {
            "via" if gw.is_none() => {
                gw = Some(kv[1].parse::<IpAddr>().map_err(|_| format!("gateway {:?} is not an IP address", kv[1]))?)
            }
            "dev" if dev.is_none() => dev = Some(kv[1].to_string()),
            k => return Err(format!("unexpected {k:?} (only `via ADDR` and `dev IF`, once each)")),
        }
    }
    let (dst, len) = prefix(dst_tok, gw.as_ref().map(Family::of))?;
    let via = match (gw, dev) {
        (Some(gw), dev) => {
            if Family::of(&gw) != Family::of(&dst) {
                return Err(format!("gateway {gw} is not of the prefix's address family"));
            }
            Via::Gateway { gw, dev }
        }
        (None, Some(dev)) => Via::Dev(dev),
        (None, None) => unreachable!("at least one key-value pair was parsed"),
    };
    Ok(Line { no, text: text.into(), dst, len, via })
}

/// Every route of `text`, or the first error naming its line.
pub fn parse(text: &str) -> Result<Vec<Line>, String> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<(IpAddr, u8), usize> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let no = i + 1;
        let body = raw.split('#').next().unwrap_or("").trim();
        if body.is_empty() {
            continue;
        }
        let l = line(no, body).map_err(|e| format!("line {no} (`{body}`): {e}"))?;
        if let Some(first) = seen.insert((l.dst, l.len), no) {
            return Err(format!("line {no} (`{body}`): {}/{} is already on line {first}", l.dst, l.len));
        }
        out.push(l);
    }
    if out.is_empty() {
        return Err("the batch holds no routes".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_and_comments() {
        let b = parse(
            "# upstream\n198.51.100.0/24 via 192.0.2.1 dev r1 # primary\n\n203.0.113.0/25 dev r0\nblackhole 2001:db8:1::/48\n2001:db8:2::/64 via 2001:db8::1\n",
        )
        .unwrap();
        assert_eq!(b.len(), 4);
        assert_eq!(b[0].no, 2);
        assert_eq!(b[0].text, "198.51.100.0/24 via 192.0.2.1 dev r1");
        assert_eq!(b[0].via, Via::Gateway { gw: "192.0.2.1".parse().unwrap(), dev: Some("r1".into()) });
        assert_eq!((b[1].len, &b[1].via), (25, &Via::Dev("r0".into())));
        assert_eq!((b[2].dst, b[2].len, &b[2].via), ("2001:db8:1::".parse().unwrap(), 48, &Via::Blackhole));
        assert_eq!(Family::of(&b[3].dst), Family::V6);
    }

    #[test]
    fn host_routes_and_default() {
        let b = parse("192.0.2.9 via 192.0.2.1\ndefault via 2001:db8::1\n").unwrap();
        assert_eq!(b[0].len, 32);
        assert_eq!((b[1].dst, b[1].len), ("::".parse().unwrap(), 0));
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("198.51.100.0/24 via 192.0.2.1\n198.51.100.1/24 via 192.0.2.1", "line 2", "host bits"),
            ("198.51.100.0/24", "line 1", "want"),
            ("198.51.100.0/24 via 2001:db8::1", "line 1", "family"),
            ("198.51.100.0/33 dev r0", "line 1", "prefix length"),
            ("198.51.100.0/24 gw 192.0.2.1", "line 1", "unexpected"),
            ("blackhole", "line 1", "blackhole PREFIX"),
            ("\n\n198.51.100.0/24 dev a\n198.51.100.0/24 dev b", "line 4", "already on line 3"),
            ("# nothing\n", "", "no routes"),
        ];
        for (text, line, what) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(line) && e.contains(what), "{text:?}: {e}");
        }
    }
}
