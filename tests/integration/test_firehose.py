"""The firehose benchmark kernel (benchmarks/firehose.py) as a real subprocess.

It is driven here with plain jupyter_client, no gateway: these tests check the kernel
itself, so that a benchmark built on it measures the gateway and not a kernel's bug.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from benchmarks.firehose import install_kernelspec

from ..timing import seconds

WAIT = 30.0  # seconds, for any one message; scaled by KGS_TEST_TIME_SCALE


@contextlib.asynccontextmanager
async def firehose_kernel(
    tmp_path: Path,
) -> AsyncIterator[tuple[AsyncKernelManager, AsyncKernelClient]]:
    """A started firehose kernel and a ready client; both cleaned up however the test ends."""
    name = install_kernelspec(tmp_path)
    manager = AsyncKernelManager(
        kernel_name=name,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")]),
        connection_file=str(tmp_path / f"kernel-{uuid.uuid4()}.json"),
    )
    client: AsyncKernelClient | None = None
    try:
        await manager.start_kernel()
        client = manager.client()
        client.start_channels()
        await client.wait_for_ready(timeout=seconds(WAIT))
        yield manager, client
    finally:
        if client is not None:
            client.stop_channels()
        if await manager.is_alive():
            await manager.shutdown_kernel(now=True)


async def until_idle(client: AsyncKernelClient, msg_id: str) -> list[dict[str, Any]]:
    """The IOPub messages whose parent is ``msg_id``, up to and including its idle status."""
    received: list[dict[str, Any]] = []
    while True:
        msg = await client.get_iopub_msg(timeout=seconds(WAIT))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        received.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return received


async def shell_reply(client: AsyncKernelClient, msg_id: str) -> dict[str, Any]:
    while True:
        msg: dict[str, Any] = await client.get_shell_msg(timeout=seconds(WAIT))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


def stream_texts(messages: list[dict[str, Any]]) -> list[str]:
    streams = [m for m in messages if m["msg_type"] == "stream"]
    assert all(m["content"]["name"] == "stdout" for m in streams)
    return [m["content"]["text"] for m in streams]


def assert_firehose_texts(texts: list[str], count: int, size: int) -> list[float]:
    """Every text is ``"{i} {time} xxx...\\n"`` of ``size`` bytes, i = 0..count-1 in order."""
    assert len(texts) == count
    times: list[float] = []
    for i, text in enumerate(texts):
        assert len(text.encode()) == size
        assert text.endswith("\n")
        index, wall_clock, padding = text[:-1].split(" ")
        assert int(index) == i
        assert set(padding) <= {"x"}
        times.append(float(wall_clock))
    return times


async def run(client: AsyncKernelClient, code: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``: its execute_reply and its IOPub messages up to idle."""
    msg_id = client.execute(code)
    messages = await until_idle(client, msg_id)
    reply = await shell_reply(client, msg_id)
    return reply, messages


