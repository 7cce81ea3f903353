"""Kernels in a network namespace of their own (:mod:`kernel_gateway_stream.kernels.netns`).

The kernel is reachable only over a veth pair and TCP, as a kernel in a container would
be. With jupyter_client alone: it starts, runs code as a user of its own in a home of its
own, listens at its namespace's address, answers interrupts, keeps its namespace and user
across a restart and leaves nothing behind, even when it crashed and a process of its
escaped into a namespace of its own. (What it cannot reach: tests/security/
test_netns_escape.py.) Through the real daemon: a 20,000-line flood is recorded whole, and a
link that goes down mid-run loses nothing, shows the kernel ``unreachable`` meanwhile and
records it in the transcript.

These need root and a working ``ip netns``; elsewhere they are skipped, except under
``CI=true``, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from kernel_gateway_stream.client import GatewayClient
from kernel_gateway_stream.kernels import netns
from kernel_gateway_stream.kernels.netns import (
    DEFAULT_SUBNET_POOL,
    PROVISIONER_NAME,
    KernelNetwork,
    choose_subnet,
    host_interface_name,
    install_netns_kernelspec,
    namespace_name,
)
from kernel_gateway_stream.kernels.netns_confinement import (
    DEFAULT_UID_BASE,
    KernelUser,
    firewall_ruleset,
    kernel_user,
)
from kernel_gateway_stream.kernels.netns_enter import blocking_ancestor, setpriv_argv

from ..timing import seconds
from .daemon import TOKEN, Daemon
from .floods import flood_code, flood_text
from .waits import wait_until

#: Namespace tests run one at a time, on one worker: the sweep removes every namespace a
#: test leaves, and each daemon takes the first free subnet of the same pool.
pytestmark = pytest.mark.xdist_group("namespaces")

KERNEL_NAME = "python3-netns"
LIFECYCLE = "kernel_gateway_stream_lifecycle"
GAP = "kernel_gateway_stream_gap"


# -- the host, observed without the code under test ----------------------------------


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=seconds(30))
    if check and done.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def listed_namespaces() -> set[str]:
    return {line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()}


def host_links() -> set[str]:
    return {line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link").splitlines()}


def remove_namespace(name: str) -> None:
    """Kill what runs in namespace ``name``, delete its host veth and the namespace."""
    for pid in ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    ip("link", "del", "v" + name, check=False)
    ip("netns", "del", name, check=False)


@functools.cache
def netns_unavailable() -> str | None:
    """Why this host cannot run kernels in namespaces; None if it can."""
    if os.geteuid() != 0:
        return f"kernels in network namespaces need root (uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "kernels in network namespaces need iproute2's ip (apt-get install iproute2)"
    probe = f"kgs-probe-{os.getpid()}"
    try:
        for args in (("netns", "add", probe), ("netns", "exec", probe, "true")):
            done = subprocess.run(["ip", *args], capture_output=True, text=True)
            if done.returncode != 0:
                return f"ip {' '.join(args)} fails here: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture
def netns_host() -> None:
    """Skip unless this host can run kernels in namespaces (fail instead under CI=true)."""
    reason = netns_unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, and {reason}")
        pytest.skip(reason)
    names = {ep.name for ep in entry_points(group="jupyter_client.kernel_provisioners")}
    assert PROVISIONER_NAME in names, "the entry point is not registered: pip install -e ."


@pytest.fixture
def sweep(netns_host: None) -> Iterator[None]:
    """Whatever kgs- namespace a test leaves behind, even on failure, is removed."""
    before = listed_namespaces()
    yield
    for name in listed_namespaces() - before:
        if name.startswith("kgs-"):
            remove_namespace(name)


@pytest.fixture
def netns_daemon(sweep: None, daemon: Daemon) -> Daemon:
    """The daemon with the netns kernelspec installed (stopped before the sweep)."""
    install_netns_kernelspec(daemon.home / "data" / "kernels", KERNEL_NAME)
    return daemon


@pytest.fixture
def kernel_manager(
    sweep: None, tmp_path: Path, jp_asyncio_loop: asyncio.AbstractEventLoop
) -> Iterator[AsyncKernelManager]:
    """A jupyter_client kernel manager for the netns kernelspec (its kernel not started)."""
    kernels = tmp_path / "kernels"
    install_netns_kernelspec(kernels, KERNEL_NAME)
    km = AsyncKernelManager(
        kernel_name=KERNEL_NAME,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]),
        connection_file=str(tmp_path / "kernel.json"),
    )
    yield km
    if km.has_kernel:
        jp_asyncio_loop.run_until_complete(km.shutdown_kernel(now=True))


async def start(km: AsyncKernelManager) -> Any:
    """Start the kernel; a client whose channels are ready."""
    env = {**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    await km.start_kernel(env=env)
    client = km.client()
    client.start_channels()
    await client.wait_for_ready(timeout=seconds(60))
    return client


async def run(client: Any, code: str) -> tuple[dict[str, Any], str]:
    """Run ``code``; its execute_reply content and its stdout."""
    stdout: list[str] = []

    def output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            stdout.append(msg["content"]["text"])

    reply = await client.execute_interactive(code, output_hook=output, timeout=seconds(60))
    return reply["content"], "".join(stdout)


def namespace_of(pid: int) -> str:
    return ip("netns", "identify", str(pid)).strip()


# -- pure parts, and refusals --------------------------------------------------------


def test_a_free_subnet_overlaps_no_address_of_the_host() -> None:
    pool = ipaddress.IPv4Network("10.213.0.0/16")
    used = [
        ipaddress.IPv4Network("10.213.0.0/30"),
        ipaddress.IPv4Network("10.213.0.4/31"),
        ipaddress.IPv4Network("192.0.2.0/24"),
    ]
    assert choose_subnet(pool, used) == ipaddress.IPv4Network("10.213.0.8/30")
    assert choose_subnet(pool, [ipaddress.IPv4Network("10.0.0.0/8")]) is None
    assert namespace_name("3E468ADA-1234") == "kgs-3e468ada"
    assert len(host_interface_name("3e468ada-1234-5678")) <= 15


def test_each_kernel_on_the_host_has_a_user_of_its_own() -> None:
    pool = ipaddress.IPv4Network("10.213.0.0/16")
    users = [
        kernel_user(namespace_name(f"{n:08x}-0000"), subnet, pool, 5000, 7000, "/state")
        for n, subnet in enumerate(pool.subnets(new_prefix=30))
    ]
    assert len({user.uid for user in users}) == len(users) == 2**14
    assert (users[0].uid, users[0].gid, users[-1].uid) == (5000, 7000, 5000 + 2**14 - 1)
    assert users[1] == KernelUser(5001, 7001, "/state/kgs-00000001")
    assert users[1].home == "/state/kgs-00000001/home"
    network = KernelNetwork.for_kernel("00000001-0000", ipaddress.IPv4Network("10.213.0.4/30"))
    with_user = KernelNetwork(network.namespace, network.host_interface, network.subnet, users[1])
    assert KernelNetwork.from_dict(with_user.as_dict()) == with_user  # kept to re-attach
    assert KernelNetwork.from_dict(network.as_dict()) == network
    with pytest.raises(ValueError, match="not in subnet pool"):
        kernel_user("kgs-1", network.subnet, ipaddress.IPv4Network("10.99.0.0/16"), 1, 1, "/s")
    with pytest.raises(ValueError, match="out of range"):
        kernel_user("kgs-1", network.subnet, pool, 2**31 - 2, 5000, "/state")
    assert DEFAULT_UID_BASE > 65535


def test_the_firewall_accepts_only_the_kernels_ports_and_replies() -> None:
    rules = firewall_ruleset("eth0", [20005, 20001, 20003, 20002, 20004])
    input_chain, output_chain = rules.split("chain input")[1].split("chain output")
    assert "policy drop;" in input_chain
    assert "policy drop;" in output_chain
    ports = "{ 20001, 20002, 20003, 20004, 20005 }"
    assert f'iifname "eth0" tcp dport {ports} ct state new accept' in input_chain
    # Nothing the kernel opens leaves the namespace: output keeps loopback and replies.
    assert [line.strip() for line in output_chain.splitlines()][2:4] == [
        'oif "lo" accept',
        "ct state established,related accept",
    ]
    assert "accept" not in output_chain.split("established,related accept")[1]
    assert rules.startswith("table inet kernel_gateway_stream {}\ndelete table")


def test_what_the_kernel_could_not_reach_is_exposed() -> None:
    """The directory netns_enter covers with a tmpfs: the first on the way that the
    kernel's user may not search."""
    with tempfile.TemporaryDirectory() as base:  # not tmp_path: pytest's root is 0700
        os.chmod(base, 0o755)
        closed = Path(base, "closed")
        inside = closed / "python" / "lib"
        inside.mkdir(parents=True)
        closed.chmod(0o700)
        uid, gid = 5000, 5000
        assert blocking_ancestor(str(inside), uid, gid) == str(closed)
        assert blocking_ancestor(str(closed), uid, gid) is None  # itself does not count
        closed.chmod(0o701)  # others may search it now
        assert blocking_ancestor(str(inside), uid, gid) is None
        os.chown(closed, os.getuid(), gid)
        closed.chmod(0o710)  # the group's search bit is the one that counts for gid
        assert blocking_ancestor(str(inside), uid, gid) is None
        assert blocking_ancestor(str(inside), uid, gid + 1) == str(closed)
    assert setpriv_argv("/bin/setpriv", uid, gid, ["python", "-c", "1"]) == [
        "/bin/setpriv",
        "--reuid=5000",
        "--regid=5000",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        *("python", "-c", "1"),
    ]


