"""The blocking client against the daemon, from a thread whose event loop is running (as
in a Jupyter notebook): it has no loop of its own to collide with."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kernel_gateway_stream.client import GatewayHTTPError, NotFound, SyncGatewayClient

from .daemon import TOKEN, Daemon

#: The tests on the module's one daemon (each on a kernel of its own) run on one worker,
#: so that it starts once.
pytestmark = pytest.mark.xdist_group("test_client_sync-daemon")


async def test_sync_client_inside_a_running_event_loop(module_daemon: Daemon) -> None:
    daemon = module_daemon
    asyncio.get_running_loop()  # this thread's loop runs: the old client could not run here
    with SyncGatewayClient(daemon.url, TOKEN) as client:
        kernel_id = client.start_kernel()
        lines: list[str] = []
        asked: list[str] = []

        def answer(prompt: str, password: bool) -> str:
            asked.append(prompt)
            return "sync"

        result = client.execute(
            kernel_id,
            "for i in range(3): print(i)\nprint('hi', input('who? '))",
            on_stdout=lines.append,
            input=answer,
        )
        assert result.ok
        assert "".join(lines) == "0\n1\n2\nhi sync\n"
        assert asked == ["who? "]

        # execution_events: a finished execution's events, done last.
        events = list(client.execution_events(kernel_id, result.msg_id))
        assert events[-1].event == "done"
        assert events[-1].data["status"] == "ok"
        assert "".join(e.data["text"] for e in events if e.event == "stdout") == result.stdout

        # stream: the kernel's IOPub from the start; leaving it early closes it.
        texts = []
        for event in client.stream(kernel_id, 0, msg_types=["stream"]):
            if event.data["content"]["name"] == "stdout":  # the kernel may warn on stderr
                texts.append(event.data["content"]["text"])
            if "".join(texts).endswith("hi sync\n"):
                break
        assert "".join(texts) == "0\n1\n2\nhi sync\n"

        summary = client.execution(kernel_id, result.msg_id)
        assert (summary.status, summary.stdout) == ("ok", result.stdout)
        with pytest.raises(NotFound):
            client.execution(kernel_id, "no-such-execution")

        async def coroutine_callback(text: str) -> Any:
            return None

        with pytest.raises(TypeError, match="plain functions"):
            client.execute(kernel_id, "print(1)", on_stdout=coroutine_callback)
        client.shutdown(kernel_id)


async def test_interrupting_an_execution_and_its_errors(module_daemon: Daemon) -> None:
    daemon = module_daemon
    with SyncGatewayClient(daemon.url, TOKEN) as client:
        kernel_id = client.start_kernel()
        code = "import time\nprint('ready', flush=True)\ntime.sleep(60)"
        msg_id = client.start_execution(kernel_id, code)
        for event in client.execution_events(kernel_id, msg_id):
            if event.event == "stdout":  # the code runs: interrupt it
                client.interrupt_execution(kernel_id, msg_id)
            if event.event == "done":
                assert event.data["status"] == "interrupted"
        refused = None
        try:
            client.interrupt_execution(kernel_id, msg_id)  # no longer running
        except GatewayHTTPError as error:
            refused = (error.status, error.reason)
        assert refused in (None, (409, "execution_not_running"))  # a newer gateway says so
        with pytest.raises(NotFound):
            client.interrupt_execution("no-such-kernel", msg_id)
        client.shutdown(kernel_id)
