"""Start ipykernel with an IOPub socket that queues instead of dropping.

``python -m kernel_gateway_stream.kernel_launcher -f CONNECTION_FILE`` is
``python -m ipykernel_launcher -f CONNECTION_FILE`` with one change: the kernel's IOPub
socket gets ``SNDHWM=0`` before it binds. By default a PUB socket silently drops what it
cannot queue for a subscriber (1000 messages), which on a busy machine loses output of a
fast ``print`` loop before it ever reaches the gateway. With no high-water mark the
kernel holds the backlog in memory instead, and the gateway's Tap drains it.

The option must be set before ``bind``: libzmq copies a listening socket's options when
it binds, and every subscriber's queue inherits them.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import zmq
from ipykernel.kernelapp import IPKernelApp

__all__ = ["LosslessIOPubKernelApp", "main"]


class _LoopbackTransportNotice(logging.Filter):
    """ipykernel warns, at every start, that TCP carries messages unencrypted. Between the
    gateway and a kernel it started on the loopback interface nothing else is on the
    wire: the notice goes to INFO, so operators see warnings only for what needs them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Kernel is running over TCP without encryption"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            return record.levelno >= logging.getLogger(record.name).getEffectiveLevel()
        return True


class LosslessIOPubKernelApp(IPKernelApp):
    """ipykernel's kernel application with an IOPub socket that never drops."""

    def init_sockets(self) -> None:
        if self.transport == "tcp" and _loopback(self.ip):
            self.log.addFilter(_LoopbackTransportNotice())
        super().init_sockets()

    def init_iopub(self, context: zmq.Context[Any]) -> None:
        make_socket = context.socket

        def socket(socket_type: int, *args: Any, **kwargs: Any) -> Any:
            created = make_socket(socket_type, *args, **kwargs)
            if socket_type in (zmq.PUB, zmq.XPUB):
                created.setsockopt(zmq.SNDHWM, 0)
            return created

        context.socket = socket  # type: ignore[method-assign]
        try:
            super().init_iopub(context)
        finally:
            del context.socket


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def main() -> None:
    LosslessIOPubKernelApp.launch_instance()


if __name__ == "__main__":
    main()
