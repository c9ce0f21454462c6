"""SIGHUP changes the interface set: interfaces added to the config file are
attached (all or none), dropped ones detached and their traffic left to the
kernel, and the interfaces that stay keep forwarding throughout, on the same
programs, with their counters.

Lab: client:c0 <-> r0:router:r1 <-> s0:server, plus router:r2 <-> s1:server
(the `lab2` fixture). The daemon starts on r0 and r1 from a config file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from lab import FASTPATH, Daemon, Lab, counter_delta, send_and_expect, sh
from test_config import wait_for
from test_restart import pin_lab
from pkts import udp4
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

PING_GAP = "0.01"


def config(lab: Lab, ifaces: list[str], **extra: str) -> str:
    lines = [f"interface = {json.dumps(ifaces)}", f'socket = "{lab.tmp / "fp.sock"}"', 'metrics = "off"']
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def config_daemon(lab: Lab, path: Path, extra: tuple[str, ...] = ()) -> Daemon:
    """A daemon whose interfaces come from the file (the command line names none)."""
    d = Daemon(lab, extra=["--config", str(path), *extra])
    d.ifaces = []
    return d


def reload(d: Daemon, path: Path, text: str, until: str) -> None:
    """Rewrites the file, sends SIGHUP and waits for `until` in the log."""
    seen = d.log_text().count(until)
    path.write_text(text)
    os.kill(d.proc.pid, signal.SIGHUP)
    wait_for(lambda: d.log_text().count(until) > seen, f"{until!r} in the log:\n{d.log_text()}", timeout=30)


def names(d: Daemon) -> list[str]:
    return [i["name"] for i in d.status()["interfaces"]]


def prog_ids(lab: Lab) -> dict[str, int]:
    out = json.loads(lab.ip(lab.router, "-j", "-d", "link", "show").stdout)
    return {l["ifname"]: l["xdp"]["prog"]["id"] for l in out if "prog" in l.get("xdp", {})}


def ifindex(lab: Lab, name: str) -> int:
    return json.loads(lab.ip(lab.router, "-j", "link", "show", "dev", name).stdout)[0]["ifindex"]


def ping(lab: Lab, dst: str, count: int) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", lab.client, "ping", "-q", "-i", PING_GAP, "-c", str(count), "-W", "1", dst],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def no_loss(p: subprocess.Popen, count: int) -> None:
    try:
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out
    assert re.search(rf"{count} packets transmitted, {count} received, 0% packet loss", out), out


# Link chatter (ARP, neighbour discovery from link-local addresses) that the
# hosts send on their own whenever their caches age; not the test's packets.
CHATTER = {"not_ip", "link_local", "multicast"}


def delta(d: Daemon, iface: str, before: dict) -> dict[str, int]:
    return {k: v for k, v in counter_delta(before, d.counters(iface)).items() if k not in CHATTER}


def from_s1(lab: Lab, n: int) -> list:
    """Frames the server sends into r2 for the client (r2's ingress)."""
    return [Ether(src=lab.s1.mac, dst=lab.r2.mac) / IP(src=lab.S1_4, dst=lab.C4) / UDP(sport=40000, dport=9)
            / Raw(f"from-s1-{i:04d}".encode()) for i in range(n)]


def test_sighup_adds_and_drops_interfaces_without_loss(lab2, fastpath_bin):
    lab = lab2
    path = lab.tmp / "fastpath.toml"
    path.write_text(config(lab, ["r0", "r1"]))
    lab.resolve_neighbours()
    with config_daemon(lab, path) as d:
        assert names(d) == ["r0", "r1"]
        ids = prog_ids(lab)
        assert set(ids) == {"r0", "r1"}, ids
        # r2 not managed yet: the kernel forwards what goes out of it.
        before = d.counters("r0")
        send_and_expect(lab.c0, [udp4(lab, dst=lab.S1_4, seq=i) for i in range(10)], lab.s1)
        assert delta(d, "r0", before) == {"egress_not_managed": 10}

        # Across both reloads: r0 -> r1 (kept, then dropped) and r0 -> r2
        # (unmanaged, then added).
        count = 500
        pings = [ping(lab, lab.FAR4, count), ping(lab, lab.S1_4, count)]
        time.sleep(0.5)
        reload(d, path, config(lab, ["r0", "r1", "r2"]), "reload: interface r0,r1 -> r0,r1,r2: applied")
        wait_for(lambda: names(d) == ["r0", "r1", "r2"], "r2 in status", timeout=30)
        now = prog_ids(lab)
        assert {k: now[k] for k in ("r0", "r1")} == ids, "kept interfaces must keep their programs"
        assert "r2" in now
        r0_fwd = d.counters("r0")["forwarded"]["packets"]

        reload(d, path, config(lab, ["r0", "r2"]), "reload: interface r0,r1,r2 -> r0,r2: applied")
        wait_for(lambda: names(d) == ["r0", "r2"], "r1 gone from status", timeout=30)
        now = prog_ids(lab)
        assert "r1" not in now, now
        assert now["r0"] == ids["r0"]
        # Kept interfaces keep their counters.
        assert d.counters("r0")["forwarded"]["packets"] >= r0_fwd > 0
        assert all(p.poll() is None for p in pings), "the ping streams ended before the reloads did"
        for p in pings:
            no_loss(p, count)

        # Added: fast-pathed both ways, counted on its own slot.
        wait_for(lambda: r2_up(d), "r2's entry written", timeout=30)
        before = d.counters("r0")
        send_and_expect(lab.c0, [udp4(lab, dst=lab.S1_4, seq=i) for i in range(10)], lab.s1)
        assert delta(d, "r0", before) == {"forwarded": 10}
        before = d.counters("r2")
        send_and_expect(lab.s1, from_s1(lab, 10), lab.c0)
        assert delta(d, "r2", before) == {"forwarded": 10}
        # Dropped: its traffic still arrives, through the kernel.
        before = d.counters("r0")
        send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(10)], lab.s0)
        assert delta(d, "r0", before) == {"egress_not_managed": 10}
        log = d.log_text()
        assert "r2: attached (ifindex" in log and "r1: left the interface set" in log, log


