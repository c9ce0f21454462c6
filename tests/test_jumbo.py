"""Jumbo MTU on the managed ports. The program is loaded as xdp.frags, so
it attaches where a single-buffer program would be refused (veth, and most
NIC drivers, cannot give a frame larger than a page to one); frames that fit
one buffer are forwarded, larger ones arrive in pieces and go to the kernel
(`multi_buffer`), which forwards them. Either way the server gets what the
kernel alone would send."""

from __future__ import annotations

from lab import Lab
from oracle import assert_counts, differential
from pkts import udp4, udp6

MTU = 9000


def test_jumbo_ports_forward_small_and_punt_multi_buffer_frames(lab: Lab, fastpath_bin):
    for i in (lab.c0, lab.r0, lab.r1, lab.s0):
        lab.ip(i.ns, "link", "set", i.name, "mtu", str(MTU))
    # 3000 B fit a veth's one page; 8000 B do not. Every size is sent on
    # to the server by the route via r1 (MTU 9000 too).
    packets = [udp4(lab, dst=lab.S4, size=3000, seq=0), udp4(lab, dst=lab.S4, size=8000, seq=1),
               udp6(lab, dst=lab.S6, size=3000, seq=2), udp6(lab, dst=lab.S6, size=8000, seq=3),
               udp4(lab, dst=lab.S4, size=MTU - 28, seq=4)]
    _, fp = differential(lab, packets)
    assert_counts(fp, "r0", {"forwarded": 2, "multi_buffer": 3})
