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

/* @clock: fp_runtime.neigh_clock; @grace: fp_runtime.orphan_grace (0 = off). */
static __always_inline bool fp_orphaned(__u32 clock, __u32 grace)
{
	__u32 now;

	if (!grace)
		return false;
	now = (__u32)(bpf_ktime_get_coarse_ns() / 1000000000ULL) + 1;
	/* A clock never started counts as silent; one ahead of now (only the
	 * daemon writes it, from the same clock) is not. */
	return !clock || (__s32)(now - clock) > (__s32)grace;
}

#endif /* FP_WATCHDOG_H */
