"""Kernels in a sandbox (:mod:`kernel_gateway_stream.kernels.sandbox`): bubblewrap, a user
and a network namespace of their own, rlimits.

With jupyter_client alone: the kernel runs as its user, pid 2 of its own PID namespace,
in a home of its own that a restart keeps and a shutdown removes (with its tmpfs, its
namespace and its processes); an interrupt reaches ipykernel inside the PID namespace.
Through the real daemon: output arrives whole, and a kernel re-attached after the gateway
was SIGKILLed keeps its state and still leaves nothing behind. (What it cannot reach:
tests/security/test_sandbox_escape.py.)

These need root, ``ip netns``, ``nft``, ``bwrap``, ``setpriv`` and ``prlimit``; elsewhere
they are skipped, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from kernel_gateway_stream.client import GatewayClient
from kernel_gateway_stream.kernels.netns import host_interface_name, namespace_name
from kernel_gateway_stream.kernels.netns_confinement import DEFAULT_UID_BASE, mounts_under
from kernel_gateway_stream.kernels.sandbox import (
    PROVISIONER_NAME,
    SANDBOX_CONNECTION_FILE,
    SANDBOX_HOME,
    SandboxProvisioner,
    bwrap_arguments,
    install_sandbox_kernelspec,
    missing_for_sandbox,
    prlimit_arguments,
)

from ..timing import seconds
from . import test_netns
from .daemon import TOKEN, Daemon
from .floods import flood_code, flood_text
from .test_netns import ip, listed_namespaces, run, start
from .waits import wait_until

#: One worker runs these and tests/security/test_sandbox_escape.py, one after the other.
pytestmark = pytest.mark.xdist_group("namespaces")

KERNEL_NAME = "python3-sandbox"

netns_host = test_netns.netns_host
sweep = test_netns.sweep


# -- the host, observed without the code under test ----------------------------------


def runtime_directory() -> str:
    return str(SandboxProvisioner().runtime_directory)


def kernel_user_processes() -> dict[int, int]:
    """pid -> uid of every process of a kernel's user (uids from DEFAULT_UID_BASE)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    if uid >= DEFAULT_UID_BASE:
                        found[int(entry.name)] = uid
    return found


@pytest.fixture
def sandbox_host(netns_host: None) -> None:
    """Skip unless this host can run sandbox kernels (fail instead under CI=true)."""
    missing = missing_for_sandbox()
    if missing:
        reason = "; ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, and {reason}")
        pytest.skip(reason)


class Watched:
    """The kernels a test started, to check that they left nothing behind."""

    def __init__(self) -> None:
        self.directories: dict[str, int] = {}  # kernel directory -> its user's uid

    def watch(self, kernel_id: str) -> None:
        """Watch kernel ``kernel_id`` (started: its home exists)."""
        directory = os.path.join(runtime_directory(), namespace_name(kernel_id))
        self.directories[directory] = os.stat(os.path.join(directory, "home")).st_uid

    def leftovers(self) -> tuple[list[str], dict[int, int]]:
        """Mounts and processes (pid -> uid) of the watched kernels still there."""
        mounts = [point for directory in self.directories for point in mounts_under(directory)]
        uids = set(self.directories.values())
        processes = {pid: uid for pid, uid in kernel_user_processes().items() if uid in uids}
        return mounts, processes


@pytest.fixture
def nothing_left(sandbox_host: None, sweep: None) -> Iterator[Watched]:
    """After the test: no storage mounted and no process left of the kernels it watched
    (removed, and the test fails, if there are). Other tests' kernels are left alone: the
    suite runs in parallel."""
    watched = Watched()
    yield watched
    mounts, processes = watched.leftovers()
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    for pid in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not mounts, f"mounts left behind: {sorted(mounts)}"
    assert not processes, f"kernel users' processes left behind: {processes}"


@pytest.fixture
def sandbox_daemon(nothing_left: Watched, daemon: Daemon) -> Daemon:
    """The daemon with the sandbox kernelspec installed (stopped before the checks)."""
    install_sandbox_kernelspec(daemon.home / "data" / "kernels", KERNEL_NAME)
    return daemon