def r2_up(d: Daemon) -> bool:
    return any(i["name"] == "r2" and i["up"] for i in d.status()["interfaces"])


def test_a_bad_added_interface_rejects_the_reload_and_keeps_the_old_set(lab2, fastpath_bin):
    lab = lab2
    # macvlan has no native XDP: with xdp-mode native it cannot be attached.
    lab.ip(lab.router, "link", "add", "link", "r1", "name", "m0", "type", "macvlan")
    lab.defer(lambda: lab.ip(lab.router, "link", "del", "m0", check=False))
    lab.ip(lab.router, "link", "set", "m0", "up")
    path = lab.tmp / "fastpath.toml"
    path.write_text(config(lab, ["r0", "r1"], **{"xdp-mode": '"native"'}))
    lab.resolve_neighbours()
    with config_daemon(lab, path) as d:
        ids = prog_ids(lab)
        # r2 is attached first, then m0 fails: r2 must be detached again.
        reload(d, path, config(lab, ["r0", "r1", "r2", "m0"], **{"xdp-mode": '"native"', "flow-timeout": "7"}),
               "reload rejected")
        log = d.log_text()
        assert re.search(r"reload rejected, running configuration unchanged: interface r0,r1 -> r0,r1,r2,m0: "
                         r"attaching XDP to m0: the driver has no native XDP", log), log
        assert prog_ids(lab) == ids, "old set intact, nothing else attached"
        st = d.status()
        assert [i["name"] for i in st["interfaces"]] == ["r0", "r1"]
        assert st["flow_cache"]["timeout_s"] != 7, "a rejected reload applies nothing"
        before = d.counters("r0")
        send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(10)], lab.s0)
        assert delta(d, "r0", before) == {"forwarded": 10}

        # Nothing was left behind by the rollback: r2 can be added now.
        reload(d, path, config(lab, ["r0", "r1", "r2"], **{"xdp-mode": '"native"'}),
               "reload: interface r0,r1 -> r0,r1,r2: applied")
        assert set(prog_ids(lab)) == {"r0", "r1", "r2"}


def test_pinned_reload_pins_added_and_unpins_dropped(lab2, fastpath_bin):
    lab = lab2
    pin_dir = pin_lab(lab)
    links = pin_dir / "v1" / "links"
    pinned = ("--pin", "--pin-dir", str(pin_dir))
    path = lab.tmp / "fastpath.toml"
    path.write_text(config(lab, ["r0", "r1"]))
    lab.resolve_neighbours()
    r1, r2 = str(ifindex(lab, "r1")), str(ifindex(lab, "r2"))
    d = config_daemon(lab, path, pinned).start()
    reload(d, path, config(lab, ["r0", "r1", "r2"]), "reload: interface r0,r1 -> r0,r1,r2: applied")
    assert r2 in os.listdir(links) and r2 in os.listdir(pin_dir / "v1" / "progs")
    reload(d, path, config(lab, ["r0", "r2"]), "reload: interface r0,r1,r2 -> r0,r2: applied")
    assert r1 not in os.listdir(links) and r1 not in os.listdir(pin_dir / "v1" / "progs")
    assert set(prog_ids(lab)) == {"r0", "r2"}
    ids = prog_ids(lab)
    assert d.stop() == 0
    # The pins are what a restart takes over: r0 and r2, r1 stays detached.
    assert prog_ids(lab) == ids
    d2 = config_daemon(lab, path, pinned).start()
    log = d2.log_text()
    assert "r0: took over the pinned XDP link" in log and "r2: took over the pinned XDP link" in log, log
    assert "not asked for this time" not in log, log
    before = d2.counters("r0")
    send_and_expect(lab.c0, [udp4(lab, dst=lab.S1_4, seq=i) for i in range(10)], lab.s1)
    assert delta(d2, "r0", before) == {"forwarded": 10}
    assert d2.stop() == 0


