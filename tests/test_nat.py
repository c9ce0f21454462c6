"""NAT on the fast path (stateful mode): the kernel as oracle.

The router NATs with nftables (SNAT, masquerade, DNAT / port forwarding)
and marks established connections for the fast path. Client and server are
both driven with raw frames (their own stacks kept quiet), so the same
connection can be replayed: once through the kernel alone, once with
fastpath in stateful mode, conntrack flushed before each run. What arrives
at the server and back at the client must be byte-identical, and the
flow entries must show that NATed packets were forwarded by XDP in both
directions (a run that punted everything would prove nothing).

A UDP flow becomes fast only once conntrack has made it ASSURED, which it
does for a packet more than two seconds after the first (stream_ts), so the
UDP flows pause once. An ICMP echo flow (echo id NAT) becomes fast once the
daemon's copy of its entry shows the marks both directions set: its first
two exchanges go through the kernel, the rest after the pause. All six
flows of a NAT kind (v4/v6, UDP/TCP/ICMP) share one run and that pause;
each is compared on its own frames, and must have been forwarded by XDP in
both directions, per fastpath's flow entries.
"""

from __future__ import annotations

import time

import pytest

from lab import Lab, Sender
from oracle import Case, differential_many
from pkts import ICMP, IP, TCP, UDP, Ether, ICMPv6EchoReply, ICMPv6EchoRequest, IPv6, Raw, payload

# The fast-path bits of each direction (fastpath's --ct-mark / --ct-mark-reply defaults).
FAST_MARK, FAST_MARK_REPLY = "0x1", "0x2"

FILTER = f"""
table inet fpnat_fw {{
  chain transit {{
    type filter hook forward priority 0; policy accept;
    ct state established ct direction original ct mark set ct mark or {FAST_MARK}
    ct state established ct direction reply ct mark set ct mark or {FAST_MARK_REPLY}
  }}
}}
"""

SNAT4, SNAT6 = "198.51.100.100", "2001:db8:2::100"
# The scenarios' echoes carry this DSCP so that the source NAT rules leave
# the lab's own pings alone (they resolve the neighbours before each run,
# and the server could not answer a translated one: nothing owns SNAT4).
ECHO_DSCP = "cs1"
ECHO_TOS = 0x20

RULES = {
    "snat": f"""
table ip fpnat {{
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto {{ tcp, udp }} snat to {SNAT4}
    oifname "r1" ip dscp {ECHO_DSCP} icmp type echo-request snat to {SNAT4}
  }}
}}
table ip6 fpnat {{
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto {{ tcp, udp }} snat to {SNAT6}
    oifname "r1" ip6 dscp {ECHO_DSCP} icmpv6 type echo-request snat to {SNAT6}
  }}
}}
""",
    "masquerade": f"""
table ip fpnat {{
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto {{ tcp, udp }} masquerade
    oifname "r1" ip dscp {ECHO_DSCP} icmp type echo-request masquerade
  }}
}}
table ip6 fpnat {{
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "r1" meta l4proto {{ tcp, udp }} masquerade
    oifname "r1" ip6 dscp {ECHO_DSCP} icmpv6 type echo-request masquerade
  }}
}}
""",
    # Port forwarding: the client talks to the router's own address.
    "dnat": f"""
table ip fpnat {{
  chain pre {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip daddr {Lab.R0_4} meta l4proto {{ tcp, udp }} th dport 8080 dnat to {Lab.S4}:80
    iifname "r0" ip daddr {Lab.R0_4} icmp type echo-request dnat to {Lab.S4}
  }}
}}
table ip6 fpnat {{
  chain pre {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "r0" ip6 daddr {Lab.R0_6} meta l4proto {{ tcp, udp }} th dport 8080 dnat to [{Lab.S6}]:80
    iifname "r0" ip6 daddr {Lab.R0_6} icmpv6 type echo-request dnat to {Lab.S6}
  }}
}}
""",
}


def flow(kind: str, v6: bool, sport: int) -> tuple[tuple, tuple]:
    """(client's view, server's view) of the connection: (src, dst, sport, dport)."""
    c, s = (Lab.C6, Lab.S6) if v6 else (Lab.C4, Lab.S4)
    if kind == "snat":
        return (c, s, sport, 80), ((SNAT6 if v6 else SNAT4), s, sport, 80)
    if kind == "masquerade":
        return (c, s, sport, 80), ((Lab.R1_6 if v6 else Lab.R1_4), s, sport, 80)
    r0 = Lab.R0_6 if v6 else Lab.R0_4
    return (c, r0, sport, 8080), (c, s, sport, 80)


