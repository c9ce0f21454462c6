"""Hitless restart: `fastpath run --pin`, kill -9, adopt, take over, detach.

Each test mounts its own bpffs under the lab's temporary directory and
pins there (--pin-dir), so parallel runs never share pins; teardown runs
`fastpath detach` and unmounts it, also on failure. The daemon runs under
`ip netns exec`, whose private mount namespace still sees that mount.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from lab import FASTPATH, Capture, Daemon, Lab, Sender, counter_delta, in_netns, sh
from pkts import udp4, udp_series


def pin_lab(lab: Lab) -> Path:
    """A bpffs of this lab's own; returns the pin directory on it."""
    mnt = lab.tmp / "bpffs"
    mnt.mkdir()
    sh("mount", "-t", "bpf", "bpf", str(mnt))
    lab.defer(lambda: sh("umount", "-l", str(mnt), check=False))
    pin_dir = mnt / "fastpath"
    # Runs after every daemon of the test is gone (undo order is reversed).
    lab.defer(lambda: sh(str(FASTPATH), "detach", "--pin-dir", str(pin_dir), check=False))
    return pin_dir


def pinned(lab: Lab, pin_dir: Path, *extra: str) -> Daemon:
    return Daemon(lab, extra=["--pin", "--pin-dir", str(pin_dir), *extra])


def kill9(d: Daemon) -> None:
    assert d.proc is not None and d.proc.poll() is None
    os.kill(d.proc.pid, signal.SIGKILL)
    d.proc.wait()
    d.lab.daemon = None


def xdp_prog_ids(lab: Lab) -> dict[str, int]:
    out = json.loads(lab.ip(lab.router, "-j", "-d", "link", "show").stdout)
    ids = {}
    for link in out:
        xdp = link.get("xdp")
        if xdp and "prog" in xdp:
            ids[link["ifname"]] = xdp["prog"]["id"]
    return ids


class Watch:
    """Samples the router's XDP program ids until stopped; remembers any
    sample in which a managed interface had none."""

    def __init__(self, lab: Lab, ifaces=("r0", "r1")):
        self.lab, self.ifaces = lab, ifaces
        self.gaps: list[str] = []
        self.seen: dict[str, set[int]] = {i: set() for i in ifaces}
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            ids = xdp_prog_ids(self.lab)
            self.samples += 1
            for i in self.ifaces:
                if i in ids:
                    self.seen[i].add(ids[i])
                else:
                    self.gaps.append(i)

    def __enter__(self) -> "Watch":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


class UdpCounter:
    """A UDP socket on the server counting the numbered datagrams it gets."""

    def __init__(self, lab: Lab, port: int = 9):
        with in_netns(lab.server):
            self.s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            self.s.bind(("0.0.0.0", port))
        self.s.settimeout(0.2)
        self.seqs: set[int] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.s.recv(2048)
            except socket.timeout:
                continue
            if data.startswith(b"fastpath-"):
                self.seqs.add(int(data[9:17]))

    def close(self, drain: float = 0.5) -> None:
        time.sleep(drain)
        self._stop.set()
        self._t.join()
        self.s.close()


def stream(lab: Lab, n: int, pps: int, events: dict[int, callable]) -> None:
    """n numbered UDP datagrams client -> server at `pps`; events[i]() runs
    (in another thread, so the stream keeps its pace) when datagram i goes."""
    frames = udp_series(udp4, lab, range(n))
    tx = Sender(lab.c0)
    threads = []
    try:
        t0 = time.monotonic()
        for i, f in enumerate(frames):
            target = t0 + i / pps
            while time.monotonic() < target:
                time.sleep(0.0002 if target - time.monotonic() > 0.001 else 0)
            tx.send(f)
            if i in events:
                t = threading.Thread(target=events[i])
                t.start()
                threads.append(t)
    finally:
        tx.close()
        for t in threads:
            t.join()


