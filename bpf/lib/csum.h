/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* csum.h — IPv4 header checksum verification and incremental update. */
#ifndef FP_CSUM_H
#define FP_CSUM_H

#include "vmlinux.h"
#include <bpf/bpf_endian.h>

/*
 * True if the 20-byte header sums to 0xffff (ones' complement), the test
 * ip_rcv_core() applies. Summing 32-bit words and folding gives the same
 * 16-bit ones' complement sum in either byte order, with five loads.
 */
static __always_inline bool fp_ip4_csum_ok(const struct iphdr *ip)
{
	const __u32 *w = (const __u32 *)ip;
	__u64 s = (__u64)w[0] + w[1] + w[2] + w[3] + w[4];

	/* Below 2^32 + 4, then 2^17, then at most 0x10000, which a last fold
	 * would make 1: only 0xffff itself folds to 0xffff, so stop here. */
	s = (s & 0xFFFFFFFF) + (s >> 32);
	s = (s & 0xFFFF) + (s >> 16);
	s = (s & 0xFFFF) + (s >> 16);
	return s == 0xFFFF;
}

/*
 * TTL - 1 with the RFC 1624 incremental update. The TTL is the high byte of
 * its 16-bit word, so the word drops by 0x0100 and the checksum rises by the
 * same amount with end-around carry. Written exactly as the kernel's
 * ip_decrease_ttl() so the bytes match the slow path's, including which of
 * 0x0000/0xffff represents zero.
 */
static __always_inline void fp_ip4_dec_ttl(struct iphdr *ip)
{
	__u32 check = ip->check;

	check += bpf_htons(0x0100);
	ip->check = (__sum16)(check + (check >= 0xFFFF));
	ip->ttl--;
}

#endif /* FP_CSUM_H */
