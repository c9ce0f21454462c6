/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * flowhash.h — the software flow hash of the flow cache, without any map,
 * so that benchmark programs can time exactly what the data path runs.
 */
#ifndef FP_FLOWHASH_H
#define FP_FLOWHASH_H

#include "vmlinux.h"
#include "fastpath.h"

_Static_assert(sizeof(struct fp_flow_key) == 44, "fp_flow_key is hashed and compared as 5 u64 + 1 u32");

/* Multiply-xorshift over the key words: cheap, and good enough to spread
 * sets; it is never trusted for identity. */
static __always_inline __u32 fp_flow_hash_sw(const struct fp_flow_key *k)
{
	const __u64 *w = (const __u64 *)k;
	__u64 h = 0;
	__u32 i;

#pragma unroll
	for (i = 0; i < 5; i++) {
		h = (h ^ w[i]) * 0x9E3779B97F4A7C15ULL;
		h ^= h >> 29;
	}
	h = (h ^ ((const __u32 *)k)[10]) * 0x9E3779B97F4A7C15ULL;
	return (__u32)(h >> 32);
}

/*
 * The same for an IPv4 key, whose other words are 0 (family, proto,
 * ingress and ports; flow label 0 and the source; the destination), in
 * half the multiplies. Only ever compared with hashes of IPv4 keys.
 * Taken as @w0 family to dport, @w1 the source in its high half (a key's
 * bytes 8-15), @daddr the destination.
 *
 * The destination goes into the last multiply as the low half of a word:
 * a product's low bits depend only on the low bits of what is multiplied,
 * and the hosts of a subnet differ in an address's last byte, the top one
 * of the word as the key holds it. In the high half (bytes 24-31 as they
 * are), the 256 destinations of a /24 from one source with no ports (a
 * ping sweep; TCP/UDP with `--flow-key addresses`) all found one set.
 */
static __always_inline __u32 fp_flow_hash_sw4_words(__u64 w0, __u64 w1, __u32 daddr)
{
	__u64 h;

	h = w0 * 0x9E3779B97F4A7C15ULL;
	h ^= h >> 29;
	h = (h ^ w1) * 0x9E3779B97F4A7C15ULL;
	h ^= h >> 29;
	h = (h ^ daddr) * 0x9E3779B97F4A7C15ULL;
	return (__u32)(h >> 32);
}

static __always_inline __u32 fp_flow_hash_sw4(const struct fp_flow_key *k)
{
	const __u64 *w = (const __u64 *)k;

	return fp_flow_hash_sw4_words(w[0], w[1], *(const __u32 *)k->daddr);
}

#endif /* FP_FLOWHASH_H */
