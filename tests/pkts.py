"""Scapy packet builders for frames the client sends to the router."""

from __future__ import annotations

import logging
import struct

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.layers.inet import ICMP, IP, TCP, UDP, fragment  # noqa: E402
from scapy.layers.inet6 import (  # noqa: E402
    ICMPv6EchoReply, ICMPv6EchoRequest, IPv6, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, fragment6)
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


def _fold(s: int) -> int:
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def _sum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    return sum(struct.unpack(f"!{len(data) // 2}H", data))


def udp_series(mk, lab: Lab, seqs, **kw) -> list[bytes]:
    """`[bytes(mk(lab, seq=s, **kw)) for s in seqs]` for mk = udp4 or udp6,
    fast: scapy takes milliseconds per frame on a loaded machine and streams
    send thousands. The frames differ only in the sequence digits of their
    payload, so each is the first one with those digits and the UDP checksum
    redone; the last is also built by scapy and must come out the same."""
    seqs = list(seqs)
    if not seqs:
        return []
    first = bytes(mk(lab, seq=seqs[0], **kw))
    v4 = first[12:14] == b"\x08\x00"
    l4 = 14 + ((first[14] & 0xF) * 4 if v4 else 40)
    assert (first[23] if v4 else first[20]) == 17, "not a plain UDP frame"
    digits = l4 + 8 + len(b"fastpath-")
    assert first[l4 + 8:digits] == b"fastpath-" and first[digits:digits + 8] == b"%08d" % seqs[0], \
        "payload too short for its sequence number"
    udp_len = len(first) - l4
    if v4:
        pseudo = first[26:34] + struct.pack("!BBH", 0, 17, udp_len)
    else:
        pseudo = first[22:54] + struct.pack("!IxxxB", udp_len, 17)
    zero_csum = first[l4 + 6:l4 + 8] == b"\0\0"  # an IPv4 datagram sent without one
    out = []
    buf = bytearray(first)
    for seq in seqs:
        buf[digits:digits + 8] = b"%08d" % seq
        if not zero_csum:
            buf[l4 + 6:l4 + 8] = b"\0\0"
            c = ~_fold(_sum16(pseudo) + _sum16(bytes(buf[l4:]))) & 0xFFFF
            buf[l4 + 6:l4 + 8] = struct.pack("!H", c or 0xFFFF)
        out.append(bytes(buf))
    assert out[-1] == bytes(mk(lab, seq=seqs[-1], **kw)), "udp_series differs from scapy's frame"
    return out


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
    "Ether", "IP", "IPv6", "UDP", "TCP", "ICMP", "ICMPv6EchoRequest", "ICMPv6EchoReply", "Raw", "Padding", "IPv6ExtHdrHopByHop",
    "eth", "payload", "udp4", "udp6", "udp_series", "tcp4", "tcp6", "ping4", "ping6", "frags4", "frags6",
]
