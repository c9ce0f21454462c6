/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * xdp_fwd — the forwarding fast path, one instance per managed interface.
 *
 * A packet is forwarded here only when fastpath's tables say exactly what
 * the kernel would do with it; every other packet leaves with XDP_PASS,
 * unmodified, and is counted under the reason (per CPU, per ingress slot,
 * packets and frame bytes). Forwarded packets are counted with the length
 * actually transmitted.
 *
 * Order of checks, modelled on the kernel's receive and forward path so
 * that the reason names the step at which the kernel itself would decide:
 *   ingress known -> L2 (VLAN, not IP, group MAC, other host)
 *   -> IP header sanity (ip_rcv_core / ipv6_rcv: malformed, options,
 *      fragments, IPv6 extension headers)
 *   -> address classes (ip_route_input_slow: martian, multicast,
 *      link-local)
 *   -> runtime switches (policy routing, table full): they say our FIB
 *      cannot be trusted, so they come before any lookup
 *   -> FIB (local, blackhole, unreachable, prohibit, punt, no route)
 *   -> forwarding sysctl (the kernel tests it after the local check)
 *   -> IPv4 source validation (fib_validate_source: rp_filter, own address
 *      as source)
 *   -> ip_forward / ip6_forward: TTL, egress, same interface, MTU
 *   -> neighbour -> devmap -> rewrite.
 * Since every punt is the same XDP_PASS, the order only affects which
 * counter moves, never the bytes on the wire.
 *
 * In front of the FIB sits the per-CPU flow cache (flow.h): once the IP
 * header has passed its sanity checks, a packet whose flow was forwarded
 * under the current table generation reuses that result (egress, MACs,
 * MTU) and only the per-packet checks remain (TTL, length). The cached
 * result is only ever a forward; every punt is decided afresh.
 *
 * The commonest packet of all, an IPv4 TCP/UDP cache hit (in stateful
 * mode one whose conntrack verdict is cached and current; an IPv6 one too,
 * in the plain stateless entry point through a call), goes a shorter way first
 * (express.h): the same checks and the same decision; whatever it declines
 * takes the general path below from scratch.
 *
 * Two entry points share all of this: fp_xdp_fwd takes the flow hash from
 * an fp_rx_hint in the metadata area or computes it, fp_xdp_fwd_hw first
 * asks a real NIC (bpf_xdp_metadata_rx_hash, so it must be loaded bound to
 * its device; BPF_PROG_RUN cannot run it), and also punts frames whose
 * VLAN tag the NIC stripped (bpf_xdp_metadata_rx_vlan_tag), which the plain
 * entry point cannot see. One instance is loaded per interface with its
 * own fp_config; all instances share the maps.
 *
 * Stateful mode (fp_config.stateful, ct.h) adds the conntrack gate where
 * the kernel has conntrack, before routing: on the full path after the
 * address checks and before the FIB, on a cache hit after the per-packet
 * checks. Stateless instances have the gate compiled in but never run it
 * (fp_cfg is read-only: the verifier drops the dead branch).
 *
 * AF_XDP mode (fp_cfg.afxdp, xsk.h): the same decisions, but a packet to
 * forward goes untouched to the user-space forwarder's socket with the
 * rewrite data in its metadata; user space rewrites and transmits it.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "fib.h"
#include "neigh.h"
#include "tx.h"
#include "ecmp.h"
#include "mphash.h"
#include "flow.h"
#include "stats.h"
#include "watchdog.h"
#include "ct.h"
#include "xsk.h"
#include "express.h"

/* fp_cfg (per instance, set before load) is in maps.h. */

/* The whole .bss: the daemon writes it as one value. Nothing else goes here. */
struct fp_runtime fp_rt;

#define FP_IPPROTO_ICMP   1
#define FP_IPPROTO_TCP    6
#define FP_IPPROTO_UDP    17
#define FP_IPPROTO_ICMPV6 58

/* One packet's way through the program. */
struct fp_pkt {
	struct xdp_md *ctx;
	const struct fp_iface *in;
	struct fp_stats *st;
	__u32 gen;               /* fp_rt.generation (low 32 bits), read once before any table */
	__u32 len;               /* frame length, updated by the trim */
	__u32 hash;              /* flow hash from a hint (hash_src != SOFTWARE) */
	__u32 hash_src;          /* enum fp_hash_src */
	__u32 hash_l4;           /* the hint is an L4 (RSS) hash */
	__u32 vlan_stripped;     /* the NIC took an 802.1Q tag off into metadata */
	__u32 clock;             /* fp_rt.neigh_clock */
	__u32 timeout;           /* fp_rt.flow_timeout, 0 = no cache */
};

/* One in this many misses into a set of live flows may evict one. */
#define FP_FLOW_ADMIT 8

/* Where the cache lookup left off: the hit, or where the miss path fills. */
struct fp_flow_pos {
	struct fp_flow_set *set;
	__u32 idx;               /* the set's index in fp_flows / fp_ct_flows */
	__u32 hash;
	int way;                 /* way holding the key (hit, stale or idle), or -1 */
	__u32 prev_nh;           /* its next hop if stale: ECMP stickiness */
};

/*
 * L4 part of the key: ports for TCP/UDP (unless fp_flow_ports() says the
 * family's keys go without), type and code for ICMP; in stateful mode also
 * the echo id (conntrack keeps one entry per id, and so must the cache of
 * its verdicts).
 */
