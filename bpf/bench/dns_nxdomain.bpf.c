/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * dns_nxdomain.bpf.c — the execution-point study's "DNS ping" (issue #6,
 * workload c): every well-formed DNS query arriving on the interface is
 * answered NXDOMAIN in place and sent back out of it (XDP_TX). Malformed
 * queries get FORMERR/NOTIMP or no answer, everything else is passed to the
 * kernel; the rules are in lib/dns.h.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "dns.h"

SEC("xdp")
int fp_dns_nxdomain(struct xdp_md *ctx)
{
	struct dns_query q = {};
	__u16 rcode;
	int v;

	v = dns_parse(ctx, &q, NULL);
	if (v == DNS_V_PASS) {
		dns_count(FP_DNS_C_PASS);
		return XDP_PASS;
	}
	if (v == DNS_V_DROP) {
		dns_count(FP_DNS_C_DROP);
		return XDP_DROP;
	}
	rcode = v == DNS_V_QUESTION && q.rcode == DNS_RCODE_NOERROR ? DNS_RCODE_NXDOMAIN : q.rcode;
	return dns_counted(dns_answer(ctx, &q, v == DNS_V_QUESTION, rcode, NULL), rcode, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
