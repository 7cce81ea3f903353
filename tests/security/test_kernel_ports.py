"""Another local user and a kernel's IOPub: TCP on loopback is open to them, IPC is not.

Jupyter's TCP transport binds a kernel's five ports on 127.0.0.1, and ZMQ asks nothing of
a subscriber: any local process, of any user, can subscribe to IOPub and read everything
the kernel prints (the HMAC key only signs messages). Item 7 of the kernel-takeover
issue: with ``--KernelManager.transport=ipc`` the ports are Unix sockets in the Jupyter
runtime directory (0700), which another user cannot open. Against a real daemon and a
real ipykernel; the other user is ``nobody``, with the system's Python and no pyzmq, so
the spy speaks ZMTP 3 itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from typing import Any

import pytest

from ..integration.daemon import Daemon
from ..timing import seconds
from .test_secrets import run_in_kernel

#: A ZMQ SUB socket in plain Python (ZMTP 3.0, NULL mechanism, RFC 23/ZMTP): connects to
#: ``argv[1]`` (``tcp://host:port`` or a Unix socket's path), subscribes to everything,
#: prints ``subscribed`` once the handshake is done, then collects frames until one holds
#: ``argv[2]`` or ``argv[3]`` seconds pass. Prints one JSON line.
SPY = r"""
import json, socket, struct, sys, time
url, marker, patience = sys.argv[1], sys.argv[2].encode(), float(sys.argv[3])
result = {"connected": False, "error": None, "seen": False}
try:
    if url.startswith("tcp://"):
        host, port = url[6:].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=patience)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(patience)
        sock.connect(url)
    result["connected"] = True

    def read(n):
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError("closed")
            data += chunk
        return data

    def frame():
        flags = read(1)[0]
        size = struct.unpack(">Q", read(8))[0] if flags & 2 else read(1)[0]
        return flags, read(size)

    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0")
    sock.sendall(greeting + b"\0" * 32)  # as-server 0, then filler
    read(64)
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 3) + b"SUB"
    sock.sendall(b"\x04" + bytes([len(ready)]) + ready)
    while not (frame()[0] & 4):
        pass
    sock.sendall(b"\x00\x01\x01")  # a message: subscribe to every topic
    print("subscribed", flush=True)
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline and not result["seen"]:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            result["seen"] = marker in frame()[1]
        except socket.timeout:
            break
except Exception as error:
    result["error"] = type(error).__name__ + ": " + str(error)
print(json.dumps(result), flush=True)
"""


#: Kernel code: print the marker every 50 ms until the test says stop (at most 120 s).
PRINT_UNTIL = """
import os, time
deadline = time.monotonic() + 120
while True:
    print({marker!r}, flush=True)
    if os.path.exists({stop!r}) or time.monotonic() > deadline:
        break
    time.sleep(0.05)
"""


def connection_file(daemon: Daemon, kernel_id: str) -> dict[str, Any]:
    path = daemon.home / "runtime" / f"kernel-{kernel_id}.json"
    info: dict[str, Any] = json.loads(path.read_text())
    return info


async def spy_as_nobody(url: str, marker: str) -> asyncio.subprocess.Process:
    """The spy, run as ``nobody`` with no groups and no capabilities."""
    return await asyncio.create_subprocess_exec(
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "/usr/bin/python3",
        "-c",
        SPY,
        url,
        marker,
        str(seconds(20)),
        stdout=asyncio.subprocess.PIPE,
        cwd="/",
    )


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="runs the other user's process with setpriv as root, with the system's Python",
)


@needs_root
@pytest.mark.parametrize(
    ("transport", "readable"), [("tcp", True), ("ipc", False)], ids=["tcp-control", "ipc"]
)
async def test_another_user_reads_iopub_over_tcp_but_not_over_ipc(
    daemon: Daemon, transport: str, readable: bool
) -> None:
    """Over TCP (the control: the exposure docs/guarantees.md states) another user's process
    subscribes to the kernel's IOPub and reads what the kernel prints; over IPC it
    cannot even connect, and the gateway's clients get the output all the same."""
    daemon.start(f"--KernelManager.transport={transport}")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    await run_in_kernel(daemon, kernel_id, "pass")  # its ports are bound
    info = connection_file(daemon, kernel_id)
    assert info["transport"] == transport
    if transport == "tcp":
        url = f"tcp://{info['ip']}:{info['iopub_port']}"
    else:
        url = f"{info['ip']}-{info['iopub_port']}"
        assert os.stat(daemon.home / "runtime").st_mode & 0o077 == 0
    marker = f"private-{uuid.uuid4().hex}"
    spy = await spy_as_nobody(url, marker)
    assert spy.stdout is not None
    first = (await asyncio.wait_for(spy.stdout.readline(), seconds(30))).decode()
    if readable:
        assert first.strip() == "subscribed", first
    # The kernel prints until the spy is done: a new subscription takes effect when the
    # kernel's XPUB next processes its commands, not when the spy has sent it.
    stop = daemon.home / "spy-done"
    printing = asyncio.ensure_future(
        run_in_kernel(daemon, kernel_id, PRINT_UNTIL.format(marker=marker, stop=str(stop)))
    )
    rest = (await asyncio.wait_for(spy.stdout.read(), seconds(60))).decode()
    await spy.wait()
    stop.touch()
    output = await asyncio.wait_for(printing, seconds(60))
    assert marker in output
    report = json.loads((first + rest).strip().splitlines()[-1])
    if readable:
        assert report["seen"], report
    else:
        assert not report["connected"], report
        assert "PermissionError" in report["error"], report
        assert not report["seen"]
