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


def test_bench_stateful_ipv6_flows_through_every_mode(fastpath_bin, tmp_path):
    """`--family 6`: established IPv6/UDP flows through the ruleset; the conntrack-lookup
    reference and fastpath forward them themselves (their own counters say so), and the
    IPv4-only parts are refused or left out with a reason."""
    modes = ["kernel-ct", "ct-ref", "fastpath-stateful", "raw"]
    # On CPU 1: the connection-rate test above and the forward bench tests pin to CPU 0.
    cmd = [str(FASTPATH), "bench", "stateful", "--family", "6", "--no-rt", "--cpu", "1", "--modes", ",".join(modes),
           "--flows", "1,50", "--reps", "1", "--duration", "0.2", "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert "IPv6 traffic" in run.stdout and "connections/s part runs IPv4" in run.stdout, run.stdout
    rep = json.loads((tmp_path / "stateful.json").read_text())
    assert rep["family"] == "ipv6" and rep["tcp_crr"] == [], rep
    cells = {(c["mode"], c["flows"]): c for c in rep["results"]}
    assert set(cells) == {(m, f) for m in modes for f in (1, 50)}, list(cells)
    for key, c in cells.items():
        assert c["size"] == 84 and all(r["mpps"] > 0 for r in c["reps"]), f"{key}: {c['reps']}"
    ct = rep["ct_ref_verdicts"]
    assert ct["forwarded"] > 0 and ct["passed"] <= ct["forwarded"] // 100, ct
    v = rep["fastpath_verdicts"]["fastpath-stateful"]
    # The first packet of each of the 49 other flows goes to the kernel, which marks it again.
    assert v["forwarded"] > 0 and v["punted"] <= 50, v
    assert "fastpath-stateful 84 B 1 flow(s): " in run.stdout, run.stdout

    bad = [str(FASTPATH), "bench", "stateful", "--family", "6", "--snat", "--no-rt", "--out", str(tmp_path / "bad")]
    run = subprocess.run(bad, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "--snat" in run.stderr and "IPv4" in run.stderr, run.stderr
    assert not (tmp_path / "bad").exists()
