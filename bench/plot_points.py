#!/usr/bin/env python3
"""Figures of `fastpath bench points`, after paper 003 (execution points).

Usage: plot_points.py points.json points.png

Panels (each only when the JSON has its workload):
  drop      Mpps when dropping everything, grouped by (flows, cores), one bar per
            point (the paper's Figure 2); whiskers span min..max.
  csum      Mpps against N checksums per frame, one line per point (Figure 3).
  cpu       CPU time per frame split into user / system / softirq, per point,
            for the drop cells and the largest N (Figure 8's question: where did
            the time go).
  maps      map updates per second from user space, log scale (Figure 6).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["native", "generic", "tc", "afxdp"]
COLORS = {"native": "#2ca02c", "generic": "#1f77b4", "tc": "#ff7f0e", "afxdp": "#9467bd"}
SPLIT = [("ns_per_packet_softirq", "softirq", "#d62728"),
         ("ns_per_packet_system", "system", "#7f7f7f"),
         ("ns_per_packet_user", "user", "#17becf")]


def points_of(cells):
    present = {c["point"] for c in cells}
    return [p for p in ORDER if p in present] + sorted(present - set(ORDER))


def drop_panel(ax, cells):
    groups = sorted({(c["flows"], c["cores"]) for c in cells})
    pts = points_of(cells)
    width = 0.8 / max(len(pts), 1)
    for i, p in enumerate(pts):
        xs, ys, lo, hi = [], [], [], []
        for g, (flows, cores) in enumerate(groups):
            c = next((c for c in cells if c["point"] == p and c["flows"] == flows and c["cores"] == cores), None)
            if c is None:
                continue
            xs.append(g + (i - (len(pts) - 1) / 2) * width)
            ys.append(c["median_mpps"])
            lo.append(c["median_mpps"] - c["min_mpps"])
            hi.append(c["max_mpps"] - c["median_mpps"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=p, color=COLORS.get(p))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{f} flow{'s' if f != 1 else ''}\n{c} core{'s' if c != 1 else ''}" for f, c in groups])
    ax.set_ylabel("Mpps")
    ax.set_title("(a) Drop everything, 64 B (median, min-max)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def csum_panel(ax, cells):
    for p in points_of(cells):
        row = sorted((c for c in cells if c["point"] == p), key=lambda c: c["n"])
        ax.errorbar([c["n"] for c in row], [c["median_mpps"] for c in row],
                    yerr=[[c["median_mpps"] - c["min_mpps"] for c in row],
                          [c["max_mpps"] - c["median_mpps"] for c in row]],
                    marker="o", capsize=3, label=p, color=COLORS.get(p))
    ax.set_xlabel("IPv4 header checksums per frame (N)")
    ax.set_ylabel("Mpps")
    ax.set_title("(b) Packet rate against processing per frame (1 flow, 1 core)", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def cpu_panel(ax, drop, csum):
    bars = []
    for c in drop:
        if c["flows"] == min(d["flows"] for d in drop) and c["cores"] == 1:
            bars.append((f"{c['point']}\ndrop", c))
    if csum:
        top = max(c["n"] for c in csum)
        bars += [(f"{c['point']}\nN={top}", c) for c in csum if c["n"] == top]
    xs = range(len(bars))
    bottom = [0.0] * len(bars)
    for key, label, color in SPLIT:
        ys = [c[key] for _, c in bars]
        ax.bar(xs, ys, 0.6, bottom=bottom, label=label, color=color)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_xticks(list(xs))
    ax.set_xticklabels([n for n, _ in bars], fontsize=8)
    ax.set_ylabel("CPU ns per frame")
    ax.set_title("(f) Where the CPU time went (/proc/stat of the CPUs in use)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def maps_panel(ax, rows):
    rows = [r for r in rows if not r.get("error")]
    labels = [f"{r['point']}\n{r['map']} {r['entries'] // 1000}k\n{r['method']}" for r in rows]
    colors = [COLORS["afxdp"] if r["point"] == "afxdp" else ("#2ca02c" if r["method"] == "batch" else "#98df8a")
              for r in rows]
    ax.bar(range(len(rows)), [r["updates_per_s"] for r in rows], color=colors)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("updates / s")
    ax.set_title("(e) Table updates from user space (bpf-map: what XDP/TC read)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        data = json.load(f)
    drop, csum, maps = data.get("drop") or [], data.get("csum") or [], data.get("maps") or []
    panels = [p for p, have in (("drop", drop), ("csum", csum), ("cpu", drop or csum), ("maps", maps)) if have]
    if not panels:
        sys.exit("nothing to plot")
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 4.5 * rows), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        if p == "drop":
            drop_panel(ax, drop)
        elif p == "csum":
            csum_panel(ax, csum)
        elif p == "cpu":
            cpu_panel(ax, drop, csum)
        else:
            maps_panel(ax, maps)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"fastpath bench points: execution points on kernel {data.get('kernel_release', '?')} "
                 f"({data.get('reps')} x {data.get('duration_s')} s per cell; NIC offload not available)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
