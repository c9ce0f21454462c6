"""A small FPM client speaking the protocol as FRR 8.5's zebra (dplane_fpm_nl)
does: routes and next-hop objects as netlink messages in FPM frames, and the
offload status the server sends back (RTM_NEWROUTE, NLM_F_REQUEST, rtm_flags
RTM_F_OFFLOAD / RTM_F_OFFLOAD_FAILED), read the way fpm_read reads it: one
netlink message per frame."""

from __future__ import annotations

import ipaddress
import select
import socket
import struct
import time
from dataclasses import dataclass

FPM_VERSION, FPM_TYPE_NETLINK = 1, 1
RTM_NEWROUTE, RTM_DELROUTE, RTM_NEWNEXTHOP, RTM_DELNEXTHOP = 24, 25, 104, 105
NLM_F_REQUEST, NLM_F_CREATE = 0x1, 0x400
RTM_F_OFFLOAD, RTM_F_TRAP, RTM_F_OFFLOAD_FAILED = 0x4000, 0x8000, 0x20000000
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE, RTA_NH_ID = 1, 4, 5, 6, 15, 30
NHA_ID, NHA_GROUP, NHA_OIF, NHA_GATEWAY = 1, 2, 5, 6
RTPROT_STATIC_ZEBRA = 196  # zebra's protocol number for static routes
RTN_UNICAST = 1


def _attr(kind: int, value: bytes) -> bytes:
    a = struct.pack("=HH", 4 + len(value), kind) + value
    return a + b"\0" * (-len(a) % 4)


def _nlmsg(msg_type: int, flags: int, seq: int, payload: bytes) -> bytes:
    m = struct.pack("=IHHII", 16 + len(payload), msg_type, flags, seq, 0) + payload
    return m + b"\0" * (-len(m) % 4)


def frame(*nlmsgs: bytes) -> bytes:
    body = b"".join(nlmsgs)
    return struct.pack("!BBH", FPM_VERSION, FPM_TYPE_NETLINK, 4 + len(body)) + body


def _family(net) -> int:
    return socket.AF_INET if net.version == 4 else socket.AF_INET6


def route_msg(msg_type: int, prefix: str, *, gateway: str | None = None, oif: int = 0,
              nh_id: int | None = None, table: int = 254, metric: int = 20, seq: int = 0) -> bytes:
    net = ipaddress.ip_network(prefix)
    tb = table if table < 256 else 252  # RT_TABLE_COMPAT, the real id in RTA_TABLE
    rtm = struct.pack("=BBBBBBBBI", _family(net), net.prefixlen, 0, 0, tb,
                      RTPROT_STATIC_ZEBRA, 0, RTN_UNICAST, 0)
    attrs = _attr(RTA_DST, net.network_address.packed) + _attr(RTA_TABLE, struct.pack("=I", table))
    attrs += _attr(RTA_PRIORITY, struct.pack("=I", metric))
    if nh_id is not None:
        attrs += _attr(RTA_NH_ID, struct.pack("=I", nh_id))
    if gateway is not None:
        attrs += _attr(RTA_GATEWAY, ipaddress.ip_address(gateway).packed)
    if oif:
        attrs += _attr(RTA_OIF, struct.pack("=I", oif))
    return _nlmsg(msg_type, NLM_F_REQUEST | NLM_F_CREATE, seq, rtm + attrs)


def nexthop_msg(msg_type: int, nh_id: int, *, gateway: str | None = None, oif: int = 0,
                group: list[tuple[int, int]] | None = None, seq: int = 0) -> bytes:
    fam = socket.AF_UNSPEC if group or gateway is None else _family(ipaddress.ip_address(gateway))
    nhm = struct.pack("=BBBBI", fam, 0, RTPROT_STATIC_ZEBRA, 0, 0)
    attrs = _attr(NHA_ID, struct.pack("=I", nh_id))
    if group:
        attrs += _attr(NHA_GROUP, b"".join(struct.pack("=IBBH", i, w - 1, 0, 0) for i, w in group))
    if oif:
        attrs += _attr(NHA_OIF, struct.pack("=I", oif))
    if gateway is not None:
        attrs += _attr(NHA_GATEWAY, ipaddress.ip_address(gateway).packed)
    return _nlmsg(msg_type, NLM_F_REQUEST | NLM_F_CREATE, seq, nhm + attrs)


