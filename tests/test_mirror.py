"""The daemon's mirror of kernel state under stress: neighbour keep-alive and
netlink overruns, end to end."""

from __future__ import annotations

import ipaddress
import random
import threading
import time

from lab import Daemon, Lab, Sender, assert_recompute_writes_nothing, counter_delta, set_hash_seed, wait_for
from pkts import udp4, udp6, udp_series


def neigh_state(lab: Lab, addr: str, dev: str = "r1") -> str | None:
    out = lab.ip(lab.router, "neigh", "show", addr, "dev", dev).stdout.split()
    return out[-1] if out else None


class OneWayStream:
    """UDP from the client to the server at a steady rate, in a thread. The
    server drops it silently, so nothing the server sends can refresh the
    router's neighbour entry: only fastpath's keep-alive can."""

    def __init__(self, lab: Lab, dst: str, pps: int = 50):
        lab.run(lab.server, "nft", "add", "table", "ip", "sink")
        lab.run(lab.server, "nft", "add", "chain", "ip", "sink", "input",
                "{ type filter hook input priority 0; policy accept; }")
        lab.run(lab.server, "nft", "add", "rule", "ip", "sink", "input", "udp", "dport", "9", "drop")
        self.frames = udp_series(udp4, lab, range(pps), dst=dst)
        self.sender = Sender(lab.c0)
        self.gap = 1.0 / pps
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        lab.defer(self.close)

    def _run(self) -> None:
        i = 0
        while not self.stop.wait(self.gap):
            self.sender.send(self.frames[i % len(self.frames)])
            i += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sender.close()


def route_entry(daemon: Daemon, prefix: str) -> dict | None:
    return next((r for r in daemon.routes() if r["prefix"] == prefix), None)


def r0_deltas(lab: Lab, daemon: Daemon, frames) -> dict[str, int]:
    """r0's counter deltas for `frames` sent by the client."""
    sent = daemon.counters("r0")
    tx = Sender(lab.c0)
    for f in frames:
        tx.send(f)
    tx.close()
    time.sleep(0.3)
    return counter_delta(sent, daemon.counters("r0"))


def test_vanished_neighbour_stops_the_fast_path_like_the_kernel(lab, daemon):
    """A neighbour that stops answering must stop the fast path the way it
    stops the kernel: the kernel's probes fail (FAILED/INCOMPLETE), the mirror
    drops the entry, and fastpath hands the flow back to the kernel (no_neigh)
    instead of sending to a MAC nobody answers for. Also checks that the
    keep-alive reports the in-use entry (neigh_keepalives).

    What this cannot show on 6.18: that the keep-alive is *needed*. In this
    lab the kernel keeps a once-probed entry cycling REACHABLE/DELAY even
    when idle (`ip -s neigh` shows used 0), so it detects the dead neighbour
    on its own; the NTF_USE re-probe of a STALE entry is tested directly in
    crates/fastpath-core/tests/mirror_netns.rs."""
    for key, value in (("base_reachable_time_ms", "500"), ("delay_first_probe_time", "1"),
                       ("retrans_time_ms", "100"), ("ucast_solicit", "3"), ("mcast_solicit", "3")):
        lab.sysctl(lab.router, f"net.ipv4.neigh.r1.{key}", value)
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    OneWayStream(lab, Lab.S4)

    # Several reachable-time periods of one-way fast-pathed traffic.
    time.sleep(3.0)
    before = daemon.counters("r0")
    time.sleep(1.0)
    d = counter_delta(before, daemon.counters("r0"))
    assert d.get("forwarded", 0) >= 40 and d.get("no_neigh", 0) == 0, d
    assert daemon.status()["neigh_keepalives"] > 0

    # The server stops answering ARP: the kernel's probes must fail.
    lab.ip(lab.server, "link", "set", "s0", "arp", "off")
    wait_for("the router's neighbour to fail",
             lambda: neigh_state(lab, Lab.S4) in (None, "FAILED", "INCOMPLETE"), timeout=8)
    daemon.wait_converged(0.3)
    before = daemon.counters("r0")
    time.sleep(1.0)
    d = counter_delta(before, daemon.counters("r0"))
    assert d.get("forwarded", 0) == 0 and d.get("no_neigh", 0) > 0, d


