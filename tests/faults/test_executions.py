"""Item 15: executions through the execute API when things go wrong.

(a) a queued execution's timeout counts from its own start and interrupts only it;
(b) an execution whose kernel is restarted or deleted ends (died or aborted, with a
reason) instead of staying running for ever; (c) simultaneous first requests on a kernel
all succeed, and leak nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ..timing import seconds


@pytest.fixture
def api(jp_http_port: int, jp_auth_header: dict[str, str], jp_base_url: str) -> Any:
    client = AsyncHTTPClient(force_instance=True)

    async def call(path: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
        base = f"http://127.0.0.1:{jp_http_port}{jp_base_url.rstrip('/')}"
        response = await client.fetch(
            HTTPRequest(
                base + path,
                method=method,
                body=None if body is None else json.dumps(body),
                headers=jp_auth_header,
                request_timeout=seconds(120),
            ),
            raise_error=False,
        )
        text = response.body.decode()
        try:
            return response.code, json.loads(text)
        except ValueError:
            return response.code, text

    yield call
    client.close()


def events_of(body: str) -> list[tuple[str, Any]]:
    """``(event, data)`` of a finished SSE response body."""
    events = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields.get("data", "null"))))
    return events


async def test_a_queued_timeout_counts_from_its_own_start_and_interrupts_only_it(
    start_kernel: Any, api: Any
) -> None:
    """(a) A (no timeout) runs 3 s; B, queued behind it with timeout 1, sleeps 10 s once
    it runs. A ends ok, not interrupted; B is interrupted about a second into its own run."""
    kernel_id = await start_kernel()
    k = f"/api/kernels/{kernel_id}"
    _, first = await api(f"{k}/execute", "POST", {"code": "import time; time.sleep(3); print('A')"})
    _, second = await api(
        f"{k}/execute",
        "POST",
        {"code": "import time; print('B starts'); time.sleep(10); print('B ends')", "timeout": 1},
    )
    for execution in (first, second):
        await api(f"{k}/executions/{execution['msg_id']}/events")
    _, a = await api(f"{k}/executions/{first['msg_id']}")
    _, b = await api(f"{k}/executions/{second['msg_id']}")
    assert (a["status"], a["stdout"]) == ("ok", "A\n")
    assert (b["status"], b["stdout"]) == ("interrupted", "B starts\n")
    assert b["duration"] < 9


#: A cell the kernel can interrupt, and one it cannot (SIGINT ignored: when the kernel is
#: asked to restart or shut down, jupyter_client ends up killing it after its grace time).
CELLS = {
    "interruptible": "import time\nprint('started', flush=True)\ntime.sleep(60)",
    "uninterruptible": (
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('started', flush=True)\ntime.sleep(60)"
    ),
}


@pytest.mark.parametrize("cell", sorted(CELLS))
@pytest.mark.parametrize("how", ["restart", "delete"])
async def test_an_execution_ends_when_its_kernel_is_restarted_or_deleted(
    start_kernel: Any, api: Any, jp_fetch: Any, how: str, cell: str
) -> None:
    """(b) An execution running when its kernel is restarted by REST or deleted ends, with
    the reason: ``interrupted`` if the kernel could interrupt it (ipykernel does, when asked
    to go), ``died`` if the kernel went with it unfinished; one still queued then is
    ``aborted``. Its event stream ends with ``done`` (not a bare end of stream that a client
    would resume for ever)."""
    kernel_id = await start_kernel()
    k = f"/api/kernels/{kernel_id}"
    _, running = await api(f"{k}/execute", "POST", {"code": CELLS[cell]})
    _, queued = await api(f"{k}/execute", "POST", {"code": "print('queued')"})
    watching = asyncio.ensure_future(api(f"{k}/executions/{running['msg_id']}/events"))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(60)
    while (await api(f"{k}/executions/{running['msg_id']}"))[1]["stdout"] != "started\n":
        assert loop.time() < deadline
        await asyncio.sleep(0.1)
    if how == "restart":
        await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="")
        reason = "restart_requested"
    else:
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
        reason = "shutdown"
    code, body = await asyncio.wait_for(watching, seconds(60))
    assert code == 200
    done = events_of(body)[-1]
    assert done[0] == "done"
    expected = "interrupted" if cell == "interruptible" else "died"
    assert (done[1]["status"], done[1]["reason"]) == (expected, reason)
    _, summary = await api(f"{k}/executions/{queued['msg_id']}")
    if cell == "uninterruptible":
        assert (summary["status"], summary["reason"]) == ("aborted", reason)
    else:  # ipykernel may still run a queued request once the running one is interrupted
        assert summary["status"] in ("ok", "aborted")
    _, events = await api(f"{k}/executions/{queued['msg_id']}/events")
    assert events_of(events)[-1][0] == "done"


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_simultaneous_first_requests_all_succeed_and_leak_nothing(
    start_kernel: Any, api: Any, jp_fetch: Any
) -> None:
    """(c) Four simultaneous first POST .../execute on fresh kernels, ten times: every one
    answers 201 and finishes ok (one run in four answered 500: a socket monitor polled
    after another request closed it), and no socket is left behind once the kernels go."""
    before = open_descriptors()
    for _ in range(10):
        kernel_id = await start_kernel()
        k = f"/api/kernels/{kernel_id}"
        answers = await asyncio.gather(
            *(api(f"{k}/execute", "POST", {"code": f"print({n})"}) for n in range(4))
        )
        assert [code for code, _ in answers] == [201] * 4, answers
        for n, (_, answer) in enumerate(answers):
            await api(f"{k}/executions/{answer['msg_id']}/events")
            _, summary = await api(f"{k}/executions/{answer['msg_id']}")
            assert (summary["status"], summary["stdout"]) == ("ok", f"{n}\n")
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    await asyncio.sleep(1)
    assert open_descriptors() - before < 20


async def test_an_events_stream_opened_as_its_kernel_goes_ends_with_the_final_status(
    start_kernel: Any, api: Any, jp_fetch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events of an execution asked for while its kernel is running, answered once the
    kernel is gone (the request waited for a summary slot meanwhile: a busy gateway): the
    ``done`` event says how the execution ended, not ``running`` as the summary read
    before the kernel went said (a fresh-clone run saw that)."""
    from kernel_gateway_stream.executions import ExecutionManager

    kernel_id = await start_kernel()
    k = f"/api/kernels/{kernel_id}"
    _, running = await api(f"{k}/execute", "POST", {"code": CELLS["interruptible"]})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(60)
    while (await api(f"{k}/executions/{running['msg_id']}"))[1]["stdout"] != "started\n":
        assert loop.time() < deadline
        await asyncio.sleep(0.1)
    real = ExecutionManager.summary
    read = asyncio.Event()
    deleted = asyncio.Event()

    async def slow_first(self: ExecutionManager, kernel: str, msg_id: str) -> Any:
        summary = await real(self, kernel, msg_id)
        if not read.is_set():
            read.set()
            await deleted.wait()
        return summary

    monkeypatch.setattr(ExecutionManager, "summary", slow_first)
    watching = asyncio.ensure_future(api(f"{k}/executions/{running['msg_id']}/events"))
    await asyncio.wait_for(read.wait(), seconds(30))
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    deleted.set()
    code, body = await asyncio.wait_for(watching, seconds(60))
    assert code == 200
    done = events_of(body)[-1]
    assert done[0] == "done"
    assert (done[1]["status"], done[1]["reason"]) == ("interrupted", "shutdown")
