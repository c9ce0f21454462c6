/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nat.h — NAT of an established conntrack entry, as nf_nat would do it.
 *
 * What: fp_nat_from_ct() reads the target tuple out of an nf_conn (CO-RE),
 * fp_nat_apply4/6() rewrite addresses, ports and checksums in place.
 *
 * Why the bytes match the kernel's (net/netfilter/nf_nat_proto.c): every
 * checksum change there is an RFC 1624 update "~(~old_sum + ~old + new)"
 * done with 32-bit end-around-carry adds seeded by ~csum_unfold(check),
 * which is never zero, followed by csum_fold(). A fold of a non-zero sum
 * lands in 1..0xffff, so the stored checksum is its complement in
 * 0..0xfffe: the result depends only on the ones' complement value, never
 * on how or in which order the terms were added, and 0xffff is never
 * produced (TCP may end at 0x0000). ip_decrease_ttl() keeps to the same
 * rule, so NAT and the TTL update compose in any order. Here all terms of
 * one packet go into one sum, seeded the kernel's way so it cannot be zero.
 * UDP differs twice: a zero checksum means "none" and stays zero, and a
 * result of zero is sent as 0xffff (CSUM_MANGLED_0). Zero is not allowed
 * over IPv6, but conntrack tracks such a datagram and nf_nat leaves its
 * checksum alone there too (udp_manip_pkt tests the value, not the family),
 * so the same rule applies to both families.
 *
 * ICMP echo (icmp_manip_pkt, nf_nat_icmpv6_manip_pkt): the echo id is the
 * entry's "port", set to the target tuple's id by either manip, and the
 * checksum follows it; ICMPv4's checksum covers no pseudo-header, so an
 * address change leaves it alone, while ICMPv6's covers the addresses like
 * TCP's. Its fp_nat comes from the daemon's copy of the entry (ct.h,
 * fp_ct_icmp_check): id in sport and dport alike.
 */
#ifndef FP_NAT_H
#define FP_NAT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "fastpath.h"

#ifndef FP_IPPROTO_TCP
#define FP_IPPROTO_TCP 6
#endif
#ifndef FP_IPPROTO_UDP
#define FP_IPPROTO_UDP 17
#endif
#ifndef FP_IPPROTO_ICMP
#define FP_IPPROTO_ICMP 1
#endif
#ifndef FP_IPPROTO_ICMPV6
#define FP_IPPROTO_ICMPV6 58
#endif

/*
 * Which way a packet goes through its entry, as conntrack's lookup reports
 * it (bpf_ct_opts.dir): 0 = original, 1 = reply.
 */
#define FP_CT_DIR_ORIGINAL 0
#define FP_CT_DIR_REPLY    1

/* Both directions' tuples of one entry, copied out of the nf_conn. */
static __always_inline void
fp_nat_copy_target(struct fp_nat *nat, const struct nf_conntrack_tuple *t)
{
	/* The packet leaves as the other direction's tuple reversed. */
	__builtin_memcpy(nat->saddr, &t->dst.u3, 16);
	__builtin_memcpy(nat->daddr, &t->src.u3, 16);
	nat->sport = t->dst.u.all;
	nat->dport = t->src.u.all;
}

/*
 * Fill @nat for a packet travelling in direction @dir of @ct, as
 * nf_nat_packet() decides: a source manip (POSTROUTING) for an original
 * packet of a SNAT entry, or a reply packet of a DNAT entry; a destination
 * manip (PREROUTING) for the other two. Returns 0, or FP_R_CT_NAT for NAT
 * the fast path must leave to the kernel: sequence-number adjustment
 * (helpers that resize payloads).
 *
 * Written for the verifier: the flags come out of arithmetic, not
 * branches, and the target is copied whether it is needed or not, so that
 * every entry leaves the same kind of state behind and the forwarding
 * program's paths after the lookup merge again (branching here multiplied
 * them past the verifier's budget). The tuple index is spelled out per
 * branch because an nf_conn is a BTF pointer, read at constant offsets.
 */
static __always_inline __u32
fp_nat_from_ct(const struct nf_conn *ct, __u32 dir, struct fp_nat *nat)
{
	unsigned long status = ct->status;
	__u32 snat = (status / IPS_SRC_NAT) & 1, dnat = (status / IPS_DST_NAT) & 1;
	__u32 orig = snat * FP_NAT_SRC | dnat * FP_NAT_DST;
	__u32 reply = snat * FP_NAT_DST | dnat * FP_NAT_SRC;
	__u32 m = -(dir & 1);

	nat->flags = (orig & ~m) | (reply & m);
	if (dir == FP_CT_DIR_ORIGINAL)
		fp_nat_copy_target(nat, &ct->tuplehash[IP_CT_DIR_REPLY].tuple);
	else
		fp_nat_copy_target(nat, &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple);
	return nat->flags && (status & IPS_SEQ_ADJUST) ? FP_R_CT_NAT : 0;
}

