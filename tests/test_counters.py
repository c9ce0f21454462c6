"""Counters agree with the traffic sent; the JSON views describe the lab."""

from __future__ import annotations

import pytest

from lab import Lab, counter_delta, send_and_capture
from pkts import frags4, ping4, udp4, udp6


# The module's tests only send traffic and compare counter deltas: they share
# one lab and one daemon.
@pytest.fixture(scope="module")
def lab(module_lab):
    return module_lab


@pytest.fixture(scope="module")
def daemon(module_daemon):
    return module_daemon


REASON_KEYS = {"packets", "bytes"}


def test_counters_match_known_packet_list(lab, daemon):
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    plan = {
        "forwarded": [udp4(lab, seq=i, size=10 * i) for i in range(7)]
                     + [udp6(lab, seq=i, size=100 + i) for i in range(4)],
        "ttl_exceeded": [udp4(lab, ttl=1), udp6(lab, hlim=1)],
        "ip_options": [udp4(lab, options=b"\x01\x01\x01\x00")],
        "fragment": frags4(lab),
        "malformed": [udp4(lab, chksum=0xBAD), udp4(lab, chksum=0xBAD, seq=1)],
        "local": [ping4(lab, dst=lab.R1_4)],
        "no_route": [udp6(lab, dst="2001:db8:ffff::9")],
    }
    frames = {r: [bytes(p) for p in pkts] for r, pkts in plan.items()}
    before = daemon.counters("r0")
    with lab.quiet(lab.client):
        send_and_capture(lab.c0, [f for fs in frames.values() for f in fs], [lab.s0])
    after = daemon.counters("r0")
    pk = counter_delta(before, after, "packets")
    by = counter_delta(before, after, "bytes")
    for reason, fs in frames.items():
        assert pk.get(reason, 0) == len(fs), f"{reason}: sent {len(fs)}, counted {pk.get(reason, 0)}; {pk}"
        assert by.get(reason, 0) == sum(len(f) for f in fs), \
            f"{reason} bytes: sent {sum(len(f) for f in fs)}, counted {by.get(reason, 0)}"


def test_status_json_shape(lab, daemon):
    st = daemon.status()
    for k in ("generation", "netlink_resyncs", "neigh_keepalives", "interfaces", "tables", "families",
              "totals"):
        assert k in st, f"status --json lacks {k}: {sorted(st)}"
    names = {i["name"]: i for i in st["interfaces"]}
    assert set(names) == {"r0", "r1"}
    r0 = names["r0"]
    assert r0["mac"] == lab.r0.mac and r0["up"] is True and r0["fwd4"] is True and r0["fwd6"] is True
    assert r0["xdp_mode"] in ("native", "generic", "driver", "drv", "skb"), r0["xdp_mode"]
    assert r0["mtu"] == 1500
    for t in ("fib4", "fib6", "nexthops", "neighbours", "interfaces"):
        assert 0 <= st["tables"][t]["used"] <= st["tables"][t]["capacity"], st["tables"]
    for fam in ("ipv4", "ipv6"):
        assert st["families"][fam]["fast_path"] is True, st["families"]
    for reason, v in st["totals"].items():
        assert set(v) == REASON_KEYS, (reason, v)
    assert lab.xdp_attached().keys() == {"r0", "r1"}


def test_routes_and_neighbours_json(lab, daemon):
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    routes = daemon.routes()
    by_prefix = {r["prefix"]: r for r in routes}
    far4 = by_prefix[Lab.REMOTE4]
    assert far4["family"] in ("ipv4", "inet", 4) and far4["action"] in ("forward", "unicast"), far4
    assert far4["nexthop"]["gateway"] == Lab.S4 and far4["nexthop"]["dev"] == "r1", far4
    far6 = by_prefix[Lab.REMOTE6]
    assert far6["nexthop"]["gateway"] == Lab.S6 and far6["nexthop"]["dev"] == "r1", far6
    assert by_prefix["198.51.100.0/24"]["nexthop"]["gateway"] in (None, "", "0.0.0.0")
    neigh = {(n["dev"], n["address"]): n for n in daemon.neighbours()}
    assert neigh[("r1", Lab.S4)]["mac"] == lab.s0.mac
    assert neigh[("r1", Lab.S6)]["mac"] == lab.s0.mac
    assert neigh[("r0", Lab.C4)]["mac"] == lab.c0.mac