def iperf_tcp(lab: Lab, seconds: int) -> subprocess.Popen:
    srv = subprocess.Popen(["ip", "netns", "exec", lab.server, "iperf3", "-s", "-1", "-B", lab.FAR4, "-p", "5201"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lab.defer(lambda: (srv.poll() is None and srv.kill(), srv.wait()))
    time.sleep(0.3)
    cli = subprocess.Popen(["ip", "netns", "exec", lab.client, "iperf3", "-c", lab.FAR4, "-p", "5201",
                            "-t", str(seconds), "-b", "20M", "-J"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    lab.defer(lambda: (cli.poll() is None and cli.kill(), cli.wait()))
    return cli


def test_kill9_under_traffic_then_restart_takes_over(lab, fastpath_bin):
    pin_dir = pin_lab(lab)
    d = pinned(lab, pin_dir).start()
    before_ids = xdp_prog_ids(lab)
    assert set(before_ids) == {"r0", "r1"}
    c0 = d.counters("r0")

    pps, seconds = 3000, 8
    n = pps * seconds
    counter = UdpCounter(lab)
    tcp = iperf_tcp(lab, seconds)
    state: dict[str, object] = {}

    def kill():
        kill9(d)
        state["after_kill"] = xdp_prog_ids(lab)

    def restart():
        d2 = pinned(lab, pin_dir)
        with Watch(lab) as w:
            d2.start()
            time.sleep(0.3)
        state["d2"], state["watch"] = d2, w

    stream(lab, n, pps, {pps * 2: kill, pps * 4: restart})
    counter.close()
    out, err = tcp.communicate(timeout=30)

    d2: Daemon = state["d2"]  # type: ignore[assignment]
    w: Watch = state["watch"]  # type: ignore[assignment]
    # kill -9 left the programs attached and forwarding
    assert state["after_kill"] == before_ids
    # the restart swapped each program in its link, with no sample showing none
    after_ids = xdp_prog_ids(lab)
    assert set(after_ids) == {"r0", "r1"}
    for i in ("r0", "r1"):
        assert after_ids[i] != before_ids[i], f"{i}: program not swapped"
    assert not w.gaps, f"XDP detached during the take-over: {w.gaps} ({w.samples} samples)"
    assert "took over the pinned XDP link" in d2.log_text()

    lost = n - len(counter.seqs)
    assert lost <= n * 0.001, f"{lost} of {n} datagrams lost across kill -9 and restart"
    # the fast path carried them (counters live in the pinned maps: one series)
    fwd = counter_delta(c0, d2.counters("r0")).get("forwarded", 0)
    assert fwd >= n * 0.99, f"only {fwd} of {n} forwarded by XDP"

    assert tcp.returncode == 0, err
    res = json.loads(out)
    assert "error" not in res, res.get("error")
    assert res["end"]["sum_received"]["bytes"] > 0
    assert d2.stop() == 0
    # SIGTERM with --pin leaves XDP attached
    assert set(xdp_prog_ids(lab)) == {"r0", "r1"}


def test_route_changed_while_dead_is_corrected(lab2, fastpath_bin):
    lab = lab2
    pin_dir = pin_lab(lab)
    extra = lab.REMOTE4.replace("/24", "/25")  # 203.0.113.0/25, only while the first daemon runs
    lab.ip(lab.router, "route", "add", extra, "via", lab.S4)
    d = pinned(lab, pin_dir).start()
    d.wait_converged()
    assert any(r.get("prefix") == extra for r in d.routes()), d.routes()
    kill9(d)

    # While nobody mirrors: the remote prefix moves to s1's path, the /25 goes.
    lab.ip(lab.router, "route", "replace", lab.REMOTE4, "via", lab.S1_4)
    lab.ip(lab.router, "route", "del", extra)

    d2 = pinned(lab, pin_dir).start()
    d2.wait_converged()
    routes = {r.get("prefix"): r for r in d2.routes()}
    assert extra not in routes, f"stale route from the dead daemon's time kept: {routes[extra]}"
    assert lab.REMOTE4 in routes
    # and the fast path now sends it the way the kernel does: out r2 to s1.
    # s1 was never spoken to: the first packets wait for the kernel's ARP
    # (how many depends on the machine's speed, not on fastpath), then,
    # with the neighbour mirrored, every packet goes fast.
    for settled in (False, True):
        c0 = d2.counters("r0")
        with Capture([lab.s0, lab.s1]) as cap:
            tx = Sender(lab.c0)
            for i in range(50):
                tx.send(bytes(udp4(lab, seq=i)))
            tx.close()
            got = cap.collect()
        assert len(got["s1"]) == 50 and not got["s0"], {k: len(v) for k, v in got.items()}
        delta = counter_delta(c0, d2.counters("r0"))
        if settled:
            assert delta.get("forwarded", 0) == 50, delta
        else:
            assert delta.get("forwarded", 0) + delta.get("no_neigh", 0) == 50, delta
            d2.wait_neighbours_mirrored()
    assert d2.stop() == 0


def test_orphan_grace_expiry_punts_to_the_kernel(lab, fastpath_bin):
    pin_dir = pin_lab(lab)
    d = pinned(lab, pin_dir, "--orphan-grace", "2").start()
    c0 = d.counters("r0")
    kill9(d)
    time.sleep(3.5)  # past the grace: no heartbeat for > 2 s
    counter = UdpCounter(lab)
    stream(lab, 100, 1000, {})
    counter.close()
    # the kernel forwarded every one of them
    assert len(counter.seqs) == 100
    # counters survive in the pinned maps: the next daemon shows what happened
    d2 = pinned(lab, pin_dir, "--orphan-grace", "2").start()
    delta = counter_delta(c0, d2.counters("r0"))
    assert delta.get("orphaned", 0) >= 100, delta
    assert delta.get("forwarded", 0) == 0, delta
    # a live daemon's heartbeat forwards again
    c1 = d2.counters("r0")
    counter = UdpCounter(lab)
    stream(lab, 100, 1000, {})
    counter.close()
    assert len(counter.seqs) == 100
    assert counter_delta(c1, d2.counters("r0")).get("forwarded", 0) == 100
    assert d2.stop() == 0


def test_sigterm_keeps_forwarding_and_detach_removes_everything(lab, fastpath_bin):
    pin_dir = pin_lab(lab)
    d = pinned(lab, pin_dir).start()
    ids = xdp_prog_ids(lab)
    assert d.stop() == 0
    assert xdp_prog_ids(lab) == ids, "SIGTERM with --pin must leave XDP attached"
    assert "leaving the pinned programs forwarding" in d.log_text()
    # still forwarding without a daemon (well within the default grace)
    counter = UdpCounter(lab)
    stream(lab, 50, 1000, {})
    counter.close()
    assert len(counter.seqs) == 50
    assert (pin_dir / "v1" / "links").is_dir()

    # in the router's namespace, where the link's ifindex names r0 and r1
    out = lab.run(lab.router, str(FASTPATH), "detach", "--pin-dir", str(pin_dir)).stdout
    assert "detached XDP from" in out and "r0" in out and "r1" in out, out
    assert not lab.xdp_attached(), lab.xdp_attached()
    assert not pin_dir.exists()
    for prog_id in ids.values():
        p = sh("bpftool", "prog", "show", "id", str(prog_id), check=False)
        assert p.returncode != 0, f"program {prog_id} still loaded after detach: {p.stdout}"
    # the kernel alone forwards
    counter = UdpCounter(lab)
    stream(lab, 50, 1000, {})
    counter.close()
    assert len(counter.seqs) == 50

    again = lab.run(lab.router, str(FASTPATH), "detach", "--pin-dir", str(pin_dir))
    assert "nothing pinned" in again.stdout


def test_incompatible_pins_are_refused_unless_replace(lab, fastpath_bin):
    pin_dir = pin_lab(lab)
    d = pinned(lab, pin_dir).start()
    ids = xdp_prog_ids(lab)
    assert d.stop() == 0

    bad = pinned(lab, pin_dir, "--fib4-entries", "1000")
    with pytest.raises(RuntimeError) as e:
        bad.start()
    msg = str(e.value)
    assert "fp_fib4 max_entries is 65536, this run needs 1000" in msg, msg
    assert "--replace" in msg
    assert xdp_prog_ids(lab) == ids, "a refused start must not touch the running programs"

    # another layout version under the same directory is refused too
    (pin_dir / "v0").mkdir()
    with pytest.raises(RuntimeError) as e:
        pinned(lab, pin_dir).start()
    assert "another layout (v0)" in str(e.value)
    (pin_dir / "v0").rmdir()

    # --replace: fresh tables, programs still swapped in the same links
    d2 = pinned(lab, pin_dir, "--fib4-entries", "1000", "--replace").start()
    new = xdp_prog_ids(lab)
    assert set(new) == {"r0", "r1"} and all(new[i] != ids[i] for i in new)
    c0 = d2.counters("r0")
    counter = UdpCounter(lab)
    stream(lab, 50, 1000, {})
    counter.close()
    assert len(counter.seqs) == 50
    # fresh tables: a neighbour gone stale meanwhile is re-learnt by the kernel first
    delta = counter_delta(c0, d2.counters("r0"))
    assert delta.get("forwarded", 0) >= 40 and delta.get("forwarded", 0) + delta.get("no_neigh", 0) == 50, delta
    assert d2.stop() == 0


def test_interface_not_asked_again_is_detached(lab2, fastpath_bin):
    lab = lab2
    pin_dir = pin_lab(lab)
    d = pinned(lab, pin_dir).start()
    assert set(xdp_prog_ids(lab)) == {"r0", "r1", "r2"}
    kill9(d)
    d2 = Daemon(lab, ifaces=["r0", "r1"], extra=["--pin", "--pin-dir", str(pin_dir)]).start()
    assert set(xdp_prog_ids(lab)) == {"r0", "r1"}
    assert not (pin_dir / "v1" / "links" / str(json.loads(
        lab.ip(lab.router, "-j", "link", "show", "dev", "r2").stdout)[0]["ifindex"])).exists()
    st = d2.status()
    assert [i["name"] for i in st["interfaces"]] == ["r0", "r1"]
    assert d2.stop() == 0


def test_stateful_restart_moves_the_ct_generation_on(lab, fastpath_bin):
    """Verdicts the pinned programs cached stay in the pinned maps with the
    old run's conntrack generation; the next run must continue past it, not
    start again at 1, or verdicts cached early in the old run would be
    trusted again without a conntrack lookup."""
    pin_dir = pin_lab(lab)
    # The stateful program takes the verifier a while on a busy machine.
    d = pinned(lab, pin_dir, "--mode", "stateful").start()
    # A ruleset commit bumps the generation; commits that arrive in one
    # daemon round share a bump, so each waits for the previous one's.
    old = d.status()["conntrack"]["generation"]
    for i in range(3):
        lab.run(lab.router, "nft", "add", "table", "inet", f"fp_gen_{i}")
        deadline = time.monotonic() + 5
        while (gen := d.status()["conntrack"]["generation"]) <= old and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gen > old, d.status()["conntrack"]
        old = gen
    assert d.stop() == 0
    d2 = pinned(lab, pin_dir, "--mode", "stateful").start()
    new = d2.status()["conntrack"]["generation"]
    assert new > old, f"generation {new} after the restart, {old} before"
    assert d2.stop() == 0