def test_the_kernelspec_and_its_installer(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "kernel_gateway_stream.kernels.netns", "install"),
            *("--dir", str(tmp_path), "--name", "ns-test", "--subnet-pool", "10.99.0.0/24"),
        ],
        capture_output=True,
        text=True,
        timeout=seconds(60),
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "ns-test" / "kernel.json").read_text())
    assert spec["argv"] == [
        sys.executable,
        "-m",
        "kernel_gateway_stream.kernel_launcher",
        "-f",
        "{connection_file}",
    ]
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": PROVISIONER_NAME,
        "config": {"subnet_pool": "10.99.0.0/24"},
    }
    prefixed = install_netns_kernelspec(tmp_path / "prefix", prefix=True)
    assert prefixed == tmp_path / "prefix" / "share" / "jupyter" / "kernels" / KERNEL_NAME
    with pytest.raises(ValueError, match="invalid kernel name"):
        install_netns_kernelspec(tmp_path, "no spaces")


def test_it_refuses_without_root_or_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(RuntimeError, match="iproute2's 'no-such-ip'") as missing:
        netns.require_netns_support("no-such-ip")
    assert "\n" not in str(missing.value)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match=r"need root \(uid 1000 is not\)") as not_root:
        netns.require_netns_support()
    assert "\n" not in str(not_root.value)


