"""JupyterLab with the package installed, in a real browser (Debian's chromium driven by
Playwright), against a real ``jupyter lab`` and real ipykernels: output survives a flood,
a reload, a gateway restart and a dropped connection (issue 10).

The lab server is this package's installed set-up: the server extension is enabled by the
config file ``pip install`` puts in place, and the lab extension is the prebuilt one in
``share/jupyter/labextensions``. Cells are run from the keyboard and read from the page
(``.jp-OutputArea-output``). Screenshots are saved under ``test-artifacts/`` at the
repository's root (CI keeps the folder; look at them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient

from kernel_gateway_stream.core.errors import GatewayStreamError
from kernel_gateway_stream.core.messages import REPLAYED_METADATA_KEY
from kernel_gateway_stream.core.wire import decode_v1

from .. import without_iri
from ..integration.daemon import free_port
from ..timing import seconds
from .test_live_page import ARTIFACTS, CHROMIUM, chromium

TOKEN = "test-token-for-jupyterlab"
LAB_EXTENSION = "kernel-gateway-stream"

FLOOD = "for i in range(20000): print(i, flush=True)"
# 100 lines, one every 0.2 s until the test has done what it does mid-run (reload,
# restart, cut in) and creates the file named ``go``; then the rest at once, so that no
# test waits out 20 s of ticks after its point is made.
TICKS = """\
import os, time
for i in range(100):
    print(f"tick {{i}}", flush=True)
    if not os.path.exists({go!r}):
        time.sleep(0.2)
"""
EXPECTED_TICKS = [f"tick {i}" for i in range(100)]
PROGRESS = """\
import os, time
for i in range(1, 401):
    print(f"\\rprogress {{i}}/400", end="", flush=True)
    if not os.path.exists({go!r}):
        time.sleep(0.05)
print("\\nfinished", flush=True)
"""
QUIET_THEN_DONE = """\
import time
time.sleep(3)
for i in range(5):
    print(f"while away {i}", flush=True)
"""


class Lab:
    """``jupyter lab`` as a subprocess in its own Jupyter directories, serving ``root``."""

    def __init__(self, home: Path, *options: str) -> None:
        self.home = home
        self.options = options
        self.root = home / "notebooks"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = home / "lab.log"
        # The announcements plugin asks, in a toast, whether to fetch news: not under test.
        labconfig = home / "config" / "labconfig"
        labconfig.mkdir(parents=True, exist_ok=True)
        (labconfig / "page_config.json").write_text(
            json.dumps(
                {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
            )
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = dict(
            os.environ,
            JUPYTER_TOKEN=TOKEN,
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
        )
        argv = [
            *without_iri.RUN,  # as our daemon starts (see tests/without_iri.py)
            "jupyterlab",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            "--ip=127.0.0.1",
            "--no-browser",
            "--allow-root",
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *self.options,
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )

    def wait_ready(self) -> None:
        """Until the server answers (blocking: fixtures of any scope use it)."""
        deadline = time.monotonic() + seconds(90)
        request = urllib.request.Request(
            f"{self.url}/api/status", headers={"Authorization": f"token {TOKEN}"}
        )
        while True:
            assert self.process is not None
            assert self.process.poll() is None, self.log_text()
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return
            except (OSError, urllib.error.URLError):
                assert time.monotonic() < deadline, self.log_text()
                time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the server alone: its kernels run on (the gateway re-attaches them)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(seconds(30))
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-20000:]

    def notebook(self, name: str, *sources: str) -> str:
        """Write a notebook of code cells (ids ``cell-0``, ...) on Python 3; its name."""
        cells: list[dict[str, Any]] = [
            {
                "cell_type": "code",
                "id": f"cell-{index}",
                "metadata": {},
                "source": source,
                "outputs": [],
                "execution_count": None,
            }
            for index, source in enumerate(sources)
        ]
        document = {
            "cells": cells,
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (self.root / name).write_text(json.dumps(document))
        return name

    async def api(self, path: str, **kwargs: Any) -> Any:
        response = await AsyncHTTPClient().fetch(
            f"{self.url}{path}", headers={"Authorization": f"token {TOKEN}"}, **kwargs
        )
        return json.loads(response.body) if response.body else None

    async def kernel_of(self, name: str) -> str:
        """The id of the kernel of notebook ``name``'s session."""
        sessions = await self.api("/api/sessions")
        [kernel_id] = [s["kernel"]["id"] for s in sessions if s["path"] == name]
        return str(kernel_id)

    async def shutdown_kernel(self, name: str) -> None:
        kernel_id = await self.kernel_of(name)
        await self.api(f"/api/kernels/{kernel_id}", method="DELETE")


