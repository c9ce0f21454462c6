"""The config file, `fastpath check-config`, SIGHUP reload and the metrics
endpoint, against a daemon running in the lab's router namespace."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lab import FASTPATH, Daemon, Lab, in_netns, send_and_expect
from pkts import udp4

METRICS = "127.0.0.1:9469"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def check_config(lab: Lab, path: Path) -> subprocess.CompletedProcess:
    return lab.run(lab.router, str(FASTPATH), "check-config", str(path), check=False)


def config_daemon(lab: Lab, path: Path, extra: tuple[str, ...] = ()) -> Daemon:
    """A daemon whose interfaces come from the file (the command line names none)."""
    d = Daemon(lab, extra=["--config", str(path), *extra])
    d.ifaces = []
    return d


def good_config(lab: Lab, **extra: str) -> str:
    lines = ['interface = ["r0", "r1"]', f'socket = "{lab.tmp / "fp.sock"}"']
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def scrape(lab: Lab, addr: str = METRICS) -> str:
    with in_netns(lab.router):
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            return r.read().decode()


def sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in the exposition:\n{text}")


def wait_for(pred, what: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_check_config_good_and_bad_files(lab: Lab, fastpath_bin):
    t = lab.tmp
    good = write(t / "good.toml", good_config(lab, **{"flow-timeout": "10", "allow-netfilter-bypass": "true"}))
    p = check_config(lab, good)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr

    bad = {
        'interface = ["r0"]\nno-such-option = 1\n': r"bad\.toml:2: key `no-such-option`: unknown option",
        'interface = ["r0"]\nflow-timeout = "soon"\n': r"bad\.toml:2: key `flow-timeout`: invalid value 'soon'",
        'flow-timeout = true\n': r"bad\.toml:1: key `flow-timeout`: expected a string or a number",
        # An enum's choices are named on the same line.
        'xdp-mode = "turbo"\n': r"bad\.toml:1: key `xdp-mode`: invalid value 'turbo'.*\[possible values: auto, native, generic\]$",
        # The data path times cached verdicts with a 30-bit clock (struct fp_ct_hot).
        'ct-revalidate-ms = 600001\n': r"bad\.toml:1: key `ct-revalidate-ms`: invalid value '600001'.*0\.\.=600000",
        'ct-icmp-entries = 0\n': r"bad\.toml:1: key `ct-icmp-entries`: invalid value '0'.*1\.\.=1048576",
        'interface = ["r0", "nosuch0"]\n': r"bad\.toml: unknown interface nosuch0",
        # Options that parse one by one but do not go together.
        'interface = ["r0", "r1"]\nmode = "stateful"\nflow-key = "addresses"\n':
            r"bad\.toml: --flow-key addresses works in stateless mode only",
        'interface = ["r0"\n': r"bad\.toml:1: ",
    }
    for text, want in bad.items():
        path = write(t / "bad.toml", text)
        p = check_config(lab, path)
        err = p.stderr.strip()
        assert p.returncode != 0, text
        assert p.stdout.strip() == "", text
        assert len(err.splitlines()) == 1, err
        assert re.search(want, err), f"{text!r}: {err}"

    # A bad file never starts anything.
    p = lab.run(lab.router, str(FASTPATH), "run", "--config", str(t / "bad.toml"), check=False)
    assert p.returncode != 0 and "bad.toml" in p.stderr
    assert not lab.xdp_attached()


def test_daemon_from_config_file_and_check_while_running(lab: Lab, fastpath_bin):
    path = write(lab.tmp / "fastpath.toml", good_config(lab, **{"flow-timeout": "17"}))
    lab.resolve_neighbours()
    with config_daemon(lab, path) as d:
        st = d.status()
        assert [i["name"] for i in st["interfaces"]] == ["r0", "r1"]
        assert st["flow_cache"]["timeout_s"] == 17
        send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(5)], lab.s0)
        # The running daemon's own programs do not make its file invalid.
        p = check_config(lab, path)
        assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    # The command line overrides the file.
    with config_daemon(lab, path, extra=("--flow-timeout", "9")) as d:
        assert d.status()["flow_cache"]["timeout_s"] == 9


def test_sighup_applies_flow_timeout_without_loss_and_rejects_bad_files(lab: Lab, fastpath_bin):
    path = write(lab.tmp / "fastpath.toml", good_config(lab, **{"flow-timeout": "30"}))
    lab.resolve_neighbours()
    with config_daemon(lab, path) as d:
        assert d.status()["flow_cache"]["timeout_s"] == 30
        attached = lab.xdp_attached()
        ping = subprocess.Popen(
            ["ip", "netns", "exec", lab.client, "ping", "-q", "-i", "0.01", "-c", "400", "-W", "1", lab.FAR4],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(0.5)
            write(path, good_config(lab, **{"flow-timeout": "5", "fib4-entries": "4096"}))
            os.kill(d.proc.pid, signal.SIGHUP)
            wait_for(lambda: d.status()["flow_cache"]["timeout_s"] == 5, "flow-timeout 5 after SIGHUP")

            # A bad file is rejected whole: the good key in it is not applied.
            write(path, good_config(lab, **{"flow-timeout": "7", "no-such-option": "1"}))
            os.kill(d.proc.pid, signal.SIGHUP)
            wait_for(lambda: "reload rejected" in d.log_text(), "the rejection in the log")
            assert d.status()["flow_cache"]["timeout_s"] == 5
            out, _ = ping.communicate(timeout=30)
        finally:
            if ping.poll() is None:
                ping.kill()
                ping.wait()
        assert ping.returncode == 0, out
        assert re.search(r"400 packets transmitted, 400 received, 0% packet loss", out), out
        # Interfaces untouched: same programs attached.
        assert lab.xdp_attached() == attached
        log = d.log_text()
        assert re.search(r"reload: flow-timeout 30 -> 5: applied", log), log
        assert re.search(r"reload: fib4-entries \d+ -> 4096: fixed at start, needs a restart", log), log
        assert "no-such-option" in log
        m = scrape(lab)
        assert sample(m, 'fastpath_config_reloads_total{result="ok"}') == 1
        assert sample(m, 'fastpath_config_reloads_total{result="failed"}') == 1


def test_metrics_move_with_traffic_and_listen_on_loopback_only(lab: Lab, fastpath_bin):
    # Before the daemon: a loaded machine already makes ping -W1 marginal.
    lab.resolve_neighbours()
    with Daemon(lab):
        metrics_and_listeners(lab)


def metrics_and_listeners(lab: Lab) -> None:
    fwd = 'fastpath_packets_total{interface="r0",verdict="forwarded",reason="forwarded"}'
    before = scrape(lab)
    send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(20)], lab.s0)
    after = scrape(lab)
    assert sample(after, fwd) - sample(before, fwd) >= 20
    # The flow is among the busiest (--metrics-flows, default 10) with the
    # count `fastpath flows` has for it; the first packet of a new flow
    # misses the cache, so at least 19 of the 20 were forwarded as a hit.
    flow = (f'fastpath_flow_packets{{family="ipv4",proto="17",src="{lab.C4}",sport="40000",'
            f'dst="{lab.FAR4}",dport="9",ingress="r0",egress="r1"}}')
    listed = [f for f in json.loads(lab.daemon.cli("flows", "--json", "--limit", "0").stdout)["flows"]
              if (f["proto"], f["src"], f["sport"], f["dst"], f["dport"]) == (17, lab.C4, 40000, lab.FAR4, 9)]
    assert len(listed) == 1, listed
    assert sample(after, flow) == listed[0]["packets"] >= 19, (listed, after)
    assert "fastpath_flow_bytes" not in after, "stateless entries keep no byte counts"
    assert sample(after, 'fastpath_table_capacity{table="fib4"}') > 0
    assert sample(after, 'fastpath_table_entries{table="fib4"}') >= 1
    assert sample(after, "fastpath_full_sync_age_seconds") >= 0
    assert "fastpath_mirror_lag_max_seconds" in after
    assert "fastpath_netlink_resyncs_total" in after
    assert after.endswith("# EOF\n")
    # The daemon process, as any Prometheus client exports its own, and
    # the same in `fastpath status --json`.
    pid = lab.daemon.proc.pid
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
    assert 0.5 * rss <= sample(after, "process_resident_memory_bytes") <= 2 * rss, (rss, after)
    assert sample(after, "fastpath_daemon_peak_resident_memory_bytes") >= sample(after, "process_resident_memory_bytes")
    assert sample(after, "process_open_fds") == pytest.approx(len(os.listdir(f"/proc/{pid}/fd")), abs=8)
    assert sample(after, "process_cpu_seconds_total") >= 0
    assert time.time() - 3600 < sample(after, "process_start_time_seconds") <= time.time() + 1
    st = json.loads(lab.daemon.cli("status", "--json").stdout)
    assert st["daemon"]["pid"] == pid and st["daemon"]["resident_bytes"] > 0, st["daemon"]
    assert re.search(rf"^daemon: pid {pid}, [\d.]+ MiB resident \(peak [\d.]+ MiB\)", lab.daemon.cli("status").stdout, re.M)

    # A route change shows up as mirror lag.
    lab.ip(lab.router, "route", "add", "203.0.113.128/25", "via", lab.S4)
    wait_for(lambda: sample(scrape(lab), "fastpath_mirror_lag_max_seconds") > 0, "a mirror lag sample")

    listening = lab.run(lab.router, "ss", "-Hltn").stdout
    ports = [l.split()[3] for l in listening.splitlines() if l.split()[3].endswith(":9469")]
    assert ports == [METRICS], listening
    # Not reachable from the client through the router's address.
    with in_netns(lab.client):
        try:
            urllib.request.urlopen(f"http://{lab.R0_4}:9469/metrics", timeout=2)
            raise AssertionError("metrics reachable from the network")
        except urllib.error.URLError:
            pass


def test_metrics_off(lab: Lab, fastpath_bin):
    with Daemon(lab, extra=["--metrics", "off"]):
        listening = lab.run(lab.router, "ss", "-Hltn").stdout
        assert ":9469" not in listening, listening


def test_metrics_flows_zero_exports_no_flow(lab: Lab, fastpath_bin):
    lab.resolve_neighbours()
    with Daemon(lab, extra=["--metrics-flows", "0"]) as d:
        send_and_expect(lab.c0, [udp4(lab, seq=i) for i in range(5)], lab.s0)
        assert json.loads(d.cli("flows", "--json").stdout)["flows"], "the flow is cached"
        text = scrape(lab)
        assert "fastpath_flow_cache_events_total" in text
        assert "fastpath_flow_packets" not in text, text


def test_metrics_flows_out_of_range_is_refused(lab: Lab, fastpath_bin):
    p = lab.run(lab.router, str(FASTPATH), "run", "-i", "r0", "-i", "r1", "--metrics-flows", "1001",
                "--socket", str(lab.tmp / "bad.sock"), check=False)
    assert p.returncode != 0 and "1001" in p.stderr and "--metrics-flows" in p.stderr, p.stderr
    assert not lab.xdp_attached()


def test_sighup_applies_the_stateful_settings(lab: Lab, fastpath_bin):
    """ct-mark and ct-revalidate-ms change live: the data path's runtime
    gets them, the new mark's bits are cleared on every conntrack entry
    and the conntrack generation moves, so no verdict cached under the old
    mark survives."""
    settings = {"mode": '"stateful"', "ct-mark": "0x1", "ct-revalidate-ms": "1000"}
    path = write(lab.tmp / "fastpath.toml", good_config(lab, **settings))
    # The stateful program takes the verifier a while on a busy machine.
    d = config_daemon(lab, path).start()
    ct = d.status()["conntrack"]
    assert (ct["mark"], ct["revalidate_ms"]) == (1, 1000), ct
    # An entry already carrying the new bit: the old ruleset's mark, not a promise under the new one.
    lab.run(lab.router, "conntrack", "-I", "-p", "udp", "-s", lab.C4, "-d", lab.S4, "--sport", "4000",
            "--dport", "4001", "--timeout", "60", "--mark", "0x6")
    write(path, good_config(lab, **{**settings, "ct-mark": "0x2", "ct-revalidate-ms": "250"}))
    os.kill(d.proc.pid, signal.SIGHUP)
    wait_for(lambda: d.status()["conntrack"]["mark"] == 2, "ct-mark 0x2 after SIGHUP")
    now = d.status()["conntrack"]
    assert now["revalidate_ms"] == 250, now
    assert now["generation"] > ct["generation"], (ct, now)
    assert now["marks_cleared"] >= 1, now
    entry = lab.run(lab.router, "conntrack", "-L", "-p", "udp", "--sport", "4000").stdout
    assert "mark=4" in entry, entry
    log = d.log_text()
    assert re.search(r"reload: ct-mark \S+ -> \S+: applied", log), log
    assert re.search(r"reload: ct-revalidate-ms 1000 -> 250: applied", log), log
    assert d.stop() == 0
