"""Client - router - server lab in network namespaces, and the tools to drive it.

    client:c0 <-> r0:router:r1 <-> s0:server      (+ router:r2 <-> s1:server, optional)

Everything here is created with unique names per run and torn down in
reverse order by Lab.__exit__, also when a test fails or is interrupted.

Hosts' veths get TX checksum offload turned off: a local socket's packets
leave a veth with a partial checksum (the "wire" never fills it in), which
XDP redirect does not fix. A real NIC computes it; we emulate that wire.
They also get GRO on: a veth accepts XDP-redirected frames only when its
receiving end runs NAPI (GRO or an XDP program), as any real NIC does.
"""

from __future__ import annotations

import contextlib
import errno
import ctypes
import ipaddress
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parent.parent
FASTPATH = Path(os.environ.get("FASTPATH_BIN", REPO / "target" / "release" / "fastpath"))

CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4

_libc = ctypes.CDLL(None, use_errno=True)


def sh(*cmd: str, check: bool = True, capture: bool = True, timeout: float = 30,
       input: str | None = None) -> subprocess.CompletedProcess:
    """Run a command; on failure raise with its stderr so the test says why."""
    p = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout, input=input)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {p.returncode}: {(p.stderr or '').strip()}")
    return p


@contextlib.contextmanager
def in_netns(name: str):
    """Switch this thread into netns `name`; sockets opened inside keep it."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns(back): {os.strerror(err)}")
    finally:
        os.close(target)
        os.close(own)


def packet_socket(ns: str, ifname: str) -> socket.socket:
    s = None
    with in_netns(ns):
        # Protocol 0 until bound: a socket opened for ETH_P_ALL hooks into
        # every device at once, and bind() then unhooks it with an RCU grace
        # period (~30 ms a socket, three sockets a scenario); it also queued
        # frames of other devices received before the bind.
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind((ifname, ETH_P_ALL))
    return s


def close_in_background(socks: Sequence[socket.socket]) -> None:
    """Close packet sockets without waiting: the kernel's release of one
    waits for an RCU grace period (~15 ms), and a scenario closes three.
    Nothing reads them any more; they only stop receiving a little later."""
    threading.Thread(target=lambda: [s.close() for s in socks], daemon=True).start()


# ---------------------------------------------------------------- frames

def is_noise(frame: bytes) -> bool:
    """ARP, IPv6 neighbour discovery / MLD / RA and other link chatter."""
    if len(frame) < 14:
        return True
    et = struct.unpack_from("!H", frame, 12)[0]
    if et == 0x0806 or et == 0x88CC:  # ARP, LLDP
        return True
    if et == 0x86DD and len(frame) >= 54:
        nh = frame[20]
        off = 54
        if nh == 0:  # hop-by-hop (MLD carries router alert)
            nh = frame[54]
            off = 54 + (frame[55] + 1) * 8
        if nh == 58 and len(frame) > off and frame[off] in (130, 131, 132, 133, 134, 135, 136, 137, 143):
            return True
    return False


def ipv4_csum_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 0xF) * 4
    hdr = frame[14:14 + ihl]
    if len(hdr) < 20 or len(hdr) % 2:
        return False
    s = sum(struct.unpack(f"!{len(hdr) // 2}H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s == 0xFFFF


def mask_ip_id(frame: bytes) -> bytes:
    """Zero the IPv4 ID and header checksum of a kernel-generated frame.

    The kernel picks IDs of locally generated packets (ICMP errors, echo
    replies) from a per-boot hash plus a moving counter, so they differ
    between two otherwise identical runs. Nothing else is masked; a bad
    checksum stays visible so it still fails the comparison.
    """
    if len(frame) >= 34 and frame[12:14] == b"\x08\x00" and ipv4_csum_ok(frame):
        return frame[:18] + b"\0\0" + frame[20:24] + b"\0\0" + frame[26:]
    return frame


def describe(frame: bytes) -> str:
    try:
        from scapy.layers.l2 import Ether
        return Ether(frame).summary()
    except Exception:  # noqa: BLE001 - a summary is only for messages
        return frame[:64].hex()


# ---------------------------------------------------------------- lab

@dataclass
class Iface:
    ns: str
    name: str
    mac: str


@dataclass
class Lab:
    """client - router - server; see the module docstring."""

    second_path: bool = False
    rp_filter: int = 0
    prefix: str = field(default_factory=lambda: f"fp{os.getpid()}{random.randrange(16**4):04x}")

    # addresses
    C4, C6 = "192.0.2.2", "2001:db8:1::2"
    R0_4, R0_6 = "192.0.2.1", "2001:db8:1::1"
    R1_4, R1_6 = "198.51.100.1", "2001:db8:2::1"
    S4, S6 = "198.51.100.2", "2001:db8:2::2"
    # second router-server link: a /25 inside r1's /24 (longest match wins);
    # the documentation ranges leave no fourth /24 for it.
    R2_4, R2_6 = "198.51.100.129", "2001:db8:4::1"
    S1_4, S1_6 = "198.51.100.130", "2001:db8:4::2"
    REMOTE4, REMOTE6 = "203.0.113.0/24", "2001:db8:3::/64"
    FAR4, FAR6 = "203.0.113.1", "2001:db8:3::1"  # a host inside the remote prefix

    def __post_init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self.daemon: "Daemon | None" = None  # set while a fastpath daemon runs on the router
        self.neigh_flushed_at = 0.0  # time.monotonic() of the last flush_router_neigh()
        self.client = f"{self.prefix}-client"
        self.router = f"{self.prefix}-router"
        self.server = f"{self.prefix}-server"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        # Fixed, locally administered MACs make failures readable.
        self.c0 = Iface(self.client, "c0", "02:00:00:00:01:02")
        self.r0 = Iface(self.router, "r0", "02:00:00:00:01:01")
        self.r1 = Iface(self.router, "r1", "02:00:00:00:02:01")
        self.s0 = Iface(self.server, "s0", "02:00:00:00:02:02")
        self.r2 = Iface(self.router, "r2", "02:00:00:00:04:01")
        self.s1 = Iface(self.server, "s1", "02:00:00:00:04:02")

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> "Lab":
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        errors = []
        while self._undo:
            fn = self._undo.pop()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep tearing down
                errors.append(e)
        with contextlib.suppress(OSError):
            for p in sorted(self.tmp.rglob("*"), reverse=True):
                p.unlink() if not p.is_dir() or p.is_symlink() else p.rmdir()
            self.tmp.rmdir()
        if errors:
            raise RuntimeError(f"lab teardown: {errors}")

    def defer(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def _netns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.defer(lambda: sh("ip", "netns", "del", name))
        self.ip(name, "link", "set", "lo", "up")
        sysctls = {
            # Identical runs must produce identical ICMP: no rate limiting.
            "net.ipv4.icmp_ratelimit": "0",
            # And no type rate-limited at all: with a limit of 0 the per-peer
            # check still empties the token bucket that ip_error() shares
            # for its net unreachables (test_live.send_unroutable).
            "net.ipv4.icmp_ratemask": "0",
            "net.ipv4.icmp_msgs_per_sec": "100000",
            "net.ipv4.icmp_msgs_burst": "100000",
            "net.ipv6.icmp.ratelimit": "0",
            "net.ipv6.conf.all.accept_dad": "0",
            "net.ipv6.conf.default.accept_dad": "0",
            # No router solicitations/RAs: fewer frames that are not ours.
            "net.ipv6.conf.default.router_solicitations": "0",
            "net.ipv6.conf.all.accept_ra": "0",
            "net.ipv6.conf.default.accept_ra": "0",
            # Keep v6 addresses across link down/up, as v4 does, so tests that
            # take a link down restore state by re-adding routes only.
            "net.ipv6.conf.all.keep_addr_on_down": "1",
            "net.ipv6.conf.default.keep_addr_on_down": "1",
        }
        for k, v in sysctls.items():
            self.sysctl(name, k, v, check=False)

    def _veth(self, a: Iface, b: Iface) -> None:
        # Each end gets an ifindex its peer does not have. With the numbers a
        # fresh namespace hands out, both ends of c0-r0 were 2: the kernel
        # then takes the pair for a non-tunnel device (ifindex == iflink), so
        # its carrier-up is not urgent and linkwatch, which runs at most once
        # a second, left r0 without a qdisc for up to a second per lab.
        sh("ip", "link", "add", a.name, "netns", a.ns, "address", a.mac, "index", str(self._index(a)),
           "type", "veth", "peer", "name", b.name, "netns", b.ns, "address", b.mac,
           "index", str(self._index(b)))
        # Deleting one end deletes the pair; the namespace going away does too.
        self.defer(lambda: sh("ip", "-n", a.ns, "link", "del", a.name, check=False))

    def _build(self) -> None:
        for ns in (self.client, self.router, self.server):
            self._netns(ns)
        r = self.router
        self.sysctl(r, "net.ipv4.ip_forward", "1")
        self.sysctl(r, "net.ipv6.conf.all.forwarding", "1")
        self.sysctl(r, "net.ipv4.conf.all.rp_filter", "0")
        self.sysctl(r, "net.ipv4.conf.default.rp_filter", str(self.rp_filter))

        self._veth(self.c0, self.r0)
        self._veth(self.r1, self.s0)
        if self.second_path:
            self._veth(self.r2, self.s1)
        for i in self.router_ifaces():
            self.sysctl(r, f"net.ipv4.conf.{i}.rp_filter", str(self.rp_filter))
        for h in (self.c0, self.s0) + ((self.s1,) if self.second_path else ()):
            # tx off: see the module docstring. gro on: a veth drops frames
            # XDP-redirected into it unless its receiving end has GRO (NAPI)
            # or an XDP program; real NICs have GRO on by default anyway.
            self.run(h.ns, "ethtool", "-K", h.name, "tx", "off", "gro", "on")

        self.addr(self.c0, f"{self.C4}/24", f"{self.C6}/64")
        self.addr(self.r0, f"{self.R0_4}/24", f"{self.R0_6}/64")
        self.addr(self.r1, f"{self.R1_4}/24", f"{self.R1_6}/64")
        self.addr(self.s0, f"{self.S4}/24", f"{self.S6}/64")
        if self.second_path:
            self.addr(self.r2, f"{self.R2_4}/25", f"{self.R2_6}/64")
            self.addr(self.s1, f"{self.S1_4}/25", f"{self.S1_6}/64")
        for i in (self.c0, self.r0, self.r1, self.s0) + (
                (self.r2, self.s1) if self.second_path else ()):
            self.ip(i.ns, "link", "set", i.name, "up")

        self.ip(self.client, "route", "add", "default", "via", self.R0_4)
        self.ip(self.client, "-6", "route", "add", "default", "via", self.R0_6)
        self.server_routes()
        # The remote prefix lives on the server's loopback: all of it is local there.
        self.ip(self.server, "addr", "add", f"{self.FAR4}/24", "dev", "lo")
        self.ip(self.server, "addr", "add", f"{self.FAR6}/64", "dev", "lo")
        self.ip(self.server, "-6", "route", "add", "local", self.REMOTE6, "dev", "lo")
        self.gateway_routes()
        self.wait_ready()

    # ------------------------------------------------------------ helpers

    def _index(self, i: Iface) -> int:
        """Fixed, pairwise distinct ifindexes for the lab's own veth ends."""
        return 11 + [self.c0, self.r0, self.r1, self.s0, self.r2, self.s1].index(i)

    def router_ifaces(self) -> list[str]:
        return ["r0", "r1"] + (["r2"] if self.second_path else [])

    def ip(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ip", "-n", ns, *args, check=check)

    def run(self, ns: str, *cmd: str, check: bool = True, timeout: float = 30,
            input: str | None = None) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", ns, *cmd, check=check, timeout=timeout, input=input)

    def sysctl(self, ns: str, key: str, value: str, check: bool = True) -> None:
        # Written by this thread from inside the namespace (/proc/sys/net is
        # the opener's namespace): a `sysctl` process per key cost about half
        # of a lab's start, and a lab sets some forty of them.
        try:
            with in_netns(ns), open(Path("/proc/sys", *key.split(".")), "w") as f:
                f.write(value)
        except OSError as e:
            if check:
                raise RuntimeError(f"sysctl {key}={value} in {ns}: {e.strerror}") from e

    def addr(self, i: Iface, *prefixes: str) -> None:
        for p in prefixes:
            extra = ["nodad"] if ":" in p else []
            self.ip(i.ns, "addr", "add", p, "dev", i.name, *extra)

    def server_routes(self) -> None:
        """(Re)install the server's default routes (a link down deletes them)."""
        self.ip(self.server, "route", "replace", "default", "via", self.R1_4)
        self.ip(self.server, "-6", "route", "replace", "default", "via", self.R1_6)

    def gateway_routes(self) -> None:
        """(Re)install the router's routes to the remote prefix via the server."""
        self.ip(self.router, "route", "replace", self.REMOTE4, "via", self.S4)
        self.ip(self.router, "-6", "route", "replace", self.REMOTE6, "via", self.S6)

    def wait_ready(self, timeout: float = 5.0) -> None:
        """Wait for the links to really carry packets.

        Until linkwatch has run, a freshly upped veth still has the noop qdisc
        and silently drops what is sent (the first ARP/ND would be lost and
        retried a second later); nodad makes addresses usable at once, but we
        also wait for anything still tentative.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = []
            for ns in (self.client, self.router, self.server):
                for l in json.loads(self.ip(ns, "-j", "link", "show").stdout):
                    if l["ifname"] != "lo" and (l.get("operstate") != "UP" or l.get("qdisc") == "noop"):
                        busy.append(f"{ns}:{l['ifname']}")
                if self.ip(ns, "-6", "addr", "show", "tentative").stdout.strip():
                    busy.append(f"{ns}:tentative")
            if not busy:
                return
            time.sleep(0.02)
        raise RuntimeError(f"links not ready: {busy}")

    def resolve_neighbours(self) -> None:
        """Populate every ARP/ND cache on the paths so runs start alike.

        The router's own table is checked afterwards, and the pings repeated
        until it holds every neighbour on their paths: right after a flush a
        running daemon still holds the flushed entries for a few ms, and a
        ping it fast-paths with one of them never makes the kernel resolve
        that neighbour again. Daemon and kernel then agree on an entry
        neither has (wait_neighbours_mirrored), and the run's first packets
        punt as no_neigh."""
        # The replies go to the address each ping sends from: the client's
        # first one, or another a test added (source address selection).
        want = {("r0", self._source(self.client, self.S4)), ("r0", self._source(self.client, self.S6)),
                ("r1", self.S4), ("r1", self.S6)}
        if self.second_path:
            want |= {("r2", self.S1_4), ("r2", self.S1_6)}
        missing: set = set()
        for _ in range(20):
            self._ping_paths()
            missing = want - set(kernel_neighbours(self))
            if not missing:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the router resolved no neighbour for {sorted(missing)}")

    def _source(self, ns: str, dst: str) -> str:
        """The address `ns` sends to `dst` from."""
        route = json.loads(self.ip(ns, "-j", "route", "get", dst).stdout)[0]
        return str(ipaddress.ip_address(route["prefsrc"]))

    def _ping_paths(self) -> None:
        pings = [(self.client, "-4", self.FAR4), (self.client, "-6", self.FAR6),
                 (self.client, "-4", self.S4), (self.client, "-6", self.S6)]
        if self.second_path:
            pings += [(self.router, "-4", self.S1_4), (self.router, "-6", self.S1_6)]
        # All at once: each waits mostly for its neighbour resolution, and a
        # resolution another ping is waiting for too serves both.
        procs = [(subprocess.Popen(["ip", "netns", "exec", ns, "ping", fam, "-c1", "-W1", "-q", dst],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), ns, dst)
                 for ns, fam, dst in pings]
        failed = []
        for p, ns, dst in procs:
            _, err = p.communicate(timeout=30)
            if p.returncode != 0:
                failed.append(f"ping {dst} in {ns} -> {p.returncode}: {err.strip()}")
        if failed:
            raise RuntimeError("; ".join(failed))

    def flush_router_neigh(self, dev: str = "r1") -> None:
        # Deleting an INCOMPLETE entry makes the kernel answer its queued
        # packets with host unreachable (see test_live.send_unroutable).
        self.neigh_flushed_at = time.monotonic()
        self.ip(self.router, "neigh", "flush", "dev", dev)
        self.ip(self.router, "-6", "neigh", "flush", "dev", dev)

    @contextlib.contextmanager
    def quiet(self, ns: str):
        """Make a host's stack ignore what it receives (capture still sees it).

        Raw packets sent from the client would otherwise make its kernel answer
        replies with RSTs or learn PMTUs, adding frames that are not ours.
        ARP and neighbour discovery still work, so the router can reach it.
        """
        table = f"fpquiet{random.randrange(1 << 16)}"
        self.run(ns, "nft", "-f", "-", input=(
            f"table inet {table} {{\n chain quiet_input {{\n"
            f"  type filter hook input priority -300; policy drop;\n"
            f"  icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept\n }}\n}}\n"))
        try:
            yield
        finally:
            self.run(ns, "nft", "delete", "table", "inet", table, check=False)

    def xdp_attached(self, ns: str | None = None) -> dict[str, str]:
        """{ifname: description} of every interface in `ns` with XDP attached."""
        out = json.loads(self.ip(ns or self.router, "-j", "-d", "link", "show").stdout)
        return {l["ifname"]: json.dumps(l["xdp"]) for l in out if "xdp" in l}

    def mac_of(self, i: Iface) -> str:
        out = json.loads(self.ip(i.ns, "-j", "link", "show", "dev", i.name).stdout)
        return out[0]["address"]


# ---------------------------------------------------------------- traffic

class Capture:
    """AF_PACKET listeners opened before sending; collect() drains them."""

    def __init__(self, points: Sequence[Iface], incoming_only: bool = True):
        self.points = list(points)
        self.incoming_only = incoming_only
        self.socks = [packet_socket(p.ns, p.name) for p in self.points]
        self.frames: dict[str, list[bytes]] = {p.name: [] for p in self.points}
        self.stamps: dict[str, list[float]] = {p.name: [] for p in self.points}

    def close(self) -> None:
        close_in_background(self.socks)

    def __enter__(self) -> "Capture":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def poll(self, timeout: float) -> int:
        got = 0
        r, _, _ = select.select(self.socks, [], [], timeout)
        for s in r:
            name = self.points[self.socks.index(s)].name
            while True:
                try:
                    data, addr = s.recvfrom(65535, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except OSError as e:
                    # the interface went down under us (a test did it): the
                    # socket reports it once and keeps working after link up
                    if e.errno == errno.ENETDOWN:
                        break
                    raise
                if self.incoming_only and addr[2] == PACKET_OUTGOING:
                    continue
                if is_noise(data):
                    continue
                self.frames[name].append(data)
                self.stamps[name].append(time.monotonic())
                got += 1
        return got

    def collect(self, quiet: float = 0.3, limit: float = 3.0) -> dict[str, list[bytes]]:
        """Drain until nothing arrived for `quiet` seconds (or `limit` passed)."""
        end = time.monotonic() + limit
        last = time.monotonic()
        while time.monotonic() < end and time.monotonic() - last < quiet:
            if self.poll(0.05):
                last = time.monotonic()
        return self.frames


class Sender:
    def __init__(self, tx: Iface):
        self.sock = packet_socket(tx.ns, tx.name)
        self.ifname = tx.name

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def close(self) -> None:
        close_in_background([self.sock])


def to_bytes(packets: Iterable) -> list[bytes]:
    return [p if isinstance(p, (bytes, bytearray)) else bytes(p) for p in packets]


def send_and_capture(tx: Iface, packets: Iterable, rx: Sequence[Iface], gap: float = 0.002,
                     quiet: float = 0.3) -> dict[str, list[bytes]]:
    """Send raw frames out of `tx`; return what each `rx` interface received."""
    frames = to_bytes(packets)
    with Capture(rx) as cap:
        s = Sender(tx)
        try:
            for f in frames:
                s.send(f)
                cap.poll(gap)
        finally:
            s.close()
        return cap.collect(quiet=quiet)


def send_and_expect(tx: Iface, packets: Iterable, rx: Iface, count: int | None = None,
                    gap: float = 0.002) -> list[bytes]:
    """VPP style: send, and expect `count` (default: as many as sent) frames at `rx`."""
    frames = to_bytes(packets)
    got = send_and_capture(tx, frames, [rx], gap=gap)[rx.name]
    want = len(frames) if count is None else count
    if len(got) != want:
        raise AssertionError(
            f"expected {want} frames at {rx.ns}:{rx.name}, got {len(got)}:\n"
            + "\n".join(describe(f) for f in got))
    return got


def send_and_expect_none(tx: Iface, packets: Iterable, rx: Iface) -> None:
    send_and_expect(tx, packets, rx, count=0)


# ---------------------------------------------------------------- daemon

class Daemon:
    """`fastpath run` inside the router namespace, stopped by SIGTERM by pid."""

    def __init__(self, lab: Lab, ifaces: Sequence[str] | None = None,
                 extra: Sequence[str] = (), binary: Path = FASTPATH,
                 datapath: str | None = None):
        self.lab = lab
        self.ifaces = list(ifaces or lab.router_ifaces())
        self.binary = binary
        self.sock = lab.tmp / "fp.sock"
        self.log = lab.tmp / "fastpath.log"
        self.extra = list(extra)
        # `--datapath afxdp` (user-space forwarding), per test or for a whole
        # run with FASTPATH_DATAPATH=afxdp.
        self.datapath = datapath or os.environ.get("FASTPATH_DATAPATH", "xdp")
        if self.datapath != "xdp" and "--datapath" not in self.extra:
            self.extra += ["--datapath", self.datapath]
        # The IPv4 lookup (`--fib4-index`) for a whole run, e.g.
        # FASTPATH_FIB4_INDEX=dir24 to run every test through the /24 index.
        fib4_index = os.environ.get("FASTPATH_FIB4_INDEX")
        if fib4_index and "--fib4-index" not in self.extra:
            self.extra += ["--fib4-index", fib4_index]
        # The same for IPv6 (`--fib6-index`), e.g. FASTPATH_FIB6_INDEX=multibit.
        fib6_index = os.environ.get("FASTPATH_FIB6_INDEX")
        if fib6_index and "--fib6-index" not in self.extra:
            self.extra += ["--fib6-index", fib6_index]
        self.proc: subprocess.Popen | None = None

    def cli(self, *args: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess:
        return sh(str(self.binary), *args, "--socket", str(self.sock), check=check, timeout=timeout)

    def status(self) -> dict:
        return json.loads(self.cli("status", "--json").stdout)

    def routes(self) -> list:
        return json.loads(self.cli("routes", "--json").stdout)

    def neighbours(self) -> list:
        return json.loads(self.cli("neighbours", "--json").stdout)

    def start(self, timeout: float = 60.0) -> "Daemon":
        cmd = ["ip", "netns", "exec", self.lab.router, str(self.binary), "run"]
        for i in self.ifaces:
            cmd += ["-i", i]
        cmd += ["--socket", str(self.sock), *self.extra]
        logf = open(self.log, "wb")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
        logs_info = env["RUST_LOG"] in ("info", "debug", "trace")
        # `ip netns exec` execs the daemon, so this pid is the daemon's own.
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        logf.close()
        self.lab.defer(self._kill_if_running)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fastpath run exited {self.proc.returncode}:\n{self.log_text()}")
            if self.sock.exists():
                p = self.cli("status", "--json", check=False)
                # The daemon holds its start's log until it is running
                # (crates/fastpath/src/startlog.rs), a moment after the API
                # answers: tests read the log as of this return.
                if p.returncode == 0 and (not logs_info or "fastpath running on" in self.log_text()):
                    self.lab.daemon = self
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"fastpath status did not answer within {timeout}s:\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM; returns the exit code (tests assert 0 and nothing left attached)."""
        assert self.proc is not None
        self.lab.daemon = None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise RuntimeError(f"fastpath did not exit {timeout}s after SIGTERM:\n{self.log_text()}")

    def _kill_if_running(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        rc = self.stop()
        left = self.lab.xdp_attached()
        if exc_type is None:
            assert rc == 0, f"fastpath exited {rc} after SIGTERM:\n{self.log_text()}"
            assert not left, f"XDP still attached after fastpath exit: {left}"

    # ------------------------------------------------------------ counters

    def counters(self, iface: str | None = None) -> dict[str, dict[str, int]]:
        st = self.status()
        if iface is None:
            return st.get("totals", {})
        for i in st.get("interfaces", []):
            if i.get("name") == iface:
                return i.get("counters", {})
        raise KeyError(f"{iface} not in fastpath status")

    def wait_converged(self, settle: float = 0.15) -> None:
        """Give the daemon its <= 100 ms to mirror a change the test just made."""
        time.sleep(settle)

    def neighbour_view(self) -> dict[tuple[str, str], str]:
        """{(dev, address): mac} of the daemon's neighbour table."""
        return {(n["dev"], str(ipaddress.ip_address(n["address"]))): n["mac"] for n in self.neighbours()}

    # A neighbour no test uses, put in and taken out as an event barrier.
    MARKER4, MARKER_MAC = "198.51.100.251", "02:00:5e:00:53:fb"

    def wait_neighbours_mirrored(self, timeout: float = 10.0) -> None:
        """Until the daemon holds exactly the router's usable neighbours.

        A barrier for runs that start from freshly resolved neighbours: a
        fixed sleep let a loaded CI machine send a case's first packets
        before the daemon had mirrored the new entries (counted no_neigh).
        Agreement alone can be vacuous: a daemon still behind on the events
        of a flush and re-resolve holds the old entries, with the same MACs,
        and drops them only after the check. So a marker entry goes in and
        out first: netlink delivers events in order, and once the daemon has
        dropped the marker it has applied every event before it."""
        dev, marker = self.ifaces[0], (self.ifaces[0], self.MARKER4)
        self.lab.ip(self.lab.router, "neigh", "replace", self.MARKER4, "lladdr", self.MARKER_MAC,
                    "dev", dev, "nud", "permanent")
        try:
            wait_for("the daemon to mirror the marker neighbour",
                     lambda: marker in self.neighbour_view(), timeout, step=0.02)
        finally:
            self.lab.ip(self.lab.router, "neigh", "del", self.MARKER4, "dev", dev)
        wait_for("the daemon to drop the marker neighbour",
                 lambda: marker not in self.neighbour_view(), timeout, step=0.02)
        diff: list[str] = []

        def agree() -> bool:
            k, d = kernel_neighbours(self.lab, self.ifaces), self.neighbour_view()
            diff[:] = [f"{key}: kernel {k.get(key)} fastpath {d.get(key)}"
                       for key in sorted(set(k) | set(d)) if k.get(key) != d.get(key)]
            return not diff

        try:
            wait_for("the daemon to mirror the resolved neighbours", agree, timeout, step=0.02)
        except AssertionError as e:
            raise AssertionError(f"{e}: {diff}\n{self.log_text()}") from None


USABLE_NEIGH = {"PERMANENT", "REACHABLE", "STALE", "DELAY", "PROBE"}


def kernel_neighbours(lab: "Lab", ports: Sequence[str] | None = None) -> dict[tuple[str, str], str]:
    """{(dev, address): mac} of the router's neighbours fastpath may forward to."""
    ports = list(ports or lab.router_ifaces())
    out = {}
    for n in json.loads(lab.ip(lab.router, "-j", "neigh", "show").stdout):
        if n.get("dev") in ports and "lladdr" in n and USABLE_NEIGH & set(n.get("state", [])):
            out[(n["dev"], str(ipaddress.ip_address(n["dst"])))] = n["lladdr"]
    return out


def ping_deltas(lab: "Lab", daemon: Daemon) -> tuple[dict, dict]:
    """5 pings client -> server, every one answered: (r0's, r1's counter deltas)."""
    before = daemon.counters("r0"), daemon.counters("r1")
    lab.run(lab.client, "ping", "-4", "-c5", "-i0.01", "-W2", "-q", Lab.S4)
    return counter_delta(before[0], daemon.counters("r0")), counter_delta(before[1], daemon.counters("r1"))


def ipv4_problems(daemon: Daemon) -> str:
    """What `fastpath status` says keeps IPv4 (or part of it) off the fast path."""
    return " ".join(daemon.status()["families"]["ipv4"]["problems"])


@contextlib.contextmanager
def one_cpu():
    """The flow cache is per CPU, as RSS keeps a flow on one CPU; a socket's
    packets are received on the sender's CPU, so pin the sending thread for
    a flow to keep meeting its cache entry."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def wait_for(what: str, cond, timeout: float = 5.0, step: float = 0.05):
    """cond()'s first true value, polled until `timeout` (else a failed assert)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(step)


def assert_recompute_writes_nothing(daemon: Daemon, view, why: object = "") -> None:
    """A full recompute (SIGHUP) writes nothing and `view()` (what the maps
    hold) stays as it was: the updates so far left exactly its tables. A
    check that a kernel change overlapped (the lab's own neighbour traffic:
    a link-local neighbour appearing, which the recompute then writes) is
    taken again."""
    def neighbours() -> list:
        return sorted((n["address"], n["ifindex"], n["mac"]) for n in daemon.neighbours())

    for _ in range(3):
        before, neigh, st = view(), neighbours(), daemon.status()
        gen, rec = st["generation"], st["reconciles"]
        os.kill(daemon.proc.pid, signal.SIGHUP)
        wait_for("SIGHUP's full recompute", lambda: daemon.status()["reconciles"]["full"] > rec["full"], 5)
        after = daemon.status()
        others = {k: v for k, v in after["reconciles"].items() if k != "full"}
        if others != {k: v for k, v in rec.items() if k != "full"} or neighbours() != neigh:
            continue
        assert after["generation"] == gen, f"the full recompute wrote something {why}"
        assert view() == before, why
        return
    raise AssertionError(f"kernel changes overlapped every check {why}")


def set_hash_seed(lab: Lab, daemon: Daemon) -> None:
    """A multipath hash seed the data plane can reproduce (without one,
    multipath routes are punted), and the daemon's full recompute after
    reading it done."""
    lab.sysctl(lab.router, "net.ipv4.fib_multipath_hash_seed", "4660")
    wait_for("the hash seed read", lambda: not daemon.status()["families"]["ipv4"]["multipath_hash"].startswith("punted"), 10)


def counter_delta(before: dict, after: dict, what: str = "packets") -> dict[str, int]:
    out = {}
    for reason in set(before) | set(after):
        d = after.get(reason, {}).get(what, 0) - before.get(reason, {}).get(what, 0)
        if d:
            out[reason] = d
    return out


def fastpath_usable() -> str | None:
    """None if the daemon binary looks usable, else why not (a skip reason)."""
    if not FASTPATH.exists():
        return f"{FASTPATH} not built (make build)"
    p = subprocess.run([str(FASTPATH), "run", "--help"], capture_output=True, text=True)
    if p.returncode != 0 or "--socket" not in p.stdout:
        return f"{FASTPATH} has no usable `run` subcommand yet"
    return None


def addr_family(a: str) -> int:
    return 6 if ipaddress.ip_address(a).version == 6 else 4
