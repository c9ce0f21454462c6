#!/usr/bin/env python3
"""Bar chart of `fastpath bench table1` (paper 000's Table 1).

Usage: plot_table1.py table1.json table1.png

One group of bars per (target, route source), one bar per reservation model:
left the control latency (first route sent -> the model's last answer),
then the last route's forwarding delay, the data-plane outage (first echo
reply) and when every route was in the map. Medians over the repetitions; the dashed lines are the issue's
targets for the BPF target.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    with open(src) as f:
        rep = json.load(f)
    rows = rep["rows"]
    groups = []
    for r in rows:
        g = (r["target"], r["source"])
        if g not in groups:
            groups.append(g)
    models = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    panels = [("control_ms", "control latency (ms)", None),
              ("forward_ms", "last-route forwarding (ms)", rep["target"]["max_forward_ms"]),
              ("outage_s", "data-plane outage (s)", rep["target"]["max_outage_s"]),
              ("all_in_map_ms", "all routes in the map (ms from t0)", None)]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    width = 0.8 / max(len(models), 1)
    for ax, (key, title, target) in zip(axes, panels):
        for mi, m in enumerate(models):
            xs, ys = [], []
            for gi, g in enumerate(groups):
                r = next((r for r in rows if (r["target"], r["source"]) == g and r["model"] == m), None)
                if r is not None and r.get(key) is not None:
                    xs.append(gi + (mi - (len(models) - 1) / 2) * width)
                    ys.append(r[key])
            ax.bar(xs, ys, width, label=m)
        if target is not None:
            ax.axhline(target, linestyle="--", color="black", linewidth=0.8, label="target (bpf)")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{t}\n{s}" for t, s in groups])
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"fastpath bench table1: {rep['routes']} routes, sim-asic "
                 f"{rep['sim_write_us']} µs/write, {rep['sim_query_us']} µs/query")
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
