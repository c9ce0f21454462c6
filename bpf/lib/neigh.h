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
 * packet's own destination: @dst4 for IPv4, @dst6 (16 bytes) for IPv6.
 * Callers pass a constant @family, so the other branch folds away.
 */
static __always_inline struct fp_neigh *
fp_neigh_lookup(__u32 ifindex, const struct fp_nexthop *nh, __u8 family, __be32 dst4, const __u8 *dst6)
{
	struct fp_neigh_key key;

	__builtin_memset(&key, 0, sizeof(key));
	key.ifindex = ifindex;
	if (nh->gw_family) {
		key.family = nh->gw_family;
		__builtin_memcpy(key.addr, nh->gw, sizeof(key.addr));
	} else if (family == FP_AF_INET) {
		key.family = FP_AF_INET;
		*(__be32 *)key.addr = dst4;
	} else {
		key.family = FP_AF_INET6;
		__builtin_memcpy(key.addr, dst6, sizeof(key.addr));
	}
	return bpf_map_lookup_elem(&fp_neigh, &key);
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
