/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * drop.bpf.c — workload (a) of `fastpath bench points`: count and drop every
 * frame, at each execution point the box offers. The same two lines run as
 * native XDP and generic (skb) XDP (fp_points_xdp_drop, attached in either
 * mode), as a cls_bpf direct-action classifier (fp_points_tc_drop) and, for
 * the AF_XDP point, as the redirect that hands each frame to the user-space
 * drop loop (fp_points_xsk; the loop counts what it receives, so the
 * redirect counts nothing).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "points.h"

#define TC_ACT_SHOT 2

/* One AF_XDP socket per RX queue of the router's veth. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} points_xsks SEC(".maps");

SEC("xdp")
int fp_points_xdp_drop(struct xdp_md *ctx)
{
	points_count_one();
	return XDP_DROP;
}

SEC("tc")
int fp_points_tc_drop(struct __sk_buff *skb)
{
	points_count_one();
	return TC_ACT_SHOT;
}

/* A queue without a socket drops: the study measures user space or nothing. */
SEC("xdp")
int fp_points_xsk(struct xdp_md *ctx)
{
	return bpf_redirect_map(&points_xsks, ctx->rx_queue_index, XDP_DROP);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
