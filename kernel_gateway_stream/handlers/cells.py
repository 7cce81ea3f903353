"""``GET /api/kernels/{id}/cells``: each notebook cell's latest execution, ready to show.

What a JupyterLab page needs, in one request, when it opens a notebook (or is reloaded)
on a kernel that ran cells while the page was away: for every cell the kernel ran in its
current life (since its last restart), the latest execution's status, execution count and
outputs, folded as an output area folds them (see :mod:`..core.outputs`), so that a cell
that printed 100,000 progress updates costs kilobytes. Cells are known by the request
marks the channels socket records (JupyterLab's ``metadata.cellId``).

Parameters: ``since`` (only executions with a record after this seq, or still running;
default 0). The answer::

    {"kernel_id", "head", "epoch", "life_start", "truncated",
     "executions": [{"cell_id", "msg_id", "status", "execution_count", "reason",
                     "first_seq", "last_seq", "outputs", "display_ids", "gaps",
                     "truncated"}, ...]}

``head`` is the last seq the answer covers: a page that is connected applies live
messages after it. Authorization is the channels socket's (``execute`` on ``kernels``).
"""

from __future__ import annotations

import asyncio

from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.errors import LocalError
from ..core.messages import dumps_json
from ..core.outputs import CellRestorer
from .common import KERNEL_ACTION, ServicesMixin, parse_seq, requires

__all__ = ["CellsHandler"]

#: Records and bytes read per page (each page is folded off the event loop).
PAGE = 5000
PAGE_BYTES = 8 * 1024 * 1024
#: Answers folded and sent at once across the gateway: each holds a restorer's outputs
#: (bounded per cell, see CellRestorer) and its body; more requests wait their turn.
CONCURRENT = 2


_SLOTS: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _slots() -> asyncio.Semaphore:
    """The slots of the running loop (a test suite runs several loops in turn)."""
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        _SLOTS.clear()  # a loop is not run again once another has started
        slots = _SLOTS[loop] = asyncio.Semaphore(CONCURRENT)
    return slots


class CellsHandler(ServicesMixin, APIHandler):
    """Each cell's latest execution (see the module docstring)."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def get(self, kernel_id: str) -> None:  # type: ignore[override]
        try:
            await self._get(kernel_id)
        except LocalError as error:
            self.write_error_json(error)

    async def _get(self, kernel_id: str) -> None:
        async with _slots():
            await self._answer(kernel_id)

    async def _answer(self, kernel_id: str) -> None:
        since = parse_seq("since", self.get_argument("since", None)) or 0
        store = self.services.store
        # Cut: a page applying live frames above the head answered shows none twice.
        head = (await self.services.locate(kernel_id, since, cut=True)).head
        restarts = [
            mark.seq
            for mark in await store.marks(kernel_id, 0)
            if mark.message.msg_type == "status" and mark.message.execution_state == "restarting"
        ]
        start = restarts[-1] if restarts else 0
        restorer = CellRestorer()
        loop = asyncio.get_running_loop()
        cursor = start
        while cursor < head:
            page = await store.read(kernel_id, cursor, PAGE, until=head, max_bytes=PAGE_BYTES)
            if not page.records:
                break
            await loop.run_in_executor(None, restorer.feed, page.records)
            cursor = page.records[-1].seq
        executions = await loop.run_in_executor(None, lambda: restorer.result(since=since))
        self.set_header("Content-Type", "application/json")
        self.finish(
            dumps_json(  # strict: JSON.parse refuses NaN/Infinity (none is parsed from a kernel)
                {
                    "kernel_id": kernel_id,
                    "head": head,
                    "epoch": len(restarts),
                    "life_start": start,
                    "truncated": restorer.truncated,
                    "executions": executions,
                }
            )
        )
