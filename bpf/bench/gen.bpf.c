/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * gen.bpf.c — the benchmark's traffic generator.
 *
 * Run with BPF_PROG_RUN in live-frames mode (BPF_F_TEST_XDP_LIVE_FRAMES) and
 * ingress_ifindex = the generator's veth: every XDP_TX becomes a real frame
 * sent out of that veth to the router.
 *
 * Live frames come from a page pool that is initialised from the user's
 * data_in only when a page is first handed out in a run; a recycled page keeps
 * whatever bytes the last user left in it, and by then the router has already
 * rewritten the MACs and decremented the TTL in place. So the program writes
 * the whole Ethernet/IPv4/UDP header from the template on every frame instead
 * of patching only the port: the payload is never touched by anyone, the
 * header always is.
 *
 * Flow i has UDP source port gen_sport_base + i % 32768 and destination port
 * (template's) + i / 32768, so up to 32768 flows differ only in the source
 * port and a million still fit in valid ports. The IPv4 header checksum does
 * not cover the ports, so the template's checksum stays valid; the UDP
 * checksum is 0 (allowed for IPv4).
 *
 * Every frame also carries a struct fp_rx_hint in the XDP metadata area with
 * a per-flow hash, as a NIC supplying RX hashes would (the hints paper's
 * prototype did the same in its driver). Its magic is gen_hint_magic: the
 * real FP_HINT_MAGIC in the hint mode, 0 in every other mode so fastpath
 * ignores it. The generator thus does the same work in every mode; only the
 * router's share of the path changes between them.
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

#define GEN_HDR_WORDS 21        /* 14 B Ethernet + 20 B IPv4 + 8 B UDP, in 16-bit words */
#define GEN_SPORT_WORD 17       /* UDP source port: byte 34 of the frame */
#define GEN_DPORT_WORD 18       /* UDP destination port: byte 36 */
#define GEN_SPORT_BITS 15       /* flows per destination port: 32768 */
#define GEN_CSUM_WORD 12        /* IPv4 header checksum: byte 24 */
#define GEN_DADDR_WORD 15       /* IPv4 destination: bytes 30..33 */

/* Header template in wire order, built (and checksummed) by the bench. */
const volatile __u16 gen_hdr[GEN_HDR_WORDS];
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

/* Next flow index of this CPU: live-frame runs are per CPU, no atomics needed. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen_flow SEC(".maps");

static __always_inline int gen_frame(struct xdp_md *ctx, bool per_flow_dst)
{
	struct fp_rx_hint *hint;
	__u32 zero = 0, *flow, f, h;
	__u16 *data;
	void *data_end;
	int i;

	flow = bpf_map_lookup_elem(&gen_flow, &zero);
	if (!flow)
		return XDP_ABORTED;
	f = *flow;
	if (++*flow >= gen_flows)
		*flow = 0;

	/* The metadata area comes with the frame: user space runs us with
	 * one hint's worth in front of data (xdp_md.data), which test_run
	 * restores for every live frame. Not bpf_xdp_adjust_meta(): some
	 * kernels refuse that helper to XDP programs (6.18.44 here does). */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	hint = (void *)(long)ctx->data_meta;
	/* Bounds for the verifier, then the exact size (as fp_xdp_fwd reads
	 * a hint); the empty asm keeps clang from merging the two. */
	if ((void *)(hint + 1) > (void *)data || (void *)(data + GEN_HDR_WORDS) > data_end)
		return XDP_ABORTED;
	asm volatile("" : "+r"(data));
	if ((void *)(hint + 1) != (void *)data)
		return XDP_ABORTED;

	/* A NIC's RSS hash is some well-mixed function of the 5-tuple; a
	 * multiplicative hash of the flow number is one, and costs nothing. */
	h = (f + 1) * 0x9E3779B1U;
	hint->hash = h ^ (h >> 16);
	hint->flags = FP_HINT_L4;
	hint->magic = gen_hint_magic;

#pragma unroll
	for (i = 0; i < GEN_HDR_WORDS; i++)
		data[i] = gen_hdr[i];
	data[GEN_SPORT_WORD] = bpf_htons(gen_sport_base + (f & ((1U << GEN_SPORT_BITS) - 1)));
	data[GEN_DPORT_WORD] = bpf_htons(bpf_ntohs(gen_hdr[GEN_DPORT_WORD]) + (f >> GEN_SPORT_BITS));
	if (per_flow_dst) {
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
	return XDP_TX;
}

SEC("xdp")
int fp_bench_gen(struct xdp_md *ctx)
{
	return gen_frame(ctx, false);
}

SEC("xdp")
int fp_bench_gen_dst(struct xdp_md *ctx)
{
	return gen_frame(ctx, true);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
