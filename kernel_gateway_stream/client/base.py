"""What the two clients share besides the calls: settings, headers, streams to follow."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from . import api
from .callbacks import EXECUTION_ENDS
from .resume import Backoff, Reconnect, ResumableStream

__all__ = ["ClientBase"]

log = logging.getLogger("kernel_gateway_stream.client")


class ClientBase:
    """Settings and stream bookkeeping of :class:`GatewayClient` and
    :class:`SyncGatewayClient`; no I/O.

    Args:
        url: the server's base URL; default ``$KGS_URL`` or ``http://127.0.0.1:8888``.
        token: the API token; default ``$KGS_TOKEN`` or ``$JUPYTER_TOKEN``.
        request_timeout: seconds for each plain request.
        connect_timeout: seconds to open a connection.
        idle_timeout: seconds an event stream may stay silent before it is taken for
            dropped and resumed (the gateway sends a keep-alive every 15 s).
        reconnect_attempts: retries of one outage of an event stream before it fails with
            :class:`GatewayUnreachable` (default: no limit but ``reconnect_deadline``).
        reconnect_delay: the first pause before resuming; it doubles with each retry...
        reconnect_max_delay: ...up to this.
        reconnect_deadline: seconds after which an outage fails with
            :class:`GatewayUnreachable`.
        on_reconnect: called with a :class:`Reconnect` before each resume of a stream.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        request_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        idle_timeout: float | None = 60.0,
        reconnect_attempts: int | None = None,
        reconnect_delay: float = 0.1,
        reconnect_max_delay: float = 5.0,
        reconnect_deadline: float = 60.0,
        on_reconnect: Callable[[Reconnect], Any] | None = None,
    ) -> None:
        self.url = (url or os.environ.get("KGS_URL") or "http://127.0.0.1:8888").rstrip("/")
        self.token = token or os.environ.get("KGS_TOKEN") or os.environ.get("JUPYTER_TOKEN")
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.backoff = Backoff(
            first_delay=reconnect_delay,
            max_delay=reconnect_max_delay,
            give_up_after=reconnect_deadline,
            max_attempts=reconnect_attempts,
        )
        self.on_reconnect = on_reconnect

    def _http_options(self) -> dict[str, Any]:
        """The arguments of the httpx client."""
        return {
            "base_url": self.url,
            "headers": {"Authorization": f"token {self.token}"} if self.token else {},
            "timeout": httpx.Timeout(self.request_timeout, connect=self.connect_timeout),
        }

    def _stream_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(
            self.request_timeout, connect=self.connect_timeout, read=self.idle_timeout
        )

    def _kernel_stream(
        self, kernel_id: str, since: int | None, filters: api.StreamFilters
    ) -> ResumableStream:
        unknown = sorted(set(filters) - api.StreamFilters.__optional_keys__)
        if unknown:
            raise TypeError(f"stream() got unexpected keyword arguments: {', '.join(unknown)}")
        path = api.stream_path(kernel_id, filters)
        ends = frozenset({"kernel_shutdown"})
        return ResumableStream(path, since, ends_with=ends, backoff=self.backoff)

    @contextlib.contextmanager
    def _connecting(self, stream: ResumableStream) -> Iterator[dict[str, str]]:
        """Around one connection of ``stream``: its headers, and its failure told to it.

        Raises:
            GatewayUnreachable: the first connection failed.
        """
        headers = stream.connect()
        try:
            yield headers
        except httpx.TransportError as error:
            stream.failed(self.url, error)

    def _execution_stream(
        self, kernel_id: str, msg_id: str, since: int | None, answered_before: bool = False
    ) -> ResumableStream:
        return ResumableStream(
            api.events_path(kernel_id, msg_id),
            since,
            ends_with=EXECUTION_ENDS,
            backoff=self.backoff,
            established=answered_before,
        )

    def _reconnecting(self, stream: ResumableStream, now: float) -> Reconnect:
        """The next attempt of a stream that stopped, announced.

        Raises:
            GatewayUnreachable: the stream's outage lasted too long.
        """
        reconnect = stream.reconnect(self.url, now, random.random())
        log.info(
            "%s: %s; resuming after seq %s in %.2f s",
            reconnect.path,
            reconnect.reason,
            reconnect.since,
            reconnect.delay,
        )
        if self.on_reconnect is not None:
            self.on_reconnect(reconnect)
        return reconnect
