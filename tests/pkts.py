"""Scapy packet builders for frames the client sends to the router."""

from __future__ import annotations

import logging

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.layers.inet import ICMP, IP, TCP, UDP, fragment  # noqa: E402
from scapy.layers.inet6 import (  # noqa: E402
    ICMPv6EchoRequest, IPv6, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, fragment6)
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.packet import Padding, Raw  # noqa: E402

from lab import Lab  # noqa: E402


def eth(lab: Lab):
    return Ether(src=lab.c0.mac, dst=lab.r0.mac)


def payload(seq: int = 0, size: int = 32) -> bytes:
    """Exactly `size` bytes, starting with a readable sequence number."""
    return (f"fastpath-{seq:08d}-".encode() + b"." * size)[:size]


def udp4(lab: Lab, dst: str | None = None, ttl: int = 64, sport: int = 40000, dport: int = 9,
         seq: int = 0, size: int = 32, **ip):
    return eth(lab) / IP(**{"src": lab.C4, **ip}, dst=dst or lab.FAR4, ttl=ttl) / \
        UDP(sport=sport, dport=dport) / Raw(payload(seq, size))


def udp6(lab: Lab, dst: str | None = None, hlim: int = 64, sport: int = 40000, dport: int = 9,
         seq: int = 0, size: int = 32, **ip):
    return eth(lab) / IPv6(**{"src": lab.C6, **ip}, dst=dst or lab.FAR6, hlim=hlim) / \
        UDP(sport=sport, dport=dport) / Raw(payload(seq, size))


def tcp4(lab: Lab, dst: str | None = None, ttl: int = 64, flags: str = "S", dport: int = 80,
         seq: int = 1000, data: bytes = b""):
    return eth(lab) / IP(src=lab.C4, dst=dst or lab.FAR4, ttl=ttl) / \
        TCP(sport=40001, dport=dport, flags=flags, seq=seq, window=8192) / Raw(data)


def tcp6(lab: Lab, dst: str | None = None, hlim: int = 64, flags: str = "S", dport: int = 80,
         seq: int = 1000, data: bytes = b""):
    return eth(lab) / IPv6(src=lab.C6, dst=dst or lab.FAR6, hlim=hlim) / \
        TCP(sport=40001, dport=dport, flags=flags, seq=seq, window=8192) / Raw(data)


def ping4(lab: Lab, dst: str | None = None, ttl: int = 64, seq: int = 1, size: int = 32, **ip):
    return eth(lab) / IP(**{"src": lab.C4, **ip}, dst=dst or lab.FAR4, ttl=ttl) / \
        ICMP(id=0x4650, seq=seq) / Raw(payload(seq, size))


def ping6(lab: Lab, dst: str | None = None, hlim: int = 64, seq: int = 1, size: int = 32):
    return eth(lab) / IPv6(src=lab.C6, dst=dst or lab.FAR6, hlim=hlim) / \
        ICMPv6EchoRequest(id=0x4650, seq=seq, data=payload(seq, size))


def frags4(lab: Lab, dst: str | None = None, size: int = 600, fragsize: int = 256):
    pkt = IP(src=lab.C4, dst=dst or lab.FAR4, id=0x1234) / UDP(sport=40002, dport=9) / \
        Raw(payload(7, size))
    return [eth(lab) / f for f in fragment(pkt, fragsize=fragsize)]


def frags6(lab: Lab, dst: str | None = None, size: int = 600, fragsize: int = 300):
    pkt = IPv6(src=lab.C6, dst=dst or lab.FAR6) / IPv6ExtHdrFragment(id=0x1234) / \
        UDP(sport=40002, dport=9) / Raw(payload(7, size))
    return [eth(lab) / f for f in fragment6(pkt, fragsize)]


__all__ = [
    "Ether", "IP", "IPv6", "UDP", "TCP", "ICMP", "Raw", "Padding", "IPv6ExtHdrHopByHop",
    "eth", "payload", "udp4", "udp6", "tcp4", "tcp6", "ping4", "ping6", "frags4", "frags6",
]
