#!/usr/bin/env python3
"""Where a loaded XDP program spends its time, by source line.

The VM has no PMU, but perf's cpu-clock (hrtimer) sampling works, and the
kernel keeps, for every JIT'd BPF program, the JIT address of each BTF line
record. This samples one CPU with call chains, takes for each sample the
innermost frame inside a matching program (so the time of the helpers and
kfuncs it called counts at the line that called them), and maps that JIT
offset to the source line. bpftool here is built without libbfd and cannot
dump JIT images, hence the direct bpf(2) calls.

Run it while the program carries traffic, e.g. next to a bench:

    fastpath bench --flows 10000 --modes fastpath --no-hints --reps 12 &
    sleep 5; bench/bpf_profile.py --cpu 0 --seconds 4

(the bench's traffic starts ~3 s in and runs reps x 1.5 s; the samples
outside the program are counted, so a short share means it was not busy).

Needs root and perf. A developer tool; nothing in make test uses it.
"""
import argparse
import bisect
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile

SYS_BPF = 321  # x86-64
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_BTF_GET_FD_BY_ID = 19
PROG_INFO_SIZE = 232  # struct bpf_prog_info up to the fields read here (6.x uapi)

libc = ctypes.CDLL(None, use_errno=True)


def bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(SYS_BPF, cmd, buf, 128)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return r


def obj_info(fd: int, size: int, request: bytes = b"") -> bytes:
    buf = ctypes.create_string_buffer(request.ljust(size, b"\0"), size)
    bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("IIQ", fd, size, ctypes.addressof(buf)))
    return buf.raw


def btf_strings(btf_id: int) -> bytes:
    fd = bpf(BPF_BTF_GET_FD_BY_ID, struct.pack("I", btf_id))
    try:
        size = struct.unpack_from("I", obj_info(fd, 32), 8)[0]
        data = ctypes.create_string_buffer(size)
        obj_info(fd, 32, struct.pack("QI", ctypes.addressof(data), size))
    finally:
        os.close(fd)
    b = data.raw
    hdr_len, _type_off, _type_len, str_off, str_len = struct.unpack_from("IIIII", b, 4)
    return b[hdr_len + str_off : hdr_len + str_off + str_len]


def line_table(prog_id: int) -> tuple:
    """([(jit address, file, line, text)] sorted by address, [(start, end)] of
    each JIT'd function: the main one and every BPF-to-BPF subprogram, which
    the kernel gives symbols of their own (bpf_prog_<their tag>_<name>)."""
    fd = bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("I", prog_id))
    try:
        raw = obj_info(fd, PROG_INFO_SIZE)
        nr_ksyms, = struct.unpack_from("I", raw, 104)
        btf_id, = struct.unpack_from("I", raw, 128)
        nr_line, = struct.unpack_from("I", raw, 148)
        nr_jline, line_rec, jline_rec = struct.unpack_from("III", raw, 168)
        nr_lens, = struct.unpack_from("I", raw, 108)
        if not nr_line or not nr_jline:
            return [], []
        ksyms = ctypes.create_string_buffer(8 * max(nr_ksyms, 1))
        lens = ctypes.create_string_buffer(4 * max(nr_lens, 1))
        lines = ctypes.create_string_buffer(nr_line * line_rec)
        jlines = ctypes.create_string_buffer(nr_jline * jline_rec)
        req = bytearray(PROG_INFO_SIZE)
        struct.pack_into("I", req, 104, nr_ksyms)
        struct.pack_into("I", req, 108, nr_lens)
        struct.pack_into("Q", req, 112, ctypes.addressof(ksyms))
        struct.pack_into("Q", req, 120, ctypes.addressof(lens))
        struct.pack_into("I", req, 148, nr_line)
        struct.pack_into("QQ", req, 152, ctypes.addressof(lines), ctypes.addressof(jlines))
        struct.pack_into("III", req, 168, nr_jline, line_rec, jline_rec)
        obj_info(fd, PROG_INFO_SIZE, bytes(req))
    finally:
        os.close(fd)
    strs = btf_strings(btf_id)

    def s(off: int) -> str:
        return strs[off : strs.index(b"\0", off)].decode(errors="replace")

    funcs = [(struct.unpack_from("Q", ksyms.raw, 8 * i)[0], struct.unpack_from("I", lens.raw, 4 * i)[0])
             for i in range(min(nr_ksyms, nr_lens))]
    out = []
    for i in range(min(nr_line, nr_jline)):
        _insn, file_off, line_off, line_col = struct.unpack_from("IIII", lines.raw, i * line_rec)
        addr, = struct.unpack_from("Q", jlines.raw, i * jline_rec)
        out.append((addr, os.path.basename(s(file_off)), line_col >> 10, s(line_off).strip()))
    return sorted(out), [(start, start + n) for start, n in funcs]


