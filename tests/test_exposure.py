"""Hardening: what the daemon exposes. The API socket is root's alone, and
nothing listens on the network except (if enabled) a metrics endpoint on
loopback."""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import subprocess

from lab import Daemon, FASTPATH


def listening(lab, pid: int) -> list[dict]:
    """The daemon's listening sockets in its namespace: TCP, UDP, unix, raw."""
    out = lab.run(lab.router, "ss", "-H", "-lnptuxw").stdout
    mine = []
    for line in out.splitlines():
        if not re.search(rf"pid={pid},", line):
            continue
        f = line.split()
        # netid state recv-q send-q local peer process
        mine.append({"netid": f[0], "local": f[4], "line": line})
    return mine


def host_of(local: str) -> str:
    host = local.rsplit(":", 1)[0].strip("[]")
    return host.split("%", 1)[0]


def test_api_socket_is_root_only_and_nothing_else_listens(lab, fastpath_bin):
    # A directory that does not exist yet: the daemon must create it 0700.
    sockdir = lab.tmp / "api"
    d = Daemon(lab)
    d.sock = sockdir / "fastpath.sock"
    with d:
        st = os.stat(d.sock)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        assert (st.st_uid, st.st_gid) == (0, 0), (st.st_uid, st.st_gid)
        dst = os.stat(sockdir)
        assert stat.S_IMODE(dst.st_mode) == 0o700 and dst.st_uid == 0, oct(dst.st_mode)

        # Another user cannot talk to it (even with the socket's own permissions bypassed
        # by a lax directory, connect() needs write on the socket).
        os.chmod(sockdir, 0o755)
        try:
            p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                str(FASTPATH), "status", "--socket", str(d.sock)],
                               capture_output=True, text=True, timeout=10)
        finally:
            os.chmod(sockdir, 0o700)
        assert p.returncode != 0, f"nobody could query the daemon:\n{p.stdout}"

        socks = listening(lab, d.proc.pid)
        unix = [s for s in socks if s["netid"] == "u_str"]
        assert [s["local"] for s in unix] == [str(d.sock)], socks
        for s in socks:
            if s["netid"] == "u_str":
                continue
            # Only the Prometheus endpoint, and only on loopback.
            assert s["netid"] == "tcp", f"unexpected listening socket: {s['line']}"
            assert ipaddress.ip_address(host_of(s["local"])).is_loopback, \
                f"listens beyond loopback: {s['line']}"
