/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * hints.bpf.c — the hints paper's three drop programs, with fastpath's own
 * flow-hash work, timed by `fastpath bench hints` with BPF_PROG_RUN:
 *
 *   XDP1       parse Ethernet/IPv4/L4 and compute the software flow hash
 *              over fastpath's flow key, as fp_xdp_fwd does without a hint;
 *   XDP_HINTS  take the hash from the struct fp_rx_hint an upstream program
 *              (a NIC) left in the metadata area, as fp_xdp_fwd does with one;
 *   XDP3       no work.
 *
 * Each ends in XDP_DROP when it got its hash and XDP_PASS when not, so the
 * bench can tell that the path it timed is the one it meant (a missing hint
 * is not a cheap hint). The hash goes to a global so the compiler cannot drop
 * the work that produced it.
 *
 * The hash is the data path's own (bpf/lib/flowhash.h).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "fastpath.h"
#include "flowhash.h"

#define ETH_P_IP 0x0800
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define AF_INET_ 2      /* FP_AF_INET of bpf/lib/parse.h */

__u32 hints_hash;


SEC("xdp")
int fp_bench_xdp1_parse(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct fp_flow_key k __attribute__((aligned(8))) = {};
	struct iphdr *ip;
	__u16 *ports;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl != 5)
		return XDP_PASS;
	k.family = AF_INET_;
	k.proto = ip->protocol;
	*(__be32 *)k.saddr = ip->saddr;
	*(__be32 *)k.daddr = ip->daddr;
	if (k.proto == IPPROTO_TCP_ || k.proto == IPPROTO_UDP_) {
		ports = (void *)(ip + 1);
		if ((void *)(ports + 2) > data_end)
			return XDP_PASS;
		k.sport = ports[0];
		k.dport = ports[1];
	}
	hints_hash = fp_flow_hash_sw4(&k);
	return XDP_DROP;
}

SEC("xdp")
int fp_bench_xdp_hints(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	struct fp_rx_hint *h = (void *)(long)ctx->data_meta;

	/* The same two tests fp_take_meta_hint() makes: bounds, exact size. */
	if ((void *)(h + 1) > data)
		return XDP_PASS;
	asm volatile("" : "+r"(data));
	if ((void *)(h + 1) != data || h->magic != FP_HINT_MAGIC)
		return XDP_PASS;
	hints_hash = h->hash;
	return XDP_DROP;
}

SEC("xdp")
int fp_bench_xdp3_none(struct xdp_md *ctx)
{
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
