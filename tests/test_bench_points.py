"""`fastpath bench points --quick` smoke test: the execution-point study runs
end to end and every point handles traffic. Not a timing test: it checks that
each point's cell exists and counted packets, never how many per second."""

from __future__ import annotations

import json
import subprocess

from lab import FASTPATH

POINTS = {"native", "generic", "tc", "afxdp"}


def test_bench_points_quick_drop_every_point(fastpath_bin, tmp_path):
    out = tmp_path / "points.json"
    # Normal scheduling: a smoke run on a shared box has no business taking a CPU.
    cmd = [str(FASTPATH), "bench", "points", "--quick", "--workloads", "drop", "--no-rt",
           "--json", str(out), "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    rep = json.loads(out.read_text())
    assert rep["bench"] == "points"
    cells = {c["point"]: c for c in rep["drop"]}
    assert set(cells) == POINTS, rep["drop"]
    for point, c in cells.items():
        assert c["workload"] == "drop" and c["flows"] == 1 and c["cores"] == 1
        assert c["packets"] > 0, f"{point}: no packets handled"
        assert c["median_mpps"] > 0
    assert rep["nic_offload"].startswith("not available")
    assert "(a) drop everything" in run.stdout
