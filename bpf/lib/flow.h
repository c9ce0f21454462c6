/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * flow.h — the per-CPU flow cache (FreeBSD paper's flow table): the key,
 * the flow hash, lookup, and filling a way after a full lookup.
 *
 * A set is found by the flow hash (the NIC's when it gave one, else our
 * own), the way by comparing the whole key, so a hash collision can only
 * cost a miss. An entry is trusted only while its generation is the
 * current table generation and it has been used within the idle timeout;
 * anything else is recomputed by the full path.
 */
#ifndef FP_FLOW_H
#define FP_FLOW_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"
#include "tx.h"
#include "flowhash.h"
#include "mphash.h"

/*
 * The set of flow hash @hash in this CPU's slice of fp_flows (@sets sets,
 * a power of two). XDP runs with migration disabled, so the slice stays
 * this CPU's for the whole packet.
 */
static __always_inline __u32 fp_flow_index(__u32 hash, __u32 sets)
{
	return bpf_get_smp_processor_id() * sets + (hash & (sets - 1));
}

/*
 * TCP/UDP ports belong in a flow key of @family (FP_AF_*): always, except
 * with `--flow-key addresses` (fp_config.flow_key_addrs), where only a
 * multipath hash policy of 1 for the family, or 3 with a port among its
 * fields, needs them: the kernel then picks an ECMP path by them. Under
 * policy 0 it hashes the addresses only,
 * and nothing else a stateless forward decides reads the ports. A change of
 * policy or fields comes with a generation bump, so no entry keyed the other way is
 * trusted after it.
 */
static __always_inline bool fp_flow_ports(const volatile struct fp_config *cfg, const struct fp_runtime *rt,
					  __u8 family)
{
	__u8 policy;
	__u32 fields;

	if (!cfg->flow_key_addrs)
		return true;
	policy = family == FP_AF_INET ? rt->mp_policy4 : rt->mp_policy6;
	fields = family == FP_AF_INET ? rt->mp_fields4 : rt->mp_fields6;
	return policy == 1 || (policy == 3 && (fields & (FP_MP_F_SRC_PORT | FP_MP_F_DST_PORT)));
}

_Static_assert(sizeof(struct fp_flow_way) == 64 && sizeof(struct fp_flow_way4) == 64, "a way is one cache line");
_Static_assert(__builtin_offsetof(struct fp_flow_way4, nh_id) == __builtin_offsetof(struct fp_flow_way, nh_id),
	       "an IPv4 way keeps the result where every way has it");
_Static_assert(sizeof(struct fp_flow_key4) == 16 && __builtin_offsetof(struct fp_flow_key4, saddr) == 8,
	       "an IPv4 key is two words, family to dport first as in fp_flow_key");
_Static_assert(sizeof(struct fp_ct_way) == 64 && sizeof(struct fp_ct_hot) == 16, "a conntrack way is one line");

static __always_inline struct fp_flow_way4 *fp_flow_way4(struct fp_flow_set *s, __u32 w)
{
	return (struct fp_flow_way4 *)&s->way[w & (FP_FLOW_WAYS - 1)];
}

/* The way an IPv4 flow of hash @hash is filled into when it is free. */
static __always_inline __u32 fp_flow_home(__u32 hash)
{
	return (hash >> 28) & (FP_FLOW_WAYS - 1);
}

static __always_inline bool fp_flow_key_eq(const struct fp_flow_key *a, const struct fp_flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	const __u32 *x4 = (const __u32 *)a, *y4 = (const __u32 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4]) |
		(x4[10] ^ y4[10])) == 0;
}

/* @k (IPv4) packed as an IPv4 way holds it. */
static __always_inline void fp_flow_key4(struct fp_flow_key4 *k4, const struct fp_flow_key *k)
{
	__builtin_memcpy(k4, k, 8);
	k4->saddr = *(const __u32 *)k->saddr;
	k4->daddr = *(const __u32 *)k->daddr;
}

/*
 * An IPv4 key as the two words a way stores it in (struct fp_flow_key4):
 * family to dport, then saddr | daddr << 32.
 */
static __always_inline __u64 fp_flow_key4_addrs(const struct fp_flow_key *k)
{
	return *(const __u32 *)k->saddr | (__u64)*(const __u32 *)k->daddr << 32;
}

/* Way @w of @s holds the IPv4 key (@key0, @addrs): its first 16 bytes only. */
static __always_inline bool fp_flow_way4_is(const struct fp_flow_set *s, __u32 w, __u64 key0, __u64 addrs)
{
	const __u64 *x = (const __u64 *)&s->way[w & (FP_FLOW_WAYS - 1)];

	return ((x[0] ^ key0) | (x[1] ^ addrs)) == 0;
}

