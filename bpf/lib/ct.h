/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ct.h — the conntrack gate of stateful mode (fp_config.stateful).
 *
 * In stateful mode a packet is forwarded only when the kernel's conntrack
 * holds an entry for it that the kernel itself treats as an established
 * flow, and the user's ruleset marked it fast for the packet's direction
 * (fp_runtime.ct_mark, ct_mark_reply). Anything
 * that would change conntrack's state goes to the kernel instead, so
 * conntrack sees every transition: TCP SYN/FIN/RST, the handshake's last ACK
 * (the entry is still SYN_RECV), a UDP flow's first replied packet (the one
 * that makes it ASSURED). Helper-managed and expected flows, sequence
 * adjustment, synproxy, custom timeout policies and offloaded entries punt:
 * conntrack does per-packet work for them that we do not.
 *
 * The kfuncs (net/netfilter/nf_conntrack_bpf.c, 6.18): bpf_xdp_ct_lookup()
 * accepts IPPROTO_TCP and IPPROTO_UDP only (-EPROTO otherwise). ICMP and
 * ICMPv6 echo entries are judged from the daemon's copy of them instead
 * (fp_ct_icmp, read over ctnetlink; fp_ct_icmp_check), every other ICMP
 * (errors are related traffic) and every other protocol punt
 * FP_R_CT_UNSUPPORTED. Lookups use the
 * device's netns (BPF_F_CURRENT_NETNS) and the 12-byte bpf_ct_opts, which
 * 6.18 still accepts and which means the default zone 0; an entry in any
 * other zone is not found (FP_R_CT_NEW), so zones are never fast-pathed.
 *
 * A lookup costs a hash walk plus an atomic get/put on the entry's refcount
 * (shared between CPUs), so its result is cached per flow next to the flow
 * cache (an IPv4 flow's in its own way, an IPv6 flow's in fp_ct_flows)
 * and re-checked only every ct_revalidate_ms or after
 * the daemon bumps ct_generation (conntrack destroy/update events). Each
 * (re)validation refreshes the entry's timeout to what the kernel's own
 * per-packet refresh would set, so that a flow living on the fast path never
 * expires. The kfuncs cannot add to conntrack's packet/byte counters; the
 * fast path keeps its own per flow (fp_ct_hot.bytes, the packets of its way in fp_flows).
 */
#ifndef FP_CT_H
#define FP_CT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"
#include "parse.h"
#include "nat.h"
#include "flow.h"
#include "watchdog.h"

/* Weak: a kernel without conntrack still loads the stateless program. */
extern struct nf_conn *bpf_xdp_ct_lookup(struct xdp_md *xdp_ctx, struct bpf_sock_tuple *bpf_tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts, __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn *nfct) __ksym __weak;
extern int bpf_ct_change_timeout(struct nf_conn *nfct, __u32 timeout) __ksym __weak;

/*
 * The bpf_ct_opts layout before zones were added (netns_id, error,
 * l4proto, dir, reserved[2]): every kernel with the kfuncs accepts it, and
 * it selects the default zone.
 */
#define FP_CT_OPTS_SZ 12
#define FP_BPF_F_CURRENT_NETNS (-1)

#define FP_TCP_FIN 0x01
#define FP_TCP_SYN 0x02
#define FP_TCP_RST 0x04

/* include/uapi/linux/netfilter/nf_conntrack_tcp.h */
#define FP_CT_TCP_FLAG_BE_LIBERAL 0x08

#define FP_NSEC_PER_MSEC 1000000ULL
#define FP_ENOENT 2

/*
 * What the gate decided for one packet, applied after the commit. Scalars
 * only: pointers of different kinds (map value, stack, NULL) carried through
 * the rest of the path would keep the verifier from merging its states.
 */
struct fp_ct_verdict {
	__u64 now;               /* bpf_ktime_get_coarse_ns(), as fp_coarse_ns() reads it */
	__u32 idx;               /* the flow's set in fp_flows / fp_ct_flows */
	__u32 gen;               /* fp_runtime.ct_generation, read before the lookup */
	__u8  cached;            /* the flow cache is on (idx is valid) */
	__u8  fresh;             /* decided by a conntrack lookup just now */
	__u16 _pad;
	__u32 _pad2;
	struct fp_nat nat;       /* the rewrite to apply (flags 0: none) */
};

