/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ct_fwd.bpf.c — the stateful benchmark's reference XDP firewall-router:
 * the linux-fastpath paper's design done with today's kfuncs, with no state
 * of its own. Every packet pays for a conntrack lookup.
 *
 * Per packet: parse Ethernet + IPv4 + TCP/UDP; leave TTL <= 1, IP options,
 * fragments and TCP SYN/FIN/RST to the kernel (conntrack must see set-up and
 * teardown); bpf_xdp_ct_lookup() in the current namespace; forward only an
 * entry that is confirmed, not dying, has seen a reply, is not NATed (this
 * forwarder does not rewrite addresses), is TCP ESTABLISHED for TCP, and
 * carries all bits of ct_fwd_mark (set by the nftables ruleset). Then
 * bpf_fib_lookup() and a devmap redirect exactly as fib_fwd.bpf.c does.
 * Anything else is XDP_PASSed untouched. fp_bench_ct_fwd6 does the same for
 * IPv6 (`fastpath bench stateful --family 6`; no extension headers).
 *
 * Per-CPU counters by verdict let the bench prove the figure it prints is
 * this program forwarding, not the kernel behind it. Bench only.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "csum.h"

#define ETH_P_IP     0x0800
#define ETH_P_IPV6   0x86DD
#define AF_INET      2
#define AF_INET6     10
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
/* The ct opts layout this kernel takes (with the zone fields, 6.x). */
#define CT_OPTS_SZ   16
#define IP_MF_OFFSET 0x3FFF

/* Must match CtVerdict in crates/fastpath/src/bench/ct_ref.rs. */
enum ct_fwd_verdict {
	CT_FWD_FORWARDED,
	CT_FWD_NOT_PARSED,    /* not IPv4 TCP/UDP, options, fragment, TTL <= 1 */
	CT_FWD_TCP_FLAGS,     /* SYN, FIN or RST */
	CT_FWD_CT_MISS,       /* no conntrack entry */
	CT_FWD_NOT_ESTABLISHED,
	CT_FWD_UNMARKED,
	CT_FWD_NO_ROUTE,      /* FIB lookup failed or egress not in the devmap */
	CT_FWD__COUNT,
};

extern struct nf_conn *bpf_xdp_ct_lookup(struct xdp_md *xdp_ctx, struct bpf_sock_tuple *bpf_tuple,
					 u32 tuple__sz, struct bpf_ct_opts *opts, u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

/* The ct mark bits an entry must carry, all of them. */
const volatile __u32 ct_fwd_mark = 1;

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} ct_tx SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CT_FWD__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} ct_fwd_stats SEC(".maps");

static __always_inline int verdict(__u32 v, int action)
{
	__u64 *c = bpf_map_lookup_elem(&ct_fwd_stats, &v);

	if (c)
		*c += 1;
	return action;
}

/* The conntrack verdict for the packet's tuple, the entry released again. */
static __always_inline __u32 ct_check(struct xdp_md *ctx, struct bpf_sock_tuple *t, __u32 size, __u8 proto)
{
	struct bpf_ct_opts opts = { .netns_id = -1, .l4proto = proto };
	struct nf_conn *ct;
	unsigned long status;
	__u32 v = CT_FWD_FORWARDED;

	ct = bpf_xdp_ct_lookup(ctx, t, size, &opts, CT_OPTS_SZ);
	if (!ct)
		return CT_FWD_CT_MISS;
	status = ct->status;
	if (!(status & IPS_CONFIRMED) || (status & IPS_DYING) || !(status & IPS_SEEN_REPLY) ||
	    (status & IPS_NAT_MASK))
		v = CT_FWD_NOT_ESTABLISHED;
	else if (proto == IPPROTO_TCP_ && ct->proto.tcp.state != TCP_CONNTRACK_ESTABLISHED)
		v = CT_FWD_NOT_ESTABLISHED;
	else if ((ct->mark & ct_fwd_mark) != ct_fwd_mark)
		v = CT_FWD_UNMARKED;
	bpf_ct_release(ct);
	return v;
}

/*
 * The L4 header at @l4 (IP protocol @proto): TCP without SYN/FIN/RST, or
 * UDP, with the ports in the frame (*@ports). CT_FWD_FORWARDED when it may
 * go on, else the verdict to pass it up with.
 */
