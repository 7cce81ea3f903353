"""The live output page (operators issue, items 6 and 7), in a real browser: Debian's
chromium driven by Playwright, against a real daemon and a real ipykernel.

Screenshots are saved under ``test-artifacts/`` at the repository's root (CI keeps the
folder; look at them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient

from ..integration.daemon import TOKEN, Daemon
from ..timing import seconds

ARTIFACTS = Path(__file__).resolve().parent.parent.parent / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

RUN = r"""
import sys, time
print("<script>window.pwned = 1</script><b>bold?</b>", flush=True)
print("\x1b[31mred text\x1b[0m", flush=True)
print("to stderr", file=sys.stderr, flush=True)
for i in range(1, 101):
    print(f"\rprogress {i}%", end="", flush=True)
    time.sleep(0.01)
print()
for i in range(30):
    print("line", i, flush=True)
    time.sleep(0.1)
"""

TICKS = """
import time
for i in range(400):
    print("tick", i, flush=True)
    time.sleep(0.05)
"""


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("CI installs Debian's chromium (.ci/run)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-background-networking",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        try:
            yield browser
        finally:
            await browser.close()


async def execute(daemon: Daemon, kernel_id: str, code: str) -> str:
    answer = await daemon.fetch(
        f"/api/kernels/{kernel_id}/execute", method="POST", body=json.dumps({"code": code})
    )
    msg_id: str = answer["msg_id"]
    return msg_id


async def open_kernel(page: Any, daemon: Daemon, kernel_id: str) -> None:
    # The daemon's / leads to the page; the token in the URL logs the browser in.
    await page.goto(f"{daemon.url}/?token={TOKEN}")
    assert page.url.startswith(f"{daemon.url}/kernel_gateway_stream/")
    await page.click(f'#kernels a[data-kernel="{kernel_id}"]', timeout=seconds(30) * 1000)
    await page.wait_for_selector("#connection.live", timeout=seconds(30) * 1000)


async def outputs_text(page: Any) -> str:
    text: str = await page.inner_text("#executions")
    return text


async def until(page: Any, check: Callable[[str], bool], what: str, timeout: float = 60) -> str:
    """Poll the outputs' text until ``check`` holds (the page's Content-Security-Policy
    stays on, so no string is evaluated in it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(timeout)
    while True:
        text = await outputs_text(page)
        if check(text):
            return text
        assert loop.time() < deadline, f"the page never showed {what}"
        await asyncio.sleep(0.1)


#: The tests on the module's one daemon (each on a kernel of its own) run on one worker,
#: so that it starts once.
SHARED_DAEMON = pytest.mark.xdist_group("test_live_page-daemon")


@SHARED_DAEMON
async def test_the_page_shows_output_as_it_happens_safely(module_daemon: Daemon) -> None:
    daemon = module_daemon
    ARTIFACTS.mkdir(exist_ok=True)
    kernel_id = await daemon.start_kernel()
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        await open_kernel(page, daemon, kernel_id)
        await execute(daemon, kernel_id, RUN)
        # As it happens: a line is on the page while the execution still runs.
        await until(page, lambda text: "line 3" in text, "line 3")
        assert await page.inner_text(".execution .status") == "running"
        await page.screenshot(path=str(ARTIFACTS / "live-page-running.png"), full_page=True)
        await until(page, lambda text: "line 29" in text, "line 29")
        await page.wait_for_selector(".execution .status.ok", timeout=seconds(30) * 1000)
        text = await outputs_text(page)
        # The progress bar updated in place: its last state, once, no earlier one.
        assert text.count("progress 100%") == 1
        assert "progress 99%" not in text
        # stdout and stderr are told apart; ANSI colours are rendered, not printed.
        assert (await page.inner_text(".out.stderr")).strip() == "to stderr"
        assert await page.inner_text(".out .ansi-fg-1") == "red text"
        assert "[31m" not in await page.inner_text(".execution .outputs")
        # What the kernel printed stayed text: no script ran, no element was made.
        assert "<script>window.pwned = 1</script><b>bold?</b>" in text
        assert await page.evaluate("window.pwned") is None
        assert await page.query_selector("#executions b") is None
        assert await page.query_selector("#executions script") is None
        # The code and the execution count are shown with it.
        assert "time.sleep(0.01)" in await page.inner_text(".execution .code")
        assert await page.inner_text(".execution .count") == "[1]"
        await page.screenshot(path=str(ARTIFACTS / "live-page-done.png"), full_page=True)
        assert not errors, errors