def test_neighbour_only_changes_write_just_those_entries(lab, daemon):
    """A neighbour that appears, changes its MAC and goes is written as its
    entry alone (no full recompute); a full recompute afterwards (SIGHUP)
    finds nothing to write."""
    addr = "198.51.100.99"  # on r1's subnet; nothing is sent to it

    def entry():
        return next((n for n in daemon.neighbours() if n["address"] == addr), None)

    def reconciles():
        return daemon.status()["reconciles"]

    before = reconciles()
    lab.ip(lab.router, "neigh", "replace", addr, "lladdr", "02:00:00:00:00:99", "dev", "r1", "nud", "permanent")
    e = wait_for("neighbour mirrored", entry, 5)
    assert e["mac"] == "02:00:00:00:00:99" and e["dev"] == "r1", e
    lab.ip(lab.router, "neigh", "replace", addr, "lladdr", "02:00:00:00:00:98", "dev", "r1", "nud", "permanent")
    wait_for("the new MAC", lambda: (entry() or {}).get("mac") == "02:00:00:00:00:98", 5)
    lab.ip(lab.router, "neigh", "del", addr, "dev", "r1")
    wait_for("neighbour gone", lambda: entry() is None, 5)
    after = reconciles()
    assert after["neighbours"] >= before["neighbours"] + 3 and after["full"] == before["full"], (before, after)

    def table():  # what the maps hold, not how recently the data path used it
        return sorted((n["ifindex"], n["address"], n["mac"]) for n in daemon.neighbours())

    assert_recompute_writes_nothing(daemon, table)


def test_link_changes_restrict_the_interface_ahead_of_the_recompute(lab, daemon):
    """What a link change takes away (r1 losing carrier, a smaller MTU,
    rp_filter turned on) is written to r1's interface entry before the route
    re-dump and full recompute the change needs (seconds with a full table:
    `fastpath bench fulltable` times it); what gives permission back (the
    old MTU, rp_filter off) waits for the recompute, except the carrier
    coming back, which changes nothing but the interface entry (counted
    `links`, no recompute)."""

    def reconciles():
        return daemon.status()["reconciles"]

    def r1():
        return next(i for i in daemon.status()["interfaces"] if i["name"] == "r1")

    def ip(*args):
        return lambda: lab.ip(*args)

    def rp_filter(v):
        return lambda: lab.sysctl(lab.router, "net.ipv4.conf.r1.rp_filter", v)

    for what, take, give, taken in (
        ("carrier loss", ip(lab.server, "link", "set", "s0", "down"), ip(lab.server, "link", "set", "s0", "up"),
         lambda i: not i["up"]),
        ("smaller MTU", ip(lab.router, "link", "set", "r1", "mtu", "1400"), ip(lab.router, "link", "set", "r1", "mtu", "1500"),
         lambda i: i["mtu"] == 1400),
        ("rp_filter on", rp_filter("1"), rp_filter("0"), lambda i: i["rp_filter"] == 1),
    ):
        before = reconciles()
        take()
        try:
            wait_for(f"the recompute after {what}", lambda: reconciles()["full"] > before["full"] and taken(r1()), 5)
            mid = reconciles()
            assert mid["ahead"] == before["ahead"] + 1, (what, before, mid)
        finally:
            give()
        if what == "carrier loss":
            wait_for("the carrier back", lambda: reconciles()["links"] > mid["links"] and not taken(r1()), 5)
            assert reconciles()["full"] == mid["full"], reconciles()
        else:
            wait_for(f"the recompute after undoing {what}", lambda: reconciles()["full"] > mid["full"] and not taken(r1()), 5)
        assert reconciles()["ahead"] == mid["ahead"], what


