"""No blackhole when the IPv4 FIB is full (issue #5 item 5).

The router's FIB map is sized to exactly what it holds. Then a more specific
route is added that does not fit: 203.0.113.77/32 via the second server link
(r2), inside 203.0.113.0/24 via r1. Longest prefixes stay out first, so the
/32 is the one left out; its traffic must still leave by r2 as the kernel
sends it (punted: the /24 becomes a punt), never by the fast-path /24 out of
r1. `fastpath routes --json` says "failed" / "punted-cover". Deleting another
route makes room: the /32 is installed and fast-path forwarded, the /24
forwards again.
"""

from __future__ import annotations

import ipaddress
import json
import time

import pytest

from lab import Daemon, Lab, counter_delta, send_and_capture
from pkts import IP, UDP, Ether, Raw

HOST = "203.0.113.77"
SPARE = "198.51.100.64/26"  # an extra route whose delete makes room


def fib4_size(lab: Lab) -> int:
    """Distinct IPv4 prefixes of the router's local and main tables: what
    fastpath's merged FIB holds."""
    prefixes = set()
    for table in ("local", "main"):
        for r in json.loads(lab.ip(lab.router, "-4", "-j", "route", "show", "table", table).stdout):
            dst = "0.0.0.0/0" if r["dst"] == "default" else r["dst"]
            prefixes.add(ipaddress.ip_network(dst, strict=False))
    return len(prefixes)


def frame(lab: Lab) -> bytes:
    return bytes(Ether(src=lab.c0.mac, dst=lab.r0.mac) / IP(src=lab.C4, dst=HOST, ttl=9)
                 / UDP(sport=40000, dport=9) / Raw(b"overflow"))


def send(lab: Lab) -> dict[str, list[bytes]]:
    return send_and_capture(lab.c0, [frame(lab)], [lab.s0, lab.s1])


def ipv4_delta(before: dict, after: dict) -> dict[str, int]:
    """The counter delta of our IPv4 frame: the client's own IPv6 chatter
    from its link-local address (MLD) may pass r0 meanwhile, punted as
    link_local, and is not what these checks are about."""
    delta = counter_delta(before, after)
    delta.pop("link_local", None)
    return delta


def routes_by_prefix(d: Daemon) -> dict[str, dict]:
    return {r["prefix"]: r for r in d.routes() if r["family"] == "ipv4"}


def wait_routes(d: Daemon, want: dict[str, str], timeout: float = 5.0) -> dict[str, dict]:
    """Poll until each prefix in `want` has that offload status."""
    deadline = time.monotonic() + timeout
    while True:
        rs = routes_by_prefix(d)
        if all(rs.get(p, {}).get("offload") == s for p, s in want.items()):
            return rs
        if time.monotonic() > deadline:
            raise AssertionError(f"offload status not {want}: {json.dumps(rs, indent=1)}")
        time.sleep(0.05)


def test_route_that_does_not_fit_is_punted_not_misforwarded(lab2, fastpath_bin):
    lab = lab2
    lab.resolve_neighbours()
    lab.ip(lab.router, "route", "add", SPARE, "via", lab.S4)

    # The kernel alone: the /32 goes out r2, what s1 receives is the reference.
    lab.ip(lab.router, "route", "add", f"{HOST}/32", "via", lab.S1_4)
    kernel = send(lab)
    assert len(kernel["s1"]) == 1 and not kernel["s0"], kernel
    lab.ip(lab.router, "route", "del", f"{HOST}/32")

    cap = fib4_size(lab)
    with Daemon(lab, extra=["--fib4-entries", str(cap)]) as d:
        rs = wait_routes(d, {"203.0.113.0/24": "ok"})
        assert all(r["offload"] == "ok" for r in rs.values()), rs
        assert len(rs) == cap, rs
        # Fast path by the /24 (and a flow cache entry the next change must not trust).
        assert len(send(lab)["s0"]) == 1

        lab.ip(lab.router, "route", "add", f"{HOST}/32", "via", lab.S1_4)
        rs = wait_routes(d, {f"{HOST}/32": "failed", "203.0.113.0/24": "punted-cover"})
        assert rs[f"{HOST}/32"]["action"] == "none"
        assert rs["203.0.113.0/24"]["action"] == "punt" and rs["203.0.113.0/24"]["reason"] == "table_full"
        assert d.status()["routes_offload_failed"] == 1
        before = d.counters("r0")
        got = send(lab)
        assert not got["s0"], "forwarded by the less specific fast-path route"
        assert got["s1"] == kernel["s1"], "not what the kernel alone sends"
        delta = ipv4_delta(before, d.counters("r0"))
        assert delta == {"table_full": 1}, delta
        assert "203.0.113.77/32: offload failed" in d.log.read_text(errors="replace")

        # A delete makes room: the /32 goes in, the /24 forwards again.
        lab.ip(lab.router, "route", "del", SPARE)
        rs = wait_routes(d, {f"{HOST}/32": "ok", "203.0.113.0/24": "ok"})
        assert rs[f"{HOST}/32"]["action"] == "forward" and rs[f"{HOST}/32"]["nexthop"]["dev"] == "r2"
        assert d.status()["routes_offload_failed"] == 0
        before = d.counters("r0")
        got = send(lab)
        assert got["s1"] == kernel["s1"] and not got["s0"], got
        delta = ipv4_delta(before, d.counters("r0"))
        assert delta == {"forwarded": 1}, delta
        assert "203.0.113.77/32: offloaded again" in d.log.read_text(errors="replace")