@contextlib.contextmanager
def running_lab(home: Path, *options: str) -> Iterator[Lab]:
    lab = Lab(home, *options)
    lab.start()
    try:
        lab.wait_ready()
        yield lab
    finally:
        lab.stop()


def require_chromium() -> None:
    """Skip (fail in CI) before starting a server for nothing."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("CI installs Debian's chromium (.ci/run)")
        pytest.skip("chromium is not installed (apt-get install chromium)")


#: The cases that share one ``jupyter lab`` run on one worker, so that it starts once (a
#: module-scoped fixture is made once per pytest-xdist worker that uses it).
SHARED_LAB = pytest.mark.xdist_group("jupyterlab")


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One ``jupyter lab`` for the cases that do not restart it (a notebook each)."""
    require_chromium()
    with running_lab(tmp_path_factory.mktemp("lab")) as lab:
        yield lab


class CuttableProxy:
    """A TCP relay between the browser and the lab; :meth:`blip` is a network blip: for a
    moment what either side sends is lost on the way, then every connection drops (each
    side sees its TCP connection reset). What the server sent meanwhile never arrives,
    though the server wrote it to its socket: a resume by what the server believes it
    sent would miss it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.WriteTransport] = set()
        self._dropping = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def blip(self, duration: float) -> None:
        """Lose what is sent for ``duration`` seconds, then drop every connection."""
        self._dropping = True
        await asyncio.sleep(duration)
        self.cut()
        self._dropping = False

    def cut(self) -> None:
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._transports.update([writer.transport, up_writer.transport])
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self._dropping:
                    continue
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._transports.discard(writer.transport)
            writer.transport.abort()


@contextlib.asynccontextmanager
async def lab_page(name: str) -> AsyncIterator[tuple[Any, list[str]]]:
    """A chromium page (and the page errors it reports) for one case."""
    ARTIFACTS.mkdir(exist_ok=True)
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        # What the page asked for and did not get, told when the case fails: a fresh-clone
        # run once found the page unstyled ("Error Loading Theme: Stylesheet failed to
        # load", the server having logged no error) and waited out its 180 s for a kernel
        # indicator that never showed.
        failed: list[str] = []
        page.on(
            "requestfailed",
            lambda request: failed.append(f"{request.method} {request.url}: {request.failure}"),
        )
        page.on(
            "response",
            lambda response: (
                failed.append(f"{response.status} {response.url}")
                if response.status >= 400
                else None
            ),
        )
        try:
            yield page, errors
        except BaseException:
            print(f"requests of the page that failed: {failed}")
            with contextlib.suppress(Exception):
                await page.screenshot(path=str(ARTIFACTS / f"jupyterlab-{name}-failed.png"))
            raise


async def open_notebook(page: Any, base_url: str, name: str) -> None:
    """Open notebook ``name`` (the token in the URL logs the browser in) and wait until
    its kernel is connected and idle. Each notebook has a workspace of its own, so the
    cases sharing a server do not reopen each other's notebooks."""
    workspace = name.removesuffix(".ipynb")
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    await page.goto(f"{base_url}/lab/workspaces/{workspace}/tree/{name}?token={TOKEN}")
    await notebook_shown(page)
    # The indicator reads idle before the notebook has its kernel too, and a cell run then
    # makes JupyterLab start one itself or, failing that, open its "Select Kernel" dialog
    # over the page (seen under load). The kernel's channels socket opens once the session
    # has its kernel.
    await until("the kernel's channels socket", socket_after(sockets, 0))
    await page.wait_for_selector(
        ".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator[data-status='idle']",
        timeout=seconds(60) * 1000,
    )


async def notebook_shown(page: Any) -> None:
    """Until the notebook's cells are on the page, with the lab extension loaded."""
    await page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=seconds(60) * 1000)
    extensions = await page.evaluate(
        "JSON.parse(document.getElementById('jupyter-config-data').textContent)"
        ".federated_extensions.map(e => e.name)"
    )
    assert LAB_EXTENSION in extensions, f"the lab extension is not installed: {extensions}"


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


