"""DNS responders of `fastpath bench dns` (issue #6, workloads c and d), end to end.

One lab for the module; each responder runs as `fastpath bench dns-serve` in
the router namespace (XDP on r0, or the UDP socket server on [::]:53) and a
UDP client in the client namespace asks it over IPv4 and IPv6. Behind an
XDP responder the socket server runs as the slow path: an answer too big for
the tailroom of an skb-backed veth buffer is punted to it (the test checks
that XDP itself answered the rest):

  - NXDOMAIN responders: the right ID, flags and the question echoed;
  - map responders: the generated records (A, AAAA) case-insensitively,
    NODATA for another type of an existing name, NXDOMAIN otherwise;
  - malformed queries: FORMERR / NOTIMP (header only, same ID) or no answer,
    never anything else; and the responder still answers afterwards.

The expected records are recomputed here from the generation rule in
crates/fastpath/src/bench/dns_records.rs, independently of its code.
"""

from __future__ import annotations

import ipaddress
import re
import signal
import socket
import struct
import subprocess

import pytest
from scapy.layers.dns import DNS

from lab import FASTPATH, Lab, in_netns

RESPONDERS = ["xdp-nxdomain", "xdp-map", "socket-nxdomain", "socket-map"]
NO_ANSWER_WAIT = 0.3


@pytest.fixture(scope="module")
def dlab(fastpath_bin):
    with Lab() as l:
        yield l


class Server:
    def __init__(self, lab: Lab, kind: str):
        self.lab, self.kind = lab, kind
        cmd = ["ip", "netns", "exec", lab.router, str(FASTPATH), "bench", "dns-serve",
               "--responder", kind, "--set", "small"]
        if kind.startswith("xdp"):
            cmd += ["--dev", "r0", "--client-pass", f"{lab.client}:c0"]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def __enter__(self) -> "Server":
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            self.p.kill()
            raise RuntimeError(f"dns-serve {self.kind} did not start: {line}{self.p.stderr.read()}")
        return self

    def __exit__(self, *exc) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            out, err = self.p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.communicate()
            raise
        assert self.p.returncode == 0, f"dns-serve exited {self.p.returncode}: {err}"
        assert "counters" in out
        if self.kind.startswith("xdp") and not any(exc):
            # XDP answered itself; only answers too big for an skb's
            # tailroom may have gone to the slow path (none for NXDOMAIN).
            assert re.search(r'"(answer|nxdomain)", [1-9]', out), out
            if self.kind == "xdp-nxdomain":
                assert "slow path answers: 0" in out, out
        assert not self.lab.xdp_attached(), "XDP left attached on the router"
        assert not self.lab.xdp_attached(self.lab.client), "XDP left attached on the client"


@pytest.fixture(params=RESPONDERS)
def server(request, dlab):
    with Server(dlab, request.param) as s:
        yield s


def wire_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def query(qid: int, name: str, qtype: int, qclass: int = 1, flags: int = 0x0100) -> bytes:
    return struct.pack("!HHHHHH", qid, flags, 1, 0, 0, 0) + wire_name(name) + struct.pack("!HH", qtype, qclass)


