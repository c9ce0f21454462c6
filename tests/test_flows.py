"""The flow cache seen from outside: `fastpath flows`, the cache counters
and the flow-hash source in `fastpath status`."""

from __future__ import annotations

import pytest

import json

from lab import Daemon, Lab, one_cpu, send_and_expect, wait_for
from pkts import udp4, udp6


# The module's tests only send traffic and compare counter deltas: they share
# one lab and one daemon.
@pytest.fixture(scope="module")
def lab(module_lab):
    return module_lab


@pytest.fixture(scope="module")
def daemon(module_daemon):
    return module_daemon


def test_flows_lists_the_cached_flows(daemon: Daemon, lab: Lab):
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    frames = []
    for sport, n in ((41000, 6), (41001, 3)):
        frames += [udp4(lab, sport=sport, seq=i) for i in range(n)]
    frames += [udp6(lab, sport=41002, seq=i) for i in range(4)]
    before = daemon.status()["flow_cache"]
    send_and_expect(lab.c0, frames, lab.s0)
    st = daemon.status()
    fc = st["flow_cache"]
    assert fc["enabled"] and fc["timeout_s"] == 30
    # First packet of each flow misses, the rest hit.
    assert fc["miss"] - before["miss"] >= 3
    assert fc["hit"] - before["hit"] >= 13 - 3

    flows = json.loads(daemon.cli("flows", "--json", "--limit", "0").stdout)
    ours = {(f["family"], f["sport"]): f for f in flows["flows"] if f["dport"] == 9}
    assert ours[("ipv4", 41000)]["packets"] == 6
    assert ours[("ipv4", 41001)]["packets"] == 3
    assert ours[("ipv6", 41002)]["packets"] == 4
    f = ours[("ipv4", 41000)]
    assert (f["src"], f["dst"], f["proto"]) == (lab.C4, lab.FAR4, 17)
    assert (f["ingress"], f["egress"], f["dmac"]) == ("r0", "r1", lab.s0.mac)
    assert f["current"] and f["idle_s"] <= 2
    # Busiest first.
    counts = [x["packets"] for x in flows["flows"]]
    assert counts == sorted(counts, reverse=True)
    text = daemon.cli("flows").stdout
    assert f"{lab.C4}:41000" in text and "PACKETS" in text


def test_a_new_neighbour_leaves_cached_flows_alone(daemon: Daemon, lab: Lab):
    """A neighbour entry appearing (a host resolved again after the kernel
    dropped its idle entry, an IPv6 host's link-local address) changes no
    cached result: the generation stays and the cached flow keeps hitting.
    A MAC change of that same entry, which a cached flow may hold, bumps."""
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    frames = lambda: [udp4(lab, sport=41010, seq=i) for i in range(3)]
    seen = []
    # The lab's own neighbours may still change on their own meanwhile (an
    # entry just resolved, a link-local one probed): an attempt that saw
    # another change is repeated with another address.
    with one_cpu():
        for attempt in range(3):
            addr = f"198.51.100.{97 + attempt}"
            lab.defer(lambda a=addr: lab.ip(lab.router, "neigh", "del", a, "dev", "r1", check=False))
            send_and_expect(lab.c0, frames(), lab.s0)  # cached under the current generation
            st0 = daemon.status()
            lab.ip(lab.router, "neigh", "replace", addr, "lladdr", "02:00:5e:00:53:99", "dev", "r1", "nud",
                   "permanent")
            wait_for("the daemon to mirror the new neighbour", lambda: ("r1", addr) in daemon.neighbour_view(), 5,
                     step=0.02)
            send_and_expect(lab.c0, frames(), lab.s0)
            st = daemon.status()
            fc0, fc = st0["flow_cache"], st["flow_cache"]
            seen.append((st0["generation"], st["generation"], st0["reconciles"], st["reconciles"], fc0, fc))
            if st["generation"] == st0["generation"] and st["reconciles"]["full"] == st0["reconciles"]["full"]:
                assert fc["stale"] == fc0["stale"] and fc["hit"] - fc0["hit"] >= 3, seen
                break
        else:
            raise AssertionError(f"every new neighbour came with a generation bump: {seen}")

    lab.ip(lab.router, "neigh", "replace", addr, "lladdr", "02:00:5e:00:53:9a", "dev", "r1", "nud", "permanent")
    wait_for("the MAC change to bump the generation",
             lambda: daemon.status()["generation"] > st["generation"], 5, step=0.02)
    assert daemon.neighbour_view()[("r1", addr)] == "02:00:5e:00:53:9a"