class Ends:
    """Frame builders for both ends of one connection."""

    def __init__(self, lab: Lab, kind: str, v6: bool, sport: int):
        self.lab, self.v6 = lab, v6
        self.cview, self.sview = flow(kind, v6, sport)

    def _ip(self, src: str, dst: str, tos: int):
        if self.v6:
            return IPv6(src=src, dst=dst, hlim=64, tc=tos)
        return IP(src=src, dst=dst, ttl=64, id=0x4e41, tos=tos)

    def from_client(self, l4, tos: int = 0) -> bytes:
        src, dst, _, _ = self.cview
        return bytes(Ether(src=self.lab.c0.mac, dst=self.lab.r0.mac) / self._ip(src, dst, tos) / l4)

    def from_server(self, l4, tos: int = 0) -> bytes:
        src, dst, _, _ = self.sview
        return bytes(Ether(src=self.lab.s0.mac, dst=self.lab.r1.mac) / self._ip(dst, src, tos) / l4)

    def echo(self, seq: int, reply: bool) -> bytes:
        """An echo request from the client, or the server's reply (as NATed)."""
        id_ = self.cview[2]
        data = payload(200 + seq, 24 + seq)
        if self.v6:
            l4 = ICMPv6EchoReply(id=id_, seq=seq, data=data) if reply else ICMPv6EchoRequest(id=id_, seq=seq, data=data)
        else:
            l4 = ICMP(type=0 if reply else 8, id=id_, seq=seq) / Raw(data)
        return self.from_server(l4, ECHO_TOS) if reply else self.from_client(l4, ECHO_TOS)

    def c_ports(self) -> dict:
        return {"sport": self.cview[2], "dport": self.cview[3]}

    def s_ports(self) -> dict:
        return {"sport": self.sview[3], "dport": self.sview[2]}


N = 4  # fast-path packets per direction
ASSURED_AFTER = 2.2  # s after a UDP flow's first packet (conntrack's stream_ts is 2 s)


def udp_open(ends: Ends, send, srv: Sender) -> None:
    """The first exchange: conntrack has seen a reply, but not yet assured."""
    send([ends.from_client(UDP(**ends.c_ports()) / Raw(payload(0)))])   # new
    srv.send(ends.from_server(UDP(**ends.s_ports()) / Raw(payload(100, 40))))
    time.sleep(0.01)


def udp_stream(ends: Ends, send, srv: Sender) -> None:
    """The flow once it is past stream_ts: assured, so marked fast."""
    def reply(seq: int) -> None:
        srv.send(ends.from_server(UDP(**ends.s_ports()) / Raw(payload(100 + seq, 40))))
        time.sleep(0.01)

    send([ends.from_client(UDP(**ends.c_ports()) / Raw(payload(1)))])   # assured now
    time.sleep(0.05)
    for i in range(N):
        send([ends.from_client(UDP(**ends.c_ports()) / Raw(payload(10 + i, 24 + i)))])
        reply(10 + i)
    # zero checksum over IPv4 (none), an odd length
    if not ends.v6:
        send([ends.from_client(UDP(**ends.c_ports(), chksum=0) / Raw(payload(20, 17)))])


def icmp_open(ends: Ends, send, srv: Sender) -> None:
    """Two exchanges through the kernel: the first makes the entry (the reply
    direction marked by its reply), the second marks the original direction."""
    for seq in (1, 2):
        send([ends.echo(seq, reply=False)])
        srv.send(ends.echo(seq, reply=True))
        time.sleep(0.01)


def icmp_stream(ends: Ends, send, srv: Sender) -> None:
    """Echoes once the daemon has re-read the marked entry (the kernel keeps
    the id unless it clashes: the server answers the id the client sent)."""
    for seq in range(10, 10 + N):
        send([ends.echo(seq, reply=False)])
        srv.send(ends.echo(seq, reply=True))
        time.sleep(0.01)


def tcp_session(ends: Ends, send, srv: Sender) -> None:
    c_seq, s_seq = 1000, 5000

    def server(flags: str, seq: int, ack: int, data: bytes = b"") -> None:
        srv.send(ends.from_server(TCP(**ends.s_ports(), flags=flags, seq=seq, ack=ack, window=65535)
                                  / Raw(data)))
        time.sleep(0.01)

    def client(flags: str, seq: int, ack: int, data: bytes = b"") -> None:
        send([ends.from_client(TCP(**ends.c_ports(), flags=flags, seq=seq, ack=ack, window=65535)
                               / Raw(data))])

    client("S", c_seq, 0)
    server("SA", s_seq, c_seq + 1)
    c_seq, s_seq = c_seq + 1, s_seq + 1
    client("A", c_seq, s_seq)          # conntrack: ESTABLISHED, marked
    # With strict window tracking the data path asks the daemon to
    # make the entry liberal only once it has met it strict for
    # 10 ms (ct.h): one exchange 20 ms apart, through the kernel.
    d = payload(10, 30)
    client("PA", c_seq, s_seq, d)
    c_seq += len(d)
    time.sleep(0.02)
    r = payload(11, 30)
    server("PA", s_seq, c_seq, r)
    s_seq += len(r)
    time.sleep(0.05)
    for i in range(N):
        d = payload(30 + i, 40 + i)
        client("PA", c_seq, s_seq, d)
        c_seq += len(d)
        r = payload(60 + i, 20 + 3 * i)
        server("PA", s_seq, c_seq, r)
        s_seq += len(r)


