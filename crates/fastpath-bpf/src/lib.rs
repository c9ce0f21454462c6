//! fastpath's BPF side as Rust: one skeleton module per `bpf/**/<name>.bpf.c`
//! (`fastpath_bpf::skel::xdp_fwd`, ...) and the shared interface header as
//! Rust types (`fastpath_bpf::intf`).

#![allow(clippy::all)]

/// Generated skeletons, one module per BPF object.
pub mod skel {
    #![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code, unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/skels.rs"));
}

/// Types, constants and enums of `bpf/include/fastpath.h`.
pub mod intf {
    #![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code)]
    include!(concat!(env!("OUT_DIR"), "/intf.rs"));
    include!(concat!(env!("OUT_DIR"), "/reason_names.rs"));

    // The names are parsed from the header's text; the enum comes from
    // bindgen. If the parse ever drifts (two enumerators on a line, ...),
    // fail the build rather than mislabel every counter.
    const _: () = assert!(REASON_NAMES.len() == fp_reason::FP_R__COUNT as usize);

    /// Name of a reason index as shown by the CLI and metrics.
    pub fn reason_name(i: usize) -> &'static str {
        REASON_NAMES.get(i).copied().unwrap_or("unknown")
    }
}

/// Whether this kernel lets an XDP program grow a frame's metadata area
/// (`bpf_xdp_adjust_meta`), which only the bench generator's `*_hint`
/// entry points call: libbpf loads a two-instruction program and reads the
/// verifier's answer. This project's kernel has refused it on some VMs and
/// allowed it on others, so callers ask every time.
pub fn xdp_adjust_meta_allowed() -> std::io::Result<bool> {
    // SAFETY: no pointers of ours cross (the options are optional, NULL);
    // libbpf loads and closes its probe program itself.
    let r = unsafe {
        libbpf_rs::libbpf_sys::libbpf_probe_bpf_helper(
            libbpf_rs::libbpf_sys::BPF_PROG_TYPE_XDP,
            libbpf_rs::libbpf_sys::BPF_FUNC_xdp_adjust_meta,
            std::ptr::null(),
        )
    };
    match r {
        1 => Ok(true),
        0 => Ok(false),
        e => Err(std::io::Error::from_raw_os_error(-e)),
    }
}

/// Entries of `fp_flows` (and of `fp_ct_flows` in stateful mode) for
/// `sets` flow-cache sets per CPU: the maps hold one slice per possible
/// CPU, indexed by the CPU the program runs on (bpf/lib/maps.h).
pub fn flow_cache_entries(sets: u32) -> Result<u32, String> {
    let cpus = libbpf_rs::num_possible_cpus().map_err(|e| format!("counting possible CPUs: {e}"))?;
    u32::try_from(cpus)
        .ok()
        .and_then(|c| c.checked_mul(sets))
        .ok_or_else(|| format!("{sets} flow-cache sets on each of {cpus} CPUs do not fit one map"))
}

/// One way of a flow-cache set as the data path reads it: an IPv4 way packs
/// its key into 16 bytes and keeps its generation, last use, packets and
/// conntrack verdict in the rest of its line (`struct fp_flow_way4`,
/// bpf/include/fastpath.h).
#[derive(Clone, Copy, Debug)]
pub struct FlowWay {
    /// The key as the program built it (`struct fp_flow_key`, IPv4 padding zero).
    pub key: intf::fp_flow_key,
    /// 0: empty or invalidated.
    pub generation: u32,
    pub used: u32,
    pub packets: u32,
    /// Stateful mode: an IPv4 flow's cached conntrack verdict and bytes
    /// (None for IPv6, whose verdict is in `fp_ct_flows`: see `flow_ct`).
    pub ct4: Option<intf::fp_ct_hot>,
}

/// fp_flow_key.family of IPv4 (FP_AF_INET, bpf/lib/parse.h).
const FP_AF_INET: u8 = 2;

/// Way `w` (< FP_FLOW_WAYS) of `set`.
pub fn flow_way(set: &intf::fp_flow_set, w: usize) -> FlowWay {
    let f = &set.way[w];
    if f.key.family != FP_AF_INET {
        return FlowWay {
            key: f.key,
            generation: set.generation[w],
            used: set.used[w],
            packets: set.packets[w],
            ct4: None,
        };
    }
    // SAFETY: both are plain C structs of 64 bytes (asserted by bindgen's
    // layout tests and flow.h), every bit pattern valid for either.
    let f4: intf::fp_flow_way4 = unsafe { std::mem::transmute_copy(f) };
    // SAFETY: fp_flow_key is plain old data; all zeroes is a valid value.
    let mut key: intf::fp_flow_key = unsafe { std::mem::zeroed() };
    key.family = f4.key.family;
    key.proto = f4.key.proto;
    key.ingress = f4.key.ingress;
    key.sport = f4.key.sport;
    key.dport = f4.key.dport;
    // The addresses are in network order: their bytes, as stored.
    key.saddr[..4].copy_from_slice(&f4.key.saddr.to_ne_bytes());
    key.daddr[..4].copy_from_slice(&f4.key.daddr.to_ne_bytes());
    FlowWay { key, generation: f4.generation, used: f4.used, packets: f4.packets, ct4: Some(f4.ct) }
}

/// The cached conntrack verdict (bytes counted, validation) of way `w`:
/// in the way for IPv4, in `ct_set` (the same index of `fp_ct_flows`) for IPv6.
pub fn flow_ct(way: &FlowWay, ct_set: &intf::fp_ct_set, w: usize) -> intf::fp_ct_hot {
    way.ct4.unwrap_or(ct_set.way[w].hot)
}