/*
 * The way of @s holding @k (of any generation), or -1, by the tags in the
 * set's first line; a way's key line is read only when its tag matches.
 * Hand-unrolled: the verifier then sees constant offsets.
 */
static __always_inline int fp_flow_find(const struct fp_flow_set *s, const struct fp_flow_key *k, __u32 tag)
{
	_Static_assert(FP_FLOW_WAYS == 4, "fp_flow_find is unrolled for 4 ways");
	if (s->tag[0] == tag && fp_flow_key_eq(&s->way[0].key, k))
		return 0;
	if (s->tag[1] == tag && fp_flow_key_eq(&s->way[1].key, k))
		return 1;
	if (s->tag[2] == tag && fp_flow_key_eq(&s->way[2].key, k))
		return 2;
	if (s->tag[3] == tag && fp_flow_key_eq(&s->way[3].key, k))
		return 3;
	return -1;
}

/*
 * The same for an IPv4 key (@key0, @addrs) of hash @tag: its home way
 * first, without the set's first line (most IPv4 hits read one line), then
 * the others by their tags.
 */
static __always_inline int fp_flow_find4(const struct fp_flow_set *s, __u64 key0, __u64 addrs, __u32 tag)
{
	__u32 w = fp_flow_home(tag);

	if (fp_flow_way4_is(s, w, key0, addrs))
		return w;
	if (s->tag[0] == tag && fp_flow_way4_is(s, 0, key0, addrs))
		return 0;
	if (s->tag[1] == tag && fp_flow_way4_is(s, 1, key0, addrs))
		return 1;
	if (s->tag[2] == tag && fp_flow_way4_is(s, 2, key0, addrs))
		return 2;
	if (s->tag[3] == tag && fp_flow_way4_is(s, 3, key0, addrs))
		return 3;
	return -1;
}

/*
 * Way @w of @s holds the IPv6 key whose words are @x (fp_flow_hash_sw6_words()'s
 * six, the last a half word): fp_flow_key_eq() without a key to compare.
 */
static __always_inline bool fp_flow_way6_is(const struct fp_flow_set *s, __u32 w, const __u64 *x)
{
	const __u64 *k = (const __u64 *)&s->way[w & (FP_FLOW_WAYS - 1)].key;
	const __u32 *k4 = (const __u32 *)k;

	return ((k[0] ^ x[0]) | (k[1] ^ x[1]) | (k[2] ^ x[2]) | (k[3] ^ x[3]) | (k[4] ^ x[4]) |
		(k4[10] ^ (__u32)x[5])) == 0;
}

/* fp_flow_find() for an IPv6 key given as its words. */
static __always_inline int fp_flow_find6(const struct fp_flow_set *s, const __u64 *x, __u32 tag)
{
	_Static_assert(FP_FLOW_WAYS == 4, "fp_flow_find6 is unrolled for 4 ways");
	if (s->tag[0] == tag && fp_flow_way6_is(s, 0, x))
		return 0;
	if (s->tag[1] == tag && fp_flow_way6_is(s, 1, x))
		return 1;
	if (s->tag[2] == tag && fp_flow_way6_is(s, 2, x))
		return 2;
	if (s->tag[3] == tag && fp_flow_way6_is(s, 3, x))
		return 3;
	return -1;
}

/* Generation and last use of way @w: in the way itself for IPv4. */
static __always_inline __u32 fp_flow_gen(struct fp_flow_set *s, __u32 w, bool v4)
{
	w &= FP_FLOW_WAYS - 1;
	return v4 ? fp_flow_way4(s, w)->generation : s->generation[w];
}

static __always_inline __u32 fp_flow_used(struct fp_flow_set *s, __u32 w, bool v4)
{
	w &= FP_FLOW_WAYS - 1;
	return v4 ? fp_flow_way4(s, w)->used : s->used[w];
}

/* Way @w is no longer to be trusted (whatever its family). */
static __always_inline void fp_flow_invalidate(struct fp_flow_set *s, __u32 w)
{
	w &= FP_FLOW_WAYS - 1;
	s->generation[w] = 0;
	if (s->way[w].key.family == FP_AF_INET)
		fp_flow_way4(s, w)->generation = 0;
}

/*
 * Victim test by the set's first line, which mirrors every way's generation
 * and (to the clock tick) its last use, IPv4 ways included.
 */
static __always_inline bool fp_flow_live(const struct fp_flow_set *s, __u32 w, __u32 gen, __u32 clock, __u32 timeout)
{
	w &= FP_FLOW_WAYS - 1;
	return s->generation[w] == gen && clock - s->used[w] <= timeout;
}

