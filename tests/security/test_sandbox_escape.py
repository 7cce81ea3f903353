"""Kernels in a sandbox do not get out of it, nor past their limits (sandbox-provisioner).

Through the real daemon, with real ipykernels under real bwrap, kernel code tries: who it
is (uid, capabilities); which processes it can see (its ``/proc``) and whether it can
signal the gateway; reading the transcript database, the gateway's runtime directory
(every kernel's connection file), the daemon's data directory (its kernelspecs) and another
sandbox kernel's home; writing outside its home and ``/tmp`` (the system, the daemon's
home); a fork bomb, an 8 GiB mapping, a 2 GiB allocation, a file past the size limit and
storage past its size. A plain kernel of the same daemon runs the same probe and each
probe succeeds there, so the probes can fail.

These need what tests/integration/test_sandbox.py needs; elsewhere they are skipped,
except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel_gateway_stream.client import GatewayClient
from kernel_gateway_stream.client.api import ExecutionResult
from kernel_gateway_stream.core.errors import KernelDied
from kernel_gateway_stream.kernels.netns import namespace_name
from kernel_gateway_stream.kernels.sandbox import install_sandbox_kernelspec

from ..integration import test_netns, test_sandbox
from ..integration.daemon import TOKEN, Daemon
from ..integration.test_metrics import parse, value
from ..timing import seconds
from .test_netns_escape import host_address

netns_host = test_netns.netns_host
sweep = test_netns.sweep
sandbox_host = test_sandbox.sandbox_host
nothing_left = test_sandbox.nothing_left

#: One worker runs them all, one after the other, as the integration tests of sandbox
#: kernels: each test then watches only its own kernels' users, and no other test's kernel
#: can have taken one of those users meanwhile.
pytestmark = pytest.mark.xdist_group("namespaces")

KERNEL_NAME = "python3-sandbox-limited"
CPU_KERNEL_NAME = "python3-sandbox-cpu"
MEMORY_KERNEL_NAME = "python3-sandbox-memory"
#: Resident memory per kernel (kernel_memory_limit): ipykernel holds about 70 MiB.
KERNEL_MEMORY = 300 * 2**20
#: Well above what ipykernel's start takes, even on a loaded machine.
CPU_SECONDS = 8
PROCESS_LIMIT = 64
MEMORY_LIMIT = 2**30
FILE_SIZE_LIMIT = 16 * 2**20
STORAGE_SIZE = 48 * 2**20
#: /usr and /etc are read-only binds (EROFS: a plain OSError); / (bwrap's tmpfs) and
#: /run/kernel are root's.
#: What the sandbox shows of <sys.prefix>/etc/jupyter (jupyter_server's own configuration
#: directory): an empty tmpfs where the host has it.
PREFIX_JUPYTER_CONFIG = (
    "empty" if os.path.isdir(os.path.join(sys.prefix, "etc", "jupyter")) else "FileNotFoundError"
)
WRITE_SYSTEM_ERRORS = ["OSError", "OSError", "PermissionError", "PermissionError"]

#: What kernel code runs; it prints one JSON line. Every probe catches its own error and
#: says its type: the kernel must live through all of them.
PROBE = """
import json, mmap, os, signal, socket, sys, time

def attempt(action):
    try:
        return action()
    except BaseException as error:
        return type(error).__name__

def read(path):
    with open(path, "rb") as file:
        return "read" if file.read() else "empty"

def listing(path):
    return "listed" if os.listdir(path) else "empty"

def write(path):
    with open(path, "w") as file:
        file.write("written")
    os.unlink(path)
    return "written"

def connect(host, port):
    with socket.create_connection((host, port), timeout={timeout}):
        return "connected"

def signal_gateway():
    os.kill({gateway_pid}, 0)
    return "signalled"

def processes():
    found = {{}}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{{name}}/cmdline", "rb") as file:
                    found[name] = file.read().replace(b"\\0", b" ").decode()[:200]
            except OSError:
                pass
    return found

def fork_bomb():
    children = []
    try:
        for _ in range({forks}):
            pid = os.fork()
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            children.append(pid)
        return ["forked", len(children)]
    except OSError as error:
        return [type(error).__name__, len(children)]
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)

def map_8_gib():
    with mmap.mmap(-1, 8 * 2**30):  # address space only: no page is touched
        return "mapped"

