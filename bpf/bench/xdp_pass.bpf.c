/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * xdp_pass.bpf.c — the `xdp-pass` variant of `fastpath bench stateful --ab`:
 * an XDP program that hands every frame to the kernel, on both router ports.
 * What it costs a TCP connection is what any XDP program on these ports
 * costs before doing any work: on a veth, a locally built skb (cloned by TCP
 * for retransmission, short of XDP headroom) is copied into a fresh buffer
 * for the program and back into an skb after XDP_PASS. A physical NIC runs
 * XDP on its receive buffer before any skb exists, so pays none of that.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

SEC("xdp")
int fp_bench_xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
