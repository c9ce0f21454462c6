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
			return fp_lookup_apart(&fp_fib4_vals, &e);
	}
	return fp_lookup_apart(&fp_fib4, &key);
}

/* The index's hash of a key (crates/fastpath-core/src/dir6/table.rs). */
static __always_inline __u64 fp_dir6_hash(__u64 hi, __u32 tag)
{
	__u64 x = hi ^ ((__u64)tag * 0x9E3779B97F4A7C15ULL);

	x ^= x >> 33;
	x *= 0xFF51AFD7ED558CCDULL;
	x ^= x >> 33;
	x *= 0xC4CEB9FE1A85EC53ULL;
	return x ^ (x >> 33);
}

/*
 * Entry of (@hi, @tag) in bucket @b: 1 if there, with *@e set. The tag is
 * read again after the entry: the daemon moves an entry to its second
 * bucket (copy first) and then clears the slot before writing another
 * entry into it, so an unchanged tag means the entry read was this key's.
 */
static __always_inline int fp_dir6_in(const struct fp_dir6_bucket *b, __u64 hi, __u32 tag, __u32 *e)
{
	const volatile struct fp_dir6_slot *s;
	__u32 v;
	int w;

#pragma unroll
	for (w = 0; w < FP_DIR6_WAYS; w++) {
		s = &b->s[w];
		if (s->tag == tag && s->hi == hi) {
			v = s->entry;
			asm volatile("" ::: "memory");
			if (s->tag == tag) {
				*e = v;
				return 1;
			}
		}
	}
	return 0;
}

/*
 * One step of the index walk: @e is a DESCEND entry of a block of the
 * /16 whose version is @ver; returns the entry of the address's block at
 * the level @e names, or VAL(@e's default) when that level has none, or
 * TRIE for a level out of range. Global, so the verifier checks it once:
 * inlined, its probes multiplied the paths of every caller past the
 * verifier's limit.
 */
__noinline __u32 fp_dir6_step(__u64 hi, __u32 ver, __u32 e)
{
	struct fp_dir6_bucket *b1, *b2;
	__u32 lv = (e >> 16) & 0xFF, mask = fp_cfg.fib6_dir - 1, i1, i2, tag, next;
	__u64 h, key;

	if (lv < 24 || lv > 64)
		return FP_DIR6_TRIE;
	key = hi & (~0ULL << (64 - lv));
	tag = (ver & FP_DIR6_VER_MASK) << 8 | lv;
	h = fp_dir6_hash(key, tag);
	i1 = h & mask;
	i2 = (h >> 32) & mask;
	/* Both lines asked for before either is searched. */
	b1 = bpf_map_lookup_elem(&fp_fib6_dir, &i1);
	b2 = bpf_map_lookup_elem(&fp_fib6_dir, &i2);
	if (b1 && fp_dir6_in(b1, key, tag, &next))
		return next;
	if (b2 && fp_dir6_in(b2, key, tag, &next))
		return next;
	return (FP_DIR6_VAL << 24) | (e & 0xFFFF);
}

/*
 * The multibit index's answer for the address whose upper half is @hi:
 * the fp_fib6_vals slot of its route, FP_DIR6_NONE for none, or
 * FP_DIR6_ASK_TRIE. A full table's trie walk costs a cache miss per level;
 * this is the /16's word and, for most addresses, one to three probes of
 * two independent cache lines each.
 */
#define FP_DIR6_ASK_TRIE 0x10000

static __always_inline __u32 fp_fib6_dir_slot(__u64 hi)
{
	__u32 top = hi >> 48, e, cover, slot, ver, i;
	__u64 *w, word;

	w = bpf_map_lookup_elem(&fp_fib6_dir16, &top);
	if (!w)
		return FP_DIR6_ASK_TRIE;
	word = *w;      /* one load: entry and version together */
	e = (__u32)word;
	ver = word >> 32;
	cover = e & 0xFFFF;
	for (i = 0; i < FP_DIR6_HOPS && (e >> 24) == FP_DIR6_DESCEND; i++)
		e = fp_dir6_step(hi, ver, e);
	if ((e >> 24) != FP_DIR6_VAL)
		return FP_DIR6_ASK_TRIE;
	slot = e & 0xFFFF;
	if (slot == FP_DIR6_INHERIT)
		slot = cover;
	return slot == FP_DIR6_INHERIT ? FP_DIR6_NONE : slot;
}

/* The key doubles as the caller's stack copy of the address. */
static __always_inline struct fp_route *fp_fib6_lookup(struct fp_lpm6_key *key)
{
	__u32 a0, a1, slot;

	key->prefixlen = 128;
	if (fp_cfg.fib6_dir) {
		__builtin_memcpy(&a0, key->addr, 4);
		__builtin_memcpy(&a1, key->addr + 4, 4);
		slot = fp_fib6_dir_slot(((__u64)bpf_ntohl(a0) << 32) | bpf_ntohl(a1));
		if (slot == FP_DIR6_NONE)
			return NULL;
		if (slot != FP_DIR6_ASK_TRIE)
			return fp_lookup_apart(&fp_fib6_vals, &slot);
	}
	return fp_lookup_apart(&fp_fib6, key);
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