def kind_scenario(flows: list[tuple[Ends, str]]):
    """Every flow of one NAT kind in one run, so that the UDP flows share
    their wait for ASSURED and the TCP sessions run during it."""
    def run(lab: Lab, send) -> None:
        srv = Sender(lab.s0)
        try:
            with lab.quiet(lab.server):  # the server's stack must not answer
                udp = [e for e, proto in flows if proto == "udp"]
                for e in udp:
                    udp_open(e, send, srv)
                assured_at = time.monotonic() + ASSURED_AFTER
                icmp = [e for e, proto in flows if proto == "icmp"]
                for e in icmp:
                    icmp_open(e, send, srv)
                for e in (e for e, proto in flows if proto == "tcp"):
                    tcp_session(e, send, srv)
                time.sleep(max(0.0, assured_at - time.monotonic()))
                for e in udp:
                    udp_stream(e, send, srv)
                for e in icmp:
                    icmp_stream(e, send, srv)
        finally:
            srv.close()
    return run


def claims(v6: bool, proto: str):
    """Whether a frame belongs to the flow of this family and protocol (one per kind's run)."""
    et, num = (b"\x86\xdd", 20) if v6 else (b"\x08\x00", 23)  # next header / protocol
    want = PROTO[proto](v6)
    return lambda f: len(f) > num and f[12:14] == et and f[num] == want


PROTO = {"udp": lambda v6: 17, "tcp": lambda v6: 6, "icmp": lambda v6: 58 if v6 else 1}


CASES = [(k, v6, p) for k in RULES for v6 in (False, True) for p in ("udp", "tcp", "icmp")]
IDS = [f"{k}-{'v6' if v6 else 'v4'}-{p}" for k, v6, p in CASES]


@pytest.fixture(scope="module")
def nat_runs(fastpath_bin):
    """Every case through one lab and one stateful daemon: the ruleset is
    replaced and conntrack flushed before each kind's run, as a user would.
    Returns {id: ((kernel, fastpath) or the AssertionError, Ends)}."""
    with Lab() as lab:
        def prepare(kind: str):
            def load() -> None:
                lab.run(lab.router, "nft", "-f", "-", input="flush ruleset\n" + FILTER + RULES[kind])
                lab.run(lab.router, "conntrack", "-F", check=False)
            return load

        ends: dict[str, Ends] = {}
        cases = {}
        for kind in RULES:
            parts, flows = {}, []
            for n, ((k, v6, proto), name) in enumerate(zip(CASES, IDS)):
                if k != kind:
                    continue
                # A port per case: the same tuple NATed differently by the next
                # kind's ruleset is punted once (ct_nat), not what a case counts.
                ends[name] = Ends(lab, kind, v6, 40100 + n)
                flows.append((ends[name], proto))
                parts[name] = claims(v6, proto)
            cases[kind] = Case(kind_scenario(flows), prepare=prepare(kind), parts=parts, flows=True)
        runs = differential_many(lab, cases, rx=[lab.s0, lab.c0], gap=0.01, daemon_args=["--mode", "stateful"])
        yield {name: (runs[name], ends[name]) for name in IDS}


def flow_packets(flows: list[dict], ingress: str, proto: str, v6: bool, sport: int, dport: int) -> int:
    return sum(f["packets"] for f in flows
               if f["ingress"] == ingress and f["proto"] == PROTO[proto](v6)
               and f["family"] == ("ipv6" if v6 else "ipv4") and (f["sport"], f["dport"]) == (sport, dport))


@pytest.mark.parametrize("name", IDS)
def test_nat_same_bytes(nat_runs, name):
    result, ends = nat_runs[name]
    if isinstance(result, AssertionError):
        raise result
    _, fp = result
    # This flow NATed by XDP in both directions: r0 takes the client's
    # packets (keyed as sent), r1 the server's (keyed as the server sent them).
    _, _, proto = name.split("-")
    c, s = ends.c_ports(), ends.s_ports()
    keys = (("r0", c["sport"], c["dport"]), ("r1", s["sport"], s["dport"]))
    if proto == "icmp":
        # ICMP flow keys: type and code as sport, the echo id as dport.
        req, rep = (128, 129) if ends.v6 else (8, 0)
        keys = (("r0", req << 8, c["sport"]), ("r1", rep << 8, c["sport"]))
    for iface, sport, dport in keys:
        got = flow_packets(fp.flows, iface, proto, ends.v6, sport, dport)
        assert got >= N, f"{iface}: {got} fast-path packets of {name} ({sport} -> {dport}); flows: {fp.flows}"
