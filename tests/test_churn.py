"""Hardening: route and neighbour churn under traffic, and forced netlink overruns.

A seeded list of changes (route replace/del/add over 256 IPv4 /32s and 256
IPv6 /64s, each via one of 160 gateways on two router ports; neighbour
lladdr replace/del/add of those gateways) is applied with `ip -batch` while a
thread sends UDP to the churned prefixes. After the last change (every
gateway ends resolved, so the end state is deterministic):
- the daemon's tables equal the kernel's (`fastpath routes --json` vs
  `ip -j route`, `fastpath neighbours --json` vs `ip -j neigh`, churned
  prefixes and all neighbours on managed ports), and
- zero stale forwards: one probe per prefix leaves by the kernel's current
  route (port) to its current neighbour (destination MAC), exactly once,
  and fastpath forwarded every probe itself.

test_churn: 20,000 changes in `make test`, 100,000 in `make soak`
(FASTPATH_CHURN_CHANGES overrides), with the default event buffer.
test_netlink_overrun: a 4 KiB event buffer (`--netlink-rcvbuf 4096`) and
bursts of changes: the socket overruns (ENOBUFS), the daemon re-dumps and
counts it (`netlink_resyncs` in `fastpath status`), with the same end checks.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import struct
import threading
import time

from lab import Capture, Daemon, Lab, Sender, counter_delta, kernel_neighbours
from pkts import udp4, udp6

SOAK = os.environ.get("FASTPATH_SOAK", "") not in ("", "0")
SEED = int(os.environ.get("FASTPATH_CHURN_SEED", random.SystemRandom().randrange(1 << 32)))
PREFIX4 = [f"203.0.113.{i}/32" for i in range(256)]
PREFIX6 = [str(ipaddress.ip_network(f"2001:db8:5:{i:x}::/64")) for i in range(256)]
FALLBACK6 = "2001:db8:5::/48"  # a deleted /64 falls back to it (v4: the lab's 203.0.113.0/24)
GW = {  # port -> gateways on it
    "r1": [f"198.51.100.{i}" for i in range(10, 50)] + [f"2001:db8:2::{i:x}" for i in range(0x10, 0x38)],
    "r2": [f"198.51.100.{i}" for i in range(140, 180)] + [f"2001:db8:4::{i:x}" for i in range(0x10, 0x38)],
}
PORT_OF = {g: port for port, gws in GW.items() for g in gws}


def family(a: str) -> int:
    return ipaddress.ip_network(a, strict=False).version


def net(a: str) -> str:
    return str(ipaddress.ip_network(a, strict=False))


class Churn:
    """The change generator and its model of what the kernel ends up with."""

    def __init__(self, seed: int):
        self.rnd = random.Random(seed)
        self.routes: dict[str, str | None] = {}  # prefix -> gateway (None: deleted)
        self.neigh: dict[str, str | None] = {}   # gateway -> MAC (None: deleted)

    def mac(self) -> str:
        return "02:" + ":".join(f"{self.rnd.randrange(256):02x}" for _ in range(5))

    def gw_for(self, prefix: str) -> str:
        v = family(prefix)
        return self.rnd.choice([g for g in PORT_OF if family(g) == v])

    def initial(self) -> list[str]:
        out = []
        for g, port in PORT_OF.items():
            self.neigh[g] = self.mac()
            out.append(f"neigh replace {g} lladdr {self.neigh[g]} dev {port} nud permanent")
        for p in PREFIX4 + PREFIX6:
            self.routes[p] = self.gw_for(p)
            out.append(f"route replace {p} via {self.routes[p]}")
        return out

    def change(self) -> str:
        r = self.rnd
        if r.random() < 0.6:
            p = r.choice(PREFIX4 + PREFIX6)
            if self.routes[p] is None:
                self.routes[p] = self.gw_for(p)
                return f"route add {p} via {self.routes[p]}"
            if r.random() < 0.15:
                self.routes[p] = None
                return f"route del {p}"
            self.routes[p] = self.gw_for(p)
            return f"route replace {p} via {self.routes[p]}"
        g = r.choice(list(PORT_OF))
        port = PORT_OF[g]
        if self.neigh[g] is None:
            self.neigh[g] = self.mac()
            # replace, not add: traffic may have re-created it (INCOMPLETE) meanwhile
            return f"neigh replace {g} lladdr {self.neigh[g]} dev {port} nud permanent"
        if r.random() < 0.1:
            self.neigh[g] = None
            return f"neigh del {g} dev {port}"
        self.neigh[g] = self.mac()
        return f"neigh replace {g} lladdr {self.neigh[g]} dev {port} nud permanent"

    def resolve_all(self) -> list[str]:
        """Every gateway resolved at the end, so probes have a deterministic outcome."""
        out = []
        for g, port in PORT_OF.items():
            if self.neigh[g] is None:
                self.neigh[g] = self.mac()
            out.append(f"neigh replace {g} lladdr {self.neigh[g]} dev {port} nud permanent")
        return out


def batch(lab: Lab, lines: list[str], name: str) -> None:
    f = lab.tmp / name
    f.write_text("\n".join(lines) + "\n")
    # -force: a failing line (none expected) must not hide the rest.
    lab.run(lab.router, "ip", "-force", "-batch", str(f), timeout=300)


# ------------------------------------------------------------ kernel vs daemon

def kernel_routes(lab: Lab) -> dict[str, tuple[str, str]]:
    out = {}
    for fam in ("-4", "-6"):
        for r in json.loads(lab.ip(lab.router, fam, "-j", "route", "show").stdout):
            p = net(r["dst"]) if r["dst"] != "default" else None
            if p in CHURNED:
                out[p] = (r.get("gateway"), r.get("dev"))
    return out


def daemon_routes(d: Daemon) -> dict[str, tuple[str, str]]:
    out = {}
    for r in d.routes():
        if r["prefix"] in CHURNED:
            nh = r.get("nexthop") or {}
            out[r["prefix"]] = (nh.get("gateway"), nh.get("dev")) if r["action"] == "forward" else (r["action"], None)
    return out


CHURNED = set(PREFIX4) | set(PREFIX6)


def tables_agree(lab: Lab, d: Daemon) -> str | None:
    """None when the daemon mirrors the kernel exactly, else what differs."""
    kr, dr = kernel_routes(lab), daemon_routes(d)
    kn, dn = kernel_neighbours(lab), d.neighbour_view()
    bad = []
    for what, k, m in (("route", kr, dr), ("neighbour", kn, dn)):
        for key in sorted(set(k) | set(m), key=str):
            if k.get(key) != m.get(key):
                bad.append(f"{what} {key}: kernel {k.get(key)} fastpath {m.get(key)}")
    return "\n".join(bad[:20] + ([f"... {len(bad)} in all"] if len(bad) > 20 else [])) or None


def wait_agree(lab: Lab, d: Daemon, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        diff = tables_agree(lab, d)
        if diff is None:
            return
        assert time.monotonic() < deadline, f"seed {SEED}: tables still differ {timeout}s after the last change:\n{diff}"
        time.sleep(0.2)


# ------------------------------------------------------------ traffic

def probe_frames(lab: Lab, tag: int) -> list[tuple[str, bytes]]:
    """One UDP frame per churned prefix; the payload carries its index."""
    out = []
    for i, p in enumerate(PREFIX4 + PREFIX6):
        dst = str(ipaddress.ip_network(p)[1 if family(p) == 6 else 0])
        mk = udp4 if family(p) == 4 else udp6
        out.append((p, bytes(mk(lab, dst=dst, seq=tag * 10000 + i, sport=40000 + i % 1000))))
    return out


class Background:
    """UDP to the churned prefixes from the client while the changes run."""

    def __init__(self, lab: Lab, pps: int = 2000):
        self.frames = [f for _, f in probe_frames(lab, 9)]
        self.sender = Sender(lab.c0)
        self.gap = 1.0 / pps
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.is_set():
            try:
                self.sender.send(self.frames[self.sent % len(self.frames)])
            except OSError:
                pass  # a full queue on the way; the next one goes
            self.sent += 1
            delay = t0 + self.sent * self.gap - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sender.close()


def seq_of(frame: bytes) -> int | None:
    k = frame.find(b"fastpath-")
    return int(frame[k + 9:k + 17]) if k >= 0 else None


def check_probes(lab: Lab, d: Daemon, churn: Churn) -> None:
    """Each probe leaves once, by the kernel's current route, to its current neighbour."""
    want = {}
    kr = kernel_routes(lab)
    kn = kernel_neighbours(lab)
    frames = probe_frames(lab, 1)
    for i, (p, _) in enumerate(frames):
        if p in kr:
            gw, dev = kr[p]
        else:  # deleted: the covering route via the server
            gw, dev = (Lab.S4, "r1") if family(p) == 4 else (Lab.S6, "r1")
        port = {"r1": "s0", "r2": "s1"}[dev]
        want[10000 + i] = (port, kn[(dev, gw)], p)
    before = d.counters("r0")
    with Capture([lab.s0, lab.s1]) as cap:
        tx = Sender(lab.c0)
        try:
            for _, f in frames:
                tx.send(f)
                cap.poll(0.0005)
        finally:
            tx.close()
        got = cap.collect(quiet=0.5)
    seen: dict[int, list[tuple[str, str]]] = {}
    for port, fs in got.items():
        for f in fs:
            s = seq_of(f)
            if s is not None and s >= 10000:
                seen.setdefault(s, []).append((port, ":".join(f"{b:02x}" for b in f[:6])))
    bad = []
    for s, (port, mac, p) in want.items():
        if seen.get(s) != [(port, mac)]:
            bad.append(f"{p}: want {port} to {mac}, got {seen.get(s)}")
    assert not bad, f"seed {SEED}: {len(bad)} stale or lost forwards:\n" + "\n".join(bad[:20])
    fwd = counter_delta(before, d.counters("r0")).get("forwarded", 0)
    assert fwd == len(frames), f"fastpath forwarded {fwd} of {len(frames)} probes itself"