@pytest.fixture
def kernel_manager(
    nothing_left: Watched, tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop
) -> Iterator[AsyncKernelManager]:
    """A jupyter_client kernel manager for the sandbox kernelspec (not started)."""
    kernels = tmp_path / "kernels"
    install_sandbox_kernelspec(kernels, KERNEL_NAME)
    km = AsyncKernelManager(
        kernel_name=KERNEL_NAME,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]),
        connection_file=str(tmp_path / "kernel.json"),
    )
    yield km
    if km.has_kernel:
        jp_asyncio_loop.run_until_complete(km.shutdown_kernel(now=True))


# -- pure parts ------------------------------------------------------------------------


def test_the_limits_and_the_sandbox_on_the_command_line() -> None:
    assert prlimit_arguments(
        address_space=2**30, cpu_seconds=0, processes=64, file_size=10, open_files=256
    ) == ["--as=1073741824", "--nproc=64", "--fsize=10", "--nofile=256"]
    # The CPU time's hard limit a second past the soft one: SIGXCPU first, which says why.
    assert prlimit_arguments(
        address_space=0, cpu_seconds=5, processes=0, file_size=0, open_files=0
    ) == ["--cpu=5:6"]
    options = bwrap_arguments(
        storage="/state/kgs-1/home",
        connection_file="/state/kgs-1/connection.json",
        exposed=["/opt/python"],
        hidden=[],
    )
    pairs = list(zip(options, options[1:], options[2:], strict=False))
    assert ("--bind", "/state/kgs-1/home/home", SANDBOX_HOME) in pairs
    assert ("--bind", "/state/kgs-1/home/tmp", "/tmp") in pairs
    assert ("--ro-bind", "/state/kgs-1/connection.json", SANDBOX_CONNECTION_FILE) in pairs
    assert ("--ro-bind-try", "/opt/python", "/opt/python") in pairs
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts"):
        assert flag in options
    # Written nowhere but the storage: every other bind is read-only.
    writable = [options[i + 1] for i, option in enumerate(options) if option == "--bind"]
    assert writable == ["/state/kgs-1/home/home", "/state/kgs-1/home/tmp"]
    assert options[options.index("--cap-drop") + 1] == "ALL"
    added = [options[i + 1] for i, option in enumerate(options) if option == "--cap-add"]
    assert added == ["CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]
    # The ancestors bwrap would make closed to the kernel's user are made searchable.
    assert ("--perms", "0755", "--dir") in pairs
    assert "/opt" in [options[i + 3] for i, option in enumerate(options) if option == "--perms"]
    # What is exposed is mounted after the kernel's /tmp: a package or interpreter under
    # /tmp (a clone, a virtualenv) stays visible in the sandbox.
    under_tmp = bwrap_arguments(
        storage="/state/kgs-1/home",
        connection_file="/state/kgs-1/connection.json",
        exposed=["/tmp/clone"],
        hidden=[],
    )
    assert under_tmp.index("/tmp/clone") > under_tmp.index("/state/kgs-1/home/tmp")
    # And its ancestors inside the kernel's /tmp are made again, searchable, after it.
    nested = bwrap_arguments(
        storage="/state/kgs-1/home",
        connection_file="/state/kgs-1/connection.json",
        exposed=["/tmp/clone/package"],
        hidden=[],
    )
    made = [
        i
        for i in range(len(nested) - 3)
        if nested[i : i + 4] == ["--perms", "0755", "--dir", "/tmp/clone"]
    ]
    assert made
    assert made[-1] > nested.index("/state/kgs-1/home/tmp")


def test_the_kernelspec_names_the_sandbox_provisioner(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "kernel_gateway_stream.kernels.sandbox", "install"),
            *("--dir", str(tmp_path), "--name", "sb-test"),
        ],
        capture_output=True,
        text=True,
        timeout=seconds(60),
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "sb-test" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == PROVISIONER_NAME
    assert spec["argv"][1:3] == ["-m", "kernel_gateway_stream.kernel_launcher"]


