# fastpath: the two commands are `make demo` and `make test` (both as root).
# Each installs whatever is missing first (scripts/setup.sh is idempotent).

SHELL := /bin/bash
.DEFAULT_GOAL := build

CARGO   ?= cargo
VENV    := .venv
PYTHON  := $(VENV)/bin/python
BIN     := target/release/fastpath
PYTEST_ARGS ?=
# End-to-end workers (pytest-xdist). The suite mostly waits (sleeps, netlink,
# captures), so two workers halve it on a 2-vCPU box; each test file stays on
# one worker (--dist loadfile) with its module-wide lab and daemon. 0 = serial.
E2E_WORKERS ?= 2

# bindgen (crates/fastpath-bpf/build.rs) loads libclang at build time.
ifneq ($(wildcard /usr/lib/llvm-19/lib),)
export LIBCLANG_PATH ?= /usr/lib/llvm-19/lib
endif
# rustup installs into ~/.cargo/bin, which non-login root shells often lack.
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: setup build build-tests test test-rust test-e2e soak demo bench bench-ipv6 bench-table1 bench-stateful bench-points bench-afxdp clean
# `test` runs its layers in order (setup, build, Rust, end to end), also under make -j.
.NOTPARALLEL:

setup:
	scripts/setup.sh

build:
	$(CARGO) build --release --locked

# The daemon and every Rust test binary in one cargo run. Built apart, the
# test build compiled regex, env_logger and the daemon a second time:
# dev-dependencies (proptest) unify their features with the daemon's only
# when test targets are part of the build. Leaves target/release/fastpath too.
build-tests:
	$(CARGO) build --release --locked --workspace --all-targets

# Every test layer: Rust unit tests, root BPF_PROG_RUN and netlink tests
# (inside cargo test), then the end-to-end suite in network namespaces.
# A failing layer does not hide the others' results; the exit status is non-zero if any failed
# (a test target that does not compile still leaves the daemon for the end-to-end suite).
test: setup
	@rc=0; \
	$(MAKE) --no-print-directory build-tests || { rc=1; $(MAKE) --no-print-directory build || exit 1; }; \
	$(MAKE) --no-print-directory test-rust || rc=1; \
	$(MAKE) --no-print-directory test-e2e || rc=1; \
	exit $$rc

test-rust:
	$(CARGO) test --release --locked --workspace --no-fail-fast

test-e2e:
	$(PYTHON) -m pytest tests -n $(E2E_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Long hardening runs (3-4 minutes on the 2-vCPU dev VM): 100k fuzzed frames kernel vs fastpath
# and kernel vs kernel, 100k route/neighbour changes, 2k FPM route/object
# changes. Not part of `make test`.
soak: setup build
	FASTPATH_SOAK=1 $(PYTHON) -m pytest tests/test_fuzz.py tests/test_churn.py tests/test_fpm.py $(PYTEST_ARGS)

demo: setup build
	$(PYTHON) tests/demo.py

# Forwarding rates, then paper 000's Table 1 (reservation models, ~6 minutes).
bench: setup build
	$(BIN) bench
	$(BIN) bench table1

bench-table1: setup build
	$(BIN) bench table1

# The forwarding bench with IPv6/UDP traffic (84 and 532 B), ~6 minutes.
bench-ipv6: setup build
	$(BIN) bench --family 6 --out bench/out/ipv6

# Stateful firewall bench (issue #4), ~2 minutes: separate from `bench` to keep that one short.
bench-stateful: setup build
	$(BIN) bench stateful

# Execution-point study (issue #6, paper 003), ~3.5 minutes.
bench-points: setup build
	$(BIN) bench points

# AF_XDP forwarding (prefetch on/off) vs the kernel, native XDP and AF_XDP transmit alone (issue #6), ~3.5 minutes.
bench-afxdp: setup build
	$(BIN) bench --modes kernel,fastpath,afxdp,afxdp-noprefetch,afxdp-tx --sizes 64 --flows 1,10000 --no-hints --out bench/out/afxdp

clean:
	$(CARGO) clean
	rm -rf .pytest_cache bench/out
	find tests -name __pycache__ -prune -exec rm -rf {} +
