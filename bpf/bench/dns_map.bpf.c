/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * dns_map.bpf.c — DNS responder answering from a hash map of records (issue
 * #6, workload d; the paper's in-memory response cache). The key is the
 * question's name (wire format, lowercased, so lookups are case-insensitive)
 * and QTYPE; the value is the answer section, appended after the echoed
 * question. A name with no record of the asked type is NODATA when its
 * "exists" marker (QTYPE 0) is present, NXDOMAIN otherwise, so a missing
 * type never claims the name does not exist. Names longer than the key are
 * never records (the loader refuses them): NXDOMAIN without a lookup.
 * Parsing and malformed-query rules: lib/dns.h.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "dns.h"

/* The record set; user space sizes it before load (`fastpath bench dns`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct fp_dns_key);
	__type(value, struct fp_dns_answer);
} dns_records SEC(".maps");

SEC("xdp")
int fp_dns_map(struct xdp_md *ctx)
{
	struct fp_dns_key key = {};
	struct dns_query q = {};
	struct fp_dns_answer *ans = NULL;
	__u16 rcode;
	int v;

	v = dns_parse(ctx, &q, &key);
	if (v == DNS_V_PASS) {
		dns_count(FP_DNS_C_PASS);
		return XDP_PASS;
	}
	if (v == DNS_V_DROP) {
		dns_count(FP_DNS_C_DROP);
		return XDP_DROP;
	}
	rcode = q.rcode;
	if (v == DNS_V_QUESTION && rcode == DNS_RCODE_NOERROR) {
		rcode = DNS_RCODE_NXDOMAIN;
		if (q.name_len <= FP_DNS_KEY_NAME) {
			key.qtype = q.qtype;
			ans = bpf_map_lookup_elem(&dns_records, &key);
			if (ans) {
				rcode = DNS_RCODE_NOERROR;
			} else {
				key.qtype = FP_DNS_QTYPE_NAME;
				if (q.qtype != FP_DNS_QTYPE_NAME && bpf_map_lookup_elem(&dns_records, &key))
					rcode = DNS_RCODE_NOERROR;
			}
		}
	}
	return dns_counted(dns_answer(ctx, &q, v == DNS_V_QUESTION, rcode, ans), rcode, ans ? ans->ancount : 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
