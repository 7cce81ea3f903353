"""The daemon's log (operators issue, items 2 and 3): quiet by default, one line per event
worth knowing, JSON when asked, in a file that SIGHUP reopens; no token and no kernel
output in it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from ..timing import seconds
from .daemon import TOKEN, Daemon

#: The one warning a normal run may log: CI runs as root, and running kernels as root is
#: worth a warning.
EXPECTED_WARNINGS = ("Running as root",)


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def until_logged(path: Path, message: str) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(30)
    while True:
        lines = lines_of(path) if path.exists() else []
        if any(message in line["message"] for line in lines):
            return lines
        assert loop.time() < deadline, f"never logged: {message}"
        await asyncio.sleep(0.1)


async def test_a_quiet_structured_log_of_events_without_secrets_or_output(
    daemon: Daemon, tmp_path: Path
) -> None:
    log_file = tmp_path / "gateway.log"
    daemon.start("--GatewayStreamApp.log_json=True", f"--GatewayStreamApp.log_file={log_file}")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    ws = await daemon.channels(kernel_id, session_id="watcher", protocol="v1")
    secret_output = "output-that-stays-out-of-the-log-4711"
    await ws.until_idle(ws.execute(f"print({secret_output!r})"))
    ws.close()
    lines = await until_logged(log_file, "left at seq")
    again = await daemon.channels(kernel_id, session_id="watcher")
    again.close()
    lines = await until_logged(log_file, "resuming after seq")

    connected = [line for line in lines if "connected to kernel" in line["message"]]
    assert connected[0]["kernel_id"] == kernel_id
    assert connected[0]["session_id"] == "watcher"
    assert connected[0]["surface"] == "channels_v1"
    left = next(line for line in lines if "left at seq" in line["message"])
    assert left["reason"] == "client_closed"
    assert left["last_seq"] > 0
    assert any(line["message"].startswith("Transcripts in ") for line in lines)
    assert any(line["message"].startswith("Tapping kernel") for line in lines)
    # Quiet: nothing at WARNING or above is normal operation.
    loud = [
        line
        for line in lines
        if line["level"] in ("WARNING", "ERROR", "CRITICAL")
        and not line["message"].startswith(EXPECTED_WARNINGS)
    ]
    assert not loud, loud
    text = log_file.read_text()
    assert TOKEN not in text
    assert secret_output not in text
    # Standard error has nothing but what precedes the logging setup.
    assert "connected to kernel" not in daemon.log_text()

    # logrotate moves the file and sends SIGHUP: the daemon writes a new one, and lives.
    rotated = tmp_path / "gateway.log.1"
    os.rename(log_file, rotated)
    assert daemon.process is not None
    os.kill(daemon.process.pid, signal.SIGHUP)
    await until_logged(log_file, "Reopened the log file")
    third = await daemon.channels(kernel_id, session_id="third")
    third.close()
    await until_logged(log_file, "Client third of kernel")
    assert daemon.process.poll() is None
    assert "Reopened" not in rotated.read_text()


async def test_a_transcript_begins_with_the_kernels_output_not_a_debugger_warning(
    daemon: Daemon,
) -> None:
    """debugpy prints a "frozen modules" warning on a kernel's stdout at start, now and
    then (Python 3.11+); kernels start with the switch it names, so transcripts do not
    begin with it."""
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    ws = await daemon.channels(kernel_id)
    code = "import os; print(os.environ.get('PYDEVD_DISABLE_FILE_VALIDATION'))"
    received = await ws.until_idle(ws.execute(code))
    ws.close()
    assert received.text() == "1\n"
    page = await daemon.fetch(f"/api/kernels/{kernel_id}/transcript?msg_type=stream")
    assert [r["content"]["text"] for r in page["records"]] == ["1\n"]
