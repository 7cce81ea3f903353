"""The gateway's own channels to each kernel, for the execute API.

One :class:`KernelExecutor` per kernel holds a shell and a stdin socket with an identity of
the gateway's, so the kernel's ``input_request`` for an execution sent through the API comes
back here. Those requests are recorded in the transcript (under the execution's parent) so
that every reader of the execution sees them, with a sequence number, and can resume.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import zmq
from jupyter_client.session import Session
from traitlets import Float
from traitlets.config import LoggingConfigurable

from .core.errors import RemoteError, UnknownKernel
from .core.executions import INPUT_REQUEST, ExecutionSummary, summarize
from .core.messages import KernelMessage, split_identities
from .core.subscription import LIFECYCLE_STATES
from .stores.base import TranscriptStore
from .tap import KernelTap, TapManager, connect_dealer

__all__ = ["UNFINISHED", "ExecutionManager", "KernelExecutor"]

#: Seconds an execution stays known after its execute_reply, for its IOPub to be recorded.
REPLY_GRACE = 10.0

#: Summary statuses of an execution that has not ended.
UNFINISHED = frozenset({"queued", "running"})


class KernelExecutor:
    """Sends execute requests and input replies to one kernel on the gateway's behalf."""

    def __init__(self, kernel_id: str, tap: KernelTap, manager: ExecutionManager) -> None:
        self.kernel_id = kernel_id
        self.tap = tap
        self.manager = manager
        kernel = tap.kernel_manager
        self.session = Session(
            key=kernel.session.key,
            signature_scheme=kernel.session.signature_scheme,
            username="kernel_gateway_stream",
        )
        identity = f"kernel_gateway_stream-{uuid.uuid4().hex}".encode()
        info = kernel.get_connection_info()
        context = manager.taps.context
        self.shell, shell_monitor = connect_dealer(context, info, "shell", identity)
        self.stdin, stdin_monitor = connect_dealer(context, info, "stdin", identity)
        self._monitors: list[zmq.Socket[bytes]] | None = [shell_monitor, stdin_monitor]
        self.shell.on_recv(self._on_shell)
        self.stdin.on_recv(self._on_stdin)
        #: Executions sent through this executor that have not ended yet, by msg_id.
        self.running: set[str] = set()
        #: The input_request header waiting for an answer, by execution msg_id.
        self.waiting_input: dict[str, dict[str, Any]] = {}

    async def _handshaken(self, timeout: float) -> None:
        """Wait until the kernel knows both our identities: its stdin ROUTER silently drops
        an input_request for an identity whose connection is still being set up."""
        if self._monitors is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout
        for monitor in self._monitors:
            while not monitor.poll(0) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.005)
        for stream, monitor in zip((self.shell, self.stdin), self._monitors, strict=True):
            stream.socket.disable_monitor()
            monitor.close(linger=0)
        self._monitors = None

    async def execute(self, code: str, *, allow_stdin: bool, stop_on_error: bool) -> str:
        """Send an execute_request once the Tap sees IOPub; returns its msg_id."""
        await self.tap.ready
        await self._handshaken(self.manager.connect_timeout)
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": allow_stdin,
            "stop_on_error": stop_on_error,
        }
        message = self.session.msg("execute_request", content=content)
        msg_id: str = message["header"]["msg_id"]
        self.running.add(msg_id)
        self.session.send(self.shell.socket, message)
        return msg_id

    def answer(self, msg_id: str, value: str) -> bool:
        """Answer the pending input_request of execution ``msg_id``; False if none waits."""
        header = self.waiting_input.pop(msg_id, None)
        if header is None:
            return False
        self.session.send(
            self.stdin.socket, "input_reply", content={"value": value}, parent={"header": header}
        )
        return True

    def _on_shell(self, frames: list[bytes]) -> None:
        message = self._decode(frames)
        if message is not None and message.msg_type == "execute_reply":
            msg_id = message.parent_msg_id or ""
            self.waiting_input.pop(msg_id, None)
            # The reply comes on shell, the output on IOPub: two sockets, read in no
            # particular order. Until the Tap has recorded the execution's IOPub messages
            # its summary still needs ``running`` to say "queued" rather than "unknown".
            asyncio.get_running_loop().call_later(REPLY_GRACE, self.running.discard, msg_id)

    def _on_stdin(self, frames: list[bytes]) -> None:
        message = self._decode(frames)
        if message is None or message.msg_type != INPUT_REQUEST or not message.parent_msg_id:
            return
        self.waiting_input[message.parent_msg_id] = message.header()
        self.tap.record_message(message)

    def _decode(self, frames: list[Any]) -> KernelMessage | None:
        try:
            _, rest = split_identities([bytes(frame) for frame in frames])
            self.tap.signer.verify(rest[0], rest[1:5])
            return KernelMessage.from_parts(rest[1:])
        except (RemoteError, IndexError) as error:
            self.manager.log.warning("Dropped an invalid reply from %s: %s", self.kernel_id, error)
            return None

    def close(self) -> None:
        for monitor in self._monitors or ():
            monitor.close(linger=0)
        self._monitors = None
        for stream in (self.shell, self.stdin):
            if not stream.closed():
                stream.close(linger=0)


