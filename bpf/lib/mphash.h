/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mphash.h — the kernel's ECMP hash on the forwarding path, so that a flow
 * picks the same next hop with and without fastpath (Linux 6.18,
 * fib_multipath_hash() in net/ipv4/route.c, rt6_multipath_hash() in
 * net/ipv6/route.c, called with an skb from ip_mkroute_input() and
 * fib6_select_path()).
 *
 * What the kernel does: it zeroes a struct flow_keys, sets addr_type and the
 * fields of the policy, and returns fib_multipath_hash_from_keys() >> 1:
 * __flow_hash_consistentify() (v4: swap the addresses if dst < src compared
 * as host-order u32 of the network-order values; v6: if memcmp(dst, src) < 0;
 * then, independently, swap the ports if dst < src as host-order u16), then
 * SipHash-2-4 of the struct from `basic` (offset 8) for 48 bytes (v4) or
 * 72 bytes (v6), keyed by key[0] = key[1] = seed << 32 | seed, where seed is
 * net.ipv4.fib_multipath_hash_seed (used for IPv6 too); the low 32 bits of
 * that, 0 turned into 1. The value returned here is that >> 1, the number the
 * kernel compares against each path's upper bound (first path whose bound is
 * >= the hash wins).
 *
 * Layout hashed (offsets from `basic`, struct flow_keys of 6.18 BTF):
 *   0 n_proto (always 0 here)  2 ip_proto  3 pad  4 tags.flow_label
 *   8 vlan, cvlan (0)  24 keyid (0)  28 ports.src  30 ports.dst  32 icmp (0)
 *   36 v4 src, dst | v6 src, dst, then 4 zero bytes up to the hashed length.
 *
 * Fields per policy (forwarding path, skb != NULL):
 *   v4 policy 0: addresses only (ip_multipath_l3_keys).
 *   v6 policy 0: addresses, flow label, ip_proto = the IPv6 header's nexthdr
 *                (the very next header, extension header or not).
 *   policy 1:    addresses, ports, ip_proto from the flow dissector
 *                (FLOW_DISSECTOR_F_STOP_AT_ENCAP); no flow label in v6.
 *   policy 2:    the fields the flow dissector (flags 0) finds in the
 *                innermost header: for a packet that encapsulates none, v4
 *                as policy 0; v6 addresses, ip_proto and the flow label in
 *                host order (the dissector's ntohl(); policy 0 keeps the
 *                header's word as it is). The caller punts protocols the
 *                dissector walks into (fp_mp_ports_proto() says so).
 *   policy 3:    the fields of net.ipv{4,6}.fib_multipath_hash_fields
 *                (@fields, FP_MP_F_*) the caller's packet has, as policy 1
 *                takes them from the dissector (the v6 flow label in host
 *                order, as policy 2); unchosen ones stay 0. The flow hash of
 *                those (0 when no outer field is chosen) and of the inner
 *                header's (0: the caller punts what an inner field would
 *                look into) go through jhash_2words(), shifted right once
 *                (fib_multipath_custom_hash_skb(), rt6_multipath_custom_hash_skb()).
 *
 * What the CALLER must pass, and when it must punt instead:
 *   - ICMP / ICMPv6 errors (policy 0 hashes the embedded header): punt.
 *   - Fragments and IPv4 options: punt (the parser already does).
 *   - proto: the IPv4 protocol field; for IPv6 the nexthdr field. Ignored by
 *     v4 policy 0.
 *   - flowlabel (v6): the first 32-bit word of the IPv6 header as it is in
 *     the packet (network order); the 20 label bits are masked here.
 *     Policies 0, 2 and 3 use it.
 *   - ports (policies 1 and 3): ask fp_mp_ports_proto(policy, fields, proto),
 *     which for policy 1 is fp_mp_l4_ports_proto(proto). 1: pass the TCP/UDP
 *     source and destination ports as in the packet. 0: pass 0, 0 (the
 *     dissector finds no ports for that protocol). -1: punt — the dissector
 *     reads something the caller does not pass (SPIs of ESP/AH, the ports of
 *     SCTP/DCCP/UDP-Lite) or walks on to another header and changes ip_proto
 *     (IPv6 extension headers, MPLS in IP). Policy 0 ignores ports.
 *   - Punt the whole ECMP decision when the kernel would not hash this way:
 *     fib_multipath_hash_seed = 0 (a random boot seed), fib
 *     rules that need early flow dissection in IPv6 (the label then enters
 *     in host order), a BPF flow dissector attached to the netns, or — for
 *     policy 1 — an skb that would arrive with skb->l4_hash set (a NIC RSS
 *     hash of L4 type: the kernel then uses that hash >> 1 instead).
 */
