/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * xdp_pass.bpf.c — the `xdp-pass` variant of `fastpath bench stateful --ab`:
 * an XDP program that hands every frame to the kernel, on both router ports.
 * What it costs a TCP connection is what any XDP program on these ports
 * costs before doing any work. With `--crr-ingress skbs` that includes
 * veth's copy of each locally built skb (cloned by TCP for retransmission,
 * short of XDP headroom) into a fresh buffer for the program; a physical
 * NIC runs XDP on its receive buffer before any skb exists, and with the
 * default `--crr-ingress frames` (bench/wire.rs) neither does the router.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

SEC("xdp")
int fp_bench_xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
