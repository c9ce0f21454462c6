"""Netfilter and the stateless fast path: a fast-pathed packet skips the
prerouting/forward/postrouting hooks, so fastpath refuses to start while such
base chains exist, punts everything when they appear while it runs, and only
bypasses them when told to (--allow-netfilter-bypass)."""

from __future__ import annotations

import time

from lab import FASTPATH, Daemon, Lab, counter_delta
from test_cli import one_line_error, run_in_router


def add_forward_chain(lab: Lab) -> None:
    lab.run(lab.router, "nft", "add", "table", "inet", "fw")
    lab.run(lab.router, "nft", "add", "chain", "inet", "fw", "transit",
            "{ type filter hook forward priority 0; policy accept; }")
    lab.run(lab.router, "nft", "add", "rule", "inet", "fw", "transit", "udp", "dport", "9", "drop")


def test_run_refuses_netfilter_bypass(lab, fastpath_bin):
    """A forward-hook firewall would be bypassed by stateless forwarding: refuse, name the chain."""
    add_forward_chain(lab)
    line = one_line_error(run_in_router(lab, "-i", "r0", "-i", "r1"))
    assert "inet fw transit (forward)" in line and "--allow-netfilter-bypass" in line, line
    assert not lab.xdp_attached()


def test_netfilter_bypass_allowed_explicitly(lab, fastpath_bin):
    add_forward_chain(lab)
    with Daemon(lab, extra=["--allow-netfilter-bypass"]) as d:
        assert d.status()["families"]["ipv4"]["fast_path"]
        assert "bypassed" in d.log_text()


def ping_deltas(lab: Lab, daemon: Daemon) -> dict:
    before = daemon.counters("r0")
    lab.run(lab.client, "ping", "-4", "-c5", "-i0.01", "-W2", "-q", Lab.S4)
    return counter_delta(before, daemon.counters("r0"))


def test_chain_added_while_running_punts_everything(lab, daemon):
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    assert ping_deltas(lab, daemon).get("forwarded", 0) >= 5
    ahead = daemon.status()["reconciles"]["ahead"]

    add_forward_chain(lab)
    deadline = time.monotonic() + 5
    while daemon.status()["families"]["ipv4"]["fast_path"]:
        assert time.monotonic() < deadline, "fast path still on 5 s after a forward chain appeared"
        time.sleep(0.2)
    d = ping_deltas(lab, daemon)
    assert d.get("forwarded", 0) == 0 and d.get("policy_routing", 0) >= 5, d
    assert not daemon.status()["families"]["ipv6"]["fast_path"]
    assert "inet fw transit (forward)" in " ".join(daemon.status()["families"]["ipv4"]["problems"])
    # Both families were punted ahead of the full recompute.
    assert daemon.status()["reconciles"]["ahead"] == ahead + 1

    lab.run(lab.router, "nft", "delete", "table", "inet", "fw")
    deadline = time.monotonic() + 5
    while not daemon.status()["families"]["ipv4"]["fast_path"]:
        assert time.monotonic() < deadline, "fast path not back 5 s after the chain was removed"
        time.sleep(0.2)
    assert ping_deltas(lab, daemon).get("forwarded", 0) >= 5
    assert daemon.status()["reconciles"]["ahead"] == ahead + 1, "lifting the punt is the recompute's"


def test_run_refuses_when_it_cannot_check(lab, fastpath_bin):
    """No nft binary on PATH: no evidence of no rules, so refuse (fail closed)."""
    p = lab.run(lab.router, "env", "PATH=/nonexistent", str(FASTPATH), "run", "-i", "r0", "-i", "r1",
                "--socket", str(lab.tmp / "bad.sock"), check=False)
    line = one_line_error(p)
    assert "nft" in line and "--allow-netfilter-bypass" in line, line
    assert not lab.xdp_attached()
