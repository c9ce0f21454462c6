"""`fastpath bench points --quick` smoke test: the execution-point study runs
end to end and every point handles traffic. Not a timing test: it checks that
each point's cell exists and counted packets, never how many per second. On a
kernel that refuses BPF_PROG_RUN live frames (this project's since 2026-12-06)
the study has no frame source: then it checks the refusal is one clear line
and writes nothing."""

from __future__ import annotations

import json
import subprocess

from lab import FASTPATH

POINTS = {"native", "generic", "tc", "afxdp"}


def test_bench_points_refuses_without_a_frame_source(fastpath_bin, tmp_path):
    out = tmp_path / "points.json"
    cmd = [str(FASTPATH), "bench", "points", "--quick", "--workloads", "drop", "--no-rt",
           "--json", str(out), "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if run.returncode == 0:
        # A kernel with live frames: the study ran; the smoke test below checks it.
        return _check_points_report(out, run.stdout)
    assert "its programs drop every frame" in run.stderr and "EPERM" in run.stderr, run.stderr
    assert run.stderr.strip().count("\n") == 0, f"one line, not a trace: {run.stderr}"
    assert not out.exists(), "nothing half-written"


def _check_points_report(out, stdout):
    rep = json.loads(out.read_text())
    assert rep["bench"] == "points"
    cells = {c["point"]: c for c in rep["drop"]}
    assert set(cells) == POINTS, rep["drop"]
    for point, c in cells.items():
        assert c["workload"] == "drop" and c["flows"] == 1 and c["cores"] == 1
        assert c["packets"] > 0, f"{point}: no packets handled"
        assert c["median_mpps"] > 0
    assert rep["nic_offload"].startswith("not available")
    assert "(a) drop everything" in stdout