def test_a_bridge_port_forwards_nothing_in_or_out(lab, daemon):
    """A managed port enslaved to a bridge is no L3 interface any more: the
    kernel hands what arrives on it to the bridge and routes out by the
    bridge. So nothing arriving on it is forwarded (forwarding_disabled),
    nothing is sent out through it (egress_down), status says why; and all
    is fast again once it leaves the bridge."""

    def pings(ns: str, dst: str) -> dict:
        before = {i: daemon.counters(i) for i in ("r0", "r1")}
        lab.run(ns, "ping", "-4", "-c3", "-i0.05", "-W1", "-q", dst, check=False)
        return {i: counter_delta(before[i], daemon.counters(i)) for i in ("r0", "r1")}

    def problems() -> str:
        return " ".join(daemon.status()["families"]["ipv4"]["problems"])

    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    assert pings(lab.client, Lab.S4)["r0"].get("forwarded", 0) == 3
    lab.ip(lab.router, "link", "add", "fpbr", "type", "bridge")
    lab.ip(lab.router, "link", "set", "r0", "master", "fpbr")
    try:
        wait_for("the bridge port in status", lambda: "r0 is a port of fpbr (bridge)" in problems(), 5)
        d = pings(lab.client, Lab.S4)
        assert d["r0"].get("forwarded", 0) == 0 and d["r0"].get("forwarding_disabled", 0) == 3, d
        d = pings(lab.server, Lab.C4)
        assert d["r1"].get("forwarded", 0) == 0 and d["r1"].get("egress_down", 0) == 3, d
    finally:
        lab.ip(lab.router, "link", "set", "r0", "nomaster")
        lab.ip(lab.router, "link", "del", "fpbr")
    wait_for("the port back", lambda: "fpbr" not in problems(), 5)
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    assert pings(lab.client, Lab.S4)["r0"].get("forwarded", 0) == 3


def test_carrier_back_leaves_the_full_recompute_tables(lab, daemon):
    """While r1 has no carrier its multipath members are marked down, which
    the data plane punts; carrier back clears the marks (the mirror does it
    itself, no re-dump), gives r1 its entry back and rewrites those routes,
    without a full recompute: a SIGHUP recompute afterwards writes nothing."""
    prefix = "203.0.113.128/25"

    def reconciles():
        return daemon.status()["reconciles"]

    def r1_up():
        return next(i for i in daemon.status()["interfaces"] if i["name"] == "r1")["up"]

    def paths():
        e = next((r for r in daemon.routes() if r["prefix"] == prefix), None)
        if e is None or e["action"] != "multipath":
            return None
        return [p["nexthop"] is not None for p in e["group"]["paths"]]

    set_hash_seed(lab, daemon)
    lab.ip(lab.router, "route", "add", prefix, "nexthop", "via", "198.51.100.30", "dev", "r1",
           "nexthop", "via", "198.51.100.31", "dev", "r1")
    wait_for("the multipath route", lambda: paths() == [True, True], 5)
    lab.ip(lab.server, "link", "set", "s0", "down")
    try:
        wait_for("r1 down and its paths punted", lambda: not r1_up() and paths() == [False, False], 5)
        mid = reconciles()
    finally:
        lab.ip(lab.server, "link", "set", "s0", "up")
    wait_for("carrier back", lambda: r1_up() and paths() == [True, True], 5)
    after = reconciles()
    assert after["full"] == mid["full"] and after["links"] == mid["links"] + 1, (mid, after)
    assert_recompute_writes_nothing(daemon, daemon.routes)


