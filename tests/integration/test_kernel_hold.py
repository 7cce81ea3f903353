"""A kernel started through the gateway's launcher holds its IOPub while nobody listens
(no subscription on its XPUB), and publishes a notice and then what it held to the next
subscriber, in order; past its limit it drops the oldest and says how many. Real
ipykernel, real sockets, jupyter_client as the subscriber."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager

from kernel_gateway_stream.core.marks import SPOOL_MSG_TYPE

from ..timing import seconds

PRINTS = "import time\nfor i in range(60):\n    print(i, flush=True)\n    time.sleep(0.02)\n"


@pytest.fixture(params=[64 * 1024 * 1024, 2000], ids=["default", "small"])
def kernel(request: pytest.FixtureRequest) -> Iterator[tuple[KernelManager, int]]:
    hold = request.param
    argv = [
        sys.executable,
        "-m",
        "kernel_gateway_stream.kernel_launcher",
        "-f",
        "{connection_file}",
        f"--LosslessIOPubKernelApp.iopub_hold_bytes={hold}",
    ]
    # IPC, not TCP: jupyter_client picks free TCP ports and the kernel binds them later, and
    # a test running beside this one could take one in between ("Address already in use",
    # seen in a fresh-clone run). A short directory: a socket's path has ~100 bytes at most.
    directory = tempfile.mkdtemp(prefix="kgs-hold-")
    manager = KernelManager(transport="ipc", ip=os.path.join(directory, "k"))
    manager._kernel_spec = KernelSpec(argv=argv, display_name="held", language="python")
    manager.start_kernel(env=dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1"))
    try:
        yield manager, hold
    finally:
        manager.shutdown_kernel(now=True)
        shutil.rmtree(directory, ignore_errors=True)


def _messages(client: Any, until: float) -> list[dict[str, Any]]:
    received = []
    while time.monotonic() < until:
        try:
            received.append(client.get_iopub_msg(timeout=0.5))
        except Exception:  # queue.Empty: nothing for a moment
            continue
        message = received[-1]
        ended = message["msg_type"] == "status" and message["content"]["execution_state"] == "idle"
        if ended and message["parent_header"].get("msg_type") == "execute_request":
            break
    return received


def test_what_a_kernel_prints_unwatched_reaches_the_next_subscriber(
    kernel: tuple[KernelManager, int],
) -> None:
    manager, hold = kernel
    first = manager.client()
    first.start_channels(hb=False)
    first.wait_for_ready(timeout=seconds(60))
    msg_id = first.execute(PRINTS)
    # Watch the first lines, then leave: the kernel prints on to nobody.
    lines: list[int] = []
    deadline = time.monotonic() + seconds(30)
    while len(lines) < 5:
        assert time.monotonic() < deadline
        message = first.get_iopub_msg(timeout=seconds(10))
        if message["msg_type"] == "stream":
            lines += [int(line) for line in message["content"]["text"].split()]
    first.iopub_channel.stop()
    # The run ends meanwhile (60 lines, 20 ms apart): its reply comes on the shell channel.
    while first.get_shell_msg(timeout=seconds(30))["parent_header"].get("msg_id") != msg_id:
        pass
    first.stop_channels()

    second = manager.client()
    second.start_channels(hb=False)
    try:
        received = _messages(second, time.monotonic() + seconds(30))
    finally:
        second.stop_channels()
    types = [m["msg_type"] for m in received]
    assert SPOOL_MSG_TYPE in types, types
    notice = received[types.index(SPOOL_MSG_TYPE)]
    held = [
        int(line)
        for m in received[types.index(SPOOL_MSG_TYPE) + 1 :]
        if m["msg_type"] == "stream"
        for line in m["content"]["text"].split()
    ]
    assert held, "what it printed unwatched"
    assert held == list(range(held[0], 60)), "in order, to the end of the run"
    if hold > 10_000:
        assert notice["content"]["dropped"] == 0
        # Everything: the lines the first subscriber had not received yet, none lost
        # (what was in flight when it left went to it, or is held).
        assert held[0] <= lines[-1] + 1
    else:
        # Past the limit the oldest went, counted; the newest are held.
        assert notice["content"]["dropped"] > 0
        assert 0 < notice["content"]["held"] < 60
