"""Fixtures for the end-to-end suite, and the CI rule that a skip is a failure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab import Daemon, Lab, fastpath_usable  # noqa: E402

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if CI and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped tests fail in CI (CI=true): {reason}"


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="end-to-end tests need root (namespaces, XDP)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def lab():
    with Lab() as l:
        yield l


@pytest.fixture
def lab2():
    """The lab with a second router-server link (r2 <-> s1) for route changes."""
    with Lab(second_path=True) as l:
        yield l


@pytest.fixture(scope="session")
def fastpath_bin():
    why = fastpath_usable()
    if why:
        pytest.skip(why)


@pytest.fixture
def daemon(lab, fastpath_bin):
    """fastpath running on the router; on exit: SIGTERM, exit 0, nothing attached."""
    with Daemon(lab) as d:
        yield d


@pytest.fixture(scope="module")
def module_lab():
    """One lab for a whole module whose tests only send traffic and read
    counter deltas (a lab and a daemon start per test cost seconds each)."""
    with Lab() as l:
        yield l


@pytest.fixture(scope="module")
def module_daemon(module_lab, fastpath_bin):
    with Daemon(module_lab) as d:
        yield d


@pytest.fixture(scope="module")
def module_lab2():
    """`module_lab` with the second router-server link (see `lab2`)."""
    with Lab(second_path=True) as l:
        yield l


@pytest.fixture(scope="module")
def module_daemon2(module_lab2, fastpath_bin):
    with Daemon(module_lab2) as d:
        yield d


@pytest.fixture
def daemon2(lab2, fastpath_bin):
    with Daemon(lab2) as d:
        yield d
