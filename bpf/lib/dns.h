/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * dns.h — DNS query parsing and in-place answers for the XDP DNS responders
 * (bpf/bench/dns_*.bpf.c). crates/fastpath/src/bench/dns_wire.rs applies the
 * same rules in the socket server, so both give the same answers.
 *
 * What is answered, and how:
 *  - Not UDP to port 53, multicast/broadcast, IP options, IPv6 extension
 *    headers, fragments, inconsistent IP/UDP lengths: XDP_PASS, the kernel's
 *    business (it drops the broken ones itself).
 *  - Dropped without an answer: a DNS message shorter than its 12-byte
 *    header (there is no ID to answer to), QR already set (answering
 *    responses invites loops and reflection), messages over 512 bytes and
 *    source port 0.
 *  - Header-only answer (QDCOUNT 0), same ID: NOTIMP for an opcode other
 *    than QUERY; FORMERR for QDCOUNT != 1, any answer or authority record,
 *    more than one additional record, a bad question name (label > 63,
 *    compression pointer or extended label type, name > 255 bytes, running
 *    past the message), a question cut short, and any bytes after the
 *    question other than exactly one EDNS OPT record.
 *  - Otherwise the question is echoed with the answer. An OPT record in the
 *    query is dropped from the answer: the responders do not speak EDNS,
 *    which RFC 6891 lets a responder do by answering without OPT.
 *
 * The name is walked label by label in a bounded loop, then (for the map
 * responder) copied lowercased into the key in a second one: no nested
 * loops, and few enough verifier states that both programs load.
 *
 * A query whose answer does not fit the buffer's tailroom is passed up
 * unmodified (FP_DNS_C_PUNT): punt, never guess.
 *
 * Answers go back out of the interface they came in on (XDP_TX): MACs, IP
 * addresses and UDP ports swapped, IP TTL / hop limit reset to DNS_TTL, IPv4
 * header checksum and the UDP checksum recomputed in full (mandatory for
 * IPv6; for IPv4 it is cheap at these sizes and lets the client verify).
 */
#ifndef FP_DNS_H
#define FP_DNS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "fastpath.h"
#include "parse.h"

#define DNS_PORT      53
#define DNS_HDR_LEN   12
#define DNS_MAX_QUERY 512     /* classic UDP message limit */
#define DNS_MAX_NAME  255     /* wire bytes, root label included */
#define DNS_TTL       64
#define DNS_UDP_HLEN  8
/* The longest answer datagram: header, question, answer records. */
#define DNS_MAX_UDP   (DNS_UDP_HLEN + DNS_HDR_LEN + DNS_MAX_NAME + 4 + FP_DNS_ANS_MAX)

#define DNS_F_QR     0x8000
#define DNS_F_OPCODE 0x7800
#define DNS_F_RD     0x0100
#define DNS_F_RA     0x0080

#define DNS_RCODE_NOERROR  0
#define DNS_RCODE_FORMERR  1
#define DNS_RCODE_NXDOMAIN 3
#define DNS_RCODE_NOTIMP   4
#define DNS_RCODE_REFUSED  5

#define DNS_TYPE_OPT 41
#define DNS_CLASS_IN 1

#define DNS_IPPROTO_UDP 17

enum dns_verdict {
	DNS_V_PASS,     /* not ours: XDP_PASS */
	DNS_V_DROP,     /* no answer */
	DNS_V_HDR,      /* header-only answer with dns_query.rcode */
	DNS_V_QUESTION, /* well-formed question (rcode REFUSED if not class IN) */
};

struct dns_hdr {
	__be16 id;
	__be16 flags;
	__be16 qdcount;
	__be16 ancount;
	__be16 nscount;
	__be16 arcount;
};

struct dns_query {
	__u32 dns;      /* frame offset of the DNS header */
	__u32 qend;     /* frame offset just past QTYPE and QCLASS */
	__u32 name_len; /* wire bytes of the question name, root label included */
	__u16 flags;    /* query flags, host order */
	__u16 qtype;    /* host order */
	__u16 rcode;
	bool v6;
};

