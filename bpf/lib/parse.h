/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * parse.h — protocol constants and address classification.
 *
 * vmlinux.h carries the header structs but none of the #define'd
 * constants, so the few we need live here. Address helpers take addresses
 * in network order, straight from the packet.
 */
#ifndef FP_PARSE_H
#define FP_PARSE_H

#include "vmlinux.h"
#include <bpf/bpf_endian.h>

#define FP_AF_INET   2
#define FP_AF_INET6  10

#define FP_ETH_HLEN  14
#define FP_IP4_HLEN  20
#define FP_IP6_HLEN  40
#define FP_IPV6_MIN_MTU 1280

#define FP_ETH_P_IP     0x0800
#define FP_ETH_P_IPV6   0x86DD
#define FP_ETH_P_8021Q  0x8100
#define FP_ETH_P_8021AD 0x88A8

/* MF flag plus the 13-bit fragment offset; DF (0x4000) does not matter here. */
#define FP_IP4_FRAG_MASK 0x3FFF

/* The I/G bit: set for multicast and broadcast destinations. */
static __always_inline bool fp_mac_is_group(const __u8 *mac)
{
	return mac[0] & 1;
}

/* Compared as one 32-bit and one 16-bit word: cheaper than six byte loads. */
static __always_inline bool fp_mac_eq(const __u8 *a, const __u8 *b)
{
	return *(const __u32 *)a == *(const __u32 *)b &&
	       *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
}

/*
 * The source and destination checks ip_route_input_slow() applies before it
 * even looks at the FIB (route_localnet is assumed off: the daemon punts the
 * family via policy if that ever matters). Returns a reason or 0.
 */
static __always_inline __u32 fp_ip4_addr_reason(__be32 saddr, __be32 daddr)
{
	__u32 s = bpf_ntohl(saddr), d = bpf_ntohl(daddr);
	__u32 s8 = s >> 24, d8 = d >> 24;

	if ((s & 0xF0000000) == 0xE0000000 || s == 0xFFFFFFFF || s8 == 0 || s8 == 127)
		return FP_R_MARTIAN;
	if (d8 == 0 || d8 == 127)
		return FP_R_MARTIAN;
	if ((d & 0xF0000000) == 0xE0000000 || d == 0xFFFFFFFF)
		return FP_R_MULTICAST;
	if ((s >> 16) == 0xA9FE || (d >> 16) == 0xA9FE)
		return FP_R_LINK_LOCAL;
	return 0;
}

/* :: (unspecified) or ::1 (loopback). */
static __always_inline bool fp_ip6_is_any_or_lo(const struct in6_addr *a)
{
	const __u32 *w = (const __u32 *)a;

	return (w[0] | w[1] | w[2]) == 0 && (w[3] == 0 || w[3] == bpf_htonl(1));
}

static __always_inline bool fp_ip6_is_linklocal(const struct in6_addr *a)
{
	const __u8 *b = (const __u8 *)a;

	return b[0] == 0xFE && (b[1] & 0xC0) == 0x80;
}

/*
 * Kernel-like classification of an IPv6 source/destination pair (ipv6_rcv
 * drops multicast sources; ip6_forward refuses ::, ::1 and link-local).
 */
static __always_inline __u32 fp_ip6_addr_reason(const struct in6_addr *s, const struct in6_addr *d)
{
	if (((const __u8 *)s)[0] == 0xFF || fp_ip6_is_any_or_lo(s) || fp_ip6_is_any_or_lo(d))
		return FP_R_MARTIAN;
	if (((const __u8 *)d)[0] == 0xFF)
		return FP_R_MULTICAST;
	if (fp_ip6_is_linklocal(s) || fp_ip6_is_linklocal(d))
		return FP_R_LINK_LOCAL;
	return 0;
}

/*
 * Next headers a router would have to look into or past. Hop-by-Hop (0) is
 * processed by every hop, so the kernel must see it; the others are only
 * acted on by the destination, but a flow key (flow-cache issue) would have
 * to walk them, so they are punted too until that walk exists.
 *
 * ESP (50) is deliberately absent: everything behind it is encrypted, no
 * router can parse it, and Linux forwards it like any upper-layer protocol
 * (as IPv4 forwards protocol 50). Forwarding it keeps IPsec tunnels between
 * sites on the fast path.
 */
static __always_inline bool fp_ip6_is_ext_hdr(__u8 nexthdr)
{
	switch (nexthdr) {
	case 0:   /* Hop-by-Hop options */
	case 43:  /* Routing */
	case 44:  /* Fragment */
	case 51:  /* Authentication Header */
	case 60:  /* Destination options */
	case 135: /* Mobility */
	case 139: /* HIP */
	case 140: /* Shim6 */
	case 253: /* experimental */
	case 254:
		return true;
	}
	return false;
}

#endif /* FP_PARSE_H */
