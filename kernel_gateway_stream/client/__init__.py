"""A Python client for kernel_gateway_stream: async (:class:`GatewayClient`) and blocking
(:class:`SyncGatewayClient`), on httpx.

    async with GatewayClient("http://127.0.0.1:8888", token=TOKEN) as gateway:
        kernel_id = await gateway.start_kernel()
        result = await gateway.execute(kernel_id, "print('hi')", on_stdout=print)
        assert result.status == "ok"

``execute`` follows its execution's events and, if the connection drops, resumes from the
last event it got: every line once, and the final result, whatever the network does.

The modules: :mod:`.sse` parses Server-Sent Events, :mod:`.api` builds the requests and
reads the answers, :mod:`.resume` decides when and where a stream resumes,
:mod:`.callbacks` routes an execution's events to the caller; all four are pure.
:mod:`.aio` and :mod:`.sync` are the two thin clients that do the I/O.

Imported by the ``kgs`` command line and by programs; it imports nothing of the gateway
but :mod:`..core.errors` (it runs where the gateway does not).
"""

from ..core.errors import (
    AuthenticationError,
    ClientError,
    GatewayHTTPError,
    GatewayUnreachable,
    KernelDied,
    NotFound,
)
from .aio import Event, ExecutionResult, GatewayClient
from .resume import Reconnect
from .sync import SyncGatewayClient

__all__ = [
    "AuthenticationError",
    "ClientError",
    "Event",
    "ExecutionResult",
    "GatewayClient",
    "GatewayHTTPError",
    "GatewayUnreachable",
    "KernelDied",
    "NotFound",
    "Reconnect",
    "SyncGatewayClient",
]
