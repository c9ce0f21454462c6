"""Bad input to the CLI: one clear line on stderr, exit != 0, nothing attached."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from lab import FASTPATH, Daemon, Lab, sh


def one_line_error(p: subprocess.CompletedProcess) -> str:
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode != 0, f"exit 0 for bad input; stdout={p.stdout!r}"
    assert len(lines) == 1, f"want exactly one line on stderr, got {len(lines)}:\n{p.stderr}"
    return lines[0]


@pytest.fixture(scope="module")
def idle_lab():
    """One lab for the tests of refused starts and of a missing daemon: they
    must leave nothing behind, which each of them asserts."""
    with Lab() as l:
        yield l


def run_in_router(lab: Lab, *args: str, prefix: tuple = ()) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", lab.router, *prefix, str(FASTPATH), "run", *args,
              "--socket", str(lab.tmp / "bad.sock"), check=False, timeout=30)


@pytest.mark.parametrize("args, mentions", [
    (["-i", "nosuch0"], "nosuch0"),
    (["-i", "r0", "-i", "nosuch0"], "nosuch0"),
    (["-i", "r0", "-i", "r0"], "r0"),
    (["-i", "lo"], "lo"),
    (["-i", "r0", "-i", "lo"], "lo"),
    ([], ""),
    (["-i", ""], ""),
])
def test_run_bad_interfaces(idle_lab, fastpath_bin, args, mentions):
    lab = idle_lab
    line = one_line_error(run_in_router(lab, *args))
    assert mentions in line, line
    assert not lab.xdp_attached(), "something stayed attached after a refused start"
    assert not (lab.tmp / "bad.sock").exists(), "socket left behind"


@pytest.mark.parametrize("args, mentions", [
    (["--flow-key", "addresses", "--mode", "stateful"], "--flow-key addresses"),
    (["--datapath", "afxdp", "--mode", "stateful"], "--datapath afxdp"),
])
def test_run_options_that_do_not_go_together(idle_lab, fastpath_bin, args, mentions):
    lab = idle_lab
    line = one_line_error(run_in_router(lab, "-i", "r0", "-i", "r1", *args))
    assert mentions in line, line
    assert not lab.xdp_attached(), "something stayed attached after a refused start"
    assert not (lab.tmp / "bad.sock").exists(), "socket left behind"


def test_run_not_root(idle_lab, fastpath_bin):
    lab = idle_lab
    # the binary must be reachable for an unprivileged user
    d = lab.tmp / "nobody"
    d.mkdir()
    mode = lab.tmp.stat().st_mode
    os.chmod(lab.tmp, 0o755)
    try:
        os.chmod(d, 0o777)
        exe = d / "fastpath"
        shutil.copy(FASTPATH, exe)
        os.chmod(exe, 0o755)
        p = sh("ip", "netns", "exec", lab.router, "setpriv", "--reuid=65534", "--regid=65534",
               "--clear-groups", "--inh-caps=-all", str(exe), "run", "-i", "r0", "-i", "r1",
               "--socket", str(d / "fp.sock"), check=False)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        os.chmod(lab.tmp, mode)
    line = one_line_error(p)
    assert "root" in line.lower() or "permission" in line.lower() or "privile" in line.lower(), line
    assert not lab.xdp_attached()


def test_run_without_btf(idle_lab, fastpath_bin):
    """A kernel without BTF: /sys/kernel/btf hidden under an empty tmpfs in a
    mount namespace of the daemon's own, the rest of the system untouched."""
    lab = idle_lab
    p = sh("ip", "netns", "exec", lab.router, "unshare", "--mount", "--propagation", "private",
           "sh", "-c", 'mount -t tmpfs none /sys/kernel/btf && exec "$@"', "sh",
           str(FASTPATH), "run", "-i", "r0", "-i", "r1", "--socket", str(lab.tmp / "bad.sock"),
           check=False, timeout=30)
    line = one_line_error(p)
    assert "BTF" in line, line
    assert not lab.xdp_attached()
    assert not (lab.tmp / "bad.sock").exists()


@pytest.fixture
def bridge_port(idle_lab):
    """A bridge in the router: a device whose driver has no native XDP."""
    lab = idle_lab
    lab.ip(lab.router, "link", "add", "rbr0", "type", "bridge")
    try:
        lab.ip(lab.router, "link", "set", "rbr0", "up")
        yield "rbr0"
    finally:
        lab.ip(lab.router, "link", "del", "rbr0", check=False)


def test_native_mode_on_a_device_without_native_xdp(idle_lab, fastpath_bin, bridge_port):
    """--xdp-mode native: refused, and r0, attached first, is detached again."""
    lab = idle_lab
    line = one_line_error(run_in_router(lab, "-i", "r0", "-i", bridge_port, "--xdp-mode", "native"))
    assert bridge_port in line and "native XDP" in line, line
    assert not lab.xdp_attached(), "r0 stayed attached after the refused start"
    assert not (lab.tmp / "bad.sock").exists()


def test_auto_mode_falls_back_to_generic_with_a_warning(idle_lab, fastpath_bin, bridge_port):
    lab = idle_lab
    with Daemon(lab, ["r0", bridge_port]) as d:
        modes = {i["name"]: i["xdp_mode"] for i in d.status()["interfaces"]}
        assert modes == {"r0": "native", bridge_port: "generic"}, modes
        warned = [l for l in d.log_text().splitlines() if "WARN" in l and bridge_port in l]
        assert any("generic mode" in l for l in warned), d.log_text()
        # The kernel's own view: XDP_ATTACHED_SKB (2) is generic, DRV (1) native.
        kernel = {n: json.loads(x)["mode"] for n, x in lab.xdp_attached().items()}
        assert kernel == {"r0": 1, bridge_port: 2}, kernel


def test_status_without_daemon(idle_lab, fastpath_bin):
    lab = idle_lab
    for cmd in (["status"], ["status", "--json"], ["routes", "--json"], ["neighbours"]):
        p = sh(str(FASTPATH), *cmd, "--socket", str(lab.tmp / "none.sock"), check=False)
        one_line_error(p)


def test_socket_is_root_only(module_daemon):
    lab, daemon = module_daemon.lab, module_daemon
    mode = lab.tmp.stat().st_mode
    os.chmod(lab.tmp, 0o755)  # only the socket's own permissions may stop an unprivileged user
    try:
        p = sh("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(FASTPATH), "status",
               "--socket", str(daemon.sock), check=False)
    finally:
        os.chmod(lab.tmp, mode)
    one_line_error(p)


def test_second_instance_refused_first_untouched(module_daemon):
    lab, daemon = module_daemon.lab, module_daemon
    before = lab.xdp_attached()
    p = sh("ip", "netns", "exec", lab.router, str(FASTPATH), "run", "-i", "r0", "-i", "r1",
           "--socket", str(lab.tmp / "second.sock"), check=False, timeout=30)
    one_line_error(p)
    assert lab.xdp_attached() == before, "the refused second instance changed the attachment"
    daemon.status()  # first one still answers


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_detaches(lab, fastpath_bin, sig):
    d = Daemon(lab).start()
    assert lab.xdp_attached().keys() == {"r0", "r1"}
    os.kill(d.proc.pid, sig)
    assert d.proc.wait(10) == 0, d.log_text()
    assert not lab.xdp_attached()
    assert not d.sock.exists(), "socket left behind after exit"