static __always_inline void
fp_flow_key_l4(struct fp_flow_key *k, void *l4, void *data_end, __u32 l4_len, __u8 icmp_proto)
{
	__u16 *w = l4;

	k->sport = 0;
	k->dport = 0;
	if (k->proto == FP_IPPROTO_TCP || k->proto == FP_IPPROTO_UDP) {
		if (!fp_flow_ports(&fp_cfg, &fp_rt, k->family))
			return;
		/* A datagram too short for ports hashes without them (the flow
		 * dissector finds none either). */
		if (l4_len >= 4 && (void *)(w + 2) <= data_end) {
			k->sport = w[0];
			k->dport = w[1];
		}
	} else if (k->proto == icmp_proto) {
		if (l4_len >= 2 && (void *)(w + 1) <= data_end)
			k->sport = w[0];
		if (fp_cfg.stateful && l4_len >= 8 && (void *)(w + 4) <= data_end)
			k->dport = w[2];
	}
}

/*
 * The thrash guard (struct fp_flow_guard): true when this packet goes past
 * the cache. Stateful mode never does: a TCP packet's flags act on its
 * flow's cached verdict (fp_ct_closing), which only a lookup finds.
 */
static __always_inline bool fp_flow_bypass(struct fp_pkt *p)
{
	struct fp_flow_guard *g = &p->st->guard;

	if (fp_cfg.stateful || !g->skip)
		return false;
	g->skip--;
	p->st->flow[FP_FC_BYPASS]++;
	return true;
}

/* The cache is being bypassed (every packet but the sampled ones). */
static __always_inline bool fp_flow_bypassing(struct fp_pkt *p)
{
	return !fp_cfg.stateful && p->st->guard.bypass;
}

/*
 * A cached flow last used before the latest bypass began: the bypass sent
 * it by the full lookup meanwhile, so its entry (an ECMP path kept across a
 * group change) must not take it back to where it was before. Decides
 * whether a stale entry keeps its path.
 */
static __always_inline bool fp_flow_predates_bypass(struct fp_pkt *p, __u32 used)
{
	__u32 since = p->st->guard.since;

	return !fp_cfg.stateful && since && (__s32)(used - since) <= 0;
}

/*
 * The same for a hit, which holds the current generation's result: that
 * differs from the full lookup's only for a flow kept off the hash's path,
 * so only once such a flow may have been cached (guard.sticky: a flow
 * cached before a group change kept its next hop). Otherwise the entry
 * is trusted, also when it was filled in the clock second the bypass began
 * (which the second-grained clock cannot tell from before it).
 */
static __always_inline bool fp_flow_hit_predates_bypass(struct fp_pkt *p, __u32 used)
{
	return p->st->guard.sticky && fp_flow_predates_bypass(p, used);
}

/* A lookup is made: the guard's window (flow.h). */
static __always_inline void fp_flow_probed(struct fp_pkt *p, __u32 hash)
{
	if (!fp_cfg.stateful)
		fp_flow_guard_probed(&p->st->guard, p->clock, hash);
}

/*
 * Looks the flow up: true on a hit (pos->way), else records where to fill.
 * @v4: an IPv4 key (a constant at each call): its home way is tried first,
 * without the set's first line (flow.h).
 */
static __always_inline bool
fp_flow_lookup(struct fp_pkt *p, const struct fp_flow_key *k, struct fp_flow_pos *pos, bool v4)
{
	struct fp_flow_set *s;
	__u32 idx, w, gen, used;

	pos->set = NULL;
	pos->way = -1;
	pos->prev_nh = 0;
	if (!p->timeout || !fp_cfg.flow_sets || fp_flow_bypass(p))
		return false;
	pos->hash = p->hash_src != FP_HS_SOFTWARE ? p->hash : v4 ? fp_flow_hash_sw4(k) : fp_flow_hash_sw(k);
	if (p->hash_src < FP_HS__COUNT)
		p->st->hash_src[p->hash_src]++;
	pos->idx = idx = fp_flow_index(pos->hash, fp_cfg.flow_sets);
	s = bpf_map_lookup_elem(&fp_flows, &idx);
	pos->set = s;
	if (!s)
		return false;
	fp_flow_probed(p, pos->hash);
	if (v4)
		pos->way = fp_flow_find4(s, *(const __u64 *)k, fp_flow_key4_addrs(k), pos->hash);
	else
		pos->way = fp_flow_find(s, k, pos->hash);
	if (pos->way < 0) {
		p->st->flow[FP_FC_MISS]++;
		return false;
	}
	w = pos->way & (FP_FLOW_WAYS - 1);
	gen = fp_flow_gen(s, w, v4);
	if (gen != p->gen) {
		p->st->flow[FP_FC_STALE]++;
		p->st->flow[FP_FC_MISS]++;
		if ((__s32)(gen - (__u32)fp_rt.mp_generation) >= 0 && !fp_flow_bypassing(p) &&
		    !fp_flow_predates_bypass(p, fp_flow_used(s, w, v4))) {
			pos->prev_nh = s->way[w].nh_id;
			/* Computed before a group changed, it may now keep its
			 * flow off the hash's path: the thrash guard must know. */
			if ((__s32)(gen - fp_rt.group_generation) < 0)
				p->st->guard.sticky = 1;
		}
		return false;
	}
	used = fp_flow_used(s, w, v4);
	if (p->clock - used > p->timeout) {
		p->st->flow[FP_FC_EXPIRED]++;
		p->st->flow[FP_FC_MISS]++;
		return false;
	}
	if (fp_flow_hit_predates_bypass(p, used)) {
		p->st->flow[FP_FC_MISS]++;
		return false;
	}
	p->st->flow[FP_FC_HIT]++;
	/*
	 * While the cache is bypassed, the packets sent past it take the path
	 * the kernel's hash picks; a sampled one must not take another (an
	 * ECMP flow kept on its old path after a group change), or the flow
	 * would alternate between paths. It takes the full lookup too, which
	 * refreshes this way: the flow moves once, as if it had been evicted.
	 */
	return !fp_flow_bypassing(p);
}

