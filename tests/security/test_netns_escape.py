"""Kernels in their own network namespace do not escape it (netns-provisioner).

Through the real daemon, with real ipykernels in real namespaces, kernel code tries what an
attacker tried: ``nsenter --net=/proc/<gateway pid>/ns/net`` back into the host's network
(the gateway, its loopback and its token live there), a connection to a host service
bound on 0.0.0.0 and to the gateway's own HTTP port through the host side of its veth
pair, and reading another kernel's connection file (its copy, and the gateway's original).
It also reads its own uid and capabilities, and tries the host over IPv6 too (the veth
pair's link-local addresses). A plain kernel of the same daemon runs the
same probe against the same targets, and each probe succeeds there: the probes can fail.

These need root, ``ip netns``, ``setpriv`` and ``nft``; elsewhere they are skipped, except
under ``CI=true``, where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway_stream.client import GatewayClient
from kernel_gateway_stream.kernels.netns import host_interface_name

from ..integration import test_netns
from ..integration.daemon import TOKEN, Daemon
from ..integration.test_netns import KERNEL_NAME, ip
from ..timing import seconds

# The netns tests' fixtures: the host can run such kernels, namespaces are swept after
# each test, and the daemon has the netns kernelspec.
netns_host = test_netns.netns_host
sweep = test_netns.sweep

#: Namespace tests run one at a time, on one worker: the sweep removes every namespace a
#: test leaves, and each daemon takes the first free subnet of the same pool.
pytestmark = pytest.mark.xdist_group("namespaces")
netns_daemon = test_netns.netns_daemon

#: What kernel code runs; it prints one JSON line. ``{timeout}`` bounds every connection;
#: the connections are tried at once (a dropped one waits the whole of it).
PROBE = """
import json, os, socket, subprocess
from concurrent.futures import ThreadPoolExecutor
from ipykernel.kernelapp import IPKernelApp

def connect(port, host={host!r}):
    try:
        with socket.create_connection((host, port), timeout={timeout}):
            return "connected"
    except OSError as error:
        return type(error).__name__

def signal(pid):
    try:
        os.kill(pid, 0)
        return "signalled"
    except OSError as error:
        return type(error).__name__

def read(path):
    try:
        with open(path) as file:
            return "read" if file.read() else "empty"
    except OSError as error:
        return type(error).__name__

