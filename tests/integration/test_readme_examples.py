"""The README's and docs/' examples run as written, against a real daemon: the async client
example as a script, the attach example in bash (its URL and file path pointed at this
test's), every `kgs run -c` line, and the execute API's and SSE's curl calls. Every relative
link between those files points at a file and a heading that exist."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..timing import seconds
from .daemon import TOKEN, Daemon

#: The tests on the module's one daemon (each on kernels of its own) run on one worker,
#: so that it starts once.
SHARED_DAEMON = pytest.mark.xdist_group("test_readme_examples-daemon")


async def kernel_ids(daemon: Daemon) -> set[str]:
    """The kernels running on ``daemon`` (the module's: a test compares before and after)."""
    return {kernel["id"] for kernel in await daemon.fetch("/api/kernels")}


ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_URL = "http://127.0.0.1:8888"
CODE_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def example(heading: str, language: str) -> str:
    """The first ``language`` code block after the heading that starts with ``heading``
    (its title, without the #s), in the README or a file of docs/."""
    title = re.compile(rf"^#+ {re.escape(heading)}", re.MULTILINE)
    places = [(path, found) for path in DOCUMENTS if (found := title.search(path.read_text()))]
    assert len(places) == 1, (heading, [str(path) for path, _ in places])
    path, found = places[0]
    block = re.compile(rf"^```{language}\n(.*?)^```", re.DOTALL | re.MULTILINE)
    code = block.search(path.read_text(), found.end())
    assert code is not None, heading
    return code.group(1)


def code_blocks(language: str) -> list[str]:
    """Every ``language`` code block of the README and docs/."""
    return [
        code
        for path in DOCUMENTS
        for found_language, code in CODE_BLOCK.findall(path.read_text())
        if found_language == language
    ]


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = CODE_BLOCK.sub("", path.read_text())
    return {anchor(title) for title in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}


def test_every_link_between_the_readme_and_docs_points_at_a_heading_that_exists() -> None:
    broken = []
    for path in DOCUMENTS:
        text = CODE_BLOCK.sub("", path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists() or (fragment and fragment not in anchors(linked)):
                broken.append(f"{path.name}: {target}")
    assert broken == []


@SHARED_DAEMON
async def test_the_async_client_example_runs_as_a_script(
    module_daemon: Daemon, tmp_path: Path
) -> None:
    daemon = module_daemon
    script = tmp_path / "example.py"
    script.write_text(example("The Python client", "python"))
    before = await kernel_ids(daemon)
    done = subprocess.run(
        [sys.executable, str(script)],
        env=dict(os.environ, KGS_URL=daemon.url, KGS_TOKEN=TOKEN),
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("0\n1\n2\nok 0\n1\n2\n"), done.stdout
    assert await kernel_ids(daemon) == before


@SHARED_DAEMON
async def test_every_kgs_run_line_runs_as_written(module_daemon: Daemon) -> None:
    """Each distinct `kgs run -c` line on a new kernel (a line naming a kernel ID needs one)."""
    daemon = module_daemon
    lines = {
        line.split("#")[0].strip()
        for code in code_blocks("bash")
        for line in code.splitlines()
        if line.startswith("kgs run ") and " -c " in line and " ID" not in line
    }
    assert "kgs run -c \"print('hi')\"" in lines
    before = await kernel_ids(daemon)
    for line in sorted(lines):
        done = subprocess.run(
            ["bash", "-ec", line],
            env=dict(os.environ, KGS_URL=daemon.url, KGS_TOKEN=TOKEN),
            capture_output=True,
            text=True,
            timeout=seconds(60),
        )
        assert done.returncode == 0, (line, done.stderr[-3000:])
        if "print('hi')" in line:
            assert done.stdout == "hi\n", line
    assert await kernel_ids(daemon) == before


@SHARED_DAEMON
async def test_the_execute_and_stream_curl_calls_run_as_written(
    module_daemon: Daemon, tmp_path: Path
) -> None:
    """The SSE example follows the kernel while the execute example runs code on it."""
    daemon = module_daemon
    execute = example("The execute API", "bash").replace(EXAMPLE_URL, "{url}")
    stream = example("`GET /api/kernels/{id}/stream`", "bash").replace(EXAMPLE_URL, "{url}")
    assert "{url}" in execute
    assert "{url}" in stream
    kernel_id = await daemon.start_kernel()
    env = dict(os.environ, JUPYTER_TOKEN=TOKEN, KERNEL=kernel_id)
    streamed = tmp_path / "stream.out"
    with open(streamed, "w") as out:
        follower = subprocess.Popen(
            ["bash", "-ec", stream.replace("{url}", daemon.url)],
            env=env,
            stdout=out,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        done = subprocess.run(
            ["bash", "-ec", execute.replace("{url}", daemon.url)],
            env=env,
            capture_output=True,
            text=True,
            timeout=seconds(60),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        events = done.stdout
        assert events.startswith("event: execution\n"), events
        done_data = re.findall(r"^event: done\ndata: (.*)$", events, re.MULTILINE)
        assert len(done_data) == 1, events
        summary = json.loads(done_data[0])
        assert summary["status"] == "ok", summary
        assert summary["stdout"] == "0\n1\n2\n", summary
        deadline = time.monotonic() + seconds(30)
        while stream_text(streamed.read_text()) != "0\n1\n2\n" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stream_text(streamed.read_text()) == "0\n1\n2\n", streamed.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(follower.pid, signal.SIGKILL)
        follower.wait()


def stream_text(events: str) -> str:
    """The text of the complete `stream` events in an SSE body."""
    found = re.findall(r"^event: stream\ndata: (.*)\n\n", events, re.MULTILINE)
    return "".join(json.loads(data)["content"]["text"] for data in found)


async def test_the_attach_example_runs_as_written(daemon: Daemon, tmp_path: Path) -> None:
    """It read the connection file before the kernel had written it."""
    connection_file = tmp_path / "kernel-outside.json"
    code = example("Attached by connection info", "bash")
    assert EXAMPLE_URL in code
    assert "/tmp/kernel-outside.json" in code
    code = code.replace(EXAMPLE_URL, daemon.url)
    code = code.replace("/tmp/kernel-outside.json", str(connection_file))
    daemon.start()
    await daemon.wait_ready()
    output = tmp_path / "curl.out"
    with open(output, "w") as out, open(tmp_path / "bash.err", "w") as err:
        # The example leaves its kernel running in the background: its session is ended
        # below, with the kernel in it.
        example_run = subprocess.Popen(
            ["bash", "-ec", code],
            env=dict(os.environ, JUPYTER_TOKEN=TOKEN, PYDEVD_DISABLE_FILE_VALIDATION="1"),
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        assert example_run.wait(seconds(60)) == 0, (tmp_path / "bash.err").read_text()
        # The kernel's banner comes first (the example runs it in the background).
        model = json.loads(output.read_text().splitlines()[-1])
        kernels = await daemon.fetch("/api/kernels")
        assert [kernel["id"] for kernel in kernels] == [model["id"]]
        ws = await daemon.channels(model["id"])
        try:
            received = await ws.until_idle(ws.execute("print('attached')"))
            assert received.text() == "attached\n"
        finally:
            ws.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(example_run.pid, signal.SIGKILL)
