"""The IPv4 /24 index (`--fib4-index dir24`) end to end.

Nested routes under 198.18.0.0/15 (the benchmarking range) towards the two
servers, some shorter than /24 (answered by the index), some longer (their
/24 sent to the trie), a blackhole; then deletes and a replace. Each
destination must arrive where the kernel's longest match sends it, carried
by the fast path (counters), with the cache off so every packet is looked
up. A pinned restart then takes the index over and forwards the same way.
"""

from __future__ import annotations

import pytest

from lab import Daemon, Lab, counter_delta, send_and_capture
from pkts import udp4
from test_restart import kill9, pin_lab, pinned

# Cache off: each packet goes through fp_fib4_lookup().
ARGS = ["--fib4-index", "dir24", "--flow-timeout", "0"]


def where(lab: Lab, daemon: Daemon, dsts: list[str], udp=udp4) -> tuple[dict[str, str | None], dict[str, int]]:
    """Server side each destination arrived at (None: nowhere) and the r0
    counter deltas; `udp` builds the frames (pkts.udp6 for IPv6)."""
    before = daemon.counters("r0")
    frames = [udp(lab, dst=d, seq=i) for i, d in enumerate(dsts)]
    got = send_and_capture(lab.c0, frames, [lab.s0, lab.s1])
    after = daemon.counters("r0")
    out: dict[str, str | None] = {d: None for d in dsts}
    for side, fs in got.items():
        for f in fs:
            for i, d in enumerate(dsts):
                if f"fastpath-{i:08d}-".encode() in f:
                    assert out[d] is None, f"{d} arrived twice"
                    out[d] = side
    return out, counter_delta(before, after)


def routes(lab: Lab, *cmds: tuple[str, ...]) -> None:
    for c in cmds:
        lab.ip(lab.router, "route", *c)


@pytest.fixture
def lab_dir24(fastpath_bin):
    with Lab(second_path=True) as lab:
        lab.resolve_neighbours()
        yield lab


def dir_status(daemon: Daemon) -> dict:
    st = daemon.status()
    assert "fib4_dir24" in st, f"status shows no /24 index: {sorted(st)}"
    return st["fib4_dir24"]


def test_dir24_forwards_by_longest_match_through_changes(lab_dir24):
    lab = lab_dir24
    s0, s1 = lab.S4, lab.S1_4
    routes(lab,
           ("add", "198.18.0.0/15", "via", s0),
           ("add", "198.18.5.0/24", "via", s1),
           ("add", "198.18.5.128/25", "via", s0),
           ("add", "blackhole", "198.19.7.0/24"),
           ("add", "198.19.64.0/18", "via", s1))
    dsts = ["198.18.1.1", "198.18.5.1", "198.18.5.200", "198.19.7.7", "198.19.8.8", "198.19.70.1"]
    with Daemon(lab, extra=ARGS) as d:
        d.wait_converged()
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        st = dir_status(d)
        # Via s0, via s1, blackhole, and the lab's own routes' values.
        assert st["vals"] >= 3 and st["unslotted"] == 0, st
        # The /25's block, and the lab's own /24s with local and broadcast /32s in them.
        trie_blocks = st["trie_blocks"]
        assert trie_blocks >= 1, st

        got, delta = where(lab, d, dsts)
        assert got == {"198.18.1.1": "s0", "198.18.5.1": "s1", "198.18.5.200": "s0",
                       "198.19.7.7": None, "198.19.8.8": "s0", "198.19.70.1": "s1"}, got
        assert delta.get("forwarded", 0) == 5 and delta.get("blackhole", 0) == 1, delta

        # The /24 goes: its block falls to the /15 except the /25's half,
        # still answered by the trie.
        routes(lab, ("del", "198.18.5.0/24"))
        d.wait_converged()
        got, delta = where(lab, d, ["198.18.5.1", "198.18.5.200"])
        assert got == {"198.18.5.1": "s0", "198.18.5.200": "s0"}, got
        assert delta.get("forwarded", 0) == 2, delta

        # The /25 goes: the block leaves the trie with the /15's value, and
        # with the /15 replaced all of 198.18/16 agrees: its first-level
        # entry answers.
        routes(lab, ("del", "198.18.5.128/25"), ("replace", "198.18.0.0/15", "via", s1))
        d.wait_converged()
        assert dir_status(d)["trie_blocks"] == trie_blocks - 1
        got, delta = where(lab, d, ["198.18.1.1", "198.18.5.200", "198.19.7.7", "198.19.70.1"])
        assert got == {"198.18.1.1": "s1", "198.18.5.200": "s1", "198.19.7.7": None, "198.19.70.1": "s1"}, got
        assert delta.get("forwarded", 0) == 3 and delta.get("blackhole", 0) == 1, delta

        # No route at all: the index says so (punted to the kernel, which drops it).
        routes(lab, ("del", "198.18.0.0/15"))
        d.wait_converged()
        got, delta = where(lab, d, ["198.18.1.1"])
        assert got == {"198.18.1.1": None}, got
        assert delta.get("no_route", 0) == 1, delta
        text = d.cli("status").stdout
        assert "fib4 index: dir24" in text, text


def test_dir24_pinned_restart_takes_the_index_over(lab_dir24):
    """A restart with --pin adopts the pinned index (kill -9 first: the old
    program keeps forwarding on it): the same slots for the same route
    values, every block rewritten from the routes, and a route that changed
    while no daemon ran is forwarded by its new next hop."""
    lab = lab_dir24
    pin_dir = pin_lab(lab)
    routes(lab, ("add", "198.18.0.0/15", "via", lab.S4), ("add", "198.18.9.0/24", "via", lab.S1_4))
    dsts = ["198.18.1.1", "198.18.9.9"]
    d = pinned(lab, pin_dir, *ARGS).start()
    d.wait_converged()
    got, delta = where(lab, d, dsts)
    assert got == {"198.18.1.1": "s0", "198.18.9.9": "s1"}, got
    assert delta.get("forwarded", 0) == 2, delta
    kill9(d)
    routes(lab, ("replace", "198.18.9.0/24", "via", lab.S4))
    d2 = pinned(lab, pin_dir, *ARGS).start()
    d2.wait_converged()
    got, delta = where(lab, d2, dsts)
    assert got == {"198.18.1.1": "s0", "198.18.9.9": "s0"}, got
    assert delta.get("forwarded", 0) == 2, delta
    assert dir_status(d2)["vals"] >= 2
    assert d2.stop() == 0
