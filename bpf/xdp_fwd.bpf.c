/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * xdp_fwd — the forwarding fast path, one instance per managed interface.
 *
 * A packet is forwarded here only when fastpath's tables say exactly what
 * the kernel would do with it; every other packet leaves with XDP_PASS,
 * unmodified, and is counted under the reason (per CPU, per ingress slot,
 * packets and frame bytes). Forwarded packets are counted with the length
 * actually transmitted.
 *
 * Order of checks, modelled on the kernel's receive and forward path so
 * that the reason names the step at which the kernel itself would decide:
 *   ingress known -> L2 (VLAN, not IP, group MAC, other host)
 *   -> IP header sanity (ip_rcv_core / ipv6_rcv: malformed, options,
 *      fragments, IPv6 extension headers)
 *   -> address classes (ip_route_input_slow: martian, multicast,
 *      link-local)
 *   -> runtime switches (policy routing, table full): they say our FIB
 *      cannot be trusted, so they come before any lookup
 *   -> FIB (local, blackhole, unreachable, prohibit, punt, no route)
 *   -> forwarding sysctl (the kernel tests it after the local check)
 *   -> IPv4 source validation (fib_validate_source: rp_filter, own address
 *      as source)
 *   -> ip_forward / ip6_forward: TTL, egress, same interface, MTU
 *   -> neighbour -> devmap -> rewrite.
 * Since every punt is the same XDP_PASS, the order only affects which
 * counter moves, never the bytes on the wire.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "fib.h"
#include "neigh.h"
#include "tx.h"
#include "stats.h"

/* The whole .bss: the daemon writes it as one value. Nothing else goes here. */
struct fp_runtime fp_rt;

static __always_inline __u32
fp_fwd_ip4(struct xdp_md *ctx, const struct fp_iface *in, __u32 in_ifindex, __u32 *len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + FP_ETH_HLEN;
	const struct fp_route *rt;
	struct fp_tx tx;
	__u32 tot_len, r;
	__u8 vihl;

	if ((void *)(ip + 1) > data_end)
		return FP_R_MALFORMED;
	vihl = *(__u8 *)ip;
	if ((vihl >> 4) != 4 || (vihl & 0xF) < 5)
		return FP_R_MALFORMED;
	if ((vihl & 0xF) > 5)
		return FP_R_IP_OPTIONS;
	tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len < FP_IP4_HLEN || tot_len > *len - FP_ETH_HLEN)
		return FP_R_MALFORMED;
	if (!fp_ip4_csum_ok(ip))
		return FP_R_MALFORMED;
	if (ip->frag_off & bpf_htons(FP_IP4_FRAG_MASK))
		return FP_R_FRAGMENT;
	r = fp_ip4_addr_reason(ip->saddr, ip->daddr);
	if (r)
		return r;

	if (fp_rt.policy_punt & FP_FAM_V4)
		return FP_R_POLICY_ROUTING;
	if (fp_rt.table_full & FP_FAM_V4)
		return FP_R_TABLE_FULL;

	rt = fp_fib4_lookup(ip->daddr);
	if (!rt)
		return FP_R_NO_ROUTE;
	r = fp_route_reason(rt);
	if (r != FP_R_FORWARDED)
		return r;
	if (!(in->flags & FP_IF_FWD4))
		return FP_R_FORWARDING_DISABLED;
	r = fp_ip4_rpf_reason(in, in_ifindex, ip->saddr, fp_rt.src_lpm);
	if (r)
		return r;
	if (ip->ttl <= 1)
		return FP_R_TTL_EXCEEDED;

	r = fp_tx_resolve(&tx, rt, in_ifindex, FP_AF_INET, ip->daddr, NULL, tot_len);
	if (r != FP_R_FORWARDED)
		return r;
	r = fp_tx_commit(ctx, &tx, len, FP_ETH_HLEN + tot_len, fp_rt.neigh_clock);
	if (r != FP_R_FORWARDED)
		return r;

	/* The trim invalidated every packet pointer. */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	ip = data + FP_ETH_HLEN;
	if ((void *)(ip + 1) > data_end)
		return FP_R_REDIRECT_FAILED;
	fp_tx_rewrite_eth(data, &tx);
	fp_ip4_dec_ttl(ip);
	return FP_R_FORWARDED;
}