/* The ICMP types conntrack tracks as one echo entry (request, reply). */
static __always_inline bool fp_ct_icmp_echo(__u8 icmp_proto, __u8 type)
{
	if (icmp_proto == FP_IPPROTO_ICMP)
		return type == 8 || type == 0;
	return type == 128 || type == 129;
}

/*
 * Punts that need no conntrack lookup: protocols the kfuncs refuse (and
 * ICMP other than echo), L4 headers too short to look up or to read the
 * flags from, and TCP packets conntrack must see (SYN, FIN, RST) — on
 * every packet, cache hit or not. @icmp_proto: the family's ICMP.
 * @l4_off is the constant offset of the L4 header in the frame. *@closes:
 * the TCP segment punted for its flags has FIN or RST (else it is a SYN).
 */
static __always_inline __u32 fp_ct_l4_reason(struct xdp_md *ctx, __u8 proto, __u8 icmp_proto, __u32 l4_off,
					     __u32 l4_len, bool *closes)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 *l4 = data + l4_off;

	if (proto == IPPROTO_TCP) {
		if (l4_len < 20 || (void *)(l4 + 20) > data_end)
			return FP_R_CT_UNSUPPORTED;
		if (!(l4[13] & (FP_TCP_FIN | FP_TCP_SYN | FP_TCP_RST)))
			return 0;
		*closes = l4[13] & (FP_TCP_FIN | FP_TCP_RST);
		return FP_R_CT_TCP_FLAGS;
	}
	if (proto == IPPROTO_UDP) {
		if (l4_len < 8 || (void *)(l4 + 8) > data_end)
			return FP_R_CT_UNSUPPORTED;
		return 0;
	}
	if (proto == icmp_proto) {
		/* Code 0 only: the kernel sends no other with an echo. */
		if (l4_len < 8 || (void *)(l4 + 8) > data_end || l4[1] || !fp_ct_icmp_echo(icmp_proto, l4[0]))
			return FP_R_CT_UNSUPPORTED;
		return 0;
	}
	return FP_R_CT_UNSUPPORTED;
}

static __always_inline bool fp_ct_has_ext(const struct nf_conn *ct, int id)
{
	const struct nf_ct_ext *ext = ct->ext;

	return ext && id >= 0 && id < NF_CT_EXT_NUM && ext->offset[id];
}

static __always_inline __u32 fp_ct_secs_to_ms(__u32 s)
{
	/* The kernel caps a timeout at INT_MAX jiffies anyway. */
	return s > 0xFFFFFFFFU / 1000 ? 0xFFFFFFFFU : s * 1000;
}

/*
 * What nf_conntrack_tcp_packet() / nf_conntrack_udp_packet() would refresh
 * an eligible entry to on this packet, in seconds (0 = leave it alone).
 * TCP: the ESTABLISHED timeout (the kernel uses shorter ones while it
 * sees retransmissions, unacknowledged data or a zero window, which the fast
 * path cannot judge; those only make a dead peer's entry go sooner). UDP
 * (assured, as eligibility requires): the stream timeout once the entry is
 * older than its stream_ts (two seconds after creation), the plain one
 * before.
 */
static __always_inline __u32 fp_ct_timeout(const struct nf_conn *ct, __u8 proto, const struct fp_runtime *rt)
{
	long age;

	if (proto == IPPROTO_TCP)
		return rt->ct_timeout_tcp;
	/* time_after(jiffies, stream_ts), as the kernel writes it. */
	age = (long)(ct->proto.udp.stream_ts - bpf_jiffies64());
	return age < 0 ? rt->ct_timeout_udp_stream : rt->ct_timeout_udp;
}

/*
 * Liberal window tracking on demand (see fp_ct_eligible). A marked,
 * established TCP entry that is still strict punts, and the daemon is asked
 * (fp_ct_liberal_req) to make it liberal, but only once the data path has
 * met it strict for FP_CT_LIBERAL_DELAY_NS: a short connection (request,
 * response, close) is over before then, and an update per connection costs
 * the kernel and the daemon more than its few packets could gain. At most
 * one request per entry per ct_revalidate_ms, so that a lost one (full
 * ring, a busy daemon) is asked again. Keyed by the original tuple: both
 * directions, and NAT, name the same entry, as ctnetlink wants it.
 */
#define FP_CT_LIBERAL_DELAY_NS (10 * FP_NSEC_PER_MSEC)

