"""The synchronous client: :class:`GatewayClient` on an event loop of its own."""

from __future__ import annotations

import asyncio
from typing import Any

from .aio import ExecutionResult, GatewayClient

__all__ = ["SyncGatewayClient"]


class SyncGatewayClient:
    """Blocking calls with the same arguments as :class:`GatewayClient`'s; callbacks run in
    the calling thread. Not for use inside a running event loop."""

    def __init__(self, url: str | None = None, token: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = GatewayClient(url, token, **options)

    def __enter__(self) -> SyncGatewayClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()
        self._loop.close()

    def _run(self, call: Any) -> Any:
        return self._loop.run_until_complete(call)

    def start_kernel(self, name: str | None = None) -> str:
        kernel_id: str = self._run(self._client.start_kernel(name))
        return kernel_id

    def list_kernels(self) -> list[dict[str, Any]]:
        kernels: list[dict[str, Any]] = self._run(self._client.list_kernels())
        return kernels

    def interrupt(self, kernel_id: str) -> None:
        self._run(self._client.interrupt(kernel_id))

    def restart(self, kernel_id: str) -> None:
        self._run(self._client.restart(kernel_id))

    def shutdown(self, kernel_id: str) -> None:
        self._run(self._client.shutdown(kernel_id))

    def transcript(self, kernel_id: str, **params: Any) -> dict[str, Any]:
        page: dict[str, Any] = self._run(self._client.transcript(kernel_id, **params))
        return page

    def transcript_text(self, kernel_id: str, **params: Any) -> str:
        text: str = self._run(self._client.transcript_text(kernel_id, **params))
        return text

    def execute(self, kernel_id: str, code: str, **options: Any) -> ExecutionResult:
        result: ExecutionResult = self._run(self._client.execute(kernel_id, code, **options))
        return result
