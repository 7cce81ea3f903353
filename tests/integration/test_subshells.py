"""Kernel subshells (ipykernel 7, JEP 91; JupyterLab 4.4 sends widget comms over them): a
cell on a subshell runs while the main shell is busy, each execution ends on its own
``idle``, and the kernel's state stays ``busy`` while any shell is (jupyter_server's goes
``idle`` when the subshell does, with the main shell still running a cell)."""

from __future__ import annotations

from typing import Any

from .daemon import Daemon
from .waits import wait_until
from .wsclient import KernelWS

#: A main-shell cell that runs until a subshell's cell releases it (they share the
#: namespace).
WAITS = "import time\nwhile not globals().get('release'): time.sleep(0.05)\nprint('main done')"


async def kernel_state(daemon: Daemon, kernel_id: str) -> str:
    state: str = (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"]
    return state


async def reply(ws: KernelWS, msg_id: str, msg_type: str) -> dict[str, Any]:
    while True:
        message = await ws.receive()
        assert message is not None, "connection closed"
        ws.history.append(message)
        if message["msg_type"] == msg_type and message["parent_header"].get("msg_id") == msg_id:
            return message


async def test_the_kernel_is_busy_while_any_shell_is(daemon: Daemon) -> None:
    daemon.start()
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    ws = await daemon.channels(kernel_id)
    try:
        # As JupyterLab does, a kernel_info first: ipykernel 7.4 answers a
        # create_subshell_request that comes before its shell channel thread is set up
        # with an AssertionError in its control handler and no reply (3 of 8 starts under
        # load, with jupyter_client alone).
        await reply(ws, ws.send("shell", "kernel_info_request", {}), "kernel_info_reply")
        created = await reply(
            ws, ws.send("control", "create_subshell_request", {}), "create_subshell_reply"
        )
        subshell = created["content"]["subshell_id"]
        main = ws.execute(WAITS)

        async def busy() -> bool:
            return await kernel_state(daemon, kernel_id) == "busy"

        await wait_until(busy, "the main shell's cell running")
        # A cell on the subshell runs and ends while the main shell's still runs.
        # Not in the history: IPython's history database, written from two threads at
        # once, says so on stdout now and then.
        sub = ws.execute("print('sub ran')", subshell_id=subshell, store_history=False)
        assert (await ws.until_idle(sub)).text() == "sub ran\n"
        summary = await daemon.fetch(f"/api/kernels/{kernel_id}/executions/{sub}")
        assert summary["status"] == "ok", summary
        assert await kernel_state(daemon, kernel_id) == "busy"
        running = await daemon.fetch(f"/api/kernels/{kernel_id}/executions/{main}")
        assert running["status"] == "running", running
        # Released from the subshell, the main cell ends: now the kernel is idle.
        ws.execute("release = True", subshell_id=subshell, store_history=False)
        assert (await ws.until_idle(main)).text() == "main done\n"

        async def idle() -> bool:
            return await kernel_state(daemon, kernel_id) == "idle"

        await wait_until(idle, "every shell idle")
    finally:
        ws.close()