status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
gateway = os.getppid()
pool = ThreadPoolExecutor(4)
nsenter = pool.submit(
    subprocess.run,
    ["nsenter", f"--net=/proc/{{gateway}}/ns/net", "true"],
    capture_output=True, text=True, timeout={timeout},
)
listener = pool.submit(connect, {listener_port})
listener6 = pool.submit(connect, {listener6_port}, {host6!r})
gateway_port = pool.submit(connect, {gateway_port})
nsenter = nsenter.result()
print(json.dumps({{
    "uid": os.getuid(),
    "euid": os.geteuid(),
    "capabilities": {{
        name: int(status[name], 16) for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb")
    }},
    "no_new_privs": int(status["NoNewPrivs"]),
    "gateway": gateway,
    "nsenter": [nsenter.returncode, nsenter.stderr.strip()],
    "listener": listener.result(),
    "listener6": listener6.result(),
    "gateway_port": gateway_port.result(),
    "own_connection_file": read(IPKernelApp.instance().connection_file),
    "other_connection_files": [read(path) for path in {other_files!r}],
    "other_kernel": signal({other_pid}),
}}))
"""


@pytest.fixture
def escape_host(netns_host: None) -> None:
    """Skip unless setpriv and nft are here too (fail instead under CI=true)."""
    missing = [command for command in ("setpriv", "nft", "nsenter") if not shutil.which(command)]
    if missing:
        reason = f"netns kernels' confinement needs {', '.join(missing)} (util-linux, nftables)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, and {reason}")
        pytest.skip(reason)


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on 0.0.0.0 of the host (the kernel's TCP handshake needs no accept);
    its port."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


@pytest.fixture
def host_listener6() -> Iterator[int]:
    """A TCP listener on :: of the host (IPv6 only); its port. The veth pair has IPv6
    link-local addresses whatever the kernel's IPv4 /30."""
    with socket.socket(socket.AF_INET6) as listener:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listener.bind(("::", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


async def host_link_local(kernel_id: str) -> str:
    """The host side's IPv6 link-local address, once duplicate address detection has
    finished (until then it is tentative, and takes no connections)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds(30)
    while True:
        device = host_interface_name(kernel_id)
        shown = ip("-6", "-o", "addr", "show", "dev", device, "scope", "link")
        if shown and "tentative" not in shown:
            return shown.split()[3].split("/")[0]
        assert loop.time() < deadline, f"no usable link-local address: {shown!r}"
        await asyncio.sleep(0.1)


def host_address(kernel_id: str) -> str:
    """The host side of the kernel's veth pair, as the host shows it."""
    return (
        ip("-o", "-4", "addr", "show", "dev", host_interface_name(kernel_id))
        .split()[3]
        .split("/")[0]
    )


async def connection_file_of(client: GatewayClient, kernel_id: str) -> str:
    """The connection file kernel ``kernel_id`` reads, as it says."""
    result = await client.execute(
        kernel_id,
        "from ipykernel.kernelapp import IPKernelApp\n"
        "print(IPKernelApp.instance().connection_file)",
    )
    assert result.ok, result.error
    return result.stdout.strip()


async def probe(
    client: GatewayClient,
    kernel_id: str,
    *,
    host: str,
    host6: str,
    listener_port: int,
    listener6_port: int,
    gateway_port: int,
    other_files: list[str],
    other_pid: int,
) -> dict[str, Any]:
    code = PROBE.format(
        host=host,
        host6=host6,
        timeout=seconds(3),
        listener_port=listener_port,
        listener6_port=listener6_port,
        gateway_port=gateway_port,
        other_files=other_files,
        other_pid=other_pid,
    )
    result = await client.execute(kernel_id, code)
    assert result.ok, result.error
    found: dict[str, Any] = json.loads(result.stdout)
    return found


async def started(daemon: Daemon) -> None:
    # On every address: without the firewall the gateway's port would answer on the host
    # side of each veth pair too.
    daemon.start("--ip=0.0.0.0")
    await daemon.wait_ready()


async def test_a_netns_kernel_cannot_leave_its_namespace_nor_reach_the_host(
    escape_host: None, netns_daemon: Daemon, host_listener: int, host_listener6: int
) -> None:
    daemon = netns_daemon
    await started(daemon)
    assert daemon.process is not None
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        attacker = await client.start_kernel(KERNEL_NAME)
        victim = await client.start_kernel(KERNEL_NAME)
        victim_copy = await connection_file_of(client, victim)
        victim_pid, victim_uid = await pid_and_uid(client, victim)
        victim_original = daemon.home / "runtime" / f"kernel-{victim}.json"
        assert Path(victim_copy).read_text() == victim_original.read_text()  # root reads both

        found = await probe(
            client,
            attacker,
            host=host_address(attacker),
            host6=f"{await host_link_local(attacker)}%eth0",  # its end of the pair
            listener_port=host_listener,
            listener6_port=host_listener6,
            gateway_port=daemon.port,
            other_files=[victim_copy, str(victim_original)],
            other_pid=victim_pid,
        )
        assert found["gateway"] == daemon.process.pid  # the gateway started it: its parent
        assert found["uid"] != 0
        assert found["euid"] != 0
        assert found["capabilities"] == {"CapEff": 0, "CapPrm": 0, "CapBnd": 0, "CapAmb": 0}
        assert found["no_new_privs"] == 1
        assert found["nsenter"][0] != 0, found["nsenter"]
        assert found["listener"] != "connected"
        assert found["listener6"] != "connected"
        assert found["gateway_port"] != "connected"
        assert found["own_connection_file"] == "read"
        assert found["other_connection_files"] == ["PermissionError", "PermissionError"]
        # Two kernels, two users: one cannot signal (nor trace) the other.
        assert victim_uid not in (0, found["uid"])
        assert found["other_kernel"] == "PermissionError"
        # And the gateway still reaches the kernel it confined.
        assert (await client.execute(attacker, "print('still here')")).stdout == "still here\n"
        for kernel_id in (attacker, victim):
            await client.shutdown(kernel_id)


async def pid_and_uid(client: GatewayClient, kernel_id: str) -> tuple[int, int]:
    result = await client.execute(kernel_id, "import os\nprint(os.getpid(), os.getuid())")
    pid, uid = map(int, result.stdout.split())
    return pid, uid


async def test_the_same_probes_succeed_from_a_kernel_without_the_provisioner(
    escape_host: None, netns_daemon: Daemon, host_listener: int, host_listener6: int
) -> None:
    """The control: a plain kernel of the same daemon, against the same targets (the host
    side of a netns kernel's veth pair, the other kernel's connection files)."""
    daemon = netns_daemon
    await started(daemon)
    assert daemon.process is not None
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        confined = await client.start_kernel(KERNEL_NAME)
        plain = await client.start_kernel("python3")
        confined_copy = await connection_file_of(client, confined)
        confined_pid, confined_uid = await pid_and_uid(client, confined)
        confined_original = daemon.home / "runtime" / f"kernel-{confined}.json"
        found = await probe(
            client,
            plain,
            host=host_address(confined),
            host6=f"{await host_link_local(confined)}%{host_interface_name(confined)}",
            listener_port=host_listener,
            listener6_port=host_listener6,
            gateway_port=daemon.port,
            other_files=[confined_copy, str(confined_original)],
            other_pid=confined_pid,
        )
        # Forked by the daemon's kernel forkserver (docs/kernels.md), the daemon's child.
        assert daemon.process.pid in (found["gateway"], parent_of(found["gateway"]))
        assert found["uid"] == 0
        assert found["capabilities"]["CapEff"] != 0
        assert found["nsenter"][0] == 0, found["nsenter"]
        assert found["listener"] == "connected"
        assert found["listener6"] == "connected"
        assert found["gateway_port"] == "connected"
        assert found["other_connection_files"] == ["read", "read"]
        assert found["other_kernel"] == "signalled"
        assert confined_uid != 0
        for kernel_id in (confined, plain):
            await client.shutdown(kernel_id)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[1])


def test_the_probe_code_is_valid_python() -> None:
    compile(
        PROBE.format(
            host="192.0.2.1",
            host6="fe80::1%eth0",
            timeout=1,
            listener_port=1,
            listener6_port=3,
            gateway_port=2,
            other_files=["/x"],
            other_pid=1,
        ),
        "probe",
        "exec",
    )
