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

#define FP_FLOW_HASH_MUL 0x9E3779B97F4A7C15ULL

/* One step of the hashes below: word @w into @h, mixed. */
static __always_inline __u64 fp_flow_hash_step(__u64 h, __u64 w)
{
	h = (h ^ w) * FP_FLOW_HASH_MUL;
	return h ^ (h >> 29);
}

/*
 * Multiply-xorshift over the words of a key (what fp_flow_key holds at
 * bytes 0, 8, 16, 24, 32 and, a half word, 40): cheap, and good enough to
 * spread sets; it is never trusted for identity. Taken as words so that
 * the IPv6 express path hashes them straight from the headers, with no key
 * built; fp_flow_hash_sw() is the same hash of a key.
 */
static __always_inline __u32 fp_flow_hash_sw6_words(__u64 w0, __u64 w1, __u64 w2, __u64 w3, __u64 w4, __u32 w5)
{
	__u64 h = 0;

	h = fp_flow_hash_step(h, w0);
	h = fp_flow_hash_step(h, w1);
	h = fp_flow_hash_step(h, w2);
	h = fp_flow_hash_step(h, w3);
	h = fp_flow_hash_step(h, w4);
	return (__u32)(((h ^ w5) * FP_FLOW_HASH_MUL) >> 32);
}

static __always_inline __u32 fp_flow_hash_sw(const struct fp_flow_key *k)
{
	const __u64 *w = (const __u64 *)k;

	return fp_flow_hash_sw6_words(w[0], w[1], w[2], w[3], w[4], ((const __u32 *)k)[10]);
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
	__u64 h = 0;

	h = fp_flow_hash_step(h, w0);
	h = fp_flow_hash_step(h, w1);
	return (__u32)(((h ^ daddr) * FP_FLOW_HASH_MUL) >> 32);
}

static __always_inline __u32 fp_flow_hash_sw4(const struct fp_flow_key *k)
{
	const __u64 *w = (const __u64 *)k;

	return fp_flow_hash_sw4_words(w[0], w[1], *(const __u32 *)k->daddr);
}

#endif /* FP_FLOWHASH_H */