static __always_inline void fp_ct_want_liberal(const struct nf_conn *ct, const struct fp_runtime *rt)
{
	const struct nf_conntrack_tuple *t = &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple;
	struct fp_ct_liberal_seen *seen, first = {};
	__u32 zero = 0;
	/* Off the stack: the forward path is at the 512-byte limit. */
	struct fp_flow_key *k = bpf_map_lookup_elem(&fp_ct_liberal_key, &zero);
	__u64 now = bpf_ktime_get_coarse_ns();

	if (!k)
		return;
	k->family = t->src.l3num == FP_AF_INET6 ? FP_AF_INET6 : FP_AF_INET;
	k->proto = IPPROTO_TCP;
	k->ingress = 0;
	k->sport = t->src.u.all;
	k->dport = t->dst.u.all;
	k->flowlabel = 0;
	/* Conntrack zeroes a tuple before filling it: IPv4 leaves 12 bytes 0, as the key wants. */
	__builtin_memcpy(k->saddr, &t->src.u3, 16);
	__builtin_memcpy(k->daddr, &t->dst.u3, 16);
	seen = bpf_map_lookup_elem(&fp_ct_liberal_seen, k);
	if (!seen) {
		first.first = now;
		bpf_map_update_elem(&fp_ct_liberal_seen, k, &first, BPF_NOEXIST);
		return;
	}
	if (now - seen->first < FP_CT_LIBERAL_DELAY_NS)
		return;
	if (seen->asked && now - seen->asked < rt->ct_revalidate_ms * FP_NSEC_PER_MSEC)
		return;
	if (!bpf_ringbuf_output(&fp_ct_liberal_req, k, sizeof(*k), 0))
		seen->asked = now;
}

/*
 * Whether entry @ct lets this packet take the fast path: FP_R_FORWARDED or
 * the punt reason. Called with the reference held.
 */
static __always_inline __u32
fp_ct_eligible(const struct nf_conn *ct, __u32 dir, __u8 proto, const struct fp_runtime *rt, struct fp_nat *nat)
{
	unsigned long status = ct->status;
	__u32 mask;

	/*
	 * Conntrack does per-packet work for these that we would skip:
	 * helpers and their expected flows, sequence adjustment (NAT
	 * helpers, synproxy: IPS_SEQ_ADJUST; the extension alone means
	 * nothing, ctnetlink adds it to every entry it creates), a timeout
	 * policy of its own, flowtable offload.
	 */
	if (ct->master || (status & (IPS_EXPECTED | IPS_HELPER | IPS_SEQ_ADJUST | IPS_OFFLOAD | IPS_HW_OFFLOAD)))
		return FP_R_CT_UNSUPPORTED;
	if (fp_ct_has_ext(ct, NF_CT_EXT_HELPER) || fp_ct_has_ext(ct, NF_CT_EXT_TIMEOUT))
		return FP_R_CT_UNSUPPORTED;

	if (!(status & IPS_CONFIRMED) || (status & IPS_DYING) || !(status & IPS_SEEN_REPLY))
		return FP_R_CT_NOT_ESTABLISHED;
	if (proto == IPPROTO_TCP && ct->proto.tcp.state != TCP_CONNTRACK_ESTABLISHED)
		return FP_R_CT_NOT_ESTABLISHED;
	/* Replied but not yet assured: the kernel assures it on its next packet. */
	if (proto == IPPROTO_UDP && !(status & IPS_ASSURED))
		return FP_R_CT_NOT_ESTABLISHED;

	/* The ruleset vouched for this packet's direction (fp_runtime.ct_mark_reply says why each has its own). */
	mask = dir == IP_CT_DIR_ORIGINAL ? rt->ct_mark : rt->ct_mark_reply;
	if ((ct->mark & mask) != mask)
		return FP_R_CT_UNMARKED;
	/*
	 * (After the mark: the daemon makes only marked entries liberal.)
	 * Conntrack never sees the segments we carry: unless its window
	 * tracking is liberal for this entry (both directions; the daemon sets
	 * it, as the kernel's flowtable does, when asked here) or the whole
	 * netns, the next segment it does see (a FIN, a revalidation punt)
	 * would fall outside the window it remembers and be classed invalid.
	 */
	if (proto == IPPROTO_TCP && !rt->ct_tcp_liberal &&
	    !(ct->proto.tcp.seen[0].flags & ct->proto.tcp.seen[1].flags & FP_CT_TCP_FLAG_BE_LIBERAL)) {
		fp_ct_want_liberal(ct, rt);
		return FP_R_CT_NOT_ESTABLISHED;
	}

	/* NAT: what the packet becomes, from the other direction's tuple. */
	return fp_nat_from_ct(ct, dir, nat) ?: FP_R_FORWARDED;
}

