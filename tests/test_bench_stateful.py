"""`fastpath bench stateful`, cut to its connection-rate part's plumbing: real
TCP connections through kernel-ct and fastpath-stateful with the hosts'
NIC-like hop (bench/README.md, "Router ingress"). Not a timing test: it
checks that connections complete, none fail, and fastpath carried its
share of every connection, never how many per second."""

from __future__ import annotations

import json
import subprocess

from lab import FASTPATH


def test_bench_stateful_connections_through_the_nic_like_hop(fastpath_bin, tmp_path):
    cmd = [str(FASTPATH), "bench", "stateful", "--no-rt", "--modes", "kernel-ct,fastpath-stateful",
           "--flows", "1", "--reps", "1", "--duration", "0.2", "--crr-reps", "1", "--crr-duration", "0.5",
           "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    rep = json.loads((tmp_path / "stateful.json").read_text())
    assert rep["crr_ingress"] == "frames"
    rows = {r["mode"]: r for r in rep["tcp_crr"] if r["variant"] is None}
    assert set(rows) == {"kernel-ct", "fastpath-stateful"}, rep["tcp_crr"]
    for mode, r in rows.items():
        done = sum(x["completed"] for x in r["reps"])
        assert done > 100 and r["failed"] == 0, f"{mode}: {r['reps']}"
    # Every connection: SYN, SYN-ACK and the FINs to the kernel, its data
    # fast. A hop that delivered nothing as frames, or a gate that punted
    # everything, would leave `forwarded` at 0.
    fp = rows["fastpath-stateful"]
    done = sum(x["completed"] for x in fp["reps"])
    v = fp["fastpath_verdicts"]
    assert v["forwarded"] >= done, v
    reasons = dict(v["punted_by_reason"])
    assert reasons.get("ct_tcp_flags", 0) >= 2 * done, v
