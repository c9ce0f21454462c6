/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * express.h — the common case on its own: an IPv4 TCP/UDP packet of a flow
 * the cache holds, in a stateless instance or, in stateful mode, of a flow
 * whose conntrack verdict the cache holds too; and the same for an IPv6
 * TCP/UDP packet (fp_express6, at the end).
 *
 * It takes the decision the general path (xdp_fwd.bpf.c) takes for such a
 * packet, with every check the general path makes on the way: ingress
 * known, no tc ingress, the tables kept current (watchdog), L2 (IPv4, our
 * MAC), IPv4 header sanity, the cache hit (flow.h: generation, idle time,
 * the guard), TTL and MTU; in stateful mode also those of ct.h's gate for a
 * cached verdict (TCP flags, a verdict not held for a FIN or RST, taken
 * under the current ct_generation less than ct_revalidate_ms ago). Their
 * order is free here: nothing is written before the last of them has
 * passed. Where the general path spreads the flow key over a struct and
 * reassembles it in every step, this path builds the two words an IPv4 way
 * stores straight from the headers and keeps its few values in registers,
 * and the general path runs as a function of its own, so that neither
 * one's register pressure spills into the other. A cache hit then costs
 * about what the checks themselves cost.
 *
 * Anything else returns FP_XP_DECLINED before any side effect, and the
 * general path decides the packet from scratch (counting it once): a miss,
 * a stale or idle entry, an entry not yet used in this clock tick (the
 * general path marks it used and keeps its neighbour alive, once a tick
 * per flow), a packet the guard sends past or samples, TTL <= 1, a datagram
 * over the cached MTU, a short or truncated datagram, other protocols,
 * IPv6 (fp_express6's), AF_XDP instances; in stateful mode a TCP SYN, FIN or RST, a verdict
 * due for revalidation (or dropped, or held).
 */
#ifndef FP_EXPRESS_H
#define FP_EXPRESS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "flow.h"
#include "tx.h"
#include "stats.h"
#include "watchdog.h"
#include "ct.h"

/* Not a reason: the packet goes to the general path. */
#define FP_XP_DECLINED FP_R__COUNT

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the key words are built little-endian");
_Static_assert(__builtin_offsetof(struct iphdr, daddr) == __builtin_offsetof(struct iphdr, saddr) + 4,
	       "saddr and daddr are one word, as in struct fp_flow_key4");

/*
 * Stateful mode: fp_ct_pass() would let this hit through on its cached
 * verdict @h (the caller finds a NATed flow's translation). The L4 header
 * (@proto, as the way's key has it: the packet's, since the key matched; at
 * the constant @l4_off, @l4_len bytes in the datagram) must be whole in the
 * frame and in the datagram (fp_ct_l4_reason()) and carry no flag
 * conntrack must see; the verdict must be current as fp_ct_gate() judges it.
 */
static __always_inline bool fp_express_ct_ok(struct xdp_md *ctx, const struct fp_runtime *rt,
					     const struct fp_watch *w, const struct fp_ct_hot *h, __u8 proto,
					     __u32 l4_off, __u32 l4_len)
{
	__u8 *l4 = (void *)(long)ctx->data + l4_off;
	__u32 state = h->state, t = state >> FP_CTH_FLAG_BITS, limit;

	if (proto == IPPROTO_TCP) {
		if (l4_len < 20 || (void *)(l4 + 20) > (void *)(long)ctx->data_end ||
		    (l4[13] & (FP_TCP_FIN | FP_TCP_SYN | FP_TCP_RST)))
			return false;
	} else if (l4_len < 8 || (void *)(l4 + 8) > (void *)(long)ctx->data_end) {
		return false;
	}
	/* A verdict dropped (t 0) or held for a FIN or RST. */
	if (!t || (state & FP_CTH_CLOSING) || h->ct_generation != rt->ct_generation)
		return false;
	/* The coarse clock as fp_coarse_ns() read it in this jiffy (the
	 * caller found kept_jiffies current); not read here, a helper call
	 * and its spills: the general path reads it once a jiffy. */
	if (w->jiffies != w->kept_jiffies)
		return false;
	limit = ((__u64)rt->ct_revalidate_ms * FP_NSEC_PER_MSEC) >> FP_CT_TICK_SHIFT;
	return ((fp_ct_tick(w->now_ns) - t) & FP_CT_TICK_MASK) < limit;
}

/*
 * The checks in front of the cache that do not depend on the family: the
 * counters of the ingress slot *@slot (one stack key for both lookups), the
 * guard, the watchdog, the ingress interface known and without tc ingress,
 * a frame to our MAC (@eth: the caller proved its header in bounds).
 * @clock: fp_runtime.neigh_clock. Returns the slot's counters, or NULL to
 * decline. First what a flood (the guard bypassing) or a silent daemon
 * turns away, so that those packets pay little for trying.
 */
static __always_inline struct fp_stats *fp_express_ingress(struct xdp_md *ctx, const volatile struct fp_config *cfg,
							   const struct fp_runtime *rt, const struct ethhdr *eth,
							   __u32 clock, __u32 *slot)
{
	const struct fp_iface *in;
	struct fp_stats *st;

	st = bpf_map_lookup_elem(&fp_stats, slot);
	if (!st)
		return NULL;
	/* The guard's window ends (fp_flow_guard_probed() judges it), or it
	 * sends packets past the cache: the general path's business. Stateful
	 * mode has no guard (fp_flow_bypass() says why). */
	if (!cfg->stateful && (st->guard.left <= 1 || st->guard.skip || st->guard.bypass))
		return NULL;
	if (!fp_kept_this_jiffy(&st->watch, clock, rt->orphan_grace))
		return NULL;
	in = bpf_map_lookup_elem(&fp_ifaces, slot);
	if (!in || (in->flags & (FP_IF_PRESENT | FP_IF_TC_INGRESS)) != FP_IF_PRESENT ||
	    ctx->ingress_ifindex != cfg->ingress_ifindex)
		return NULL;
	if (fp_mac_is_group(eth->h_dest) || !fp_mac_eq(eth->h_dest, in->mac))
		return NULL;
	return st;
}

/*
 * @hash, @hash_src: the hint the entry point found (FP_HS_SOFTWARE: none);
 * a frame whose VLAN tag the NIC stripped never comes here. Returns the
 * reason it counted (FP_R_FORWARDED after the rewrite), or FP_XP_DECLINED.
 */
static __always_inline __u32 fp_express(struct xdp_md *ctx, const volatile struct fp_config *cfg,
					const struct fp_runtime *rt, __u32 hash, __u32 hash_src)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + FP_ETH_HLEN;
	__u32 slot = cfg->ingress_slot, idx, len, tot_len, clock, ports, r;
	struct fp_flow_guard *g;
	struct fp_flow_way4 *f;
	struct fp_flow_set *s;
	struct fp_ct_set *c;
	const struct fp_nat *nat = NULL;
	struct fp_stats *st;
	__u64 key0, addrs;
	int way;
	__u8 proto;

	if (cfg->afxdp || !cfg->flow_sets || !rt->flow_timeout)
		return FP_XP_DECLINED;
	/* Ethernet, a 20-byte IPv4 header and the ports. */
	if (data + FP_ETH_HLEN + FP_IP4_HLEN + 4 > data_end || eth->h_proto != bpf_htons(FP_ETH_P_IP))
		return FP_XP_DECLINED;
	clock = rt->neigh_clock;
	st = fp_express_ingress(ctx, cfg, rt, eth, clock, &slot);
	if (!st)
		return FP_XP_DECLINED;
	g = &st->guard;
	proto = ip->protocol;
	if (*(__u8 *)ip != 0x45 || ip->ttl <= 1 || (ip->frag_off & bpf_htons(FP_IP4_FRAG_MASK)) ||
	    (proto != IPPROTO_TCP && proto != IPPROTO_UDP))
		return FP_XP_DECLINED;
	len = data_end - data;
	tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len < FP_IP4_HLEN + 4 || tot_len > len - FP_ETH_HLEN || !fp_ip4_csum_ok(ip))
		return FP_XP_DECLINED;

	/* struct fp_flow_key4 as its two words (fp_flow_key_l4: ports as sent,
	 * or none). */
	ports = fp_flow_ports(cfg, rt, FP_AF_INET) ? *(__u32 *)(ip + 1) : 0;
	key0 = FP_AF_INET | (__u64)proto << 8 | (__u64)slot << 16 | (__u64)ports << 32;
	addrs = *(__u64 *)&ip->saddr;
	if (hash_src == FP_HS_SOFTWARE)
		hash = fp_flow_hash_sw4_words(key0, addrs << 32, addrs >> 32);
	idx = fp_flow_index(hash, cfg->flow_sets);
	s = bpf_map_lookup_elem(&fp_flows, &idx);
	if (!s)
		return FP_XP_DECLINED;
	way = fp_flow_find4(s, key0, addrs, hash);
	if (way < 0)
		return FP_XP_DECLINED;
	f = fp_flow_way4(s, way);
	if (f->generation != (__u32)rt->generation || f->used != clock || tot_len > f->mtu)
		return FP_XP_DECLINED;
	if (cfg->stateful) {
		if (!fp_express_ct_ok(ctx, rt, &st->watch, &f->ct, f->key.proto, FP_ETH_HLEN + FP_IP4_HLEN,
				      tot_len - FP_IP4_HLEN))
			return FP_XP_DECLINED;
		/* NAT: the translation is in the way's fp_ct_flows line, as
		 * fp_ct_gate() finds it. */
		if (f->ct.state & FP_CTH_NAT) {
			c = bpf_map_lookup_elem(&fp_ct_flows, &idx);
			if (!c)
				return FP_XP_DECLINED;
			nat = &c->way[way & (FP_FLOW_WAYS - 1)].nat;
		}
	} else if (g->sticky && g->since && (__s32)(f->used - g->since) <= 0) {
		return FP_XP_DECLINED;
	}

	/* A hit, counted as fp_flow_lookup() counts one. */
	if (hash_src < FP_HS__COUNT)
		st->hash_src[hash_src]++;
	if (!cfg->stateful)
		g->left--;
	st->flow[FP_FC_HIT]++;
	r = fp_tx_commit(ctx, f->slot, &len, FP_ETH_HLEN + tot_len);
	if (r == FP_R_FORWARDED) {
		f->packets++;
		if (cfg->stateful)
			f->ct.bytes += tot_len;
		/* The trim invalidated every packet pointer. */
		eth = (void *)(long)ctx->data;
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > (void *)(long)ctx->data_end || (nat && !fp_nat_rewrite(ctx, nat))) {
			r = FP_R_REDIRECT_FAILED;
		} else {
			fp_flow_rewrite_eth(eth, f);
			fp_ip4_dec_ttl(ip);
		}
	}
	fp_count(st, r, len);
	return r;
}

