/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sink.bpf.c — the benchmark's receiver: counts every IPv4 frame arriving on
 * the sink's veth and sends it back to the generator out of s1
 * (loop_ifindex; gen.bpf.c says why the frames go round), or drops it when
 * there is no loop (unit tests). Everything else (ARP) goes up to the sink's
 * stack, so the sink still answers the router like a host would if the
 * router ever has to resolve it. Being an XDP program on that veth is also
 * what makes the router's veth accept XDP-redirected frames towards it.
 * With expect_saddr set it also counts frames from any other IPv4 source:
 * a bench whose router translates addresses (source NAT) checks that it did.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

struct sink_count {
	__u64 packets;
	__u64 bytes;
};

/* s1, the veth back to the generator; 0: drop what was counted. */
const volatile __u32 loop_ifindex = 0;

/* The IPv4 source every frame should carry (network order); 0: any. */
const volatile __u32 expect_saddr = 0;

/* Frames seen by the sink, per CPU (the bench sums and zeroes them). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sink_count);
} sink_stats SEC(".maps");

/* Frames from another source than expect_saddr, per CPU; never zeroed. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sink_strays SEC(".maps");

static __always_inline int sink(struct xdp_md *ctx, __u16 proto)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct sink_count *c;
	__u64 *strays;
	__u32 zero = 0;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(proto))
		return XDP_PASS;
	if (expect_saddr && ((void *)(ip + 1) > data_end || ip->saddr != expect_saddr)) {
		strays = bpf_map_lookup_elem(&sink_strays, &zero);
		if (strays)
			(*strays)++;
	}
	c = bpf_map_lookup_elem(&sink_stats, &zero);
	if (c) {
		c->packets++;
		c->bytes += ctx->data_end - ctx->data;
	}
	return loop_ifindex ? bpf_redirect(loop_ifindex, 0) : XDP_DROP;
}

SEC("xdp")
int fp_bench_sink(struct xdp_md *ctx)
{
	return sink(ctx, ETH_P_IP);
}

/* The same counting IPv6 frames (`fastpath bench --family 6`); expect_saddr
 * is for IPv4 only and stays 0. */
SEC("xdp")
int fp_bench_sink6(struct xdp_md *ctx)
{
	return sink(ctx, ETH_P_IPV6);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