/* Per-CPU outcome counters, indexed by FP_DNS_C_*. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FP_DNS_C__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} dns_stats SEC(".maps");

static __always_inline void dns_count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&dns_stats, &what);

	if (c)
		(*c)++;
}

/*
 * Walks the question name at frame offset @off (the message ends at @end)
 * label by label. Returns the name's wire length, or 0 if it is malformed.
 * A jump per label keeps the verifier's work linear: at most 128 labels fit
 * in 255 bytes.
 */
static __always_inline __u32 dns_walk_name(void *data, void *data_end, __u32 off, __u32 end)
{
	__u32 i, pos = 0;

	for (i = 0; i < (DNS_MAX_NAME + 1) / 2; i++) {
		__u8 *p;
		__u8 c;

		if (pos >= DNS_MAX_NAME || off + pos >= end)
			return 0;
		p = data + off + pos;
		if ((void *)(p + 1) > data_end)
			return 0;
		c = *p;
		if (c == 0)
			return pos + 1;
		/* > 63 covers compression pointers (0xc0) and the obsolete
		 * extended label types (0x40, 0x80) too. */
		if (c > 63)
			return 0;
		pos += c + 1;
	}
	return 0;
}

/*
 * Copies the first @len bytes of the name at frame offset @off into @key,
 * lowercased. Length bytes are at most 63, below 'A', so lowercasing every
 * byte only ever changes letters inside labels. Global (verified once on its
 * own), like dns_udp_sum(): inline, clang-14's code for this loop multiplied
 * the verifier's paths past its limit.
 */
__attribute__((noinline)) int dns_name_key(struct xdp_md *ctx, __u32 off, __u32 len, struct fp_dns_key *key)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 i;

	if (!key || off > FP_ETH_HLEN + FP_IP6_HLEN + DNS_UDP_HLEN + DNS_HDR_LEN)
		return 0;
	for (i = 0; i < FP_DNS_KEY_NAME; i++) {
		__u8 *p = data + off + i;
		__u8 c;

		if (i >= len || (void *)(p + 1) > data_end)
			break;
		c = *p;
		if (c >= 'A' && c <= 'Z')
			c += 'a' - 'A';
		key->name[i] = c;
	}
	return 0;
}