/*
 * Way to fill for a new flow: an empty or stale one first, from the flow's
 * home way on, then an idle one, else the least recently used (by
 * keep-alive clock second; ties go to the first seen from home, so equal
 * ages do not always evict the same way). Sets *@evict when a live flow is
 * pushed out. Reads only the set's first line.
 */
static __always_inline __u32
fp_flow_victim(const struct fp_flow_set *s, __u32 hash, __u32 gen, __u32 clock, __u32 timeout, bool *evict)
{
	__u32 i, w, best = 0, best_used = 0xFFFFFFFF;

#pragma unroll
	for (i = 0; i < FP_FLOW_WAYS; i++) {
		w = (i + fp_flow_home(hash)) & (FP_FLOW_WAYS - 1);
		if (!fp_flow_live(s, w, gen, clock, timeout)) {
			*evict = false;
			return w;
		}
		if (s->used[w] < best_used) {
			best_used = s->used[w];
			best = w;
		}
	}
	*evict = true;
	return best;
}

/*
 * Stores the result of a full lookup for @k in way @w of @s. @same: the way
 * held this very key already (stale or idle), so an IPv4 way's conntrack
 * verdict still stands; a new flow's starts empty.
 */
static __always_inline void
fp_flow_fill(struct fp_flow_set *s, __u32 w, __u32 tag, const struct fp_flow_key *k, const struct fp_tx *tx,
	     __u32 gen, __u32 clock, bool v4, bool same)
{
	struct fp_flow_way *f;

	w &= FP_FLOW_WAYS - 1;
	f = &s->way[w];
	if (v4) {
		struct fp_flow_way4 *f4 = fp_flow_way4(s, w);

		fp_flow_key4(&f4->key, k);
		if (!same)
			f4->ct = (struct fp_ct_hot){};
		f4->generation = gen;
		f4->used = clock;
		f4->packets = 1;
		s->packets[w] = 0;
	} else {
		f->key = *k;
		s->packets[w] = 1;
	}
	f->nh_id = tx->nh_id;
	__builtin_memcpy(f->dmac, tx->dmac, FP_ETH_ALEN);
	__builtin_memcpy(f->smac, tx->smac, FP_ETH_ALEN);
	f->slot = tx->slot;
	f->mtu = tx->mtu > 0xFFFF ? 0xFFFF : tx->mtu;
	s->tag[w] = tag;
	s->generation[w] = gen;
	s->used[w] = clock;
}

/*
 * A pseudo-random number from the guard's xorshift32 state, seeded from
 * @seed (a flow hash) the first time. No helper call: the callers sit in
 * the program's deepest frames, where a call's spills would not fit.
 */
static __always_inline __u32 fp_flow_guard_rand(struct fp_flow_guard *g, __u32 seed)
{
	__u32 x = g->rand ? g->rand : seed | 1;

	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	g->rand = x;
	return x;
}

/*
 * The thrash guard (struct fp_flow_guard) sees a lookup: once a window is
 * full, judge it; while bypassing, start the next run of packets sent past
 * the cache. @clock: fp_runtime.neigh_clock; @hash: the flow hash.
 */
static __always_inline void fp_flow_guard_probed(struct fp_flow_guard *g, __u32 clock, __u32 hash)
{
	bool crowded;

	if (g->left > 1) {
		g->left--;
	} else {
		crowded = g->left && g->crowded * 2 > FP_FLOW_GUARD_WINDOW;
		if (crowded && !g->bypass)
			g->since = clock;
		if (!crowded)
			g->bypass = 0;
		else if (g->bypass <= FP_FLOW_GUARD_DEEPEN)
			g->bypass++;
		g->crowded = 0;
		g->left = FP_FLOW_GUARD_WINDOW;
	}
	/* 0 to 2 * gap - 1 packets past the cache, gap - 1/2 on average, the
	 * gap SAMPLE doubled for each crowded window in a row after the first. */
	if (g->bypass)
		g->skip = fp_flow_guard_rand(g, hash) & ((2 * FP_FLOW_GUARD_SAMPLE << ((g->bypass - 1) & 7)) - 1);
}

_Static_assert(__builtin_offsetof(struct fp_flow_way4, dmac) % 8 == 0 &&
	       __builtin_offsetof(struct fp_flow_way4, smac) == __builtin_offsetof(struct fp_flow_way4, dmac) + 6,
	       "a way's MACs are 12 aligned bytes, a frame's first 12");

/* The new L2 addresses from an IPv4 way: two loads and two stores. */
static __always_inline void fp_flow_rewrite_eth(struct ethhdr *eth, const struct fp_flow_way4 *f)
{
	const __u64 *m = (const __u64 *)f->dmac;

	*(__u64 *)eth = m[0];
	*(__u32 *)((__u8 *)eth + 8) = *(const __u32 *)(m + 1);
}

#endif /* FP_FLOW_H */
