"""Seeded generator of random and malformed frames for the differential fuzzer.

Frames are built as bytes (no scapy: 100k frames must take seconds, not
minutes): a valid Ethernet/IPv4|IPv6/TCP|UDP|ICMP frame first, then zero or
more mutations (truncation, trailing junk, bad lengths and checksums, IPv4
options, fragments, TTL 0/1, odd ethertypes, stacked VLAN tags, IPv6
extension headers, tiny frames, flipped bytes).

The address and message choices keep the kernel's own answers reproducible,
because the oracle is the kernel itself and two runs must agree:
- destinations are only hosts whose neighbour entry is permanent (the server,
  the client, the router itself) or prefixes routed via them; no unresolved
  on-link host (ARP/ND timing), no IPv6 to the ingress link (redirects are
  rate limited per peer with a fixed 1 s), no link-local IPv6 destination
  (the kernel sends it back out of the ingress and reports the failed ND
  on a timer);
- no ICMP that changes the router's or the server's state (redirects,
  frag-needed / packet too big, ND, MLD) or whose answer carries a clock
  (timestamp);
- no IPv4 source routing options (they route by addresses in the option), and
  no timestamp option with room left (every hop writes its clock into it).
Everything else about a frame is random.
"""

from __future__ import annotations

import array
import random
import struct
from dataclasses import dataclass


def csum(data: bytes, start: int = 0) -> int:
    if len(data) % 2:
        data += b"\0"
    a = array.array("H", data)
    a.byteswap()  # little-endian host: the sum is over big-endian words
    s = sum(a) + start
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def mac(s: str) -> bytes:
    return bytes(int(x, 16) for x in s.split(":"))


def a4(s: str) -> bytes:
    return bytes(int(x) for x in s.split("."))


def a6(s: str) -> bytes:
    import ipaddress
    return ipaddress.IPv6Address(s).packed


@dataclass
class Topology:
    """The lab's addresses as the generator needs them (see lab.Lab)."""
    client_mac: str
    router_mac: str
    c4: str
    c6: str
    r0_4: str
    r0_6: str
    r1_4: str
    r1_6: str
    s4: str
    s6: str