/* Classifies the frame; on DNS_V_QUESTION @q (and @key's name) describe it. */
static __always_inline int dns_parse(struct xdp_md *ctx, struct dns_query *q, struct fp_dns_key *key)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 frame = data_end - data, l4, ip_payload, udp_len, end, rest;
	struct ethhdr *eth = data;
	struct dns_hdr *h;
	struct udphdr *udp;
	__u8 *tail;

	if ((void *)(eth + 1) > data_end || fp_mac_is_group(eth->h_dest))
		return DNS_V_PASS;
	if (eth->h_proto == bpf_htons(FP_ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		__u32 d;

		if ((void *)(ip + 1) > data_end)
			return DNS_V_PASS;
		if (ip->version != 4 || ip->ihl != 5 || ip->protocol != DNS_IPPROTO_UDP ||
		    (ip->frag_off & bpf_htons(FP_IP4_FRAG_MASK)))
			return DNS_V_PASS;
		d = bpf_ntohl(ip->daddr);
		if ((d & 0xF0000000) == 0xE0000000 || d == 0xFFFFFFFF)
			return DNS_V_PASS;
		ip_payload = bpf_ntohs(ip->tot_len);
		if (ip_payload < FP_IP4_HLEN || FP_ETH_HLEN + ip_payload > frame)
			return DNS_V_PASS;
		ip_payload -= FP_IP4_HLEN;
		l4 = FP_ETH_HLEN + FP_IP4_HLEN;
		q->v6 = false;
	} else if (eth->h_proto == bpf_htons(FP_ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return DNS_V_PASS;
		if (ip6->version != 6 || ip6->nexthdr != DNS_IPPROTO_UDP || ip6->daddr.in6_u.u6_addr8[0] == 0xff)
			return DNS_V_PASS;
		ip_payload = bpf_ntohs(ip6->payload_len);
		if (FP_ETH_HLEN + FP_IP6_HLEN + ip_payload > frame)
			return DNS_V_PASS;
		l4 = FP_ETH_HLEN + FP_IP6_HLEN;
		q->v6 = true;
	} else {
		return DNS_V_PASS;
	}

	udp = data + l4;
	if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(DNS_PORT))
		return DNS_V_PASS;
	udp_len = bpf_ntohs(udp->len);
	if (udp_len < DNS_UDP_HLEN || udp_len > ip_payload)
		return DNS_V_PASS;
	if (udp->source == 0)
		return DNS_V_DROP;
	q->dns = l4 + DNS_UDP_HLEN;
	end = l4 + udp_len;
	if (udp_len - DNS_UDP_HLEN < DNS_HDR_LEN || udp_len - DNS_UDP_HLEN > DNS_MAX_QUERY)
		return DNS_V_DROP;
	h = data + q->dns;
	if ((void *)(h + 1) > data_end)
		return DNS_V_DROP;
	q->flags = bpf_ntohs(h->flags);
	if (q->flags & DNS_F_QR)
		return DNS_V_DROP;
	q->rcode = DNS_RCODE_FORMERR;
	if (q->flags & DNS_F_OPCODE) {
		q->rcode = DNS_RCODE_NOTIMP;
		return DNS_V_HDR;
	}
	if (h->qdcount != bpf_htons(1) || h->ancount || h->nscount || bpf_ntohs(h->arcount) > 1)
		return DNS_V_HDR;

	q->name_len = dns_walk_name(data, data_end, q->dns + DNS_HDR_LEN, end);
	if (!q->name_len)
		return DNS_V_HDR;
	if (key && q->name_len <= FP_DNS_KEY_NAME) {
		dns_name_key(ctx, q->dns + DNS_HDR_LEN, q->name_len, key);
		/* Fresh pointers: none are carried across the call. */
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
	}
	tail = data + q->dns + DNS_HDR_LEN + q->name_len;
	if ((void *)(tail + 4) > data_end)
		return DNS_V_HDR;
	q->qend = q->dns + DNS_HDR_LEN + q->name_len + 4;
	if (q->qend > end)
		return DNS_V_HDR;
	q->qtype = (__u16)tail[0] << 8 | tail[1];
	rest = end - q->qend;
	if (h->arcount == 0) {
		if (rest)
			return DNS_V_HDR;
	} else {
		/* One OPT record: root name, TYPE 41, CLASS, TTL, RDLENGTH, RDATA. */
		__u8 *opt = data + q->qend;

		if (rest < 11 || (void *)(opt + 11) > data_end)
			return DNS_V_HDR;
		if (opt[0] != 0 || opt[1] != 0 || opt[2] != DNS_TYPE_OPT ||
		    11 + ((__u32)opt[9] << 8 | opt[10]) != rest)
			return DNS_V_HDR;
	}
	q->rcode = (tail[2] == 0 && tail[3] == DNS_CLASS_IN) ? DNS_RCODE_NOERROR : DNS_RCODE_REFUSED;
	return DNS_V_QUESTION;
}

static __always_inline __u16 dns_fold(__u64 s)
{
	s = (s & 0xFFFFFFFF) + (s >> 32);
	s = (s & 0xFFFF) + (s >> 16);
	s = (s & 0xFFFF) + (s >> 16);
	s = (s & 0xFFFF) + (s >> 16);
	return s;
}

