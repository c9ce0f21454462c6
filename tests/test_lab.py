"""The harness itself, against the kernel alone (no fastpath needed)."""

import subprocess

import pytest

from lab import Lab, ipv4_csum_ok, send_and_expect
from pkts import IP, IPv6, Ether, udp4, udp6, udp_series


@pytest.fixture(scope="module")
def lab(module_lab):
    """The kernel-only tests here change nothing: one lab for the module."""
    return module_lab


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_lab_tears_down_also_on_failure():
    with pytest.raises(ZeroDivisionError):
        with Lab() as lab:
            name = lab.router
            assert name in namespaces()
            1 / 0
    assert name not in namespaces()


@pytest.mark.parametrize("dst", [Lab.S4, Lab.FAR4, Lab.S6, Lab.FAR6])
def test_kernel_forwards_ping(lab, dst):
    fam = "-6" if ":" in dst else "-4"
    lab.run(lab.client, "ping", fam, "-c2", "-i0.2", "-W2", "-q", dst)


def test_send_and_expect_through_kernel(lab):
    lab.resolve_neighbours()
    got = send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(3)], lab.s0)
    for f in got:
        e = Ether(f)
        assert e.src == lab.r1.mac and e.dst == lab.s0.mac
        assert e[IP].ttl == 63 and ipv4_csum_ok(f)
    got = send_and_expect(lab.c0, [udp6(lab, seq=i) for i in range(3)], lab.s0)
    assert all(Ether(f)[IPv6].hlim == 63 for f in got)


@pytest.mark.parametrize("mk,kw", [(udp4, {}), (udp6, {}), (udp4, {"size": 100, "dst": Lab.S4}),
                                   (udp4, {"chksum": 0}), (udp6, {"size": 17, "sport": 1234})])
def test_udp_series_is_what_scapy_builds(lab, mk, kw):
    seqs = list(range(0, 2000, 37)) + [99999999]
    assert udp_series(mk, lab, seqs, **kw) == [bytes(mk(lab, seq=s, **kw)) for s in seqs]
