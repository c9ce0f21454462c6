/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * watchdog.h — is anybody keeping the tables current?
 *
 * With pinned maps and links the program outlives the daemon, so after a
 * crash routes may change while nobody mirrors them. The daemon's
 * keep-alive tick (fp_runtime.neigh_clock, CLOCK_MONOTONIC_COARSE seconds
 * + 1, ~1/s) doubles as its heartbeat: it is the same clock as
 * bpf_ktime_get_coarse_ns(), so one coarse clock read per packet tells
 * how long the daemon has been silent. Past the grace period everything
 * goes to the kernel, which always knows the current routes.
 */
#ifndef FP_WATCHDOG_H
#define FP_WATCHDOG_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/*
 * @clock: fp_runtime.neigh_clock; @grace: fp_runtime.orphan_grace (0 = off).
 * The daemon's clock is whole seconds of the coarse clock plus one, so
 * "now - clock > grace" in seconds is "ns >= (clock + grace) s": a multiply
 * instead of a 64-bit divide. A clock never started counts as silent; one
 * ahead of now (only the daemon writes it, from the same clock) is not.
 *
 * The coarse clock only moves at a tick, when jiffies does, so the verdict
 * is computed once per jiffy (per CPU and ingress slot, in @w) and reused:
 * jiffies is an inlined load, the clock a helper call, and with return
 * thunks a call costs more than the rest of this check.
 */
static __always_inline bool fp_orphaned(struct fp_watch *w, __u32 clock, __u32 grace)
{
	__u64 now;

	if (!grace)
		return false;
	if (!clock)
		return true;
	now = bpf_jiffies64();
	if (w->jiffies != now || w->clock != clock || w->grace != grace) {
		w->orphaned = bpf_ktime_get_coarse_ns() >= ((__u64)clock + grace) * 1000000000ULL;
		w->jiffies = now;
		w->clock = clock;
		w->grace = grace;
	}
	return w->orphaned;
}

#endif /* FP_WATCHDOG_H */