async def test_networks_made_at_once_get_their_own_subnets(sweep: None) -> None:
    pool = ipaddress.IPv4Network(DEFAULT_SUBNET_POOL)
    kernel_ids = [f"{n:08x}-0000-4000-8000-{os.getpid():012x}" for n in range(0xFEED0, 0xFEED4)]
    made = await asyncio.gather(
        *(asyncio.to_thread(netns.create_network, kernel_id, pool) for kernel_id in kernel_ids)
    )
    try:
        assert len({network.subnet for network in made}) == len(kernel_ids)
        assert {network.namespace for network in made} <= listed_namespaces()
        for network in made:
            assert network.subnet.subnet_of(pool)
            assert f"{network.host_address}/30" in ip(
                "-o", "-4", "addr", "show", "dev", network.host_interface
            )
            inside = ip("-n", network.namespace, "-o", "-4", "addr", "show", "dev", "eth0")
            assert f"{network.kernel_address}/30" in inside
    finally:
        for network in made:
            netns.delete_network(network)
            netns.delete_network(network)  # again: nothing left to delete, no error
    assert not {network.namespace for network in made} & listed_namespaces()
    assert not {network.host_interface for network in made} & host_links()


# -- with jupyter_client alone ---------------------------------------------------------


async def test_a_kernel_runs_in_its_own_namespace(kernel_manager: AsyncKernelManager) -> None:
    km = kernel_manager
    client = await start(km)
    try:
        kernel_id = str(km.kernel_id)
        name = namespace_name(kernel_id)
        info = km.get_connection_info()
        address = ipaddress.ip_address(info["ip"])
        assert address in ipaddress.ip_network(DEFAULT_SUBNET_POOL)
        assert info["transport"] == "tcp"
        assert json.loads(Path(km.connection_file).read_text())["ip"] == str(address)
        assert name in listed_namespaces()
        assert host_interface_name(kernel_id) in host_links()
        assert namespace_of(km.provisioner.pid) == name  # type: ignore[union-attr]
        assert km.watch_heartbeat is True  # type: ignore[attr-defined]

        reply, stdout = await run(client, "print(1+1)")
        assert (reply["status"], stdout) == ("ok", "2\n")
        # The kernel sees only its namespace's interfaces, and the address is its own.
        reply, stdout = await run(
            client,
            "import socket, subprocess\n"
            "print(sorted(name for _, name in socket.if_nameindex()))\n"
            "print(subprocess.run(['ip', '-4', '-o', 'addr', 'show', 'eth0'],"
            " capture_output=True, text=True).stdout.split()[3])",
        )
        interfaces, own_address = stdout.splitlines()
        assert interfaces == "['eth0', 'lo']"
        assert own_address.split("/")[0] == str(address)
        # It runs as its user, in its own home, reading its copy of the connection file.
        user = km.provisioner.network.user  # type: ignore[union-attr]
        assert user is not None
        assert user.uid >= DEFAULT_UID_BASE
        home = os.stat(user.home)
        assert (home.st_uid, home.st_gid, stat.S_IMODE(home.st_mode)) == (
            user.uid,
            user.gid,
            0o700,
        )
        _, stdout = await run(
            client,
            "import os, json\n"
            "from ipykernel.kernelapp import IPKernelApp\n"
            "print(json.dumps([os.getuid(), os.getgid(), os.getgroups(), os.getcwd(),"
            " os.environ['HOME'], IPKernelApp.instance().connection_file]))",
        )
        assert json.loads(stdout) == [
            user.uid,
            user.gid,
            [],
            user.home,
            user.home,
            user.connection_file,
        ]
        # The host reaches it over TCP, at that address.
        for port in (info["shell_port"], info["hb_port"]):
            with socket.create_connection((str(address), port), timeout=seconds(10)):
                pass
    finally:
        client.stop_channels()
        await km.shutdown_kernel()
    assert name not in listed_namespaces()
    assert host_interface_name(kernel_id) not in host_links()
    assert not Path(user.directory).exists()


