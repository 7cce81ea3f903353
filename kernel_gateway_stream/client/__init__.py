"""A Python client for kernel_gateway_stream: async (:class:`GatewayClient`) and sync
(:class:`SyncGatewayClient`), on the dependencies the gateway already has (tornado).

    async with GatewayClient("http://127.0.0.1:8888", token=TOKEN) as gateway:
        kernel_id = await gateway.start_kernel()
        result = await gateway.execute(kernel_id, "print('hi')", on_stdout=print)
        assert result.status == "ok"

``execute`` follows its execution's events and, if the connection drops, resumes from the
last event it got: every line once, and the final result, whatever the network does.
"""

from ..core.errors import (
    AuthenticationError,
    ClientError,
    GatewayHTTPError,
    KernelDied,
    NotFound,
)
from .aio import Event, ExecutionResult, GatewayClient
from .sync import SyncGatewayClient

__all__ = [
    "AuthenticationError",
    "ClientError",
    "Event",
    "ExecutionResult",
    "GatewayClient",
    "GatewayHTTPError",
    "KernelDied",
    "NotFound",
    "SyncGatewayClient",
]
