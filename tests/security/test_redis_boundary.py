"""Redis as a boundary: what code in a kernel can do to the nodes through Redis.

Item 3 of the hardening issue, against real daemons, real ipykernels and real Redis
servers: the suite's (no password, so that the kernels reach it: the worst case, allowed
on purpose with ``allow_unauthenticated_redis``) and one of each test's own that asks for
a password. Every attack is code run in a kernel; where it can be shown, a control runs
the same attack with what the kernel lacks (the cluster secret) and sees it land, so the
test could fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient

from kernel_gateway_stream.stores.redis_trust import EntrySigner

from ..integration.daemon import TOKEN, Daemon, free_port
from ..integration.redis_server import RedisServer, require_redis_server
from ..integration.test_several_nodes import CLUSTER_SECRET, Cluster, redis_url, until
from ..timing import seconds
from .test_secrets import run_in_kernel

#: Several daemons each, and the mid-flood tests share their set-up: one worker, in order.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("several-nodes")]

#: Kernel code: take the kernel's lease for a node of its own making (no expiry, so that
#: no node renews or takes it) and give that node the URL of the attacker's listener. A
#: restart asked of a node that follows the kernel goes to the lease holder's URL.
HIJACK = """
import redis
r = redis.Redis.from_url({url!r})
r.hset({nodes!r}, "evil", {listener!r})
r.set({lease!r}, "evil:1")
"""

#: Kernel code: copy the real kernel's directory entry under ids of its own, once with its
#: signature stripped and once as it is.
FORGE = """
import redis
r = redis.Redis.from_url({url!r})
entry = r.hget({kernels!r}, {kernel_id!r})
r.hset({kernels!r}, {unsigned!r}, entry.split(b".", 2)[2])
r.hset({kernels!r}, {copied!r}, entry)
print("written")
"""

#: Kernel code: look for Redis's password where a kernel can read: its environment, the
#: gateway's argument and environment blocks, the gateway's log file.
HUNT = """
import json, os
password = {password!r}
found = []
found += [["env", name] for name, value in os.environ.items() if password in value]
for path in ["/proc/%d/cmdline" % os.getppid(), "/proc/%d/environ" % os.getppid(), {log!r}]:
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    found += [[path]] if password.encode() in data else []
print(json.dumps(found))
"""


class Listener:
    """An HTTP listener the test owns (the attacker's): it records each request's head and
    answers ``200 {}``, as a fake node would."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            self.requests.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
            )
            await writer.drain()
        writer.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, on a free port, that asks for a password."""
    require_redis_server()
    instance = RedisServer(tmp_path / "redis", f"redis-pw-{uuid.uuid4().hex}")
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[Cluster]:
    """Two nodes on the suite's Redis (no password, allowed on purpose: kernels reach it)."""
    instance = Cluster(tmp_path, redis_url(), names="ab")
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
        instance.clean()


async def _listed(node: Daemon, kernel_id: str) -> bool:
    kernels = await node.fetch("/api/kernels")
    return any(k["id"] == kernel_id for k in kernels)


async def _restart(node: Daemon, kernel_id: str) -> tuple[int, dict[str, Any]]:
    response = await AsyncHTTPClient().fetch(
        f"{node.url}/api/kernels/{kernel_id}/restart",
        method="POST",
        body="{}",
        headers=node.headers,
        raise_error=False,
    )
    return response.code, json.loads(response.body or b"null")


