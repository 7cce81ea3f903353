"""``kgs`` in a pipeline as users run it: a reader that closes early (``| head -1``) ends
the command quietly with 0, and a file to run that cannot be read is a usage error."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
from pathlib import Path

from kernel_gateway_stream.client import GatewayClient

from ..timing import seconds
from .daemon import TOKEN, Daemon

MANY_LINES = "for i in range(20000): print(i)"


def piped_to_head(*argv: str, url: str) -> tuple[int, str, str]:
    """``kgs ARGV | head -1`` in bash: kgs's own exit status, head's output, kgs's stderr."""
    kgs = shlex.join([sys.executable, "-m", "kernel_gateway_stream.cli", *argv])
    env = dict(os.environ, KGS_URL=url, KGS_TOKEN=TOKEN)
    done = subprocess.run(
        ["bash", "-c", f"{kgs} | head -1; exit ${{PIPESTATUS[0]}}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    return done.returncode, done.stdout, done.stderr


def test_output_to_a_closed_pipe_ends_quietly_with_0(daemon: Daemon) -> None:
    """``export`` in both formats and ``follow`` (which would wait for the kernel's end),
    with far more output than a pipe holds: one line reaches the reader, kgs exits 0 with
    nothing on stderr (it printed a BrokenPipeError, then "aclose(): asynchronous
    generator is already running")."""

    async def execute(kernel_id: str | None, code: str) -> str:
        async with GatewayClient(daemon.url, TOKEN) as client:
            kernel_id = kernel_id or await client.start_kernel()
            result = await client.execute(kernel_id, code, timeout=seconds(120))
            assert result.status == "ok"
            return kernel_id

    daemon.start()
    asyncio.run(daemon.wait_ready())
    kernel_id = asyncio.run(execute(None, MANY_LINES))
    for argv in (("export", kernel_id, "--format", "jsonl"), ("export", kernel_id)):
        code, stdout, stderr = piped_to_head(*argv, url=daemon.url)
        assert stdout.count("\n") == 1, (argv, stdout[:200])
        assert stderr == "", (argv, stderr[-2000:])
        assert code == 0, argv
    # follow, as `| head -1` does it: read a line, close the pipe. Like `tail -f`, kgs
    # learns the reader is gone at its next write: the kernel prints again.
    follow = subprocess.Popen(
        [sys.executable, "-m", "kernel_gateway_stream.cli", "follow", kernel_id, "--since", "0"],
        env=dict(os.environ, KGS_URL=daemon.url, KGS_TOKEN=TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        assert follow.stderr is not None
        assert follow.stdout.readline() == "0\n"
        follow.stdout.close()
        asyncio.run(execute(kernel_id, "print('more')"))
        assert follow.wait(seconds(60)) == 0
        assert follow.stderr.read() == ""
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()


def test_a_file_to_run_that_cannot_be_read_is_a_usage_error(tmp_path: Path) -> None:
    """Exit 2 and one line (it was a FileNotFoundError's traceback and 1, which means an
    error in the code), before any connection: no gateway listens at this URL."""
    for path, why in (
        (tmp_path / "nosuchfile.py", "No such file or directory"),
        (tmp_path, "Is a directory"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "kernel_gateway_stream.cli", "run", str(path)],
            env=dict(os.environ, KGS_URL="http://127.0.0.1:9", KGS_TOKEN=TOKEN),
            capture_output=True,
            text=True,
            timeout=seconds(60),
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr == f"kgs: cannot read {path}: {why}\n"