def recreate_r1(lab: Lab, same_ifindex: bool) -> None:
    """Deletes the r1 - s0 link and creates it again as the lab had it (a
    veth pair goes as one): with its old ifindex, or a new one."""
    lab.ip(lab.router, "link", "del", "r1")
    if same_ifindex:
        lab._veth(lab.r1, lab.s0)
    else:
        sh("ip", "link", "add", "r1", "netns", lab.router, "address", lab.r1.mac, "type", "veth",
           "peer", "name", "s0", "netns", lab.server, "address", lab.s0.mac)
    lab.addr(lab.r1, f"{lab.R1_4}/24", f"{lab.R1_6}/64")
    lab.addr(lab.s0, f"{lab.S4}/24", f"{lab.S6}/64")
    lab.run(lab.server, "ethtool", "-K", "s0", "tx", "off", "gro", "on")
    for i in (lab.r1, lab.s0):
        lab.ip(i.ns, "link", "set", i.name, "up")
    lab.server_routes()
    lab.gateway_routes()
    lab.wait_ready()


def test_a_port_created_again_is_managed_again(lab, fastpath_bin):
    """A managed port deleted and created again under its name (a hot-plugged
    NIC, a recreated veth) is attached again by the daemon itself, with the
    interfaces on the command line, whether the new device got its old
    ifindex or a new one; its traffic is fast again both ways."""
    lab.resolve_neighbours()
    with Daemon(lab) as d:
        for same in (True, False):
            recreate_r1(lab, same)
            ifindex = json.loads(lab.ip(lab.router, "-j", "link", "show", "r1").stdout)[0]["ifindex"]
            wait_for(lambda: "r1" in prog_ids(lab) and
                     any(i["name"] == "r1" and i["ifindex"] == ifindex and i["up"] for i in d.status()["interfaces"]),
                     f"r1 (ifindex {ifindex}, same as before: {same}) managed again:\n{d.log_text()}", timeout=10)
            lab.resolve_neighbours()
            d.wait_neighbours_mirrored()
            before = {i: d.counters(i) for i in ("r0", "r1")}
            lab.run(lab.client, "ping", "-4", "-c3", "-i", PING_GAP, "-W2", "-q", lab.S4)
            assert delta(d, "r0", before["r0"]) == {"forwarded": 3}, same
            assert delta(d, "r1", before["r1"]) == {"forwarded": 3}, same
        assert "r1: attached (ifindex" in d.log_text()


def has_xdp(lab: Lab, ns: str, name: str) -> bool:
    return "prog" in json.loads(lab.ip(ns, "-j", "-d", "link", "show", "dev", name).stdout)[0].get("xdp", {})


def test_a_port_moved_to_another_namespace_is_released_and_managed_again_on_return(lab, fastpath_bin):
    """A managed port moved to another network namespace keeps its XDP link
    over the move (the kernel detaches nothing): the daemon detaches it, so
    the namespace it went to gets the device without our program, the other
    port stays as it was, and when the device comes back it is adopted
    again and its traffic is fast again."""
    lab.resolve_neighbours()
    away = f"{lab.prefix}-away"
    sh("ip", "netns", "add", away)
    try:
        with Daemon(lab) as d:
            r0_prog = prog_ids(lab)["r0"]
            lab.ip(lab.router, "link", "set", "r1", "netns", away)
            wait_for(lambda: not has_xdp(lab, away, "r1") and "r1" not in names(d),
                     f"r1 released after leaving the namespace:\n{d.log_text()}", timeout=10)
            assert prog_ids(lab) == {"r0": r0_prog}
            assert d.proc.poll() is None

            # Back: a move takes the device's addresses and routes with it.
            lab.ip(away, "link", "set", "r1", "netns", lab.router)
            lab.addr(lab.r1, f"{lab.R1_4}/24", f"{lab.R1_6}/64")
            lab.ip(lab.router, "link", "set", "r1", "up")
            lab.server_routes()
            lab.gateway_routes()
            lab.wait_ready()
            wait_for(lambda: "r1" in prog_ids(lab) and
                     any(i["name"] == "r1" and i["up"] for i in d.status()["interfaces"]),
                     f"r1 managed again after coming back:\n{d.log_text()}", timeout=10)
            lab.resolve_neighbours()
            d.wait_neighbours_mirrored()
            before = {i: d.counters(i) for i in ("r0", "r1")}
            lab.run(lab.client, "ping", "-4", "-c3", "-i", PING_GAP, "-W2", "-q", lab.S4)
            assert delta(d, "r0", before["r0"]) == {"forwarded": 3}
            assert delta(d, "r1", before["r1"]) == {"forwarded": 3}
            assert "left the network namespace" in d.log_text()
    finally:
        # The lab tears down by namespace: r1 goes back to the router's first.
        lab.ip(away, "link", "set", "r1", "netns", lab.router, check=False)
        sh("ip", "netns", "del", away)