def _kill(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_kernel_code_pointing_a_node_entry_at_its_listener_gets_no_token(
    two_nodes: Cluster,
) -> None:
    """Kernel code takes its kernel's lease for a node it names and gives that node its
    own listener's URL. A restart asked of the node that follows the kernel is not
    forwarded there (the entry is not signed): the client gets a JSON 502, the listener
    nothing, and the node says so in its log. Control: the same entry signed with the
    cluster secret is followed, token and all, and the client gets the listener's fake
    ``200 {}``: only the secret stands between the kernel and the token."""
    await two_nodes.wait_ready()
    a, b = two_nodes.nodes["a"], two_nodes.nodes["b"]
    listener = Listener()
    await listener.start()
    kernel_id = await a.start_kernel()
    pid = int(await run_in_kernel(a, kernel_id, "import os; print(os.getpid())"))
    import redis

    client = redis.Redis.from_url(two_nodes.url)
    try:
        await until(lambda: _listed(b, kernel_id), 30, "the kernel on B")
        keys = two_nodes.prefix
        code = HIJACK.format(
            url=two_nodes.url,
            lease=f"{keys}{{{kernel_id}}}:lease",
            nodes=f"{keys}nodes",
            listener=listener.url,
        )
        # Not waited for: once its lease is taken, no node records the kernel's output.
        ws = await a.channels(kernel_id)
        ws.execute(code)

        async def hijacked() -> bool:
            return bool(client.get(f"{keys}{{{kernel_id}}}:lease") == b"evil:1")

        await until(hijacked, 30, "the kernel's code to take the lease")
        ws.close()

        status, body = await _restart(b, kernel_id)
        assert status == 502, body
        assert body["reason"] == "node_entry_not_trusted"
        assert listener.requests == []
        assert "not forwarding POST" in b.log_text()

        # Control: what a node would write, signed with the secret the kernel lacks.
        signer = EntrySigner(CLUSTER_SECRET.encode())
        client.hset(f"{keys}nodes", "evil", signer.sign("node", "evil", listener.url.encode()))
        status, body = await _restart(b, kernel_id)
        assert (status, body) == (200, {})
        assert len(listener.requests) == 1
        assert f"token {TOKEN}".encode() in listener.requests[0]
    finally:
        client.close()
        listener.close()
        _kill(pid)


async def test_kernel_code_cannot_have_a_node_attach_a_kernel_entry_it_wrote(
    two_nodes: Cluster,
) -> None:
    """Kernel code copies its kernel's directory entry (connection info and key) under
    ids of its own, signature stripped or kept: no node attaches either (the id is
    signed too), and each refusal is logged. Control: the same payload signed with the
    cluster secret under a third id is attached and listed."""
    await two_nodes.wait_ready()
    a, b = two_nodes.nodes["a"], two_nodes.nodes["b"]
    kernel_id = await a.start_kernel()
    unsigned, copied, control = (str(uuid.uuid4()) for _ in range(3))
    pid = int(await run_in_kernel(a, kernel_id, "import os; print(os.getpid())"))
    try:
        await until(lambda: _listed(b, kernel_id), 30, "the kernel on B")
        kernels = f"{two_nodes.prefix}kernels"
        code = FORGE.format(
            url=two_nodes.url,
            kernels=kernels,
            kernel_id=kernel_id,
            unsigned=unsigned,
            copied=copied,
        )
        assert await run_in_kernel(a, kernel_id, code) == "written\n"

        async def refused() -> bool:
            log = b.log_text()
            return all(
                f"Kernel {forged} of the directory in Redis is not attached" in log
                for forged in (unsigned, copied)
            )

        await until(refused, 30, "B's refusal of both forged entries")
        listed = {k["id"] for k in await b.fetch("/api/kernels")}
        assert kernel_id in listed
        assert not listed & {unsigned, copied}

        # Control: the payload signed with the secret the kernel lacks is attached.
        import redis

        client = redis.Redis.from_url(two_nodes.url)
        try:
            entry = client.hget(kernels, kernel_id)
            payload = entry.split(b".", 2)[2]
            signer = EntrySigner(CLUSTER_SECRET.encode())
            client.hset(kernels, control, signer.sign("kernel", control, payload))
        finally:
            client.close()
        await until(lambda: _listed(b, control), 30, "the signed entry attached on B")
    finally:
        # Shut down through its node, not only killed: A's restarter would start the kernel
        # again, and a node of a cluster leaves its kernels running when it stops (another
        # node may take them over), so the new one outlived the suite (seen after a run).
        with contextlib.suppress(Exception):
            await a.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
        _kill(pid)


@pytest.mark.parametrize(
    ("form", "given"),
    [("userinfo", "argument"), ("query", "argument"), ("query", "environment")],
)
async def test_redis_password_is_in_no_log_health_body_or_argument(
    own_redis: RedisServer, tmp_path: Path, form: str, given: str
) -> None:
    """One node on a Redis that asks for a password, given in either URL form, on the
    command line or in KGS_REDIS_URL: the password is in no log line (DEBUG), not in the
    health body (which names the Redis, redacted), and not in the node's argument block,
    neither as a kernel reads it nor as the test does. On the command line, the log says
    to use the environment variable instead."""
    await own_redis.wait_ready()
    password = own_redis.password
    where = f"127.0.0.1:{own_redis.port}/0"
    url = (
        f"redis://default:{password}@{where}"
        if form == "userinfo"
        else f"redis://{where}?password={password}"
    )
    node = _daemon(tmp_path / "node")
    env = {"KGS_CLUSTER_SECRET": CLUSTER_SECRET}
    args = ["--log-level=DEBUG", f"--RedisTranscriptStore.key_prefix=kgs-test-{form}:"]
    if given == "argument":
        args.append(f"--GatewayStreamApp.redis_url={url}")
    else:
        env["KGS_REDIS_URL"] = url
    node.start(*args, env=env)
    try:
        await node.wait_ready()
        kernel_id = await node.start_kernel()
        found = await run_in_kernel(
            node, kernel_id, HUNT.format(password=password, log=str(node.log))
        )
        assert json.loads(found) == []
        health = await AsyncHTTPClient().fetch(
            f"{node.url}/api/gateway/health", headers=node.headers, raise_error=False
        )
        named = json.loads(health.body)["components"]["store"]["redis"]
        assert named.endswith("password=***") or "default:***@" in named
        assert where in named
        assert password.encode() not in health.body
        assert node.process is not None
        cmdline = Path(f"/proc/{node.process.pid}/cmdline").read_bytes()
        assert password.encode() not in cmdline
        assert b"--GatewayStreamApp.redis_url=" in cmdline or given == "environment"
    finally:
        _stop_leaving_no_kernel(node)
    log = node.log_text()
    assert password not in log
    told = "give the URL in the KGS_REDIS_URL environment variable instead" in log
    assert told == (given == "argument")


def _daemon(home: Path) -> Daemon:
    home.mkdir()
    return Daemon(home)


def _stop_leaving_no_kernel(node: Daemon) -> None:
    """Stop ``node`` gracefully, then end the kernels it started: a node of a cluster that
    stops leaves its kernels running for the other nodes to take over, and here there is
    none (each such run left its kernels behind, for ever)."""
    kernels = node.kernel_pids()
    node.stop()
    for pid in kernels:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _refused(node: Daemon) -> str:
    """The last line of a daemon that must exit at start-up, once it has."""
    assert node.process is not None
    code = node.process.wait(seconds(60))
    assert code != 0, node.log_text()[-3000:]
    return node.log_text().strip().splitlines()[-1]


async def test_a_start_on_a_redis_without_password_is_refused(tmp_path: Path) -> None:
    """A node on a Redis that answers a client giving no password (as a kernel would
    connect) stops at start-up with one line naming the option; control: with the option
    it starts, and warns."""
    url = redis_url()
    prefix = f"--RedisTranscriptStore.key_prefix=kgs-test-{uuid.uuid4().hex[:8]}:"
    env = {"KGS_REDIS_URL": url, "KGS_CLUSTER_SECRET": CLUSTER_SECRET}
    refused = _daemon(tmp_path / "refused")
    refused.start(prefix, env=env)
    line = _refused(refused)
    assert line.startswith("kernel-gateway-stream: refusing to run as one node of several")
    assert "allow_unauthenticated_redis" in line

    allowed = _daemon(tmp_path / "allowed")
    allowed.start(prefix, "--ClusterNode.allow_unauthenticated_redis=True", env=env)
    try:
        await allowed.wait_ready()
    finally:
        allowed.stop()
    assert "a client that gives no password (allow_unauthenticated_redis)" in allowed.log_text()


async def test_a_start_without_a_cluster_secret_is_refused(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """Several nodes need the cluster secret, even on a Redis that asks for a password;
    a short one is refused too. Control: with one, the node starts."""
    await own_redis.wait_ready()
    url = f"redis://:{own_redis.password}@127.0.0.1:{own_redis.port}/0"
    for secret in ("", "short"):
        node = _daemon(tmp_path / f"secret-{len(secret)}")
        node.start(env={"KGS_REDIS_URL": url, "KGS_CLUSTER_SECRET": secret})
        line = _refused(node)
        assert line.startswith("kernel-gateway-stream: several nodes need a cluster secret")
    node = _daemon(tmp_path / "with-secret")
    node.start(env={"KGS_REDIS_URL": url, "KGS_CLUSTER_SECRET": CLUSTER_SECRET})
    try:
        await node.wait_ready()
    finally:
        node.stop()
    assert node.process is not None
    assert node.process.returncode == 0, node.log_text()[-3000:]


async def test_kernel_code_finds_the_cluster_secret_nowhere(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """The cluster secret, given in KGS_CLUSTER_SECRET, reaches no kernel: not its
    environment, nor the gateway's argument or environment blocks, nor the log."""
    await own_redis.wait_ready()
    node = _daemon(tmp_path / "node")
    url = f"redis://:{own_redis.password}@127.0.0.1:{own_redis.port}/0"
    node.start(env={"KGS_REDIS_URL": url, "KGS_CLUSTER_SECRET": CLUSTER_SECRET})
    try:
        await node.wait_ready()
        kernel_id = await node.start_kernel()
        found = await run_in_kernel(
            node, kernel_id, HUNT.format(password=CLUSTER_SECRET, log=str(node.log))
        )
        assert json.loads(found) == []
    finally:
        _stop_leaving_no_kernel(node)