/* Ones' complement sum of @len bytes at @p, in memory order. */
static __always_inline __u64 dns_sum(void *p, void *data_end, __u32 len)
{
	__u64 s = 0;
	__u32 i;

	if (len > DNS_MAX_UDP)
		return 0;
	for (i = 0; i < (DNS_MAX_UDP + 1) / 2; i++) {
		__u8 *b = p + 2 * i;

		if (2 * i >= len || (void *)(b + 1) > data_end)
			break;
		if (2 * i + 1 == len) {
			/* The odd byte is the high half of a zero-padded word. */
			s += b[0];
			break;
		}
		if ((void *)(b + 2) > data_end)
			break;
		s += *(__u16 *)b;
	}
	return s;
}

/*
 * The ones' complement sum (folded to 16 bits, memory order) of the @len
 * bytes of the UDP datagram at frame offset @off. A global function on
 * purpose, the one exception to this directory's inline rule: the verifier
 * checks it once on its own instead of once per path into it, and each
 * possible loop exit multiplied those paths past the 1M-instruction limit
 * with clang-14's code.
 */
__attribute__((noinline)) __u32 dns_udp_sum(struct xdp_md *ctx, __u32 off, __u32 len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (off > FP_ETH_HLEN + FP_IP6_HLEN)
		return 0;
	return dns_fold(dns_sum(data + off, data_end, len));
}

/* Writes the UDP checksum at frame offset @l4 from the sum of everything else. */
static __always_inline int dns_set_udp_check(struct xdp_md *ctx, __u32 l4, __u64 pseudo, __u32 udp_len)
{
	struct udphdr *udp;
	void *data_end;
	__u64 s;

	s = pseudo + dns_udp_sum(ctx, l4, udp_len);
	/* Fresh pointers: none are carried across the call. */
	udp = (void *)(long)ctx->data + l4;
	data_end = (void *)(long)ctx->data_end;
	if ((void *)(udp + 1) > data_end)
		return XDP_DROP;
	udp->check = ~dns_fold(s) ?: 0xFFFF;
	return XDP_TX;
}

/*
 * Turns the query in place into its answer and returns the XDP verdict
 * (XDP_PASS, frame untouched, when the answer does not fit):
 * header only for DNS_V_HDR, otherwise the question followed by @ans's
 * records (or none). The frame is cut or grown to the answer's length, which
 * also drops an OPT record and any Ethernet padding.
 */
/* UDP ports swapped and the DNS header turned into the answer's: the same
 * for both families, once the caller has bounds-checked @h. */
static __always_inline void dns_reply_headers(struct udphdr *udp, struct dns_hdr *h, const struct dns_query *q,
					      bool question, __u16 rcode, __u16 ancount, __u32 udp_len)
{
	__be16 port = udp->source;

	udp->source = udp->dest;
	udp->dest = port;
	udp->len = bpf_htons(udp_len);
	udp->check = 0;
	h->flags = bpf_htons(DNS_F_QR | (q->flags & (DNS_F_OPCODE | DNS_F_RD)) | DNS_F_RA | rcode);
	h->qdcount = bpf_htons(question ? 1 : 0);
	h->ancount = bpf_htons(ancount);
	h->nscount = 0;
	h->arcount = 0;
}