/*
 * An ICMP echo packet with key @k (fp_ct_l4_reason() let it by): its
 * conntrack entry as the daemon last read it, trusted for ct_revalidate_ms
 * after that read. On FP_R_FORWARDED *@nat is filled and *@asof (now, on
 * entry) becomes the time of the read, which is what a verdict cached from
 * it is as old as. No copy, or one too old: punted as FP_R_CT_NEW (the
 * data path knows of no entry), and the daemon asked for one. Every look
 * at a current copy stamps it used: the daemon keeps reading the copies
 * packets look at, and refreshes the entry's timeout for them. With
 * ct_revalidate_ms 0 nothing is ever current: every echo is the kernel's.
 */
static __always_inline __u32
fp_ct_icmp_check(const struct fp_flow_key *k, const struct fp_runtime *rt, struct fp_nat *nat, __u64 *asof)
{
	__u32 zero = 0;
	struct fp_flow_key *q = bpf_map_lookup_elem(&fp_ct_liberal_key, &zero);
	struct fp_ct_icmp *e;
	__u64 now = *asof;
	__u32 r;

	if (!q)
		return FP_R_CT_UNSUPPORTED;
	*q = *k;
	q->ingress = 0;
	q->flowlabel = 0;
	e = bpf_map_lookup_elem(&fp_ct_icmp, q);
	/* Signed: the daemon's clock may read a hair ahead of ours. */
	if (!e || (__s64)(now - e->checked) >= (__s64)((__u64)rt->ct_revalidate_ms * FP_NSEC_PER_MSEC)) {
		if (rt->ct_revalidate_ms)
			bpf_ringbuf_output(&fp_ct_icmp_req, q, sizeof(*q), 0);
		return FP_R_CT_NEW;
	}
	/* Any verdict: the daemon reads again only copies packets look at. */
	e->used = now;
	r = e->reason;
	if (r != FP_R_FORWARDED)
		return r < FP_R__COUNT ? r : FP_R_CT_UNSUPPORTED;
	*nat = e->nat;
	*asof = e->checked;
	return FP_R_FORWARDED;
}

/*
 * One conntrack lookup for the packet with key @k: FP_R_FORWARDED (with
 * *@nat filled and the entry's timeout refreshed) or the punt reason.
 * *@asof: now on entry; when the answer was read from conntrack on return.
 * (Tried as a global function, verified once instead of per call site: the
 * stateless program then cost the verifier 20% more, so it stays inline.)
 */
static __always_inline __u32
fp_ct_check(struct xdp_md *ctx, const struct fp_flow_key *k, const struct fp_runtime *rt, struct fp_nat *nat,
	    __u64 *asof)
{
	struct bpf_ct_opts opts = { .netns_id = FP_BPF_F_CURRENT_NETNS, .l4proto = k->proto };
	struct bpf_sock_tuple t = {};
	struct nf_conn *ct;
	__u32 r, tuple_sz, timeout;

	if (k->proto == FP_IPPROTO_ICMP || k->proto == FP_IPPROTO_ICMPV6)
		return fp_ct_icmp_check(k, rt, nat, asof);
	if (!bpf_ksym_exists(bpf_xdp_ct_lookup) || !bpf_ksym_exists(bpf_ct_release) ||
	    !bpf_ksym_exists(bpf_ct_change_timeout))
		return FP_R_CT_UNSUPPORTED;
	if (k->family == FP_AF_INET) {
		t.ipv4.saddr = *(const __be32 *)k->saddr;
		t.ipv4.daddr = *(const __be32 *)k->daddr;
		t.ipv4.sport = k->sport;
		t.ipv4.dport = k->dport;
		tuple_sz = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, k->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, k->daddr, 16);
		t.ipv6.sport = k->sport;
		t.ipv6.dport = k->dport;
		tuple_sz = sizeof(t.ipv6);
	}
	ct = bpf_xdp_ct_lookup(ctx, &t, tuple_sz, &opts, FP_CT_OPTS_SZ);
	if (!ct)
		return opts.error == -FP_ENOENT ? FP_R_CT_NEW : FP_R_CT_UNSUPPORTED;
	r = fp_ct_eligible(ct, opts.dir, k->proto, rt, nat);
	if (r == FP_R_FORWARDED) {
		/* -EPERM for IPS_FIXED_TIMEOUT, which the kernel leaves alone too. */
		timeout = fp_ct_timeout(ct, k->proto, rt);
		if (timeout)
			bpf_ct_change_timeout(ct, fp_ct_secs_to_ms(timeout));
	}
	bpf_ct_release(ct);
	return r;
}