def big_file(path, size):
    chunk = b"x" * 2**20
    try:
        with open(path, "wb") as file:
            for _ in range(size // 2**20):
                file.write(chunk)
        return "written"
    finally:
        if os.path.exists(path):
            os.unlink(path)

status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({{
    "uid": os.getuid(),
    "capabilities": {{
        name: int(status[name], 16) for name in ("CapEff", "CapPrm", "CapBnd", "CapAmb")
    }},
    "processes": processes(),
    "signal_gateway": attempt(signal_gateway),
    "gateway_port": attempt(lambda: connect({gateway_host!r}, {gateway_port})),
    "redis": attempt(lambda: connect("127.0.0.1", 6379)),
    "postgresql": attempt(lambda: connect("127.0.0.1", 5432)),
    "other_kernel": attempt(lambda: connect({other_kernel[0]!r}, {other_kernel[1]})),
    "transcripts": attempt(lambda: read({transcripts!r})),
    "runtime": attempt(lambda: listing({runtime!r})),
    "daemon_data": attempt(lambda: listing({daemon_data!r})),
    "prefix_jupyter_config": attempt(lambda: listing(sys.prefix + "/etc/jupyter")),
    "other_home": attempt(lambda: read({other_home!r})),
    "write_system": [attempt(lambda: write(path)) for path in {system_files!r}],
    "write_daemon_home": attempt(lambda: write({daemon_file!r})),
    "write_home": attempt(lambda: write(os.path.expanduser("~/probe"))),
    "write_tmp": attempt(lambda: write("/tmp/probe")),
    "fork_bomb": fork_bomb(),
    "map_8_gib": attempt(map_8_gib),
    "file_past_limit": attempt(lambda: big_file("/tmp/big", {big_file})),
}}))
"""


async def probe(client: GatewayClient, kernel_id: str, daemon: Daemon, **targets: Any) -> Any:
    code = PROBE.format(
        gateway_pid=daemon.process.pid if daemon.process else 0,
        gateway_port=daemon.port,
        timeout=seconds(3),
        transcripts=str(daemon.transcript_path),
        runtime=str(daemon.home / "runtime"),
        daemon_data=str(daemon.home / "data"),
        forks=PROCESS_LIMIT + 16,
        big_file=FILE_SIZE_LIMIT + 2**20,
        **targets,
    )
    result = await client.execute(kernel_id, code)
    assert result.ok, result.error
    return json.loads(result.stdout)


@pytest.fixture
def limited_daemon(nothing_left: test_sandbox.Watched, daemon: Daemon) -> Daemon:
    install_sandbox_kernelspec(
        daemon.home / "data" / "kernels",
        KERNEL_NAME,
        config={
            "process_limit": PROCESS_LIMIT,
            "memory_limit": MEMORY_LIMIT,
            "file_size_limit": FILE_SIZE_LIMIT,
            "storage_size": STORAGE_SIZE,
        },
    )
    install_sandbox_kernelspec(
        daemon.home / "data" / "kernels", CPU_KERNEL_NAME, config={"cpu_time_limit": CPU_SECONDS}
    )
    install_sandbox_kernelspec(
        daemon.home / "data" / "kernels",
        MEMORY_KERNEL_NAME,
        config={"kernel_memory_limit": KERNEL_MEMORY, "memory_check_interval": 0.2},
    )
    return daemon


def shell_address(daemon: Daemon, kernel_id: str) -> tuple[str, int]:
    """Where kernel ``kernel_id``'s shell listens, as the gateway reaches it."""
    info = json.loads((daemon.home / "runtime" / f"kernel-{kernel_id}.json").read_text())
    return str(info["ip"]), int(info["shell_port"])


async def secret_home_file(client: GatewayClient, kernel_id: str) -> str:
    """A secret in kernel ``kernel_id``'s home; its path on the host."""
    namespace = namespace_name(kernel_id)
    result = await client.execute(
        kernel_id, "import os\nopen('secret', 'w').write('secret')\nprint(os.getpid())"
    )
    assert result.ok, result.error
    secret = Path(test_sandbox.runtime_directory(), namespace, "home", "home", "secret")
    assert secret.read_text() == "secret"  # on the host, in the kernel's storage
    return str(secret)


