"""``GET /api/kernels/{id}/cells``: what a reloaded JupyterLab page needs to bring each
cell up to date, from a real kernel, through the channels socket as JupyterLab uses it
(each execute_request names its cell in ``metadata.cellId``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from kernel_gateway_stream.core.marks import REQUEST_MSG_TYPE

PROGRESS = r"""
import time
for i in range(1, 5001):
    print(f"\rprogress {i}/5000", end="", flush=True)
print()
print("done")
"""

SLOW = """
import time
for i in range(100):
    print("tick", i, flush=True)
    time.sleep(0.05)
"""


async def cells(jp_fetch: Any, kernel_id: str, **params: Any) -> dict[str, Any]:
    response = await jp_fetch("api", "kernels", kernel_id, "cells", params=params)
    answer: dict[str, Any] = json.loads(response.body)
    return answer


async def test_each_cells_latest_execution_folded(
    jp_fetch: Any, start_kernel: Any, connect: Any, transcript: Any
) -> None:
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    first = ws.execute("print('old run')", cell_id="cell-a")
    await ws.until_idle(first, timeout=60)
    progress = ws.execute(PROGRESS, cell_id="cell-b")
    await ws.until_idle(progress, timeout=120)
    latest = ws.execute("print('new run'); 6 * 7", cell_id="cell-a")
    await ws.until_idle(latest, timeout=60)
    failing = ws.execute("1 / 0", cell_id="cell-c")
    await ws.until_idle(failing, timeout=60)
    no_cell = ws.execute("print('from a program')")
    await ws.until_idle(no_cell, timeout=60)

    answer = await cells(jp_fetch, kernel_id)
    records = await transcript(kernel_id, msg_type=REQUEST_MSG_TYPE)
    assert [r["content"] for r in records["records"]] == [
        {"msg_id": first, "cell_id": "cell-a"},
        {"msg_id": progress, "cell_id": "cell-b"},
        {"msg_id": latest, "cell_id": "cell-a"},
        {"msg_id": failing, "cell_id": "cell-c"},
    ]
    assert answer["head"] >= max(r["seq"] for r in records["records"])
    # In the kernel's session: JupyterLab drops the messages it has queued when one comes
    # with another session (its ``_assertCurrentMessage``).
    inputs = await transcript(kernel_id, msg_type="execute_input")
    kernel_session = inputs["records"][0]["header"]["session"]
    assert {r["header"]["session"] for r in records["records"][1:]} == {kernel_session}
    assert answer["epoch"] == 0
    by_cell = {e["cell_id"]: e for e in answer["executions"]}
    assert [e["cell_id"] for e in answer["executions"]] == ["cell-b", "cell-a", "cell-c"]
    b, a, c = by_cell["cell-b"], by_cell["cell-a"], by_cell["cell-c"]
    assert (b["msg_id"], b["status"]) == (progress, "ok")
    assert b["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "progress 5000/5000\ndone\n"}
    ]
    assert (a["msg_id"], a["status"], a["execution_count"]) == (latest, "ok", 3)
    assert a["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": "new run\n"},
        {
            "output_type": "execute_result",
            "data": {"text/plain": "42"},
            "metadata": {},
            "execution_count": 3,
        },
    ]
    assert c["status"] == "error"
    assert c["outputs"][0]["ename"] == "ZeroDivisionError"
    # 5,000 progress updates in the transcript (100 kB of text, each its own message); a
    # few kilobytes in the answer.
    response = await jp_fetch("api", "kernels", kernel_id, "cells")
    assert len(response.body) < 4096
    # since: only what has records after it.
    later = await cells(jp_fetch, kernel_id, since=str(a["last_seq"]))
    assert [e["cell_id"] for e in later["executions"]] == ["cell-c"]


OUTPUT_WIDGET = """
from IPython.display import display
from ipywidgets import Output
out = Output()
display(out)
print('before')
with out:
    print('inside output')
    raise ValueError('shown in the widget')
print('after')
"""


async def test_what_an_output_widget_captured_stays_the_widgets(
    jp_fetch: Any, start_kernel: Any, connect: Any
) -> None:
    """ipywidgets 8 in a real kernel: the text an Output widget captured is not restored a
    second time as the cell's own output (JupyterLab gave it to the widget, whose model the
    kernel keeps: a reload shows it there), nor is its error the cell's."""
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute(OUTPUT_WIDGET, cell_id="widget")
    received = await ws.until_idle(msg_id, timeout=60)
    assert "inside output\n" in received.text(), "the kernel printed it, to the widget"
    (cell,) = (await cells(jp_fetch, kernel_id))["executions"]
    assert cell["status"] == "ok"
    widget, text = cell["outputs"]
    assert "application/vnd.jupyter.widget-view+json" in widget["data"]
    assert text == {"output_type": "stream", "name": "stdout", "text": "before\nafter\n"}


async def test_a_running_cell_and_a_restart(jp_fetch: Any, start_kernel: Any, connect: Any) -> None:
    kernel_id = await start_kernel()
    ws = await connect(kernel_id)
    msg_id = ws.execute(SLOW, cell_id="slow")
    await ws.until_lines(5)
    answer = await cells(jp_fetch, kernel_id)
    (running,) = answer["executions"]
    assert running["status"] == "running"
    assert running["outputs"][0]["text"].startswith("tick 0\ntick 1\n")
    # Not its five seconds to the end: interrupted, it ends at once.
    await jp_fetch("api", "kernels", kernel_id, "interrupt", method="POST", body="")
    await ws.until_idle(msg_id, timeout=60)
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    answer = await cells(jp_fetch, kernel_id)
    assert answer["epoch"] == 1
    assert answer["executions"] == [], "a new life: the old life's cells are not answered"
    assert answer["life_start"] > 0


async def test_refused_as_the_channels_socket_refuses(jp_fetch: Any, start_kernel: Any) -> None:
    with pytest.raises(HTTPClientError) as unknown:
        await jp_fetch("api", "kernels", "00000000-0000-0000-0000-000000000000", "cells")
    assert unknown.value.code == 404
    kernel_id = await start_kernel()
    with pytest.raises(HTTPClientError) as ahead:
        await jp_fetch("api", "kernels", kernel_id, "cells", params={"since": "999999"})
    assert ahead.value.code == 400
    with pytest.raises(HTTPClientError) as bad:
        await jp_fetch("api", "kernels", kernel_id, "cells", params={"since": "-1"})
    assert bad.value.code == 400
    await asyncio.sleep(0)
