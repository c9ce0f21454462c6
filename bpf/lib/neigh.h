/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* neigh.h — next-hop neighbour lookup and the "in use" mark. */
#ifndef FP_NEIGH_H
#define FP_NEIGH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"
#include "parse.h"

/*
 * The neighbour is the gateway when the next hop has one (its family may
 * differ from the packet's: IPv4 via an IPv6 gateway, RFC 5549), else the
 * packet's own destination: @dst4 for IPv4, @dst6 (16 bytes) for IPv6. The
 * neighbour's family picks the map. Callers pass a constant @family, so the
 * other on-link branch folds away.
 */
static __always_inline struct fp_neigh *
fp_neigh_lookup(__u32 ifindex, const struct fp_nexthop *nh, __u8 family, __be32 dst4, const __u8 *dst6)
{
	struct fp_neigh4_key k4;
	struct fp_neigh6_key k6;
	__u8 nfam = nh->gw_family ? nh->gw_family : family;

	if (nfam == FP_AF_INET) {
		k4.ifindex = ifindex;
		k4.addr = nh->gw_family ? *(const __u32 *)nh->gw : dst4;
		return fp_lookup_apart(&fp_neigh4, &k4);
	}
	if (nfam != FP_AF_INET6)
		return NULL;
	k6.ifindex = ifindex;
	/* Separate copies: a select between a map value and a stack pointer
	 * would not pass the verifier. */
	if (nh->gw_family)
		__builtin_memcpy(k6.addr, nh->gw, sizeof(k6.addr));
	else
		__builtin_memcpy(k6.addr, dst6, sizeof(k6.addr));
	return fp_lookup_apart(&fp_neigh6, &k6);
}

/*
 * Fast-pathed packets never touch the kernel's neighbour entry; the daemon
 * reads `used` to keep in-use entries alive. The clock only moves once per
 * keep-alive tick, so the store (and its cache-line bounce between CPUs)
 * happens about once a second per neighbour, and no per-packet time helper.
 */
static __always_inline void fp_neigh_touch(struct fp_neigh *n, __u32 clock)
{
	if (n->used != clock)
		n->used = clock;
}

#endif /* FP_NEIGH_H */
