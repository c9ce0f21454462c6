"""`fastpath run --reservation-model MODEL --resource-target bpf|sim-asic`
(issue #5): routes reach the maps only through the model, and the
no-blackhole rule holds under every model and target.

The lab's routes fit; a more specific route to 203.0.113.77 (via the second
server link, r2) inside 203.0.113.0/24 (via r1) does not: a /32 on the BPF
target, a /28 on the simulated ASIC. On the BPF target the FIB
map is sized to what the lab holds (`--fib4-entries`); on the simulated ASIC
its LPM memory is (`--sim-lpm-units`, host routes live in its hash memory).
It must not be forwarded by the fast-path /24: the /24 becomes a punt
and the kernel sends the packet out r2. Deleting another route makes room:
the more specific route is admitted, written and fast-path forwarded.
"""

from __future__ import annotations

import ipaddress
import json
import os

import pytest

from lab import FASTPATH, Daemon, Lab, counter_delta, send_and_capture, sh
from pkts import IP, UDP, Ether, Raw
from test_overflow import routes_by_prefix, wait_routes

HOST = "203.0.113.77"
SPARE = "198.51.100.64/26"


def fib4_prefixes(lab: Lab) -> set:
    prefixes = set()
    for table in ("local", "main"):
        for r in json.loads(lab.ip(lab.router, "-4", "-j", "route", "show", "table", table).stdout):
            dst = "0.0.0.0/0" if r["dst"] == "default" else r["dst"]
            prefixes.add(ipaddress.ip_network(dst, strict=False))
    return prefixes


def lpm_units(lab: Lab, extra: list[str]) -> int:
    """What the daemon's FIB takes of the simulated ASIC's LPM memory (both
    families share it), asked of a daemon with room to spare: IPv4 prefixes
    cost 1, IPv6 up to /64 2, longer 4; host routes go to the hash memory."""
    with Daemon(lab, extra=extra) as d:
        wait_routes(d, {"203.0.113.0/24": "ok", SPARE: "ok"})
        units = 0
        for r in d.routes():
            n = ipaddress.ip_network(r["prefix"])
            if n.version == 4 and n.prefixlen < 32:
                units += 1
            elif n.version == 6 and n.prefixlen <= 64:
                units += 2
            elif n.version == 6 and n.prefixlen < 128:
                units += 4
        return units


def ours(delta: dict[str, int]) -> dict[str, int]:
    """The counters our one frame (IPv4 unicast) can move: the lab's own
    chatter (ARP, IPv6 link-local, MLD and ND to multicast groups) counts as
    not_ip / link_local / multicast meanwhile."""
    return {k: v for k, v in delta.items() if k not in ("not_ip", "link_local", "multicast")}


def send(lab: Lab) -> dict[str, list[bytes]]:
    f = bytes(Ether(src=lab.c0.mac, dst=lab.r0.mac) / IP(src=lab.C4, dst=HOST, ttl=9)
              / UDP(sport=40001, dport=9) / Raw(b"models"))
    return send_and_capture(lab.c0, [f], [lab.s0, lab.s1])


