"""The gateway's own channels to each kernel, for the execute API.

One :class:`KernelExecutor` per kernel holds shell, control and stdin sockets with an
identity of the gateway's (:class:`~.kernels.base.KernelChannels`), so the kernel's
``input_request`` for an execution sent through the API comes back here. Those requests
are recorded in the transcript (under the execution's parent) so that every reader of
the execution sees them, with a sequence number, and can resume.

:class:`ExecutionManager` follows every kernel's records (a Tap observer) to know which
execution each kernel is running, so that a ``timeout`` counts from its execution's own
start and interrupts only it, and an interrupt names the execution it is for.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from typing import Any

from jupyter_client._version import protocol_version as PROTOCOL_VERSION
from traitlets import Float, Int
from traitlets.config import LoggingConfigurable

from .core.errors import ExecutionNotRunning, UnknownExecution, UnknownKernel
from .core.executions import INPUT_REQUEST, UNFINISHED, ExecutionSummary, SummaryBuilder
from .core.marks import LIFECYCLE_STATES
from .core.messages import KernelMessage, Record, dumps_json
from .kernels.base import KernelChannels
from .recording.recorder import KernelRecorder, now_iso
from .recording.registry import RecorderRegistry
from .stores.base import TranscriptStore

__all__ = ["UNFINISHED", "ExecutionManager", "KernelExecutor"]

#: Records and bytes per page when a summary is rebuilt from the transcript.
SUMMARY_PAGE = 10000
SUMMARY_PAGE_BYTES = 8 * 1024 * 1024
#: Executions sent through the API but not seen in the transcript yet, remembered.
MAX_SENT = 10000


class KernelExecutor:
    """Sends execute requests and input replies to one kernel on the gateway's behalf."""

    def __init__(self, tap: KernelRecorder, manager: ExecutionManager) -> None:
        self.kernel_id = tap.kernel_id
        self.tap = tap
        self.manager = manager
        self.session_id = uuid.uuid4().hex
        identity = f"kernel_gateway_stream-{uuid.uuid4().hex}".encode()
        self.channels: KernelChannels = tap.link.channels(
            identity, self._on_reply, handshake_timeout=manager.connect_timeout
        )
        #: The input_request header waiting for an answer, by execution msg_id.
        self.waiting_input: dict[str, dict[str, Any]] = {}

    async def execute(self, code: str, *, allow_stdin: bool, stop_on_error: bool) -> str | None:
        """Send an execute_request once the Tap sees IOPub and the kernel knows our stdin
        identity (every concurrent first request waits on the same future); returns its
        msg_id, or None if this executor was closed meanwhile (its kernel restarted: its
        sockets were the old kernel's, and what was sent on them would go nowhere)."""
        await self.tap.ready
        await asyncio.shield(self.channels.ready)
        if self.channels.closed:
            return None
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": allow_stdin,
            "stop_on_error": stop_on_error,
        }
        msg_id, parts = self._request("execute_request", content)
        self.manager.sent(self.kernel_id, msg_id, self.tap.head)
        self.channels.send("shell", parts)
        return msg_id

    def _request(
        self, msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None = None
    ) -> tuple[str, list[bytes]]:
        """A request of the gateway's own: its msg_id and its four JSON parts."""
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": "kernel_gateway_stream",
            "session": self.session_id,
            "date": now_iso(),
            "version": PROTOCOL_VERSION,
        }
        parts = [dumps_json(header), dumps_json(parent or {}), b"{}", dumps_json(content)]
        return msg_id, parts

    def answer(self, msg_id: str, value: str) -> bool:
        """Answer the pending input_request of execution ``msg_id``; False if none waits."""
        header = self.waiting_input.pop(msg_id, None)
        if header is None or self.channels.closed:
            return False
        _, parts = self._request("input_reply", {"value": value}, header)
        self.channels.send("stdin", parts)
        return True

    def _on_reply(self, channel: str, message: KernelMessage) -> None:
        if channel == "shell" and message.msg_type == "execute_reply":
            self.waiting_input.pop(message.parent_msg_id or "", None)
        elif channel == "stdin" and message.msg_type == INPUT_REQUEST and message.parent_msg_id:
            self.waiting_input[message.parent_msg_id] = message.header()
            self.tap.record_message(message)

    def close(self) -> None:
        self.channels.close()


