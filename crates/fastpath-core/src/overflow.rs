//! A FIB that does not fit its map, per route, without a blackhole.
//!
//! When a family has more prefixes than its LPM map holds, some are left
//! out. A left-out prefix must never be forwarded by a shorter prefix that
//! is in the map (the paper's 13.0.0.0/24 taking the default route), so the
//! nearest installed prefix covering it is turned into a punt: its slot is
//! reused, nothing new is written, and its whole range goes to the kernel,
//! which still has every route. A left-out prefix with no installed cover
//! needs nothing: a miss already punts (no_route).
//!
//! Which prefixes stay is deterministic: shortest first (then by address),
//! so covers are the ones that get a slot, and one more route of length L
//! displaces at most routes longer than L, or at the same length after it.
//! Deleting routes makes room and the next computation installs the
//! left-out ones again, restoring their covers.

use std::collections::{BTreeSet, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use serde::Serialize;

use crate::desired::Prefix;
use crate::model::Family;
use crate::resources::admission::{Admission, Gate};

/// Offload status of every prefix that is not plainly in the map as the
/// kernel has it. Everything else in the FIB is "ok".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Offload {
    /// Not in the map (no slot), or in it only as a punt because its next
    /// hop, ECMP group or buckets found no slot: the kernel forwards it.
    pub failed4: BTreeSet<(Ipv4Addr, u8)>,
    pub failed6: BTreeSet<(Ipv6Addr, u8)>,
    /// Installed, but as a punt instead of its own action, because a
    /// failed prefix lies inside it.
    pub covers4: BTreeSet<(Ipv4Addr, u8)>,
    pub covers6: BTreeSet<(Ipv6Addr, u8)>,
}

/// Value of the API's `"offload"` field.
pub const OK: &str = "ok";
pub const FAILED: &str = "failed";
pub const PUNTED_COVER: &str = "punted-cover";

impl Offload {
    pub fn failed(&self) -> usize {
        self.failed4.len() + self.failed6.len()
    }

    pub fn status4(&self, k: &(Ipv4Addr, u8)) -> &'static str {
        if self.failed4.contains(k) {
            FAILED
        } else if self.covers4.contains(k) {
            PUNTED_COVER
        } else {
            OK
        }
    }

    pub fn status6(&self, k: &(Ipv6Addr, u8)) -> &'static str {
        if self.failed6.contains(k) {
            FAILED
        } else if self.covers6.contains(k) {
            PUNTED_COVER
        } else {
            OK
        }
    }
}

/// What `trim` did to one family's FIB.
#[derive(Debug)]
pub(crate) struct Trimmed<T> {
    /// Prefixes removed, with what they would have held.
    pub left_out: Vec<(Prefix, T)>,
    /// Installed prefixes turned into punts, with what they held before.
    pub covers: Vec<(Prefix, T)>,
    /// Of `left_out`: admitted by the reservation model, target write not
    /// landed yet. Left out like the rest, but not failed.
    pub pending: HashSet<Prefix>,
}

impl<T> Default for Trimmed<T> {
    fn default() -> Self {
        Trimmed {
            left_out: Vec::new(),
            covers: Vec::new(),
            pending: HashSet::new(),
        }
    }
}

/// Cuts `fib` (sorted by prefix) down to `cap` entries. `punt_cover` turns
/// an entry covering a left-out prefix into a punt and returns what it
/// held, or returns None when the entry does not forward anyway (a punt,
/// local delivery, a reject route: all go to the kernel already).
#[cfg(test)]
pub(crate) fn trim<T>(
    fib: &mut Vec<(Prefix, T)>,
    cap: usize,
    punt_cover: impl FnMut(&mut T) -> Option<T>,
) -> Trimmed<T> {
    trim_gated(fib, cap, punt_cover, None)
}