@pytest.mark.parametrize("target,model", [("bpf", "lockstep"), ("sim-asic", "credit"), ("sim-asic", "prefetch:4")])
def test_model_admits_forwards_and_never_blackholes(lab2, fastpath_bin, target, model):
    lab = lab2
    # The prefix that does not fit: the longest (trimmed first) of the BPF
    # FIB, where host routes are the lab's longest too (last by address);
    # of the ASIC's LPM memory, where host routes do not go.
    MORE = f"{HOST}/32" if target == "bpf" else "203.0.113.64/28"
    lab.resolve_neighbours()
    lab.ip(lab.router, "route", "add", SPARE, "via", lab.S4)

    # The kernel alone: HOST goes out r2 by MORE, what s1 receives is the reference.
    lab.ip(lab.router, "route", "add", MORE, "via", lab.S1_4)
    kernel = send(lab)
    assert len(kernel["s1"]) == 1 and not kernel["s0"], kernel
    lab.ip(lab.router, "route", "del", MORE)

    extra = ["--reservation-model", model, "--resource-target", target]
    if target == "bpf":
        extra += ["--fib4-entries", str(len(fib4_prefixes(lab)))]
    else:
        extra += ["--sim-lpm-units", str(lpm_units(lab, extra))]
    with Daemon(lab, extra=extra) as d:
        rs = wait_routes(d, {"203.0.113.0/24": "ok", SPARE: "ok"})
        assert all(r["offload"] == "ok" for r in rs.values()), rs
        adm = d.status()["admission"]
        assert (adm["target"], adm["model"]) == (target, model.split(":")[0]), adm
        assert adm["refused"] == 0 and adm["installed"] >= len(rs) - 1, adm
        res = json.loads(d.cli("resources", "--json").stdout)
        if target == "sim-asic":
            # The device's shared pools, with what each kind of entry costs, beside the maps.
            dev = res["device"]
            assert (dev["target"], dev["model"]) == ("sim-asic", model.split(":")[0]), dev
            pools = {r["name"]: r for r in dev["resources"]}
            assert any(r["costs"] for r in pools.values()), pools
            assert sum(r["used"] for r in pools.values()) >= adm["installed"], (pools, adm)
            assert res["target"] == "bpf" and any(r["name"] == "fib4" for r in res["resources"]), res
            # A batch reserves only against the BPF maps: refused whole, not half-kept.
            f = lab.tmp / "batch.txt"
            f.write_text("192.0.2.128/25 via " + lab.S4 + "\n")
            p = d.cli("route", "add", "--batch", str(f), check=False)
            assert p.returncode != 0 and "--resource-target bpf" in p.stderr, (p.returncode, p.stderr)
            assert "192.0.2.128" not in lab.ip(lab.router, "-4", "route", "show").stdout
        before = d.counters("r0")
        assert len(send(lab)["s0"]) == 1, "the /24 is not forwarded"
        assert ours(counter_delta(before, d.counters("r0"))) == {"forwarded": 1}
        if target == "bpf":
            assert "device" not in res, res

        lab.ip(lab.router, "route", "add", MORE, "via", lab.S1_4)
        rs = wait_routes(d, {MORE: "failed", "203.0.113.0/24": "punted-cover"})
        assert rs[MORE]["action"] == "none"
        assert rs["203.0.113.0/24"]["action"] == "punt" and rs["203.0.113.0/24"]["reason"] == "table_full"
        assert d.status()["routes_offload_failed"] == 1
        if target == "sim-asic":
            assert d.status()["admission"]["refused"] == 1
        before = d.counters("r0")
        got = send(lab)
        assert not got["s0"], "forwarded by the less specific fast-path route"
        assert got["s1"] == kernel["s1"], "not what the kernel alone sends"
        assert ours(counter_delta(before, d.counters("r0"))) == {"table_full": 1}

        # A delete makes room: the route is admitted, written, and forwarded by the fast path.
        lab.ip(lab.router, "route", "del", SPARE)
        rs = wait_routes(d, {MORE: "ok", "203.0.113.0/24": "ok"})
        assert rs[MORE]["action"] == "forward" and rs[MORE]["nexthop"]["dev"] == "r2", rs[MORE]
        assert SPARE not in routes_by_prefix(d)
        before = d.counters("r0")
        got = send(lab)
        assert got["s1"] == kernel["s1"] and not got["s0"], got
        assert ours(counter_delta(before, d.counters("r0"))) == {"forwarded": 1}


def test_sim_asic_refuses_pinning(lab, fastpath_bin):
    """A simulated ASIC's tables live in the daemon: a pinned restart would
    adopt maps it knows nothing of. Refused before anything is attached."""
    p = sh("ip", "netns", "exec", lab.router, str(FASTPATH), "run", "-i", "r0", "-i", "r1",
           "--resource-target", "sim-asic", "--pin", "--pin-dir", f"/sys/fs/bpf/fptest-{os.getpid()}-sim",
           "--socket", str(lab.tmp / "sim.sock"), check=False, timeout=30)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert any("sim-asic" in ln and "--pin" in ln for ln in lines), p.stderr
    assert not lab.xdp_attached(), "something stayed attached after a refused start"