RICH = r"""
import base64
from IPython.display import HTML, Image, display
png = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="
)
display(HTML("<i>rich</i><script>window.htmlPwned = 1</script>"))
display(Image(data=png, format="png"))
1 / 0
"""


@SHARED_DAEMON
async def test_tracebacks_images_and_html_are_shown_safely(module_daemon: Daemon) -> None:
    daemon = module_daemon
    ARTIFACTS.mkdir(exist_ok=True)
    kernel_id = await daemon.start_kernel()
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1200, "height": 900})
        await open_kernel(page, daemon, kernel_id)
        await execute(daemon, kernel_id, RICH)
        await page.wait_for_selector(".execution .status.error", timeout=seconds(60) * 1000)
        # The traceback: its exception, and its frames without raw escape codes.
        error = await page.inner_text(".out.error")
        assert "ZeroDivisionError: division by zero" in error
        assert "1 / 0" in error
        assert "\x1b[" not in error
        assert "[0;31m" not in error
        # The image, as a data URL.
        source = await page.get_attribute(".out img", "src")
        assert source is not None
        assert source.startswith("data:image/png;base64,iVBOR")
        # The HTML, in an iframe sandboxed without scripts: rendered, its script inert.
        frame = await page.query_selector(".out iframe")
        assert frame is not None
        assert await frame.get_attribute("sandbox") == ""
        content = await frame.content_frame()
        assert content is not None
        assert await content.inner_text("i") == "rich"
        assert await page.evaluate("window.htmlPwned") is None
        # A kernel's "error" message (an SSE event named "error") is not a lost connection.
        await asyncio.sleep(1)
        assert await page.inner_text("#connection") == "live"
        await page.screenshot(path=str(ARTIFACTS / "live-page-rich.png"), full_page=True)


async def test_the_page_survives_a_gateway_restart_and_shows_what_it_missed(
    daemon: Daemon,
) -> None:
    """The gateway is killed while a kernel prints and started again: the page says it is
    reconnecting, then shows everything the transcript kept (what it had not received
    too), in order, once, and that the kernel is no longer running here."""
    ARTIFACTS.mkdir(exist_ok=True)
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1200, "height": 900})
        await open_kernel(page, daemon, kernel_id)
        await execute(daemon, kernel_id, TICKS)
        await until(page, lambda text: "tick 20" in text, "tick 20")
        daemon.kill_hard()
        await page.wait_for_selector("#connection.reconnecting", timeout=seconds(30) * 1000)
        seen_before = (await outputs_text(page)).count("tick ")
        daemon.start()
        await daemon.wait_ready()
        transcript = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?limit=10000")
        # Joined before it is cut into lines: print("tick", i) writes its words apart, and
        # ipykernel's flush on its own timer can fall between them ("tick", " 18\n": a
        # fresh clone's run cut that way once).
        kept = "".join(
            record["content"]["text"]
            for record in transcript["records"]
            if record["msg_type"] == "stream"
        ).splitlines()
        # A SIGKILL may cost the transcript the last lines a client already had (what the
        # writer had not committed: see docs/guarantees.md).
        await until(page, lambda text: text.count("tick ") >= len(kept), "the missed lines")
        await page.wait_for_selector("#kernel-state.ended", timeout=seconds(30) * 1000)
        shown = [
            line for line in (await outputs_text(page)).splitlines() if line.startswith("tick ")
        ]
        assert shown == [f"tick {i}" for i in range(len(shown))], "in order, none twice"
        assert shown[: len(kept)] == kept, "every line the transcript kept"
        print(
            f"gateway restart: the page had {seen_before} lines, the transcript kept "
            f"{len(kept)}, the page then showed {len(shown)}"
        )
        await page.screenshot(path=str(ARTIFACTS / "live-page-after-restart.png"), full_page=True)


