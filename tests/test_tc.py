"""tc policy and the fast path: XDP runs before tc ingress and a redirect
skips the egress qdisc, so fastpath refuses to start while a managed port
carries a shaping/classifying qdisc or tc filters, punts everything while
such policy appears at run time, and bypasses it only when told to
(--allow-tc-bypass). Queueing-only qdiscs are no policy."""

from __future__ import annotations

from lab import Daemon, Lab, counter_delta, wait_for
from test_cli import one_line_error, run_in_router


def tc(lab: Lab, *args: str) -> None:
    lab.run(lab.router, "tc", *args)


def ping_deltas(lab: Lab, daemon: Daemon, fam: str = "-4", dst: str = Lab.S4) -> dict:
    before = daemon.counters("r0")
    lab.run(lab.client, "ping", fam, "-c5", "-i0.01", "-W2", "-q", dst)
    return counter_delta(before, daemon.counters("r0"))


def fast(daemon: Daemon) -> tuple[bool, bool]:
    f = daemon.status()["families"]
    return f["ipv4"]["fast_path"], f["ipv6"]["fast_path"]


def test_run_refuses_a_shaping_qdisc(lab, fastpath_bin):
    tc(lab, "qdisc", "add", "dev", "r1", "root", "handle", "1:", "htb")
    line = one_line_error(run_in_router(lab, "-i", "r0", "-i", "r1"))
    assert "r1: qdisc htb (root)" in line and "--allow-tc-bypass" in line, line
    assert not lab.xdp_attached()


def test_tc_bypass_allowed_explicitly(lab, fastpath_bin):
    tc(lab, "qdisc", "add", "dev", "r1", "root", "handle", "1:", "htb")
    with Daemon(lab, extra=["--allow-tc-bypass"]) as d:
        assert fast(d) == (True, True)
        assert "tc policy bypassed" in d.log_text()


def test_queueing_only_qdisc_is_no_policy(lab, fastpath_bin):
    tc(lab, "qdisc", "replace", "dev", "r1", "root", "pfifo", "limit", "100")
    with Daemon(lab) as d:
        assert fast(d) == (True, True)


def test_filter_added_while_running_punts_everything(lab, daemon):
    lab.resolve_neighbours()
    daemon.wait_neighbours_mirrored()
    assert ping_deltas(lab, daemon).get("forwarded", 0) >= 5

    tc(lab, "qdisc", "add", "dev", "r0", "clsact")
    # A classifier that only classifies: the kernel still forwards, so the
    # pings must get through, all of them by the kernel.
    tc(lab, "filter", "add", "dev", "r0", "ingress", "u32", "match", "u32", "0", "0", "classid", "1:1")
    wait_for("both families punted", lambda: fast(daemon) == (False, False), 5)
    d = ping_deltas(lab, daemon)
    assert d.get("forwarded", 0) == 0 and d.get("policy_routing", 0) >= 5, d
    assert "r0: tc ingress filters" in " ".join(daemon.status()["families"]["ipv6"]["problems"])

    tc(lab, "qdisc", "del", "dev", "r0", "clsact")
    wait_for("fast again", lambda: fast(daemon) == (True, True), 5)
    assert ping_deltas(lab, daemon).get("forwarded", 0) >= 5



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


def test_tcx_program_added_while_running_punts_everything(lab, daemon):
    import subprocess
    import sys

    p = subprocess.Popen(["ip", "netns", "exec", lab.router, sys.executable, "-c", TCX_ATTACH, "r0"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "attached"
        wait_for("both families punted", lambda: fast(daemon) == (False, False), 5)
        assert "r0: 1 tcx ingress program(s)" in " ".join(daemon.status()["families"]["ipv4"]["problems"])
    finally:
        p.stdin.close()
        p.wait(timeout=10)
    wait_for("fast again", lambda: fast(daemon) == (True, True), 5)