#ifndef FP_MPHASH_H
#define FP_MPHASH_H

#include "vmlinux.h"
#include <bpf/bpf_endian.h>
#include "siphash.h"

/* Not a hash (those are < 2^31): the caller must punt. */
#define FP_MP_HASH_PUNT 0xFFFFFFFFu

/* fib_multipath_hash_fields bits (FIB_MULTIPATH_HASH_FIELD_*). */
#define FP_MP_F_SRC_IP    (1U << 0)
#define FP_MP_F_DST_IP    (1U << 1)
#define FP_MP_F_IP_PROTO  (1U << 2)
#define FP_MP_F_FLOWLABEL (1U << 3)  /* IPv6 only */
#define FP_MP_F_SRC_PORT  (1U << 4)
#define FP_MP_F_DST_PORT  (1U << 5)
#define FP_MP_F_OUTER     0x03FU
#define FP_MP_F_INNER     0xFC0U
/* Bits of fp_mp_effective()'s own, where the inner fields were. */
#define FP_MP_X_LABEL_NET (1U << 6)  /* the label as the header's word (v6 policy 0), not a number */
#define FP_MP_X_CUSTOM    (1U << 7)  /* policy 3's jhash_2words() finish */

/* 1: pass the L4 ports; 0: pass zero ports; -1: punt (policy 1). */
static __always_inline int fp_mp_l4_ports_proto(__u8 proto)
{
	switch (proto) {
	case 6:   /* TCP */
	case 17:  /* UDP */
		return 1;
	case 33:  /* DCCP: ports at offset 0 (proto_ports_offset) */
	case 50:  /* ESP: SPI taken as ports */
	case 51:  /* AH: SPI at offset 4 taken as ports */
	case 132: /* SCTP */
	case 136: /* UDP-Lite */
	case 0:   /* IPv6 hop-by-hop: the dissector walks on */
	case 43:  /* IPv6 routing */
	case 44:  /* IPv6 fragment */
	case 60:  /* IPv6 destination options */
	case 137: /* MPLS in IP: dissected further */
		return -1;
	default:
		return 0;
	}
}

/*
 * Policy 2: an inner header the flow dissector would hash instead (a GRE
 * payload, IP in IP, IPv6 in IP; Ethernet and MPLS in IP as well, to be
 * safe). Kept equal to fastpath_core::mphash::policy2_encap().
 */
static __always_inline bool fp_mp_policy2_encap(__u8 proto)
{
	return proto == 4 || proto == 41 || proto == 47 || proto == 97 || proto == 137;
}

/*
 * What the caller passes as ports under @policy (non-zero) and, for policy
 * 3, @fields: as fp_mp_l4_ports_proto() for policy 1; policy 2 takes none,
 * and punts (-1) what it would hash an inner header of; policy 3 as policy
 * 1 when it chooses a port (none otherwise), and punts what policy 1 punts
 * and, with an inner field chosen, what policy 2 punts; any other policy punts (the daemon
 * never lets one reach a multipath route: its hash would be
 * FP_MP_HASH_PUNT, which no path bound may be compared with).
 */
static __always_inline int fp_mp_ports_proto(__u32 policy, __u32 fields, __u8 proto)
{
	int l4;

	if (policy > 3)
		return -1;
	if (policy == 2)
		return fp_mp_policy2_encap(proto) ? -1 : 0;
	l4 = fp_mp_l4_ports_proto(proto);
	if (policy == 1 || l4 < 0)
		return l4;
	if ((fields & FP_MP_F_INNER) && fp_mp_policy2_encap(proto))
		return -1;
	return (fields & (FP_MP_F_SRC_PORT | FP_MP_F_DST_PORT)) ? l4 : 0;
}