def setup(lab: Lab, churn: Churn) -> None:
    lab.ip(lab.router, "-6", "route", "add", FALLBACK6, "via", Lab.S6)
    # the server behind the fallback routes: resolved for good
    for addr in (Lab.S4, Lab.S6):
        lab.ip(lab.router, "neigh", "replace", addr, "lladdr", lab.s0.mac, "dev", "r1", "nud", "permanent")
    batch(lab, churn.initial(), "initial.batch")


def run_churn(lab: Lab, d: Daemon, churn: Churn, changes: int, batch_size: int) -> None:
    bg = Background(lab)
    try:
        done = 0
        while done < changes:
            n = min(batch_size, changes - done)
            batch(lab, [churn.change() for _ in range(n)], f"churn{done}.batch")
            done += n
        batch(lab, churn.resolve_all(), "final.batch")
    finally:
        bg.close()
    assert bg.sent > 0


def test_churn(lab2, fastpath_bin):
    """Route/neighbour changes under traffic (make test 20,000, make soak 100,000:
    about 170 s on the 2-vCPU VM, the daemon recomputing its tables per burst);
    then tables equal and no stale forward."""
    print(f"churn seed {SEED} (replay: FASTPATH_CHURN_SEED={SEED})")
    churn = Churn(SEED)
    setup(lab2, churn)
    with Daemon(lab2) as d:
        wait_agree(lab2, d)
        t0 = time.monotonic()
        run_churn(lab2, d, churn, changes=int(os.environ.get("FASTPATH_CHURN_CHANGES", 100_000 if SOAK else 20_000)),
                  batch_size=10_000)
        t1 = time.monotonic()
        wait_agree(lab2, d)
        print(f"changes applied in {t1 - t0:.1f}s, converged {time.monotonic() - t1:.2f}s later; "
              f"resyncs {d.status()['netlink_resyncs']}")
        check_probes(lab2, d, churn)


def test_netlink_overrun(lab2, fastpath_bin):
    """A 4 KiB event buffer and bursts of route and neighbour changes: overrun,
    counted full resync, and no stale entry afterwards."""
    print(f"overrun seed {SEED} (replay: FASTPATH_CHURN_SEED={SEED})")
    churn = Churn(SEED)
    setup(lab2, churn)
    with Daemon(lab2, extra=["--netlink-rcvbuf", "4096"]) as d:
        wait_agree(lab2, d)
        before = d.status()["netlink_resyncs"]
        run_churn(lab2, d, churn, changes=6000, batch_size=3000)
        wait_agree(lab2, d)
        resyncs = d.status()["netlink_resyncs"] - before
        assert resyncs >= 1, "a 4 KiB buffer and 3000-change bursts should have overrun"
        check_probes(lab2, d, churn)
