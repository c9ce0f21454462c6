/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * fib_fwd.bpf.c — the benchmark's reference XDP router: the plain
 * bpf_fib_lookup() forwarder everybody can write, in the design of
 * xdp-tools' xdp-forward (and the kernel's xdp_fwd sample before it).
 *
 * Per packet: parse Ethernet + IPv4/IPv6, leave TTL/hop limit <= 1 to the
 * kernel, ask the kernel's FIB (and its neighbour table, which
 * bpf_fib_lookup() consults) with the packet's addresses, check that the
 * egress is one of our TX ports, decrement the TTL with the incremental
 * checksum, write the MACs from the lookup result and redirect through a
 * devmap keyed by ifindex. Anything else — no route, no neighbour,
 * forwarding off, a frame too big (the helper checks the MTU) — is
 * XDP_PASSed. No flow state, no own tables: what fastpath is measured
 * against to show what its tables and cache buy. Bench only.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "csum.h"

#define ETH_P_IP   0x0800
#define ETH_P_IPV6 0x86DD
#define AF_INET    2
#define AF_INET6   10

/* Egress ports by ifindex, as xdp-forward keeps them: the loader adds every
 * interface it serves. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} fib_tx SEC(".maps");

SEC("xdp")
int fp_bench_fib_fwd(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct bpf_fib_lookup fib = {};
	struct ipv6hdr *ip6 = NULL;
	struct iphdr *ip = NULL;
	__u32 egress;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->ihl != 5)
			return XDP_PASS;
		if (ip->ttl <= 1)
			return XDP_PASS;
		fib.family = AF_INET;
		fib.tos = ip->tos;
		fib.l4_protocol = ip->protocol;
		fib.tot_len = bpf_ntohs(ip->tot_len);
		fib.ipv4_src = ip->saddr;
		fib.ipv4_dst = ip->daddr;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		if (ip6->hop_limit <= 1)
			return XDP_PASS;
		fib.family = AF_INET6;
		fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0FFFFFFF);
		fib.l4_protocol = ip6->nexthdr;
		fib.tot_len = bpf_ntohs(ip6->payload_len);
		__builtin_memcpy(fib.ipv6_src, &ip6->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, &ip6->daddr, 16);
	} else {
		return XDP_PASS;
	}
	fib.ifindex = ctx->ingress_ifindex;

	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_PASS;
	egress = fib.ifindex;
	/* A devmap redirect to a missing key fails after the rewrite; test
	 * first so the packet can still go up untouched. */
	if (!bpf_map_lookup_elem(&fib_tx, &egress))
		return XDP_PASS;

	if (ip)
		fp_ip4_dec_ttl(ip);
	else if (ip6)
		ip6->hop_limit--;
	__builtin_memcpy(eth->h_dest, fib.dmac, 6);
	__builtin_memcpy(eth->h_source, fib.smac, 6);
	return bpf_redirect_map(&fib_tx, egress, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
