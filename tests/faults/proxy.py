"""A TCP proxy between one gateway node and redis-server, which the fault harness cuts.

* :meth:`RedisProxy.cut`: every connection through it is reset, and new ones are reset as
  they come (the node sees its connection refused or reset at once);
* :meth:`RedisProxy.blackhole`: connections stay open and new ones are accepted, but no byte
  goes through either way (a partition: the node's requests wait for its timeouts); what was
  written meanwhile goes through once healed, as TCP would retransmit it;
* :meth:`RedisProxy.heal`: bytes flow again.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..integration.daemon import free_port

__all__ = ["RedisProxy"]

CHUNK = 1 << 16


class RedisProxy:
    """Listens on :attr:`port` (127.0.0.1) and forwards to ``target_port``. Runs in the
    event loop that :meth:`start`\\ s it; :meth:`close` when done."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.refusing = False
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.transports: set[asyncio.BaseTransport] = set()
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def cut(self) -> None:
        self.refusing = True
        self.flowing.set()
        self._reset_all()

    def blackhole(self) -> None:
        self.flowing.clear()

    def heal(self) -> None:
        self.refusing = False
        self.flowing.set()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self._reset_all()

    def _reset_all(self) -> None:
        for transport in list(self.transports):
            _abort(transport)
        self.transports.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            _abort(writer.transport)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:  # redis-server is down: so is the connection
            _abort(writer.transport)
            return
        pair = (writer.transport, upstream_writer.transport)
        self.transports.update(pair)
        try:
            await asyncio.gather(
                self._pump(reader, upstream_writer), self._pump(upstream_reader, writer)
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for transport in pair:
                self.transports.discard(transport)
                _abort(transport)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(CHUNK):
            await self.flowing.wait()
            if writer.transport.is_closing():
                return
            writer.write(data)
            await writer.drain()
        # One side ended: end the other, and with it the other pump.
        with contextlib.suppress(OSError):
            writer.transport.abort()


def _abort(transport: asyncio.BaseTransport) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        transport.abort()  # type: ignore[attr-defined]
