/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * raw_fwd.bpf.c — the benchmark's upper bound: what an XDP router costs when
 * it does nothing but rewrite the MACs and redirect. No table lookups, no TTL,
 * no checks beyond "is it IPv4"; it forwards every IPv4 frame to the one
 * egress in raw_tx (fp_bench_raw_fwd6: every IPv6 frame, for `fastpath bench
 * --family 6`). Never use it outside the bench.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

/* New destination then source MAC, as three 16-bit words each (wire order). */
const volatile __u16 raw_macs[6];

/* Slot 0: the egress device. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} raw_tx SEC(".maps");

static __always_inline int raw_fwd(struct xdp_md *ctx, __u16 proto)
{
	__u16 *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	int i;

	if ((void *)(data + 7) > data_end)
		return XDP_PASS;
	if (data[6] != bpf_htons(proto))
		return XDP_PASS;

#pragma unroll
	for (i = 0; i < 6; i++)
		data[i] = raw_macs[i];
	return bpf_redirect_map(&raw_tx, 0, 0);
}

SEC("xdp")
int fp_bench_raw_fwd(struct xdp_md *ctx)
{
	return raw_fwd(ctx, ETH_P_IP);
}

SEC("xdp")
int fp_bench_raw_fwd6(struct xdp_md *ctx)
{
	return raw_fwd(ctx, ETH_P_IPV6);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