class Programs:
    """The loaded programs whose name starts with a prefix: their functions'
    JIT ranges and one line table (absolute JIT addresses) over them all."""

    def __init__(self, prefix: str):
        listing = json.loads(subprocess.run(["bpftool", "-j", "prog", "show"], check=True,
                                            capture_output=True, text=True).stdout)
        self.ranges, recs = [], []
        for p in listing:
            if p.get("name", "").startswith(prefix[:15]):
                lines, funcs = line_table(p["id"])
                recs += lines
                self.ranges += funcs
        self.recs = sorted(recs)
        self.addrs = [r[0] for r in self.recs]

    def __bool__(self) -> bool:
        return bool(self.recs)

    def owns(self, ip: int) -> bool:
        return any(lo <= ip < hi for lo, hi in self.ranges)

    def line(self, ip: int) -> tuple:
        i = bisect.bisect_right(self.addrs, ip) - 1
        return self.recs[i][1:] if i >= 0 else ("?", 0, "")


def samples(data: str, progs: Programs, self_only: bool = False):
    """The innermost frame in a matching program (its main function or a
    subprogram) of each sample: its address, or None. A caller's frame holds
    a return address, which belongs to the call's line: one byte back.
    self_only: only samples taken in the program's own code, not in what it called."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym"],
                         capture_output=True, text=True).stdout
    for block in out.split("\n\n"):
        hit = None
        for depth, line in enumerate(block.strip().splitlines()):
            parts = line.split()
            if len(parts) < 2 or not parts[1].startswith("bpf_prog_"):
                continue
            ip = int(parts[0], 16)
            if progs.owns(ip):
                if not self_only or depth == 0:
                    hit = ip if depth == 0 else ip - 1
                break
        if block.strip():
            yield hit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prog", default="fp_xdp_fwd", help="program name prefix (default: fp_xdp_fwd)")
    ap.add_argument("--cpu", type=int, default=0, help="CPU to sample (default 0)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--data", help="keep perf's data file here")
    ap.add_argument("--self", dest="self_only", action="store_true",
                    help="only the program's own instructions, not the helpers and kfuncs it called")
    a = ap.parse_args()

    progs = Programs(a.prog)
    if not progs:
        print(f"no loaded program named {a.prog}*", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data or os.path.join(tmp, "perf.data")
        subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-g", "-C", str(a.cpu), "-o", data,
                        "--", "sleep", str(a.seconds)], check=True, stdout=subprocess.DEVNULL)
        total, inside = 0, 0
        by_line = collections.Counter()
        for hit in samples(data, progs, a.self_only):
            total += 1
            if hit is None:
                continue
            inside += 1
            by_line[progs.line(hit)] += 1
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"CPU {a.cpu}, {a.seconds:g} s: {total} samples, {inside} ({100 * inside / total:.1f}%) in {a.prog}* "
          + ("itself" if a.self_only else "or what it called"))
    print(f"{'share':>6} {'samples':>7}  line")
    for (f, ln, text), n in by_line.most_common(a.top):
        print(f"{100 * n / max(inside, 1):5.1f}% {n:7d}  {f}:{ln}  {text[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
