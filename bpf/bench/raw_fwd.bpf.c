/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * raw_fwd.bpf.c — the benchmark's upper bound: what an XDP router costs when
 * it does nothing but rewrite the MACs and redirect. No table lookups, no TTL,
 * no checks beyond "is it the bench's protocol" (IPv4, or IPv6 for `fastpath
 * bench --family 6`); it forwards every such frame to the one egress in
 * raw_tx. Never use it outside the bench.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_P_IP 0x0800

/* New destination then source MAC, as three 16-bit words each (wire order). */
const volatile __u16 raw_macs[6];
/* The EtherType forwarded, wire order (the rest is passed). */
const volatile __u16 raw_proto = bpf_htons(ETH_P_IP);

/* Slot 0: the egress device. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} raw_tx SEC(".maps");

SEC("xdp")
int fp_bench_raw_fwd(struct xdp_md *ctx)
{
	__u16 *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	int i;

	if ((void *)(data + 7) > data_end)
		return XDP_PASS;
	if (data[6] != raw_proto)
		return XDP_PASS;

#pragma unroll
	for (i = 0; i < 6; i++)
		data[i] = raw_macs[i];
	return bpf_redirect_map(&raw_tx, 0, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