def test_a_new_rule_punts_its_family_ahead_of_the_recompute(lab, daemon):
    """An ip rule added makes the kernel look up another table for some
    packets: the family is punted before the full recompute (which says so
    in its problems); the rule's removal waits for the recompute."""

    def reconciles():
        return daemon.status()["reconciles"]

    def fast4():
        return daemon.status()["families"]["ipv4"]["fast_path"]

    before = reconciles()
    assert fast4()
    rule = ("rule", "add", "from", "192.0.2.0/24", "table", "100", "pref", "100")
    lab.ip(lab.router, *rule)
    try:
        wait_for("the full recompute", lambda: reconciles()["full"] > before["full"] and not fast4(), 5)
        mid = reconciles()
        assert mid["ahead"] == before["ahead"] + 1, (before, mid)
    finally:
        lab.ip(lab.router, "rule", "del", *rule[2:])
    wait_for("IPv4 fast again", fast4, 5)
    assert reconciles()["ahead"] == mid["ahead"]


def test_a_new_address_is_punted_ahead_of_the_recompute(lab, daemon):
    """An address added to the router (a virtual address taken over) is
    made local in the FIB before the full recompute its change needs; its
    removal waits for the recompute. Traffic to it goes to the kernel."""
    vip = "198.51.100.77"  # inside r1's subnet, added to r0

    def reconciles():
        return daemon.status()["reconciles"]

    def action():
        return next((r["action"] for r in daemon.routes() if r["prefix"] == f"{vip}/32"), None)

    before = reconciles()
    lab.ip(lab.router, "addr", "add", f"{vip}/32", "dev", "r0")
    try:
        wait_for("the full recompute", lambda: reconciles()["full"] > before["full"], 5)
        mid = reconciles()
        assert mid["ahead"] >= before["ahead"] + 1, (before, mid)
        assert action() == "local", daemon.routes()
        lab.resolve_neighbours()
        d = r0_deltas(lab, daemon, udp_series(udp4, lab, range(5), dst=vip))
        assert d.get("local", 0) == 5 and d.get("forwarded", 0) == 0, d
    finally:
        lab.ip(lab.router, "addr", "del", f"{vip}/32", "dev", "r0")
    wait_for("the address gone from the FIB", lambda: action() != "local", 5)
    assert reconciles()["ahead"] == mid["ahead"]


def test_the_last_ipv4_address_gone_punts_ipv4_out_of_its_interface_ahead_of_the_redump(lab, daemon):
    """An interface losing its last IPv4 address makes the kernel flush
    every IPv4 route through it without a message each. The daemon punts
    IPv4 leaving by it at once (counted `ahead`), before the route re-dump
    and recompute (seconds with a full table); IPv6 goes on being
    forwarded, and the recompute lifts the punt: an IPv4 route through the
    interface, added while it has no address, is fast-pathed."""
    def entry(prefix):
        return route_entry(daemon, prefix)

    def reconciles():
        return daemon.status()["reconciles"]

    def send(mk, n=5):
        return r0_deltas(lab, daemon, udp_series(mk, lab, range(n)))

    lab.gateway_routes()
    wait_for("the gateway routes", lambda: entry(Lab.REMOTE4) and entry(Lab.REMOTE6), 5)
    lab.resolve_neighbours()
    before = reconciles()
    lab.ip(lab.router, "addr", "del", f"{Lab.R1_4}/24", "dev", "r1")
    try:
        # The kernel said nothing about the route via S4: only the re-dump shows it gone.
        wait_for("the flushed route gone", lambda: entry(Lab.REMOTE4) is None, 5)
        daemon.wait_converged(0.3)
        after = reconciles()
        assert after["ahead"] > before["ahead"] and after["full"] > before["full"], (before, after)
        assert "r1 (last IPv4 address gone: IPv4 punted)" in daemon.log.read_text()
        d = send(udp6)
        assert d.get("forwarded", 0) == 5, d
        # No address needed to route through it; the kernel's neighbour entry stays put.
        lab.ip(lab.router, "neigh", "replace", Lab.S4, "lladdr", lab.s0.mac, "dev", "r1", "nud", "permanent")
        lab.ip(lab.router, "route", "add", Lab.REMOTE4, "via", Lab.S4, "dev", "r1", "onlink")
        wait_for("the route without an address", lambda: (entry(Lab.REMOTE4) or {}).get("action") == "forward", 5)
        d = send(udp4)
        assert d.get("forwarded", 0) == 5 and d.get("egress_down", 0) == 0, d
    finally:
        lab.ip(lab.router, "route", "del", Lab.REMOTE4, check=False)
        lab.ip(lab.router, "neigh", "del", Lab.S4, "dev", "r1", check=False)
        lab.ip(lab.router, "addr", "add", f"{Lab.R1_4}/24", "dev", "r1", check=False)


