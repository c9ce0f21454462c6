/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * maps.h — every table of the forwarding program, declared once.
 * Sizes here are placeholders: the daemon sets max_entries before load
 * from its --*-entries options (defaults in fastpath.h).
 */
#ifndef FP_MAPS_H
#define FP_MAPS_H

#include "fastpath.h"
#include <bpf/bpf_helpers.h>

/*
 * bpf_map_lookup_elem() that clang keeps at a call of its own. Where two
 * branches end in lookups of different maps, clang sinks them into one
 * call taking either map; the verifier cannot bind that call to one map,
 * so it becomes a call of the generic helper (an indirect call, a
 * retpoline here) instead of the map's own lookup, inlined for arrays and
 * hash maps: on 2026-12-08 that cost the no-cache path 6 % of its rate.
 * The barrier cannot be sunk, so neither can the call before it. Use it
 * for every lookup of such a pair; clang_compat.rs fails any program that
 * still calls the generic helper.
 */
#define fp_lookup_apart(map, key)                                  \
	({                                                         \
		void *fp_found_ = bpf_map_lookup_elem(map, key);   \
		barrier_var(fp_found_);                            \
		fp_found_;                                         \
	})

/*
 * Per instance, set before load (.rodata): here, as the table lookups
 * (fib.h) read it too, and the verifier drops the branches it turns off.
 */
const volatile struct fp_config fp_cfg = {};

/* Managed interfaces by slot: ingress checks and egress rewrite data. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_MAX_IFACES);
	__type(key, __u32);
	__type(value, struct fp_iface);
} fp_ifaces SEC(".maps");

/* IPv4 FIB: longest-prefix match over the merged local + main tables. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, FP_DEFAULT_FIB4_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fp_lpm4_key);
	__type(value, struct fp_route);
} fp_fib4 SEC(".maps");

/*
 * The /24 index in front of fp_fib4 and the route values it points at
 * (struct fp_dir24_elem). One entry each when the index is off. Mapped
 * into the daemon, which paints blocks with plain stores.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_DIR24_ELEMS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct fp_dir24_elem);
} fp_fib4_dir SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_DIR16_ELEMS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct fp_dir24_elem);
} fp_fib4_dir16 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_DIR24_VALS);
	__type(key, __u32);
	__type(value, struct fp_route);
} fp_fib4_vals SEC(".maps");

/*
 * The IPv6 multibit index in front of fp_fib6 (struct fp_dir6_bucket). One
 * entry each when the index is off. Both are mapped into the daemon, which
 * switches a /16 to its new entries with one 8-byte store.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_DIR6_TOPS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} fp_fib6_dir16 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct fp_dir6_bucket);
} fp_fib6_dir SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_DIR6_VALS);
	__type(key, __u32);
	__type(value, struct fp_route);
} fp_fib6_vals SEC(".maps");

/*
 * The forward paths' copy of their route (and IPv6's FIB key). The copy:
 * the trie's and an index's values lie in different maps, which to the
 * verifier are different pointers, so it checked everything after the
 * lookup once for each (past its limit in stateful mode). Not on the
 * stack: the general path's frames fill the 512 bytes, and the IPv6
 * index's step (fp_dir6_step) needs a frame of its own below them.
 */
/* A key in .rodata: no stack slot for it. */
static const __u32 fp_zero_key = 0;

struct fp_fwd_scratch {
	struct fp_lpm6_key key;
	struct fp_route rt;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_fwd_scratch);
} fp_fwd_scratch SEC(".maps");

