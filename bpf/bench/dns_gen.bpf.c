/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * dns_gen.bpf.c — DNS query generator for `fastpath bench dns`: a spring
 * like gen.bpf.c's (fp_dns_gen_spring on gx1, fp_dns_bounce on gx0): each
 * round a query is written into the frame and broadcast to loop_ports, one
 * copy into the spring again, one out of g0 to the responder, whatever
 * becomes of it there. (fp_dns_gen, the same query as an XDP_TX, was run by
 * BPF_PROG_RUN in live-frames mode, which this project's kernel now refuses;
 * the unit tests still run it without live frames.)
 *
 * Unlike gen.bpf.c it writes the whole frame from the template every time:
 * pages come back from the responder with the answer in them (QR set, an
 * answer section appended), not only with rewritten headers. And because
 * the responder may have grown the frame, whose recycled xdp_frame then
 * keeps the grown length, the program is fed one spare byte and trims it on
 * every run: a changed context makes the test runner rebuild the frame from
 * it, so each query leaves with exactly dg_len bytes.
 *
 * Query q asks for name number q / 2 (six lowercase hex digits written at
 * dg_digits) with QTYPE A for even q and AAAA for odd q, and carries q as
 * its DNS ID; q cycles over [0, dg_queries). All names have the same
 * length, so the IPv4 header and its checksum stay the template's; the UDP
 * checksum is 0.
 *
 * fp_dns_pass (below) is the client-side helper of the response-time runs
 * and of tests/test_dns.py.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "loop.h"

#define DG_MAX 96

const volatile __u8 dg_tmpl[DG_MAX];
const volatile __u32 dg_len = 0;       /* frame bytes, <= DG_MAX */
const volatile __u32 dg_digits = 0;    /* offset of the six hex digits */
const volatile __u32 dg_qtype = 0;     /* offset of QTYPE */
const volatile __u32 dg_id = 0;        /* offset of the DNS ID */
const volatile __u32 dg_queries = 1;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} dg_next SEC(".maps");

static __always_inline __u8 dg_hex(__u32 n)
{
	n &= 0xf;
	return n < 10 ? '0' + n : 'a' + n - 10;
}

/* Writes the next query into the frame, first cut to dg_len if @trim (the
 * spring's frames have that length already); 0, or XDP_ABORTED. */
static __always_inline int dg_query(struct xdp_md *ctx, bool trim)
{
	__u32 zero = 0, *next, q, name;
	__u8 *data, *data_end;
	int i;

	next = bpf_map_lookup_elem(&dg_next, &zero);
	if (!next)
		return XDP_ABORTED;
	q = *next;
	if (++*next >= dg_queries)
		*next = 0;

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (trim && bpf_xdp_adjust_tail(ctx, (int)dg_len - (int)(data_end - data)))
		return XDP_ABORTED;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
#pragma unroll
	for (i = 0; i < DG_MAX; i++) {
		if (i < dg_len && data + i + 1 <= data_end)
			data[i] = dg_tmpl[i];
	}
	name = q >> 1;
	if (dg_digits + 6 <= dg_len && data + dg_digits + 6 <= data_end) {
		data[dg_digits] = dg_hex(name >> 20);
		data[dg_digits + 1] = dg_hex(name >> 16);
		data[dg_digits + 2] = dg_hex(name >> 12);
		data[dg_digits + 3] = dg_hex(name >> 8);
		data[dg_digits + 4] = dg_hex(name >> 4);
		data[dg_digits + 5] = dg_hex(name);
	}
	if (dg_qtype + 2 <= dg_len && data + dg_qtype + 2 <= data_end) {
		data[dg_qtype] = 0;
		data[dg_qtype + 1] = q & 1 ? 28 : 1;
	}
	if (dg_id + 2 <= dg_len && data + dg_id + 2 <= data_end) {
		data[dg_id] = q >> 8;
		data[dg_id + 1] = q;
	}
	return 0;
}

SEC("xdp")
int fp_dns_gen(struct xdp_md *ctx)
{
	return dg_query(ctx, true) ? XDP_ABORTED : XDP_TX;
}

/* loop_frame_len is dg_len: the spring only ever holds queries. */
SEC("xdp")
int fp_dns_gen_spring(struct xdp_md *ctx)
{
	struct loop_count *c;
	bool bad;

	if (!loop_ours(ctx))
		return XDP_PASS;
	c = loop_running(&bad);
	if (!c)
		return bad ? XDP_ABORTED : XDP_DROP;
	if (dg_query(ctx, false))
		return XDP_ABORTED;
	c->sent++;
	return loop_spring_send();
}

SEC("xdp")
int fp_dns_bounce(struct xdp_md *ctx)
{
	return loop_bounce(ctx);
}

/*
 * For the client's veth: a veth delivers its peer's XDP_TX frames at once
 * only when it runs an XDP program itself (veth_xdp_flush() wakes the
 * receiver only then; otherwise they wait for the next unrelated packet).
 * A real NIC has no such rule, so the client side gets this do-nothing one.
 */
SEC("xdp")
int fp_dns_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
