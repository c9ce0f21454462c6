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

/// One way of a flow-cache set as the data path reads it: an IPv4 way keeps
/// its generation, last use and packets in its own line, in the key's
/// address padding (`struct fp_flow_way4`, bpf/include/fastpath.h).
#[derive(Clone, Copy, Debug)]
pub struct FlowWay {
    /// The key with IPv4 padding back to zero, as the program built it.
    pub key: intf::fp_flow_key,
    /// 0: empty or invalidated.
    pub generation: u32,
    pub used: u32,
    pub packets: u32,
}

/// fp_flow_key.family of IPv4 (FP_AF_INET, bpf/lib/parse.h).
const FP_AF_INET: u8 = 2;

/// Way `w` (< FP_FLOW_WAYS) of `set`.
pub fn flow_way(set: &intf::fp_flow_set, w: usize) -> FlowWay {
    let f = &set.way[w];
    if f.key.family != FP_AF_INET {
        return FlowWay { key: f.key, generation: set.generation[w], used: set.used[w], packets: set.packets[w] };
    }
    // SAFETY: both are plain C structs of 64 bytes (asserted by bindgen's
    // layout tests and flow.h), every bit pattern valid for either.
    let f4: intf::fp_flow_way4 = unsafe { std::mem::transmute_copy(f) };
    let mut key = f.key;
    key.daddr[4..].fill(0);
    FlowWay { key, generation: f4.generation, used: f4.used, packets: f4.packets }
}
