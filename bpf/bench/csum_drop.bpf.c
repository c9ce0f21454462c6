/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * csum_drop.bpf.c — workload (b) of `fastpath bench points`: N IPv4 header
 * checksum computations per frame, then drop (the paper's proxy for "how
 * much work the offloaded program does"). N is a load-time constant; the
 * bench reloads the object for each N. The result goes into a per-CPU sink
 * so the work cannot be optimised away. XDP (native or generic) and
 * cls_bpf direct-action entry points run the same loop; the AF_XDP point
 * does the same arithmetic in Rust.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "points.h"

#define TC_ACT_SHOT 2

const volatile __u32 csum_rounds = 0;

/* Last result per CPU: keeps the loop's output live. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} points_csum_sink SEC(".maps");

static __always_inline void csum_and_count(void *data, void *data_end)
{
	__u32 zero = 0, *out;
	__u32 r = points_csum(data, data_end, csum_rounds);

	out = bpf_map_lookup_elem(&points_csum_sink, &zero);
	if (out)
		*out = r;
	points_count_one();
}

SEC("xdp")
int fp_points_xdp_csum(struct xdp_md *ctx)
{
	csum_and_count((void *)(long)ctx->data, (void *)(long)ctx->data_end);
	return XDP_DROP;
}

SEC("tc")
int fp_points_tc_csum(struct __sk_buff *skb)
{
	/* The generic path may leave the headers outside the linear area. */
	bpf_skb_pull_data(skb, 34);
	csum_and_count((void *)(long)skb->data, (void *)(long)skb->data_end);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