@dataclass
class Status:
    """One status message from the FPM server."""
    msg_type: int
    nl_flags: int
    prefix: str
    table: int
    rtm_flags: int
    nh_id: int | None
    gateway: str | None

    @property
    def offloaded(self) -> bool:
        return bool(self.rtm_flags & RTM_F_OFFLOAD)

    @property
    def failed(self) -> bool:
        return bool(self.rtm_flags & RTM_F_OFFLOAD_FAILED)


def parse_status(nl: bytes) -> Status:
    length, msg_type, flags, _seq, _pid = struct.unpack_from("=IHHII", nl)
    fam, dst_len, _src, _tos, table, _proto, _scope, _type, rtm_flags = struct.unpack_from("=BBBBBBBBI", nl, 16)
    dst = gw = nh_id = None
    off = 16 + 12
    while off + 4 <= length:
        alen, kind = struct.unpack_from("=HH", nl, off)
        if alen < 4:
            break
        val = nl[off + 4:off + alen]
        if kind == RTA_DST:
            dst = ipaddress.ip_address(val)
        elif kind == RTA_GATEWAY:
            gw = str(ipaddress.ip_address(val))
        elif kind == RTA_TABLE:
            table = struct.unpack("=I", val)[0]
        elif kind == RTA_NH_ID:
            nh_id = struct.unpack("=I", val)[0]
        off += (alen + 3) & ~3
    if dst is None:
        dst = ipaddress.ip_address("0.0.0.0" if fam == socket.AF_INET else "::")
    return Status(msg_type, flags, f"{dst}/{dst_len}", table, rtm_flags, nh_id, gw)


class FpmClient:
    """The zebra side of one FPM connection."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.seq = 0
        # Latest status per prefix, and every message in arrival order.
        self.statuses: dict[str, Status] = {}
        self.received: list[Status] = []

    @classmethod
    def connect(cls, host: str = "127.0.0.1", port: int = 2620, timeout: float = 5.0) -> "FpmClient":
        deadline = time.monotonic() + timeout
        while True:
            try:
                return cls(socket.create_connection((host, port), timeout=1.0))
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        self.sock.close()

    def send(self, *nlmsgs: bytes) -> None:
        self.sock.sendall(frame(*nlmsgs))

    def add_route(self, prefix: str, **kw) -> None:
        self.seq += 1
        self.send(route_msg(RTM_NEWROUTE, prefix, seq=self.seq, **kw))

    def del_route(self, prefix: str, **kw) -> None:
        self.seq += 1
        self.send(route_msg(RTM_DELROUTE, prefix, seq=self.seq, **kw))

    def add_nexthop(self, nh_id: int, **kw) -> None:
        self.seq += 1
        self.send(nexthop_msg(RTM_NEWNEXTHOP, nh_id, seq=self.seq, **kw))

    def del_nexthop(self, nh_id: int) -> None:
        self.seq += 1
        self.send(nexthop_msg(RTM_DELNEXTHOP, nh_id, seq=self.seq))

    def read_status(self, timeout: float = 2.0) -> list[Status]:
        """Every status message that arrives until `timeout` passes with none."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            while len(self.buf) >= 4:
                ver, typ, length = struct.unpack_from("!BBH", self.buf)
                assert ver == FPM_VERSION and typ == FPM_TYPE_NETLINK and length >= 4, self.buf[:4]
                if len(self.buf) < length:
                    break
                body, self.buf = self.buf[4:length], self.buf[length:]
                # FRR reads exactly one netlink message per frame.
                assert struct.unpack_from("=I", body)[0] == len(body), "one netlink message per frame"
                st = parse_status(body)
                out.append(st)
                self.received.append(st)
                self.statuses[st.prefix] = st
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                return out
            chunk = self.sock.recv(65536)
            if not chunk:
                return out
            self.buf += chunk
            deadline = time.monotonic() + 0.3  # more may follow right behind

    def wait_status(self, *prefixes: str, timeout: float = 5.0) -> dict[str, Status]:
        """The latest status of each prefix, once every one has one."""
        deadline = time.monotonic() + timeout
        while not all(p in self.statuses for p in prefixes):
            left = deadline - time.monotonic()
            missing = [p for p in prefixes if p not in self.statuses]
            assert left > 0, f"no status for {missing} within {timeout}s (got {list(self.statuses)})"
            self.read_status(timeout=min(0.5, left))
        return {p: self.statuses[p] for p in prefixes}
