"""The README's examples run as written, against a real daemon: the async client example as
a script, and the attach example in bash (its URL and file path pointed at this test's)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from ..timing import seconds
from .daemon import TOKEN, Daemon

README = Path(__file__).parents[2] / "README.md"


def example(heading: str, language: str) -> str:
    """The first ``language`` code block after the README's ``heading``."""
    text = README.read_text()
    start = text.index(heading)
    found = re.compile(rf"```{language}\n(.*?)```", re.DOTALL).search(text, start)
    assert found is not None, heading
    return found.group(1)


async def test_the_async_client_example_runs_as_a_script(daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example("### The Python client", "python"))
    daemon.start()
    await daemon.wait_ready()
    done = subprocess.run(
        [sys.executable, str(script)],
        env=dict(os.environ, KGS_URL=daemon.url, KGS_TOKEN=TOKEN),
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("0\n1\n2\nok 0\n1\n2\n"), done.stdout
    assert await daemon.fetch("/api/kernels") == []


async def test_the_attach_example_runs_as_written(daemon: Daemon, tmp_path: Path) -> None:
    """It read the connection file before the kernel had written it."""
    connection_file = tmp_path / "kernel-outside.json"
    code = example("### Attached by connection info", "bash")
    assert "http://127.0.0.1:8888" in code
    assert "/tmp/kernel-outside.json" in code
    code = code.replace("http://127.0.0.1:8888", daemon.url)
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