def test_ipv6_switched_off_on_the_egress_stops_ipv6_through_it_at_once(lab, daemon):
    """net.ipv6.conf.r1.disable_ipv6=1: the kernel drops IPv6 leaving by r1
    (ip6_output) and flushes r1's IPv6 routes, unannounced under
    net.ipv6.route.skip_notify_on_dev_down=1. Only the addresses' messages
    tell: the daemon re-reads r1's sysctls on them, punts IPv6 out of r1 at
    once (counted `ahead`) and re-dumps the routes; IPv4 goes on. Switched
    on again, with its address and route back, IPv6 is fast-pathed again."""
    def entry(prefix):
        return route_entry(daemon, prefix)

    def reconciles():
        return daemon.status()["reconciles"]

    def send(mk, n=5):
        return r0_deltas(lab, daemon, udp_series(mk, lab, range(n)))

    lab.sysctl(lab.router, "net.ipv6.route.skip_notify_on_dev_down", "1")
    lab.gateway_routes()
    wait_for("the gateway routes", lambda: entry(Lab.REMOTE4) and entry(Lab.REMOTE6), 5)
    lab.resolve_neighbours()
    assert send(udp6).get("forwarded", 0) == 5
    before = reconciles()
    lab.sysctl(lab.router, "net.ipv6.conf.r1.disable_ipv6", "1")
    # Nothing announced the route's end: only the re-dump shows it gone.
    wait_for("the flushed IPv6 route gone", lambda: entry(Lab.REMOTE6) is None, 5)
    daemon.wait_converged(0.3)
    after = reconciles()
    assert after["ahead"] > before["ahead"] and after["full"] > before["full"], (before, after)
    r1 = next(i for i in daemon.status()["interfaces"] if i["name"] == "r1")
    assert not r1["fwd6"], r1
    d = send(udp6)
    assert d.get("forwarded", 0) == 0 and d.get("no_route", 0) == 5, d
    d = send(udp4)
    assert d.get("forwarded", 0) == 5, d

    lab.sysctl(lab.router, "net.ipv6.conf.r1.disable_ipv6", "0")
    lab.ip(lab.router, "-6", "addr", "add", f"{Lab.R1_6}/64", "dev", "r1", "nodad")
    lab.ip(lab.router, "-6", "route", "replace", Lab.REMOTE6, "via", Lab.S6)
    wait_for("the IPv6 route back", lambda: (entry(Lab.REMOTE6) or {}).get("action") == "forward", 5)
    lab.resolve_neighbours()
    d = send(udp6)
    assert d.get("forwarded", 0) == 5, d


def test_a_port_given_a_new_mac_address_is_followed(lab, daemon):
    """`ip link set r0 address NEW`: frames still sent to the old address
    are not the router's any more (the kernel drops them as another host's)
    and are never forwarded; frames to the new one are, and leave r1 from
    r1's own address as before."""
    old, new = lab.r0.mac, "02:00:00:00:09:09"

    def send(dst_mac, n=5):
        mac = bytes.fromhex(dst_mac.replace(":", ""))
        return r0_deltas(lab, daemon, [mac + f[6:] for f in udp_series(udp4, lab, range(n))])

    lab.gateway_routes()
    wait_for("the gateway route", lambda: route_entry(daemon, Lab.REMOTE4), 5)
    lab.resolve_neighbours()
    assert send(old).get("forwarded", 0) == 5
    lab.ip(lab.router, "link", "set", "r0", "address", new)
    try:
        wait_for("the new address in status", lambda: next(
            i["mac"] for i in daemon.status()["interfaces"] if i["name"] == "r0") == new, 5)
        d = send(old)
        assert d.get("forwarded", 0) == 0 and d.get("l2_other_host", 0) == 5, d
        d = send(new)
        assert d.get("forwarded", 0) == 5, d
    finally:
        lab.ip(lab.router, "link", "set", "r0", "address", old)