/* Returns the way filled, or -1. */
static __always_inline int
fp_flow_store(struct fp_pkt *p, struct fp_flow_pos *pos, const struct fp_flow_key *k, const struct fp_tx *tx, bool v4)
{
	bool evict = false;
	__u32 w;

	if (!pos->set)
		return -1;
	if (pos->way >= 0) {
		w = pos->way;
	} else {
		w = fp_flow_victim(pos->set, pos->hash, p->gen, p->clock, p->timeout, &evict);
		if (evict) {
			p->st->guard.crowded++;
			/*
			 * Admission under pressure: only one miss in
			 * FP_FLOW_ADMIT may push out a live flow, so a scan of
			 * many short flows cannot flush the cache (nor pay a
			 * fill for every packet); a flow that keeps sending
			 * gets in after a few packets. By chance, not by a
			 * count: with a count, a scan whose period is a
			 * multiple of FP_FLOW_ADMIT offers the same flows
			 * every time.
			 */
			if (fp_flow_guard_rand(&p->st->guard, pos->hash) % FP_FLOW_ADMIT)
				return -1;
			p->st->flow[FP_FC_EVICT]++;
		}
	}
	fp_flow_fill(pos->set, w, pos->hash, k, tx, p->gen, p->clock, v4, pos->way >= 0);
	return w;
}

/* Stateful mode: the conntrack gate (ct.h) with this flow's cached verdict. */
static __always_inline __u32
fp_ct_pass(struct fp_pkt *p, const struct fp_flow_key *k, const struct fp_flow_pos *pos, __u32 l4_off, __u32 l4_len,
	   struct fp_ct_verdict *v, bool v4)
{
	bool closes = false;
	__u32 r = fp_ct_l4_reason(p->ctx, k->proto, v4 ? FP_IPPROTO_ICMP : FP_IPPROTO_ICMPV6, l4_off, l4_len, &closes);

	if (r) {
		if (r == FP_R_CT_TCP_FLAGS && pos->set)
			fp_ct_closing(&fp_rt, pos->idx, pos->way, v4, closes);
		return r;
	}
	return fp_ct_gate(p->ctx, &fp_rt, k, pos->set != NULL, pos->idx, pos->way, &p->st->watch, v, v4);
}

/*
 * A hit: count it, and once per clock tick mark it used and keep its
 * neighbour alive, as the full path does on every packet. An IPv4 hit
 * touches the set's first line only then.
 */
static __always_inline void fp_flow_touch(struct fp_pkt *p, struct fp_flow_set *s, __u32 w,
					  const struct fp_flow_way *f, __u8 family, __be32 dst4, const __u8 *dst6)
{
	struct fp_nexthop *nh;
	struct fp_neigh *n;

	w &= FP_FLOW_WAYS - 1;
	if (family == FP_AF_INET) {
		struct fp_flow_way4 *f4 = fp_flow_way4(s, w);

		f4->packets++;
		if (f4->used == p->clock)
			return;
		f4->used = p->clock;
	} else {
		s->packets[w]++;
		if (s->used[w] == p->clock)
			return;
	}
	s->used[w] = p->clock;
	nh = fp_nexthop_lookup(f->nh_id);
	if (!nh)
		return;
	n = fp_neigh_lookup(nh->ifindex, nh, family, dst4, dst6);
	if (n)
		fp_neigh_touch(n, p->clock);
}

/* ICMP types whose multipath hash the kernel takes from the inner header
 * (or might): everything but echo. */
static __always_inline bool fp_icmp_not_echo(__u8 proto, __u16 type_code)
{
	__u8 type = *(__u8 *)&type_code;

	if (proto == FP_IPPROTO_ICMP)
		return type != 0 && type != 8;
	if (proto == FP_IPPROTO_ICMPV6)
		return type != 128 && type != 129;
	return false;
}

/*
 * The next hop for route @rt: its own, or for a multipath route the path
 * the kernel's hash picks (a stale cached flow keeps its path while that
 * is still one). Returns FP_R_FORWARDED with *@nh_id set, or why not.
 * @v4: @k is IPv4, a constant at each call, so that each family's path
 * holds only its own hash.
 */