static __always_inline __u32
fp_fwd_ip6(struct xdp_md *ctx, const struct fp_iface *in, __u32 in_ifindex, __u32 *len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + FP_ETH_HLEN;
	struct fp_lpm6_key key;
	const struct fp_route *rt;
	struct fp_tx tx;
	__u32 ip_len, r;

	if ((void *)(ip6 + 1) > data_end)
		return FP_R_MALFORMED;
	if ((*(__u8 *)ip6 >> 4) != 6)
		return FP_R_MALFORMED;
	ip_len = FP_IP6_HLEN + bpf_ntohs(ip6->payload_len);
	if (ip_len > *len - FP_ETH_HLEN)
		return FP_R_MALFORMED;
	r = fp_ip6_addr_reason(&ip6->saddr, &ip6->daddr);
	if (r)
		return r;
	if (fp_ip6_is_ext_hdr(ip6->nexthdr))
		return FP_R_IPV6_EXT_HDR;

	if (fp_rt.policy_punt & FP_FAM_V6)
		return FP_R_POLICY_ROUTING;
	if (fp_rt.table_full & FP_FAM_V6)
		return FP_R_TABLE_FULL;

	__builtin_memcpy(key.addr, &ip6->daddr, sizeof(key.addr));
	rt = fp_fib6_lookup(&key);
	if (!rt)
		return FP_R_NO_ROUTE;
	r = fp_route_reason(rt);
	if (r != FP_R_FORWARDED)
		return r;
	if (!(in->flags & FP_IF_FWD6))
		return FP_R_FORWARDING_DISABLED;
	if (ip6->hop_limit <= 1)
		return FP_R_TTL_EXCEEDED;

	r = fp_tx_resolve(&tx, rt, in_ifindex, FP_AF_INET6, 0, key.addr, ip_len);
	if (r != FP_R_FORWARDED)
		return r;
	r = fp_tx_commit(ctx, &tx, len, FP_ETH_HLEN + ip_len, fp_rt.neigh_clock);
	if (r != FP_R_FORWARDED)
		return r;

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	ip6 = data + FP_ETH_HLEN;
	if ((void *)(ip6 + 1) > data_end)
		return FP_R_REDIRECT_FAILED;
	fp_tx_rewrite_eth(data, &tx);
	ip6->hop_limit--;
	return FP_R_FORWARDED;
}

static __always_inline __u32
fp_fwd(struct xdp_md *ctx, const struct fp_iface *in, __u32 in_ifindex, __u32 *len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__be16 proto;

	if ((void *)(eth + 1) > data_end)
		return FP_R_MALFORMED;
	proto = eth->h_proto;
	if (proto == bpf_htons(FP_ETH_P_8021Q) || proto == bpf_htons(FP_ETH_P_8021AD))
		return FP_R_VLAN;
	if (proto != bpf_htons(FP_ETH_P_IP) && proto != bpf_htons(FP_ETH_P_IPV6))
		return FP_R_NOT_IP;
	if (fp_mac_is_group(eth->h_dest))
		return FP_R_MULTICAST;
	if (!fp_mac_eq(eth->h_dest, in->mac))
		return FP_R_L2_OTHER_HOST;
	if (proto == bpf_htons(FP_ETH_P_IP))
		return fp_fwd_ip4(ctx, in, in_ifindex, len);
	return fp_fwd_ip6(ctx, in, in_ifindex, len);
}

SEC("xdp")
int fp_xdp_fwd(struct xdp_md *ctx)
{
	__u32 in_ifindex = ctx->ingress_ifindex;
	__u32 len = ctx->data_end - ctx->data;
	const struct fp_iface *in;
	__u32 slot = 0, reason;

	in = bpf_map_lookup_elem(&fp_ifaces, &in_ifindex);
	if (in) {
		slot = in->slot;
		reason = fp_fwd(ctx, in, in_ifindex, &len);
	} else {
		reason = FP_R_INGRESS_UNKNOWN;
	}
	fp_count(slot, reason, len);
	return reason == FP_R_FORWARDED ? XDP_REDIRECT : XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
