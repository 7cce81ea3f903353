"""The Python client and the ``kgs`` CLI against a real gateway and real kernels."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kernel_gateway_stream.client import (
    AuthenticationError,
    GatewayClient,
    KernelDied,
    NotFound,
    SyncGatewayClient,
)

from ..timing import seconds
from .daemon import TOKEN, Daemon
from .waits import until_restarted


class CuttableProxy:
    """A TCP proxy on loopback whose connections can all be cut at once: a network drop."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: list[asyncio.StreamWriter] = []
        self.cuts = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        self.writers += [writer, upstream_writer]
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def cut(self) -> None:
        self.cuts += 1
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    def close(self) -> None:
        self.cut()
        self.server.close()


@pytest.fixture
def gateway(
    http_server_client: Any,
    jp_asyncio_loop: Any,
    jp_http_port: int,
    jp_auth_header: dict[str, str],
    jp_base_url: str,
) -> Iterator[Any]:
    proxy = CuttableProxy(jp_http_port)
    port = jp_asyncio_loop.run_until_complete(proxy.start())
    token = jp_auth_header["Authorization"].split(" ", 1)[1]
    url = f"http://127.0.0.1:{port}{jp_base_url.rstrip('/')}"
    client = GatewayClient(url, token, reconnect_delay=0.05)
    client.proxy = proxy  # type: ignore[attr-defined]
    yield client
    client.close()
    proxy.close()


@pytest.mark.smoke
async def test_execute_with_live_callbacks(gateway: Any) -> None:
    kernel_id = await gateway.start_kernel()
    out: list[str] = []
    err: list[str] = []
    outputs: list[Any] = []
    result = await gateway.execute(
        kernel_id,
        "import sys\nfor i in range(3): print(i)\nprint('e', file=sys.stderr)\n2 + 2",
        on_stdout=out.append,
        on_stderr=err.append,
        on_output=outputs.append,
    )
    assert result.ok
    assert "".join(out) == result.stdout == "0\n1\n2\n"
    assert "".join(err) == "e\n"
    assert [o.data["data"]["text/plain"] for o in outputs] == ["4"]
    assert result.execution_count == 1
    failed = await gateway.execute(kernel_id, "raise ValueError('no')")
    assert failed.status == "error"
    assert failed.error["ename"] == "ValueError"
    assert any(k["id"] == kernel_id for k in await gateway.list_kernels())
    await gateway.shutdown(kernel_id)


async def test_execute_survives_a_network_drop_without_duplicates(gateway: Any) -> None:
    """Cut every connection mid-run: the client resumes from the last event it got and
    the callbacks see every line exactly once."""
    kernel_id = await gateway.start_kernel()
    seen: list[str] = []

    def on_stdout(text: str) -> None:
        seen.append(text)
        if gateway.proxy.cuts == 0 and len("".join(seen).splitlines()) >= 500:
            gateway.proxy.cut()

    code = "import time\nfor i in range(3000):\n    print(i, flush=True)\n    time.sleep(0.0005)"
    result = await gateway.execute(kernel_id, code, on_stdout=on_stdout)
    expected = "".join(f"{i}\n" for i in range(3000))
    assert gateway.proxy.cuts == 1
    assert "".join(seen) == expected
    assert result.ok
    assert result.stdout == expected


async def test_input_callback_answers_the_kernel(gateway: Any) -> None:
    kernel_id = await gateway.start_kernel()
    prompts: list[tuple[str, bool]] = []

    async def answer(prompt: str, password: bool) -> str:
        prompts.append((prompt, password))
        return "agent"

    result = await gateway.execute(kernel_id, "print('hello', input('name? '))", input=answer)
    assert prompts == [("name? ", False)]
    assert result.stdout == "hello agent\n"


async def test_kernel_death_raises_instead_of_hanging(gateway: Any, jp_serverapp: Any) -> None:
    kernel_id = await gateway.start_kernel()
    pid = None

    def kill_on_first_output(text: str) -> None:
        nonlocal pid
        if pid is None:
            pid = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.process.pid
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(KernelDied) as died:
        await asyncio.wait_for(
            gateway.execute(
                kernel_id,
                "import time\nprint('up', flush=True)\ntime.sleep(60)",
                on_stdout=kill_on_first_output,
            ),
            seconds(60),
        )
    assert died.value.result.stdout == "up\n"
    await until_restarted(jp_serverapp.kernel_manager.get_kernel(kernel_id))


async def test_clear_errors_for_bad_token_and_unknown_kernel(gateway: Any) -> None:
    with pytest.raises(NotFound) as unknown:
        await gateway.execute("00000000-0000-0000-0000-000000000000", "1")
    assert unknown.value.reason == "unknown_kernel"
    wrong = GatewayClient(gateway.url, "wrong-token")
    with pytest.raises(AuthenticationError):
        await wrong.start_kernel()
    wrong.close()


def test_sync_client_and_cli_against_the_daemon(daemon: Daemon) -> None:
    """The blocking client, and ``kgs run`` / ``export`` / ``kernels`` as a user runs them."""
    daemon.start()
    asyncio.run(daemon.wait_ready())
    with SyncGatewayClient(daemon.url, TOKEN) as client:
        kernel_id = client.start_kernel()
        lines: list[str] = []
        result = client.execute(kernel_id, "for i in range(5): print(i)", on_stdout=lines.append)
        assert result.ok
        assert "".join(lines) == "0\n1\n2\n3\n4\n"
    env = dict(os.environ, KGS_URL=daemon.url, KGS_TOKEN=TOKEN)

    def kgs(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "kernel_gateway_stream.cli", *argv]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    ran = kgs("run", "-c", "print('from the cli')")
    assert (ran.returncode, ran.stdout) == (0, "from the cli\n")
    failed = kgs("run", "-c", "1/0")
    assert failed.returncode == 1
    assert "ZeroDivisionError" in failed.stderr
    timed_out = kgs("run", "--timeout", "0.5", "-c", "import time; time.sleep(30)")
    assert timed_out.returncode == 130
    kept = kgs("run", "--kernel", kernel_id, "-c", "print('again')")
    assert kept.stdout == "again\n"
    exported = kgs("export", kernel_id)
    assert exported.stdout.endswith("0\n1\n2\n3\n4\nagain\n")
    jsonl = kgs("export", kernel_id, "--format", "jsonl")
    assert len(jsonl.stdout.splitlines()) > 5
    assert kernel_id in kgs("kernels").stdout
    assert kgs("--token", "wrong", "kernels").returncode == 3
    running = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernel_gateway_stream.cli",
            "run",
            "-c",
            "import time\nprint('ready', flush=True)\ntime.sleep(30)",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert running.stdout is not None
    assert running.stdout.readline() == "ready\n"
    running.send_signal(signal.SIGINT)  # Ctrl-C: interrupts the kernel, then exits 130
    assert running.wait(seconds(60)) == 130
    command = [sys.executable, "-m", "kernel_gateway_stream.cli", "follow", kernel_id]
    follower = subprocess.Popen(
        [*command, "--since", "0"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        with SyncGatewayClient(daemon.url, TOKEN) as client:
            client.execute(kernel_id, "print('followed')")
        assert follower.stdout is not None
        lines = [follower.stdout.readline() for _ in range(7)]
        assert lines[-2:] == ["again\n", "followed\n"]
    finally:
        follower.terminate()
        follower.wait(seconds(30))
