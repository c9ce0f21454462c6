/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * xsk.h — the AF_XDP data path's commit: instead of the devmap redirect
 * and the rewrite, hand the untouched frame to the user-space forwarder's
 * socket of this ingress and RX queue, with the rewrite data (struct
 * fp_xsk_meta) pushed in front of it as packet data.
 */
#ifndef FP_XSK_H
#define FP_XSK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "maps.h"
#include "parse.h"

/*
 * Point of no return of the AF_XDP path, like fp_tx_commit(): every check
 * that can fail comes before the frame is touched, so a failure is a clean
 * punt. The forwarder thread of RX queue q owns one socket per interface on
 * queue q; without a socket of the egress slot on this queue it could not
 * transmit, so the packet goes to the kernel instead. A frame that would
 * not fit a UMEM chunk is punted too: the socket would drop it.
 * *@len becomes the length user space will transmit (padding cut), for the
 * counters.
 */
static __always_inline __u32
fp_xsk_commit(struct xdp_md *ctx, __u32 in_slot, __u32 out_slot, __u32 *len, __u32 l2_len,
	      const __u8 *dmac, const __u8 *smac, __u16 family)
{
	struct fp_xsk_meta *m;
	void *data;
	__u32 q = ctx->rx_queue_index, key;

	if (q >= FP_XSK_MAX_QUEUES || *len > FP_XSK_MAX_FRAME - sizeof(*m))
		return FP_R_REDIRECT_FAILED;
	key = out_slot * FP_XSK_MAX_QUEUES + q;
	if (!bpf_map_lookup_elem(&fp_xsks, &key))
		return FP_R_EGRESS_NOT_MANAGED;
	key = in_slot * FP_XSK_MAX_QUEUES + q;
	if (bpf_redirect_map(&fp_xsks, key, 0) != XDP_REDIRECT)
		return FP_R_REDIRECT_FAILED;
	/*
	 * Our struct as the descriptor's first bytes, the frame behind it:
	 * grown into the headroom as packet data rather than as metadata,
	 * because some kernels refuse bpf_xdp_adjust_meta() to XDP programs
	 * (6.18.44 here does), and every path that runs XDP leaves headroom.
	 * The XDP_PASS the caller returns on failure overrides the redirect;
	 * the frame then goes to the kernel as it came.
	 */
	if (bpf_xdp_adjust_head(ctx, -(int)sizeof(*m)))
		return FP_R_REDIRECT_FAILED;
	m = (void *)(long)ctx->data;
	data = (void *)(long)ctx->data_end;
	if ((void *)(m + 1) > data) {
		bpf_xdp_adjust_head(ctx, (int)sizeof(*m));
		return FP_R_REDIRECT_FAILED;
	}
	__builtin_memcpy(m->dmac, dmac, FP_ETH_ALEN);
	__builtin_memcpy(m->smac, smac, FP_ETH_ALEN);
	m->egress_slot = out_slot;
	m->family = family;
	m->magic = FP_XSK_META_MAGIC;
	*len = l2_len;
	return FP_R_FORWARDED;
}

#endif /* FP_XSK_H */