async def test_interrupt_and_restart_keep_the_namespace(
    kernel_manager: AsyncKernelManager,
) -> None:
    km = kernel_manager
    client = await start(km)
    try:
        name = namespace_name(str(km.kernel_id))
        info = km.get_connection_info()
        first_pid = km.provisioner.pid  # type: ignore[union-attr]
        user = km.provisioner.network.user  # type: ignore[union-attr]
        # The line is printed without flush=True: a flush makes the cell wait (a
        # threading.Event) for ipykernel's IO thread to send it, and the SIGINT below, sent
        # as the line arrives, lands as that wait ends. A KeyboardInterrupt raised as
        # Condition.wait takes its lock back leaves the lock released, and the cell then
        # raises "RuntimeError: release unlocked lock" in its place (CPython's
        # python/cpython#118433, #78667: this test got that RuntimeError once). Unflushed,
        # the IO thread sends the line on its own 0.2 s later, while the cell sleeps.
        msg_id = client.execute("import time\nprint('sleeping')\ntime.sleep(600)")
        while True:  # until the cell runs
            msg = await client.get_iopub_msg(timeout=seconds(60))
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                break
        await km.interrupt_kernel()  # SIGINT, through ip netns exec's process
        reply = await client.get_shell_msg(timeout=seconds(60))
        while reply["parent_header"]["msg_id"] != msg_id:
            # A late kernel_info_reply of wait_for_ready (it asks more than once).
            assert reply["msg_type"] == "kernel_info_reply", reply["msg_type"]
            reply = await client.get_shell_msg(timeout=seconds(60))
        content = reply["content"]
        assert (content["status"], content["ename"]) == ("error", "KeyboardInterrupt"), (
            content.get("evalue"),
            content.get("traceback"),
        )

        await km.restart_kernel()
        await client.wait_for_ready(timeout=seconds(60))
        assert km.get_connection_info() == info  # same address, ports and key
        assert name in listed_namespaces()
        second_pid = km.provisioner.pid  # type: ignore[union-attr]
        assert second_pid != first_pid
        assert namespace_of(second_pid) == name
        reply, stdout = await run(client, "import os\nprint(os.getpid())")
        assert stdout == f"{second_pid}\n"  # ip netns exec became the kernel
        assert km.provisioner.network.user == user  # type: ignore[union-attr]
        _, stdout = await run(client, "import os\nprint(os.getuid())")
        assert stdout == f"{user.uid}\n"
    finally:
        client.stop_channels()
        await km.shutdown_kernel()
    assert name not in listed_namespaces()


