/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * gen.bpf.c — the benchmark's traffic generator.
 *
 * A loop of frames, not a source: attached to g1, the generator's end of
 * the veth pair that comes back from the sink (s1 – g1), it turns every
 * frame the sink sends back into the next one of the flow sequence and
 * redirects it out of g0 to the router (gen_out_ifindex). The sink counts
 * each frame and redirects it out of s1 (sink.bpf.c); user space puts a
 * fixed number of frames into the loop once (traffic.rs) and stops it by
 * loop_stop (loop.h), which makes this program drop what comes back. So every frame
 * reaches the router as an xdp_frame from a peer's XDP, as one from a NIC
 * driver would, and nothing is allocated per packet in the loop.
 * (Until 2026-12-06 it was run by BPF_PROG_RUN in live-frames mode; this
 * project's kernel, 6.18.44, now answers that with EPERM.)
 *
 * A frame comes back with the router's edits in it (MACs, TTL, and with
 * NAT the addresses), so the program writes the whole Ethernet/IPv4/UDP
 * header from the template on every frame instead of patching only the
 * port: the payload is never touched by anyone, the header always is.
 *
 * Flow i has UDP source port gen_sport_base + i % 32768 and destination port
 * (template's) + i / 32768, so up to 32768 flows differ only in the source
 * port and a million still fit in valid ports. The IPv4 header checksum does
 * not cover the ports, so the template's checksum stays valid; the UDP
 * checksum is 0 (allowed for IPv4).
 *
 * A frame with room for exactly one struct fp_rx_hint in its XDP metadata
 * area gets a per-flow hash there, as a NIC supplying RX hashes would (the
 * hints paper's prototype did the same in its driver), with gen_hint_magic
 * as its magic. Frames enter the loop without a metadata area: the _hint
 * entry points (the bench's `fastpath-hint` mode) make it one hint wide
 * with bpf_xdp_adjust_meta, once per frame, since a redirect keeps the area
 * and the frame comes round with it. Some kernels refuse that helper to XDP
 * programs (this project's 6.18.44 did on 2026-12-06, not on 2026-12-07),
 * which is why those are entry points of their own, loaded only in that
 * mode, and the bench asks the kernel first (traffic::hint_supported).
 *
 * fp_bench_gen6 (`fastpath bench --family 6`) is the same for an
 * Ethernet/IPv6/UDP header (GEN6_*): the ports at their IPv6 offsets, and
 * since IPv6 forbids a zero UDP checksum, the template's checksum moved by
 * what the ports add to the sum (RFC 1624), so every frame stays valid.
 * fp_bench_gen6_dst is its `fastpath bench fullrate --family 6` form,
 * taking flow i's destination and UDP checksum from gen6_dsts[i].
 *
 * fp_bench_gen_dst (`fastpath bench fullrate`) is the same generator with a
 * destination address per flow: flow i also takes its IPv4 destination and
 * the matching header checksum from gen_dsts[i], which user space fills (so
 * the program needs no checksum arithmetic). It is a separate entry point so
 * the default generator's code and cost stay exactly what they were.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "fastpath.h"
#include "loop.h"

#define GEN_HDR_WORDS 21        /* 14 B Ethernet + 20 B IPv4 + 8 B UDP, in 16-bit words */
#define GEN_SPORT_WORD 17       /* UDP source port: byte 34 of the frame */
#define GEN_DPORT_WORD 18       /* UDP destination port: byte 36 */
#define GEN_SPORT_BITS 15       /* flows per destination port: 32768 */
#define GEN_CSUM_WORD 12        /* IPv4 header checksum: byte 24 */
#define GEN_DADDR_WORD 15       /* IPv4 destination: bytes 30..33 */
#define GEN6_HDR_WORDS 31       /* 14 B Ethernet + 40 B IPv6 + 8 B UDP */
#define GEN6_SPORT_WORD 27      /* UDP source port: byte 54 */
#define GEN6_DPORT_WORD 28
#define GEN6_UCSUM_WORD 30      /* UDP checksum: byte 60 */
#define GEN6_DADDR_WORD 19      /* IPv6 destination: bytes 38..53 */

/* Header template in wire order, built (and checksummed) by the bench; an
 * IPv4 one fills the first GEN_HDR_WORDS. */
const volatile __u16 gen_hdr[GEN6_HDR_WORDS];
/* Source ports cycle over [gen_sport_base, gen_sport_base + gen_flows). */
const volatile __u16 gen_sport_base = 1024;
const volatile __u32 gen_flows = 1;
/* fp_rx_hint.magic written into every frame's metadata (0 = no hint). */
const volatile __u16 gen_hint_magic = 0;

/* Per-flow destination for fp_bench_gen_dst, in wire order; user space sizes
 * the map to the flow count (1 entry when unused). */
struct gen_dst {
	__u16 daddr[2];
	__u16 csum;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_dst);
} gen_dsts SEC(".maps");

/* The same for fp_bench_gen6_dst: the destination and flow i's whole UDP
 * checksum (ports included), so the program adds nothing up. */
struct gen6_dst {
	__u16 daddr[8];
	__u16 ucsum;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen6_dst);
} gen6_dsts SEC(".maps");

/* Where the next frame goes: g0's ifindex (0: XDP_TX, for BPF_PROG_RUN). */
const volatile __u32 gen_out_ifindex = 0;

/* Next flow index of this CPU: each CPU's loop is its own, no atomics needed. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen_flow SEC(".maps");

/*
 * The spring (fp_bench_gen_spring, `fastpath bench points`, whose programs
 * drop every frame, which would empty the loop): the frames go round
 * gx1 -> gx0 -> gx1 instead, and each round gx1's program broadcasts the
 * frame to both ends of loop_ports: a copy into the spring again (slot 0,
 * gx1) and one out of g0 to the router (slot 1). So frames reach the router
 * whatever becomes of them there, at the cost of the copy (xdpf_clone: a
 * page and a memcpy per frame) the kernel makes for a broadcast.
 */

static __always_inline int gen_frame(struct xdp_md *ctx, bool per_flow_dst, bool spring, bool grow_meta, bool v6)
{
	const int words = v6 ? GEN6_HDR_WORDS : GEN_HDR_WORDS;
	const int sport_w = v6 ? GEN6_SPORT_WORD : GEN_SPORT_WORD;
	const int dport_w = v6 ? GEN6_DPORT_WORD : GEN_DPORT_WORD;
	__u32 sum, dsport, ddport;
	struct fp_rx_hint *hint;
	struct loop_count *c;
	__u32 zero = 0, *flow, f, h;
	__u16 *data;
	void *data_end;
	bool bad;
	int i;

	if (!loop_ours(ctx))
		return XDP_PASS;
	c = loop_running(&bad);
	if (!c)
		return bad ? XDP_ABORTED : XDP_DROP;
	flow = bpf_map_lookup_elem(&gen_flow, &zero);
	if (!flow)
		return XDP_ABORTED;
	f = *flow;
	if (++*flow >= gen_flows)
		*flow = 0;
	if (grow_meta) {
		int have = (int)((long)ctx->data - (long)ctx->data_meta);

		if (have != (int)sizeof(*hint) && bpf_xdp_adjust_meta(ctx, have - (int)sizeof(*hint)))
			return XDP_ABORTED;
	}
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if ((void *)(data + words) > data_end)
		return XDP_ABORTED;
	/* Bounds for the verifier, then the exact size (as fp_xdp_fwd reads
	 * a hint); the empty asm keeps clang from merging the two. */
	hint = (void *)(long)ctx->data_meta;
	if ((void *)(hint + 1) <= (void *)data) {
		asm volatile("" : "+r"(data));
		if ((void *)(hint + 1) == (void *)data) {
			/* A NIC's RSS hash is some well-mixed function of the
			 * 5-tuple; a multiplicative hash of the flow number is
			 * one, and costs nothing. */
			h = (f + 1) * 0x9E3779B1U;
			hint->hash = h ^ (h >> 16);
			hint->flags = FP_HINT_L4;
			hint->magic = gen_hint_magic;
		}
	}

#pragma unroll
	for (i = 0; i < words; i++)
		data[i] = gen_hdr[i];
	dsport = f & ((1U << GEN_SPORT_BITS) - 1);
	ddport = f >> GEN_SPORT_BITS;
	data[sport_w] = bpf_htons(gen_sport_base + dsport);
	data[dport_w] = bpf_htons(bpf_ntohs(gen_hdr[dport_w]) + ddport);
	if (v6 && per_flow_dst) {
		__u32 key = f;
		struct gen6_dst *dst = bpf_map_lookup_elem(&gen6_dsts, &key);

		if (!dst)
			return XDP_ABORTED;
#pragma unroll
		for (i = 0; i < 8; i++)
			data[GEN6_DADDR_WORD + i] = dst->daddr[i];
		data[GEN6_UCSUM_WORD] = dst->ucsum;
	} else if (v6) {
		/* The template's ports are the base ones: the sum grows by the
		 * two increments, end-around carry, and 0 goes as 0xffff. */
		sum = (__u16)~bpf_ntohs(gen_hdr[GEN6_UCSUM_WORD]) + dsport + ddport;
		sum = (sum & 0xFFFF) + (sum >> 16);
		sum = (sum & 0xFFFF) + (sum >> 16);
		sum = (__u16)~sum;
		data[GEN6_UCSUM_WORD] = bpf_htons(sum ? sum : 0xFFFF);
	}
	if (per_flow_dst && !v6) {
		/* A copy: taking f's own address changes fp_bench_gen's code
		 * too (checked with llvm-objdump), and it must stay as it was. */
		__u32 key = f;
		struct gen_dst *dst;

		dst = bpf_map_lookup_elem(&gen_dsts, &key);
		if (!dst)
			return XDP_ABORTED;
		data[GEN_CSUM_WORD] = dst->csum;
		data[GEN_DADDR_WORD] = dst->daddr[0];
		data[GEN_DADDR_WORD + 1] = dst->daddr[1];
	}
	c->sent++;
	if (spring)
		return loop_spring_send();
	return gen_out_ifindex ? bpf_redirect(gen_out_ifindex, 0) : XDP_TX;
}

SEC("xdp")
int fp_bench_gen(struct xdp_md *ctx)
{
	return gen_frame(ctx, false, false, false, false);
}

SEC("xdp")
int fp_bench_gen_dst(struct xdp_md *ctx)
{
	return gen_frame(ctx, true, false, false, false);
}

SEC("xdp")
int fp_bench_gen_hint(struct xdp_md *ctx)
{
	return gen_frame(ctx, false, false, true, false);
}

SEC("xdp")
int fp_bench_gen_dst_hint(struct xdp_md *ctx)
{
	return gen_frame(ctx, true, false, true, false);
}

SEC("xdp")
int fp_bench_gen6(struct xdp_md *ctx)
{
	return gen_frame(ctx, false, false, false, true);
}

SEC("xdp")
int fp_bench_gen6_hint(struct xdp_md *ctx)
{
	return gen_frame(ctx, false, false, true, true);
}

SEC("xdp")
int fp_bench_gen6_dst(struct xdp_md *ctx)
{
	return gen_frame(ctx, true, false, false, true);
}

SEC("xdp")
int fp_bench_gen6_dst_hint(struct xdp_md *ctx)
{
	return gen_frame(ctx, true, false, true, true);
}

SEC("xdp")
int fp_bench_gen_spring(struct xdp_md *ctx)
{
	return gen_frame(ctx, false, true, false, false);
}

SEC("xdp")
int fp_bench_gen_bounce(struct xdp_md *ctx)
{
	return loop_bounce(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