static __always_inline int dns_answer(struct xdp_md *ctx, const struct dns_query *q, bool question,
				      __u16 rcode, const struct fp_dns_answer *ans)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 ans_len = 0, dns_len, udp_len, ancount = 0;
	__u8 mac[6];
	struct ethhdr *eth;
	struct dns_hdr *h;
	struct udphdr *udp;
	__u64 cur;
	int delta;

	if (question && ans) {
		ans_len = ans->len;
		ancount = ans->ancount;
		if (ans_len > FP_DNS_ANS_MAX)
			return XDP_DROP;
	}
	dns_len = question ? q->qend - q->dns + ans_len : DNS_HDR_LEN;
	if (dns_len > DNS_MAX_UDP)
		return XDP_DROP;
	cur = data_end - data;
	/* Keeps clang-14 from folding the subtraction into 32-bit pointer
	 * arithmetic, which the verifier refuses. */
	asm volatile("" : "+r"(cur));
	delta = (int)(q->dns + dns_len) - (int)cur;
	/* Nothing is modified yet: without room for the answer (an skb-backed
	 * buffer has little tailroom, a NIC's page has plenty) the query goes
	 * to the kernel untouched, where a socket server may answer it. */
	if (delta && bpf_xdp_adjust_tail(ctx, delta))
		return XDP_PASS;
	if (ans_len && bpf_xdp_store_bytes(ctx, q->qend, (void *)ans->rr, ans_len))
		return XDP_DROP;
	/* Keeps clang from folding the reloads below into an offset
	 * register on ctx, which the verifier refuses. */
	asm volatile("" : "+r"(ctx));
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	udp_len = DNS_UDP_HLEN + dns_len;

	eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(mac, eth->h_dest, 6);
	__builtin_memcpy(eth->h_dest, eth->h_source, 6);
	__builtin_memcpy(eth->h_source, mac, 6);

	if (q->v6) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		struct in6_addr a;
		__u64 s = 0;
		__u16 *w;
		int i;

		udp = (void *)(ip6 + 1);
		h = (void *)(udp + 1);
		if ((void *)(h + 1) > data_end)
			return XDP_DROP;
		a = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = a;
		ip6->payload_len = bpf_htons(udp_len);
		ip6->hop_limit = DNS_TTL;
		w = (__u16 *)&ip6->saddr;
#pragma unroll
		for (i = 0; i < 16; i++)
			s += w[i];
		s += bpf_htons(DNS_IPPROTO_UDP) + bpf_htons(udp_len);
		dns_reply_headers(udp, h, q, question, rcode, ancount, udp_len);
		return dns_set_udp_check(ctx, FP_ETH_HLEN + FP_IP6_HLEN, s, udp_len);
	} else {
		struct iphdr *ip = (void *)(eth + 1);
		__be32 a;
		__u64 s = 0;
		__u16 *w;
		int i;

		udp = (void *)(ip + 1);
		h = (void *)(udp + 1);
		if ((void *)(h + 1) > data_end)
			return XDP_DROP;
		a = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = a;
		ip->tot_len = bpf_htons(FP_IP4_HLEN + udp_len);
		ip->ttl = DNS_TTL;
		ip->check = 0;
		w = (__u16 *)ip;
#pragma unroll
		for (i = 0; i < FP_IP4_HLEN / 2; i++)
			s += w[i];
		ip->check = ~dns_fold(s);
		s = (__u64)w[6] + w[7] + w[8] + w[9] + bpf_htons(DNS_IPPROTO_UDP) + bpf_htons(udp_len);
		dns_reply_headers(udp, h, q, question, rcode, ancount, udp_len);
		return dns_set_udp_check(ctx, FP_ETH_HLEN + FP_IP4_HLEN, s, udp_len);
	}
}

/* The counter for an answer's outcome. */
static __always_inline __u32 dns_outcome(__u16 rcode, __u16 ancount)
{
	switch (rcode) {
	case DNS_RCODE_NOERROR:
		return ancount ? FP_DNS_C_ANSWER : FP_DNS_C_NODATA;
	case DNS_RCODE_NXDOMAIN:
		return FP_DNS_C_NXDOMAIN;
	case DNS_RCODE_NOTIMP:
		return FP_DNS_C_NOTIMP;
	case DNS_RCODE_REFUSED:
		return FP_DNS_C_REFUSED;
	default:
		return FP_DNS_C_FORMERR;
	}
}

/* Counts an answer attempt by what came of it. */
static __always_inline int dns_counted(int act, __u16 rcode, __u16 ancount)
{
	dns_count(act == XDP_TX ? dns_outcome(rcode, ancount) : act == XDP_PASS ? FP_DNS_C_PUNT : FP_DNS_C_DROP);
	return act;
}

#endif /* FP_DNS_H */
