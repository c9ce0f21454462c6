/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * mphash_test.bpf.c — runs bpf/lib/mphash.h under BPF_PROG_RUN so
 * crates/fastpath-bpf/tests/mphash.rs can compare it with the Rust
 * reference. Test-only; never attached.
 *
 * The input travels in the "frame" rather than in globals so the addresses
 * are read from packet memory at the unaligned offsets of a real frame
 * (IPv6 source at 22, IPv4 source at 26), as the forwarding program will.
 * Layout (all fields as they would be in a packet unless noted):
 *    0 family (4 or 6)   1 policy   2 proto   4 seed (host order)
 *    8 sport  10 dport   12 fields (policy 3's, host order u16)
 *   14 IPv6 first word (version, class, label)
 *   22 IPv6 source  38 IPv6 destination  26 IPv4 source  30 IPv4 destination
 * Output written back: 60 hash (host order), 64 fp_mp_l4_ports_proto(proto),
 * 68 fp_mp_ports_proto(policy, fields, proto) (policy 0: 0, not asked).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "mphash.h"

#define MPT_LEN 72

SEC("xdp")
int fp_mphash_test(struct xdp_md *ctx)
{
	__u8 *p = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;
	__be16 sport, dport;
	__u32 seed, fields, h;

	if (p + MPT_LEN > end)
		return XDP_ABORTED;
	fields = *(__u16 *)(p + 12);
	*(__s32 *)(p + 68) = p[1] ? fp_mp_ports_proto(p[1], fields, p[2]) : 0;
	seed = *(__u32 *)(p + 4);
	sport = *(__be16 *)(p + 8);
	dport = *(__be16 *)(p + 10);
	if (p[0] == 4)
		h = fp_mp_hash4(p[1], fields, seed, *(__be32 *)(p + 26), *(__be32 *)(p + 30), p[2], sport, dport);
	else
		h = fp_mp_hash6(p[1], fields, seed, p + 22, p + 38, *(__be32 *)(p + 14), p[2], sport, dport);
	*(__u32 *)(p + 60) = h;
	*(__s32 *)(p + 64) = fp_mp_l4_ports_proto(p[2]);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
