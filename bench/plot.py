#!/usr/bin/env python3
"""Grouped bar chart of `fastpath bench` results.

Usage: plot.py forward.json forward.png

One group of bars per (frame size, flows), one bar per mode; the bar is the
median over repetitions, the whisker spans min..max, the label is the ratio to
the kernel. Left panel: Mpps by wall clock. Right panel: Mpps per second of the
bench CPU's time, the fairer figure when the box was shared (see README.md).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODE_ORDER = ["kernel", "fastpath", "raw"]
COLORS = {"kernel": "#7f7f7f", "fastpath": "#1f77b4", "raw": "#2ca02c"}


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
    ax.set_xticklabels([f"{s} B\n{f} flow{'s' if f != 1 else ''}" for s, f in groups])
    ax.set_ylabel("Mpps")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.2)
    ax.legend(fontsize=8, loc="upper left", ncol=len(modes))
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

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panel(axes[0], results, groups, modes, "median_mpps", "ratio_to_kernel", True,
          "Forwarded Mpps (wall clock; median, min-max)")
    panel(axes[1], results, groups, modes, "median_mpps_per_cpu_s", "ratio_to_kernel_per_cpu_s", False,
          "Forwarded Mpps per CPU-second of the shared core")
    fig.suptitle(f"fastpath bench: generator - router - sink on one CPU "
                 f"(kernel {data.get('kernel_release', '?')}, {data.get('reps')} x {data.get('duration_s')} s)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
