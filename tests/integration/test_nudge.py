"""A Tap nudges its kernel with ``kernel_info_request`` until the kernel has answered one,
not only until its first IOPub message.

ipykernel 7 welcomes a subscription (``iopub_welcome``) as soon as its IOPub socket is
bound, and the gateway's launcher publishes the ``starting`` it held; a kernel whose shell
is not listening yet (a slow start on a loaded machine) has answered nothing then. Nudging
used to stop there, closing its socket with the requests it had queued: nothing took the
kernel's model out of ``starting`` while no client connected. Here a kernel stand-in on
real ZMQ sockets does exactly that: it welcomes the subscription, and binds its shell only
once the Tap has taken the welcome.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from kernel_gateway_stream.core.messages import KernelMessage
from kernel_gateway_stream.kernels.zmq_kernel import IOPubSettings, KernelSockets

from ..timing import seconds
from .waits import wait_until

KEY = b"a-key-for-this-test-only"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Sink:
    """What a Tap is to its IOPub source: here, a list of what it recorded."""

    def __init__(self) -> None:
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.messages: list[KernelMessage] = []

    def record_message(self, message: KernelMessage) -> None:
        self.messages.append(message)

    def record_replayed(self, message: KernelMessage) -> None:
        self.messages.append(message)

    def batch_received(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def accepting(self) -> bool:
        return True

    def record_gap(self, reason: str, lost: int | None) -> None:
        raise AssertionError(f"a gap: {reason} {lost}")

    def link_changed(self, reachable: bool, reason: str, lost: int | None) -> None:
        raise AssertionError(f"the link changed: {reachable} {reason}")

    def states(self) -> list[str | None]:
        return [m.execution_state for m in self.messages if m.msg_type == "status"]


class SlowShellKernel:
    """An IOPub XPUB that welcomes each subscription at once, and a shell ROUTER bound only
    when :meth:`open_shell` is called, answering ``kernel_info_request`` with ``busy`` and
    ``idle`` on IOPub, as ipykernel does."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self.session = Session(key=KEY, username="kernel")
        self.info: dict[str, Any] = {
            "transport": "tcp",
            "ip": "127.0.0.1",
            "key": KEY.decode(),
            "signature_scheme": "hmac-sha256",
            **{f"{channel}_port": free_port() for channel in ("shell", "control", "stdin")},
            "hb_port": free_port(),
        }
        self.iopub = context.socket(zmq.XPUB)
        self.iopub.setsockopt(zmq.LINGER, 0)
        self.info["iopub_port"] = self.iopub.bind_to_random_port("tcp://127.0.0.1")
        self.shell = context.socket(zmq.ROUTER)
        self.shell.setsockopt(zmq.LINGER, 0)
        self.requests: list[str] = []
        self.welcomed = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._welcome())]

    async def _welcome(self) -> None:
        while True:
            frame = await self.iopub.recv()
            if frame[:1] == b"\x01":  # a subscription (anything else: an acknowledgement)
                self.session.send(self.iopub, "iopub_welcome", {"subscription": ""})
                self.welcomed.set()

    def open_shell(self) -> None:
        self.shell.bind(f"tcp://127.0.0.1:{self.info['shell_port']}")
        self._tasks.append(asyncio.ensure_future(self._answer()))

    async def _answer(self) -> None:
        while True:
            identities, message = self.session.feed_identities(await self.shell.recv_multipart())
            request = self.session.deserialize(message, content=True)
            self.requests.append(request["header"]["msg_type"])
            parent = request["header"]
            for state in ("busy", "idle"):
                self.session.send(self.iopub, "status", {"execution_state": state}, parent)
            self.session.send(self.shell, "kernel_info_reply", {}, parent, ident=identities)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.iopub.close()
        self.shell.close()


def iopub_settings() -> IOPubSettings:
    """A Tap's IOPub settings for a kernel stand-in: small batches, quick nudges."""
    return IOPubSettings(
        receive_hwm=1000,
        receive_buffer=0,
        batch=500,
        batch_bytes=256 * 1024,
        nudge_interval=0.05,
        ready_timeout=seconds(30),
        replay_history=1000,
        refusal_log_interval=10.0,
    )


async def test_a_kernel_welcoming_its_subscription_before_its_shell_listens_is_nudged_on() -> None:
    sockets = KernelSockets()
    kernel = SlowShellKernel(sockets.async_context)
    link = sockets.link(
        "nudged",
        lambda: kernel.info,
        key=KEY,
        signature_scheme="hmac-sha256",
        log=logging.getLogger("test_nudge"),
    )
    link.settings = iopub_settings()
    sink = Sink()
    source = link.iopub(sink)  # type: ignore[arg-type]
    source.start()
    try:
        await asyncio.wait_for(sink.ready, seconds(30))  # the welcome: live
        # Handed over once no launcher's notice came (zmq_kernel.NOTICE_WAIT).
        await wait_until(lambda: sink.messages, "the welcome recorded")
        assert [m.msg_type for m in sink.messages] == ["iopub_welcome"]
        # The shell listens only now; the Tap's requests so far went nowhere.
        await asyncio.sleep(0.3)
        kernel.open_shell()
        await wait_until(lambda: "idle" in sink.states(), "the kernel's idle, answering a nudge")
        assert "kernel_info_request" in kernel.requests
        assert sink.states()[:2] == ["busy", "idle"]
    finally:
        source.stop()
        kernel.close()
