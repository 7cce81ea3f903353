"""Which kernel commands the gateway rewrites to start ipykernel with lossless IOPub."""

from __future__ import annotations

import sys

from kernel_gateway_stream.kernels import LAUNCHER_MODULE, lossless_ipykernel_command


def test_ipykernel_on_our_interpreter_is_rewritten() -> None:
    for module in ("ipykernel_launcher", "ipykernel"):
        command = [sys.executable, "-m", module, "-f", "conn.json"]
        assert lossless_ipykernel_command(command, sys.executable) == [
            sys.executable,
            "-m",
            LAUNCHER_MODULE,
            "-f",
            "conn.json",
        ]


def test_other_commands_are_left_alone() -> None:
    for command in (
        ["/opt/other/python", "-m", "ipykernel_launcher", "-f", "c.json"],
        [sys.executable, "-m", "other_kernel", "-f", "c.json"],
        ["julia", "-i", "kernel.jl", "c.json"],
        [sys.executable],
    ):
        assert lossless_ipykernel_command(command, sys.executable) == command
