#!/usr/bin/env python3
"""`make demo`: the lab, the daemon on the router, some traffic, the counters,
then the kernel-vs-fastpath benchmark; everything torn down at the end."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab import FASTPATH, REPO, Daemon, Lab  # noqa: E402


def banner(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def show(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    print(f"$ {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, text=True, capture_output=True)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    if check and p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {p.returncode}")
    return p


def udp_burst(lab: Lab, n: int) -> None:
    """n UDP datagrams from a real socket in the client to the remote prefix."""
    code = ("import socket,sys\n"
            "for fam, dst in ((socket.AF_INET, sys.argv[1]), (socket.AF_INET6, sys.argv[2])):\n"
            "    s = socket.socket(fam, socket.SOCK_DGRAM)\n"
            f"    for i in range({n}): s.sendto(b'x' * 64, (dst, 9))\n")
    lab.run(lab.client, sys.executable, "-c", code, lab.FAR4, lab.FAR6)
    print(f"sent {n} UDP datagrams to {lab.FAR4}:9 and {n} to [{lab.FAR6}]:9")


def tcp_transfer(lab: Lab) -> None:
    srv = subprocess.Popen(["ip", "netns", "exec", lab.server, "iperf3", "-s", "-1", "-B", lab.FAR4],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # wait until it listens
            if ":5201" in lab.run(lab.server, "ss", "-Hltn").stdout:
                break
            time.sleep(0.05)
        show("ip", "netns", "exec", lab.client, "iperf3", "-c", lab.FAR4, "-t", "2", "-f", "m")
    finally:
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bench-out", metavar="DIR", help="where the benchmark writes forward.json/png (default bench/out)")
    ap.add_argument("--no-rt", action="store_true", help="normal scheduling for the benchmark's generator (a shared box)")
    opts = ap.parse_args()
    if not FASTPATH.exists():
        print(f"{FASTPATH} missing: run `make build` first", file=sys.stderr)
        return 1
    fp = str(FASTPATH)
    with Lab() as lab:
        banner(f"lab: {lab.client} (c0) -- (r0) {lab.router} (r1) -- (s0) {lab.server}")
        show("ip", "-n", lab.router, "-br", "addr")
        banner("the router's routes (the kernel is the source of truth)")
        show("ip", "-n", lab.router, "route")
        show("ip", "-n", lab.router, "-6", "route")

        banner("fastpath run -i r0 -i r1 (in the router namespace)")
        with Daemon(lab) as d:
            print(f"daemon pid {d.proc.pid}, log {d.log}")
            banner("fastpath status, before traffic")
            show(fp, "status", "--socket", str(d.sock))

            banner("traffic: ping v4/v6, a UDP burst, a TCP transfer")
            show("ip", "netns", "exec", lab.client, "ping", "-c3", "-i0.2", lab.FAR4)
            show("ip", "netns", "exec", lab.client, "ping", "-6", "-c3", "-i0.2", lab.FAR6)
            udp_burst(lab, 2000)
            tcp_transfer(lab)

            banner("fastpath status, after traffic")
            show(fp, "status", "--socket", str(d.sock))
            banner("fastpath routes")
            show(fp, "routes", "--socket", str(d.sock))
            banner("fastpath neighbours")
            show(fp, "neighbours", "--socket", str(d.sock))
            banner("stopping the daemon (SIGTERM)")
        print(f"exit code {d.proc.returncode}; XDP still attached: {lab.xdp_attached() or 'none'}")

    banner("benchmark: kernel forwarding vs fastpath (fastpath bench --quick)")
    bench = [fp, "bench", "--quick"] + (["--out", opts.bench_out] if opts.bench_out else []) + \
        (["--no-rt"] if opts.no_rt else [])
    p = subprocess.run(bench, cwd=REPO)
    if p.returncode != 0:
        print(f"fastpath bench --quick exited {p.returncode}", file=sys.stderr)
        return p.returncode
    banner("demo done; every namespace is gone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