async def test_a_sandbox_kernel_stays_in_its_sandbox_and_within_its_limits(
    limited_daemon: Daemon, nothing_left: test_sandbox.Watched
) -> None:
    daemon = limited_daemon
    daemon.start("--ip=0.0.0.0")  # on every address: the host side of each veth pair too
    await daemon.wait_ready()
    assert daemon.process is not None
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(120)) as client:
        victim = await client.start_kernel(KERNEL_NAME)
        nothing_left.watch(victim)
        victim_secret = await secret_home_file(client, victim)
        attacker = await client.start_kernel(KERNEL_NAME)
        nothing_left.watch(attacker)
        found = await probe(
            client,
            attacker,
            daemon,
            other_home=victim_secret,
            other_kernel=shell_address(daemon, victim),
            gateway_host=host_address(attacker),  # the host side of its veth pair
            system_files=["/usr/probe", "/etc/probe", "/probe", "/run/kernel/probe"],
            daemon_file=str(daemon.home / "probe"),
        )
        assert found["uid"] != 0
        assert found["capabilities"] == {"CapEff": 0, "CapPrm": 0, "CapBnd": 0, "CapAmb": 0}
        # Its own PID namespace: bwrap's init (1), the kernel (2), the probe's reader.
        pids = sorted(map(int, found["processes"]))
        assert pids[:2] == [1, 2], found["processes"]
        assert "bwrap" in found["processes"]["1"]
        assert "kernel_launcher" in found["processes"]["2"]
        assert not any("kernel-gateway-stream" in line for line in found["processes"].values())
        assert found["signal_gateway"] == "ProcessLookupError"
        # Outbound traffic is off: not even the gateway's port on the host side (the
        # namespace's firewall drops the SYN, which TCP sends again until the timeout).
        assert found["gateway_port"] == "TimeoutError"
        # The host's loopback services (Redis, PostgreSQL) are not on its loopback, and
        # another kernel's ports are out of reach (no route out of its namespace).
        assert found["redis"] == "ConnectionRefusedError"
        assert found["postgresql"] == "ConnectionRefusedError"
        assert found["other_kernel"] == "OSError"
        # The gateway's files are not there at all.
        assert found["transcripts"] == "FileNotFoundError"
        assert found["runtime"] == "FileNotFoundError"
        assert found["daemon_data"] == "FileNotFoundError"
        # Jupyter's configuration in the interpreter's prefix, covered (hidden_directories).
        assert found["prefix_jupyter_config"] == PREFIX_JUPYTER_CONFIG
        assert found["other_home"] == "FileNotFoundError"
        # Read-only system, nothing else writable but its home and /tmp.
        assert found["write_system"] == WRITE_SYSTEM_ERRORS, found["write_system"]
        assert found["write_daemon_home"] == "FileNotFoundError"
        assert (found["write_home"], found["write_tmp"]) == ("written", "written")
        # Limits: the fork bomb stops at the process limit (threads of the kernel count),
        # an 8 GiB mapping and a file past the size limit are refused; the kernel lives.
        error, forked = found["fork_bomb"]
        assert error == "BlockingIOError", found["fork_bomb"]
        assert 0 < forked < PROCESS_LIMIT, found["fork_bomb"]
        assert found["map_8_gib"] == "OSError"
        assert found["file_past_limit"] == "OSError"

        # Reported through the gateway as what they are: errors of the execution.
        allocation = await client.execute(attacker, "x = bytearray(2 * 2**30)")
        assert (allocation.status, (allocation.error or {}).get("ename")) == (
            "error",
            "MemoryError",
        )
        storage = await client.execute(
            attacker,
            "import glob, os\n"
            "chunk = b'x' * 2**20\n"
            "try:\n"
            "    for n in range(8):\n"
            "        with open(f'/tmp/fill{n}', 'wb') as f:\n"
            "            for _ in range(12): f.write(chunk)\n"
            "finally:\n"
            "    for path in glob.glob('/tmp/fill*'): os.unlink(path)",
        )
        assert storage.status == "error"
        assert "No space left on device" in (storage.error or {}).get("evalue", ""), storage
        assert (await client.execute(attacker, "print('still here')")).stdout == "still here\n"
        victim_reads = await client.execute(victim, "print(open('secret').read())")
        assert victim_reads.stdout == "secret\n"  # untouched
        for kernel_id in (attacker, victim):
            await client.shutdown(kernel_id)


async def test_the_same_probes_succeed_from_a_kernel_without_the_sandbox(
    limited_daemon: Daemon, nothing_left: test_sandbox.Watched
) -> None:
    """The control: a plain kernel of the same daemon, against the same targets (a
    sandbox kernel's home on the host, the daemon's files)."""
    daemon = limited_daemon
    daemon.start("--ip=0.0.0.0")  # on every address: the host side of each veth pair too
    await daemon.wait_ready()
    assert daemon.process is not None
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(120)) as client:
        victim = await client.start_kernel(KERNEL_NAME)
        nothing_left.watch(victim)
        victim_secret = await secret_home_file(client, victim)
        plain = await client.start_kernel("python3")
        found = await probe(
            client,
            plain,
            daemon,
            other_home=victim_secret,
            other_kernel=shell_address(daemon, victim),
            gateway_host=host_address(victim),
            system_files=[],  # not the host's system: it would be written
            daemon_file=str(daemon.home / "probe"),
        )
        assert found["uid"] == 0
        assert found["capabilities"]["CapEff"] != 0
        assert str(daemon.process.pid) in found["processes"]
        assert found["signal_gateway"] == "signalled"
        assert found["gateway_port"] == "connected"
        assert found["redis"] == "connected"  # the machine's Redis and PostgreSQL
        assert found["postgresql"] == "connected"
        assert found["other_kernel"] == "connected"
        assert found["transcripts"] == "read"
        assert found["runtime"] == "listed"
        assert found["daemon_data"] == "listed"
        assert found["prefix_jupyter_config"] == (
            "listed" if PREFIX_JUPYTER_CONFIG == "empty" else "FileNotFoundError"
        )
        assert found["other_home"] == "read"
        assert found["write_daemon_home"] == "written"
        assert found["fork_bomb"] == ["forked", PROCESS_LIMIT + 16]
        assert found["map_8_gib"] == "mapped"
        assert found["file_past_limit"] == "written"
        for kernel_id in (plain, victim):
            await client.shutdown(kernel_id)


