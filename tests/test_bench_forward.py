"""`fastpath bench --quick` with the AF_XDP modes: the AF_XDP forwarder and the
transmit-alone ceiling (afxdp-tx) run end to end and their frames reach the
sink. Not a timing test: it checks that every cell exists and counted frames,
never how many per second."""

from __future__ import annotations

import json
import subprocess

from lab import FASTPATH

MODES = {"fastpath", "afxdp", "afxdp-tx"}


def test_bench_quick_afxdp_modes(fastpath_bin, tmp_path):
    # Normal scheduling: a smoke run on a shared box has no business taking a CPU.
    cmd = [str(FASTPATH), "bench", "--quick", "--no-rt", "--no-hints", "--modes", ",".join(sorted(MODES)),
           "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    rep = json.loads((tmp_path / "forward.json").read_text())
    cells = {c["mode"]: c for c in rep["results"]}
    assert set(cells) == MODES, rep["results"]
    for mode, c in cells.items():
        assert c["size"] == 64 and c["flows"] == 1
        assert len(c["reps"]) == 2 and all(r["mpps"] > 0 for r in c["reps"]), f"{mode}: {c['reps']}"
    # The AF_XDP forwarder's frames went through fastpath's program into the sockets (next to no
    # punts: ARP or ND may pass).
    v = rep["fastpath_verdicts"]["afxdp"]
    assert v["forwarded"] > 0 and v["punted"] <= v["forwarded"] // 100, v
    # Frames offered are counted where the loop goes round: for afxdp that is the forwarder's CPU.
    for mode in ("fastpath", "afxdp"):
        assert all(r["offered_mpps"] >= 0.99 * r["mpps"] for r in cells[mode]["reps"]), cells[mode]["reps"]
    for mode in ("afxdp", "afxdp-tx"):
        assert f"{mode} 64 B 1 flow(s): " in run.stdout and "% of fastpath (wall)" in run.stdout


def test_bench_quick_hint_mode_takes_the_generators_hints(fastpath_bin, tmp_path):
    """fastpath-hint: the loop's generator gives every frame a metadata hint and fastpath takes
    its flow hash from there, not from its own hash (the bench itself fails a cell where it did
    not). A kernel that refuses bpf_xdp_adjust_meta to XDP programs must get the reason, not a
    run without hints."""
    cmd = [str(FASTPATH), "bench", "--quick", "--no-rt", "--no-hints", "--modes", "fastpath,fastpath-hint",
           "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        assert "refuses bpf_xdp_adjust_meta" in run.stderr, f"{' '.join(cmd)}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        assert not (tmp_path / "forward.json").exists()
        return
    rep = json.loads((tmp_path / "forward.json").read_text())
    v = rep["fastpath_verdicts"]
    hint, plain = v["fastpath-hint"], v["fastpath"]
    # The kernel's own frames (ARP, ND) have no hint; the loop's all do.
    assert hint["forwarded"] > 0 and hint["hash_meta"] >= hint["forwarded"] * 0.99, hint
    assert hint["hash_software"] <= hint["forwarded"] // 1000, hint
    assert plain["hash_meta"] == 0 and plain["hash_software"] > 0, plain
    # fastpath forwards every frame, so each repetition's loop kept all its frames to the end.
    for c in rep["results"]:
        assert all(r["lost_frames"] == 0 for r in c["reps"]), c


def test_bench_quick_ipv6_forwards_ipv6_in_every_mode(fastpath_bin, tmp_path):
    """`--family 6`: the lab routes IPv6, the generator sends IPv6/UDP (84 B, the IPv4 run's 64 B
    payload), and every mode, fastpath included, forwards it to the sink; the IPv4-only hints
    section is left out with its reason. Bad combinations are refused before anything is built."""
    modes = ["kernel", "fib-fwd", "fastpath", "raw"]
    # On CPU 1: the other bench tests (and the stateful connection-rate one, a loaded
    # CPU's first victim) pin to CPU 0, and another worker may be running one.
    cmd = [str(FASTPATH), "bench", "--quick", "--no-rt", "--cpu", "1", "--family", "6", "--modes", ",".join(modes),
           "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert "IPv6 traffic" in run.stdout and "hints (BPF_PROG_RUN): left out" in run.stdout, run.stdout
    rep = json.loads((tmp_path / "forward.json").read_text())
    assert rep["family"] == "ipv6" and rep["target"]["size"] == 84 and rep["hints"] is None, rep
    cells = {c["mode"]: c for c in rep["results"]}
    assert set(cells) == set(modes), rep["results"]
    for mode, c in cells.items():
        assert c["size"] == 84 and c["flows"] == 1
        assert len(c["reps"]) == 2 and all(r["mpps"] > 0 for r in c["reps"]), f"{mode}: {c['reps']}"
        # The XDP routers forward every frame: their loops kept all of them to the end (the
        # kernel's may lose one to its own queues).
        if mode != "kernel":
            assert all(r["lost_frames"] == 0 for r in c["reps"]), f"{mode}: {c['reps']}"
    v = rep["fastpath_verdicts"]["fastpath"]
    assert v["forwarded"] > 0 and v["punted"] <= v["forwarded"] // 100, v
    assert v["cache_hits"] >= v["forwarded"] * 0.99, v
    assert "fastpath 84 B 1 flow(s), 100% cache hits" in run.stdout, run.stdout

    for bad, why in ((["--sizes", "64"], "IPv6 frame size 64 outside 66..=1518"),
                     (["--modes", "afxdp"], "AF_XDP modes are measured with IPv4 traffic only")):
        cmd = [str(FASTPATH), "bench", "--no-rt", "--family", "6", *bad, "--out", str(tmp_path / "bad")]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and why in run.stderr, f"{bad}: {run.stderr}"
        assert not (tmp_path / "bad").exists()


def test_bench_daemon_args_reach_the_daemons(fastpath_bin, tmp_path):
    """`--daemon-arg` (repeatable) goes to the fastpath modes' daemons, and forward.json records
    it. With `--flow-timeout 0` the fastpath mode's daemon runs without its cache, which the bench
    refuses to report as that mode; an option the daemon refuses fails the bench with the
    daemon's own reason."""
    base = [str(FASTPATH), "bench", "--quick", "--no-rt", "--no-hints", "--modes", "fastpath"]

    def bench(*args: str, out: str) -> subprocess.CompletedProcess:
        return subprocess.run(base + list(args) + ["--out", str(tmp_path / out)],
                              capture_output=True, text=True, timeout=120)

    run = bench("--daemon-arg=--fib4-index", "--daemon-arg", "dir24", out="ok")
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert "fastpath daemons run with: --fib4-index dir24" in run.stdout, run.stdout
    rep = json.loads((tmp_path / "ok" / "forward.json").read_text())
    assert rep["daemon_args"] == ["--fib4-index", "dir24"], rep["daemon_args"]
    v = rep["fastpath_verdicts"]["fastpath"]
    assert v["forwarded"] > 0 and v["cache_hits"] > 0, v

    run = bench("--daemon-arg=--flow-timeout", "--daemon-arg=0", out="nocache")
    assert run.returncode != 0 and "the flow cache was never looked up" in run.stderr, run.stderr

    run = bench("--daemon-arg=--no-such-option", out="bad")
    assert run.returncode != 0 and "--no-such-option" in run.stderr, run.stderr
    assert not (tmp_path / "bad" / "forward.json").exists()