def test_a_deleted_next_hop_object_punts_its_routes_ahead_of_the_redump(lab, daemon):
    """`ip nexthop del` takes the routes using the object with it, without a
    message each: the daemon punts their prefixes at once (counted `ahead`),
    before the route re-dump and recompute that remove them."""
    prefix = "203.0.113.128/25"

    def entry():
        return next((r for r in daemon.routes() if r["prefix"] == prefix), None)

    def reconciles():
        return daemon.status()["reconciles"]

    lab.ip(lab.router, "nexthop", "add", "id", "911", "via", Lab.S4, "dev", "r1")
    lab.ip(lab.router, "route", "add", prefix, "nhid", "911")
    e = wait_for("the route to object 911", entry, 5)
    assert e["action"] == "forward" and e["nexthop"]["gateway"] == Lab.S4, e
    before = reconciles()
    lab.ip(lab.router, "nexthop", "del", "id", "911")
    wait_for("the route gone", lambda: entry() is None, 5)
    after = reconciles()
    assert after["ahead"] == before["ahead"] + 1 and after["full"] > before["full"], (before, after)
    assert "prefixes routed through deleted next-hop objects punted ahead" in daemon.log.read_text()


def test_route_only_changes_write_just_those_routes(lab, daemon):
    """Route changes are written as those entries alone, with the next hops
    and ECMP groups they bring or leave unused (no full recompute): a route
    via a next hop in use, a /32 blackhole, a route via a new gateway, a
    multipath route, routes to next-hop objects and the objects' own
    changes. A full recompute afterwards (SIGHUP) finds nothing to write:
    the route-only updates left exactly its tables."""
    prefix = "203.0.113.128/25"  # inside the remote /24
    other = "203.0.113.64/26"

    def entry(p=prefix):
        return next((r for r in daemon.routes() if r["prefix"] == p), None)

    def reconciles():
        return daemon.status()["reconciles"]

    def gateways(e):
        if e is None:
            return None
        if e["action"] == "multipath":
            return sorted(p["nexthop"]["gateway"] for p in e["group"]["paths"])
        return [e["nexthop"]["gateway"]] if e["action"] == "forward" else e["action"]

    # Its full recompute must not make the next route change one too.
    set_hash_seed(lab, daemon)
    lab.gateway_routes()  # the remote prefix via S4: that next hop is in use
    wait_for("gateway route mirrored", lambda: any(r["prefix"] == Lab.REMOTE4 for r in daemon.routes()), 5)
    before = reconciles()
    lab.ip(lab.router, "route", "add", prefix, "via", Lab.S4)
    wait_for("route via S4", lambda: gateways(entry()) == [Lab.S4], 5)
    lab.ip(lab.router, "route", "del", prefix)
    wait_for("route gone", lambda: entry() is None, 5)
    # A remotely triggered blackhole: a /32 (and its source-deny entry).
    lab.ip(lab.router, "route", "add", "blackhole", "203.0.113.200/32")
    wait_for("blackhole mirrored", lambda: any(r["prefix"] == "203.0.113.200/32" and r["action"] == "blackhole"
                                              for r in daemon.routes()), 5)
    # 198.51.100.77 is no next hop yet: a new next-hop entry comes first.
    lab.ip(lab.router, "route", "add", prefix, "via", "198.51.100.77")
    wait_for("route via a new gateway", lambda: gateways(entry()) == ["198.51.100.77"], 5)
    # Multipath over both gateways: a new group; then back to one path,
    # which leaves the group unused.
    lab.ip(lab.router, "route", "replace", prefix, "nexthop", "via", Lab.S4, "nexthop", "via", "198.51.100.77")
    wait_for("multipath route", lambda: gateways(entry()) == sorted([Lab.S4, "198.51.100.77"]), 5)
    # Next-hop objects, as FRR installs routes: objects first (nothing uses
    # them yet), then routes to them, then an object changes under them.
    lab.ip(lab.router, "nexthop", "add", "id", "901", "via", Lab.S4, "dev", "r1")
    lab.ip(lab.router, "nexthop", "add", "id", "902", "via", "198.51.100.78", "dev", "r1")
    lab.ip(lab.router, "nexthop", "add", "id", "903", "group", "901/902")
    lab.ip(lab.router, "route", "add", other, "nhid", "901")
    lab.ip(lab.router, "route", "replace", prefix, "nhid", "903")
    wait_for("routes to next-hop objects", lambda: gateways(entry(other)) == [Lab.S4]
             and gateways(entry()) == sorted([Lab.S4, "198.51.100.78"]), 5)
    lab.ip(lab.router, "nexthop", "replace", "id", "901", "via", "198.51.100.77", "dev", "r1")
    wait_for("the routes through object 901 follow it", lambda: gateways(entry(other)) == ["198.51.100.77"]
             and gateways(entry()) == sorted(["198.51.100.77", "198.51.100.78"]), 5)
    lab.ip(lab.router, "nexthop", "replace", "id", "903", "group", "902")
    wait_for("the group's route follows it", lambda: gateways(entry()) == ["198.51.100.78"], 5)
    after = reconciles()
    assert after["routes"] >= before["routes"] + 8 and after["full"] == before["full"], (before, after)

    lab.ip(lab.router, "route", "replace", prefix, "via", Lab.S4)
    lab.ip(lab.router, "route", "del", other)
    wait_for("route back via S4", lambda: gateways(entry()) == [Lab.S4] and entry(other) is None, 5)
    # FRR deletes objects once no route uses them, a group before its
    # members: nothing vanishes unannounced, so no route re-dump and no
    # full recompute (seconds with a full table).
    before = reconciles()
    for nh in ("903", "901", "902"):
        lab.ip(lab.router, "nexthop", "del", "id", nh)
    wait_for("the deletes taken in", lambda: reconciles()["routes"] > before["routes"], 5)
    time.sleep(0.3)
    after = reconciles()
    assert after["full"] == before["full"] and after["ahead"] == before["ahead"], (before, after)
    assert_recompute_writes_nothing(daemon, daemon.routes)


