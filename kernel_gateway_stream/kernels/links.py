"""How the gateway reaches each kind of kernel: the one place that tells the kinds apart.

* :func:`link_for`: the :class:`~.base.KernelLink` of a kernel manager (a WebSocket for a
  kernel behind an upstream gateway, else ZMQ sockets from its connection info);
* :func:`describe_link`: what the store keeps of a kernel to re-attach it by connection
  info after a restart of the gateway.

Adding a kind of kernel touches :mod:`kernel_gateway_stream.kernels` alone. Imported by
the recording registry and the cluster; imports nothing above :mod:`.kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.gateway.managers import GatewayKernelManager

from .base import KernelLink
from .upstream import UpstreamKernelLink, UpstreamSettings
from .zmq_kernel import HeartbeatSettings, IOPubSettings, KernelSockets

__all__ = ["LinkSettings", "describe_link", "link_for"]


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """The options of every kind of link (the recording registry's traits)."""

    upstream: UpstreamSettings
    iopub: IOPubSettings
    #: Used for a kernel whose process the gateway does not watch (``watch_heartbeat``).
    heartbeat: HeartbeatSettings


def link_for(
    kernel_id: str,
    kernel: Any,
    sockets: KernelSockets,
    settings: LinkSettings,
    log: Any,
    *,
    on_gone: Callable[[str], None],
) -> KernelLink:
    """How to reach ``kernel`` (a kernel manager): a WebSocket for a kernel behind an
    upstream gateway (``on_gone(reason)`` is called when the upstream no longer has it),
    else ZMQ sockets from its connection info, with a heartbeat when the gateway cannot
    watch the kernel's process (``kernel.watch_heartbeat``). Called by the recording
    registry when it starts a kernel's recorder."""
    if isinstance(kernel, GatewayKernelManager):
        return UpstreamKernelLink(
            kernel_id, GatewayClient.instance(), settings.upstream, log, on_gone=on_gone
        )
    session = kernel.session
    zmq_link = sockets.link(
        kernel_id,
        kernel.get_connection_info,
        key=session.key,
        signature_scheme=session.signature_scheme,
        log=log,
    )
    zmq_link.settings = settings.iopub
    if getattr(kernel, "watch_heartbeat", False):
        zmq_link.heartbeat = settings.heartbeat
    return zmq_link


def describe_link(kernel: Any) -> dict[str, Any] | None:
    """What the store keeps to re-attach ``kernel`` (a kernel manager) after a restart of
    the gateway; None for a kernel that cannot be re-attached by connection info."""
    attachment = getattr(kernel, "attachment", None)
    if attachment is not None:
        return {"kernel_name": kernel.kernel_name, "attachment": attachment.to_json()}
    try:
        info = dict(kernel.get_connection_info())
    except Exception:  # a kernel manager of another kind: nothing to re-attach by
        return None
    if not all(isinstance(info.get(f"{c}_port"), int) and info.get(f"{c}_port") for c in _PORTS):
        return None
    key = info.get("key", b"")
    info["key"] = key.decode() if isinstance(key, bytes) else str(key)
    spec = getattr(kernel, "kernel_spec", None)
    provisioner = getattr(kernel, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    network = getattr(provisioner, "network", None)  # netns-provisioner's KernelNetwork
    return {
        "kernel_name": kernel.kernel_name,
        "attachment": {
            "connection_info": {k: info[k] for k in _LINK_FIELDS if k in info},
            "display_name": getattr(spec, "display_name", "") or kernel.kernel_name,
            "language": getattr(spec, "language", "") or "",
            "owned": True,
            "pid": pid if isinstance(pid, int) else None,
            "source": "recovered",
            "network": None if network is None else network.as_dict(),
        },
    }


_PORTS = ("shell", "iopub", "stdin", "control", "hb")
#: What is kept to re-attach a kernel: its address, its key, and its CurveZMQ key pair
#: where its transport is encrypted (as secret as the key, and kept beside it).
_LINK_FIELDS = (
    "ip",
    "transport",
    "key",
    "signature_scheme",
    "curve_publickey",
    "curve_secretkey",
    *(f"{c}_port" for c in _PORTS),
)
