"""The kinds of kernel the gateway reaches, as siblings (see :mod:`.base` for the seams).

* :mod:`.local`: the kernel manager of each kernel the gateway starts itself;
* :mod:`.attached`, :mod:`.attaching`: kernels reached by connection info;
* :mod:`.mapping`: the kernel manager of them all;
* :mod:`.zmq_kernel`: ZMQ sockets on any kernel reachable by connection info;
* :mod:`.upstream`, :mod:`.upstream_channels`, :mod:`.upstream_manager`: kernels behind
  another gateway, over its WebSocket;
* :mod:`.netns`, :mod:`.sandbox`: kernels confined in a network or a sandbox of their own;
* :mod:`.links`: the one place that tells the kinds apart (how each is reached).

Imported by the recording registry, the cluster node, the executions, the handlers and
the application; imports nothing of the package but :mod:`..core` and :mod:`..memory`.

The names below are the ones configuration refers to
(``--ServerApp.kernel_manager_class=kernel_gateway_stream.kernels.StreamMappingKernelManager``).
"""

from .local import (
    LAUNCHER_MODULE,
    StreamKernelManager,
    lossless_ipykernel_command,
    without_secrets,
)
from .mapping import StreamMappingKernelManager, until_settled

__all__ = [
    "LAUNCHER_MODULE",
    "StreamKernelManager",
    "StreamMappingKernelManager",
    "lossless_ipykernel_command",
    "until_settled",
    "without_secrets",
]