def test_check_says_whether_the_host_can(sandbox_host: None, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernel_gateway_stream.kernels.sandbox", "check"],
        capture_output=True,
        text=True,
        timeout=seconds(60),
    )
    assert (done.returncode, done.stdout.split(":")[0]) == (0, "yes"), done.stderr
    # Everything but bwrap.
    for command in ("ip", "setpriv", "prlimit", "nft", "mount", "umount"):
        found = shutil.which(command)
        assert found is not None
        (tmp_path / command).symlink_to(found)
    without = subprocess.run(
        [sys.executable, "-m", "kernel_gateway_stream.kernels.sandbox", "check"],
        capture_output=True,
        text=True,
        timeout=seconds(60),
        env={**os.environ, "PATH": str(Path(sys.executable).parent)},
    )
    assert without.returncode == 1
    assert "'bwrap' is not on PATH (apt-get install bubblewrap)" in without.stderr


# -- with jupyter_client alone -----------------------------------------------------------


async def test_interrupt_restart_and_shutdown(
    kernel_manager: AsyncKernelManager, nothing_left: Watched
) -> None:
    km = kernel_manager
    client = await start(km)
    nothing_left.watch(str(km.kernel_id))
    try:
        name = namespace_name(str(km.kernel_id))
        user = km.provisioner.network.user  # type: ignore[union-attr]
        assert user is not None
        _, stdout = await run(
            client,
            "import os, json\n"
            "open('kept.txt', 'w').write('kept')\n"
            "print(json.dumps([os.getuid(), os.getpid(), os.getcwd(), os.environ['HOME']]))",
        )
        assert json.loads(stdout) == [user.uid, 2, SANDBOX_HOME, SANDBOX_HOME]
        assert user.home in mounts_under(user.home)  # the storage's tmpfs

        # Not flushed: see test_netns.test_interrupt_and_restart_keep_the_namespace.
        msg_id = client.execute("import time\nprint('sleeping')\ntime.sleep(600)")
        while True:  # until the cell runs
            msg = await client.get_iopub_msg(timeout=seconds(60))
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                break
        await km.interrupt_kernel()  # SIGINT, from the host into the PID namespace
        reply = await client.get_shell_msg(timeout=seconds(60))
        while reply["parent_header"]["msg_id"] != msg_id:
            assert reply["msg_type"] == "kernel_info_reply", reply["msg_type"]
            reply = await client.get_shell_msg(timeout=seconds(60))
        assert (reply["content"]["status"], reply["content"]["ename"]) == (
            "error",
            "KeyboardInterrupt",
        )
        assert await km.is_alive()

        first = km.provisioner.pid  # type: ignore[union-attr]
        await km.restart_kernel()
        await client.wait_for_ready(timeout=seconds(60))
        assert km.provisioner.pid != first  # type: ignore[union-attr]
        _, stdout = await run(client, "print(open('kept.txt').read())")
        assert stdout == "kept\n"  # the home survived the restart
        assert km.provisioner.network.user == user  # type: ignore[union-attr]
    finally:
        client.stop_channels()
        await km.shutdown_kernel()
    assert name not in listed_namespaces()
    assert user.home not in mounts_under(runtime_directory())
    assert not Path(user.directory).exists()  # the home with it
    assert user.uid not in kernel_user_processes().values()


# -- through the daemon ------------------------------------------------------------------


async def test_output_through_the_gateway(sandbox_daemon: Daemon, nothing_left: Watched) -> None:
    daemon = sandbox_daemon
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        kernel_id = await client.start_kernel(KERNEL_NAME)
        nothing_left.watch(kernel_id)
        result = await asyncio.wait_for(
            client.execute(
                kernel_id,
                flood_code(20000)
                + "import os, sys\nprint('to stderr', file=sys.stderr)\nos.getpid()",
            ),
            seconds(180),
        )
        assert result.ok, result.error
        assert result.stdout == flood_text(20000)
        assert result.stderr == "to stderr\n"
        assert result.outputs[-1]["data"]["text/plain"] == "2"
        text = await client.transcript_text(kernel_id, parent=result.msg_id)
        assert text == result.stdout + "to stderr\n"  # both streams, in order
        await client.shutdown(kernel_id)
    assert namespace_name(kernel_id) not in listed_namespaces()


