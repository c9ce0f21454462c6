#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 box (run as root): installs only the
# apt packages that are missing, creates .venv with the pinned Python
# requirements, and checks that a recent enough cargo is on PATH.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

pkgs=(
	clang-19 llvm-19 libclang-19-dev   # BPF compiler; bindgen needs libclang
	bpftool libelf-dev zlib1g-dev pkg-config build-essential
	nftables conntrack ethtool tcpdump iperf3 iproute2 iputils-ping
	python3-venv
	frr                                # zebra for the FPM route-source test (tests/test_fpm.py)
)

say() { printf 'setup: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
	say "must run as root (installs packages; the tests need namespaces and XDP)" >&2
	exit 1
fi

missing=()
for p in "${pkgs[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	say "installing: ${missing[*]}"
	# clang-19 came to bookworm main with a point release (12.10+); an older
	# mirror snapshot needs `apt-get update` first, which we always do here.
	apt-get update -q
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; then
		say "apt-get install failed; clang-19 needs Debian 12.10 or later package lists" >&2
		exit 1
	fi
else
	say "apt packages present"
fi

py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
	say "creating .venv with $py"
	"$py" -m venv .venv
fi
# pip is quick when everything is already satisfied; the stamp avoids even that.
stamp=.venv/.requirements.stamp
if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp"; then
	say "installing Python requirements into .venv"
	.venv/bin/pip install -q -r requirements.txt
	cp requirements.txt "$stamp"
else
	say "Python requirements present"
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
	export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
	say "cargo not found. Debian 12's cargo is too old; install rustup:" >&2
	say "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y" >&2
	say "  . \"\$HOME/.cargo/env\"" >&2
	exit 1
fi
# workspace rust-version is 1.80; edition 2021 crates in the lock need at least that.
ver="$(cargo --version | awk '{print $2}')"
minor="$(echo "$ver" | cut -d. -f2)"
if [ "$(echo "$ver" | cut -d. -f1)" -lt 1 ] || [ "$minor" -lt 80 ]; then
	say "cargo $ver is too old (need >= 1.80); run: rustup update stable" >&2
	exit 1
fi
say "cargo $ver"

if [ ! -r /sys/kernel/btf/vmlinux ]; then
	say "warning: /sys/kernel/btf/vmlinux missing; fastpath needs a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y)" >&2
fi
say "done"