class FrameGen:
    def __init__(self, seed: int, topo: Topology):
        self.rnd = random.Random(seed)
        self.t = topo
        r = self.rnd
        self.cmac, self.rmac = mac(topo.client_mac), mac(topo.router_mac)
        self.dst4 = [  # (weight, address or callable)
            (30, lambda: a4("203.0.113.1")),
            (20, lambda: bytes([203, 0, 113, r.randrange(256)])),  # server-local /24
            (8, lambda: a4(topo.s4)),
            (6, lambda: a4(topo.c4)),                                # same interface
            (5, lambda: a4(topo.r0_4)), (4, lambda: a4(topo.r1_4)),  # the router itself
            (8, lambda: self._public4()),                           # default route -> server drops
            (2, lambda: a4("192.0.2.255")), (2, lambda: a4("198.51.100.255")),
            (2, lambda: a4("255.255.255.255")),
            (2, lambda: bytes([224 + r.randrange(16), r.randrange(256), r.randrange(256), r.randrange(1, 256)])),
            (1, lambda: a4("0.0.0.0")), (1, lambda: bytes([127, 0, 0, r.randrange(1, 256)])),
            (1, lambda: bytes([169, 254, r.randrange(256), r.randrange(1, 255)])),
        ]
        self.src4 = [
            (80, lambda: a4(topo.c4)), (8, lambda: self._public4()), (2, lambda: a4(topo.s4)),
            (1, lambda: a4("0.0.0.0")), (1, lambda: a4("127.0.0.1")), (1, lambda: a4(topo.r0_4)),
            (1, lambda: bytes([224, 0, 0, r.randrange(1, 256)])), (1, lambda: a4("255.255.255.255")),
            (1, lambda: bytes([169, 254, 1, r.randrange(1, 255)])),
        ]
        self.dst6 = [
            (30, lambda: a6("2001:db8:3::1")),
            (20, lambda: a6("2001:db8:3::") [:8] + r.randbytes(8)),  # server-local /64
            (8, lambda: a6(topo.s6)),
            (5, lambda: a6(topo.r0_6)), (4, lambda: a6(topo.r1_6)),
            (6, lambda: a6("2001:db8:ffff::")[:6] + r.randbytes(10)),  # no route: ICMPv6 back
            (2, lambda: bytes([0xFF, r.choice([0x02, 0x05, 0x0E])]) + bytes(13) + bytes([r.randrange(1, 256)])),
            (1, lambda: a6("::")), (1, lambda: a6("::1")),
        ]
        self.src6 = [
            (85, lambda: a6(topo.c6)), (6, lambda: a6("2001:db8:ffff::")[:6] + r.randbytes(10)),
            (1, lambda: a6("::")), (1, lambda: a6("::1")), (1, lambda: a6(topo.r0_6)),
            (1, lambda: a6("ff02::1")), (2, lambda: a6("fe80::")[:8] + r.randbytes(8)),
        ]

    # ------------------------------------------------------------ helpers

    def _pick(self, table):
        total = sum(w for w, _ in table)
        x = self.rnd.randrange(total)
        for w, f in table:
            if x < w:
                return f()
            x -= w
        raise AssertionError("unreachable")

    def _public4(self) -> bytes:
        """A unicast address outside every lab subnet (routed by the default route)."""
        r = self.rnd
        while True:
            b = bytes([r.randrange(1, 224), r.randrange(256), r.randrange(256), r.randrange(1, 255)])
            if b[0] in (10, 127, 169, 172, 192, 198, 203) or b[0] >= 224:
                continue
            return b

    def _ttl(self) -> int:
        return self.rnd.choices([0, 1, 2, 64, 255, self.rnd.randrange(256)], [3, 5, 3, 70, 10, 9])[0]

    def _payload(self, n: int | None = None) -> bytes:
        r = self.rnd
        if n is None:
            n = r.choices([r.randrange(0, 64), r.randrange(64, 600), r.randrange(1300, 1472)], [70, 25, 5])[0]
        return r.randbytes(n)

    # ------------------------------------------------------------ L4

    def _l4(self, v6: bool, src: bytes, dst: bytes) -> tuple[int, bytes]:
        r = self.rnd
        kind = r.choices(["udp", "tcp", "icmp", "other"], [45, 30, 20, 5])[0]
        data = self._payload()
        if kind == "other":
            proto = r.choice([47, 50, 132, 253, 41 if not v6 else 4, r.randrange(256)])
            if v6 and proto in (0, 43, 44, 51, 60, 58, 135, 6, 17):
                proto = 253
            if not v6 and proto in (1, 6, 17):
                proto = 47
            return proto, data
        if kind == "udp":
            proto = 17
            hdr = struct.pack("!HHHH", r.randrange(1024, 65536), r.choice([9, 53, 123, r.randrange(65536)]),
                              8 + len(data), 0)
        elif kind == "tcp":
            proto = 6
            flags = r.choice([0x02, 0x10, 0x18, 0x12, 0x11, 0x04, 0x14, r.randrange(256)])
            hdr = struct.pack("!HHIIBBHHH", r.randrange(1024, 65536), r.choice([22, 80, 443, r.randrange(65536)]),
                              r.getrandbits(32), r.getrandbits(32), 5 << 4, flags, r.randrange(65536), 0, 0)
        else:
            proto = 58 if v6 else 1
            if v6:
                typ, code = r.choice([(128, 0), (129, 0), (1, r.randrange(7)), (3, r.randrange(2)),
                                      (4, r.randrange(3)), (r.randrange(150, 256), r.randrange(256))])
            else:
                typ, code = r.choice([(8, 0), (0, 0), (3, r.choice([0, 1, 2, 3, 9, 10, 13])),
                                      (11, r.randrange(2)), (12, 0), (r.randrange(19, 256), r.randrange(256))])
            hdr = struct.pack("!BBHHH", typ, code, 0, r.randrange(65536), r.randrange(65536))
        seg = bytearray(hdr + data)
        off = {17: 6, 6: 16, 1: 2, 58: 2}[proto]
        if proto == 1:
            c = csum(bytes(seg))
        else:
            pseudo = src + dst + struct.pack("!I", len(seg)) + bytes(3) + bytes([proto]) if v6 else \
                src + dst + struct.pack("!BBH", 0, proto, len(seg))
            c = csum(pseudo + bytes(seg))
            if proto == 17 and c == 0:
                c = 0xFFFF
        if r.random() < 0.05:
            c ^= 1 + r.randrange(0xFFFF)  # bad L4 checksum
        struct.pack_into("!H", seg, off, c)
        return proto, bytes(seg)

    # ------------------------------------------------------------ L3

    def _options4(self) -> bytes:
        r = self.rnd
        opts = b""
        for _ in range(r.randrange(1, 4)):
            k = r.randrange(6)
            if k == 0:
                opts += b"\x01" * r.randrange(1, 4)                            # NOP
            elif k == 1:
                n = r.randrange(1, 5)
                opts += bytes([7, 3 + 4 * n, r.choice([4, 4, 8, 3, 40])]) + bytes(4 * n)  # record route
            elif k == 2:  # timestamp with no room left (overflow count bumped; no clock written)
                opts += bytes([68, 8, 9, r.randrange(16) << 4]) + r.randbytes(4)
            elif k == 3:
                opts += bytes([148, 4, 0, 0])                                  # router alert
            elif k == 4:
                opts += bytes([r.choice([130, 133, 134, 25, 30, 222]), r.randrange(0, 12)])
                opts += r.randbytes(max(0, opts[-1] - 2))                       # odd/bad length
            else:
                opts += b"\x00"                                                # end of list
        opts = opts[:40]
        return opts + bytes(-len(opts) % 4)

    def _ip4(self) -> bytes:
        r = self.rnd
        src, dst = self._pick(self.src4), self._pick(self.dst4)
        proto, l4 = self._l4(False, src, dst)
        opts = self._options4() if r.random() < 0.06 else b""
        frag = r.choice([0x4000, 0x4000, 0])
        if r.random() < 0.05:
            frag = r.choice([0x2000, 0x2000 | r.randrange(1, 200), r.randrange(1, 200), 0x6000 | r.randrange(8192)])
        hl = 20 + len(opts)
        hdr = bytearray(struct.pack("!BBHHHBBH4s4s", 0x40 | hl // 4, r.choice([0, 0, 0, 0xB8, r.randrange(256)]),
                                    hl + len(l4), r.randrange(65536), frag, self._ttl(), proto, 0, src, dst) + opts)
        struct.pack_into("!H", hdr, 10, csum(bytes(hdr)))
        return bytes(hdr) + l4

    def _ext6(self, nh: int, body: bytes) -> tuple[int, bytes]:
        r = self.rnd
        k = r.randrange(7)
        if k == 0:    # hop-by-hop: PadN, router alert or an unknown option
            opt = r.choice([b"\x01\x04\0\0\0\0", b"\x05\x02\0\0\x01\x00",
                            bytes([r.randrange(256), 4]) + r.randbytes(4)])
            return 0, bytes([nh, 0]) + opt + body
        if k == 1:    # routing header, type 0/2/4/random, segments left 0 or not
            return 43, bytes([nh, 2, r.choice([0, 2, 4, r.randrange(256)]), r.choice([0, 0, 1])]) + bytes(4) \
                + r.randbytes(16) + body
        if k == 2:    # fragment header: first, middle, atomic
            off = r.choice([0, 0, r.randrange(1, 200)])
            return 44, struct.pack("!BBHI", nh, 0, (off << 3) | r.choice([0, 1]), r.getrandbits(32)) + body
        if k == 3:    # destination options
            return 60, bytes([nh, 0, 1, 4, 0, 0, 0, 0]) + body
        if k == 4:    # AH (just bytes: nobody here has the key)
            return 51, bytes([nh, 4, 0, 0]) + r.randbytes(20) + body
        if k == 5:    # no next header, with junk behind it
            return 59, body
        return 135, bytes([nh, 0]) + r.randbytes(6) + body   # mobility

    def _ip6(self) -> bytes:
        r = self.rnd
        src, dst = self._pick(self.src6), self._pick(self.dst6)
        nh, body = self._l4(True, src, dst)
        for _ in range(r.choices([0, 1, 2], [88, 10, 2])[0]):
            nh, body = self._ext6(nh, body)
        vtf = (6 << 28) | (r.choice([0, 0, 0xB8, r.randrange(256)]) << 20) | r.choice([0, 0x12345, r.getrandbits(20)])
        return struct.pack("!IHBB", vtf, len(body), nh, self._ttl()) + src + dst + body

    # ------------------------------------------------------------ L2 and mutations

    def frame(self) -> bytes:
        r = self.rnd
        v6 = r.random() < 0.45
        l3 = self._ip6() if v6 else self._ip4()
        et = 0x86DD if v6 else 0x0800
        dmac = self.rmac
        if r.random() < 0.03:
            dmac = r.choice([b"\xff" * 6, b"\x01\x00\x5e\x00\x00\x01", b"\x33\x33\x00\x00\x00\x01",
                             b"\x02\x00\x00\x00\x99\x99"])
        f = bytearray(dmac + self.cmac + struct.pack("!H", et) + l3)
        for _ in range(r.choices([0, 1, 2], [65, 28, 7])[0]):
            f = self._mutate(f, v6)
        return bytes(f[:1514])

    def _mutate(self, f: bytearray, v6: bool) -> bytearray:
        r = self.rnd
        k = r.randrange(12)
        if k == 0 and len(f) > 14:                      # truncated (tiny frames included)
            return f[:r.randrange(14, len(f))]
        if k == 1:                                      # trailing junk / padding
            return f + (bytes(r.randrange(1, 40)) if r.random() < 0.5 else r.randbytes(r.randrange(1, 40)))
        if k == 2 and len(f) >= 34:                     # flip a bit of the fixed header or L4
            # Not in the addresses or IPv4 options: a flipped address may land on an
            # unresolved on-link host, whose ARP/ND failure is reported on a timer.
            fixed, l4 = (22, 54) if v6 else (26, 14 + max(20, (f[14] & 0xF) * 4))
            i = r.choice([r.randrange(14, fixed), r.randrange(l4, max(l4 + 1, min(len(f), l4 + 20)))])
            if i < len(f):
                f[i] ^= 1 << r.randrange(8)
            return f
        if k == 3 and len(f) >= 34 and not v6:          # bad IPv4 header checksum
            f[24] ^= 1 + r.randrange(255)
            return f
        if k == 4 and len(f) >= 34:                     # bad IP length field, checksum still right
            if v6:
                struct.pack_into("!H", f, 18, r.choice([0, r.randrange(65536), max(0, len(f) - 54 - 1)]))
            else:
                struct.pack_into("!H", f, 16, r.choice([0, 19, r.randrange(65536), len(f) - 14 + 1, len(f) - 15]))
                self._fix4(f)
            return f
        if k == 5 and len(f) >= 34 and not v6:          # bad IHL / version, checksum right
            f[14] = r.choice([0x40 | r.randrange(5), 0x40 | r.randrange(6, 16), 0x60 | 5, r.randrange(256)])
            self._fix4(f)
            return f
        if k == 6 and len(f) >= 34 and v6:               # bad version nibble
            f[14] = (f[14] & 0x0F) | (r.randrange(16) << 4)
            return f
        if k == 7:                                      # one or two VLAN tags in front
            tags = b""
            for tpid in r.choice([[0x8100], [0x88A8, 0x8100], [0x8100, 0x8100]]):
                tags += struct.pack("!HH", tpid, r.randrange(4096))
            return f[:12] + tags + f[12:]
        if k == 8:                                      # odd ethertype
            et = r.choice([0x0801, 0x86DE, 0x8847, 0x88B5, 0x0000, 0x05DC, 0xFFFF, r.randrange(0x600, 0x10000)])
            if et in (0x0806, 0x88CC, 0x0800, 0x86DD, 0x8100, 0x88A8):
                et = 0x88B5
            struct.pack_into("!H", f, 12, et)
            return f
        if k == 9:                                      # random bytes after the headers
            cut = min(len(f), 14 + (40 if v6 else 20) + r.randrange(0, 28))
            return f[:cut] + r.randbytes(max(0, len(f) - cut))
        if k == 10 and len(f) >= 34:                    # TTL / hop limit 0 or 1
            if v6:
                f[21] = r.choice([0, 1])
            else:
                f[22] = r.choice([0, 1])
                self._fix4(f)
            return f
        if k == 11:                                     # a tiny frame
            return f[:r.randrange(14, 40)]
        return f

    @staticmethod
    def _fix4(f: bytearray) -> None:
        hl = (f[14] & 0xF) * 4
        if hl < 20 or 14 + hl > len(f):
            return
        f[24:26] = b"\0\0"
        struct.pack_into("!H", f, 24, csum(bytes(f[14:14 + hl])))

    def frames(self, n: int) -> list[bytes]:
        return [self.frame() for _ in range(n)]