static __always_inline __u32 fp_mp_finish(__u64 h64)
{
	__u32 h = (__u32)h64;

	if (!h)
		h = 1;
	return h >> 1;
}

static __always_inline __u32 fp_mp_rol32(__u32 x, __u32 n)
{
	return (x << n) | (x >> (32 - n));
}

/* The kernel's jhash_2words(a, b, 0) (include/linux/jhash.h). */
static __always_inline __u32 fp_mp_jhash_2words(__u32 a, __u32 b)
{
	__u32 c = 0xdeadbeef + (2 << 2);

	a += c;
	b += c;
	c ^= b; c -= fp_mp_rol32(b, 14);
	a ^= c; a -= fp_mp_rol32(c, 11);
	b ^= a; b -= fp_mp_rol32(a, 25);
	c ^= b; c -= fp_mp_rol32(b, 16);
	a ^= c; a -= fp_mp_rol32(c, 4);
	b ^= a; b -= fp_mp_rol32(a, 14);
	c ^= b; c -= fp_mp_rol32(b, 24);
	return c;
}

/*
 * Field @bit of @fields (a run of contiguous bits: any of them) as a mask,
 * all ones if chosen, else 0. By arithmetic, not a branch per field: the
 * verifier would walk every combination of them through the rest of the
 * program.
 */
static __always_inline __u32 fp_mp_pick(__u32 fields, __u32 bit)
{
	/* (fields & bit) != 0 without a compare, for a run of contiguous
	 * bits: masked plus the run carries past its top exactly when some
	 * bit of it is set. */
	return -(((fields & bit) + bit) >> (32 - __builtin_clz(bit)) & 1);
}

/* Policy 3: the outer fields' flow hash @h64 (0 when @fields chooses no
 * outer field) with an inner hash of 0. */
static __always_inline __u32 fp_mp_custom_finish(__u32 fields, __u64 h64)
{
	__u32 outer = (__u32)h64;

	/* 0 made 1, without a branch: the top bit of (x - 1) & ~x is x == 0. */
	outer |= ((outer - 1) & ~outer) >> 31;
	return fp_mp_jhash_2words(outer & fp_mp_pick(fields, FP_MP_F_OUTER), 0) >> 1;
}

/*
 * The last step for the effective fields @eff (fp_mp_effective()): policy
 * 3's when it says so, else the others'. Both are computed and one kept by
 * a mask, so that no branch on the policy follows the hash.
 */
static __always_inline __u32 fp_mp_finish_custom(__u32 eff, __u64 h64)
{
	__u32 plain = fp_mp_finish(h64), custom = fp_mp_custom_finish(eff, h64);
	__u32 is3 = fp_mp_pick(eff, FP_MP_X_CUSTOM);

	return plain ^ ((plain ^ custom) & is3);
}

static __always_inline __u64 fp_mp_key(__u32 seed)
{
	return ((__u64)seed << 32) | seed;
}

/*
 * Every policy as the fields it hashes (FP_MP_F_* plus two private bits,
 * FP_MP_X_*), so that one straight path of masks serves all four, with no
 * branch per policy for the verifier to walk the rest of the program
 * through. Policy 3 is its @fields' outer ones. @v6 is a constant at each
 * call.
 */
static __always_inline __u32 fp_mp_effective(__u32 policy, __u32 fields, bool v6)
{
	/* Policies 0, 1, 2 a byte each: v4 addresses / 5-tuple / addresses;
	 * v6 addresses, next header and label (its word) / 5-tuple /
	 * addresses, next header and label (a number). */
	const __u32 table = v6 ? 0x0F374F : 0x033703;
	__u32 is3 = -(((policy ^ 3) - 1) >> 31);
	__u32 eff = (table >> ((policy & 3) * 8)) & 0xFF;

	return (eff & ~is3) | (((fields & FP_MP_F_OUTER) | FP_MP_X_CUSTOM) & is3);
}

