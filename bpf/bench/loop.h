/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * loop.h — what the bench generators' loops and springs share (gen.bpf.c
 * says what they are): the run's stop flag, the per-CPU counts, the
 * spring's two ends and its bounce. User space drives them all alike
 * (traffic.rs: LoopMaps, drive).
 */
#ifndef FP_BENCH_LOOP_H
#define FP_BENCH_LOOP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* The length of the frames going round; others are not ours (0: any). */
const volatile __u32 loop_frame_len = 0;

/* gx0's ifindex: loop_bounce() sends the spring's frames straight back. */
const volatile __u32 loop_bounce_ifindex = 0;

/* Slot 0, set to 1 by user space, ends a run: frames coming back are dropped. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} loop_stop SEC(".maps");

struct loop_count {
	__u64 sent;      /* sent on towards the router */
	__u64 stopped;   /* dropped under loop_stop: the frames going round at the end */
};

/* Per CPU: a loop stays on the CPU it was started on. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct loop_count);
} loop_stats SEC(".maps");

/* The spring's ends: slot 0 gx1 (round again), slot 1 g0 (to the router). */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} loop_ports SEC(".maps");

/* A frame of the loop's length (or any, with loop_frame_len 0). */
static __always_inline bool loop_ours(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;

	return !loop_frame_len || data + loop_frame_len == (void *)(long)ctx->data_end;
}

/*
 * This CPU's counts, or NULL when the run is over (the frame counted as
 * stopped, to be dropped) or a map is missing (*@bad set: abort).
 */
static __always_inline struct loop_count *loop_running(bool *bad)
{
	__u32 zero = 0, *stop = bpf_map_lookup_elem(&loop_stop, &zero);
	struct loop_count *c = bpf_map_lookup_elem(&loop_stats, &zero);

	*bad = !stop || !c;
	if (*bad)
		return NULL;
	if (*stop) {
		c->stopped++;
		return NULL;
	}
	return c;
}

/* The spring's send: one copy round again, one to the router. */
static __always_inline int loop_spring_send(void)
{
	return bpf_redirect_map(&loop_ports, 0, BPF_F_BROADCAST);
}

/* On gx0: the spring's frames back to gx1; anything else to the stack. */
static __always_inline int loop_bounce(struct xdp_md *ctx)
{
	if (!loop_ours(ctx))
		return XDP_PASS;
	return bpf_redirect(loop_bounce_ifindex, 0);
}

#endif /* FP_BENCH_LOOP_H */
