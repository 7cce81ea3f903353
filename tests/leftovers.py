"""What the suite left running: each pytest process, when its session ends, finds the
processes it started (directly or not) that still run, kills them, and the run's summary
lists them, so that a test or fixture that leaves a kernel, a daemon or a server behind is
named by the next run instead of found by chance afterwards.

A process is "ours" when its environment has :data:`MARK` with this pytest process's pid
(tests/conftest.py sets it when it is imported, and every process started from here
inherits it: daemons, servers, browsers, kernels started with exec), or when its command
line names a path in this process's temporary directory: a kernel a forkserver forked
shows the environment the forkserver was started with, which is not the daemon's, and its
command line names its connection file, in a test's directory. Only what runs once every
fixture has been torn down counts. The list is a report, not a failure: what it names is a
bug to find in the test that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest

from .integration.daemon import other_processes

#: The environment variable every process the suite starts inherits.
MARK = "KGS_TEST_SESSION"
#: Seconds a process that is ending anyway (a kernel told to shut down, a browser closing)
#: has to be gone before it is counted.
GRACE = 5.0


#: This process's temporary directory (pytest's basetemp), with a trailing slash.
_TEMPORARY: list[bytes] = []


def mark_this_process() -> None:
    os.environ[MARK] = str(os.getpid())


@pytest.fixture(scope="session", autouse=True)
def remember_the_temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    _TEMPORARY.append(str(tmp_path_factory.getbasetemp()).encode() + b"/")


def left_running() -> list[tuple[int, str]]:
    """The processes still running that this one started: (pid, command line)."""
    mark = f"{MARK}={os.getpid()}".encode()
    found: list[tuple[int, str]] = []
    for pid, raw in other_processes():
        if not raw:
            continue  # a zombie: it has ended, its parent has not reaped it yet
        if not any(place in raw for place in _TEMPORARY):
            try:
                with open(f"/proc/{pid}/environ", "rb") as environ:
                    if mark not in environ.read().split(b"\0"):
                        continue
            except OSError:
                continue  # ended meanwhile, or not ours to read
        found.append((pid, raw.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def end_leftovers() -> list[str]:
    """Wait :data:`GRACE` for this process's leftovers to end, kill those that did not, and
    describe each."""
    deadline = time.monotonic() + GRACE
    while (found := left_running()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _ in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"{pid} {command[:300]}" for pid, command in found]


#: What this process (the controller, without pytest-xdist: the only one) found.
LEFTOVERS = pytest.StashKey[list[str]]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config: Any = session.config
    if config.pluginmanager.getplugin("dsession") is not None:
        # pytest-xdist's controller: it runs no test, and its workers, which inherited
        # its mark and may still be ending, are not leftovers (each worker looks for its own).
        return
    leftovers = end_leftovers()
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: the controller prints them
        config.workeroutput["leftovers"] = leftovers
    else:
        config.stash.setdefault(LEFTOVERS, []).extend(leftovers)


def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the controller, as each worker ends: what it left running."""
    found = getattr(node, "workeroutput", {}).get("leftovers", [])
    worker = node.gateway.id
    node.config.stash.setdefault(LEFTOVERS, []).extend(f"{worker}: {line}" for line in found)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    leftovers = config.stash.get(LEFTOVERS, [])
    if leftovers:
        terminalreporter.section("processes the tests left running (killed)")
        for line in leftovers:
            terminalreporter.write_line(line)