/* The coarse clock in the ticks fp_ct_hot.state counts (30 bits). */
static __always_inline __u32 fp_ct_tick(__u64 ns)
{
	return (ns >> FP_CT_TICK_SHIFT) & FP_CT_TICK_MASK;
}

/* When @h was last validated (0: not since it was dropped). */
static __always_inline __u32 fp_ct_validated(const struct fp_ct_hot *h)
{
	return h->state >> FP_CTH_FLAG_BITS;
}

/* Drops @h's validation, keeping or setting @flags. */
static __always_inline void fp_ct_invalidate(struct fp_ct_hot *h, __u32 flags)
{
	h->state = flags;
}

/* Way @way's fp_ct_flows line (its NAT; an IPv6 flow's whole verdict), looked up unless @cw has it. */
static __always_inline struct fp_ct_way *fp_ct_line(struct fp_ct_way *cw, __u32 idx, int way)
{
	struct fp_ct_set *c;

	if (cw)
		return cw;
	c = bpf_map_lookup_elem(&fp_ct_flows, &idx);
	return c ? &c->way[way & (FP_FLOW_WAYS - 1)] : NULL;
}

/*
 * The cached verdict of way @way of set @idx: in the IPv4 way itself
 * (@v4, a constant at every call), else in fp_ct_flows. *@cw: the way's
 * fp_ct_flows line when it was looked up for the verdict (IPv6), else NULL.
 * Array lookups, inlined by the verifier: no pointer of either map has to
 * travel through the rest of the packet's path.
 */
static __always_inline struct fp_ct_hot *fp_ct_hot_of(__u32 idx, int way, bool v4, struct fp_ct_way **cw)
{
	struct fp_flow_set *s;

	*cw = NULL;
	if (way < 0)
		return NULL;
	if (!v4) {
		*cw = fp_ct_line(NULL, idx, way);
		return *cw ? &(*cw)->hot : NULL;
	}
	s = bpf_map_lookup_elem(&fp_flows, &idx);
	return s ? &fp_flow_way4(s, way)->ct : NULL;
}

/*
 * A fresh verdict that NATs unlike the one the flow's cached route was
 * computed with (fp_ct_done() keeps them together): a new conntrack entry
 * for the same tuple. The kernel takes this packet; the way goes stale and
 * keeps the new NAT, so the next packet is routed for it.
 */
static __always_inline __u32 fp_ct_nat_moved(struct fp_ct_hot *h, struct fp_ct_way *cw, const struct fp_nat *nat,
					     __u32 idx, int way)
{
	struct fp_flow_set *s = bpf_map_lookup_elem(&fp_flows, &idx);

	if (cw)
		cw->nat = *nat;
	fp_ct_invalidate(h, nat->flags && cw ? FP_CTH_NAT : 0);
	if (s)
		fp_flow_invalidate(s, way);
	return FP_R_CT_NAT;
}

/* Whether the NAT cached with @h (in @cw when FP_CTH_NAT) is @nat. */
static __always_inline bool fp_ct_nat_kept(const struct fp_ct_hot *h, const struct fp_ct_way *cw,
					   const struct fp_nat *nat)
{
	if (!(h->state & FP_CTH_NAT))
		return !nat->flags;
	return nat->flags && cw && fp_nat_same(&cw->nat, nat);
}

/*
 * The gate for a packet whose flow key is @k: FP_R_FORWARDED or the punt
 * reason. @cached: the flow cache is on and its set for this flow is @idx;
 * @way: the way holding this key in that set (a hit, or a stale/idle copy,
 * whose verdict is as good), or -1. A cached verdict answers without a
 * lookup while it is current; a failed lookup drops it. @v4: an IPv4 key
 * (a constant at every call): its verdict is in its way's own line.
 */
