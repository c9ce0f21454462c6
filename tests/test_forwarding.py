"""Real traffic through the fast path: the counters must say FORWARDED, not punted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lab import Daemon, Lab, counter_delta, ipv4_csum_ok, send_and_expect
from pkts import IP, UDP, Ether, IPv6, payload, udp4, udp6


# The module's tests only send traffic and compare counter deltas: they share
# one lab, and one daemon per data path.
@pytest.fixture(scope="module")
def lab(module_lab):
    return module_lab


HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def datapath(request):
    """`xdp` unless a test asks for more with indirect parametrisation
    (pytest groups the tests by it and stops one daemon before the next)."""
    return getattr(request, "param", "xdp")


@pytest.fixture(scope="module")
def daemon(lab, fastpath_bin, datapath):
    with Daemon(lab, datapath=datapath) as d:
        yield d


BOTH = pytest.mark.parametrize("datapath", ["xdp", "afxdp"], indirect=True, scope="module")


def fwd(delta: dict) -> int:
    return delta.get("forwarded", 0)


def snapshot(daemon):
    return {i: daemon.counters(i) for i in daemon.lab.router_ifaces()}


def deltas(daemon, before):
    return {i: counter_delta(before[i], daemon.counters(i)) for i in before}


@pytest.mark.parametrize("dst", [Lab.S4, Lab.FAR4, Lab.S6, Lab.FAR6])
def test_ping(lab, daemon, dst):
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    before = snapshot(daemon)
    fam = "-6" if ":" in dst else "-4"
    lab.run(lab.client, "ping", fam, "-c10", "-i0.01", "-W2", "-q", dst)
    d = deltas(daemon, before)
    assert fwd(d["r0"]) >= 10 and fwd(d["r1"]) >= 10, d


@BOTH
@pytest.mark.parametrize("family", [4, 6])
def test_udp_rewrite(lab, daemon, family):
    """Exact output: MACs rewritten, TTL/hop limit - 1, checksum valid, payload intact."""
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    before = snapshot(daemon)
    mk = udp4 if family == 4 else udp6
    sent = [mk(lab, seq=i, size=64 + i) for i in range(10)]
    got = send_and_expect(lab.c0, sent, lab.s0)
    for k, (s, f) in enumerate(zip(sent, got)):
        s = Ether(bytes(s))  # fields as sent, not scapy's unset defaults
        e = Ether(f)
        assert (e.src, e.dst) == (lab.r1.mac, lab.s0.mac)
        if family == 4:
            assert e[IP].ttl == 63 and ipv4_csum_ok(f)
            assert bytes(e[IP].payload) == bytes(s[IP].payload)
            assert e[IP].id == s[IP].id and e[IP].len == s[IP].len
        else:
            assert e[IPv6].hlim == 63 and bytes(e[IPv6].payload) == bytes(s[IPv6].payload)
        assert e[UDP].load == payload(k, 64 + k)
    d = deltas(daemon, before)
    assert fwd(d["r0"]) == 10, d
    if daemon.datapath == "afxdp":
        a = daemon.status()["afxdp"]
        assert a["forwarded"] >= 10 and a["drop_meta"] + a["drop_parse"] + a["drop_ttl"] == 0, a


@pytest.mark.parametrize("dst,datapath", [(Lab.FAR4, "xdp"), (Lab.FAR6, "xdp"), (Lab.S4, "xdp"),
                                          (Lab.FAR6, "afxdp")], indirect=["datapath"], scope="module")
def test_tcp_transfer(lab, daemon, dst):
    """A real connection: 2 MB echoed back through the router, checked byte for byte."""
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    before = snapshot(daemon)
    srv = subprocess.Popen(["ip", "netns", "exec", lab.server, sys.executable, str(HERE / "tcp_echo.py"),
                            "server", dst, "5001"], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "listening"
        out = lab.run(lab.client, sys.executable, str(HERE / "tcp_echo.py"), "client", dst, "5001",
                      str(2 << 20), timeout=60).stdout
        assert out.strip() == f"ok {2 << 20}"
        assert srv.wait(10) == 0
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    d = deltas(daemon, before)
    # 2 MB each way is > 1400 full-sized segments in each direction
    assert fwd(d["r0"]) >= 1400 and fwd(d["r1"]) >= 1400, d
