/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * watchdog.h — is anybody keeping the tables current?
 *
 * With pinned maps and links the program outlives the daemon, so after a
 * crash routes may change while nobody mirrors them. The daemon's
 * keep-alive tick (fp_runtime.neigh_clock, CLOCK_MONOTONIC_COARSE seconds
 * + 1, ~1/s) doubles as its heartbeat: it is the same clock as
 * bpf_ktime_get_coarse_ns(), so one coarse clock read tells how long the
 * daemon has been silent. Past the grace period everything
 * goes to the kernel, which always knows the current routes.
 */
#ifndef FP_WATCHDOG_H
#define FP_WATCHDOG_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/*
 * bpf_ktime_get_coarse_ns(), read once per jiffy (per CPU and ingress slot,
 * in @w). The coarse clock only moves at a tick, when jiffies does, and
 * jiffies is an inlined load while the clock is a helper call, which with
 * return thunks costs more than the checks that want the time. A packet
 * that sees the new jiffy just before the tick updated the clock keeps the
 * old tick's time for this jiffy: one tick late at worst, like the coarse
 * clock itself.
 */
static __always_inline __u64 fp_coarse_ns(struct fp_watch *w)
{
	__u64 j = bpf_jiffies64();

	if (w->jiffies != j) {
		w->now_ns = bpf_ktime_get_coarse_ns();
		w->jiffies = j;
	}
	return w->now_ns;
}

/*
 * @clock: fp_runtime.neigh_clock; @grace: fp_runtime.orphan_grace (0 = off).
 * The daemon's clock is whole seconds of the coarse clock plus one, so
 * "now - clock > grace" in seconds is "ns >= (clock + grace) s": a multiply
 * instead of a 64-bit divide. A clock never started counts as silent; one
 * ahead of now (only the daemon writes it, from the same clock) is not.
 * A "kept" answer is remembered with its jiffy, clock and grace
 * (fp_kept_this_jiffy()).
 */
static __always_inline bool fp_orphaned(struct fp_watch *w, __u32 clock, __u32 grace)
{
	bool orphaned;

	if (!grace)
		orphaned = false;
	else if (!clock)
		orphaned = true;
	else
		orphaned = fp_coarse_ns(w) >= ((__u64)clock + grace) * 1000000000ULL;
	if (!orphaned) {
		w->kept_jiffies = bpf_jiffies64();
		w->kept_rt = clock | (__u64)grace << 32;
	}
	return orphaned;
}

/*
 * fp_orphaned(@w, @clock, @grace) said "kept" in this jiffy, for this clock
 * and grace: two compares for the express path (express.h), which leaves
 * every other case to the general path. The answer depends on nothing
 * else but the coarse clock, which only moves at a tick, when jiffies does.
 */
static __always_inline bool fp_kept_this_jiffy(const struct fp_watch *w, __u32 clock, __u32 grace)
{
	return w->kept_jiffies == bpf_jiffies64() && w->kept_rt == (clock | (__u64)grace << 32);
}

#endif /* FP_WATCHDOG_H */
