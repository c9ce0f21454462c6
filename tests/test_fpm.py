"""`fastpath run --route-source fpm`: routes and next hops from FRR zebra's
dplane_fpm_nl instead of the kernel, and the offload status sent back.

The status path is tested with tests/fpm_client.py (speaks FPM as FRR 8.5
does; Debian's 8.4.4 reads and discards what the server sends), the route
flow end to end with the real zebra + staticd. With the client, the router's
kernel has no route to the remote prefixes: whatever reaches the server got
there by a route FPM delivered. zebra installs its routes into the kernel as
well, so there the proof is the route's `source` and its deletion in zebra."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fpm_client import NLM_F_REQUEST, RTM_NEWROUTE, FpmClient
from lab import (Daemon, Lab, assert_recompute_writes_nothing, in_netns, send_and_expect, send_and_expect_none,
                 set_hash_seed, wait_for)
from pkts import udp4, udp6

ZEBRA = Path("/usr/lib/frr/zebra")
STATICD = Path("/usr/lib/frr/staticd")
GRACE = 2
# `make soak`: a longer churn.
SOAK = os.environ.get("FASTPATH_SOAK", "") not in ("", "0")
V4, V6 = Lab.REMOTE4, Lab.REMOTE6


def route(d: Daemon, prefix: str) -> dict | None:
    return next((r for r in d.routes() if r["prefix"] == prefix), None)


def ifindex(lab: Lab, dev: str) -> int:
    return json.loads(lab.ip(lab.router, "-j", "link", "show", dev).stdout)[0]["ifindex"]


def fpm_lab(lab: Lab) -> None:
    """Only FPM may know the remote prefixes; the router knows its neighbours."""
    lab.ip(lab.router, "route", "del", V4)
    lab.ip(lab.router, "-6", "route", "del", V6)
    lab.run(lab.router, "ping", "-c1", "-W1", "-q", lab.S4)
    lab.run(lab.router, "ping", "-6", "-c1", "-W1", "-q", lab.S6)


@pytest.fixture(scope="module")
def fpm(fastpath_bin):
    with Lab() as lab:
        fpm_lab(lab)
        with Daemon(lab, extra=["--route-source", "fpm", "--fpm-grace", str(GRACE)]) as d:
            yield lab, d


def connect(lab: Lab) -> FpmClient:
    with in_netns(lab.router):
        c = FpmClient.connect()
    lab.defer(c.close)
    return c


def test_fpm_routes_forward_and_report_offload(fpm):
    lab, d = fpm
    r1 = ifindex(lab, "r1")
    c = connect(lab)
    c.add_nexthop(10, gateway=lab.S4, oif=r1)
    c.add_route(V4, nh_id=10)
    c.add_route(V6, gateway=lab.S6, oif=r1)
    # A table the FIB does not serve (a VRF): not in the fast path.
    c.add_route("192.0.2.128/25", gateway=lab.S4, oif=r1, table=100)

    st = c.wait_status(V4, V6, "192.0.2.128/25")
    for s in st.values():
        assert s.msg_type == RTM_NEWROUTE and s.nl_flags & NLM_F_REQUEST
    assert st[V4].offloaded and not st[V4].failed and st[V4].nh_id == 10, st[V4]
    assert st[V6].offloaded and st[V6].gateway == lab.S6, st[V6]
    assert st["192.0.2.128/25"].failed and not st["192.0.2.128/25"].offloaded
    assert st["192.0.2.128/25"].table == 100

    r = route(d, V4)
    assert r and r["source"] == "fpm" and r["action"] == "forward", r
    assert r["nexthop"]["gateway"] == lab.S4
    assert route(d, V6)["source"] == "fpm"
    # The local table still comes from the kernel.
    assert route(d, f"{lab.R0_4}/32")["source"] == "kernel"
    src = d.status()["route_source"]
    assert src["kind"] == "fpm" and src["connected"] and src["routes"] == 3, src
    assert src["offloaded"] == 2 and src["offload_failed"] == 1, src

    # The kernel has no route there: only fastpath can deliver these.
    send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(3)], lab.s0)
    send_and_expect(lab.c0, [udp6(lab, seq=i) for i in range(3)], lab.s0)


def test_fpm_delete_and_lost_connection(fpm):
    lab, d = fpm
    r1 = ifindex(lab, "r1")
    c = connect(lab)  # replaces the previous connection; replay below
    c.add_nexthop(10, gateway=lab.S4, oif=r1)
    c.add_route(V4, nh_id=10)
    c.add_route(V6, gateway=lab.S6, oif=r1)
    c.wait_status(V4, V6)
    wait_for("the replay to settle", lambda: route(d, "192.0.2.128/25") is None and d.status()["route_source"]["routes"] == 2, timeout=4)

    c.del_route(V4, nh_id=10)
    wait_for("the deleted route to leave the FIB", lambda: route(d, V4) is None)
    send_and_expect_none(lab.c0, [udp4(lab)], lab.s0)
    send_and_expect(lab.c0, [udp6(lab)], lab.s0)

    c.close()
    t = time.monotonic()
    assert route(d, V6), "routes outlive a lost connection for the grace period"
    wait_for("the disconnect", lambda: not d.status()["route_source"]["connected"], timeout=GRACE)
    wait_for("the grace flush", lambda: route(d, V6) is None, timeout=GRACE + 5)
    assert time.monotonic() - t >= GRACE * 0.9
    send_and_expect_none(lab.c0, [udp6(lab)], lab.s0)


def fib_view(d: Daemon) -> list[tuple]:
    """What the maps hold for routes zebra sent, comparable across calls."""
    return sorted((r["prefix"], r["action"], json.dumps(r.get("nexthop"), sort_keys=True),
                   json.dumps(r.get("group"), sort_keys=True)) for r in d.routes() if r.get("source") == "fpm")


def gateways(row: tuple) -> set[str]:
    """The gateways a fib_view row forwards to."""
    nh, group = (json.loads(x) for x in row[2:4])
    hops = [nh] if nh else [p["nexthop"] for p in (group or {}).get("paths", [])]
    return {h["gateway"] for h in hops}


def test_fpm_changes_are_route_updates(fpm):
    """zebra's updates reach the maps as route updates (they cost the
    prefixes they touch, not a recompute of a full table), also when
    next-hop objects under routes are replaced, and leave exactly what a
    full recompute makes of zebra's table: seeded random churn of routes via
    gateways, objects and groups, metric changes and deletes."""
    lab, d = fpm
    set_hash_seed(lab, d)
    r1 = ifindex(lab, "r1")
    gw4 = [lab.S4, "198.51.100.3", "198.51.100.4"]
    gw6 = [lab.S6, "2001:db8:2::3"]
    c = connect(lab)
    for i, g in enumerate(gw4):
        c.add_nexthop(10 + i, gateway=g, oif=r1)
    c.add_nexthop(20, group=[(10, 1), (11, 2)])
    wait_for("the replay to settle", lambda: d.status()["route_source"]["nexthops"] == 4
             and d.status()["route_source"]["routes"] == 0, timeout=5)
    full = d.status()["reconciles"]["full"]
    updates = d.status()["reconciles"]["routes"]

    rng = random.Random(int(os.environ.get("FASTPATH_TEST_SEED", "7")))
    v4 = [f"203.0.113.{i * 16}/28" for i in range(8)] + ["203.0.113.0/24", "203.0.113.0/25"]
    v6 = [f"2001:db8:ff:{i}::/64" for i in range(1, 6)] + ["2001:db8:ff::/48"]
    held: dict[str, dict] = {}
    for step in range(2000 if SOAK else 60):
        roll = rng.random()
        if roll < 0.1:
            # An object under routes replaced (its gateway), or the group's paths.
            if rng.random() < 0.5:
                c.add_nexthop(12, gateway=rng.choice(gw4), oif=r1)
            else:
                c.add_nexthop(20, group=rng.choice([[(10, 1), (11, 2)], [(10, 1), (12, 1)], [(11, 1)]]))
            continue
        p = rng.choice(v4 + v6)
        if p in held and roll < 0.35:
            c.del_route(p, **held.pop(p))
            continue
        metric = rng.choice([20, 30])
        if p in held and held[p]["metric"] != metric:
            # zebra's replacement under another metric: delete + add.
            c.del_route(p, **held[p])
        if ":" in p:
            kw = dict(gateway=rng.choice(gw6), oif=r1, metric=metric)
        else:
            kw = rng.choice([dict(gateway=rng.choice(gw4), oif=r1), dict(nh_id=rng.choice([10, 11, 12])), dict(nh_id=20)])
            kw["metric"] = metric
        c.add_route(p, **kw)
        held[p] = kw
    # Routes through every object, whatever the churn left.
    for p, nh in [("203.0.113.224/28", 12), ("203.0.113.240/28", 20)]:
        held[p] = dict(nh_id=nh, metric=20)
        c.add_route(p, **held[p])
    wait_for("zebra's table in the maps", lambda: {r[0] for r in fib_view(d)} == set(held)
             and d.status()["route_source"]["routes"] == len(held), timeout=10)

    # Then objects alone (a BGP next hop moving): replaced under their
    # routes, and one that no route uses added and deleted.
    c.add_nexthop(13, gateway=lab.S4, oif=r1)
    c.del_nexthop(13)
    c.add_nexthop(11, gateway="198.51.100.5", oif=r1)
    c.add_nexthop(12, gateway="198.51.100.6", oif=r1)
    c.add_nexthop(20, group=[(11, 1), (12, 1)])
    by_object = {10: {lab.S4}, 11: {"198.51.100.5"}, 12: {"198.51.100.6"}, 20: {"198.51.100.5", "198.51.100.6"}}
    want = {p: by_object[kw["nh_id"]] for p, kw in held.items() if "nh_id" in kw}
    wait_for("the routes on the replaced objects", lambda: want.items() <= {
        r[0]: gateways(r) for r in fib_view(d)}.items(), timeout=10)
    time.sleep(0.5)
    st = d.status()
    assert st["reconciles"]["full"] == full, "zebra's changes made the daemon recompute everything"
    assert st["reconciles"]["routes"] > updates
    assert_recompute_writes_nothing(d, lambda: fib_view(d), "after zebra's changes")
    src = d.status()["route_source"]
    assert src["offloaded"] + src["offload_failed"] == len(held), src


def test_fpm_status_follows_room_made_elsewhere(fastpath_bin):
    """A route left out for want of room is reported offloaded once a delete
    elsewhere makes room: a full recompute may change any route's status,
    not just those of the routes zebra changed."""
    with Lab() as lab:
        fpm_lab(lab)
        local = {ipaddress.ip_network("0.0.0.0/0" if r["dst"] == "default" else r["dst"], strict=False)
                 for r in json.loads(lab.ip(lab.router, "-4", "-j", "route", "show", "table", "local").stdout)}
        # Room for the local table and two of zebra's three routes.
        with Daemon(lab, extra=["--route-source", "fpm", "--fib4-entries", str(len(local) + 2)]) as d:
            r1 = ifindex(lab, "r1")
            c = connect(lab)
            for p in ["203.0.113.0/28", "203.0.113.16/28", "203.0.113.77/32"]:
                c.add_route(p, gateway=lab.S4, oif=r1)
            # Longest prefixes stay out first, the highest first among them.
            wait_for("the /32 reported failed", lambda: c.read_status(0.2) is not None
                     and c.statuses.get("203.0.113.77/32") and c.statuses["203.0.113.77/32"].failed)
            assert c.statuses["203.0.113.0/28"].offloaded and c.statuses["203.0.113.16/28"].offloaded
            c.del_route("203.0.113.0/28", gateway=lab.S4, oif=r1)
            wait_for("the /32 reported offloaded", lambda: c.read_status(0.2) is not None
                     and c.statuses["203.0.113.77/32"].offloaded)
            assert route(d, "203.0.113.77/32")["action"] == "forward"
            assert d.status()["route_source"]["offloaded"] == 2


# ---------------------------------------------------------------- real zebra

class Frr:
    """zebra (-M dplane_fpm_nl) and staticd in the router namespace, with their
    own config, sockets and pid files in a temp dir; stopped by pid."""

    def __init__(self, lab: Lab, statics: list[str]):
        self.lab = lab
        # The daemons drop to the frr user (root is not in the frrvty group),
        # which cannot enter the lab's private temp dir: a dir of their own.
        self.dir = Path(tempfile.mkdtemp(prefix=f"{lab.prefix}-frr-"))
        lab.defer(lambda: shutil.rmtree(self.dir, ignore_errors=True))
        shutil.chown(self.dir, "frr", "frr")
        (self.dir / "zebra.conf").write_text("hostname fpmtest\nfpm address 127.0.0.1\n")
        (self.dir / "staticd.conf").write_text("".join(f"{s}\n" for s in statics))
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, binary: Path, *extra: str) -> None:
        d = self.dir
        cmd = ["ip", "netns", "exec", self.lab.router, str(binary), *extra, "-u", "frr", "-g", "frr",
               "-i", str(d / f"{name}.pid"), "-z", str(d / "zserv.api"), "--vty_socket", str(d),
               "-f", str(d / f"{name}.conf"), "--log", f"file:{d / name}.log"]
        out = open(d / f"{name}.out", "wb")
        # `ip netns exec` execs the daemon (foreground): this pid is its own.
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.lab.defer(lambda: self.stop(name))

    def stop(self, name: str) -> None:
        p = self.procs.get(name)
        if p and p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()

    def vtysh(self, *cmds: str) -> str:
        args = []
        for c in cmds:
            args += ["-c", c]
        return self.lab.run(self.lab.router, "vtysh", "--vty_socket", str(self.dir), *args).stdout

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")))


@pytest.mark.skipif(not ZEBRA.exists() or not STATICD.exists(), reason="FRR not installed (scripts/setup.sh installs it)")
def test_fpm_route_flow_from_real_zebra(fpm):
    lab, d = fpm
    # The module's daemon: the client's routes were flushed when it left.
    frr = Frr(lab, [f"ip route {V4} {lab.S4}", f"ipv6 route {V6} {lab.S6}"])
    frr.start("zebra", ZEBRA, "-M", "dplane_fpm_nl")
    # staticd started before zebra serves its socket retries only after 10 s.
    wait_for("zebra's zserv socket", (frr.dir / "zserv.api").exists, timeout=5)
    frr.start("staticd", STATICD)
    try:
        wait_for("zebra's routes via FPM",
                 lambda: (route(d, V4) or {}).get("source") == "fpm" and route(d, V6), timeout=15)
    except AssertionError:
        raise AssertionError(f"{d.status().get('route_source')}\n{frr.logs()}\n{d.log_text()}")
    r = route(d, V4)
    assert r["action"] == "forward" and r["nexthop"]["gateway"] == lab.S4, r
    # zebra also replays the connected routes.
    assert (route(d, "198.51.100.0/24") or {}).get("source") == "fpm"
    send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(3)], lab.s0)
    send_and_expect(lab.c0, [udp6(lab, seq=i) for i in range(3)], lab.s0)

    # Deleted in FRR: gone from the fast path (zebra removes it from the kernel too).
    frr.vtysh("configure terminal", f"no ip route {V4} {lab.S4}")
    wait_for("the route deleted in zebra to leave the FIB", lambda: route(d, V4) is None, timeout=5)
    assert route(d, V6)["source"] == "fpm"
    st = d.status()["route_source"]
    assert st["connected"] and st["counters"]["messages"] > 0 and st["counters"]["decode_errors"] == 0, st
    frr.stop("staticd")
    frr.stop("zebra")