async def test_a_crashed_kernel_leaves_no_namespace(kernel_manager: AsyncKernelManager) -> None:
    km = kernel_manager
    client = await start(km)
    name = namespace_name(str(km.kernel_id))
    try:
        # A process that left the kernel's process group still runs in the namespace;
        # another made a user and network namespace of its own (any user may), out of
        # the reach of `ip netns pids`.
        _, stdout = await run(
            client,
            "import subprocess\n"
            "print(subprocess.Popen(['sleep', '600'], start_new_session=True).pid)\n"
            "nested = subprocess.Popen(['unshare', '-Urn', 'sh', '-c', 'echo in; sleep 600'],"
            " start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
            "assert nested.stdout.readline() == 'in\\n'\n"
            "print(nested.pid)",
        )
        escaped, nested = map(int, stdout.split())
        assert namespace_of(nested) != name
        os.kill(km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
        deadline = time.monotonic() + seconds(30)
        while await km.is_alive():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    finally:
        client.stop_channels()
    # What the gateway does for a kernel that died for good; twice is harmless.
    await km.cleanup_resources()
    await km.cleanup_resources()
    assert name not in listed_namespaces()
    assert host_interface_name(str(km.kernel_id)) not in host_links()
    deadline = time.monotonic() + seconds(30)
    for pid in (escaped, nested):
        while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
            assert time.monotonic() < deadline, f"the escaped process {pid} was not killed"
            await asyncio.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "gone"


# -- through the daemon ----------------------------------------------------------------


async def transcript_records(
    client: GatewayClient, kernel_id: str, **filters: Any
) -> list[dict[str, Any]]:
    """Every record of the transcript (all its pages)."""
    records: list[dict[str, Any]] = []
    since = 0
    while True:
        page = await client.transcript(kernel_id, since=since, limit=10000, **filters)
        records.extend(page["records"])
        if page["next_since"] >= page["head"] or not page["records"]:
            return records
        since = page["next_since"]


async def test_a_flood_through_the_daemon_is_recorded_whole(netns_daemon: Daemon) -> None:
    daemon = netns_daemon
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        kernel_id = await client.start_kernel(KERNEL_NAME)
        name = namespace_name(kernel_id)
        assert name in listed_namespaces()
        assert any(
            pid in daemon.kernel_pids() for pid in map(int, ip("netns", "pids", name).split())
        )
        result = await asyncio.wait_for(
            client.execute(kernel_id, flood_code(20000)),
            seconds(180),
        )
        assert result.ok
        text = await client.transcript_text(kernel_id, parent=result.msg_id)
        assert text == flood_text(20000)
        await client.shutdown(kernel_id)
    assert name not in listed_namespaces()
    assert host_interface_name(kernel_id) not in host_links()


async def test_a_link_that_fails_mid_run_loses_nothing(netns_daemon: Daemon) -> None:
    daemon = netns_daemon
    daemon.start("--TapManager.heartbeat_interval=0.5", "--TapManager.heartbeat_timeout=2")
    await daemon.wait_ready()
    lines = 400  # one every 20 ms: about 8 s
    code = f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n    time.sleep(0.02)"
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        kernel_id = await client.start_kernel(KERNEL_NAME)
        link = host_interface_name(kernel_id)
        await client.execute(kernel_id, "print('ready')")  # tapped and answering
        msg_id = await client.start_execution(kernel_id, code)
        deadline = time.monotonic() + seconds(60)
        while len((await client.transcript_text(kernel_id, parent=msg_id)).splitlines()) < 20:
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.05)

        states: list[str] = []
        ip("link", "set", link, "down")
        try:
            # Down until the gateway has seen it (its heartbeat times out after 2 s), or
            # for at most the deadline: then the rest of the test says what happened.
            deadline = time.monotonic() + seconds(20)
            while time.monotonic() < deadline:
                state = (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"]
                states.append(state)
                if state == "unreachable":
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2)  # and longer: the outage outlasts its detection
        finally:
            ip("link", "set", link, "up")

        deadline = time.monotonic() + seconds(60)
        while (await daemon.fetch(f"/api/kernels/{kernel_id}"))["execution_state"] == (
            "unreachable"
        ):
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.1)

        async def until_done() -> None:
            async for event in client.execution_events(kernel_id, msg_id):
                if event.event == "done":
                    return

        await asyncio.wait_for(until_done(), seconds(120))
        text = await client.transcript_text(kernel_id, parent=msg_id)
        assert text == "".join(f"{i}\n" for i in range(lines))

        records = await transcript_records(client, kernel_id)
        marks = [
            (r["seq"], r["content"].get("event")) for r in records if r["msg_type"] == LIFECYCLE
        ]
        events = [event for _, event in marks]
        assert "unreachable" in states, f"execution_state during the outage: {sorted(set(states))}"
        assert events[:2] == ["unreachable", "reachable"], f"lifecycle records: {marks}"
        # The TCP connection survived the outage: nothing was lost, so no gap record.
        assert not [r for r in records if r["msg_type"] == GAP]
        await client.shutdown(kernel_id)
    assert namespace_name(kernel_id) not in listed_namespaces()


