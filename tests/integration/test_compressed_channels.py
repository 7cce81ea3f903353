"""The channels WebSocket with permessage-deflate: a server configured to compress
(``ServerApp.websocket_compression_options``) writes through tornado's ``write_message``,
not the fan-out's own framing, and loses nothing either way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from traitlets.config import Config

from .test_channels import FLOOD_CODE, FLOOD_TEXT, assert_contiguous


@pytest.fixture
def jp_server_config(transcript_path: str) -> Config:
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"kernel_gateway_stream": True},
                "websocket_compression_options": {},
            },
            "SQLiteTranscriptStore": {"path": transcript_path},
        }
    )


async def test_compressed_and_plain_clients_of_one_kernel_get_the_whole_flood(
    start_kernel: Any, connect: Any
) -> None:
    """Invariants 2, 3: a compressing client (each protocol) and one that does not
    compress watch one flood; each gets every line once, in order."""
    kernel_id = await start_kernel()
    compressed = [
        await connect(kernel_id, protocol="v1", compression=True),
        await connect(kernel_id, protocol="legacy", compression=True),
    ]
    plain = await connect(kernel_id, protocol="v1")
    for ws in compressed:
        assert ws.ws.protocol._compressor is not None, "permessage-deflate was not agreed"
    assert plain.ws.protocol._compressor is None
    msg_id = plain.execute(FLOOD_CODE)
    results = await asyncio.gather(*(ws.until_idle(msg_id) for ws in [*compressed, plain]))
    for received in results:
        assert received.text() == FLOOD_TEXT
        assert_contiguous(received)
    # The server compressed for those that asked (a flood of digits deflates well), and
    # only for them.
    for ws in compressed:
        assert ws.ws.protocol._wire_bytes_in < ws.ws.protocol._message_bytes_in / 2
    assert plain.ws.protocol._wire_bytes_in > plain.ws.protocol._message_bytes_in