static __always_inline __u32 fp_mp_hash4(__u32 policy, __u32 fields, __u32 seed, __be32 saddr, __be32 daddr,
					 __u8 proto, __be16 sport, __be16 dport)
{
	__u64 m[6];
	__u64 k = fp_mp_key(seed);
	__u32 eff;

	if (policy > 3)
		return FP_MP_HASH_PUNT;
	eff = fp_mp_effective(policy, fields, false);
	saddr &= fp_mp_pick(eff, FP_MP_F_SRC_IP);
	daddr &= fp_mp_pick(eff, FP_MP_F_DST_IP);
	proto &= fp_mp_pick(eff, FP_MP_F_IP_PROTO);
	sport &= fp_mp_pick(eff, FP_MP_F_SRC_PORT);
	dport &= fp_mp_pick(eff, FP_MP_F_DST_PORT);
	if ((__u32)daddr < (__u32)saddr) {
		__be32 t = saddr;
		saddr = daddr;
		daddr = t;
	}
	if ((__u16)dport < (__u16)sport) {
		__be16 t = sport;
		sport = dport;
		dport = t;
	}
	m[0] = (__u64)proto << 16;
	m[1] = 0;
	m[2] = 0;
	m[3] = ((__u64)(__u16)sport | ((__u64)(__u16)dport << 16)) << 32;
	m[4] = (__u64)(__u32)saddr << 32;
	m[5] = (__u32)daddr;
	return fp_mp_finish_custom(eff, fp_siphash_words(m, 6, k, k));
}

/* memcmp(a & ma, b & mb, 16) < 0 (@ma, @mb: all ones or zero), i.e. a
 * sorts before b byte by byte. */
static __always_inline bool fp_mp_in6_less(const __u32 *a, __u32 ma, const __u32 *b, __u32 mb)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u32 x = bpf_ntohl(a[i] & ma), y = bpf_ntohl(b[i] & mb);

		if (x != y)
			return x < y;
	}
	return false;
}

static __always_inline __u32 fp_mp_hash6(__u32 policy, __u32 fields, __u32 seed, const __u8 *saddr,
					 const __u8 *daddr, __be32 flowlabel, __u8 proto, __be16 sport, __be16 dport)
{
	const __u32 *s = (const __u32 *)saddr, *d = (const __u32 *)daddr;
	/* An address not hashed is zeroed by mask: no zero copy on the stack
	 * of the deep frame that calls this. */
	__u32 ms, md, t, eff, net;
	__u64 m[9];
	__u64 k = fp_mp_key(seed);

	if (policy > 3)
		return FP_MP_HASH_PUNT;
	eff = fp_mp_effective(policy, fields, true);
	ms = fp_mp_pick(eff, FP_MP_F_SRC_IP);
	md = fp_mp_pick(eff, FP_MP_F_DST_IP);
	proto &= fp_mp_pick(eff, FP_MP_F_IP_PROTO);
	sport &= fp_mp_pick(eff, FP_MP_F_SRC_PORT);
	dport &= fp_mp_pick(eff, FP_MP_F_DST_PORT);
	/* Policy 0 hashes the header's word, 2 and 3 the dissector's number. */
	flowlabel &= bpf_htonl(0x000FFFFF);
	net = fp_mp_pick(eff, FP_MP_X_LABEL_NET);
	flowlabel = ((flowlabel & net) | (bpf_ntohl(flowlabel) & ~net)) & fp_mp_pick(eff, FP_MP_F_FLOWLABEL);
	if (fp_mp_in6_less(d, md, s, ms)) {
		const __u32 *x = s;

		s = d;
		d = x;
		t = ms;
		ms = md;
		md = t;
	}
	if ((__u16)dport < (__u16)sport) {
		__be16 t = sport;
		sport = dport;
		dport = t;
	}
	m[0] = ((__u64)proto << 16) | ((__u64)(__u32)flowlabel << 32);
	m[1] = 0;
	m[2] = 0;
	m[3] = ((__u64)(__u16)sport | ((__u64)(__u16)dport << 16)) << 32;
	m[4] = (__u64)(s[0] & ms) << 32;
	m[5] = (s[1] & ms) | ((__u64)(s[2] & ms) << 32);
	m[6] = (s[3] & ms) | ((__u64)(d[0] & md) << 32);
	m[7] = (d[1] & md) | ((__u64)(d[2] & md) << 32);
	m[8] = d[3] & md;
	return fp_mp_finish_custom(eff, fp_siphash_words(m, 9, k, k));
}

#endif /* FP_MPHASH_H */