def test_install_kernelspec_writes_a_signal_interrupted_spec(tmp_path: Path) -> None:
    assert install_kernelspec(tmp_path) == "firehose"
    spec = json.loads((tmp_path / "kernels" / "firehose" / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    assert Path(spec["argv"][1]).is_absolute()
    assert Path(spec["argv"][1]).name == "firehose.py"
    assert spec["argv"][2:] == ["-f", "{connection_file}"]
    assert spec["interrupt_mode"] == "signal"
    assert spec["language"] == "firehose"


async def test_kernel_info_and_every_stream_message_in_order(tmp_path: Path) -> None:
    async with firehose_kernel(tmp_path) as (_, client):
        msg_id = client.kernel_info()
        reply = await shell_reply(client, msg_id)
        assert reply["msg_type"] == "kernel_info_reply"
        info = reply["content"]
        assert info["status"] == "ok"
        assert info["protocol_version"] == "5.3"
        assert info["implementation"] == "firehose"
        assert info["language_info"]["name"] == "firehose"
        statuses = await until_idle(client, msg_id)
        assert [m["content"]["execution_state"] for m in statuses] == ["busy", "idle"]

        sent = time.time()
        reply, messages = await run(client, "5000 64")
        assert reply["content"]["status"] == "ok"
        assert reply["content"]["execution_count"] == 1
        kinds = [m["msg_type"] for m in messages]
        assert kinds == ["status", "execute_input", *["stream"] * 5000, "status"]
        assert messages[0]["content"]["execution_state"] == "busy"
        assert messages[1]["content"] == {"code": "5000 64", "execution_count": 1}
        times = assert_firehose_texts(stream_texts(messages), 5000, 64)
        assert times == sorted(times)
        assert abs(times[0] - sent) < 60  # the kernel's wall clock, as time.time() here

        reply, messages = await run(client, "10 100")
        assert reply["content"]["execution_count"] == 2
        assert_firehose_texts(stream_texts(messages), 10, 100)


async def test_paced_firehose_keeps_to_its_rate(tmp_path: Path) -> None:
    """200 messages at 1,000/s: message 199 is due 0.199 s after the first. Only the lower
    bound is asserted; a slow machine can only make it take longer."""
    async with firehose_kernel(tmp_path) as (_, client):
        started = time.monotonic()
        reply, messages = await run(client, "200 64 1000")
        elapsed = time.monotonic() - started
        assert reply["content"]["status"] == "ok"
        assert_firehose_texts(stream_texts(messages), 200, 64)
        assert elapsed >= 0.15


@pytest.mark.parametrize("code", ["hello world", "100", "1 2 3 4", "10 8", "-1 64", "10 64 -5"])
async def test_bad_code_is_an_error_and_the_kernel_carries_on(tmp_path: Path, code: str) -> None:
    async with firehose_kernel(tmp_path) as (_, client):
        reply, messages = await run(client, code)
        content = reply["content"]
        assert content["status"] == "error"
        assert content["ename"] == "ValueError"
        assert content["evalue"]
        assert content["traceback"]
        errors = [m for m in messages if m["msg_type"] == "error"]
        assert len(errors) == 1
        assert errors[0]["content"]["ename"] == "ValueError"
        assert messages[-1]["content"]["execution_state"] == "idle"
        assert stream_texts(messages) == []

        reply, messages = await run(client, "3 64")
        assert reply["content"]["status"] == "ok"
        assert_firehose_texts(stream_texts(messages), 3, 64)


@pytest.mark.parametrize("how", ["signal", "message"])
async def test_interrupt_stops_a_running_firehose(tmp_path: Path, how: str) -> None:
    """An interrupted firehose answers as ipykernel answers an interrupted cell: an error
    reply with ``ename`` ``KeyboardInterrupt`` (an ``error`` message on IOPub too), then
    idle. Every message published before the stop is delivered, in order."""
    async with firehose_kernel(tmp_path) as (manager, client):
        msg_id = client.execute("100000000 64")  # about ten minutes at full speed
        messages: list[dict[str, Any]] = []
        while not any(m["msg_type"] == "stream" for m in messages):
            msg = await client.get_iopub_msg(timeout=seconds(WAIT))
            if msg["parent_header"].get("msg_id") == msg_id:
                messages.append(msg)
        if how == "signal":
            await manager.interrupt_kernel()
        else:
            request = client.session.msg("interrupt_request", {})
            client.control_channel.send(request)
            interrupt_reply = await client.get_control_msg(timeout=seconds(WAIT))
            assert interrupt_reply["parent_header"]["msg_id"] == request["header"]["msg_id"]
            assert interrupt_reply["content"]["status"] == "ok"

        reply = await shell_reply(client, msg_id)
        content = reply["content"]
        assert content["status"] == "error"
        assert content["ename"] == "KeyboardInterrupt"
        published = int(content["evalue"].split()[2])  # "interrupted after N of COUNT messages"
        assert 0 < published < 100000000

        messages += await until_idle(client, msg_id)
        assert_firehose_texts(stream_texts(messages), published, 64)
        assert [m["msg_type"] for m in messages[-2:]] == ["error", "status"]
        assert messages[-2]["content"]["ename"] == "KeyboardInterrupt"

        reply, messages = await run(client, "100 64")
        assert reply["content"]["status"] == "ok"
        assert_firehose_texts(stream_texts(messages), 100, 64)


async def test_shutdown_request_ends_the_process_cleanly(tmp_path: Path) -> None:
    """``shutdown_kernel()`` interrupts, then asks over control and waits a few seconds before
    it kills: exit status 0 means the kernel answered and exited on its own."""
    async with firehose_kernel(tmp_path) as (manager, client):
        reply, _ = await run(client, "1000 64")
        assert reply["content"]["status"] == "ok"
        process = manager.provisioner.process  # type: ignore[union-attr]
        await manager.shutdown_kernel()
        assert process.returncode == 0
        assert not await manager.is_alive()
