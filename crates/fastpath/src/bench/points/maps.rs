//! Workload (e): how fast user space can rewrite the tables a program reads,
//! per execution point. Every in-kernel point (native XDP, generic XDP, TC)
//! reads the same BPF maps, so they share one figure: single
//! bpf_map_update_elem calls against bpf_map_update_batch, for a hash map and
//! an LPM trie, with a small and a large set. The AF_XDP point keeps its
//! tables in its own memory: a Rust HashMap insert is its update.
//! Values are 16 B, the paper's DNS resource records.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};
use serde::Serialize;

const VALUE_LEN: usize = 16;

#[derive(Clone, Debug, Serialize)]
pub struct UpdateRate {
    /// "bpf-map" (native XDP, generic XDP and TC alike) or "afxdp" (user-space memory).
    pub point: &'static str,
    pub map: &'static str,
    pub entries: u32,
    pub method: &'static str,
    pub updates: u64,
    pub seconds: f64,
    pub updates_per_s: f64,
    /// Why a cell has no figure (an operation the kernel refuses).
    pub error: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Hash,
    Lpm,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Hash => "hash",
            Kind::Lpm => "lpm",
        }
    }
}

/// Keys of entry i: a u32 for the hash; a /24 (i << 8) for the trie, so a
/// million entries are a million distinct prefixes, as routes would be.
fn keys(kind: Kind, n: u32) -> (u32, Vec<u8>) {
    match kind {
        Kind::Hash => (4, (0..n).flat_map(|i| i.to_ne_bytes()).collect()),
        Kind::Lpm => (
            8,
            (0..n)
                .flat_map(|i| {
                    let mut k = [0u8; 8];
                    k[0..4].copy_from_slice(&24u32.to_ne_bytes());
                    k[4..8].copy_from_slice(&(i << 8).to_be_bytes());
                    k
                })
                .collect(),
        ),
    }
}

fn create(kind: Kind, n: u32) -> Result<MapHandle> {
    let (key_len, _) = keys(kind, 0);
    let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
        // The kernel requires it for tries; for the hash it keeps both
        // sizes' creation cheap and the figure about updates alone.
        map_flags: if kind == Kind::Lpm {
            libbpf_rs::libbpf_sys::BPF_F_NO_PREALLOC
        } else {
            0
        },
        ..Default::default()
    };
    let t = if kind == Kind::Lpm {
        MapType::LpmTrie
    } else {
        MapType::Hash
    };
    MapHandle::create(
        t,
        Some("fp_points_upd"),
        key_len,
        VALUE_LEN as u32,
        n,
        &opts,
    )
    .with_context(|| format!("creating a {} map of {n}", kind.name()))
}

/// Rewrites the whole set again and again (after one untimed fill, so every
/// timed update replaces an entry, as refreshing a cache does) until `min`
/// has passed.
fn bpf_rate(kind: Kind, n: u32, batch: bool, min: Duration) -> Result<UpdateRate> {
    let map = create(kind, n)?;
    let (klen, ks) = keys(kind, n);
    let vals: Vec<u8> = (0..n).flat_map(|i| [i as u8; VALUE_LEN]).collect();
    let pass = |map: &MapHandle| -> Result<()> {
        if batch {
            map.update_batch(&ks, &vals, n, MapFlags::ANY, MapFlags::ANY)
                .context("bpf_map_update_batch")
        } else {
            for (k, v) in ks
                .chunks_exact(klen as usize)
                .zip(vals.chunks_exact(VALUE_LEN))
            {
                map.update(k, v, MapFlags::ANY)
                    .context("bpf_map_update_elem")?;
            }
            Ok(())
        }
    };
    let method = if batch { "batch" } else { "single" };
    let mut r = UpdateRate {
        point: "bpf-map",
        map: kind.name(),
        entries: n,
        method,
        updates: 0,
        seconds: 0.0,
        updates_per_s: 0.0,
        error: None,
    };
    if let Err(e) = pass(&map) {
        r.error = Some(format!("{e:#}"));
        return Ok(r);
    }
    let start = Instant::now();
    loop {
        pass(&map)?;
        r.updates += u64::from(n);
        if start.elapsed() >= min {
            break;
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    r.updates_per_s = r.updates as f64 / r.seconds;
    Ok(r)
}

/// The AF_XDP point's table: plain process memory.
fn user_rate(n: u32, min: Duration) -> UpdateRate {
    let mut m: HashMap<u32, [u8; VALUE_LEN]> = HashMap::with_capacity(n as usize);
    for i in 0..n {
        m.insert(i, [i as u8; VALUE_LEN]);
    }
    let start = Instant::now();
    let mut updates = 0u64;
    loop {
        for i in 0..n {
            m.insert(std::hint::black_box(i), [i as u8; VALUE_LEN]);
        }
        updates += u64::from(n);
        if start.elapsed() >= min {
            break;
        }
    }
    std::hint::black_box(&m);
    let seconds = start.elapsed().as_secs_f64();
    UpdateRate {
        point: "afxdp",
        map: "hash",
        entries: n,
        method: "single",
        updates,
        seconds,
        updates_per_s: updates as f64 / seconds,
        error: None,
    }
}

/// Every combination for the given set sizes; `progress` is told each cell.
pub fn measure(
    sizes: &[u32],
    min: Duration,
    mut progress: impl FnMut(&str),
) -> Result<Vec<UpdateRate>> {
    let mut out = Vec::new();
    for &n in sizes {
        for kind in [Kind::Hash, Kind::Lpm] {
            for batch in [false, true] {
                progress(&format!(
                    "{} {n} {}",
                    kind.name(),
                    if batch { "batch" } else { "single" }
                ));
                out.push(bpf_rate(kind, n, batch, min)?);
            }
        }
        progress(&format!("user-space hash {n}"));
        out.push(user_rate(n, min));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lpm_keys_are_distinct_slash_24s() {
        let (len, k) = keys(Kind::Lpm, 3);
        assert_eq!(len, 8);
        assert_eq!(&k[0..4], &24u32.to_ne_bytes());
        assert_eq!(&k[12..16], &[0, 0, 1, 0]);
        assert_eq!(&k[20..24], &[0, 0, 2, 0]);
    }

    #[test]
    fn user_space_rate_counts_whole_passes() {
        let r = user_rate(1000, Duration::from_millis(1));
        assert_eq!(r.updates % 1000, 0);
        assert!(r.updates >= 1000 && r.updates_per_s > 0.0);
    }
}