async def interrupt_reaches(client: GatewayClient, kernel_id: str) -> None:
    """A long sleep on ``kernel_id`` ends ``interrupted`` when the kernel is interrupted."""
    msg_id = await client.start_execution(kernel_id, "import time; time.sleep(600)")

    def status_is(wanted: str) -> Any:
        async def check() -> bool:
            return (await client.execution(kernel_id, msg_id)).status == wanted

        return check

    await wait_until(status_is("running"), "the sleep to start", timeout=60)
    await client.interrupt(kernel_id)
    await wait_until(status_is("interrupted"), "the interrupt", timeout=60)


async def test_a_kernel_re_attached_after_a_gateway_crash_takes_its_namespace_with_it(
    netns_daemon: Daemon,
) -> None:
    """The gateway is SIGKILLed; its netns kernel runs on in its namespace and is
    re-attached at the next start. Shut down then, it leaves no namespace and no veth."""
    daemon = netns_daemon
    daemon.start()
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
        kernel_id = await client.start_kernel(KERNEL_NAME)
        assert (await client.execute(kernel_id, "state = 'kept'")).ok
        home = (await client.execute(kernel_id, "import os\nprint(os.getcwd())")).stdout
    kernel_directory = Path(home.strip()).parent
    assert kernel_directory.is_dir()
    name = namespace_name(kernel_id)
    pids = [int(pid) for pid in ip("netns", "pids", name).split()]
    try:
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait()
        daemon.start()
        await daemon.wait_ready()
        async with GatewayClient(daemon.url, TOKEN, request_timeout=seconds(60)) as client:
            result = await client.execute(kernel_id, "print(state)")
            assert result.stdout == "kept\n", daemon.log_text()
            # Interrupted by message: its process cannot be told from the gateway's side.
            await interrupt_reaches(client, kernel_id)
            await client.shutdown(kernel_id)
        deadline = time.monotonic() + seconds(30)
        while name in listed_namespaces() or host_interface_name(kernel_id) in host_links():
            assert time.monotonic() < deadline, daemon.log_text()
            await asyncio.sleep(0.2)
        assert not kernel_directory.exists()
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
