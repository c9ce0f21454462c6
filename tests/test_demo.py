"""`make demo` end to end (tests/demo.py): it runs, its traffic goes through
the fast path (the status after it counts what the status before did not),
the benchmark prints kernel and fastpath side by side, and every namespace
the demo made is gone afterwards. Not a timing test: no rate is judged."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from lab import REPO


def section(out: str, title: str) -> str:
    """The text between the demo's banner `title` and the next banner."""
    start = out.index(f"== {title}")
    end = out.find("\n\033[1m== ", start + 1)
    return out[start:end if end >= 0 else len(out)]


def forwarded(status_text: str) -> int:
    """The packets `fastpath status` counts as forwarded over all interfaces
    (its "(total)" row; none before the first packet)."""
    m = re.search(r"^\(total\)\s+forwarded\s+(\d+)", status_text, re.M)
    return int(m.group(1)) if m else 0


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {n["name"] for n in json.loads(out or "[]")}


def test_demo_runs_forwards_and_tears_down(fastpath_bin, tmp_path):
    cmd = [sys.executable, str(REPO / "tests" / "demo.py"), "--bench-out", str(tmp_path), "--no-rt"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    out = p.stdout
    assert p.returncode == 0, f"demo exited {p.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{p.stderr[-2000:]}"

    titles = ["fastpath status, before traffic", "traffic: ping", "fastpath status, after traffic",
              "benchmark: kernel forwarding vs fastpath", "demo done"]
    at = [out.index(f"== {t}") for t in titles]
    assert at == sorted(at), f"demo sections out of order: {list(zip(titles, at))}"

    before = forwarded(section(out, titles[0]))
    after_text = section(out, titles[2])
    after = forwarded(after_text)
    # 2 x 2000 UDP datagrams alone, besides the pings and the TCP transfer.
    assert after - before >= 4000, f"fast path forwarded {after - before} packets of the demo's traffic:\n{after_text}"

    rep = json.loads((tmp_path / "forward.json").read_text())
    rates = {c["mode"]: c for c in rep["results"]}
    assert {"kernel", "fastpath", "raw"} <= set(rates), sorted(rates)
    assert all(r["mpps"] > 0 for c in rates.values() for r in c["reps"]), rep["results"]

    names = re.search(r"== lab: (\S+) \(c0\) -- \(r0\) (\S+) \(r1\) -- \(s0\) (\S+)", out)
    assert names, out[:2000]
    left = set(names.groups()) & netns_names()
    assert not left, f"the demo left namespaces behind: {left}"
    assert "XDP still attached: none" in out, out
