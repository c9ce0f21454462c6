/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ecmp.h — which path of a multipath route a flow takes, by the kernel's
 * rules (see struct fp_group), and whether a cached choice is still a path.
 */
#ifndef FP_ECMP_H
#define FP_ECMP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"

static __always_inline const struct fp_group *fp_group_lookup(__u32 gid)
{
	return bpf_map_lookup_elem(&fp_groups, &gid);
}

/*
 * The next hop @hash (already the kernel's "hash >> 1") selects in group
 * @gid, or 0. Hash-threshold: the first path whose upper bound is >= hash,
 * as fib_select_multipath() and nexthop_select_path_hthr() compare (a dead
 * path has bound -1 and is never taken). The kernel may skip a chosen
 * next hop it deems not good (neighbour failed); the caller punts whenever
 * the chosen next hop cannot be forwarded to, so that case goes to the
 * kernel, which then picks as it likes.
 */
static __always_inline __u32 fp_group_select(const struct fp_group *g, __u32 gid, __u32 hash)
{
	__u32 i, key, *nh;

	if (g->kind == FP_GRP_HASH_THRESHOLD) {
		for (i = 0; i < FP_GROUP_MAX_PATHS; i++) {
			if (i >= g->n_paths)
				break;
			if ((__s32)hash <= g->paths[i].upper_bound)
				return g->paths[i].nh_id;
		}
		return 0;
	}
	if (g->kind == FP_GRP_RESILIENT && g->n_buckets) {
		key = (gid << 16) | (hash % g->n_buckets);
		nh = bpf_map_lookup_elem(&fp_res_buckets, &key);
		return nh ? *nh : 0;
	}
	return 0;
}

/* Is @nh_id still a live path of the group (stickiness of cached flows)? */
static __always_inline bool fp_group_has(const struct fp_group *g, __u32 nh_id)
{
	__u32 i;

	if (!nh_id)
		return false;
	for (i = 0; i < FP_GROUP_MAX_PATHS; i++) {
		if (i >= g->n_paths)
			break;
		if (g->paths[i].nh_id == nh_id)
			return g->kind == FP_GRP_RESILIENT || g->paths[i].upper_bound >= 0;
	}
	return false;
}

#endif /* FP_ECMP_H */
