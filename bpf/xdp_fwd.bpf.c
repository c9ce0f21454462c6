/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* placeholder: replaced by the forwarding program */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"

struct fp_runtime fp_rt;

SEC("xdp")
int fp_xdp_fwd(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
