/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* fib.h — FIB lookups, route verdicts and the IPv4 reverse-path check. */
#ifndef FP_FIB_H
#define FP_FIB_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "maps.h"

/*
 * Entry @n of an index level (fp_fib4_dir16 by /16, fp_fib4_dir by /24).
 * A missing element reads as "go on" (FP_DIR16_DESCEND, FP_DIR24_TRIE: 0).
 */
static __always_inline __u32 fp_dir_entry(void *level, __u32 n)
{
	__u32 i = n / FP_DIR24_PER_ELEM;
	struct fp_dir24_elem *d = bpf_map_lookup_elem(level, &i);

	return d ? d->entry[n & (FP_DIR24_PER_ELEM - 1)] : FP_DIR24_TRIE;
}

/*
 * With the /24 index on, most lookups end at its first level or a block,
 * and a value line; a full table's trie walk costs a cache miss per level.
 */
static __always_inline struct fp_route *fp_fib4_lookup(__be32 addr)
{
	struct fp_lpm4_key key = { .prefixlen = 32, .addr = addr };
	__u32 host, e;

	_Static_assert(FP_DIR16_DESCEND == FP_DIR24_TRIE, "one \"go on\" value for both levels");
	if (fp_cfg.fib4_dir) {
		host = bpf_ntohl(addr);
		e = fp_dir_entry(&fp_fib4_dir16, host >> 16);
		if (e == FP_DIR16_DESCEND)
			e = fp_dir_entry(&fp_fib4_dir, host >> 8);
		if (e == FP_DIR24_NONE)
			return NULL;
		if (e != FP_DIR24_TRIE)
			return bpf_map_lookup_elem(&fp_fib4_vals, &e);
	}
	return bpf_map_lookup_elem(&fp_fib4, &key);
}

/*
 * The multibit index's answer for the address whose upper half is @hi:
 * the route, NULL for none, or FP_DIR6_ASK_TRIE. A full table's trie walk
 * costs a cache miss per level; this is the /16's word and, for most
 * addresses, one to three hash lookups.
 */
#define FP_DIR6_ASK_TRIE ((struct fp_route *)1)

static __always_inline struct fp_route *fp_fib6_dir_lookup(__u64 hi)
{
	struct fp_dir6_key k = {};
	__u32 top = hi >> 48, e, lv, *n, cover, slot, i;
	__u64 *w, word;

	w = bpf_map_lookup_elem(&fp_fib6_dir16, &top);
	if (!w)
		return FP_DIR6_ASK_TRIE;
	word = *w;      /* one load: entry and version together */
	e = (__u32)word;
	k.ver = word >> 32;
	cover = e & 0xFFFF;
	for (i = 0; i < FP_DIR6_HOPS; i++) {
		if ((e >> 24) != FP_DIR6_DESCEND)
			break;
		lv = (e >> 16) & 0xFF;
		if (lv < 24 || lv > 64)
			return FP_DIR6_ASK_TRIE;
		k.level = lv;
		k.hi = hi & (~0ULL << (64 - lv));
		n = bpf_map_lookup_elem(&fp_fib6_dir, &k);
		e = n ? *n : (FP_DIR6_VAL << 24) | (e & 0xFFFF);
	}
	if ((e >> 24) != FP_DIR6_VAL)
		return FP_DIR6_ASK_TRIE;
	slot = e & 0xFFFF;
	if (slot == FP_DIR6_INHERIT)
		slot = cover;
	if (slot == FP_DIR6_NONE || slot == FP_DIR6_INHERIT)
		return NULL;
	return bpf_map_lookup_elem(&fp_fib6_vals, &slot);
}

/* The key doubles as the caller's stack copy of the address. */
static __always_inline struct fp_route *fp_fib6_lookup(struct fp_lpm6_key *key)
{
	struct fp_route *rt;
	__u32 a0, a1;

	key->prefixlen = 128;
	if (fp_cfg.fib6_dir) {
		__builtin_memcpy(&a0, key->addr, 4);
		__builtin_memcpy(&a1, key->addr + 4, 4);
		rt = fp_fib6_dir_lookup(((__u64)bpf_ntohl(a0) << 32) | bpf_ntohl(a1));
		if (rt != FP_DIR6_ASK_TRIE)
			return rt;
	}
	return bpf_map_lookup_elem(&fp_fib6, key);
}

/*
 * FP_R_FORWARDED for a route we may forward by, otherwise why not. A PUNT
 * route carrying a reason that is out of range, or "forwarded" itself, is a
 * daemon bug; it still must not be forwarded, so it becomes "unsupported".
 */