static __always_inline __u32
fp_route_nexthop(struct fp_pkt *p, const struct fp_route *rt, const struct fp_flow_key *k, __u32 prev_nh,
		 __u32 *nh_id, bool v4)
{
	const struct fp_group *g;
	__u32 policy, fields, hash;
	__u16 sport = 0, dport = 0;
	int l4;

	if (rt->type == FP_RT_FORWARD) {
		*nh_id = rt->nh_id;
		return FP_R_FORWARDED;
	}
	g = fp_group_lookup(rt->nh_id);
	if (!g || !g->kind)
		return FP_R_ROUTE_UNSUPPORTED;
	if (fp_icmp_not_echo(k->proto, k->sport))
		return FP_R_ICMP_ERROR_ECMP;
	if (fp_group_has(g, prev_nh)) {
		*nh_id = prev_nh;
		return FP_R_FORWARDED;
	}
	policy = v4 ? fp_rt.mp_policy4 : fp_rt.mp_policy6;
	fields = v4 ? fp_rt.mp_fields4 : fp_rt.mp_fields6;
	if (policy) {
		l4 = fp_mp_ports_proto(policy, fields, k->proto);
		if (l4 < 0)
			return FP_R_ECMP;
		if (l4 > 0) {
			sport = k->sport;
			dport = k->dport;
		}
	}
	if (policy == 1 && p->hash_src == FP_HS_NIC && p->hash_l4 && fp_cfg.nic_hash_is_skb_hash)
		hash = p->hash >> 1;
	else if (v4)
		hash = fp_mp_hash4(policy, fields, fp_rt.mp_seed, *(__be32 *)k->saddr, *(__be32 *)k->daddr,
				   k->proto, sport, dport);
	else
		hash = fp_mp_hash6(policy, fields, fp_rt.mp_seed, k->saddr, k->daddr, k->flowlabel, k->proto,
				   sport, dport);
	*nh_id = fp_group_select(g, rt->nh_id, hash);
	if (!*nh_id)
		return FP_R_ROUTE_UNSUPPORTED;
	return FP_R_FORWARDED;
}

/*
 * The frame ends before its headers or datagram do. With xdp.frags a
 * driver hands a frame larger than one buffer (jumbo MTU) over in pieces,
 * and the program sees only the first: that is no malformed frame but one
 * the kernel forwards (counted with its whole length). The pieces are
 * looked at only here, off the common path; a frame whose datagram fits
 * the first buffer while only its trailer spills over would be forwarded
 * with that trailer, which no driver produces for a well-formed frame.
 */
static __always_inline __u32 fp_truncated(struct fp_pkt *p)
{
	__u32 whole = bpf_xdp_get_buff_len(p->ctx);

	if (whole <= p->len)
		return FP_R_MALFORMED;
	p->len = whole;
	return FP_R_MULTI_BUFFER;
}

