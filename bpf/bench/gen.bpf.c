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
 * Flows differ only in the UDP source port. The IPv4 header checksum does not
 * cover the ports, so the template's checksum stays valid; the UDP checksum is
 * 0 (allowed for IPv4).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define GEN_HDR_WORDS 21        /* 14 B Ethernet + 20 B IPv4 + 8 B UDP, in 16-bit words */
#define GEN_SPORT_WORD 17       /* UDP source port: byte 34 of the frame */

/* Header template in wire order, built (and checksummed) by the bench. */
const volatile __u16 gen_hdr[GEN_HDR_WORDS];
/* Source ports cycle over [gen_sport_base, gen_sport_base + gen_flows). */
const volatile __u16 gen_sport_base = 1024;
const volatile __u32 gen_flows = 1;

/* Next flow index of this CPU: live-frame runs are per CPU, no atomics needed. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} gen_flow SEC(".maps");

SEC("xdp")
int fp_bench_gen(struct xdp_md *ctx)
{
	__u16 *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0, *flow;
	int i;

	if ((void *)(data + GEN_HDR_WORDS) > data_end)
		return XDP_ABORTED;
	flow = bpf_map_lookup_elem(&gen_flow, &zero);
	if (!flow)
		return XDP_ABORTED;

#pragma unroll
	for (i = 0; i < GEN_HDR_WORDS; i++)
		data[i] = gen_hdr[i];
	data[GEN_SPORT_WORD] = bpf_htons(gen_sport_base + *flow);

	if (++*flow >= gen_flows)
		*flow = 0;
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