async def test_re_attached_after_a_gateway_crash(
    sandbox_daemon: Daemon, nothing_left: Watched
) -> None:
    """The gateway is SIGKILLed; its sandbox kernel runs on, is re-attached at the next
    start with its state and home, and shut down then it leaves nothing behind."""
    daemon = sandbox_daemon
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        kernel_id = await client.start_kernel(KERNEL_NAME)
        nothing_left.watch(kernel_id)
        assert (await client.execute(kernel_id, "state = 'kept'\nopen('f', 'w').write('x')")).ok
    name = namespace_name(kernel_id)
    directories = [p for p in Path(runtime_directory()).glob(f"{name}*")]
    assert len(directories) == 1
    pids = [int(pid) for pid in ip("netns", "pids", name).split()]
    try:
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGKILL)  # the gateway alone: its kernels run on
        daemon.process.wait()
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)  # the kernel ran on
        daemon.start()
        await daemon.wait_ready()
        async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
            result = await client.execute(kernel_id, "print(state, open('f').read())")
            assert result.stdout == "kept x\n", daemon.log_text()
            # An interrupt reaches it (by message: its process cannot be told from the
            # gateway's side, so it is not signalled).
            await test_netns.interrupt_reaches(client, kernel_id)
            await client.shutdown(kernel_id)
        await wait_until(
            lambda: name not in listed_namespaces() and not directories[0].exists(),
            "the kernel's namespace and directory to go",
        )
        assert not mounts_under(str(directories[0]))
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_outbound_connections_when_allowed(nothing_left: Watched, daemon: Daemon) -> None:
    """``allow_outbound``: the kernel reaches a listener on the host side of its veth
    pair (the escape tests show that it does not by default)."""
    install_sandbox_kernelspec(
        daemon.home / "data" / "kernels", "sandbox-outbound", config={"allow_outbound": True}
    )
    daemon.start()
    await daemon.wait_ready()
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
            kernel_id = await client.start_kernel("sandbox-outbound")
            nothing_left.watch(kernel_id)
            host = host_address(kernel_id)
            result = await client.execute(
                kernel_id,
                "import socket\n"
                f"with socket.create_connection(({host!r}, {port}), timeout={seconds(10)}):\n"
                "    print('connected')",
            )
            assert result.stdout == "connected\n", result.error
            await client.shutdown(kernel_id)


def host_address(kernel_id: str) -> str:
    """The host side of the kernel's veth pair, as the host shows it."""
    shown = ip("-o", "-4", "addr", "show", "dev", host_interface_name(kernel_id))
    return shown.split()[3].split("/")[0]


async def test_a_pool_of_sandbox_kernels(sandbox_daemon: Daemon, nothing_left: Watched) -> None:
    """``kernel_pool``: sandbox kernels started ahead are handed out each once, fresh and
    sandboxed; the pool fills again; at the gateway's stop the kernels it still held are
    shut down with their namespace, storage and processes (tests/integration/test_pool.py
    has the pool itself, with local kernels)."""
    daemon = sandbox_daemon
    daemon.start(f"--GatewayStreamApp.kernel_pool={json.dumps({KERNEL_NAME: 1})}")
    await daemon.wait_ready()

    async def pool(ready: int) -> bool:
        health = await daemon.fetch("/api/gateway/health")
        return bool(
            health["components"]["kernel_pool"]["kernelspecs"][KERNEL_NAME]["ready"] >= ready
        )

    await wait_until(lambda: pool(1), "a pooled sandbox kernel", timeout=seconds(120))
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        for _ in range(3):
            kernel_id = await client.start_kernel(KERNEL_NAME)
            nothing_left.watch(kernel_id)
            result = await client.execute(
                kernel_id,
                "import os\nprint('secret' in globals(), os.getpid(), os.getuid() > 0)\nsecret = 1",
            )
            assert result.stdout == "False 2 True\n", result
        await wait_until(lambda: pool(1), "the pool filled again", timeout=seconds(120))
        state = json.loads(
            (daemon.home / "data" / "kernel_gateway_stream" / "kernel-pool.json").read_text()
        )
        [waiting] = [kernel["kernel_id"] for kernel in state["kernels"]]
        nothing_left.watch(waiting)
        health = await daemon.fetch("/api/gateway/health")
        assert health["components"]["kernel_pool"]["kernelspecs"][KERNEL_NAME]["taken"] >= 1
    daemon.stop()
    assert namespace_name(waiting) not in listed_namespaces()