/* IPv6 FIB: same as fp_fib4. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, FP_DEFAULT_FIB6_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fp_lpm6_key);
	__type(value, struct fp_route);
} fp_fib6 SEC(".maps");

/*
 * IPv4 sources the kernel refuses with rp_filter off (its own addresses,
 * and every other address whose /32 FIB entry is not a unicast route):
 * address (network order) -> fp_reason to punt with. Sized like fp_fib4,
 * but it holds a handful of entries in practice: not preallocated, or a
 * full-table capacity would cost ~95 bytes per route of unused space.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_DEFAULT_FIB4_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u32);
} fp_src_deny4 SEC(".maps");

/* Bitmap filter in front of fp_src_deny4 (see FP_SRC_BLOOM_BITS). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_SRC_BLOOM_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} fp_src_bloom4 SEC(".maps");

/* Next hops, indexed by the id the daemon allocates (0 unused). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_DEFAULT_NEXTHOP_ENTRIES);
	__type(key, __u32);
	__type(value, struct fp_nexthop);
} fp_nexthops SEC(".maps");

/* ECMP groups, indexed by the id the daemon allocates (0 unused). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FP_DEFAULT_GROUP_ENTRIES);
	__type(key, __u32);
	__type(value, struct fp_group);
} fp_groups SEC(".maps");

/* Resilient group buckets: (group id << 16) | bucket -> fp_nexthops index. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_DEFAULT_RES_BUCKETS);
	__type(key, __u32);
	__type(value, __u32);
} fp_res_buckets SEC(".maps");

/*
 * The flow cache: sets of FP_FLOW_WAYS flows (see struct fp_flow_set), one
 * slice of fp_config.flow_sets sets per CPU, so that a hit never contends.
 * Not a PERCPU_ARRAY: the per-CPU allocator aligns each value to 8 bytes
 * only, so the set's one-line parts would straddle two cache lines, and a
 * lookup goes through a pointer table first. An mmapable array starts on
 * a page and is contiguous: every set begins on a line (its size is a
 * multiple of 64). Sized by the daemon: flow_sets * possible CPUs entries
 * (fp_flow_index()).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, FP_DEFAULT_FLOW_ENTRIES / FP_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct fp_flow_set);
} fp_flows SEC(".maps");

/*
 * Stateful mode: the conntrack verdict of each cached flow, parallel to
 * fp_flows (same index, same way, same layout; see struct fp_ct_set). Sized
 * like fp_flows by the daemon; one entry when stateless (never touched then).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, FP_DEFAULT_FLOW_ENTRIES / FP_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct fp_ct_set);
} fp_ct_flows SEC(".maps");

/*
 * Per-interface L2 tables, one hash per family keyed by ifindex + address.
 * Both are sized by --neigh-entries (the reconciler counts all neighbours
 * against it, so either map alone always has room).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_DEFAULT_NEIGH_ENTRIES);
	__type(key, struct fp_neigh4_key);
	__type(value, struct fp_neigh);
} fp_neigh4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_DEFAULT_NEIGH_ENTRIES);
	__type(key, struct fp_neigh6_key);
	__type(value, struct fp_neigh);
} fp_neigh6 SEC(".maps");

/*
 * Egress ports the program may redirect to: fp_iface.slot -> ifindex. An
 * array devmap: the lookup is an index, not a hash.
 */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, FP_MAX_IFACES);
	__type(key, __u32);
	__type(value, struct bpf_devmap_val);
} fp_tx_ports SEC(".maps");

/*
 * AF_XDP data path: the user-space forwarder's sockets, key = slot *
 * FP_XSK_MAX_QUEUES + queue (see struct fp_xsk_meta). Empty otherwise.
 */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, FP_MAX_IFACES * FP_XSK_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} fp_xsks SEC(".maps");

/* Per-CPU packet/byte counters per ingress slot and reason. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_MAX_IFACES);
	__type(key, __u32);
	__type(value, struct fp_stats);
} fp_stats SEC(".maps");

/*
 * Stateful mode, TCP entries whose window tracking is not liberal yet: when
 * the data path first met each (key: the entry's original tuple) and when it
 * last asked the daemon to make it liberal. Only the data path uses it.
 */
struct fp_ct_liberal_seen {
	__u64 first;             /* bpf_ktime_get_coarse_ns() of the first meeting */
	__u64 asked;             /* of the last request posted; 0 = none */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(max_entries, 8192);
	__type(key, struct fp_flow_key);
	__type(value, struct fp_ct_liberal_seen);
} fp_ct_liberal_seen SEC(".maps");

/*
 * Stateful mode: requests to the daemon, one struct fp_flow_key each (the
 * conntrack entry's original tuple; ingress and flowlabel 0), to make that
 * TCP entry's window tracking liberal.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} fp_ct_liberal_req SEC(".maps");

/*
 * Stateful mode: where fp_ct_want_liberal() and fp_ct_icmp_check() build
 * a key, off the stack (the forward path is at the 512-byte limit).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fp_flow_key);
} fp_ct_liberal_key SEC(".maps");

/* Stateful mode: conntrack's ICMP echo entries, as the daemon read them (struct fp_ct_icmp). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FP_DEFAULT_CT_ICMP_ENTRIES);
	__type(key, struct fp_flow_key);
	__type(value, struct fp_ct_icmp);
} fp_ct_icmp SEC(".maps");

/*
 * Stateful mode: ICMP echo tuples the data path found no current copy of
 * in fp_ct_icmp, one struct fp_flow_key each (as fp_ct_icmp keys them), for
 * the daemon to look up. Small on purpose: it bounds the daemon's lookups
 * per round under a flood of new echo ids; a request that finds it full is
 * posted again by a later packet.
 */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024);
} fp_ct_icmp_req SEC(".maps");

#endif /* FP_MAPS_H */