static __always_inline __u32 fp_fwd_ip4(struct fp_pkt *p)
{
	struct xdp_md *ctx = p->ctx;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + FP_ETH_HLEN;
	struct fp_flow_key k __attribute__((aligned(8))) = {};
	struct fp_flow_pos pos;
	const struct fp_route *rt;
	struct fp_fwd_scratch *sc;
	const struct fp_flow_way *f = NULL;
	const __u8 *dmac, *smac;
	struct fp_tx tx;
	struct fp_ct_verdict ctv;
	__u32 tot_len, r, nh_id, slot;
	__be32 dst;
	int filled = -1;
	__u8 vihl;

	if ((void *)(ip + 1) > data_end)
		return FP_R_MALFORMED;
	vihl = *(__u8 *)ip;
	if ((vihl >> 4) != 4 || (vihl & 0xF) < 5)
		return FP_R_MALFORMED;
	if ((vihl & 0xF) > 5)
		return FP_R_IP_OPTIONS;
	tot_len = bpf_ntohs(ip->tot_len);
	if (tot_len < FP_IP4_HLEN)
		return FP_R_MALFORMED;
	if (tot_len > p->len - FP_ETH_HLEN)
		return fp_truncated(p);
	if (!fp_ip4_csum_ok(ip))
		return FP_R_MALFORMED;
	if (ip->frag_off & bpf_htons(FP_IP4_FRAG_MASK))
		return FP_R_FRAGMENT;

	k.family = FP_AF_INET;
	k.proto = ip->protocol;
	k.ingress = fp_cfg.ingress_slot;
	*(__be32 *)k.saddr = ip->saddr;
	*(__be32 *)k.daddr = ip->daddr;
	fp_flow_key_l4(&k, ip + 1, data_end, tot_len - FP_IP4_HLEN, FP_IPPROTO_ICMP);

	if (fp_flow_lookup(p, &k, &pos, true)) {
		f = &pos.set->way[pos.way & (FP_FLOW_WAYS - 1)];
		if (ip->ttl <= 1)
			return FP_R_TTL_EXCEEDED;
		if (tot_len > f->mtu)
			goto full;
		if (fp_cfg.stateful) {
			r = fp_ct_pass(p, &k, &pos, FP_ETH_HLEN + FP_IP4_HLEN, tot_len - FP_IP4_HLEN, &ctv, true);
			if (r != FP_R_FORWARDED)
				return r;
		}
		slot = f->slot;
		dmac = f->dmac;
		smac = f->smac;
		goto send;
	}
full:
	f = NULL;
	r = fp_ip4_addr_reason(ip->saddr, ip->daddr);
	if (r)
		return r;

	if (fp_rt.policy_punt & FP_FAM_V4)
		return FP_R_POLICY_ROUTING;
	if (fp_rt.table_full & FP_FAM_V4)
		return FP_R_TABLE_FULL;
	if (fp_cfg.stateful) {
		r = fp_ct_pass(p, &k, &pos, FP_ETH_HLEN + FP_IP4_HLEN, tot_len - FP_IP4_HLEN, &ctv, true);
		if (r != FP_R_FORWARDED)
			return r;
	}
	/* NAT: the kernel routes what PREROUTING's destination NAT made. */
	dst = ip->daddr;
	if (fp_cfg.stateful && (ctv.nat.flags & FP_NAT_DST)) {
		dst = fp_nat_daddr4(&ctv.nat, dst);
		r = fp_ip4_addr_reason(ip->saddr, dst);
		if (r)
			return r;
	}

	rt = fp_fib4_lookup(dst);
	if (!rt)
		return FP_R_NO_ROUTE;
	/* A copy, as for IPv6 (fp_fib4_vals and fp_fib4 are two maps). */
	sc = bpf_map_lookup_elem(&fp_fwd_scratch, &fp_zero_key);
	if (!sc)
		return FP_R_NO_ROUTE;
	sc->rt = *rt;
	rt = &sc->rt;
	r = fp_route_reason(rt);
	if (r != FP_R_FORWARDED)
		return r;
	if (!(p->in->flags & FP_IF_FWD4))
		return FP_R_FORWARDING_DISABLED;
	r = fp_ip4_rpf_reason(p->in, fp_cfg.ingress_ifindex, ip->saddr, fp_rt.src_lpm);
	if (r)
		return r;
	if (ip->ttl <= 1)
		return FP_R_TTL_EXCEEDED;

	/* NAT: ECMP would hash the rewritten header; not done here. */
	if (fp_cfg.stateful && (ctv.nat.flags & FP_NAT_DST) && rt->type != FP_RT_FORWARD)
		return FP_R_CT_NAT;
	r = fp_route_nexthop(p, rt, &k, pos.prev_nh, &nh_id, true);
	if (r != FP_R_FORWARDED)
		return r;
	r = fp_tx_resolve(&tx, rt, nh_id, fp_cfg.ingress_slot, FP_AF_INET, dst, NULL, tot_len);
	if (r != FP_R_FORWARDED)
		return r;
	slot = tx.slot;
	dmac = tx.dmac;
	smac = tx.smac;
send:
	if (fp_cfg.afxdp)
		r = fp_xsk_commit(ctx, fp_cfg.ingress_slot, slot, &p->len, FP_ETH_HLEN + tot_len, dmac, smac,
				  FP_AF_INET);
	else
		r = fp_tx_commit(ctx, slot, &p->len, FP_ETH_HLEN + tot_len);
	if (r != FP_R_FORWARDED)
		return r;
	if (f) {
		fp_flow_touch(p, pos.set, pos.way, f, FP_AF_INET,
			      fp_cfg.stateful ? fp_nat_daddr4(&ctv.nat, *(__be32 *)k.daddr) : *(__be32 *)k.daddr, NULL);
	} else {
		fp_neigh_touch(tx.neigh, p->clock);
		filled = fp_flow_store(p, &pos, &k, &tx, true);
	}
	if (fp_cfg.stateful)
		fp_ct_done(&ctv, f ? pos.way : filled, !f, tot_len, true);
	/* AF_XDP: user space rewrites (the daemon refuses it with stateful). */
	if (fp_cfg.afxdp)
		return FP_R_FORWARDED;

	/* The trim invalidated every packet pointer. */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	ip = data + FP_ETH_HLEN;
	if ((void *)(ip + 1) > data_end)
		return FP_R_REDIRECT_FAILED;
	if (fp_cfg.stateful && !fp_nat_rewrite(ctx, &ctv.nat))
		return FP_R_REDIRECT_FAILED;
	fp_tx_rewrite_eth(data, dmac, smac);
	fp_ip4_dec_ttl(ip);
	return FP_R_FORWARDED;
}