class ExecutionManager(LoggingConfigurable):
    """One :class:`KernelExecutor` per kernel that the execute API is used on."""

    connect_timeout = Float(
        10.0,
        config=True,
        help="Seconds the execute API waits for its shell and stdin sockets to a kernel to "
        "be connected before it sends the first request anyway.",
    )

    def __init__(self, taps: TapManager, store: TranscriptStore, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taps = taps
        self.store = store
        self.executors: dict[str, KernelExecutor] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        taps.on_close(self._kernel_closed)

    async def executor(self, kernel_id: str) -> KernelExecutor:
        """The kernel's executor, created on first use.

        Raises:
            UnknownKernel: no such running kernel.
        """
        executor = self.executors.get(kernel_id)
        if executor is None:
            tap = await self.taps.ensure(kernel_id)
            executor = self.executors.setdefault(kernel_id, KernelExecutor(kernel_id, tap, self))
        return executor

    async def execute(
        self,
        kernel_id: str,
        code: str,
        *,
        allow_stdin: bool = False,
        stop_on_error: bool = True,
        timeout: float | None = None,
    ) -> str:
        executor = await self.executor(kernel_id)
        msg_id = await executor.execute(code, allow_stdin=allow_stdin, stop_on_error=stop_on_error)
        if timeout is not None:
            loop = asyncio.get_running_loop()
            self._timers[msg_id] = loop.call_later(timeout, self._on_timeout, kernel_id, msg_id)
        return msg_id

    async def summary(self, kernel_id: str, msg_id: str) -> ExecutionSummary | None:
        """The execution's summary, rebuilt from the transcript (all of its pages)."""
        records = []
        cursor = 0
        while True:
            page = await self.store.read(kernel_id, cursor, 10000, parent=msg_id)
            records.extend(page.records)
            if len(page.records) < 10000:
                break
            cursor = page.records[-1].seq
        summary = summarize(msg_id, records)
        if summary is not None and summary.status == "running":
            # Died? A restarting/dead status after the execution's last record says so.
            later = await self.store.read(kernel_id, summary.last_seq, 1000, msg_types=("status",))
            if any(r.message.execution_state in LIFECYCLE_STATES for r in later.records):
                summary.status = "died"
        executor = self.executors.get(kernel_id)
        if summary is None and executor is not None and msg_id in executor.running:
            summary = ExecutionSummary(msg_id, status="queued")
        if summary is not None and summary.status not in UNFINISHED:
            self._cancel_timer(msg_id)
        return summary

    async def interrupt(self, kernel_id: str) -> None:
        """Interrupt the kernel (SIGINT for ipykernel) and return at once."""
        if kernel_id not in self.taps.kernel_manager:
            raise UnknownKernel(kernel_id)
        await self.taps.kernel_manager.interrupt_kernel(kernel_id)

    def _on_timeout(self, kernel_id: str, msg_id: str) -> None:
        self._timers.pop(msg_id, None)
        task = asyncio.ensure_future(self._interrupt_if_running(kernel_id, msg_id))
        task.add_done_callback(lambda done: done.exception())

    async def _interrupt_if_running(self, kernel_id: str, msg_id: str) -> None:
        summary = await self.summary(kernel_id, msg_id)
        if summary is None or summary.status in UNFINISHED:
            self.log.info("Execution %s hit its timeout; interrupting %s", msg_id, kernel_id)
            await self.interrupt(kernel_id)

    def _cancel_timer(self, msg_id: str) -> None:
        timer = self._timers.pop(msg_id, None)
        if timer is not None:
            timer.cancel()

    def _kernel_closed(self, kernel_id: str, _: list[Any]) -> None:
        executor = self.executors.pop(kernel_id, None)
        if executor is not None:
            executor.close()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for executor in self.executors.values():
            executor.close()
        self.executors.clear()
