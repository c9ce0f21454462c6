"""tc policy and the fast path: XDP runs before tc ingress and a redirect
skips the egress qdisc. So what arrives on a port with tc ingress filters or
tcx programs, and what would leave by a port with a shaping/classifying
qdisc, egress filters or tcx programs, goes to the kernel (`tc_ingress`,
`tc_egress`), at start and as soon as such policy appears; the other
direction stays fast. Queueing-only qdiscs are no policy; --allow-tc-bypass
forwards past it all."""

from __future__ import annotations

import subprocess
import sys

from lab import FASTPATH, Daemon, Lab, ipv4_problems as problems, ping_deltas as pings, wait_for


def tc(lab: Lab, *args: str) -> None:
    lab.run(lab.router, "tc", *args)


def warm(lab: Lab, daemon: Daemon) -> None:
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    out, back = pings(lab, daemon)
    assert out.get("forwarded", 0) >= 5 and back.get("forwarded", 0) >= 5, (out, back)


def test_shaping_qdisc_keeps_only_its_egress_with_the_kernel(lab, daemon):
    warm(lab, daemon)  # and the flows are in the cache now
    tc(lab, "qdisc", "add", "dev", "r1", "root", "handle", "1:", "htb")
    wait_for("the tc mark", lambda: "tc policy on r1 (qdisc htb (root))" in problems(daemon), 5)
    out, back = pings(lab, daemon)
    # Requests would leave by r1: the kernel sends them through htb.
    assert out.get("forwarded", 0) == 0 and out.get("tc_egress", 0) >= 5, out
    # Replies arrive on r1 and leave by r0: still the fast path's.
    assert back.get("forwarded", 0) >= 5, back
    st = daemon.status()["families"]
    assert st["ipv4"]["fast_path"] and st["ipv6"]["fast_path"], "a port's policy is no family punt"

    tc(lab, "qdisc", "del", "dev", "r1", "root")
    wait_for("the mark gone", lambda: "tc policy" not in problems(daemon), 5)
    out, _ = pings(lab, daemon)
    assert out.get("forwarded", 0) >= 5, out


def test_ingress_filter_keeps_that_ports_arrivals_with_the_kernel(lab, daemon):
    warm(lab, daemon)
    tc(lab, "qdisc", "add", "dev", "r0", "clsact")
    # A classifier that only classifies: the kernel still forwards.
    tc(lab, "filter", "add", "dev", "r0", "ingress", "u32", "match", "u32", "0", "0", "classid", "1:1")
    wait_for("the tc mark", lambda: "tc policy on r0 (tc ingress filters)" in problems(daemon), 5)
    out, back = pings(lab, daemon)
    assert out.get("forwarded", 0) == 0 and out.get("tc_ingress", 0) >= 5, out
    assert back.get("forwarded", 0) >= 5, back


# Loads a two-instruction tc program (return TCX_NEXT), attaches it to
# argv[1] by tcx (a bpf link, no qdisc), says so, and holds the link until
# its stdin closes; exiting detaches it.
TCX_ATTACH = r"""
import ctypes, struct, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(321, cmd, buf, 128)
    if r < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd})")
    return r
insns = ctypes.create_string_buffer(bytes.fromhex("b7000000ffffffff") + bytes.fromhex("9500000000000000"))
lic = ctypes.create_string_buffer(b"GPL")
prog = bpf(5, struct.pack("IIQQ", 3, 2, ctypes.addressof(insns), ctypes.addressof(lic)))  # BPF_PROG_LOAD, SCHED_CLS
link = bpf(28, struct.pack("III", prog, socket.if_nametoindex(sys.argv[1]), 46))  # BPF_LINK_CREATE, BPF_TCX_INGRESS
print("attached", flush=True)
sys.stdin.read()
"""


def test_tcx_program_keeps_that_ports_arrivals_with_the_kernel(lab, daemon):
    warm(lab, daemon)
    p = subprocess.Popen(["ip", "netns", "exec", lab.router, sys.executable, "-c", TCX_ATTACH, "r0"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "attached"
        # tcx links send no tc event: the periodic probe finds them.
        wait_for("the tc mark", lambda: "tc policy on r0 (1 tcx ingress program(s))" in problems(daemon), 5)
        out, _ = pings(lab, daemon)
        assert out.get("forwarded", 0) == 0 and out.get("tc_ingress", 0) >= 5, out
    finally:
        p.stdin.close()
        p.wait(timeout=10)
    wait_for("the mark gone", lambda: "tc policy" not in problems(daemon), 5)


def test_policy_present_at_start_and_the_override(lab, fastpath_bin):
    tc(lab, "qdisc", "add", "dev", "r1", "root", "handle", "1:", "htb")
    with Daemon(lab) as d:
        lab.resolve_neighbours()
        d.wait_neighbours_mirrored()
        warm_out, _ = pings(lab, d)
        assert warm_out.get("tc_egress", 0) >= 5 and warm_out.get("forwarded", 0) == 0, warm_out
        assert "left to the kernel" in d.log_text()
    with Daemon(lab, extra=["--allow-tc-bypass"]) as d:
        warm(lab, d)
        assert "tc policy bypassed" in d.log_text()


def test_queueing_only_qdisc_is_no_policy(lab, fastpath_bin):
    tc(lab, "qdisc", "replace", "dev", "r1", "root", "pfifo", "limit", "100")
    with Daemon(lab) as d:
        warm(lab, d)
        assert "tc policy" not in problems(d)


def test_run_refuses_when_it_cannot_check(lab, fastpath_bin):
    """No tc binary on PATH: no evidence of no policy, so refuse (fail closed)."""
    p = lab.run(lab.router, "env", "PATH=/nonexistent", str(FASTPATH), "run", "-i", "r0", "-i", "r1",
                "--allow-netfilter-bypass", "--socket", str(lab.tmp / "bad.sock"), check=False)
    # (Above it, the warning that the netfilter check was waived.)
    assert p.returncode != 0
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("fastpath: cannot run tc") and "--allow-tc-bypass" in line, p.stderr
    assert not lab.xdp_attached()
