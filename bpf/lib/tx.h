/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tx.h — from a route to a committed redirect: next hop (or ECMP path),
 * egress checks, MTU, neighbour, devmap, tail trim. The L3 rewrite itself
 * stays with the family's code because it needs that family's header.
 */
#ifndef FP_TX_H
#define FP_TX_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"
#include "parse.h"
#include "fib.h"
#include "neigh.h"

/* Everything the rewrite needs; also what the flow cache stores. */
struct fp_tx {
	const __u8 *dmac;        /* neighbour's MAC (map value) */
	const __u8 *smac;        /* egress MAC (map value) */
	struct fp_neigh *neigh;
	__u32 nh_id;
	__u32 slot;              /* egress slot: fp_ifaces and fp_tx_ports key */
	__u32 mtu;               /* largest datagram allowed out */
};

/*
 * Resolve the egress of next hop @nh_id for a datagram of @ip_len bytes, in
 * ip_forward() order: egress usable, redirect case, MTU, then the neighbour
 * (which the kernel only needs at output). Returns FP_R_FORWARDED or why not.
 */
static __always_inline __u32
fp_tx_resolve(struct fp_tx *tx, const struct fp_route *rt, __u32 nh_id, __u32 in_slot,
	      __u8 family, __be32 dst4, const __u8 *dst6, __u32 ip_len)
{
	struct fp_nexthop *nh = fp_nexthop_lookup(nh_id);
	const struct fp_iface *out;
	__u32 mtu, slot;

	if (!nh || !nh->ifindex)
		return FP_R_NO_ROUTE;
	slot = nh->slot;
	if (!slot)
		return FP_R_EGRESS_NOT_MANAGED;
	out = bpf_map_lookup_elem(&fp_ifaces, &slot);
	if (!out || !(out->flags & FP_IF_PRESENT))
		return FP_R_EGRESS_NOT_MANAGED;
	if (!(out->flags & FP_IF_UP))
		return FP_R_EGRESS_DOWN;
	/* IPv4: until the recompute from re-dumped routes (the kernel flushed
	 * those through it); IPv6: the kernel drops it there. */
	if (out->flags & (family == FP_AF_INET ? FP_IF_V4_FLUSH : FP_IF_V6_OFF))
		return FP_R_EGRESS_DOWN;
	/* A redirect would pass the egress qdisc and tc egress by. */
	if (out->flags & FP_IF_TC_EGRESS)
		return FP_R_TC_EGRESS;
	/* veth hands a redirected frame to its peer's NAPI ring; without one
	 * the kernel drops it, where its own path would have delivered it. */
	if (out->flags & FP_IF_PEER_NO_XDP)
		return FP_R_EGRESS_PEER_NOT_READY;
	if (slot == in_slot)
		return FP_R_SAME_IFACE;

	if (family == FP_AF_INET) {
		mtu = out->mtu;
	} else {
		mtu = out->mtu6 ? out->mtu6 : out->mtu;
	}
	/* A route MTU only ever lowers the limit: punting is always safe. */
	if (rt->mtu && rt->mtu < mtu)
		mtu = rt->mtu;
	/* ip6_forward() never uses less than the IPv6 minimum MTU. */
	if (family == FP_AF_INET6 && mtu < FP_IPV6_MIN_MTU)
		mtu = FP_IPV6_MIN_MTU;
	if (ip_len > mtu)
		return FP_R_MTU;

	tx->neigh = fp_neigh_lookup(nh->ifindex, nh, family, dst4, dst6);
	if (!tx->neigh)
		return FP_R_NO_NEIGH;
	tx->dmac = tx->neigh->mac;
	tx->smac = out->mac;
	tx->nh_id = nh_id;
	tx->slot = slot;
	tx->mtu = mtu;
	return FP_R_FORWARDED;
}

/*
 * Point of no return, taken before the packet is touched. bpf_redirect_map()
 * only records the target (the redirect happens after the program returns)
 * and its own devmap lookup (by the egress slot) doubles as the "is the
 * egress in fp_tx_ports" check: with flags 0 a missing port returns
 * XDP_ABORTED, and since nothing has been modified yet the packet is punted
 * as EGRESS_NOT_MANAGED. (Using XDP_PASS as the fallback flag would hide
 * that from the counters, and any failure after a rewrite would hand the
 * kernel a frame addressed to somebody else.) The only step after that
 * which can fail is the trim; bpf_xdp_adjust_tail() leaves the frame
 * untouched when it fails, so that is a clean punt too, counted as
 * REDIRECT_FAILED.
 *
 * Ethernet padding is cut so the frame is exactly @l2_len bytes, as the
 * kernel's pskb_trim_rcsum() would. Packet pointers are invalid afterwards.
 */
static __always_inline __u32
fp_tx_commit(struct xdp_md *ctx, __u32 slot, __u32 *len, __u32 l2_len)
{
	if (bpf_redirect_map(&fp_tx_ports, slot, 0) != XDP_REDIRECT)
		return FP_R_EGRESS_NOT_MANAGED;
	if (*len > l2_len) {
		if (bpf_xdp_adjust_tail(ctx, (int)l2_len - (int)*len))
			return FP_R_REDIRECT_FAILED;
		*len = l2_len;
	}
	return FP_R_FORWARDED;
}

/* New L2 header: to the neighbour, from the egress port. */
static __always_inline void fp_tx_rewrite_eth(struct ethhdr *eth, const __u8 *dmac, const __u8 *smac)
{
	__builtin_memcpy(eth->h_dest, dmac, FP_ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, FP_ETH_ALEN);
}

#endif /* FP_TX_H */
