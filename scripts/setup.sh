#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 box (run as root): installs only the
# apt packages that are missing, creates .venv with the pinned Python
# requirements, and installs rustup's stable Rust where no cargo is on PATH.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

pkgs=(
	clang-19 llvm-19 libclang-19-dev   # BPF compiler; bindgen needs libclang
	bpftool libelf-dev zlib1g-dev pkg-config build-essential
	nftables conntrack ethtool tcpdump iperf3 iproute2 iputils-ping
	python3-venv curl ca-certificates  # curl: rustup-init where cargo is missing
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
# Debian 12's own cargo (1.63) is too old for the lock file, so a box without
# cargo gets rustup's stable toolchain in ~/.cargo (the Makefile puts its bin
# on PATH). rustup-init comes from static.rust-lang.org, checked against the
# digest published beside it; sh.rustup.rs is only a redirect to that script.
install_rustup() {
	local arch url tmp
	case "$(uname -m)" in
	x86_64) arch=x86_64-unknown-linux-gnu ;;
	aarch64) arch=aarch64-unknown-linux-gnu ;;
	*) say "no rustup build known for $(uname -m); install Rust >= 1.80 by hand" >&2; return 1 ;;
	esac
	url="https://static.rust-lang.org/rustup/dist/$arch/rustup-init"
	tmp="$(mktemp -d)"
	say "installing rustup's stable toolchain from $url"
	if ! curl --proto '=https' --tlsv1.2 -fsS -o "$tmp/rustup-init" "$url" ||
	   ! curl --proto '=https' --tlsv1.2 -fsS -o "$tmp/rustup-init.sha256" "$url.sha256"; then
		say "could not download rustup-init from $url" >&2
		rm -rf "$tmp"; return 1
	fi
	# The published digest names the file by its build path; compare the hex only.
	if [ "$(awk '{print $1}' "$tmp/rustup-init.sha256")" != "$(sha256sum "$tmp/rustup-init" | awk '{print $1}')" ]; then
		say "rustup-init does not match its published sha256; not running it" >&2
		rm -rf "$tmp"; return 1
	fi
	chmod +x "$tmp/rustup-init"
	"$tmp/rustup-init" -y -q --no-modify-path --profile minimal --default-toolchain stable || { rm -rf "$tmp"; return 1; }
	rm -rf "$tmp"
	export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
}
# workspace rust-version is 1.80; edition 2021 crates in the lock need at least that.
cargo_ok() {
	local ver
	command -v cargo >/dev/null 2>&1 || return 1
	ver="$(cargo --version | awk '{print $2}')"
	[ "$(echo "$ver" | cut -d. -f1)" -ge 1 ] && [ "$(echo "$ver" | cut -d. -f2)" -ge 80 ]
}
if ! cargo_ok; then
	if command -v rustup >/dev/null 2>&1; then
		say "cargo $(cargo --version 2>/dev/null | awk '{print $2}') is missing or too old (need >= 1.80); rustup update stable"
		rustup toolchain install stable --profile minimal && rustup default stable || true
	else
		install_rustup || true
	fi
	if ! cargo_ok; then
		say "no cargo >= 1.80 (Debian 12's is 1.63) and rustup could not provide one; install Rust by hand (https://rustup.rs)" >&2
		exit 1
	fi
fi
ver="$(cargo --version | awk '{print $2}')"
say "cargo $ver"

if [ ! -r /sys/kernel/btf/vmlinux ]; then
	say "warning: /sys/kernel/btf/vmlinux missing; fastpath needs a kernel with BTF (CONFIG_DEBUG_INFO_BTF=y)" >&2
fi
say "done"
