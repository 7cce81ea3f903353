"""handlers/channels.py ``_write_after``: what a socket did not take of a write goes to
tornado's stream from the first byte not sent, piece by piece, never joined."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from tornado.iostream import IOStream

from kernel_gateway_stream.handlers.channels import _write_after


class Recording:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.views = 0

    def write(self, data: Any) -> asyncio.Future[None]:
        self.views += isinstance(data, memoryview)
        self.writes.append(bytes(data))
        return cast(asyncio.Future[None], object())


def _after(pieces: list[bytes], skip: int) -> Recording:
    stream = Recording()
    _write_after(cast(IOStream, stream), pieces, skip)
    return stream


def test_nothing_sent_writes_every_piece_as_it_is() -> None:
    stream = _after([b"abc", b"defg", b"h"], 0)
    assert stream.writes == [b"abc", b"defg", b"h"]
    assert stream.views == 0


def test_a_cut_inside_a_piece_writes_its_rest_then_the_others() -> None:
    stream = _after([b"abc", b"defg", b"h"], 5)
    assert stream.writes == [b"fg", b"h"]
    assert stream.views == 1


def test_a_cut_between_pieces_skips_those_sent() -> None:
    assert _after([b"abc", b"defg", b"h"], 3).writes == [b"defg", b"h"]
    assert _after([b"abc", b"defg", b"h"], 7).writes == [b"h"]