/// `trim`, then every prefix that fits is put to the reservation model
/// (shortest first): one it refuses, or whose target write is still
/// queued, is left out the same way, its cover punted.
pub(crate) fn trim_gated<T>(
    fib: &mut Vec<(Prefix, T)>,
    cap: usize,
    mut punt_cover: impl FnMut(&mut T) -> Option<T>,
    gate: Option<(&mut Admission, Family)>,
) -> Trimmed<T> {
    let mut out = Trimmed::default();
    if fib.len() <= cap && gate.is_none() {
        return out;
    }
    let mut order: Vec<usize> = (0..fib.len()).collect();
    order.sort_unstable_by_key(|i| (fib[*i].0.len, fib[*i].0.bits));
    let mut drop = vec![false; fib.len()];
    for i in order.iter().skip(cap) {
        drop[*i] = true;
    }
    if let Some((adm, fam)) = gate {
        let fits: HashSet<Prefix> = order.iter().take(cap).map(|i| fib[*i].0).collect();
        // Entries that leave go back first, so the room they held serves the new ones.
        adm.retain(fam, &fits);
        for i in order.iter().take(cap) {
            let p = fib[*i].0;
            match adm.gate(fam, p) {
                Gate::Installed => {}
                Gate::Pending => {
                    drop[*i] = true;
                    out.pending.insert(p);
                }
                Gate::Refused => drop[*i] = true,
            }
        }
        if !drop.iter().any(|d| *d) {
            return out;
        }
    }
    let kept: HashSet<Prefix> = fib
        .iter()
        .zip(&drop)
        .filter(|(_, d)| !**d)
        .map(|((p, _), _)| *p)
        .collect();
    let mut kept_lens: Vec<u8> = kept.iter().map(|p| p.len).collect();
    kept_lens.sort_unstable_by(|a, b| b.cmp(a));
    kept_lens.dedup();

    // Nearest installed cover of each left-out prefix. A left-out prefix
    // between them has the same nearest installed cover, so nested
    // left-out routes share one punt.
    let mut covers: HashSet<Prefix> = HashSet::new();
    for (p, _) in fib.iter().zip(&drop).filter(|(_, d)| **d).map(|(e, _)| e) {
        let cover = kept_lens
            .iter()
            .filter(|l| **l < p.len)
            .map(|l| p.truncate(*l))
            .find(|c| kept.contains(c));
        if let Some(c) = cover {
            covers.insert(c);
        }
    }

    let old = std::mem::take(fib);
    fib.reserve(cap);
    for ((p, mut v), d) in old.into_iter().zip(drop) {
        if d {
            out.left_out.push((p, v));
            continue;
        }
        if covers.contains(&p) {
            if let Some(was) = punt_cover(&mut v) {
                out.covers.push((p, was));
            }
        }
        fib.push((p, v));
    }
    out
}

/// Logs each failed route once when it fails and once when it recovers.
#[derive(Debug, Default)]
pub struct FailedLog {
    failed4: BTreeSet<(Ipv4Addr, u8)>,
    failed6: BTreeSet<(Ipv6Addr, u8)>,
}

/// Beyond this many lines per change the rest is summed up in one line:
/// a table far too small must not flood the log.
const MAX_LINES: usize = 50;