def test_status_names_the_flow_hash_source(daemon: Daemon, lab: Lab):
    """On veth the device-bound program loads (for the VLAN tag metadata) but
    does not ask for veth's RX hash, a software one (test_ecmp.py says why):
    fastpath hashes itself."""
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    before = next(i for i in daemon.status()["interfaces"] if i["name"] == "r0")["hash"]["packets"]
    send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(5)], lab.s0)
    r0 = next(i for i in daemon.status()["interfaces"] if i["name"] == "r0")
    assert r0["hash"]["variant"] == "meta hint / software (device-bound)", r0["hash"]
    assert r0["hash"]["packets"]["software"] - before["software"] >= 5, r0["hash"]
    assert r0["hash"]["packets"]["nic"] == 0, r0["hash"]
    assert "meta hint / software (device-bound)" in daemon.cli("status").stdout


def test_rx_hash_nic_asks_veth(fastpath_bin):
    """`--rx-hash nic` asks veth too: packets a socket sent arrive as skbs,
    for which veth computes an RX hash; XDP-redirected frames would have none."""
    with Lab() as lab, Daemon(lab, extra=["--rx-hash", "nic"]) as d:
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(5)], lab.s0)
        r0 = next(i for i in d.status()["interfaces"] if i["name"] == "r0")
        assert r0["hash"]["variant"] == "nic rx-hash", r0["hash"]
        assert r0["hash"]["packets"]["nic"] >= 5, r0["hash"]
        assert "nic rx-hash" in d.cli("status").stdout


def test_cache_off(fastpath_bin):
    with Lab() as lab, Daemon(lab, extra=["--flow-timeout", "0", "--rx-hash", "off"]) as d:
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(5)], lab.s0)
        st = d.status()
        assert not st["flow_cache"]["enabled"]
        assert st["flow_cache"]["hit"] == st["flow_cache"]["miss"] == 0
        assert st["totals"]["forwarded"]["packets"] >= 5
        r0 = next(i for i in st["interfaces"] if i["name"] == "r0")
        assert r0["hash"]["variant"] == "meta hint / software"
        assert "flow cache: off" in d.cli("status").stdout


def test_a_crowded_cache_is_bypassed(fastpath_bin):
    """Far more live flows than the cache holds: after a window of misses
    into full sets the program sends most packets past the cache (counted as
    `bypass`), and every one of them is still forwarded."""
    with Lab() as lab, Daemon(lab, extra=["--flow-entries", "16"]) as d:
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        n = 1500
        send_and_expect(lab.c0, [udp4(lab, sport=20000 + i) for i in range(n)], lab.s0, gap=0)
        st = d.status()
        fc = st["flow_cache"]
        assert fc["entries_per_cpu"] == 16, fc
        assert fc["bypass"] > 0, fc
        assert fc["hit"] + fc["miss"] + fc["bypass"] >= n, fc
        assert st["totals"]["forwarded"]["packets"] >= n, st["totals"]
        assert f"bypass {fc['bypass']}" in d.cli("status").stdout


def test_flow_key_addresses_caches_an_address_pair_once(fastpath_bin):
    """`--flow-key addresses`: the connections between two hosts share one
    cached entry (ports 0 in `fastpath flows`, their packets summed), each
    family its own; every packet still arrives as sent; `status` says how
    flows are keyed."""
    with Lab() as lab, Daemon(lab, extra=["--flow-key", "addresses"]) as d:
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        frames = [udp4(lab, sport=42000 + i % 4, seq=i) for i in range(12)]
        frames += [udp6(lab, sport=42100 + i % 3, seq=i) for i in range(6)]
        before = d.status()["flow_cache"]
        with one_cpu():  # the cache is per CPU
            send_and_expect(lab.c0, frames, lab.s0)
        st = d.status()
        fc = st["flow_cache"]
        assert fc["key"] == "addresses", fc
        # The server's ICMP port unreachables come back as flows of their own.
        assert fc["hit"] - before["hit"] >= 16, (before, fc)
        flows = json.loads(d.cli("flows", "--json", "--limit", "0").stdout)["flows"]
        udp = [f for f in flows if f["proto"] == 17]
        ours = {f["family"]: f for f in udp if f["dst"] in (lab.FAR4, lab.FAR6)}
        assert len(udp) == 2, flows
        assert set(ours) == {"ipv4", "ipv6"}, flows
        assert (ours["ipv4"]["sport"], ours["ipv4"]["dport"], ours["ipv4"]["packets"]) == (0, 0, 12)
        assert (ours["ipv6"]["sport"], ours["ipv6"]["dport"], ours["ipv6"]["packets"]) == (0, 0, 6)
        assert "keyed by address pair" in d.cli("status").stdout
    with Lab() as lab, Daemon(lab) as d:
        assert d.status()["flow_cache"]["key"] == "ports"
        assert "keyed by 5-tuple" in d.cli("status").stdout
