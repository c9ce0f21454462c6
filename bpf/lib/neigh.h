/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* neigh.h — next-hop neighbour lookup and the "in use" timestamp. */
#ifndef FP_NEIGH_H
#define FP_NEIGH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"
#include "parse.h"

/* How stale used_ns may get before a packet rewrites it. */
#define FP_NEIGH_TOUCH_NS 1000000000ULL

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
 * reads used_ns to keep in-use entries alive. Refreshing at most once a
 * second keeps the cache line clean on the per-packet path.
 */
static __always_inline void fp_neigh_touch(struct fp_neigh *n)
{
	__u64 now = bpf_ktime_get_coarse_ns();

	if (now - n->used_ns > FP_NEIGH_TOUCH_NS)
		n->used_ns = now;
}

#endif /* FP_NEIGH_H */