class ExecutionManager(LoggingConfigurable):
    """One :class:`KernelExecutor` per kernel the execute API is used on, and what each
    kernel is running."""

    connect_timeout = Float(
        10.0,
        config=True,
        help="Seconds the execute API waits for the kernel to know its stdin socket before "
        "it sends the first request anyway.",
    )
    summary_max_text = Int(
        8 * 1024 * 1024,
        config=True,
        help="Characters of stdout and of stderr an execution's summary keeps (its last "
        "ones; the summary says how many it left out). The whole text is in the transcript.",
    )
    summary_max_output_bytes = Int(
        8 * 1024 * 1024,
        config=True,
        help="Bytes of display and result messages an execution's summary keeps as outputs "
        "(its first ones, each counted with 512 bytes for the objects around it; 0: no "
        "limit). Past it outputs are left out and counted in the summary's outputs_omitted; "
        "all are in the transcript.",
    )
    max_concurrent_summaries = Int(
        2,
        config=True,
        help="Execution summaries rebuilt at once across the gateway (each holds up to "
        "summary_max_text characters of each stream and summary_max_output_bytes of "
        "outputs while it is built and sent); more requests wait their turn.",
    )
    summary_write_timeout = Float(
        60.0,
        config=True,
        help="Seconds a client may take to read a summary (GET .../executions/{msg_id}) while "
        "it holds one of the max_concurrent_summaries slots; a slower one is disconnected.",
    )

    def __init__(self, taps: RecorderRegistry, store: TranscriptStore, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taps = taps
        self.store = store
        self.executors: dict[str, KernelExecutor] = {}
        #: msg_id -> (kernel_id, transcript head when sent): queued until first seen.
        self._sent: OrderedDict[str, tuple[str, int]] = OrderedDict()
        #: msg_id -> seconds, for executions whose timeout starts when they start.
        self._timeouts: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        #: kernel_id -> the msg_id of the execute_request the kernel is running.
        self._running: dict[str, str] = {}
        #: Summaries being built (and sent) at once: see max_concurrent_summaries.
        self.summary_slots = asyncio.Semaphore(max(1, self.max_concurrent_summaries))
        taps.on_close(self._kernel_closed)
        taps.observers.append(self._observe)

    async def executor(self, kernel_id: str) -> KernelExecutor:
        """The kernel's executor, created on first use (once, however many requests ask at
        the same time).

        Raises:
            UnknownKernel: no such running kernel.
        """
        executor = self.executors.get(kernel_id)
        if executor is None:
            tap = await self.taps.ensure(kernel_id)
            executor = self.executors.get(kernel_id)  # made by a request that also waited
            if executor is None:
                executor = self.executors[kernel_id] = KernelExecutor(tap, self)
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
        while True:
            # A kernel that restarts while the request waits for it closes the executor it
            # waited on (a lifecycle mark, see _observe): the next one is the new kernel's.
            executor = await self.executor(kernel_id)
            msg_id = await executor.execute(
                code, allow_stdin=allow_stdin, stop_on_error=stop_on_error
            )
            if msg_id is not None:
                break
        if timeout is not None:
            self._timeouts[msg_id] = timeout
            if self._running.get(kernel_id) == msg_id:  # it started already
                self._start_timer(kernel_id, msg_id)
        return msg_id

    def sent(self, kernel_id: str, msg_id: str, head: int) -> None:
        """An execution was sent when the transcript's head was ``head``."""
        self._sent[msg_id] = (kernel_id, head)
        if len(self._sent) > MAX_SENT:
            self._sent.popitem(last=False)

    def answer(self, kernel_id: str, msg_id: str, value: str) -> bool:
        executor = self.executors.get(kernel_id)
        return executor is not None and executor.answer(msg_id, value)

    async def summary(self, kernel_id: str, msg_id: str) -> ExecutionSummary | None:
        """The execution's summary, rebuilt from the transcript page by page (in linear
        time, each page off the event loop) in one of the :attr:`summary_slots`; None if
        nothing is known of it."""
        async with self.summary_slots:
            return await self.build_summary(kernel_id, msg_id)

    async def build_summary(self, kernel_id: str, msg_id: str) -> ExecutionSummary | None:
        """:meth:`summary` for a caller that holds one of the :attr:`summary_slots`."""
        builder = SummaryBuilder(
            msg_id, max_text=self.summary_max_text, max_output_bytes=self.summary_max_output_bytes
        )
        # Before reading: a quick execution can finish while the read awaits, and then it
        # is no longer "sent but not seen" (its records may have missed this read).
        sent = self._sent.get(msg_id)
        loop = asyncio.get_running_loop()
        cursor = 0
        while True:
            page = await self.store.read(
                kernel_id, cursor, SUMMARY_PAGE, parent=msg_id, max_bytes=SUMMARY_PAGE_BYTES
            )
            await loop.run_in_executor(None, builder.feed, page.records)
            if not page.records:
                break
            cursor = page.records[-1].seq
        sent_after = sent[1] if sent is not None and sent[0] == kernel_id else None
        start = builder.first_seq if builder.first_seq is not None else sent_after
        if start is not None:
            builder.feed_marks(await self.store.marks(kernel_id, start))
        summary = builder.result(sent_after=sent_after)
        if summary is not None and summary.status not in UNFINISHED:
            self._cancel_timer(msg_id)  # (still "sent": an aborted one has no records)
        return summary

    async def interrupt(self, kernel_id: str, msg_id: str) -> None:
        """Interrupt the kernel if it is running execution ``msg_id`` (SIGINT for
        ipykernel), and return at once.

        Raises:
            UnknownKernel: no such running kernel.
            UnknownExecution: nothing is known of ``msg_id`` on it.
            ExecutionNotRunning: it is queued or finished: interrupting the kernel now
                would interrupt another execution.
        """
        if kernel_id not in self.taps.kernel_manager:
            raise UnknownKernel(kernel_id)
        summary = await self.summary(kernel_id, msg_id)
        if summary is None:
            raise UnknownExecution(msg_id)
        running = self._running.get(kernel_id)
        if summary.status != "running" or (running is not None and running != msg_id):
            raise ExecutionNotRunning(f"execution {msg_id!r} is {summary.status}, not running")
        await self.taps.kernel_manager.interrupt_kernel(kernel_id)

    # -- following the records --------------------------------------------------------

    def _observe(self, record: Record) -> None:
        """Tap observer: which execution each kernel runs, when it starts and ends."""
        message = record.message
        if message.msg_type != "status":
            return
        kernel_id = record.kernel_id
        state = message.execution_state
        if state in LIFECYCLE_STATES:
            self._running.pop(kernel_id, None)
            executor = self.executors.pop(kernel_id, None)
            if executor is not None:
                executor.close()  # its sockets were on the kernel that went
            for msg_id, (kernel, _) in list(self._sent.items()):
                if kernel == kernel_id:
                    self._cancel_timer(msg_id)
            return
        parent = message.parent_msg_id
        if parent is None or message.parent_msg_type != "execute_request":
            return
        if state == "busy":
            self._running[kernel_id] = parent
            if parent in self._timeouts:
                self._start_timer(kernel_id, parent)
        elif state == "idle":
            if self._running.get(kernel_id) == parent:
                del self._running[kernel_id]
            self._forget(parent)

    def _start_timer(self, kernel_id: str, msg_id: str) -> None:
        seconds = self._timeouts.pop(msg_id, None)
        if seconds is None or msg_id in self._timers:
            return
        loop = asyncio.get_running_loop()
        self._timers[msg_id] = loop.call_later(seconds, self._on_timeout, kernel_id, msg_id)

    def _on_timeout(self, kernel_id: str, msg_id: str) -> None:
        self._timers.pop(msg_id, None)
        if self._running.get(kernel_id) != msg_id:
            return
        self.log.info("Execution %s hit its timeout; interrupting kernel %s", msg_id, kernel_id)
        task = asyncio.ensure_future(self.taps.kernel_manager.interrupt_kernel(kernel_id))
        task.add_done_callback(self._interrupted)

    def _interrupted(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.error("Interrupting on a timeout failed: %s", task.exception())

    def _cancel_timer(self, msg_id: str) -> None:
        self._timeouts.pop(msg_id, None)
        timer = self._timers.pop(msg_id, None)
        if timer is not None:
            timer.cancel()

    def _forget(self, msg_id: str) -> None:
        self._cancel_timer(msg_id)
        self._sent.pop(msg_id, None)

    def _kernel_closed(self, kernel_id: str, head: int) -> None:
        self._running.pop(kernel_id, None)
        executor = self.executors.pop(kernel_id, None)
        if executor is not None:
            executor.close()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for executor in self.executors.values():
            executor.close()
        self.executors.clear()