def ask(lab: Lab, family: int, payload: bytes, wait: float = 2.0) -> bytes | None:
    """One UDP exchange from the client; None when nothing came back in `wait`."""
    server = lab.R0_4 if family == 4 else lab.R0_6
    with in_netns(lab.client):
        s = socket.socket(socket.AF_INET if family == 4 else socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        s.settimeout(wait)
        s.sendto(payload, (server, 53))
        try:
            data, src = s.recvfrom(4096)
        except socket.timeout:
            return None
        assert src[1] == 53
        return data
    finally:
        s.close()


def header(resp: bytes) -> tuple[int, int, int, int, int, int]:
    return struct.unpack("!HHHHHH", resp[:12])


# The generation rule of dns_records.rs, restated.
def record_name(i: int) -> str:
    return f"h{i:06x}.dns.example"


def a_addrs(i: int) -> list[str]:
    nets = ["203.0.113", "198.51.100", "192.0.2"]
    return [f"{nets[k]}.{i % 251 + 1}" for k in range(1 + i % 3)]


def aaaa_addrs(i: int) -> list[str]:
    return [str(ipaddress.IPv6Address(f"2001:db8:d5:{k:x}::{i >> 16:x}:{i & 0xffff:x}")) for k in range(1 + i % 2)]


def is_map(server: Server) -> bool:
    return server.kind.endswith("map")


@pytest.mark.parametrize("family", [4, 6])
def test_answers(server, family):
    lab = server.lab
    # An unknown name (mixed case): NXDOMAIN from both kinds, question echoed.
    q = query(0xBEEF, "NoSuch.Example.ORG", 1)
    r = ask(lab, family, q)
    assert r is not None, "no answer"
    assert header(r) == (0xBEEF, 0x8183, 1, 0, 0, 0)
    assert r[12:] == q[12:]
    if not is_map(server):
        # Whatever exists elsewhere, this responder knows no names.
        r = ask(lab, family, query(7, record_name(3), 28))
        assert header(r)[1] & 0xF == 3
        return
    for i, qtype in [(0, 1), (5, 1), (4, 28), (35, 28), (17, 1)]:
        name = record_name(i)
        mixed = "".join(c.upper() if k % 2 else c for k, c in enumerate(name))
        q = query(0x1000 + i, mixed, qtype)
        r = ask(lab, family, q)
        assert r is not None, f"no answer for {name}"
        want = a_addrs(i) if qtype == 1 else aaaa_addrs(i)
        qid, flags, qd, an, ns, ar = header(r)
        assert (qid, flags, qd, an, ns, ar) == (0x1000 + i, 0x8180, 1, len(want), 0, 0), name
        assert r[12:len(q)] == q[12:], "question echoed as asked (case kept)"
        d = DNS(r)
        got = [d.an[k].rdata for k in range(d.ancount)]
        assert [str(x) for x in got] == want, name
        assert all(d.an[k].type == qtype and d.an[k].ttl == 300 for k in range(d.ancount))
    # NODATA: the name exists, not as MX.
    r = ask(lab, family, query(0x2000, record_name(5), 15))
    assert header(r) == (0x2000, 0x8180, 1, 0, 0, 0)
    # Outside the set: NXDOMAIN.
    r = ask(lab, family, query(0x2001, record_name(100000), 1))
    assert header(r)[1] == 0x8183


def malformed() -> list[tuple[str, bytes, int | None]]:
    """(name, payload, expected RCODE of a header-only answer, or None = no answer)."""
    good_q = wire_name("example.com") + struct.pack("!HH", 1, 1)
    ptr = b"\x03www\xc0\x0c" + struct.pack("!HH", 1, 1)
    long_name = ".".join(["a" * 60] * 5)
    return [
        ("truncated header", b"\x12\x34\x01\x00\x00", None),
        ("QR already set", struct.pack("!HHHHHH", 0x1234, 0x8100, 1, 0, 0, 0) + good_q, None),
        ("opcode STATUS", struct.pack("!HHHHHH", 0x1234, 0x1100, 1, 0, 0, 0) + good_q, 4),
        ("qdcount 2", struct.pack("!HHHHHH", 0x1234, 0x0100, 2, 0, 0, 0) + good_q + good_q, 1),
        ("label > 63", struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\x40" + b"x" * 64 + b"\0\0\1\0\1", 1),
        ("name > 255", query(0x1234, long_name, 1), 1),
        ("compression pointer", struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + ptr, 1),
        ("trailing garbage", query(0x1234, "example.com", 1) + b"\xde\xad", 1),
        ("question cut short", query(0x1234, "example.com", 1)[:-2], 1),
    ]


@pytest.mark.parametrize("family", [4, 6])
def test_malformed_get_formerr_or_nothing(server, family):
    lab = server.lab
    for name, payload, rcode in malformed():
        r = ask(lab, family, payload, wait=NO_ANSWER_WAIT if rcode is None else 2.0)
        if rcode is None:
            assert r is None, f"{name}: answered {r!r}"
            continue
        assert r is not None, f"{name}: no answer"
        qid, flags, qd, an, ns, ar = header(r)
        assert len(r) == 12 and (qid, qd, an, ns, ar) == (0x1234, 0, 0, 0, 0), f"{name}: {r!r}"
        assert flags & 0x8000 and flags & 0xF == rcode, f"{name}: flags {flags:#x}"
    # Still answering after all that (an answer that never grows the
    # frame, so it is XDP's own whatever the buffer's tailroom).
    r = ask(lab, family, query(0x4321, record_name(100000), 1))
    assert r is not None and header(r)[:2] == (0x4321, 0x8183)


def test_edns_query_answered_without_opt(dlab):
    """dig sends an OPT record; the responders answer without one."""
    opt = b"\x00" + struct.pack("!HHIH", 41, 1232, 0, 0)
    q = struct.pack("!HHHHHH", 0x5555, 0x0100, 1, 0, 0, 1) + wire_name(record_name(2)) + struct.pack("!HH", 1, 1)
    for kind in ("xdp-map", "socket-map"):
        with Server(dlab, kind):
            r = ask(dlab, 4, q + opt)
            assert r is not None, kind
            assert header(r) == (0x5555, 0x8180, 1, len(a_addrs(2)), 0, 0), kind
            assert r[12:len(q)] == q[12:]