impl FailedLog {
    pub fn update(&mut self, o: &Offload) {
        let mut lines = 0;
        let mut more = 0;
        let mut line = |s: std::fmt::Arguments, warn: bool| {
            if lines < MAX_LINES {
                if warn {
                    log::warn!("{s}");
                } else {
                    log::info!("{s}");
                }
                lines += 1;
            } else {
                more += 1;
            }
        };
        for (a, l) in o.failed4.difference(&self.failed4) {
            line(format_args!("route {a}/{l}: offload failed (no slot), its traffic is punted to the kernel"), true);
        }
        for (a, l) in o.failed6.difference(&self.failed6) {
            line(format_args!("route {a}/{l}: offload failed (no slot), its traffic is punted to the kernel"), true);
        }
        for (a, l) in self.failed4.difference(&o.failed4) {
            line(format_args!("route {a}/{l}: offloaded again"), false);
        }
        for (a, l) in self.failed6.difference(&o.failed6) {
            line(format_args!("route {a}/{l}: offloaded again"), false);
        }
        if more > 0 {
            log::warn!("{more} more routes changed offload status ({} failed now)", o.failed());
        }
        self.failed4.clone_from(&o.failed4);
        self.failed6.clone_from(&o.failed6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Family;
    use std::net::IpAddr;

    fn px(s: &str) -> Prefix {
        let (a, l) = s.split_once('/').unwrap();
        let a: IpAddr = a.parse().unwrap();
        let fam = if a.is_ipv4() { Family::V4 } else { Family::V6 };
        Prefix::new(fam, &a, l.parse().unwrap()).unwrap()
    }

    /// Entries are "fwd" or "punt"; covers become "PUNT".
    fn run(entries: &[(&str, &str)], cap: usize) -> (Vec<(Prefix, &'static str)>, Vec<Prefix>, Vec<Prefix>) {
        let mut fib: Vec<(Prefix, &'static str)> = entries
            .iter()
            .map(|(p, v)| (px(p), if *v == "fwd" { "fwd" } else { "punt" }))
            .collect();
        fib.sort();
        let t = trim(&mut fib, cap, |v| (*v == "fwd").then(|| std::mem::replace(v, "PUNT")));
        (
            fib,
            t.left_out.into_iter().map(|(p, _)| p).collect(),
            t.covers.into_iter().map(|(p, _)| p).collect(),
        )
    }

    #[test]
    fn fits_untouched() {
        let (fib, out, covers) = run(&[("10.0.0.0/8", "fwd"), ("10.1.0.0/16", "fwd")], 2);
        assert_eq!(fib.len(), 2);
        assert!(out.is_empty() && covers.is_empty());
    }

    #[test]
    fn longest_left_out_and_its_cover_punted() {
        let (fib, out, covers) = run(
            &[("0.0.0.0/0", "fwd"), ("198.51.100.0/24", "fwd"), ("198.51.100.128/25", "fwd"), ("203.0.113.0/24", "fwd")],
            3,
        );
        assert_eq!(out, vec![px("198.51.100.128/25")]);
        assert_eq!(covers, vec![px("198.51.100.0/24")]);
        assert!(fib.contains(&(px("198.51.100.0/24"), "PUNT")));
        assert!(fib.contains(&(px("0.0.0.0/0"), "fwd")), "only the nearest cover punts");
        assert!(fib.contains(&(px("203.0.113.0/24"), "fwd")));
    }

    #[test]
    fn nested_left_out_share_the_nearest_installed_cover() {
        // /25 and /26 both left out: the /24 is the nearest installed cover of both
        let (_, out, covers) = run(
            &[
                ("198.51.100.0/24", "fwd"),
                ("198.51.100.0/25", "fwd"),
                ("198.51.100.0/26", "fwd"),
                ("198.51.100.128/26", "fwd"),
                ("203.0.113.0/24", "fwd"),
            ],
            2,
        );
        assert_eq!(out.len(), 3);
        assert_eq!(covers, vec![px("198.51.100.0/24")]);
    }

    #[test]
    fn no_cover_no_punt_and_punt_covers_stay() {
        let (fib, out, covers) = run(&[("198.51.100.0/24", "fwd"), ("203.0.113.0/24", "punt"), ("203.0.113.7/32", "fwd"), ("192.0.2.0/25", "fwd")], 2);
        // shortest first: /24 and /24 stay; 192.0.2.0/25 has no cover; the punt cover stays a punt
        assert_eq!(out, vec![px("192.0.2.0/25"), px("203.0.113.7/32")]);
        assert!(covers.is_empty());
        assert_eq!(fib, vec![(px("198.51.100.0/24"), "fwd"), (px("203.0.113.0/24"), "punt")]);
    }

    #[test]
    fn v6_and_deterministic_tie_break() {
        let e = [("2001:db8::/32", "fwd"), ("2001:db8:2::/48", "fwd"), ("2001:db8:1::/48", "fwd"), ("2001:db8:1:1::/64", "fwd")];
        let (fib, out, covers) = run(&e, 2);
        // of the two /48s the lower address stays
        assert_eq!(out, vec![px("2001:db8:1:1::/64"), px("2001:db8:2::/48")]);
        assert_eq!(covers, vec![px("2001:db8::/32"), px("2001:db8:1::/48")]);
        assert_eq!(fib.len(), 2);
        let mut rev = e;
        rev.reverse();
        assert_eq!(run(&rev, 2).1, out);
    }
}
