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

/*
 * The set of flow hash @hash in this CPU's slice of fp_flows (@sets sets,
 * a power of two). XDP runs with migration disabled, so the slice stays
 * this CPU's for the whole packet.
 */
static __always_inline __u32 fp_flow_index(__u32 hash, __u32 sets)
{
	return bpf_get_smp_processor_id() * sets + (hash & (sets - 1));
}

static __always_inline bool fp_flow_key_eq(const struct fp_flow_key *a, const struct fp_flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	const __u32 *x4 = (const __u32 *)a, *y4 = (const __u32 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4]) |
		(x4[10] ^ y4[10])) == 0;
}

/*
 * The way of @s holding @k (of any generation), or -1. The tags live in the
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

static __always_inline bool fp_flow_live(const struct fp_flow_set *s, __u32 w, __u32 gen, __u32 clock, __u32 timeout)
{
	w &= FP_FLOW_WAYS - 1;
	return s->generation[w] == gen && clock - s->used[w] <= timeout;
}

/*
 * Way to fill for a new flow: an empty or stale one first, then an idle
 * one, else the least recently used (by keep-alive clock second; ties go to
 * the first seen from a hash-chosen start, so equal ages do not always
 * evict the same way). Sets *@evict when a live flow is pushed out. Reads
 * only the set's first line.
 */
static __always_inline __u32
fp_flow_victim(const struct fp_flow_set *s, __u32 hash, __u32 gen, __u32 clock, __u32 timeout, bool *evict)
{
	__u32 i, w, best = 0, best_used = 0xFFFFFFFF;

#pragma unroll
	for (i = 0; i < FP_FLOW_WAYS; i++) {
		w = (i + (hash >> 28)) & (FP_FLOW_WAYS - 1);
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

/* Stores the result of a full lookup for @k in way @w of @s. */
static __always_inline void
fp_flow_fill(struct fp_flow_set *s, __u32 w, __u32 tag, const struct fp_flow_key *k, const struct fp_tx *tx,
	     __u32 gen, __u32 clock)
{
	struct fp_flow_way *f;

	w &= FP_FLOW_WAYS - 1;
	f = &s->way[w];
	f->key = *k;
	f->nh_id = tx->nh_id;
	__builtin_memcpy(f->dmac, tx->dmac, FP_ETH_ALEN);
	__builtin_memcpy(f->smac, tx->smac, FP_ETH_ALEN);
	f->slot = tx->slot;
	f->mtu = tx->mtu > 0xFFFF ? 0xFFFF : tx->mtu;
	s->tag[w] = tag;
	s->generation[w] = gen;
	s->used[w] = clock;
	s->packets[w] = 1;
}

#endif /* FP_FLOW_H */