def test_the_probe_code_is_valid_python() -> None:
    compile(
        PROBE.format(
            gateway_pid=1,
            gateway_host="192.0.2.1",
            gateway_port=1,
            timeout=1,
            transcripts="/x",
            runtime="/x",
            daemon_data="/x",
            other_home="/x",
            other_kernel=("192.0.2.2", 1),
            system_files=["/x"],
            daemon_file="/x",
            forks=2,
            big_file=1,
        ),
        "probe",
        "exec",
    )


async def test_a_cpu_hog_is_killed_at_its_cpu_time_limit(
    limited_daemon: Daemon, nothing_left: test_sandbox.Watched
) -> None:
    """RLIMIT_CPU (CPU_SECONDS here): SIGXCPU ends the kernel; the gateway reports the execution
    ``died`` and jupyter's restarter starts the kernel again, afresh."""
    await killed_and_restarted(
        limited_daemon, nothing_left, CPU_KERNEL_NAME, "while True: pass", "cpu_limit"
    )


#: Three processes of 120 MiB each: each well under memory_limit (address space, per
#: process), the kernel's together past kernel_memory_limit.
#: It says it started and waits a second first: a kernel killed before its ``busy`` for the
#: execution reached the gateway had not (as far as anyone can tell) taken it, and the
#: execution ends ``aborted``, not ``died`` (seen once in a fresh clone, the machine loaded).
MEMORY_HOG = """
import os, time
print("allocating", flush=True)
time.sleep(1)
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        held = b"x" * (120 * 2**20)
        time.sleep(600)
        os._exit(0)
    children.append(pid)
held = b"x" * (120 * 2**20)
time.sleep(600)
"""


async def test_a_kernel_past_its_memory_limit_is_killed_and_reported(
    limited_daemon: Daemon, nothing_left: test_sandbox.Watched
) -> None:
    """kernel_memory_limit (KERNEL_MEMORY here), summed over the kernel's processes: the
    gateway kills the kernel, reports the execution ``died`` with ``memory_limit``, and
    jupyter's restarter starts the kernel again, afresh."""
    await killed_and_restarted(
        limited_daemon, nothing_left, MEMORY_KERNEL_NAME, MEMORY_HOG, "memory_limit"
    )


async def killed_and_restarted(
    daemon: Daemon, nothing_left: test_sandbox.Watched, kernel_name: str, code: str, reason: str
) -> None:
    """``code`` ends the kernel for ``reason``: said on every surface (the execution, the
    transcript's mark, the metrics), and the kernel answers again, a new process."""
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(120)) as client:
        kernel_id = await client.start_kernel(kernel_name)
        nothing_left.watch(kernel_id)
        assert (await client.execute(kernel_id, "before = 1")).ok
        with pytest.raises(KernelDied) as died:
            await client.execute(kernel_id, code)
        assert isinstance(died.value.result, ExecutionResult)
        assert died.value.result.status == "died"
        assert died.value.result.reason == reason
        marks = [
            r["content"]
            for r in (await client.transcript(kernel_id, limit=1000))["records"]
            if r["msg_type"] == "status" and r["content"].get("execution_state") == "restarting"
        ]
        assert [m.get("reason") for m in marks] == [reason], marks
        samples = parse(await daemon.fetch("/metrics"))
        assert value(samples, "kernel_deaths_total", reason=reason) == 1
        assert value(samples, "kernel_deaths_total", reason="kernel_died") == 0

        # Sent at once, while the restarter starts the kernel again: it runs on the new one
        # (tests/integration/test_auto_restart.py has why it once waited for ever).
        back = await asyncio.wait_for(client.execute(kernel_id, "print('back')"), seconds(60))
        assert back.stdout == "back\n", back
        fresh = await client.execute(kernel_id, "before")
        assert (fresh.error or {}).get("ename") == "NameError"  # a new process
        await client.shutdown(kernel_id)