/* Destination after a destination manip: what the route lookup must use. */
static __always_inline __be32 fp_nat_daddr4(const struct fp_nat *nat, __be32 daddr)
{
	return nat->flags & FP_NAT_DST ? *(const __be32 *)nat->daddr : daddr;
}

/* Whether two verdicts rewrite alike (a cached route is only good for its own). */
static __always_inline bool fp_nat_same(const struct fp_nat *a, const struct fp_nat *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	__u32 d = 0;

#pragma unroll
	for (int i = 0; i < sizeof(struct fp_nat) / 4; i++)
		d |= x[i] ^ y[i];
	return !d;
}

/* Ones' complement fold; non-zero in, 1..0xffff out. */
static __always_inline __u16 fp_nat_fold(__u64 s)
{
	s = (s & 0xFFFFFFFF) + (s >> 32);
	s = (s & 0xFFFF) + (s >> 16);
	s = (s & 0xFFFF) + (s >> 16);
	s = (s & 0xFFFF) + (s >> 16);
	return (__u16)s;
}

/* ~old + new for one 32-bit word, as csum_replace4() adds it. */
static __always_inline __u64 fp_nat_diff4(__u32 old, __u32 new)
{
	return (__u64)(__u32)~old + new;
}

static __always_inline __u64 fp_nat_diff16(const __u8 *old, const __u8 *new)
{
	const __u32 *o = (const __u32 *)old, *n = (const __u32 *)new;

	return fp_nat_diff4(o[0], n[0]) + fp_nat_diff4(o[1], n[1]) +
	       fp_nat_diff4(o[2], n[2]) + fp_nat_diff4(o[3], n[3]);
}

/*
 * The checksum after adding @diff: ~(~csum_unfold(check) + diff) folded.
 * The seed keeps csum_unfold()'s zero high half inverted, as the kernel
 * does, which is what makes the sum non-zero.
 */
static __always_inline __u16 fp_nat_csum(__u16 check, __u64 diff)
{
	return (__u16)~fp_nat_fold((__u64)(__u32)~(__u32)check + diff);
}

/*
 * The L4 part: ports, and the checksum over pseudo-header (@addr_diff)
 * and ports. @l4 must hold a whole TCP header (20 bytes) or UDP header.
 */
static __always_inline void
fp_nat_l4(void *l4, __u8 proto, const struct fp_nat *nat, __u64 addr_diff)
{
	__be16 *sport, *dport, *check;
	__u64 diff = addr_diff;
	bool udp = proto == FP_IPPROTO_UDP;

	if (udp) {
		struct udphdr *u = l4;

		sport = &u->source;
		dport = &u->dest;
		check = (__be16 *)&u->check;
	} else {
		struct tcphdr *t = l4;

		sport = &t->source;
		dport = &t->dest;
		check = (__be16 *)&t->check;
	}
	if (nat->flags & FP_NAT_SRC)
		diff += fp_nat_diff4(*sport, nat->sport);
	if (nat->flags & FP_NAT_DST)
		diff += fp_nat_diff4(*dport, nat->dport);
	/* UDP without a checksum keeps none (udp_manip_pkt's do_csum). */
	if (!udp || *check) {
		__u16 c = fp_nat_csum(*check, diff);

		if (udp && !c)
			c = 0xFFFF;
		*check = c;
	}
	if (nat->flags & FP_NAT_SRC)
		*sport = nat->sport;
	if (nat->flags & FP_NAT_DST)
		*dport = nat->dport;
}

/*
 * An ICMP or ICMPv6 echo (@l4: its 8-byte header): the id, and the
 * checksum over @addr_diff (0 for ICMPv4) and the id.
 */
static __always_inline void fp_nat_icmp(void *l4, const struct fp_nat *nat, __u64 addr_diff)
{
	__be16 *check = (__be16 *)l4 + 1, *id = (__be16 *)l4 + 2;

	*check = fp_nat_csum(*check, addr_diff + fp_nat_diff4(*id, nat->sport));
	*id = nat->sport;
}

/*
 * Rewrite an IPv4 packet of a TCP, UDP or ICMP echo flow (no IP options: @l4 follows
 * the 20-byte header). TTL is not touched; fp_ip4_dec_ttl() may run before
 * or after.
 */
