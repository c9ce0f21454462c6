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
 *   Policy 3 (custom fields) is not implemented: FP_MP_HASH_PUNT.
 *
 * What the CALLER must pass, and when it must punt instead:
 *   - ICMP / ICMPv6 errors (policy 0 hashes the embedded header): punt.
 *   - Fragments and IPv4 options: punt (the parser already does).
 *   - proto: the IPv4 protocol field; for IPv6 the nexthdr field. Ignored by
 *     v4 policy 0.
 *   - flowlabel (v6): the first 32-bit word of the IPv6 header as it is in
 *     the packet (network order); the 20 label bits are masked here. Only
 *     policy 0 uses it.
 *   - ports (policy 1): ask fp_mp_l4_ports_proto(proto). 1: pass the TCP/UDP
 *     source and destination ports as in the packet. 0: pass 0, 0 (the
 *     dissector finds no ports for that protocol). -1: punt — the dissector
 *     reads something the caller does not pass (SPIs of ESP/AH, the ports of
 *     SCTP/DCCP/UDP-Lite) or walks on to another header and changes ip_proto
 *     (IPv6 extension headers, MPLS in IP). Policy 0 ignores ports.
 *   - Punt the whole ECMP decision when the kernel would not hash this way:
 *     fib_multipath_hash_seed = 0 (a random boot seed), policy 3, fib
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
 * What the caller passes as ports under @policy (non-zero): as
 * fp_mp_l4_ports_proto() for policy 1; policy 2 takes none, and punts (-1)
 * what it would hash an inner header of; any other policy punts (the daemon
 * never lets one reach a multipath route: its hash would be
 * FP_MP_HASH_PUNT, which no path bound may be compared with).
 */
static __always_inline int fp_mp_ports_proto(__u32 policy, __u8 proto)
{
	if (policy > 2)
		return -1;
	if (policy == 2)
		return fp_mp_policy2_encap(proto) ? -1 : 0;
	return fp_mp_l4_ports_proto(proto);
}

static __always_inline __u32 fp_mp_finish(__u64 h64)
{
	__u32 h = (__u32)h64;

	if (!h)
		h = 1;
	return h >> 1;
}

static __always_inline __u64 fp_mp_key(__u32 seed)
{
	return ((__u64)seed << 32) | seed;
}

static __always_inline __u32 fp_mp_hash4(__u32 policy, __u32 seed, __be32 saddr, __be32 daddr, __u8 proto,
					 __be16 sport, __be16 dport)
{
	__u64 m[6];
	__u64 k = fp_mp_key(seed);

	if (policy > 2)
		return FP_MP_HASH_PUNT;
	if (policy != 1) {
		proto = 0;
		sport = 0;
		dport = 0;
	}
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
	return fp_mp_finish(fp_siphash_words(m, 6, k, k));
}

/* memcmp(a, b, 16) < 0, i.e. a sorts before b byte by byte. */
static __always_inline bool fp_mp_in6_less(const __u32 *a, const __u32 *b)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u32 x = bpf_ntohl(a[i]), y = bpf_ntohl(b[i]);

		if (x != y)
			return x < y;
	}
	return false;
}

static __always_inline __u32 fp_mp_hash6(__u32 policy, __u32 seed, const __u8 *saddr, const __u8 *daddr,
					 __be32 flowlabel, __u8 proto, __be16 sport, __be16 dport)
{
	const __u32 *s = (const __u32 *)saddr, *d = (const __u32 *)daddr;
	__u64 m[9];
	__u64 k = fp_mp_key(seed);

	if (policy > 2)
		return FP_MP_HASH_PUNT;
	if (policy != 1) {
		flowlabel &= bpf_htonl(0x000FFFFF);
		/* Policy 2 stores the host-order number, not the header's word. */
		if (policy == 2)
			flowlabel = bpf_ntohl(flowlabel);
		sport = 0;
		dport = 0;
	} else {
		flowlabel = 0;
	}
	if (fp_mp_in6_less(d, s)) {
		const __u32 *t = s;
		s = d;
		d = t;
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
	m[4] = (__u64)s[0] << 32;
	m[5] = s[1] | ((__u64)s[2] << 32);
	m[6] = s[3] | ((__u64)d[0] << 32);
	m[7] = d[1] | ((__u64)d[2] << 32);
	m[8] = d[3];
	return fp_mp_finish(fp_siphash_words(m, 9, k, k));
}

#endif /* FP_MPHASH_H */
