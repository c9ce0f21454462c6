/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * siphash.h — SipHash-2-4 (Aumasson/Bernstein) over a whole number of 64-bit
 * words, the function the kernel's siphash() computes. No helpers, no maps:
 * with a constant word count the loop unrolls into straight-line code.
 *
 * The message is the little-endian byte string of the words, which is what
 * the kernel hashes when it feeds a struct on a little-endian host; callers
 * build their words from in-memory values, so this header is x86/LE only.
 */
#ifndef FP_SIPHASH_H
#define FP_SIPHASH_H

#include "vmlinux.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fp_siphash builds its message from host-order words; little-endian only"
#endif

struct fp_sip {
	__u64 v0, v1, v2, v3;
};

static __always_inline __u64 fp_rotl64(__u64 x, int b)
{
	return (x << b) | (x >> (64 - b));
}

static __always_inline void fp_sipround(struct fp_sip *s)
{
	s->v0 += s->v1;
	s->v1 = fp_rotl64(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = fp_rotl64(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = fp_rotl64(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = fp_rotl64(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = fp_rotl64(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = fp_rotl64(s->v2, 32);
}

static __always_inline void fp_sip_compress(struct fp_sip *s, __u64 m)
{
	s->v3 ^= m;
	fp_sipround(s);
	fp_sipround(s);
	s->v0 ^= m;
}

/*
 * SipHash-2-4 of m[0..nwords) with key (k0, k1). nwords must be a
 * compile-time constant (the callers pass 6 or 9); a message that is a whole
 * number of words has an empty tail, so the last block is just the length.
 */
static __always_inline __u64 fp_siphash_words(const __u64 *m, const __u32 nwords, __u64 k0, __u64 k1)
{
	struct fp_sip s = {
		.v0 = k0 ^ 0x736f6d6570736575ULL,
		.v1 = k1 ^ 0x646f72616e646f6dULL,
		.v2 = k0 ^ 0x6c7967656e657261ULL,
		.v3 = k1 ^ 0x7465646279746573ULL,
	};
	__u64 b = (__u64)(nwords * 8) << 56;

#pragma unroll
	for (__u32 i = 0; i < nwords; i++)
		fp_sip_compress(&s, m[i]);
	fp_sip_compress(&s, b);
	s.v2 ^= 0xff;
	fp_sipround(&s);
	fp_sipround(&s);
	fp_sipround(&s);
	fp_sipround(&s);
	return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

#endif /* FP_SIPHASH_H */
