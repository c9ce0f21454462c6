/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nat_test.bpf.c — runs bpf/lib/nat.h under BPF_PROG_RUN so
 * crates/fastpath-bpf/tests/nat.rs can compare its rewrite with what the
 * kernel's nf_nat sent for the same packet. Test-only; never attached.
 *
 * The input is an Ethernet frame (IPv4 without options or IPv6 without
 * extension headers, TCP or UDP) exactly as it entered the router. The
 * program looks the flow up in the conntrack of the namespace it runs in
 * (the one whose kernel NATed the packet), fills an fp_nat from the entry
 * and rewrites the frame in place as the forwarding program would: NAT,
 * then the TTL / hop limit. Returns XDP_PASS with the rewritten frame, or
 * XDP_DROP with out_err set. What it saw goes to the globals below.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "fastpath.h"
#include "parse.h"
#include "csum.h"
#include "nat.h"

extern struct nf_conn *bpf_xdp_ct_lookup(struct xdp_md *ctx, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

/* 1 parse, 2 no conntrack entry (out_ct_err), 3 fp_nat_from_ct refused */
__s32 out_err;
__s32 out_ct_err;
__u32 out_dir;
__u64 out_status;
struct fp_nat out_nat;

SEC("xdp")
int fp_nat_test(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct bpf_sock_tuple t = {};
	struct bpf_ct_opts opts = { .netns_id = -1 };
	struct fp_nat nat = {};
	struct nf_conn *ct;
	struct iphdr *ip = NULL;
	struct ipv6hdr *ip6 = NULL;
	__u32 tsz, r;
	bool v6 = false;
	__u8 proto;
	void *l4;

	out_err = 1;
	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	if (eth->h_proto == bpf_htons(FP_ETH_P_IP)) {
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ihl != 5)
			return XDP_DROP;
		proto = ip->protocol;
		l4 = ip + 1;
		t.ipv4.saddr = ip->saddr;
		t.ipv4.daddr = ip->daddr;
		tsz = sizeof(t.ipv4);
	} else if (eth->h_proto == bpf_htons(FP_ETH_P_IPV6)) {
		v6 = true;
		ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return XDP_DROP;
		proto = ip6->nexthdr;
		l4 = ip6 + 1;
		__builtin_memcpy(t.ipv6.saddr, &ip6->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, &ip6->daddr, 16);
		tsz = sizeof(t.ipv6);
	} else {
		return XDP_DROP;
	}
	if (proto == FP_IPPROTO_TCP) {
		if (l4 + sizeof(struct tcphdr) > end)
			return XDP_DROP;
	} else if (proto == FP_IPPROTO_UDP) {
		if (l4 + sizeof(struct udphdr) > end)
			return XDP_DROP;
	} else {
		return XDP_DROP;
	}
	/* TCP and UDP carry the ports at the same offsets. */
	if (!v6) {
		t.ipv4.sport = ((struct udphdr *)l4)->source;
		t.ipv4.dport = ((struct udphdr *)l4)->dest;
	} else {
		t.ipv6.sport = ((struct udphdr *)l4)->source;
		t.ipv6.dport = ((struct udphdr *)l4)->dest;
	}

	opts.l4proto = proto;
	ct = bpf_xdp_ct_lookup(ctx, &t, tsz, &opts, NF_BPF_CT_OPTS_SZ);
	if (!ct) {
		out_err = 2;
		out_ct_err = opts.error;
		return XDP_DROP;
	}
	out_dir = opts.dir;
	out_status = ct->status;
	r = fp_nat_from_ct(ct, opts.dir, &nat);
	bpf_ct_release(ct);
	out_nat = nat;
	if (r) {
		out_err = 3;
		return XDP_DROP;
	}

	/* As the forwarding program does it. */
	if (!fp_nat_rewrite(ctx, &nat))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (!v6) {
		ip = data + FP_ETH_HLEN;
		if ((void *)(ip + 1) > end)
			return XDP_DROP;
		fp_ip4_dec_ttl(ip);
	} else {
		ip6 = data + FP_ETH_HLEN;
		if ((void *)(ip6 + 1) > end)
			return XDP_DROP;
		ip6->hop_limit--;
	}
	out_err = 0;
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