static __always_inline void
fp_nat_apply4(struct iphdr *ip, void *l4, __u8 proto, const struct fp_nat *nat)
{
	__be32 nsrc = *(const __be32 *)nat->saddr, ndst = *(const __be32 *)nat->daddr;
	__u64 diff = 0;

	if (!nat->flags)
		return;
	if (nat->flags & FP_NAT_SRC)
		diff += fp_nat_diff4(ip->saddr, nsrc);
	if (nat->flags & FP_NAT_DST)
		diff += fp_nat_diff4(ip->daddr, ndst);
	if (proto == FP_IPPROTO_ICMP)
		fp_nat_icmp(l4, nat, 0);
	else
		fp_nat_l4(l4, proto, nat, diff);
	ip->check = fp_nat_csum(ip->check, diff);
	if (nat->flags & FP_NAT_SRC)
		ip->saddr = nsrc;
	if (nat->flags & FP_NAT_DST)
		ip->daddr = ndst;
}

/* IPv6: no header checksum; the pseudo-header holds all 32 address bytes. */
static __always_inline void
fp_nat_apply6(struct ipv6hdr *ip6, void *l4, __u8 proto, const struct fp_nat *nat)
{
	__u64 diff = 0;

	if (!nat->flags)
		return;
	if (nat->flags & FP_NAT_SRC)
		diff += fp_nat_diff16((const __u8 *)&ip6->saddr, nat->saddr);
	if (nat->flags & FP_NAT_DST)
		diff += fp_nat_diff16((const __u8 *)&ip6->daddr, nat->daddr);
	if (proto == FP_IPPROTO_ICMPV6)
		fp_nat_icmp(l4, nat, diff);
	else
		fp_nat_l4(l4, proto, nat, diff);
	if (nat->flags & FP_NAT_SRC)
		__builtin_memcpy(&ip6->saddr, nat->saddr, 16);
	if (nat->flags & FP_NAT_DST)
		__builtin_memcpy(&ip6->daddr, nat->daddr, 16);
}

/*
 * The whole rewrite of a committed frame (Ethernet, then IPv4 without
 * options or IPv6 without extension headers, then TCP, UDP or an ICMP
 * echo), for the
 * forwarding program after fp_tx_commit() invalidated its packet
 * pointers. The gate has already seen a complete L4 header; the
 * bounds tests are for the verifier. Returns 1, or 0 with the frame
 * untouched if the headers are not there after all.
 *
 * A global function on purpose: the verifier checks it once, on its own,
 * instead of once for every path of the forwarding program that reaches
 * the send step (inlined, the stateful program exceeds the verifier's
 * budget of one million instructions).
 */
__noinline int fp_nat_rewrite(struct xdp_md *ctx, const struct fp_nat *nat)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + 14;
	struct ipv6hdr *ip6 = data + 14;
	void *l4;

	if (!nat || !nat->flags)
		return 1;
	if ((void *)(eth + 1) > end)
		return 0;
	if (eth->h_proto == bpf_htons(0x0800)) {
		l4 = ip + 1;
		if (l4 > end)
			return 0;
		/* Constant protocols: one bounds test the verifier ties to each access. */
		if (ip->protocol == FP_IPPROTO_TCP && l4 + sizeof(struct tcphdr) <= end)
			fp_nat_apply4(ip, l4, FP_IPPROTO_TCP, nat);
		else if (ip->protocol == FP_IPPROTO_UDP && l4 + sizeof(struct udphdr) <= end)
			fp_nat_apply4(ip, l4, FP_IPPROTO_UDP, nat);
		else if (ip->protocol == FP_IPPROTO_ICMP && l4 + 8 <= end)
			fp_nat_apply4(ip, l4, FP_IPPROTO_ICMP, nat);
		else
			return 0;
		return 1;
	}
	if (eth->h_proto == bpf_htons(0x86DD)) {
		l4 = ip6 + 1;
		if (l4 > end)
			return 0;
		if (ip6->nexthdr == FP_IPPROTO_TCP && l4 + sizeof(struct tcphdr) <= end)
			fp_nat_apply6(ip6, l4, FP_IPPROTO_TCP, nat);
		else if (ip6->nexthdr == FP_IPPROTO_UDP && l4 + sizeof(struct udphdr) <= end)
			fp_nat_apply6(ip6, l4, FP_IPPROTO_UDP, nat);
		else if (ip6->nexthdr == FP_IPPROTO_ICMPV6 && l4 + 8 <= end)
			fp_nat_apply6(ip6, l4, FP_IPPROTO_ICMPV6, nat);
		else
			return 0;
		return 1;
	}
	return 0;
}

#endif /* FP_NAT_H */
