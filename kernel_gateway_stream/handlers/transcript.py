"""``GET /api/kernels/{id}/transcript``: a kernel's recorded IOPub messages.

Parameters: ``since`` (records after this seq; default 0), ``limit`` (default 1000, at
most 10000), ``parent`` (one execution's msg_id), ``msg_type`` (repeatable), and
``format`` (``json``, the default, or ``text``: the stdout/stderr text in order, every
page of it). Works after the kernel has shut down, while its transcript is kept.

A JSON page also stops at about :data:`PAGE_BYTES` of messages (whatever ``limit`` says), so
a page of large outputs stays bounded: ``next_since`` says where the next page starts.
"""

from __future__ import annotations

import json

from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.errors import BadRequest, LocalError
from ..core.wire import encode_record_json
from ..stores.base import TranscriptPage
from .common import KERNEL_ACTION, ServicesMixin, parse_seq, requires

__all__ = ["TranscriptHandler"]

MAX_LIMIT = 10000
#: Bytes of messages a page (JSON, or each read of the text format) holds at most.
PAGE_BYTES = 16 * 1024 * 1024


class TranscriptHandler(ServicesMixin, APIHandler):
    """Reads of a kernel's transcript."""

    @web.authenticated
    @requires(KERNEL_ACTION)
    async def get(self, kernel_id: str) -> None:  # type: ignore[override]
        try:
            await self._get(kernel_id)
        except LocalError as error:
            self.write_error_json(error)

    async def _get(self, kernel_id: str) -> None:
        since = parse_seq("since", self.get_argument("since", None)) or 0
        limit = parse_seq("limit", self.get_argument("limit", None))
        limit = 1000 if limit is None else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}")
        output = self.get_argument("format", "json")
        if output not in ("json", "text"):
            raise BadRequest("format must be 'json' or 'text'")
        parent = self.get_argument("parent", None) or None
        msg_types = [name for value in self.get_arguments("msg_type") for name in value.split(",")]
        store = self.services.store
        location = await self.services.locate(kernel_id, since)
        if output == "text":
            await self._text(kernel_id, since, location.head, parent)
            return
        page = await store.read(
            kernel_id,
            since,
            limit,
            parent=parent,
            msg_types=msg_types or None,
            max_bytes=PAGE_BYTES,
        )
        self._json(kernel_id, page, since, location.running)

    def _json(self, kernel_id: str, page: TranscriptPage, since: int, running: bool) -> None:
        next_since = page.records[-1].seq if page.records else max(since, page.first_seq - 1)
        discarded = (
            {"first_seq": page.discarded[0], "last_seq": page.discarded[1]}
            if page.discarded
            else None
        )
        head = json.dumps(
            {
                "kernel_id": kernel_id,
                "running": running,
                "head": page.head,
                "first_seq": page.first_seq,
                "next_since": next_since,
                "discarded": discarded,
            }
        ).encode()
        body = b",".join(encode_record_json(record) for record in page.records)
        self.finish(head[:-1] + b',"records":[' + body + b"]}")

    async def _text(self, kernel_id: str, since: int, head: int, parent: str | None) -> None:
        """Every page up to the head at request time, each flushed before the next read."""
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        cursor = since
        while True:
            page = await self.services.store.read(
                kernel_id,
                cursor,
                MAX_LIMIT,
                until=head,
                parent=parent,
                msg_types=("stream",),
                max_bytes=PAGE_BYTES,
            )
            if not page.records:
                break
            self.write(utf8("".join(record.message.text or "" for record in page.records)))
            await self.flush()
            cursor = page.records[-1].seq
        self.finish(set_content_type="text/plain; charset=utf-8")


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (a kernel may send one) becomes U+FFFD."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
