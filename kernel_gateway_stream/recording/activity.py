"""The jupyter_server activity bridge: what jupyter_server's own IOPub activity watcher
keeps (``last_activity`` for culling and the kernels API, ``execution_state`` from status
messages), kept from the records the gateway makes instead, without a second IOPub socket
and a full deserialize of every message.

Imported by :mod:`.registry` (which makes one bridge) and :mod:`.recorder` (which feeds
its kernel's :class:`KernelActivity`); it imports nothing of the gateway but the message
type.
"""

from __future__ import annotations

from typing import Any

from jupyter_server._tz import utcnow

from ..core.errors import MalformedMessage
from ..core.messages import KernelMessage

__all__ = ["ActivityBridge", "KernelActivity"]


#: The control thread's key among the busy shells (no subshell id is empty).
CONTROL = ""
#: msg_types whose tracking a bridge remembers at most (see ActivityBridge.tracked).
TRACKED_CACHE = 256


class ActivityBridge:
    """jupyter_server's kernel manager (``kernel_manager``), seen from the recorders."""

    def __init__(self, kernel_manager: Any) -> None:
        self.kernel_manager = kernel_manager
        #: ``track_message_type`` by msg_type (asked once per message: a trait read and a
        #: list scan each time), forgotten when the untracked types change; at most
        #: TRACKED_CACHE types (a kernel chooses its msg_types).
        self._tracked: dict[str | None, bool] = {}
        observe = getattr(kernel_manager, "observe", None)
        if observe is not None and kernel_manager.has_trait("untracked_message_types"):
            observe(lambda _: self._tracked.clear(), "untracked_message_types")

    def tracked(self, msg_type: str | None) -> bool:
        """Whether jupyter_server counts a message of ``msg_type`` as activity."""
        known = self._tracked.get(msg_type)
        if known is None:
            if len(self._tracked) >= TRACKED_CACHE:
                self._tracked.clear()
            known = self._tracked[msg_type] = bool(self.kernel_manager.track_message_type(msg_type))
        return known

    def of(self, kernel_id: str, kernel: Any) -> KernelActivity:
        """The activity of ``kernel`` (the kernel manager of ``kernel_id``)."""
        return KernelActivity(self, kernel_id, kernel)

    def retire_watcher(self, kernel_id: str) -> None:
        """Close jupyter_server's own IOPub activity watcher for a recorded kernel.

        jupyter_server opens a second IOPub socket per kernel and deserializes every message
        on it to keep ``last_activity`` and ``execution_state``; the recorder already does
        that (:meth:`KernelActivity.saw`). Its ``stop_watching_activity`` would also run a
        pending restart's cleanup, so only the socket is closed here, with no linger: what
        it would still send (its subscription) is for a kernel the gateway reads itself, and
        a linger would hold up the server's exit by a second.
        """
        if not hasattr(self.kernel_manager, "track_message_type"):
            return
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return
        stream = getattr(kernel, "_activity_stream", None)
        if stream is not None:
            if not stream.closed():
                stream.close(linger=0)
            kernel._activity_stream = None


class KernelActivity:
    """One kernel's activity, fed by its recorder message by message; ``last_activity`` is
    set once per batch (it is a trait, and setting one is not free)."""

    __slots__ = ("_active", "_bridge", "_busy", "_kernel", "_kernel_id")

    def __init__(self, bridge: ActivityBridge, kernel_id: str, kernel: Any) -> None:
        self._bridge = bridge
        self._kernel_id = kernel_id
        self._kernel = kernel
        self._active = False
        #: The shells busy now: None for the main shell, a subshell's id, or CONTROL.
        self._busy: set[str | None] = set()

    def saw(self, message: KernelMessage) -> None:
        """``message`` was recorded (or delivered, on a follower)."""
        bridge = self._bridge
        kernel = self._kernel
        tracked = bridge.tracked(message.parent_msg_type)
        if not self._active:
            busy = kernel.execution_state == "busy"
            self._active = tracked or busy or bridge.tracked(message.msg_type)
        state = message.execution_state
        if state is not None:
            if tracked:
                kernel.execution_state = self._kernel_state(message, state)
            elif kernel.execution_state == "starting" and state != "starting":
                kernel.execution_state = "idle"

    def _kernel_state(self, message: KernelMessage, state: str) -> str:
        """The kernel's state after ``message``'s: busy while any of its shells is
        (ipykernel 7's subshells run requests at once; a subshell going idle while the
        main shell still runs a cell left jupyter_server's state ``idle``)."""
        if state not in ("busy", "idle"):  # starting, restarting, dead: every shell
            self._busy.clear()
            return state
        if (message.parent_msg_type or "").endswith("_subshell_request"):
            shell: str | None = CONTROL  # answered on the control thread, beside any shell
        else:
            try:
                subshell = message.parent_header().get("subshell_id")
            except MalformedMessage:
                subshell = None
            shell = subshell if isinstance(subshell, str) else None
        if state == "busy":
            self._busy.add(shell)
        else:
            self._busy.discard(shell)
        return "busy" if self._busy else "idle"

    def batch_ended(self) -> None:
        """A batch of messages has been recorded."""
        if self._active:
            multi = self._bridge.kernel_manager
            multi.last_kernel_activity = self._kernel.last_activity = utcnow()
        self._active = False

    def retire_watcher(self) -> None:
        """The recorder is live: jupyter_server's own watcher can go."""
        self._bridge.retire_watcher(self._kernel_id)
