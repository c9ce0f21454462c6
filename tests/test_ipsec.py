"""IPsec (xfrm) policies and the fast path: the kernel checks forwarded
packets against `fwd` and `out` policies (dropping, or encrypting them) and
against the default policy; an XDP redirect would skip that. So a family
with such a policy is punted, at once when the policy appears, and the
kernel's verdict stands (here: the packets are dropped, never forwarded in
clear)."""

from __future__ import annotations

from lab import Daemon, Lab, counter_delta, wait_for


def xfrm(lab: Lab, *args: str) -> None:
    lab.run(lab.router, "ip", "xfrm", "policy", *args)


def ping(lab: Lab, daemon: Daemon, fam: str = "-4", dst: str = Lab.S4) -> tuple[bool, dict]:
    """(all answered, r0's counter deltas) for 5 pings client -> server."""
    before = daemon.counters("r0")
    p = lab.run(lab.client, "ping", fam, "-c5", "-i0.01", "-W1", "-q", dst, check=False)
    return p.returncode == 0, counter_delta(before, daemon.counters("r0"))


def fast(daemon: Daemon, fam: str) -> bool:
    return daemon.status()["families"][fam]["fast_path"]


def problems(daemon: Daemon, fam: str) -> str:
    return " ".join(daemon.status()["families"][fam]["problems"])


def warm(lab: Lab, daemon: Daemon) -> None:
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    ok, d = ping(lab, daemon)
    assert ok and d.get("forwarded", 0) >= 5, d


def test_fwd_policy_punts_its_family_at_once_and_the_kernel_drops(lab, daemon):
    warm(lab, daemon)
    ahead = daemon.status()["reconciles"]["ahead"]
    xfrm(lab, "add", "src", f"{Lab.C4}/32", "dst", f"{Lab.S4}/32", "dir", "fwd", "action", "block")
    try:
        # Within one pass of the daemon's loop (~0.1 s); generous for loaded CI.
        wait_for("IPv4 punted", lambda: not fast(daemon, "ipv4"), 5)
        assert daemon.status()["reconciles"]["ahead"] == ahead + 1, "punted ahead of the recompute"
        ok, d = ping(lab, daemon)
        assert not ok, "the kernel's fwd block policy must drop what fastpath punts"
        assert d.get("forwarded", 0) == 0 and d.get("policy_routing", 0) >= 5, d
        assert "IPsec (xfrm) policies on the forwarding path (1 fwd, 0 out): IPv4 punted" in problems(daemon, "ipv4")
        # Only the family that has the policy.
        assert fast(daemon, "ipv6") and "IPsec" not in problems(daemon, "ipv6")
        ok6, d6 = ping(lab, daemon, "-6", Lab.S6)
        assert ok6 and d6.get("forwarded", 0) >= 5, d6
    finally:
        xfrm(lab, "flush")
    wait_for("IPv4 fast again", lambda: fast(daemon, "ipv4"), 5)
    ok, d = ping(lab, daemon)
    assert ok and d.get("forwarded", 0) >= 5, d


def test_out_policy_without_sa_is_not_forwarded_in_clear(lab, daemon):
    """An out policy encrypts forwarded traffic; with no SA the kernel holds
    it for the key daemon. Either way nothing may leave in clear."""
    warm(lab, daemon)
    xfrm(lab, "add", "src", f"{Lab.C4}/32", "dst", f"{Lab.S4}/32", "dir", "out",
         "tmpl", "src", Lab.R1_4, "dst", Lab.S4, "proto", "esp", "mode", "tunnel")
    try:
        wait_for("IPv4 punted", lambda: not fast(daemon, "ipv4"), 5)
        ok, d = ping(lab, daemon)
        assert not ok and d.get("forwarded", 0) == 0, d
        assert "(0 fwd, 1 out)" in problems(daemon, "ipv4")
    finally:
        xfrm(lab, "flush")
    wait_for("IPv4 fast again", lambda: fast(daemon, "ipv4"), 5)


def test_blocking_default_policy_punts_both_families(lab, daemon):
    warm(lab, daemon)
    xfrm(lab, "setdefault", "fwd", "block")
    try:
        wait_for("both punted", lambda: not fast(daemon, "ipv4") and not fast(daemon, "ipv6"), 5)
        assert "IPsec default policy blocks forwarded packets" in problems(daemon, "ipv6")
        ok, d = ping(lab, daemon)
        assert not ok and d.get("forwarded", 0) == 0, d
    finally:
        xfrm(lab, "setdefault", "fwd", "accept")
    wait_for("fast again", lambda: fast(daemon, "ipv4") and fast(daemon, "ipv6"), 5)


def test_policy_present_at_start(lab):
    xfrm(lab, "add", "src", "::/0", "dst", f"{Lab.S6}/128", "dir", "fwd", "action", "block")
    with Daemon(lab) as d:
        st = d.status()["families"]
        assert st["ipv4"]["fast_path"] and not st["ipv6"]["fast_path"], st
        assert "(1 fwd, 0 out): IPv6 punted" in " ".join(st["ipv6"]["problems"])
