"""A veth whose peer runs no NAPI (no XDP program, GRO off) drops every
frame redirected into it, where the kernel's own path delivers. So what
would leave by such a veth goes to the kernel (`egress_peer_not_ready`),
at start, at once when a reload adds the veth, and once the daemon sees the
peer's change (a GRO change sends an event, crates/fastpath/src/vethpeer.rs); its other direction,
and the veth once the peer is ready, stay fast. Without this, turning GRO
off on the server's end of r1 made the router a black hole for it."""

from __future__ import annotations

from lab import Daemon, Lab, counter_delta, ipv4_problems as problems, ping_deltas as pings, wait_for
from test_reload_ifaces import config, config_daemon, no_loss, ping, reload

MARK = "r1: traffic leaving by it goes to the kernel"


def gro(lab: Lab, on: bool) -> None:
    lab.run(lab.server, "ethtool", "-K", "s0", "gro", "on" if on else "off")


def test_peer_without_napi_at_start_then_ready(lab: Lab, fastpath_bin):
    gro(lab, False)
    with Daemon(lab) as d:
        assert MARK in problems(d) and "has neither an XDP program nor GRO" in problems(d), problems(d)
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        out, back = pings(lab, d)
        # Requests would leave by r1 into s0: the kernel delivers them.
        assert out.get("forwarded", 0) == 0 and out.get("egress_peer_not_ready", 0) >= 5, out
        # Replies leave by r0, whose peer has GRO: fast.
        assert back.get("forwarded", 0) >= 5, back

        gro(lab, True)
        wait_for("the mark gone", lambda: MARK not in problems(d), 5)
        out, _ = pings(lab, d)
        assert out.get("forwarded", 0) >= 5 and out.get("egress_peer_not_ready", 0) == 0, out


def test_peer_losing_napi_while_fast(lab: Lab, daemon: Daemon):
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    out, _ = pings(lab, daemon)
    assert out.get("forwarded", 0) >= 5, out  # and the flow is cached
    gro(lab, False)
    wait_for("the mark", lambda: MARK in problems(daemon), 5)
    out, back = pings(lab, daemon)
    assert out.get("forwarded", 0) == 0 and out.get("egress_peer_not_ready", 0) >= 5, out
    assert back.get("forwarded", 0) >= 5, back


def test_a_veth_added_by_reload_is_held_from_its_first_write(lab: Lab, fastpath_bin):
    """Probed when the reload adds it, not at the next period: the pings
    right after the reload (a second of them, the longest the period could
    leave it unchecked) all arrive, and none leaves by r1 on the fast path."""
    gro(lab, False)
    lab.resolve_neighbours()
    path = lab.tmp / "fastpath.toml"
    path.write_text(config(lab, ["r0"]))
    with config_daemon(lab, path) as d:
        reload(d, path, config(lab, ["r0", "r1"]), "reload: interface r0 -> r0,r1: applied")
        before = d.counters("r0")
        no_loss(ping(lab, Lab.S4, 100), 100)
        out = counter_delta(before, d.counters("r0"))
        assert out.get("forwarded", 0) == 0 and out.get("egress_peer_not_ready", 0) >= 90, out
        assert MARK in problems(d), problems(d)
