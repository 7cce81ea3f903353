"""A kernel's own stdout and stderr (ipykernel's banner, a crash's last words) go to a
file of its own beside the transcripts, never into the daemon's log."""

from __future__ import annotations

import stat

from .daemon import Daemon
from .waits import wait_until

BANNER = "NOTE: When using the `ipython kernel` entry point"


async def test_kernel_output_goes_to_a_private_file_of_its_own(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    ws = await daemon.channels(kernel_id)
    try:
        # Written by the kernel's process to its file descriptor 2: not IOPub output.
        code = "import os, sys; os.write(sys.__stderr__.fileno(), b'straight to fd 2\\n')"
        received = await ws.until_idle(ws.execute(code))
        assert received.text() == ""
    finally:
        ws.close()
    log = daemon.transcript_path.parent / "kernel-output" / f"{kernel_id}.log"
    await wait_until(lambda: log.exists() and "straight to fd 2" in log.read_text(), "the log")
    assert BANNER in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    daemon.stop()
    text = daemon.log_text()
    assert BANNER not in text
    assert "straight to fd 2" not in text
