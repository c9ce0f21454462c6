#!/usr/bin/env python3
"""Grouped bar chart of `fastpath bench` results.

Usage: plot.py forward.json forward.png

One group of bars per (frame size, flows), one bar per mode; the bar is the
median over repetitions, the whisker spans min..max, the label is the ratio to
the kernel. Top left: Mpps by wall clock. Top right: Mpps per second of the
bench CPU's time, the fairer figure when the box was shared (see README.md).
Bottom (when the JSON has a "hints" section): ns per packet of XDP1 (parse +
software hash), XDP_HINTS (hash from the metadata hint) and XDP3 (no work).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODE_ORDER = ["kernel", "fib-fwd", "fastpath-nocache", "fastpath", "fastpath-hint",
              "kernel-ct", "ct-ref", "fastpath-stateful", "raw", "afxdp", "afxdp-noprefetch", "afxdp-tx"]
COLORS = {
    "kernel": "#7f7f7f",
    "fib-fwd": "#ff7f0e",
    "fastpath-nocache": "#aec7e8",
    "fastpath": "#1f77b4",
    "fastpath-hint": "#9467bd",
    "kernel-ct": "#7f7f7f",
    "ct-ref": "#ff7f0e",
    "fastpath-stateful": "#1f77b4",
    "raw": "#2ca02c",
    "afxdp": "#d62728",
    "afxdp-noprefetch": "#e377c2",
    "afxdp-tx": "#ff9896",
}


def flows_label(f):
    if f >= 1_000_000 and f % 1_000_000 == 0:
        return f"{f // 1_000_000}M flows"
    if f >= 1000 and f % 1000 == 0:
        return f"{f // 1000}k flows"
    return f"{f} flow{'s' if f != 1 else ''}"


def hints_panel(ax, hints):
    rows = hints["rows"]
    names = [r["program"] for r in rows]
    ys = [r["ns_per_packet"] for r in rows]
    lo = [r["ns_per_packet"] - r["min_ns"] for r in rows]
    hi = [r["max_ns"] - r["ns_per_packet"] for r in rows]
    colors = ["#d62728", "#9467bd", "#7f7f7f"]
    bars = ax.bar(names, ys, yerr=[lo, hi], capsize=3, color=colors[: len(rows)])
    for b, r in zip(bars, rows):
        ax.annotate(f"{r['ns_per_packet']:.1f} ns", (b.get_x() + b.get_width() / 2, r["max_ns"]),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    above = hints.get("hint_to_parse_above_floor")
    above = f", {above:.2f}x above XDP3" if above is not None else ""
    ax.set_title(f"ns per packet (BPF_PROG_RUN x {hints['repeat']}): hint / parse = "
                 f"{hints['hint_to_parse']:.2f}x{above}", fontsize=10)
    ax.set_ylabel("ns / packet")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    ax.grid(axis="y", alpha=0.3)


def crr_panel(ax, rows):
    """`fastpath bench stateful`: TCP connections per second by mode."""
    names = [r["mode"] for r in rows]
    ys = [r["median_conns_per_s"] for r in rows]
    lo = [r["median_conns_per_s"] - r["min_conns_per_s"] for r in rows]
    hi = [r["max_conns_per_s"] - r["median_conns_per_s"] for r in rows]
    bars = ax.bar(names, ys, yerr=[lo, hi], capsize=3, color=[COLORS.get(n) for n in names])
    for b, r in zip(bars, rows):
        x = r.get("ratio_to_kernel_ct")
        ax.annotate(f"{r['median_conns_per_s']:.0f}" + (f" ({x:.2f}x)" if x is not None else ""),
                    (b.get_x() + b.get_width() / 2, r["max_conns_per_s"]),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_title("Short TCP connections per second (connect, request, response, close)", fontsize=10)
    ax.set_ylabel("connections / s")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    ax.grid(axis="y", alpha=0.3)


def panel(ax, results, groups, modes, value, ratio, whiskers, title):
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        xs, ys, lo, hi, tops, labels = [], [], [], [], [], []
        for g, (size, flows) in enumerate(groups):
            cell = next((c for c in results if c["mode"] == mode and c["size"] == size and c["flows"] == flows), None)
            if cell is None:
                continue
            x = g + (i - (len(modes) - 1) / 2) * width
            y = cell[value]
            xs.append(x)
            ys.append(y)
            if whiskers:
                lo.append(y - cell["min_mpps"])
                hi.append(cell["max_mpps"] - y)
            tops.append(max(y, cell["max_mpps"]) if whiskers else y)
            r = cell.get(ratio)
            labels.append(f"{r:.2f}x" if r is not None else "")
        err = [lo, hi] if whiskers else None
        bars = ax.bar(xs, ys, width, yerr=err, capsize=3, label=mode, color=COLORS.get(mode))
        for b, top, lab in zip(bars, tops, labels):
            ax.annotate(lab, (b.get_x() + b.get_width() / 2, top), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{s} B\n{flows_label(f)}" for s, f in groups])
    ax.set_ylabel("Mpps")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.2)
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    ax.grid(axis="y", alpha=0.3)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        data = json.load(f)
    results = data["results"]
    groups = sorted({(c["size"], c["flows"]) for c in results})
    present = {c["mode"] for c in results}
    modes = [m for m in MODE_ORDER if m in present] + sorted(present - set(MODE_ORDER))

    hints = data.get("hints")
    crr = data.get("tcp_crr")
    base = "kernel-ct" if data.get("bench") == "stateful" else "kernel"
    if crr:
        hints = None
        fig = plt.figure(figsize=(15, 9))
        grid = fig.add_gridspec(2, 2, height_ratios=[3, 2])
        axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 0])]
    elif hints:
        fig = plt.figure(figsize=(15, 9))
        grid = fig.add_gridspec(2, 2, height_ratios=[3, 2])
        axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 0])]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(15, 4.5))
    panel(axes[0], results, groups, modes, "median_mpps", "ratio_to_kernel", True,
          f"Forwarded Mpps (wall clock; median, min-max; label: x {base})")
    panel(axes[1], results, groups, modes, "median_mpps_per_cpu_s", "ratio_to_kernel_per_cpu_s", False,
          "Forwarded Mpps per CPU-second of the shared core")
    if hints:
        hints_panel(axes[2], hints)
    if crr:
        crr_panel(axes[2], crr)
    name = "fastpath bench stateful (nft ruleset + conntrack)" if base == "kernel-ct" else "fastpath bench"
    if data.get("family") == "ipv6":
        name += ", IPv6/UDP"
    fig.suptitle(f"{name}: generator - router - sink on one CPU "
                 f"(kernel {data.get('kernel_release', '?')}, {data.get('reps')} x {data.get('duration_s')} s)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