@SHARED_DAEMON
async def test_an_unauthenticated_visit_is_refused(module_daemon: Daemon) -> None:
    daemon = module_daemon
    client = AsyncHTTPClient()
    for path in ("/kernel_gateway_stream/", "/kernel_gateway_stream/static/live.js"):
        response = await client.fetch(daemon.url + path, follow_redirects=False, raise_error=False)
        assert response.code in (302, 403), (path, response.code)
        if response.code == 302:
            assert "/login" in response.headers["Location"]
    async with chromium() as browser:
        page = await browser.new_page()
        await page.goto(f"{daemon.url}/kernel_gateway_stream/")
        assert await page.query_selector("#kernels") is None
        assert "/login" in page.url
    # With the token it is served, with a policy that keeps the page to its own scripts.
    response = await client.fetch(daemon.url + "/kernel_gateway_stream/", headers=daemon.headers)
    assert response.code == 200
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "default-src 'none'" in policy
    await asyncio.sleep(0)


async def finished(daemon: Daemon, kernel_id: str, msg_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + seconds(60)
    path = f"/api/kernels/{kernel_id}/executions/{msg_id}"
    while (await daemon.fetch(path))["status"] in ("queued", "running"):
        assert asyncio.get_running_loop().time() < deadline, f"{msg_id} did not finish"
        await asyncio.sleep(0.1)


async def shown_outputs(page: Any) -> str:
    """The executions' outputs, without their code."""
    texts: list[str] = await page.eval_on_selector_all(
        ".execution .outputs", "nodes => nodes.map(node => node.innerText)"
    )
    return "\n".join(texts)


# One record each (a stream's prints may be merged by the kernel: display_data never are).
MANY = """
from IPython.display import display
for i in range(6000):
    display({"text/plain": f"early {i}"}, raw=True)
"""
DISPLAYS = """
from IPython.display import display
handle = display("first value", display_id=True)
handle.update("second value")
"""


@SHARED_DAEMON
async def test_earlier_output_on_demand_and_display_updates(module_daemon: Daemon) -> None:
    """A kernel whose transcript is longer than the page replays when it opens (5,000
    records): the earliest lines are not shown until "Show earlier output" is clicked,
    then they are, once and in order before the rest. A display updated by its
    ``display_id`` shows its last value only, also when it is updated from a later cell."""
    daemon = module_daemon
    ARTIFACTS.mkdir(exist_ok=True)
    kernel_id = await daemon.start_kernel()
    await finished(daemon, kernel_id, await execute(daemon, kernel_id, MANY))
    await finished(daemon, kernel_id, await execute(daemon, kernel_id, DISPLAYS))
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        await open_kernel(page, daemon, kernel_id)
        await until(page, lambda text: "second value" in text, "the updated display")
        text = await outputs_text(page)
        assert "first value" not in await shown_outputs(page), "updated in place"
        assert "early 5999" in text
        assert "early 0\n" not in text + "\n", "the page opened on the last records only"
        assert await page.is_visible("#earlier")
        await execute(daemon, kernel_id, "handle.update('third value')")
        deadline = asyncio.get_running_loop().time() + seconds(30)
        while "third value" not in (outputs := await shown_outputs(page)):
            assert asyncio.get_running_loop().time() < deadline, "an update from a later cell"
            await asyncio.sleep(0.1)
        assert "second value" not in outputs

        await page.click("#earlier")
        # The button goes once every page of earlier output is shown (polled from here:
        # the page's Content-Security-Policy refuses evaluated strings).
        deadline = asyncio.get_running_loop().time() + seconds(30)
        while await page.is_visible("#earlier"):
            assert asyncio.get_running_loop().time() < deadline, "the earlier output"
            await asyncio.sleep(0.1)
        earlier = await page.inner_text("#earlier-output")
        # The first part of an execution that goes on below is not shown as running.
        assert await page.inner_text("#earlier-output .status") == "continues below"
        everything = [
            int(line.split()[1])
            for line in (earlier + "\n" + await outputs_text(page)).splitlines()
            if line.startswith("early ")
        ]
        assert everything == list(range(6000)), "every line once, in order"
        await page.screenshot(path=str(ARTIFACTS / "live-page-earlier.png"))
        assert not errors, errors