static __always_inline __u32 l4_check(void *l4, void *data_end, __u8 proto, __u16 **ports)
{
	if (proto == IPPROTO_TCP_) {
		struct tcphdr *th = l4;

		if ((void *)(th + 1) > data_end)
			return CT_FWD_NOT_PARSED;
		if (th->syn || th->fin || th->rst)
			return CT_FWD_TCP_FLAGS;
	} else if (proto != IPPROTO_UDP_) {
		return CT_FWD_NOT_PARSED;
	}
	*ports = l4;
	if ((void *)(*ports + 2) > data_end)
		return CT_FWD_NOT_PARSED;
	return CT_FWD_FORWARDED;
}

/*
 * The kernel's FIB for the filled-in @fib, then the redirect to its egress
 * with the MACs it gave, TTL (@ip) or hop limit (@ip6) less one. Tests
 * the egress before any edit: a failed redirect must leave the packet as
 * it came.
 */
static __always_inline int fib_send(struct xdp_md *ctx, struct ethhdr *eth, struct bpf_fib_lookup *fib,
				    struct iphdr *ip, struct ipv6hdr *ip6)
{
	__u32 egress;

	fib->ifindex = ctx->ingress_ifindex;
	if (bpf_fib_lookup(ctx, fib, sizeof(*fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return verdict(CT_FWD_NO_ROUTE, XDP_PASS);
	egress = fib->ifindex;
	if (!bpf_map_lookup_elem(&ct_tx, &egress))
		return verdict(CT_FWD_NO_ROUTE, XDP_PASS);

	if (ip)
		fp_ip4_dec_ttl(ip);
	else
		ip6->hop_limit--;
	__builtin_memcpy(eth->h_dest, fib->dmac, 6);
	__builtin_memcpy(eth->h_source, fib->smac, 6);
	return verdict(CT_FWD_FORWARDED, bpf_redirect_map(&ct_tx, egress, 0));
}

SEC("xdp")
int fp_bench_ct_fwd(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct bpf_fib_lookup fib = {};
	struct bpf_sock_tuple t = {};
	struct iphdr *ip;
	__u16 *ports;
	__u32 v;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return verdict(CT_FWD_NOT_PARSED, XDP_PASS);
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl != 5 || ip->ttl <= 1 ||
	    (ip->frag_off & bpf_htons(IP_MF_OFFSET)))
		return verdict(CT_FWD_NOT_PARSED, XDP_PASS);
	v = l4_check(ip + 1, data_end, ip->protocol, &ports);
	if (v != CT_FWD_FORWARDED)
		return verdict(v, XDP_PASS);
	t.ipv4.saddr = ip->saddr;
	t.ipv4.daddr = ip->daddr;
	t.ipv4.sport = ports[0];
	t.ipv4.dport = ports[1];

	v = ct_check(ctx, &t, sizeof(t.ipv4), ip->protocol);
	if (v != CT_FWD_FORWARDED)
		return verdict(v, XDP_PASS);

	fib.family = AF_INET;
	fib.tos = ip->tos;
	fib.l4_protocol = ip->protocol;
	fib.tot_len = bpf_ntohs(ip->tot_len);
	fib.ipv4_src = ip->saddr;
	fib.ipv4_dst = ip->daddr;
	return fib_send(ctx, eth, &fib, ip, NULL);
}

/* The same for IPv6, TCP or UDP right after the header (no extension headers). */
SEC("xdp")
int fp_bench_ct_fwd6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct bpf_fib_lookup fib = {};
	struct bpf_sock_tuple t = {};
	struct ipv6hdr *ip6;
	__u16 *ports;
	__u32 v;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return verdict(CT_FWD_NOT_PARSED, XDP_PASS);
	ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end || ip6->hop_limit <= 1)
		return verdict(CT_FWD_NOT_PARSED, XDP_PASS);
	v = l4_check(ip6 + 1, data_end, ip6->nexthdr, &ports);
	if (v != CT_FWD_FORWARDED)
		return verdict(v, XDP_PASS);
	__builtin_memcpy(t.ipv6.saddr, &ip6->saddr, 16);
	__builtin_memcpy(t.ipv6.daddr, &ip6->daddr, 16);
	t.ipv6.sport = ports[0];
	t.ipv6.dport = ports[1];

	v = ct_check(ctx, &t, sizeof(t.ipv6), ip6->nexthdr);
	if (v != CT_FWD_FORWARDED)
		return verdict(v, XDP_PASS);

	fib.family = AF_INET6;
	fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0FFFFFFF);
	fib.l4_protocol = ip6->nexthdr;
	fib.tot_len = bpf_ntohs(ip6->payload_len);
	__builtin_memcpy(fib.ipv6_src, &ip6->saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, &ip6->daddr, 16);
	return fib_send(ctx, eth, &fib, NULL, ip6);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