static __always_inline __u32
fp_ct_gate(struct xdp_md *ctx, const struct fp_runtime *rt, const struct fp_flow_key *k, bool cached, __u32 idx,
	   int way, struct fp_watch *clock, struct fp_ct_verdict *v, bool v4)
{
	struct fp_ct_way *cw = NULL;
	struct fp_ct_hot *h = NULL;
	__u32 r, limit, t;

	/* Without a set the caller's idx is undefined: not passed on (clang
	 * may hand any register for it, once a pointer the verifier refused). */
	v->idx = cached ? idx : 0;
	v->cached = cached;
	v->gen = rt->ct_generation;
	v->now = fp_coarse_ns(clock);
	v->fresh = 0;
	if (cached)
		h = fp_ct_hot_of(idx, way, v4, &cw);
	if (h) {
		if ((h->state & FP_CTH_CLOSING) && h->ct_generation == v->gen)
			return FP_R_CT_NOT_ESTABLISHED;
		/* Strictly younger: the coarse clock ticks every few ms, and 0 must mean "always look up". */
		limit = ((__u64)rt->ct_revalidate_ms * FP_NSEC_PER_MSEC) >> FP_CT_TICK_SHIFT;
		t = fp_ct_validated(h);
		if (t && h->ct_generation == v->gen && ((fp_ct_tick(v->now) - t) & FP_CT_TICK_MASK) < limit) {
			/* Most flows have no NAT: read its line only when needed. */
			v->nat.flags = 0;
			if (!(h->state & FP_CTH_NAT))
				return FP_R_FORWARDED;
			cw = fp_ct_line(cw, idx, way);
			if (cw) {
				v->nat = cw->nat;
				return FP_R_FORWARDED;
			}
		}
	}
	r = fp_ct_check(ctx, k, rt, &v->nat, &v->now);
	if (r != FP_R_FORWARDED) {
		if (h)
			fp_ct_invalidate(h, h->state & FP_CTH_NAT);
		return r;
	}
	v->fresh = 1;
	if (h && ((h->state & FP_CTH_NAT) || v->nat.flags)) {
		cw = fp_ct_line(cw, idx, way);
		if (!fp_ct_nat_kept(h, cw, &v->nat))
			return fp_ct_nat_moved(h, cw, &v->nat, idx, way);
	}
	return FP_R_FORWARDED;
}

/*
 * A TCP FIN or RST (@closes) of the flow in way @way of set @idx goes to the
 * kernel: its cached verdict must not carry the segments behind it before
 * conntrack has processed it (XDP_PASS hands it to the stack only after the
 * rest of the receive batch went through here, and an ACK may follow a FIN).
 * Holds until the daemon's next generation bump (whatever revoked; the
 * example ruleset lets a closing entry report nothing more) or a SYN on
 * the same ports: a closing entry does not become ESTABLISHED again.
 *
 * A SYN (or SYN-ACK) only drops the cached verdict, and a hold a FIN left:
 * its sender sends nothing behind it but retransmissions and RSTs (punted
 * for their flags) before the peer answers, and the answer needs the kernel
 * to have forwarded, so conntrack to have processed, the SYN; the next
 * lookup sees that. A hold there would keep a connection that reuses a
 * closed one's ports (a client's next connection, seconds later) off the
 * fast path until the next generation bump.
 */
static __always_inline void fp_ct_closing(const struct fp_runtime *rt, __u32 idx, int way, bool v4, bool closes)
{
	struct fp_ct_way *cw;
	struct fp_ct_hot *h = fp_ct_hot_of(idx, way, v4, &cw);

	if (!h)
		return;
	fp_ct_invalidate(h, (h->state & FP_CTH_NAT) | (closes ? FP_CTH_CLOSING : 0));
	h->ct_generation = rt->ct_generation;
}

/*
 * After a forward: keep a fresh verdict in way @way of the flow's set and
 * count the packet's @bytes. @filled: the flow cache (re)filled that way for
 * this packet, so its counters start over.
 */
static __always_inline void fp_ct_done(struct fp_ct_verdict *v, int way, bool filled, __u32 bytes, bool v4)
{
	struct fp_ct_way *cw;
	struct fp_ct_hot *h;
	__u32 t;

	if (!v->cached)
		return;
	h = fp_ct_hot_of(v->idx, way, v4, &cw);
	if (!h)
		return;
	if (filled)
		h->bytes = 0;
	if (v->fresh) {
		t = fp_ct_tick(v->now);
		h->ct_generation = v->gen;
		h->state = (t ?: 1) << FP_CTH_FLAG_BITS;
		if (v->nat.flags) {
			cw = fp_ct_line(cw, v->idx, way);
			if (cw) {
				cw->nat = v->nat;
				h->state |= FP_CTH_NAT;
			} else {
				fp_ct_invalidate(h, 0);
			}
		}
	}
	h->bytes += bytes;
}

#endif /* FP_CT_H */
