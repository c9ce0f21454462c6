//! BPF_MAP_UPDATE_BATCH / BPF_MAP_DELETE_BATCH on packed key and value
//! arrays: one syscall for a run of writes to one map instead of one per
//! entry. The kernel (generic_map_*_batch) applies the entries in array
//! order, each visible to the data path as soon as it is written, and stops
//! at the first failing entry; `count` comes back as the number that landed.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapCore, MapHandle};

/// How far a batch call got: `landed` entries are in the map; if `error` is
/// set, entry `landed` failed and nothing after it was tried.
#[derive(Debug)]
pub struct Outcome {
    pub landed: usize,
    pub error: Option<io::Error>,
}

impl Outcome {
    /// The kernel or libbpf cannot batch on this map at all (nothing landed).
    pub fn unsupported(&self) -> bool {
        const ENOTSUPP: i32 = 524;
        self.landed == 0
            && self
                .error
                .as_ref()
                .and_then(io::Error::raw_os_error)
                .is_some_and(|e| [libc::EINVAL, libc::EOPNOTSUPP, ENOTSUPP, libc::ENOSYS].contains(&e))
    }
}

fn opts() -> libbpf_sys::bpf_map_batch_opts {
    libbpf_sys::bpf_map_batch_opts {
        sz: size_of::<libbpf_sys::bpf_map_batch_opts>() as libbpf_sys::size_t,
        // BPF_ANY: the only elem flag besides BPF_F_LOCK the kernel accepts is none.
        elem_flags: 0,
        flags: 0,
    }
}

fn outcome(ret: i32, count: u32, asked: usize) -> Outcome {
    if ret == 0 {
        return Outcome { landed: asked, error: None };
    }
    // libbpf returns -errno and copies back whatever count the kernel left.
    // Errors before the first entry (bad flags, no batch op, permissions)
    // leave our own count untouched; once entries are processed the kernel
    // zeroes it first and counts only the entries that landed, so a failed
    // call can never report all of them.
    let count = count as usize;
    let landed = if count >= asked { 0 } else { count };
    Outcome { landed, error: Some(io::Error::from_raw_os_error(-ret)) }
}

/// Writes `n` entries: `keys` and `values` hold them back to back, each the
/// map's key and value size.
pub fn update(map: &MapHandle, keys: &[u8], values: &[u8], n: usize) -> Outcome {
    if n == 0 {
        return Outcome { landed: 0, error: None };
    }
    let ks = map.key_size() as usize;
    let vs = map.value_size() as usize;
    if keys.len() != ks * n || values.len() != vs * n || n > u32::MAX as usize {
        return Outcome { landed: 0, error: Some(io::Error::from_raw_os_error(libc::EINVAL)) };
    }
    let mut count = n as u32;
    let o = opts();
    // SAFETY: the buffers hold exactly `count` keys and values of the map's
    // sizes (checked above) and outlive the call; the kernel only reads them.
    let ret = unsafe {
        libbpf_sys::bpf_map_update_batch(
            map.as_fd().as_raw_fd(),
            keys.as_ptr().cast(),
            values.as_ptr().cast(),
            &mut count,
            &o,
        )
    };
    outcome(ret, count, n)
}

/// Deletes `n` keys packed in `keys`. A missing key stops the batch with
/// ENOENT like any other failure.
pub fn delete(map: &MapHandle, keys: &[u8], n: usize) -> Outcome {
    if n == 0 {
        return Outcome { landed: 0, error: None };
    }
    let ks = map.key_size() as usize;
    if keys.len() != ks * n || n > u32::MAX as usize {
        return Outcome { landed: 0, error: Some(io::Error::from_raw_os_error(libc::EINVAL)) };
    }
    let mut count = n as u32;
    let o = opts();
    // SAFETY: as in `update`, for the keys alone.
    let ret = unsafe { libbpf_sys::bpf_map_delete_batch(map.as_fd().as_raw_fd(), keys.as_ptr().cast(), &mut count, &o) };
    outcome(ret, count, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use libbpf_rs::{MapFlags, MapType};

    /// A small LPM trie of /32 IPv4 keys (prefixlen, addr) -> u32, or None
    /// when this process may not create BPF maps.
    fn trie(max: u32) -> Option<MapHandle> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to create BPF maps");
            return None;
        }
        let opts = libbpf_sys::bpf_map_create_opts {
            sz: size_of::<libbpf_sys::bpf_map_create_opts>() as libbpf_sys::size_t,
            map_flags: libbpf_sys::BPF_F_NO_PREALLOC,
            ..Default::default()
        };
        MapHandle::create(MapType::LpmTrie, Some("fp_batch_test"), 8, 4, max, &opts).ok()
    }

    fn key(i: u32) -> [u8; 8] {
        let mut k = [0u8; 8];
        k[..4].copy_from_slice(&32u32.to_ne_bytes());
        k[4..].copy_from_slice(&(0xC000_0200u32 + i).to_be_bytes());
        k
    }

    fn packed(ids: &[u32]) -> (Vec<u8>, Vec<u8>) {
        (ids.iter().flat_map(|i| key(*i)).collect(), ids.iter().flat_map(|i| i.to_ne_bytes()).collect())
    }

    #[test]
    fn update_reports_exactly_what_landed() {
        let Some(m) = trie(3) else { return };
        let (k, v) = packed(&[1, 2, 3, 4, 5]);
        let out = update(&m, &k, &v, 5);
        assert_eq!(out.landed, 3, "{out:?}");
        assert!(out.error.is_some());
        assert!(!out.unsupported());
        for i in 1..=3 {
            assert!(m.lookup(&key(i), MapFlags::ANY).unwrap().is_some());
        }
        assert!(m.lookup(&key(4), MapFlags::ANY).unwrap().is_none());
    }

    #[test]
    fn delete_stops_at_a_missing_key() {
        let Some(m) = trie(8) else { return };
        let (k, v) = packed(&[1, 2, 4]);
        assert!(update(&m, &k, &v, 3).error.is_none());
        let (k, _) = packed(&[1, 2, 3, 4]);
        let out = delete(&m, &k, 4);
        assert_eq!(out.landed, 2, "{out:?}");
        assert_eq!(out.error.and_then(|e| e.raw_os_error()), Some(libc::ENOENT));
        assert!(m.lookup(&key(4), MapFlags::ANY).unwrap().is_some());
        let (k, _) = packed(&[4]);
        assert!(delete(&m, &k, 1).error.is_none());
    }

    #[test]
    fn early_errors_land_nothing() {
        let Some(m) = trie(8) else { return };
        // Wrong sizes never reach the kernel.
        let out = update(&m, &[0u8; 7], &[0u8; 4], 1);
        assert_eq!(out.landed, 0);
        // Flags the kernel rejects fail before any entry.
        let (k, v) = packed(&[1, 2]);
        let fd = m.as_fd().as_raw_fd();
        let mut count = 2u32;
        let o = opts();
        // SAFETY: buffers sized for two entries.
        let ret = unsafe {
            libbpf_sys::bpf_map_update_batch(fd, k.as_ptr().cast(), v.as_ptr().cast(), &mut count, &libbpf_sys::bpf_map_batch_opts { elem_flags: 1 << 60, ..o })
        };
        let out = outcome(ret, count, 2);
        assert_eq!(out.landed, 0, "{out:?}");
        assert!(out.unsupported());
        assert!(m.lookup(&key(1), MapFlags::ANY).unwrap().is_none());
    }
}
