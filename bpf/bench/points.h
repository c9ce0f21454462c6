/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * points.h — what the execution-point study's programs (`fastpath bench
 * points`) share: one per-CPU packet counter and the checksum work unit.
 */
#ifndef FP_BENCH_POINTS_H
#define FP_BENCH_POINTS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* The bench's upper bound for N (the paper went to 150). */
#define POINTS_CSUM_MAX 150

/* Packets this program saw, per CPU (the bench sums over CPUs). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} points_count SEC(".maps");

static __always_inline void points_count_one(void)
{
	__u32 zero = 0;
	__u64 *c = bpf_map_lookup_elem(&points_count, &zero);

	if (c)
		*c += 1;
}

/*
 * One unit of the paper's "processing complexity": the ones' complement sum
 * over the 20-byte IPv4 header at p, folded to 16 bits, plus the previous
 * result so the rounds form a chain.
 */
static __always_inline __u32 points_csum_once(const __u16 *p, __u32 prev)
{
	__u32 s = prev;
	int i;

#pragma unroll
	for (i = 0; i < 10; i++)
		s += p[i];
	s = (s & 0xFFFF) + (s >> 16);
	s = (s & 0xFFFF) + (s >> 16);
	return s;
}

/*
 * n rounds over the IPv4 header behind the Ethernet header. barrier_var()
 * hides from the compiler that the pointer is the same every round, so each
 * round really loads and sums the header again instead of being hoisted out
 * of the loop. Returns 0 when the frame is too short for a header.
 */
static __always_inline __u32 points_csum(void *data, void *data_end, __u32 n)
{
	__u32 acc = 0;
	int i;

	/* A real loop, as the paper's N is a loop count, not unrolled code. */
#pragma clang loop unroll(disable)
	for (i = 0; i < POINTS_CSUM_MAX; i++) {
		const __u16 *ip = data + 14;

		if (i >= n)
			break;
		barrier_var(ip);
		if ((void *)(ip + 10) > data_end)
			return 0;
		acc = points_csum_once(ip, acc);
	}
	return acc;
}

#endif /* FP_BENCH_POINTS_H */