async def prompt(page: Any, index: int) -> str:
    """The cell's input prompt: ``[ ]:``, ``[*]:`` while it runs, ``[3]:`` after."""
    text: str = await cell(page, index).locator(".jp-InputPrompt").text_content()
    return text.strip()


async def ended(page: Any, index: int) -> bool:
    """Whether the cell's prompt shows an execution count: it ran, and it ended."""
    text = await prompt(page, index)
    return text.startswith("[") and text.endswith("]:") and text[1:-2].isdigit()


async def run_cell(page: Any, index: int) -> None:
    """Run cell ``index`` as a user does: click its editor, Ctrl+Enter. A key pressed
    while the notebook still settles after loading can go nowhere: it is pressed again
    until the cell's prompt shows that it runs (it changes as the request is sent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(30)
    before = await prompt(page, index)
    while True:
        await cell(page, index).locator(".jp-InputArea-editor").click()
        await page.keyboard.press("Control+Enter")
        for _ in range(10):
            if await prompt(page, index) != before:
                return
            await asyncio.sleep(0.2)
        assert loop.time() < deadline, "the cell never started"


async def output_text(page: Any, index: int) -> str:
    """The cell's output as the page shows it (textContent: the notebook may skip the
    layout of cells out of view)."""
    texts: list[str] = (
        await cell(page, index)
        .locator(".jp-OutputArea-output")
        .evaluate_all("nodes => nodes.map(node => node.textContent)")
    )
    return "".join(texts)


async def output_lines(page: Any, index: int) -> list[str]:
    return (await output_text(page, index)).splitlines()


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
    """Poll ``check`` until it returns something true; that value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while True:
        value = await check()
        if value:
            return value
        assert loop.time() < deadline, f"the page never showed {what}"
        await asyncio.sleep(0.2)