static __always_inline __u32 fp_fwd_ip6(struct fp_pkt *p)
{
	struct xdp_md *ctx = p->ctx;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + FP_ETH_HLEN;
	struct fp_flow_key k __attribute__((aligned(8))) = {};
	struct fp_fwd_scratch *sc;
	struct fp_flow_pos pos;
	const struct fp_route *rt;
	const struct fp_flow_way *f = NULL;
	const __u8 *dmac, *smac;
	struct fp_tx tx;
	struct fp_ct_verdict ctv;
	__u32 ip_len, r, nh_id, slot;
	int filled = -1;

	if ((void *)(ip6 + 1) > data_end)
		return FP_R_MALFORMED;
	if ((*(__u8 *)ip6 >> 4) != 6)
		return FP_R_MALFORMED;
	ip_len = FP_IP6_HLEN + bpf_ntohs(ip6->payload_len);
	if (ip_len > p->len - FP_ETH_HLEN)
		return fp_truncated(p);
	if (fp_ip6_is_ext_hdr(ip6->nexthdr))
		goto slow_checks;

	k.family = FP_AF_INET6;
	k.proto = ip6->nexthdr;
	k.ingress = fp_cfg.ingress_slot;
	k.flowlabel = *(__be32 *)ip6 & bpf_htonl(0x000FFFFF);
	__builtin_memcpy(k.saddr, &ip6->saddr, 16);
	__builtin_memcpy(k.daddr, &ip6->daddr, 16);
	fp_flow_key_l4(&k, ip6 + 1, data_end, ip_len - FP_IP6_HLEN, FP_IPPROTO_ICMPV6);

	if (fp_flow_lookup(p, &k, &pos, false)) {
		f = &pos.set->way[pos.way & (FP_FLOW_WAYS - 1)];
		if (ip6->hop_limit <= 1)
			return FP_R_TTL_EXCEEDED;
		if (ip_len > f->mtu)
			goto full;
		if (fp_cfg.stateful) {
			r = fp_ct_pass(p, &k, &pos, FP_ETH_HLEN + FP_IP6_HLEN, ip_len - FP_IP6_HLEN, &ctv, false);
			if (r != FP_R_FORWARDED)
				return r;
		}
		slot = f->slot;
		dmac = f->dmac;
		smac = f->smac;
		goto send;
	}
full:
	f = NULL;
	r = fp_ip6_addr_reason(&ip6->saddr, &ip6->daddr);
	if (r)
		return r;

	if (fp_rt.policy_punt & FP_FAM_V6)
		return FP_R_POLICY_ROUTING;
	if (fp_rt.table_full & FP_FAM_V6)
		return FP_R_TABLE_FULL;
	if (fp_cfg.stateful) {
		r = fp_ct_pass(p, &k, &pos, FP_ETH_HLEN + FP_IP6_HLEN, ip_len - FP_IP6_HLEN, &ctv, false);
		if (r != FP_R_FORWARDED)
			return r;
	}

	sc = bpf_map_lookup_elem(&fp_fwd_scratch, &fp_zero_key);
	if (!sc)
		return FP_R_NO_ROUTE;
	__builtin_memcpy(sc->key.addr, &ip6->daddr, sizeof(sc->key.addr));
	/* NAT: the kernel routes what PREROUTING's destination NAT made. */
	if (fp_cfg.stateful && (ctv.nat.flags & FP_NAT_DST)) {
		__builtin_memcpy(sc->key.addr, ctv.nat.daddr, sizeof(sc->key.addr));
		r = fp_ip6_addr_reason(&ip6->saddr, (const struct in6_addr *)sc->key.addr);
		if (r)
			return r;
	}
	rt = fp_fib6_lookup(&sc->key);
	if (!rt)
		return FP_R_NO_ROUTE;
	sc->rt = *rt;
	rt = &sc->rt;
	r = fp_route_reason(rt);
	if (r != FP_R_FORWARDED)
		return r;
	if (!(p->in->flags & FP_IF_FWD6))
		return FP_R_FORWARDING_DISABLED;
	if (ip6->hop_limit <= 1)
		return FP_R_TTL_EXCEEDED;

	/* NAT: ECMP would hash the rewritten header; not done here. */
	if (fp_cfg.stateful && (ctv.nat.flags & FP_NAT_DST) && rt->type != FP_RT_FORWARD)
		return FP_R_CT_NAT;
	r = fp_route_nexthop(p, rt, &k, pos.prev_nh, &nh_id, false);
	if (r != FP_R_FORWARDED)
		return r;
	r = fp_tx_resolve(&tx, rt, nh_id, fp_cfg.ingress_slot, FP_AF_INET6, 0, sc->key.addr, ip_len);
	if (r != FP_R_FORWARDED)
		return r;
	slot = tx.slot;
	dmac = tx.dmac;
	smac = tx.smac;
send:
	if (fp_cfg.afxdp)
		r = fp_xsk_commit(ctx, fp_cfg.ingress_slot, slot, &p->len, FP_ETH_HLEN + ip_len, dmac, smac,
				  FP_AF_INET6);
	else
		r = fp_tx_commit(ctx, slot, &p->len, FP_ETH_HLEN + ip_len);
	if (r != FP_R_FORWARDED)
		return r;
	if (f) {
		/* NAT: the neighbour is the rewritten destination's (k is done with). */
		if (fp_cfg.stateful && (ctv.nat.flags & FP_NAT_DST))
			__builtin_memcpy(k.daddr, ctv.nat.daddr, 16);
		fp_flow_touch(p, pos.set, pos.way, f, FP_AF_INET6, 0, k.daddr);
	} else {
		fp_neigh_touch(tx.neigh, p->clock);
		filled = fp_flow_store(p, &pos, &k, &tx, false);
	}
	if (fp_cfg.stateful)
		fp_ct_done(&ctv, f ? pos.way : filled, !f, ip_len, false);
	if (fp_cfg.afxdp)
		return FP_R_FORWARDED;

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	ip6 = data + FP_ETH_HLEN;
	if ((void *)(ip6 + 1) > data_end)
		return FP_R_REDIRECT_FAILED;
	if (fp_cfg.stateful && !fp_nat_rewrite(ctx, &ctv.nat))
		return FP_R_REDIRECT_FAILED;
	fp_tx_rewrite_eth(data, dmac, smac);
	ip6->hop_limit--;
	return FP_R_FORWARDED;

slow_checks:
	/* Address classes are decided before extension headers, as before. */
	r = fp_ip6_addr_reason(&ip6->saddr, &ip6->daddr);
	return r ? r : FP_R_IPV6_EXT_HDR;
}

