"""The kinds of kernel the gateway reaches, as siblings (see :mod:`.base` for the seams).

* :mod:`.local`: the kernel managers of the kernels the gateway starts itself;
* :mod:`.zmq_kernel`: ZMQ sockets on any kernel reachable by connection info.

The names below are the ones configuration refers to
(``--ServerApp.kernel_manager_class=kernel_gateway_stream.kernels.StreamMappingKernelManager``).
"""

from .local import (
    LAUNCHER_MODULE,
    StreamKernelManager,
    StreamMappingKernelManager,
    lossless_ipykernel_command,
    until_settled,
    without_secrets,
)

__all__ = [
    "LAUNCHER_MODULE",
    "StreamKernelManager",
    "StreamMappingKernelManager",
    "lossless_ipykernel_command",
    "until_settled",
    "without_secrets",
]