def test_random_multipath_and_next_hop_object_churn_leaves_the_full_recompute_tables(lab, daemon):
    """Seeded random churn of what BGP multipath through FRR does — routes
    replaced between plain, multipath and next-hop object forms, deleted,
    objects and groups replaced under their routes — is followed by route
    updates alone (no full recompute), and leaves exactly the tables a full
    recompute (SIGHUP) computes from the kernel: it writes nothing."""
    seed = random.SystemRandom().randrange(1 << 32)
    rnd = random.Random(seed)
    set_hash_seed(lab, daemon)

    def reconciles():
        return daemon.status()["reconciles"]

    # Per family: gateways on r1, plain next-hop objects, groups of them, prefixes.
    fams = {
        4: ([f"198.51.100.{i}" for i in range(30, 38)], list(range(920, 926)), list(range(930, 933)),
            [f"203.0.113.{16 * i}/28" for i in range(16)]),
        6: ([f"2001:db8:2::{i:x}" for i in range(0x30, 0x38)], list(range(940, 946)), list(range(950, 953)),
            [f"2001:db8:6:{i:x}::/64" for i in range(16)]),
    }
    setup = []
    for gws, plain, groups, _ in fams.values():
        setup += [f"nexthop add id {i} via {rnd.choice(gws)} dev r1" for i in plain]
        setup += [f"nexthop add id {g} group {plain[0]}/{plain[1]}" for g in groups]
    lab.run(lab.router, "ip", "-batch", "-", input="\n".join(setup) + "\n")

    def op() -> str:
        gws, plain, groups, prefixes = fams[rnd.choice([4, 6])]
        p = rnd.choice(prefixes)
        r = rnd.random()
        if r < 0.2:
            return f"route replace {p} via {rnd.choice(gws)} dev r1"
        if r < 0.4:
            a, b = rnd.sample(gws, 2)
            return f"route replace {p} nexthop via {a} dev r1 weight {rnd.randint(1, 3)} nexthop via {b} dev r1"
        if r < 0.6:
            return f"route replace {p} nhid {rnd.choice(plain + groups)}"
        if r < 0.7:
            return f"route del {p}"
        if r < 0.85:
            return f"nexthop replace id {rnd.choice(plain)} via {rnd.choice(gws)} dev r1"
        members = rnd.sample(plain, rnd.randint(1, 3))
        return f"nexthop replace id {rnd.choice(groups)} group " + "/".join(f"{m},{rnd.randint(1, 4)}" for m in members)

    time.sleep(0.5)
    before = reconciles()
    for _ in range(20):
        # -force: deleting a route that is not there is fine.
        batch = [op() for _ in range(rnd.randint(1, 8))]
        lab.run(lab.router, "ip", "-force", "-batch", "-", input="\n".join(batch) + "\n", check=False)
        time.sleep(rnd.choice([0.0, 0.02, 0.1]))
    quiet = [reconciles(), time.monotonic()]

    def settled():
        now = reconciles()
        if now != quiet[0]:
            quiet[:] = [now, time.monotonic()]
        return time.monotonic() - quiet[1] >= 1.0

    wait_for("the daemon to settle", settled, 15)
    after = reconciles()
    assert after["full"] == before["full"] and after["routes"] > before["routes"], (seed, before, after)
    assert_recompute_writes_nothing(daemon, daemon.routes, f"(seed {seed})")