static __always_inline __u32 fp_fwd(struct fp_pkt *p)
{
	void *data = (void *)(long)p->ctx->data;
	void *data_end = (void *)(long)p->ctx->data_end;
	struct ethhdr *eth = data;
	__be16 proto;

	if ((void *)(eth + 1) > data_end)
		return FP_R_MALFORMED;
	proto = eth->h_proto;
	if (proto == bpf_htons(FP_ETH_P_8021Q) || proto == bpf_htons(FP_ETH_P_8021AD) || p->vlan_stripped)
		return FP_R_VLAN;
	if (proto != bpf_htons(FP_ETH_P_IP) && proto != bpf_htons(FP_ETH_P_IPV6))
		return FP_R_NOT_IP;
	if (fp_mac_is_group(eth->h_dest))
		return FP_R_MULTICAST;
	if (!fp_mac_eq(eth->h_dest, p->in->mac))
		return FP_R_L2_OTHER_HOST;
	if (proto == bpf_htons(FP_ETH_P_IP))
		return fp_fwd_ip4(p);
	return fp_fwd_ip6(p);
}

/* A hint in the metadata area, if an upstream program left exactly one. */
static __always_inline void fp_take_meta_hint(struct fp_pkt *p)
{
	void *data = (void *)(long)p->ctx->data;
	struct fp_rx_hint *h = (void *)(long)p->ctx->data_meta;

	/* The first test proves the bounds to the verifier, the second the
	 * size; the empty asm keeps clang from merging them into one "!=". */
	if ((void *)(h + 1) > data)
		return;
	asm volatile("" : "+r"(data));
	if ((void *)(h + 1) != data)
		return;
	if (h->magic != FP_HINT_MAGIC)
		return;
	/* A hash over the ports would scatter the connections of one address
	 * pair over as many sets (fp_flow_ports()). */
	if (fp_cfg.flow_key_addrs && (h->flags & FP_HINT_L4))
		return;
	p->hash = h->hash;
	p->hash_l4 = h->flags & FP_HINT_L4;
	p->hash_src = FP_HS_META;
}

static __always_inline int fp_run(struct fp_pkt *p)
{
	struct xdp_md *ctx = p->ctx;
	__u32 slot = fp_cfg.ingress_slot, reason;

	p->len = ctx->data_end - ctx->data;
	p->gen = (__u32)fp_rt.generation;
	p->clock = fp_rt.neigh_clock;
	p->timeout = fp_rt.flow_timeout;
	p->in = bpf_map_lookup_elem(&fp_ifaces, &slot);
	if (!p->in || !(p->in->flags & FP_IF_PRESENT) || ctx->ingress_ifindex != fp_cfg.ingress_ifindex) {
		/* Counted under slot 0, kept for interfaces we do not know. */
		slot = 0;
		reason = FP_R_INGRESS_UNKNOWN;
		p->st = fp_stats_of(&slot);
	} else {
		p->st = fp_stats_of(&slot);
		if (!p->st)
			return XDP_PASS;
		/* Tables nobody keeps current: the kernel decides everything. */
		if (fp_orphaned(&p->st->watch, p->clock, fp_rt.orphan_grace))
			reason = FP_R_ORPHANED;
		/* tc ingress runs on every frame after XDP: the kernel's path only. */
		else if (p->in->flags & FP_IF_TC_INGRESS)
			reason = FP_R_TC_INGRESS;
		else
			reason = fp_fwd(p);
	}
	if (p->st)
		fp_count(p->st, reason, p->len);
	return reason == FP_R_FORWARDED ? XDP_REDIRECT : XDP_PASS;
}

/*
 * The general path as a BPF function of its own, for every packet the
 * express path declines (express.h says why it is apart). It finds the
 * hint again itself, so the entry point keeps nothing across the express
 * path: the entry's frame (the express path's, 64 bytes with clang-19),
 * this one's (432) and that of the IPv6 index's step below it
 * (fp_dir6_step, 16) must fit the 512-byte BPF stack together. A load
 * failing with "combined stack size of 3 calls" means one of them grew
 * (fp_fwd_scratch holds what no longer fits).
 */
static __always_inline int fp_run_plain(struct xdp_md *ctx)
{
	struct fp_pkt p = { .ctx = ctx, .hash_src = FP_HS_SOFTWARE };

	fp_take_meta_hint(&p);
	return fp_run(&p);
}

static __noinline int fp_run_general(struct xdp_md *ctx)
{
	return fp_run_plain(ctx);
}

/* An IPv6 frame: worth a call of the IPv6 express path. */
static __always_inline bool fp_frame_is_ip6(struct xdp_md *ctx)
{
	struct ethhdr *eth = (void *)(long)ctx->data;

	return (void *)(eth + 1) <= (void *)(long)ctx->data_end && eth->h_proto == bpf_htons(FP_ETH_P_IPV6);
}

/*
 * The IPv6 express path (express.h), a function of its own: it finds the
 * hint again itself, so that nothing of the IPv4 one's stays live in the
 * entry point's frame.
 */
static __noinline int fp_run_express6(struct xdp_md *ctx)
{
	struct fp_pkt p = { .ctx = ctx, .hash_src = FP_HS_SOFTWARE };

	fp_take_meta_hint(&p);
	return fp_express6(ctx, &fp_cfg, &fp_rt, p.hash, p.hash_src);
}

