"""The IPv6 multibit index (`--fib6-index multibit`) end to end.

Nested routes in 2001:db8:8000::/33 and 2001:db8:a000::/48 towards the two
servers: a /33 with a /40 in it and a /49 in that (a block of 128 entries at
/56), a blackhole /48, a /64 with a /97 in it (its /64 asks the trie), and
a default route every /16 without a longer route inherits. Each
destination must arrive where the kernel's longest match sends it, carried
by the fast path (counters), with the cache off so every packet is looked
up; then deletes and replaces, including the default route's (only the
/16 words change). A pinned restart then takes the index over.
"""

from __future__ import annotations

import pytest

from lab import Daemon, Lab
from pkts import udp6
from test_fib4_index import where as where4
from test_restart import kill9, pin_lab, pinned

# Cache off: each packet goes through fp_fib6_lookup().
ARGS = ["--fib6-index", "multibit", "--flow-timeout", "0"]


def where(lab: Lab, daemon: Daemon, dsts: list[str]) -> tuple[dict[str, str | None], dict[str, int]]:
    """As for the /24 index, with IPv6 frames."""
    return where4(lab, daemon, dsts, udp=udp6)


def routes(lab: Lab, *cmds: tuple[str, ...]) -> None:
    for c in cmds:
        lab.ip(lab.router, "-6", "route", *c)


@pytest.fixture
def lab_multibit(fastpath_bin):
    with Lab(second_path=True) as lab:
        lab.resolve_neighbours()
        yield lab


def index_status(daemon: Daemon) -> dict:
    st = daemon.status()
    assert "fib6_multibit" in st, f"status shows no IPv6 index: {sorted(st)}"
    return st["fib6_multibit"]


def test_multibit_forwards_by_longest_match_through_changes(lab_multibit):
    lab = lab_multibit
    s0, s1 = lab.S6, lab.S1_6
    routes(lab,
           ("add", "::/0", "via", s1),
           ("add", "2001:db8:8000::/33", "via", s0),
           ("add", "2001:db8:8500::/40", "via", s1),
           ("add", "2001:db8:8500:8000::/49", "via", s0),
           ("add", "blackhole", "2001:db8:9000::/48"),
           ("add", "2001:db8:a000:1::/64", "via", s1),
           ("add", "2001:db8:a000:1::8000:0/97", "via", s0))
    dsts = ["2001:db8:8000::1", "2001:db8:8500:1::1", "2001:db8:8500:8000::1", "2001:db8:8500:ffff::1",
            "2001:db8:9000::5", "2001:db8:a000:1::1", "2001:db8:a000:1::8000:1", "3fff::1", "2001:db8:7000::1"]
    with Daemon(lab, extra=ARGS) as d:
        d.wait_converged()
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        st = index_status(d)
        # Via s0, via s1, blackhole, and the lab's own routes' values.
        assert st["vals"] >= 3 and st["unslotted"] == 0 and st["trie_tops"] == 0, st
        # The /49's 128 blocks at /56 at least.
        assert st["entries"] >= 128, st

        got, delta = where(lab, d, dsts)
        assert got == {"2001:db8:8000::1": "s0", "2001:db8:8500:1::1": "s1", "2001:db8:8500:8000::1": "s0",
                       "2001:db8:8500:ffff::1": "s0", "2001:db8:9000::5": None, "2001:db8:a000:1::1": "s1",
                       "2001:db8:a000:1::8000:1": "s0", "3fff::1": "s1", "2001:db8:7000::1": "s1"}, got
        assert delta.get("forwarded", 0) == 8 and delta.get("blackhole", 0) == 1, delta

        # The /40 goes (its /33 answers, the /49 stays), the /33 moves to
        # s1, the /97 goes (its /64 answers), the default moves to s0.
        routes(lab, ("del", "2001:db8:8500::/40"), ("replace", "2001:db8:8000::/33", "via", s1),
               ("del", "2001:db8:a000:1::8000:0/97"), ("replace", "::/0", "via", s0))
        d.wait_converged()
        got, delta = where(lab, d, dsts)
        assert got == {"2001:db8:8000::1": "s1", "2001:db8:8500:1::1": "s1", "2001:db8:8500:8000::1": "s0",
                       "2001:db8:8500:ffff::1": "s0", "2001:db8:9000::5": None, "2001:db8:a000:1::1": "s1",
                       "2001:db8:a000:1::8000:1": "s1", "3fff::1": "s0", "2001:db8:7000::1": "s0"}, got
        assert delta.get("forwarded", 0) == 8 and delta.get("blackhole", 0) == 1, delta

        # No route at all: the index says so (punted to the kernel, which answers).
        routes(lab, ("del", "::/0"), ("del", "2001:db8:8000::/33"))
        d.wait_converged()
        got, delta = where(lab, d, ["3fff::1", "2001:db8:8000::1", "2001:db8:8500:8000::1"])
        assert got == {"3fff::1": None, "2001:db8:8000::1": None, "2001:db8:8500:8000::1": "s0"}, got
        assert delta.get("no_route", 0) == 2 and delta.get("forwarded", 0) == 1, delta
        text = d.cli("status").stdout
        assert "fib6 index: multibit" in text, text


def test_multibit_pinned_restart_takes_the_index_over(lab_multibit):
    """A restart with --pin adopts the pinned index (kill -9 first: the old
    program keeps forwarding on it): the same slots for the same route
    values, every /16 rebuilt under new versions, and a route that changed
    while no daemon ran is forwarded by its new next hop."""
    lab = lab_multibit
    pin_dir = pin_lab(lab)
    routes(lab, ("add", "2001:db8:8000::/33", "via", lab.S6), ("add", "2001:db8:8009::/48", "via", lab.S1_6))
    dsts = ["2001:db8:8001::1", "2001:db8:8009::9"]
    d = pinned(lab, pin_dir, *ARGS).start()
    d.wait_converged()
    got, delta = where(lab, d, dsts)
    assert got == {"2001:db8:8001::1": "s0", "2001:db8:8009::9": "s1"}, got
    assert delta.get("forwarded", 0) == 2, delta
    kill9(d)
    routes(lab, ("replace", "2001:db8:8009::/48", "via", lab.S6))
    d2 = pinned(lab, pin_dir, *ARGS).start()
    d2.wait_converged()
    got, delta = where(lab, d2, dsts)
    assert got == {"2001:db8:8001::1": "s0", "2001:db8:8009::9": "s0"}, got
    assert delta.get("forwarded", 0) == 2, delta
    assert index_status(d2)["vals"] >= 2
    assert d2.stop() == 0
