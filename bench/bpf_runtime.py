#!/usr/bin/env python3
"""Run time per packet of loaded BPF programs, second by second (bpf_stats).

With kernel.bpf_stats_enabled=1 the kernel times every run of every BPF
program (two clock reads per run, ~15-20 ns on the development VM, so an
empty XDP program shows ~20 ns). This samples `bpftool prog show` once a
second and prints, per name prefix, the runs and the mean ns per run over
the second just gone. A far steadier figure than a connection rate for
"what does the program cost here", e.g. next to the stateful bench's
connection-rate part:

    bench/bpf_runtime.py fp_xdp_fwd,fp_bench_ct,fp_bench_xdp_pass 90 &
    fastpath bench stateful --flows 1 --reps 1 --duration 0.3 --ab xdp-pass

Programs with the same prefix are summed (fastpath loads one instance per
interface; the benches load new ones per round). It restores the sysctl's
previous value on exit; two at once would leave it on (the second takes
the first's 1 for the previous value), and every BPF program then pays
the two clock reads per run: check /proc/sys/kernel/bpf_stats_enabled. Needs root and bpftool. A developer tool; nothing
in make test uses it.
"""
import argparse
import json
import subprocess
import time

SYSCTL = "/proc/sys/kernel/bpf_stats_enabled"


def progs() -> list:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return json.loads(out or "[]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefixes", help="comma-separated program name prefixes")
    ap.add_argument("seconds", type=float, help="how long to sample")
    ap.add_argument("--min-runs", type=int, default=1000, help="skip seconds with fewer runs of a prefix")
    a = ap.parse_args()
    names = a.prefixes.split(",")
    with open(SYSCTL) as f:
        was = f.read().strip()
    with open(SYSCTL, "w") as f:
        f.write("1")
    prev: dict = {}
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < a.seconds:
            sums = {n: [0, 0] for n in names}
            for p in progs():
                pre = next((n for n in names if p.get("name", "").startswith(n)), None)
                if pre is None:
                    continue
                now = (p.get("run_time_ns", 0), p.get("run_cnt", 0))
                old = prev.get(p["id"])
                prev[p["id"]] = now
                if old is not None:
                    sums[pre][0] += now[0] - old[0]
                    sums[pre][1] += now[1] - old[1]
            cols = [f"{n} {c} runs {t / c:.0f} ns" for n, (t, c) in sums.items() if c >= a.min_runs]
            if cols:
                print(f"{time.monotonic() - t0:6.1f} s  " + " | ".join(cols), flush=True)
            time.sleep(1)
    finally:
        with open(SYSCTL, "w") as f:
            f.write(was)


if __name__ == "__main__":
    main()