/*
 * The express path, else the general one. Stateful and AF_XDP instances
 * attach fp_xdp_fwd_full* instead (the verifier drops the branch here:
 * fp_cfg is read-only).
 */
SEC("xdp.frags")
int fp_xdp_fwd(struct xdp_md *ctx)
{
	struct fp_pkt p = { .ctx = ctx, .hash_src = FP_HS_SOFTWARE };
	__u32 r;

	if (!fp_cfg.stateful && !fp_cfg.afxdp) {
		fp_take_meta_hint(&p);
		r = fp_express(ctx, &fp_cfg, &fp_rt, p.hash, p.hash_src);
		if (r == FP_XP_DECLINED && fp_frame_is_ip6(ctx))
			r = fp_run_express6(ctx);
		if (r != FP_XP_DECLINED)
			return r == FP_R_FORWARDED ? XDP_REDIRECT : XDP_PASS;
	}
	return fp_run_general(ctx);
}

extern int bpf_xdp_metadata_rx_hash(const struct xdp_md *ctx, __u32 *hash,
				    enum xdp_rss_hash_type *rss_type) __ksym __weak;
extern int bpf_xdp_metadata_rx_vlan_tag(const struct xdp_md *ctx, __be16 *vlan_proto,
					__u16 *vlan_tci) __ksym __weak;

/* What the device-bound entry point asks the NIC for, else the metadata hint. */
static __always_inline void fp_take_nic_hints(struct fp_pkt *p)
{
	/* Both answers in one 8-byte slot (only one is read). */
	union {
		struct {
			__be16 proto;
			__u16 tci;
		} vlan;
		struct {
			__u32 hash;
			enum xdp_rss_hash_type type;
		} rss;
	} out = {};

	/* A tag the NIC stripped (rx-vlan offload) leaves the frame looking
	 * untagged; the kernel hands it to the VLAN device: punt it. */
	if (bpf_xdp_metadata_rx_vlan_tag(p->ctx, &out.vlan.proto, &out.vlan.tci) == 0)
		p->vlan_stripped = 1;

	/* Not asked (fp_config.nic_rx_hash), -ENODATA (no hash for this
	 * frame) or -EOPNOTSUPP: fall back to a metadata hint or our own hash. */
	if (fp_cfg.nic_rx_hash && bpf_xdp_metadata_rx_hash(p->ctx, &out.rss.hash, &out.rss.type) == 0 &&
	    !(fp_cfg.flow_key_addrs && (out.rss.type & XDP_RSS_L4))) {
		p->hash = out.rss.hash;
		p->hash_l4 = (out.rss.type & XDP_RSS_L4) != 0;
		p->hash_src = FP_HS_NIC;
	} else {
		fp_take_meta_hint(p);
	}
}

/*
 * Stateful and AF_XDP instances get this entry point instead of
 * fp_xdp_fwd, with the general path inlined: no BPF call and return per
 * packet (with the watchdog's memo stores, the call was the 4-5 % the
 * stateful packet rate lost when the express path came). A stateful
 * instance's express paths (IPv4, then IPv6) are inlined in front of it: as
 * functions of their own their frames, the general path's and
 * fp_nat_rewrite()'s would exceed the 512-byte stack together, inlined the
 * frame stays the general path's. AF_XDP instances never take them.
 */
static __always_inline __u32 fp_express_inline(struct xdp_md *ctx, const struct fp_pkt *p)
{
	__u32 r = fp_express(ctx, &fp_cfg, &fp_rt, p->hash, p->hash_src);

	if (r == FP_XP_DECLINED && fp_frame_is_ip6(ctx))
		r = fp_express6(ctx, &fp_cfg, &fp_rt, p->hash, p->hash_src);
	return r;
}

SEC("xdp.frags")
int fp_xdp_fwd_full(struct xdp_md *ctx)
{
	struct fp_pkt p = { .ctx = ctx, .hash_src = FP_HS_SOFTWARE };
	__u32 r;

	fp_take_meta_hint(&p);
	if (fp_cfg.stateful) {
		r = fp_express_inline(ctx, &p);
		if (r != FP_XP_DECLINED)
			return r == FP_R_FORWARDED ? XDP_REDIRECT : XDP_PASS;
	}
	return fp_run(&p);
}

/*
 * The device-bound entry point, for every mode: the NIC's answers (hash,
 * stripped VLAN tag), then the express paths and the general path, all
 * inlined in one frame. The answers must outlive the express path for the
 * general one, which leaves no room to call the general path as fp_xdp_fwd
 * does (the frames would pass 512 bytes), and two calls (express, general)
 * cost more than one function's spills: on 2026-12-02 this form forwarded
 * 2-4 points of raw more at 1 flow on veth and 3-5 % more without the
 * cache, the same at 1M flows.
 */
SEC("xdp.frags")
int fp_xdp_fwd_hw(struct xdp_md *ctx)
{
	struct fp_pkt p = { .ctx = ctx, .hash_src = FP_HS_SOFTWARE };
	__u32 r;

	fp_take_nic_hints(&p);
	if (!fp_cfg.afxdp && !p.vlan_stripped) {
		r = fp_express_inline(ctx, &p);
		if (r != FP_XP_DECLINED)
			return r == FP_R_FORWARDED ? XDP_REDIRECT : XDP_PASS;
	}
	return fp_run(&p);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
