/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* stats.h — per-CPU, per-ingress-slot counters by reason. */
#ifndef FP_STATS_H
#define FP_STATS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"

/*
 * Per-CPU entries need no atomics. A slot the map does not have (the daemon
 * handing out more than FP_MAX_IFACES) falls back to slot 0 so that no
 * packet goes uncounted.
 */
static __always_inline struct fp_stats *fp_stats_of(__u32 *slot)
{
	struct fp_stats *st = bpf_map_lookup_elem(&fp_stats, slot);

	if (!st) {
		*slot = 0;
		st = bpf_map_lookup_elem(&fp_stats, slot);
	}
	return st;
}

static __always_inline void fp_count(struct fp_stats *st, __u32 reason, __u64 bytes)
{
	/*
	 * Unreachable by construction; the bound is for the verifier. The
	 * empty asm keeps clang from proving it redundant and dropping it.
	 */
	asm volatile("" : "+r"(reason));
	if (reason >= FP_R__COUNT)
		reason = FP_R_ROUTE_UNSUPPORTED;
	st->packets[reason]++;
	st->bytes[reason] += bytes;
}

#endif /* FP_STATS_H */