/*
 * The same for an IPv6 TCP/UDP packet: the checks fp_fwd_ip6() makes in
 * front of the cache and on a hit (version, a datagram the frame holds, no
 * extension header, hop limit, MTU), the cache hit with the key the general
 * path builds, read as words from the headers; in stateful mode the cached
 * verdict, which for IPv6 is in the way's fp_ct_flows line with its NAT.
 * Called only for IPv6 frames, after the IPv4 path declined: in a stateless
 * instance as a function of its own, so that its frame stays out of the
 * IPv4 path's; a stateful instance inlines it as it does the rest.
 */
static __always_inline __u32 fp_express6(struct xdp_md *ctx, const volatile struct fp_config *cfg,
					 const struct fp_runtime *rt, __u32 hash, __u32 hash_src)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = data + FP_ETH_HLEN;
	const __u8 *a = (const __u8 *)&ip6->saddr;
	__u32 slot = cfg->ingress_slot, idx, len, ip_len, clock, ports, r;
	__u64 x[6];
	__u8 proto;
	const struct fp_flow_way *f;
	const struct fp_nat *nat = NULL;
	struct fp_ct_way *cw = NULL;
	struct fp_flow_set *s;
	struct fp_ct_set *c;
	struct fp_stats *st;
	int way;

	if (cfg->afxdp || !cfg->flow_sets || !rt->flow_timeout)
		return FP_XP_DECLINED;
	/* Ethernet, the IPv6 header and the ports. */
	if ((void *)(ip6 + 1) + 4 > data_end || eth->h_proto != bpf_htons(FP_ETH_P_IPV6))
		return FP_XP_DECLINED;
	clock = rt->neigh_clock;
	st = fp_express_ingress(ctx, cfg, rt, eth, clock, &slot);
	if (!st)
		return FP_XP_DECLINED;
	proto = ip6->nexthdr;
	if ((*(__u8 *)ip6 >> 4) != 6 || ip6->hop_limit <= 1 || (proto != IPPROTO_TCP && proto != IPPROTO_UDP))
		return FP_XP_DECLINED;
	len = data_end - data;
	ip_len = FP_IP6_HLEN + bpf_ntohs(ip6->payload_len);
	if (ip_len < FP_IP6_HLEN + 4 || ip_len > len - FP_ETH_HLEN)
		return FP_XP_DECLINED;

	/* struct fp_flow_key as fp_fwd_ip6() and fp_flow_key_l4() fill it,
	 * as its words read straight from the headers, with no key to build
	 * on the stack and read back: family to dport; the flow label and the
	 * source's first 4 bytes; 8 bytes of source; the source's last 4 and
	 * the destination's first 4 (adjacent in the header); 8 of
	 * destination; its last 4. */
	ports = fp_flow_ports(cfg, rt, FP_AF_INET6) ? *(__u32 *)(ip6 + 1) : 0;
	x[0] = FP_AF_INET6 | (__u64)proto << 8 | (__u64)slot << 16 | (__u64)ports << 32;
	x[1] = (*(__u32 *)ip6 & bpf_htonl(0x000FFFFF)) | (__u64)*(__u32 *)a << 32;
	x[2] = *(__u64 *)(a + 4);
	x[3] = *(__u64 *)(a + 12);
	x[4] = *(__u64 *)(a + 20);
	x[5] = *(__u32 *)(a + 28);
	if (hash_src == FP_HS_SOFTWARE)
		hash = fp_flow_hash_sw6_words(x[0], x[1], x[2], x[3], x[4], (__u32)x[5]);
	idx = fp_flow_index(hash, cfg->flow_sets);
	s = bpf_map_lookup_elem(&fp_flows, &idx);
	if (!s)
		return FP_XP_DECLINED;
	way = fp_flow_find6(s, x, hash);
	if (way < 0)
		return FP_XP_DECLINED;
	way &= FP_FLOW_WAYS - 1;
	f = &s->way[way];
	if (s->generation[way] != (__u32)rt->generation || s->used[way] != clock || ip_len > f->mtu)
		return FP_XP_DECLINED;
	if (cfg->stateful) {
		c = bpf_map_lookup_elem(&fp_ct_flows, &idx);
		if (!c)
			return FP_XP_DECLINED;
		cw = &c->way[way];
		if (!fp_express_ct_ok(ctx, rt, &st->watch, &cw->hot, proto, FP_ETH_HLEN + FP_IP6_HLEN,
				      ip_len - FP_IP6_HLEN))
			return FP_XP_DECLINED;
		if (cw->hot.state & FP_CTH_NAT)
			nat = &cw->nat;
	} else if (st->guard.sticky && st->guard.since && (__s32)(s->used[way] - st->guard.since) <= 0) {
		return FP_XP_DECLINED;
	}

	/* A hit, counted as fp_flow_lookup() counts one. */
	if (hash_src < FP_HS__COUNT)
		st->hash_src[hash_src]++;
	if (!cfg->stateful)
		st->guard.left--;
	st->flow[FP_FC_HIT]++;
	r = fp_tx_commit(ctx, f->slot, &len, FP_ETH_HLEN + ip_len);
	if (r == FP_R_FORWARDED) {
		s->packets[way]++;
		if (cw)
			cw->hot.bytes += ip_len;
		/* The trim invalidated every packet pointer. */
		eth = (void *)(long)ctx->data;
		ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > (void *)(long)ctx->data_end || (nat && !fp_nat_rewrite(ctx, nat))) {
			r = FP_R_REDIRECT_FAILED;
		} else {
			fp_tx_rewrite_eth(eth, f->dmac, f->smac);
			ip6->hop_limit--;
		}
	}
	fp_count(st, r, len);
	return r;
}

#endif /* FP_EXPRESS_H */
