"""Fixtures for every tier: pytest-jupyter's real server (jp_serverapp, jp_fetch, ...)
with the extension enabled, kernels, channels and transcript helpers, and the daemon as a
subprocess. pytest only honours pytest_plugins in the top-level conftest."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

# Imported now, not lazily by hypothesis's pytest plugin at session end: by then a kernel
# start has imported jedi, which raises the recursion limit, and CPython 3.11.7 then fails
# to compile modules imported deep in pytest's stack ("AST constructor recursion depth
# mismatch"), ending the run with a SystemError after every test passed.
import hypothesis  # noqa: F401
import pytest
from jupyter_server.serverapp import ServerApp
from tornado.httpclient import AsyncHTTPClient
from traitlets.config import Config

from kernel_gateway_stream.handlers.common import SETTINGS_KEY, Services

from .integration.daemon import daemon, module_daemon
from .integration.sseclient import SSEReader
from .integration.wsclient import KernelWS
from .leftovers import (
    mark_this_process,
    pytest_sessionfinish,  # noqa: F401
    pytest_terminal_summary,  # noqa: F401
    pytest_testnodedown,  # noqa: F401
    remember_the_temporary_directory,  # noqa: F401
)

mark_this_process()

# Fixtures: the daemon as a subprocess, one per test or one per module
# (tests/integration/daemon.py).
__all__ = ["daemon", "module_daemon"]


@pytest.fixture
def transcript_path(tmp_path: Any) -> str:
    return str(tmp_path / "transcripts.sqlite3")


@pytest.fixture
def jp_server_config(transcript_path: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kernel_gateway_stream": True}},
            "SQLiteTranscriptStore": {"path": transcript_path},
        }
    )


@pytest.fixture
def services(jp_serverapp: Any) -> Services:
    services: Services = jp_serverapp.web_app.settings[SETTINGS_KEY]
    return services


@pytest.fixture
def start_kernel(jp_fetch: Any) -> Any:
    async def start(**body: Any) -> str:
        response = await jp_fetch("api", "kernels", method="POST", body=json.dumps(body))
        kernel_id: str = json.loads(response.body)["id"]
        return kernel_id

    return start


@pytest.fixture
def connect(
    http_server_client: Any, jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str
) -> Any:
    opened: list[KernelWS] = []

    async def open_ws(
        kernel_id: str, headers: dict[str, str] | None = None, **options: Any
    ) -> KernelWS:
        base = jp_base_url.rstrip("/")
        url = f"ws://127.0.0.1:{jp_http_port}{base}/api/kernels/{kernel_id}/channels"
        ws = await KernelWS.open(url, {**jp_auth_header, **(headers or {})}, **options)
        opened.append(ws)
        return ws

    yield open_ws
    for ws in opened:
        ws.close()


@pytest.fixture
def transcript(jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str) -> Any:
    """GET the transcript; a tuple value repeats the parameter (``msg_type=a&msg_type=b``)."""
    client = AsyncHTTPClient()

    async def read(kernel_id: str, **params: Any) -> Any:
        query = urlencode(
            [(k, v) for k, vs in params.items() for v in (vs if isinstance(vs, tuple) else [vs])]
        )
        base = jp_base_url.rstrip("/")
        url = f"http://127.0.0.1:{jp_http_port}{base}/api/kernels/{kernel_id}/transcript"
        response = await client.fetch(f"{url}?{query}", headers=jp_auth_header)
        if params.get("format") == "text":
            return response.body.decode()
        return json.loads(response.body)

    return read


@pytest.fixture
def sse(jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str) -> Any:
    """Open ``GET /api/kernels/{id}/stream`` readers (closed after the test)."""
    readers: list[SSEReader] = []

    def open_stream(kernel_id: str, query: str = "") -> SSEReader:
        base = jp_base_url.rstrip("/")
        url = f"http://127.0.0.1:{jp_http_port}{base}/api/kernels/{kernel_id}/stream{query}"
        reader = SSEReader(url, jp_auth_header)
        readers.append(reader)
        return reader

    yield open_stream
    for reader in readers:
        reader.close()


pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture(autouse=True)
def jp_server_cleanup(jp_asyncio_loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """pytest-jupyter's cleanup of its in-process server, less a second per test with a
    kernel: the sockets still open in its kernel manager's ZMQ context are closed with no
    linger. jupyter_client gives each a linger of 1 s, and the one jupyter_server watches
    a kernel's activity on (an IOPub SUB) had something queued for a kernel gone by then:
    the context's end waited that second out in every such teardown (about 110 s of a
    run's teardowns). What the sockets could still send goes to kernels being shut down.

    The test's kernels are killed, not asked to shut down: the kernel takes 0.15 to 0.7 s to
    exit after its ``shutdown_request`` (one that had not finished its start, seconds), and
    jupyter_client polls for it every 0.1 s. A test that asserts how a kernel shuts down
    does it in its body (``tests/integration/test_shutdown.py``)."""
    yield
    app = ServerApp.instance()
    manager = getattr(app, "kernel_manager", None)
    if manager is not None:
        for socket in list(manager.context._sockets):
            if not socket.closed:
                socket.linger = 0
    try:
        if manager is not None:
            jp_asyncio_loop.run_until_complete(_kill_kernels(manager))
        jp_asyncio_loop.run_until_complete(app._cleanup())
    except (RuntimeError, SystemExit) as error:
        print("ignoring cleanup error", error)
    finally:
        if manager is not None:
            manager.context.destroy(linger=0)
        ServerApp.clear_instance()


async def _kill_kernels(manager: Any) -> None:
    """Kill every kernel of the test's server at once; a kernel that is gone already (one
    whose start failed leaves the list meanwhile) is no error."""
    kernel_ids = list(manager.list_kernel_ids())
    results = await asyncio.gather(
        *(manager.shutdown_kernel(kernel_id, now=True) for kernel_id in kernel_ids),
        return_exceptions=True,
    )
    for kernel_id, result in zip(kernel_ids, results, strict=True):
        if isinstance(result, BaseException) and kernel_id in manager.list_kernel_ids():
            raise result


TESTS = Path(__file__).resolve().parent
#: The tiers whose tests start servers, kernels, browsers or namespaces: every test there
#: is ``slow`` unless it is marked ``smoke``. The rest (the unit tests, the pure core, the
#: package checks) is ``slow`` only where it says so.
SLOW_TIERS = frozenset({"browser", "faults", "integration", "security"})


#: The tests marked ``alone`` (they measure the daemon's memory) run one after another on
#: one worker, beside the other workers' tests: see ``tests/__main__.py``.
ALONE = pytest.mark.xdist_group("alone")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by markers, and xdist by groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        in_slow_tier = len(parts) > 1 and parts[0] in SLOW_TIERS
        if in_slow_tier and item.get_closest_marker("smoke") is None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("alone") is not None:
            item.add_marker(ALONE)


#: Seconds before pytest-timeout's limit at which a test still running prints where each of
#: its asyncio tasks waits: pytest-timeout shows only the threads, and for an async test
#: that is the event loop's ``select``, not the ``await`` that hangs.
TASK_DUMP_LEAD = 20


def _print_tasks(signum: int, frame: Any) -> None:
    loop = asyncio._get_running_loop()
    if loop is None:
        return
    print(f"\n+++ asyncio tasks, {TASK_DUMP_LEAD} s before the timeout +++", file=sys.stderr)
    for task in asyncio.all_tasks(loop):
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("timeout")
    limit = (
        float(marker.args[0])
        if marker and marker.args
        else float(item.config.getini("timeout") or 0)
    )
    timer = None
    if limit > TASK_DUMP_LEAD and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGUSR2, _print_tasks)
        main = threading.main_thread().ident
        assert main is not None
        timer = threading.Timer(limit - TASK_DUMP_LEAD, signal.pthread_kill, (main, signal.SIGUSR2))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
            signal.signal(signal.SIGUSR2, previous)