def test_netlink_overrun_resyncs_to_the_exact_table(lab, fastpath_bin):
    """A tiny event-socket buffer and a burst of 3000 route changes: the
    socket overruns (ENOBUFS), the daemon re-dumps, counts it, and ends with
    exactly the kernel's routes — on add and on delete."""
    n = 3000
    prefixes = [str(ipaddress.ip_network(f"2001:db8:100:{i:x}::/64")) for i in range(n)]
    add = lab.tmp / "add.batch"
    add.write_text("".join(f"route add {p} via {Lab.S6}\n" for p in prefixes))
    delete = lab.tmp / "del.batch"
    delete.write_text("".join(f"route del {p} via {Lab.S6}\n" for p in prefixes))

    with Daemon(lab, extra=["--netlink-rcvbuf", "4096"]) as d:
        base = d.status()["tables"]["fib6"]["used"]
        lab.run(lab.router, "ip", "-6", "-batch", str(add))
        wait_for("all routes mirrored", lambda: d.status()["tables"]["fib6"]["used"] == base + n, timeout=20)
        assert d.status()["netlink_resyncs"] >= 1, "a 4 KiB buffer should have overrun"
        mirrored = {r["prefix"]: r for r in d.routes() if r["family"] == "ipv6"}
        for p in (prefixes[0], prefixes[n // 2], prefixes[-1]):
            assert mirrored[p]["action"] == "forward" and mirrored[p]["nexthop"]["gateway"] == Lab.S6, mirrored[p]

        lab.run(lab.router, "ip", "-6", "-batch", str(delete))
        wait_for("all routes gone", lambda: d.status()["tables"]["fib6"]["used"] == base, timeout=20)
        left = {r["prefix"] for r in d.routes() if r["family"] == "ipv6"} & set(prefixes)
        assert not left, f"{len(left)} deleted routes still mirrored"
