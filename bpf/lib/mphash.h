/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mphash.h — PLACEHOLDER, replaced by the kernel-compatible multipath hash
 * (branch mphash). Until then the daemon must not publish multipath routes.
 */
#ifndef FP_MPHASH_H
#define FP_MPHASH_H

#include "vmlinux.h"

static __always_inline int fp_mp_l4_ports_proto(__u8 proto)
{
	return proto == 6 || proto == 17 ? 1 : 0;
}

static __always_inline __u32 fp_mp_hash4(__u32 policy, __u32 seed, __be32 saddr, __be32 daddr, __u8 proto,
					 __be16 sport, __be16 dport)
{
	return 0;
}

static __always_inline __u32 fp_mp_hash6(__u32 policy, __u32 seed, const __u8 *saddr, const __u8 *daddr,
					 __be32 flowlabel, __u8 proto, __be16 sport, __be16 dport)
{
	return 0;
}

#endif /* FP_MPHASH_H */