static __always_inline __u32 fp_route_reason(const struct fp_route *rt)
{
	__u32 r;

	switch (rt->type) {
	case FP_RT_FORWARD:
	case FP_RT_MULTIPATH:
		return FP_R_FORWARDED;
	case FP_RT_LOCAL:
		return FP_R_LOCAL;
	case FP_RT_BLACKHOLE:
		return FP_R_BLACKHOLE;
	case FP_RT_UNREACHABLE:
		return FP_R_UNREACHABLE;
	case FP_RT_PROHIBIT:
		return FP_R_PROHIBIT;
	case FP_RT_PUNT:
		r = rt->punt_reason;
		if (r == FP_R_FORWARDED || r >= FP_R__COUNT)
			return FP_R_ROUTE_UNSUPPORTED;
		return r;
	}
	return FP_R_ROUTE_UNSUPPORTED;
}

static __always_inline struct fp_nexthop *fp_nexthop_lookup(__u32 nh_id)
{
	return bpf_map_lookup_elem(&fp_nexthops, &nh_id);
}

/*
 * What fib_validate_source() in its full form says about a source whose
 * FIB entry is @rt, with rp_filter off: only unicast routes are accepted,
 * and no route at all is accepted too (last_resort). ECMP routes are
 * unicast in the kernel (forwarded or punted as ECMP); every other punt
 * may hide a non-unicast type (broadcast, throw, ...), so it is refused:
 * punting is always safe.
 * Returns a reason or 0.
 */
static __always_inline __u32 fp_ip4_src_route_reason(const struct fp_route *rt)
{
	if (!rt)
		return 0;
	switch (rt->type) {
	case FP_RT_FORWARD:
	case FP_RT_MULTIPATH:
		return 0;
	case FP_RT_LOCAL:
		return FP_R_MARTIAN;
	case FP_RT_PUNT:
		if (rt->punt_reason == FP_R_ECMP)
			return 0;
	}
	return FP_R_RP_FILTER;
}

/*
 * The source half of fib_validate_source(). With rp_filter on, the source
 * must have a single-path unicast route (a multipath one fails:
 * conservative), and in strict mode through the ingress.
 *
 * With it off the kernel refuses a source that is one of its own addresses
 * (inet_lookup_ifaddr_rcu(), accept_local=0), and once local routes were
 * ever customised (which netlink does not show) it does the full check,
 * refusing every source whose route is not unicast. We refuse what either
 * variant refuses. The daemon lists every such address in fp_src_deny4 as
 * long as only /32 entries can be non-unicast (the usual FIB: local and
 * broadcast host routes), so one hash lookup decides (and a bitmap in
 * front of it spares that lookup for almost every source); when a shorter
 * non-forwarding prefix exists (a blackhole /8, a local range) it sets
 * fp_rt.src_lpm and the source gets a full LPM lookup instead.
 * Returns a reason or 0.
 */
static __always_inline __u32
fp_ip4_rpf_reason(const struct fp_iface *in, __u32 in_ifindex, __be32 saddr, __u32 src_lpm)
{
	struct fp_route *rt;
	struct fp_nexthop *nh;
	__u32 *deny, r, word;
	__u64 *bits;

	if (!(in->flags & (FP_IF_RPF_STRICT | FP_IF_RPF_LOOSE))) {
		if (src_lpm & FP_FAM_V4)
			return fp_ip4_src_route_reason(fp_fib4_lookup(saddr));
		/* Almost every source misses the bitmap: no hash lookup. */
		r = ((__u32)saddr * FP_SRC_BLOOM_MUL) >> (32 - FP_SRC_BLOOM_BITS);
		word = r >> 6;
		bits = bpf_map_lookup_elem(&fp_src_bloom4, &word);
		if (!bits || !(*bits & (1ULL << (r & 63))))
			return 0;
		deny = bpf_map_lookup_elem(&fp_src_deny4, &saddr);
		if (!deny)
			return 0;
		r = *deny;
		/* 0 or out of range is a daemon bug: still refuse. */
		if (r == FP_R_FORWARDED || r >= FP_R__COUNT)
			return FP_R_RP_FILTER;
		return r;
	}
	rt = fp_fib4_lookup(saddr);
	if (!rt || rt->type != FP_RT_FORWARD)
		return FP_R_RP_FILTER;
	if (!(in->flags & FP_IF_RPF_STRICT))
		return 0;
	nh = fp_nexthop_lookup(rt->nh_id);
	if (!nh || nh->ifindex != in_ifindex)
		return FP_R_RP_FILTER;
	return 0;
}

#endif /* FP_FIB_H */
