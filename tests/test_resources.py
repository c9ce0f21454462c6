"""Resource view and atomic route batches (issue #5 items 1-4).

One lab and one daemon with a small IPv4 FIB for the whole module: the
tests run in file order and each leaves the table as the next expects.
"""

from __future__ import annotations

import ipaddress
import json
import time

import pytest

from lab import Daemon, Lab, fastpath_usable

FIB4 = 40  # small enough to fill with a few dozen routes


@pytest.fixture(scope="module")
def rd():
    why = fastpath_usable()
    if why:
        pytest.skip(why)
    with Lab() as lab, Daemon(lab, extra=["--fib4-entries", str(FIB4)]) as d:
        yield lab, d


def resources(d: Daemon) -> dict:
    return {r["name"]: r for r in json.loads(d.cli("resources", "--json").stdout)["resources"]}


def settled_fib4(d: Daemon, used: int | None = None, timeout: float = 5.0) -> dict:
    """fib4 once the mirror holds everything reserved (and `used` entries, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        f = resources(d)["fib4"]
        if f["reserved"] == 0 and (used is None or f["used"] == used):
            return f
        if time.monotonic() > deadline:
            raise AssertionError(f"fib4 did not settle: {f}")
        time.sleep(0.02)


def batch(lab: Lab, d: Daemon, op: str, name: str, text: str):
    f = lab.tmp / name
    f.write_text(text)
    return d.cli("route", op, "--batch", str(f), check=False)


def kernel_v4(lab: Lab) -> set[str]:
    out = set()
    for r in json.loads(lab.ip(lab.router, "-j", "route", "show").stdout):
        dst = r["dst"]
        out.add(dst if "/" in dst or dst == "default" else f"{dst}/32")
    return out


def fastpath_v4(d: Daemon) -> set[str]:
    return {r["prefix"] for r in d.routes() if r["family"] == "ipv4"}


def hosts(start: int, n: int) -> list[str]:
    return [f"{ipaddress.ip_address('203.0.113.0') + i}/32" for i in range(start, start + n)]


def routes_text(prefixes: list[str]) -> str:
    return "".join(f"{p} via {Lab.S4} dev r1\n" for p in prefixes)


def test_view_has_every_table(rd):
    lab, d = rd
    res = resources(d)
    for name in ("fib4", "fib6", "nexthops", "groups", "buckets", "neighbours", "interfaces", "flow_cache_per_cpu"):
        assert name in res, res
        assert {"size", "used", "reserved", "unit", "costs"} <= res[name].keys()
    f = settled_fib4(d)
    assert f["size"] == FIB4 and 0 < f["used"] < FIB4
    assert res["flow_cache_per_cpu"]["used"] is None
    text = d.cli("resources").stdout
    assert "fib4" in text and "reserved" in text


def test_kernel_refusal_midway_reverts_the_batch(rd):
    lab, d = rd
    before_k, before_f = kernel_v4(lab), fastpath_v4(d)
    # The third route's gateway is not on-link: the kernel refuses it after
    # two were added.
    p = batch(lab, d, "add", "bad-gw", routes_text(hosts(200, 2)) + "203.0.113.210/32 via 203.0.113.250\n")
    assert p.returncode != 0
    assert "line 3" in p.stderr and "kernel" in p.stderr and "reverted" in p.stderr, p.stderr
    assert kernel_v4(lab) == before_k
    settled_fib4(d)
    assert fastpath_v4(d) == before_f


def test_syntax_error_names_the_line(rd):
    lab, d = rd
    p = batch(lab, d, "add", "syntax", "# fine\n203.0.113.220/32 via 198.51.100.2\n203.0.113.221/24 dev r1\n")
    assert p.returncode != 0 and "line 3" in p.stderr and "host bits" in p.stderr, p.stderr


def test_fill_fib4_then_one_more_batch_fails_whole(rd):
    lab, d = rd
    f = settled_fib4(d)
    free = f["size"] - f["used"]
    first = hosts(100, free - 1)
    p = batch(lab, d, "add", "fill", routes_text(first))
    assert p.returncode == 0, p.stderr
    settled_fib4(d, used=FIB4 - 1)

    # Two routes, one slot: the second (line 3) does not fit, so neither goes in.
    over = hosts(150, 2)
    before_k = kernel_v4(lab)
    p = batch(lab, d, "add", "over", "# one too many\n" + routes_text(over))
    assert p.returncode != 0
    assert "ENOSPC" in p.stderr and "line 3" in p.stderr and "fib4" in p.stderr, p.stderr
    assert kernel_v4(lab) == before_k
    assert not set(over) & fastpath_v4(d)
    assert resources(d)["fib4"]["reserved"] == 0

    # The last slot, then nothing more.
    p = batch(lab, d, "add", "last", routes_text(hosts(150, 1)))
    assert p.returncode == 0, p.stderr
    res = resources(d)["fib4"]
    assert res["used"] + res["reserved"] == FIB4, res
    settled_fib4(d, used=FIB4)
    assert set(first + hosts(150, 1)) <= fastpath_v4(d) & kernel_v4(lab)
    p = batch(lab, d, "add", "full", routes_text(hosts(160, 1)))
    assert p.returncode != 0 and "ENOSPC" in p.stderr, p.stderr
    assert hosts(160, 1)[0] not in kernel_v4(lab)
    assert d.status()["families"]["ipv4"]["fast_path"], "a full table must not punt the family"


def test_delete_frees_and_a_batch_then_succeeds(rd):
    lab, d = rd
    gone = hosts(100, 2)
    p = batch(lab, d, "del", "del", routes_text(gone))
    assert p.returncode == 0, p.stderr
    settled_fib4(d, used=FIB4 - 2)
    assert not set(gone) & kernel_v4(lab)
    # Deleting what is not there changes nothing.
    p = batch(lab, d, "del", "del-again", routes_text(hosts(102, 1) + gone[:1]))
    assert p.returncode != 0 and "line 2" in p.stderr and "no such route" in p.stderr, p.stderr
    assert hosts(102, 1)[0] in kernel_v4(lab)
    new = hosts(170, 2)
    p = batch(lab, d, "add", "refill", routes_text(new))
    assert p.returncode == 0, p.stderr
    settled_fib4(d, used=FIB4)
    assert set(new) <= fastpath_v4(d)


def test_ipv6_blackhole_and_dev_routes(rd):
    lab, d = rd
    text = ("2001:db8:3:1::/64 via 2001:db8:2::2 dev r1\n"
            "blackhole 2001:db8:3:2::/64\n"
            "2001:db8:3:3::/64 dev r1\n")
    used6 = resources(d)["fib6"]["used"]
    p = batch(lab, d, "add", "v6", text)
    assert p.returncode == 0, p.stderr
    kernel = lab.ip(lab.router, "-6", "route", "show").stdout
    assert "2001:db8:3:1::/64 via 2001:db8:2::2 dev r1" in kernel, kernel
    assert "blackhole 2001:db8:3:2::/64" in kernel, kernel
    assert "2001:db8:3:3::/64 dev r1" in kernel, kernel
    deadline = time.monotonic() + 5
    while resources(d)["fib6"]["used"] != used6 + 3:
        assert time.monotonic() < deadline, resources(d)["fib6"]
        time.sleep(0.02)
    p = batch(lab, d, "del", "v6-del", text)
    assert p.returncode == 0, p.stderr
    kernel = lab.ip(lab.router, "-6", "route", "show").stdout
    assert not any(f"2001:db8:3:{i}::" in kernel for i in (1, 2, 3)), kernel
