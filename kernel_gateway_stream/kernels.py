"""The per-kernel manager the gateway uses for local kernels."""

from __future__ import annotations

import os
import sys

from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

__all__ = ["LAUNCHER_MODULE", "StreamKernelManager", "lossless_ipykernel_command"]

LAUNCHER_MODULE = "kernel_gateway_stream.kernel_launcher"
_IPYKERNEL_MODULES = ("ipykernel_launcher", "ipykernel")


def lossless_ipykernel_command(command: list[str], executable: str) -> list[str]:
    """``command`` with ipykernel started through :mod:`kernel_gateway_stream.kernel_launcher`.

    Only a command that runs ipykernel as a module (``python -m ipykernel_launcher ...``)
    on ``executable`` itself (the interpreter the gateway runs on, which has this package)
    is changed; any other command comes back as it is.
    """
    if len(command) < 3 or command[1] != "-m" or command[2] not in _IPYKERNEL_MODULES:
        return command
    if os.path.realpath(command[0]) != os.path.realpath(executable):
        return command
    return [command[0], "-m", LAUNCHER_MODULE, *command[3:]]


class StreamKernelManager(ServerKernelManager):
    """jupyter_server's kernel manager, launching local ipykernels with lossless IOPub."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        command: list[str] = super().format_kernel_cmd(extra_arguments)
        return lossless_ipykernel_command(command, sys.executable)
