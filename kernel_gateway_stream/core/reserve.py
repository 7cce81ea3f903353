"""What still passes a full byte budget: an execution's end, never lost behind a flood.

Two buffers between a kernel and its transcript are bounded in bytes and drop what does not
fit, saying so with a gap record: the IOPub backlog a kernel's messages wait in before they
are numbered (``iopub_backlog_bytes``), and the records numbered but not yet durable
(``max_pending_bytes``). What they drop must be output, never what tells readers that an
execution ended or that something is missing: a ``status`` message dropped with a flood
leaves its execution ``running`` on every surface for good.

So past the budget a *control* record, a ``status`` (``idle`` ends an execution), or one of
the gateway's own marks (a gap, a lifecycle status or request, a request mark; see
:mod:`.marks`), of at most :data:`SMALL` bytes, has a reserve of an eighth of the budget.
Output is refused at the budget itself, so a flood of small prints cannot use the reserve
up. Kernel code can publish statuses of its own, and so fill the reserve: then its own
executions may lose their ``idle``, which costs only that kernel, and the memory stays
within budget and reserve.
"""

from __future__ import annotations

from .marks import REQUEST_MSG_TYPE, is_mark
from .messages import KernelMessage

__all__ = ["CONTROL_TYPES", "RESERVE_DIVISOR", "SMALL", "fits", "is_control"]

#: msg_types that are control records besides the marks :func:`.marks.is_mark` knows.
CONTROL_TYPES = frozenset({"status", REQUEST_MSG_TYPE})

#: A control record larger than this gets no reserve (a status is a few hundred bytes).
SMALL = 4096
#: The reserve is the budget divided by this.
RESERVE_DIVISOR = 8


def fits(used: int, cost: int, budget: int, control: bool) -> bool:
    """Whether a record of ``cost`` bytes may join ``used`` bytes under ``budget`` (0: no
    budget); a control record (see the module docstring) may go into the reserve."""
    if not budget or used + cost <= budget:
        return True
    return control and cost <= SMALL and used + cost <= budget + budget // RESERVE_DIVISOR


def is_control(message: KernelMessage) -> bool:
    """A ``status``, or a mark of the gateway's own: what the reserve is for."""
    return message.msg_type in CONTROL_TYPES or is_mark(message)
