"""What a kernel sends a new subscriber before its hold notice is handed over after the
notice's replay, in the kernel's order (kernel_gateway_stream/kernels/zmq_kernel.py, "A
subscriber's first messages").

libzmq applies a subscription as soon as it reads it off the connection, which may be
inside one of the kernel's sends: a kernel of the gateway's launcher that is already
sending gives the new subscriber a message before the notice and the replay of what it
holds (tests/unit/test_launcher_subscriptions.py shows it on the launcher itself). Here a
kernel stand-in on real ZMQ sockets does exactly that, in that order, every time: it waits
until the Tap's subscription is in, publishes a line, then the notice and the replay of the
two lines it holds (an older one, and that line again), then a new line. The Tap must
record the notice, then the lines in the kernel's order, each once. A kernel that sends no
notice gets its messages handed over as they came once ``NOTICE_WAIT`` has passed, and is
not held again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from kernel_gateway_stream.core.marks import REPLAY_MSG_TYPE, SPOOL_MSG_TYPE
from kernel_gateway_stream.core.messages import DELIMITER, KernelMessage
from kernel_gateway_stream.kernels.zmq_kernel import KernelSockets

from ..timing import seconds
from .test_nudge import KEY, free_port, iopub_settings
from .waits import wait_until


class Sink:
    """What a Tap is to its IOPub source: here, a list of what it recorded; a message
    published again is recorded unless one with its msg_id was (as the Tap does)."""

    def __init__(self) -> None:
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.messages: list[KernelMessage] = []

    def record_message(self, message: KernelMessage) -> None:
        self.messages.append(message)

    def record_replayed(self, message: KernelMessage) -> None:
        if message.msg_id not in {m.msg_id for m in self.messages}:
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

    def seen(self) -> list[str]:
        """What was recorded: "notice", a line's text, or a msg_type."""
        seen = []
        for message in self.messages:
            if message.msg_type == SPOOL_MSG_TYPE:
                seen.append("notice")
            elif message.msg_type == "stream":
                seen.append(message.content()["text"].strip())
            else:
                seen.append(message.msg_type)
        return seen


class Kernel:
    """An IOPub XPUB that hears every subscription, as the launcher's does (and, as there,
    libzmq applies each by itself)."""

    def __init__(self, context: zmq.asyncio.Context) -> None:
        self.session = Session(key=KEY, username="kernel")
        self.iopub = context.socket(zmq.XPUB)
        self.iopub.setsockopt(zmq.LINGER, 0)
        self.iopub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription is heard
        self.info: dict[str, Any] = {
            "transport": "tcp",
            "ip": "127.0.0.1",
            "key": KEY.decode(),
            "signature_scheme": "hmac-sha256",
            "iopub_port": self.iopub.bind_to_random_port("tcp://127.0.0.1"),
            **{f"{channel}_port": free_port() for channel in ("shell", "control", "stdin")},
            "hb_port": free_port(),
        }

    async def subscribed(self) -> None:
        """Until a subscription came (the acknowledgements before it are read too)."""
        while (await self.iopub.recv())[:1] != b"\x01":
            pass

    def line(self, text: str) -> list[bytes]:
        message = self.session.msg("stream", {"name": "stdout", "text": f"{text}\n"})
        frames: list[bytes] = self.session.serialize(message, ident=b"stream.stdout")
        return frames

    def publish(self, frames: list[bytes]) -> None:
        self.iopub.send_multipart(frames)

    def notice(self, held: int, sent: int) -> None:
        content = {"held": held, "sent": sent, "dropped": 0, "evicted": 0, "acked": None}
        self.session.send(self.iopub, SPOOL_MSG_TYPE, {**content, "acks": True})

    def replay(self, frames: list[bytes]) -> None:
        own = frames[frames.index(DELIMITER) + 1 :]
        self.session.send(self.iopub, REPLAY_MSG_TYPE, {}, buffers=own)

    def close(self) -> None:
        self.iopub.close()


@contextlib.asynccontextmanager
async def subscribed() -> AsyncIterator[tuple[Kernel, Sink, Any]]:
    """A kernel stand-in, and a Tap's IOPub source on it whose subscription is in."""
    sockets = KernelSockets()
    kernel = Kernel(sockets.async_context)
    sink = Sink()
    link = sockets.link(
        "notice-first",
        lambda: kernel.info,
        key=KEY,
        signature_scheme="hmac-sha256",
        log=logging.getLogger("test_notice_first"),
    )
    link.settings = iopub_settings()
    source = link.iopub(sink)  # type: ignore[arg-type]
    source.start()
    try:
        await asyncio.wait_for(kernel.subscribed(), seconds(30))
        yield kernel, sink, source
    finally:
        source.stop()
        kernel.close()


async def test_a_line_sent_before_the_notice_is_recorded_in_the_kernels_order() -> None:
    async with subscribed() as (kernel, sink, source):
        older, early, later = kernel.line("older"), kernel.line("early"), kernel.line("later")
        kernel.publish(early)  # reaches the Tap before its notice
        await wait_until(lambda: source._before_notice, "the early line at the Tap")
        kernel.notice(held=2, sent=2)
        kernel.replay(older)
        kernel.replay(early)
        kernel.publish(later)
        await wait_until(lambda: "later" in sink.seen(), "the later line")
        assert sink.seen() == ["notice", "older", "early", "later"]
        assert source.sends_notices is True
        assert source.seen_again == 1, "the replay of the early line, which came already"


async def test_a_kernel_that_sends_no_notice_is_held_once_then_never() -> None:
    async with subscribed() as (kernel, sink, source):
        kernel.publish(kernel.line("first"))
        kernel.publish(kernel.line("second"))
        await wait_until(lambda: len(source._before_notice) == 2, "both lines held")
        assert sink.seen() == [], "held while a notice may come"
        await wait_until(lambda: len(sink.seen()) == 2, "the lines handed over")
        assert sink.seen() == ["first", "second"]
        assert source.sends_notices is False
        source.reconnect()  # subscribes again: nothing held this time
        assert source._notice_timer is None
        await asyncio.wait_for(kernel.subscribed(), seconds(30))
        kernel.publish(kernel.line("third"))
        await wait_until(lambda: "third" in sink.seen(), "the third line")
        assert sink.seen() == ["first", "second", "third"]