def line_shown(page: Any, index: int, line: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return line in await output_lines(page, index)

    return check


def line_count_above(page: Any, index: int, count: int) -> Callable[[], Awaitable[bool]]:
    """Whether the cell shows more than ``count`` lines (it is live past them)."""

    async def check() -> bool:
        return len(await output_lines(page, index)) > count

    return check


def progress_past(page: Any, index: int, step: int) -> Callable[[], Awaitable[bool]]:
    """Whether the cell's bar (updated in place, ``progress i/400``) is at ``step`` or on."""

    async def check() -> bool:
        lines = await output_lines(page, index)
        return (
            bool(lines)
            and lines[-1].startswith("progress ")
            and (int(lines[-1].split()[1].split("/")[0]) >= step)
        )

    return check


def cell_ended(page: Any, index: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await ended(page, index)

    return check


async def toast_shown(page: Any, text: str) -> None:
    """Until JupyterLab's notification toast says ``text``."""
    toast = page.locator(".Toastify__toast", has_text=text)
    await toast.first.wait_for(timeout=seconds(30) * 1000)
    await asyncio.sleep(0.5)  # it slides in: the screenshots show it whole


async def scroll_to_end(page: Any, index: int) -> None:
    """Scroll the cell's last output line into view, for a screenshot of the end."""
    await (
        cell(page, index)
        .locator(".jp-OutputArea-output")
        .last.evaluate("node => node.scrollIntoView({block: 'end'})")
    )
    await asyncio.sleep(0.3)


async def dismiss_connection_error(page: Any) -> None:
    """Close JupyterLab's own "Server Connection Error" dialog, which its requests that
    failed while the server was out of reach opened (for a screenshot of the cell)."""
    for button in await page.locator(".jp-Dialog button", has_text="Close").all():
        await button.click()


def in_order_once(lines: list[str], expected: list[str]) -> None:
    """``lines`` are ``expected``: every line, in order, none twice (say which if not)."""
    repeated = sorted(line for line, count in Counter(lines).items() if count > 1)
    shown = set(lines)
    missing = [line for line in expected if line not in shown]
    assert not repeated, f"shown twice: {repeated[:10]}"
    assert not missing, f"missing: {missing[:10]} ({len(missing)} lines)"
    assert lines == expected, "out of order"


@SHARED_LAB
async def test_a_flood_shows_every_line(shared_lab: Lab) -> None:
    """(a) 20,000 lines as fast as the kernel prints them: all of them, once, in order."""
    name = shared_lab.notebook("flood.ipynb", FLOOD)
    async with lab_page("flood") as (page, errors):
        await open_notebook(page, shared_lab.url, name)
        await run_cell(page, 0)
        await until("the flood's end", cell_ended(page, 0), timeout=180)
        in_order_once(await output_lines(page, 0), [str(i) for i in range(20000)])
        await scroll_to_end(page, 0)
        await page.screenshot(path=str(ARTIFACTS / "jupyterlab-flood.png"))
        assert not errors, errors
    await shared_lab.shutdown_kernel(name)


@SHARED_LAB
async def test_a_reload_mid_run_shows_every_line_and_stays_live(shared_lab: Lab) -> None:
    """(b) The page is reloaded while a cell prints: the cell comes back with what it
    printed meanwhile, shows it runs, and goes on to the end; every line once, in order."""
    go = shared_lab.home / "go-reload"
    name = shared_lab.notebook("reload.ipynb", TICKS.format(go=str(go)))
    async with lab_page("reload") as (page, errors):
        await open_notebook(page, shared_lab.url, name)
        await run_cell(page, 0)
        await until("tick 10", line_shown(page, 0, "tick 10"))
        await page.reload()
        await notebook_shown(page)
        restored = await until("the restored lines", lambda: output_lines(page, 0))
        assert len(restored) < len(EXPECTED_TICKS), "restored while the cell still runs"
        assert await prompt(page, 0) == "[*]:"
        await toast_shown(page, "Restored output of 1 cell from the gateway")
        await page.screenshot(path=str(ARTIFACTS / "jupyterlab-reload-restored.png"))
        await until("a line after the restored ones", line_count_above(page, 0, len(restored)))
        go.touch()
        await until("the end of the run", cell_ended(page, 0), timeout=90)
        lines = await output_lines(page, 0)
        in_order_once(lines, EXPECTED_TICKS)
        print(f"reload: {len(restored)} lines restored, then {len(lines) - len(restored)} live")
        await scroll_to_end(page, 0)
        await page.screenshot(path=str(ARTIFACTS / "jupyterlab-reload-done.png"))
        assert not errors, errors
    await shared_lab.shutdown_kernel(name)


@pytest.mark.timeout(seconds(600))
async def test_a_gateway_restart_mid_run_loses_nothing(
    tmp_path: Path,
) -> None:
    """(c) The lab server (the gateway in it) is killed while a cell prints and started
    again on its port; its kernel runs on, holding what it prints while nobody listens,
    and is re-attached. The page, never reloaded, reconnects and resumes from its last
    seq: every line, in order, none twice, to the end of the run. Nothing is missing from
    the transcript either: the kernel (of the gateway's launcher) publishes again what the
    killed gateway had received but not yet made durable. The numbers the killed gateway
    had reserved and not used are a gap record, which the page tells of."""
    require_chromium()
    # The kernel manager that re-attaches kernels (docs/endpoints.md: under jupyter server it is
    # opted into).
    with running_lab(
        tmp_path,
        "--ServerApp.kernel_manager_class=kernel_gateway_stream.kernels.StreamMappingKernelManager",
        # A batch commits a second after its first line (5 ms by default), so that the kill
        # finds lines the page has shown and the transcript does not yet keep, most times:
        # the kernel must send those again.
        "--SQLiteTranscriptStore.batch_linger=1.0",
    ) as lab:
        go = tmp_path / "go-restart"
        name = lab.notebook("restart.ipynb", TICKS.format(go=str(go)))
        async with lab_page("restart") as (page, errors):
            await open_notebook(page, lab.url, name)
            await run_cell(page, 0)
            await until("tick 15", line_shown(page, 0, "tick 15"))
            kernel_id = await lab.kernel_of(name)
            # The kernel's model, asked for while the server is down: JupyterLab asks once,
            # then 10 to 30 s later; the extension's fetch asks again every second.
            model = f"/api/kernels/{kernel_id}"
            unanswered: list[str] = []
            page.on(
                "requestfailed",
                lambda request: (
                    unanswered.append(request.url)
                    if urllib.parse.urlsplit(request.url).path.endswith(model)
                    else None
                ),
            )
            lab.kill()
            seen_before = len(await output_lines(page, 0))
            # Three asks a second apart, while the server stays down: JupyterLab alone asks
            # a second time 10 to 30 s after the first, a third 20 to 60 s after.
            await until(
                "three asks for the kernel's model",
                lambda: asyncio.sleep(0, len(unanswered) >= 3),
                5,
            )
            lab.start()
            await asyncio.to_thread(lab.wait_ready)
            back = time.monotonic()
            await until("a line after the restart", line_count_above(page, 0, seen_before))
            resumed = time.monotonic() - back
            go.touch()
            await until("the end of the run", cell_ended(page, 0), timeout=180)
            lines = await output_lines(page, 0)
            transcript = await lab.api(f"/api/kernels/{kernel_id}/transcript?limit=10000")
            kept = [
                line
                for record in transcript["records"]
                if record["msg_type"] == "stream"
                for line in record["content"]["text"].splitlines()
                if line.startswith("tick ")
            ]
            gaps = [
                r for r in transcript["records"] if r["msg_type"] == "kernel_gateway_stream_gap"
            ]
            sent_again = [
                r["content"]["text"]
                for r in transcript["records"]
                if r["msg_type"] == "stream" and r["metadata"].get(REPLAYED_METADATA_KEY)
            ]
            assert len(set(lines)) == len(lines), "none twice"
            assert lines == [line for line in EXPECTED_TICKS if line in lines], "in order"
            assert [line for line in kept if line not in lines] == [], "every line kept"
            assert lines[-1] == EXPECTED_TICKS[-1], "live to the end"
            # What the kernel printed while no gateway listened is there: the kernel held
            # it; and what the killed gateway had not made durable: the kernel sent it again.
            assert [line for line in EXPECTED_TICKS if line not in kept] == [], "none lost"
            assert lines == EXPECTED_TICKS, "the page shows every line"
            assert not [g for g in gaps if g["content"]["reason"] == "gateway_restart"], gaps
            # The gap record of the killed gateway's last batch is told.
            await toast_shown(page, "output it had just received may be missing")
            await dismiss_connection_error(page)
            print(
                f"gateway restart: the page had {seen_before} lines, showed a new one "
                f"{resumed:.1f} s after the server answered, then {len(lines)} of "
                f"{len(EXPECTED_TICKS)}; the transcript kept {len(kept)}, {sent_again} of them "
                f"sent again by the kernel, gaps {gaps}; the "
                f"kernel's model was asked for {len(unanswered)} times while it was down"
            )
            await scroll_to_end(page, 0)
            await page.screenshot(path=str(ARTIFACTS / "jupyterlab-gateway-restart.png"))
            assert not errors, errors
        await lab.shutdown_kernel(name)


@SHARED_LAB
async def test_a_dropped_connection_resumes_with_nothing_lost_or_repeated(
    shared_lab: Lab,
) -> None:
    """(d) Two network blips under a running cell (no reload): lines in flight are lost
    on the way, then the connections drop. JupyterLab reconnects, and the extension asks
    the gateway for what came after the last seq it received. Every line once, in order
    (resumed by session alone, the lines lost in flight stay missing)."""
    go = shared_lab.home / "go-dropped"
    name = shared_lab.notebook("dropped.ipynb", TICKS.format(go=str(go)))
    proxy = CuttableProxy(shared_lab.port)
    await proxy.start()
    try:
        async with lab_page("dropped") as (page, errors):
            sockets: list[str] = []
            page.on("websocket", lambda socket: sockets.append(socket.url))
            await open_notebook(page, proxy.url, name)
            await run_cell(page, 0)
            for cut_at in ("tick 15", "tick 40"):
                await until(cut_at, line_shown(page, 0, cut_at))
                before = len(channels(sockets))
                await proxy.blip(1.0)
                await until("a new socket", socket_after(sockets, before))
            go.touch()
            await until("the end of the run", cell_ended(page, 0), timeout=90)
            in_order_once(await output_lines(page, 0), EXPECTED_TICKS)
            opened = channels(sockets)
            assert "since=" not in opened[0], "the first socket starts live"
            assert all("since=" in url for url in opened[1:]), opened
            await dismiss_connection_error(page)
            await scroll_to_end(page, 0)
            await page.screenshot(path=str(ARTIFACTS / "jupyterlab-dropped-connection.png"))
            assert not errors, errors
    finally:
        await proxy.close()
    await shared_lab.shutdown_kernel(name)


def channels(sockets: list[str]) -> list[str]:
    return [url for url in sockets if "/channels" in url]


def socket_after(sockets: list[str], before: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(channels(sockets)) > before

    return check


@SHARED_LAB
async def test_a_progress_bar_is_restored_to_its_last_state(shared_lab: Lab) -> None:
    """(e) A tqdm-style bar (``\r`` and no newline) reloaded mid-run: one line, its
    latest state, updating in place to the end."""
    go = shared_lab.home / "go-progress"
    name = shared_lab.notebook("progress.ipynb", PROGRESS.format(go=str(go)))
    async with lab_page("progress") as (page, errors):
        await open_notebook(page, shared_lab.url, name)
        await run_cell(page, 0)
        await until("progress 40/400", progress_past(page, 0, 40))
        await page.reload()
        await notebook_shown(page)
        restored = await until("the restored bar", lambda: output_lines(page, 0))
        assert len(restored) == 1, restored
        assert restored[0].startswith("progress "), restored
        await toast_shown(page, "Restored output of 1 cell from the gateway")
        await page.screenshot(path=str(ARTIFACTS / "jupyterlab-progress-restored.png"))
        restored_step = int(restored[0].split()[1].split("/")[0])
        await until(
            "the bar live past its restored state", progress_past(page, 0, restored_step + 1)
        )
        go.touch()
        await until("the end of the run", cell_ended(page, 0), timeout=90)
        assert await output_lines(page, 0) == ["progress 400/400", "finished"]
        assert not errors, errors
    await shared_lab.shutdown_kernel(name)


@SHARED_LAB
async def test_output_of_a_cell_that_ended_while_no_page_was_open_appears(
    shared_lab: Lab,
) -> None:
    """(f) A cell is run, its page closed at once; the cell ends with no page open. When
    the notebook is opened again, the cell shows its output and its execution count."""
    name = shared_lab.notebook("away.ipynb", "print('first')", QUIET_THEN_DONE)
    async with lab_page("away-before") as (page, errors):
        await open_notebook(page, shared_lab.url, name)
        await run_cell(page, 0)
        await until("the first cell's end", cell_ended(page, 0))
        await run_cell(page, 1)
        assert not errors, errors
    kernel_id = await shared_lab.kernel_of(name)

    async def finished() -> bool:
        answer = await shared_lab.api(f"/api/kernels/{kernel_id}/cells")
        states = {e["cell_id"]: e["status"] for e in answer["executions"]}
        return states.get("cell-1") == "ok"

    await until("the second cell's end, in the gateway", finished)
    async with lab_page("away-after") as (page, errors):
        await open_notebook(page, shared_lab.url, name)
        await until("the output made while away", line_shown(page, 1, "while away 4"))
        assert await output_lines(page, 1) == [f"while away {i}" for i in range(5)]
        assert await output_lines(page, 0) == ["first"]
        assert await prompt(page, 0) == "[1]:"
        assert await prompt(page, 1) == "[2]:"
        await toast_shown(page, "Restored output of 2 cells from the gateway")
        await page.screenshot(path=str(ARTIFACTS / "jupyterlab-restored-after-away.png"))
        assert not errors, errors
    await shared_lab.shutdown_kernel(name)


# ipywidgets (issue 26): a slider the kernel observes, a button with a callback, an Output
# widget, a cell that moves the slider from the kernel, and a cell that keeps the main shell
# busy for a moment. JupyterLab sends widget comms over a subshell of their own (its
# default with ipykernel 7); ipykernel answers a widget's messages on the shell that last
# published on it, the main shell for a widget a cell made, so a move made while a cell
# runs is handled once it ends, with the gateway as without it.
WIDGETS = (
    """\
import ipywidgets as w
slider = w.IntSlider(value=3, description="s")
seen = w.Label("seen none")
slider.observe(lambda change: setattr(seen, "value", f"seen {change['new']}"), "value")
w.VBox([slider, seen])""",
    """\
clicks = w.Label("clicks 0")
button = w.Button(description="press")
count = [0]
def on_click(_):
    count[0] += 1
    clicks.value = f"clicks {count[0]}"
button.on_click(on_click)
w.HBox([button, clicks])""",
    """\
out = w.Output()
with out:
    print("inside output")
out""",
    "slider.value = 7",
    "import time\ntime.sleep(3)",
)


async def widget_texts(page: Any, index: int, selector: str) -> list[str]:
    """The texts of the widget views matching ``selector`` in cell ``index`` (a slider's
    readout, labels)."""
    texts: list[str] = (
        await cell(page, index)
        .locator(selector)
        .evaluate_all("nodes => nodes.map(node => node.textContent.trim())")
    )
    return texts


def widget_says(page: Any, index: int, selector: str, text: str) -> Callable[[], Awaitable[bool]]:
    """Whether a view matching ``selector`` in cell ``index`` shows ``text``."""

    async def check() -> bool:
        return text in await widget_texts(page, index, selector)

    return check


def widget_shown(page: Any, index: int, selector: str) -> Callable[[], Awaitable[int]]:
    """How many live views matching ``selector`` cell ``index`` shows."""

    async def check() -> int:
        count: int = await cell(page, index).locator(selector).count()
        return count

    return check


async def move_slider_right(page: Any) -> None:
    """Move cell 0's slider one step right from the keyboard, as a user can."""
    handle = cell(page, 0).locator(".widget-slider .noUi-handle").first
    await handle.focus()
    await page.keyboard.press("ArrowRight")


async def output_widget_shown_once(page: Any, index: int) -> None:
    """Cell ``index`` shows one output, the Output widget, and what it captured once,
    inside it (not a second time as the cell's own output)."""
    outputs = cell(page, index).locator(".jp-Cell-outputArea > .jp-OutputArea-child")
    inside = cell(page, index).locator(".widget-output .jp-OutputArea-output")
    assert await outputs.count() == 1
    assert await inside.count() == 1
    assert (await inside.first.text_content() or "").strip() == "inside output"


def comm_subshells(frames: list[str | bytes]) -> set[str]:
    """The subshells named by the ``comm_msg`` frames the page sent."""
    return {subshell for kind, subshell in sent_kinds(frames) if kind == "comm_msg" and subshell}


def sent_kinds(frames: list[str | bytes]) -> list[tuple[str, str | None]]:
    """Each comm or subshell frame the page sent: its msg_type and the subshell it names
    (None: the main shell), to tell what happened when the check fails."""
    kinds: list[tuple[str, str | None]] = []
    for frame in frames:
        text = frame if isinstance(frame, str) else frame.decode("latin-1")
        kind = re.search(r'"msg_type":\s*"((?:comm_\w+)|(?:\w*subshell\w*))"', text)
        if kind is not None:
            subshell = re.search(r'"subshell_id":\s*"([^"]+)"', text)
            kinds.append((kind.group(1), subshell.group(1) if subshell else None))
    return kinds


def frame_message(frame: str | bytes) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """``(channel, header, parent_header)`` of a frame the page sent or received, in either
    of JupyterLab's protocols (JSON text, or binary ``v1``); None if it is not a message."""
    try:
        if isinstance(frame, str):
            message = json.loads(frame)
            return message["channel"], message["header"], message["parent_header"] or {}
        channel, parts = decode_v1(frame)
        return channel, json.loads(parts[0]), json.loads(parts[1] or b"{}")
    except (GatewayStreamError, ValueError, KeyError, IndexError, TypeError):
        return None


def subshell_story(sent: list[str | bytes], received: list[str | bytes]) -> list[str]:
    """For each ``create_subshell_request`` the page sent: the replies it received to it
    (their channel and subshell) and the statuses its parent had on IOPub."""
    requests = []
    for frame in sent:
        message = frame_message(frame)
        if message is not None and message[1].get("msg_type") == "create_subshell_request":
            requests.append(message[1]["msg_id"])
    story = []
    for msg_id in requests:
        heard = []
        for frame in received:
            message = frame_message(frame)
            if message is not None and message[2].get("msg_id") == msg_id:
                channel, header, _ = message
                text = frame if isinstance(frame, str) else frame.decode("latin-1")
                state = re.search(r'"execution_state":\s*"(\w+)"', text)
                subshell = re.search(r'"subshell_id":\s*"([^"]+)"', text)
                heard.append(
                    f"{channel}:{header.get('msg_type')}"
                    + (f":{state.group(1)}" if state else "")
                    + (f":{subshell.group(1)[:8]}" if subshell else "")
                )
        story.append(f"{msg_id[:8]} -> {heard}")
    return story


async def saved_with_outputs(lab: Lab, name: str) -> bool:
    """Whether notebook ``name``'s file holds outputs of its first cell."""
    document = json.loads((lab.root / name).read_text())
    return bool(document["cells"][0]["outputs"])


@SHARED_LAB
@pytest.mark.parametrize("saved", [True, False], ids=["saved", "unsaved"])
async def test_widgets_are_live_before_and_after_a_reload(shared_lab: Lab, saved: bool) -> None:
    """(g) Widgets behave as without the gateway, and come back live after a reload: a
    slider moved from the page and from the kernel, a button's callback, an Output widget,
    comms sent over a subshell, a move made while the main shell is busy handled once it
    is free. Then the page is reloaded, the notebook saved before (its outputs come from
    the file) or not (its file, which JupyterLab never signed, has none: the gateway
    restores them): every widget is a live view again, nothing shows twice, and the page
    and the kernel still move the slider and hear the button."""
    kind = "saved" if saved else "unsaved"
    name = shared_lab.notebook(f"widgets-{kind}.ipynb", *WIDGETS)
    readout, label = ".widget-readout", ".widget-label"
    async with lab_page(f"widgets-{kind}") as (page, errors):
        sent: list[str | bytes] = []
        received: list[str | bytes] = []  # to tell, should the last check fail, whether
        # the page got its subshells' create_subshell_reply

        def watch(ws: Any) -> None:
            ws.on("framesent", lambda frame: sent.append(frame))
            ws.on("framereceived", lambda frame: received.append(frame))

        page.on("websocket", watch)
        await open_notebook(page, shared_lab.url, name)
        for index in range(4):
            await run_cell(page, index)
            await until(f"cell {index}'s end", cell_ended(page, index))
        # From the kernel (cell 3 set 7) to the page, and back through the observer.
        await until("the slider at 7", widget_says(page, 0, readout, "7"))
        await until("the observer's 'seen 7'", widget_says(page, 0, label, "seen 7"))
        await output_widget_shown_once(page, 2)
        # From the page, while the main shell is busy and after.
        await run_cell(page, 4)
        await move_slider_right(page)
        await cell(page, 1).locator(".widget-button").click()
        await until("the observer's 'seen 8'", widget_says(page, 0, label, "seen 8"))
        await until("the callback's 'clicks 1'", widget_says(page, 1, label, "clicks 1"))
        await until("the busy cell's end", cell_ended(page, 4))
        if saved:
            await page.keyboard.press("Control+s")
            await until("the notebook saved", lambda: saved_with_outputs(shared_lab, name))
        await page.reload()
        await notebook_shown(page)
        await until("the slider live again at 8", widget_says(page, 0, readout, "8"), timeout=90)
        await until("the button live again", widget_shown(page, 1, ".widget-button"))
        await until("the Output widget live again", widget_shown(page, 2, ".widget-output"))
        await output_widget_shown_once(page, 2)
        assert await widget_texts(page, 1, label) == ["clicks 1"]
        await page.screenshot(path=str(ARTIFACTS / f"jupyterlab-widgets-{kind}.png"))
        await move_slider_right(page)
        await until("'seen 9' after the reload", widget_says(page, 0, label, "seen 9"))
        await cell(page, 1).locator(".widget-button").click()
        await until("'clicks 2' after the reload", widget_says(page, 1, label, "clicks 2"))
        await run_cell(page, 3)
        await until("the slider moved by the kernel to 7", widget_says(page, 0, readout, "7"))
        # A comm sent before its subshell exists goes to the main shell (JupyterLab creates
        # the subshell as the comm opens, and does not wait): by now they go over one.
        story = subshell_story(sent, received)
        print(f"subshells ({kind}): sent {sent_kinds(sent)}; {story}")
        # Each create_subshell_request had its reply (one in four page loads missed some:
        # the channels' sockets stalled, tests/integration/test_channel_replies.py).
        assert all("create_subshell_reply" in line for line in story), story
        assert comm_subshells(sent), (
            f"no comm over a subshell: sent {sent_kinds(sent)}; "
            f"each create_subshell_request and what the page received to it: "
            f"{subshell_story(sent, received)}"
        )
        assert not errors, errors
    await shared_lab.shutdown_kernel(name)
