"""``kgs`` as a user runs it, in a subprocess: what it prints and how it exits when the
gateway is unreachable, when the user presses Ctrl-C, when the terminal closes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from kernel_gateway_stream.client import SyncGatewayClient

from ..timing import seconds
from .daemon import TOKEN, Daemon, free_port
from .scripted import HANG, ScriptedGateway, sse, sse_response


def kgs_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "kernel_gateway_stream.cli", *argv]


def kgs(*argv: str, url: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KGS_URL=url, KGS_TOKEN=TOKEN)
    return subprocess.run(
        kgs_command(*argv), env=env, capture_output=True, text=True, timeout=seconds(timeout)
    )


def start_kgs(*argv: str, url: str) -> subprocess.Popen[str]:
    env = dict(os.environ, KGS_URL=url, KGS_TOKEN=TOKEN)
    return subprocess.Popen(
        kgs_command(*argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=seconds(60))
    return process.returncode, stdout, stderr


def stopped_quietly(process: subprocess.Popen[str]) -> tuple[int, str, list[str]]:
    """Its exit status, the rest of its stdout, and what kgs itself said on stderr (the
    kernel's own stderr, which kgs relays, is left out: a kernel may print warnings)."""
    code, stdout, stderr = finish(process)
    assert "Traceback" not in stderr, stderr
    return code, stdout, [line for line in stderr.splitlines() if line.startswith("kgs:")]


#: The tests on the module's one daemon run on one worker, so that it starts once.
SHARED_DAEMON = pytest.mark.xdist_group("test_kgs-daemon")


def kernel_ids(daemon: Daemon) -> set[str]:
    """The kernels running on ``daemon`` (the module's: a test compares before and after)."""
    with SyncGatewayClient(daemon.url, TOKEN) as client:
        return {kernel["id"] for kernel in client.list_kernels()}


def start_run(daemon: Daemon, *options: str, ignore_sigint: bool = False) -> Any:
    """``kgs run`` of code that sleeps a minute, once the code runs."""
    program = "import time\nprint('ready', flush=True)\ntime.sleep(60)"
    if ignore_sigint:
        program = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + program
    running = start_kgs("run", *options, "-c", program, url=daemon.url)
    assert running.stdout is not None
    assert running.stdout.readline() == "ready\n"
    return running


@pytest.mark.parametrize(
    "argv",
    [("kernels",), ("follow", "k1"), ("export", "k1"), ("run", "-c", "1")],
    ids=["kernels", "follow", "export", "run"],
)
def test_an_unreachable_gateway_is_one_line_and_exit_3(argv: tuple[str, ...]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = kgs(*argv, url=url, timeout=30)
    assert done.returncode == 3
    assert done.stderr.startswith(f"kgs: cannot reach the gateway at {url}: ")
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_follow_does_not_retry_a_gateway_it_never_reached() -> None:
    """Fail fast: one connection attempt, not retries with growing pauses (~47 s before)."""
    server = ScriptedGateway([])  # closes each connection without answering
    try:
        done = kgs("follow", "k1", url=server.url, timeout=30)
    finally:
        server.close()
    assert done.returncode == 3
    assert len(server.requests) == 1
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("argv", [("follow", "k1"), ("export", "k1"), ("kernels",)])
def test_ctrl_c_while_waiting_exits_130_quietly(argv: tuple[str, ...]) -> None:
    server = ScriptedGateway([HANG])  # accepts, never answers
    try:
        running = start_kgs(*argv, url=server.url)
        server.wait_accepted()
        running.send_signal(signal.SIGINT)
        code, stdout, stderr = finish(running)
    finally:
        server.close()
    assert (code, stdout, stderr) == (130, "", "")


def test_follow_says_on_stderr_that_it_reconnects() -> None:
    def out(text: str, seq: int) -> bytes:
        return sse("stream", {"content": {"name": "stdout", "text": text}}, seq)

    server = ScriptedGateway(
        [
            sse_response(out("one\n", 1)),  # then the connection drops
            sse_response(out("two\n", 2), sse("kernel_shutdown", {})),
        ]
    )
    try:
        done = kgs("follow", "k1", url=server.url, timeout=60)
    finally:
        server.close()
    assert done.returncode == 0
    assert done.stdout == "one\ntwo\n"
    reconnecting, shut_down = done.stderr.splitlines()
    assert reconnecting.startswith("kgs: the gateway ended the stream; reconnecting in ")
    assert reconnecting.endswith(", resuming after seq 1")
    assert shut_down == "kgs: the kernel shut down"
    assert server.requests[1][1]["last-event-id"] == "1"


@SHARED_DAEMON
def test_export_since_in_text(module_daemon: Daemon) -> None:
    daemon = module_daemon
    with SyncGatewayClient(daemon.url, TOKEN) as client:
        kernel_id = client.start_kernel()
        early = client.execute(kernel_id, "print('early')")
        head = list(client.execution_events(kernel_id, early.msg_id))[-1].id
        assert head is not None
        client.execute(kernel_id, "print('late')")
        client.shutdown(kernel_id)
    assert kgs("export", kernel_id, url=daemon.url).stdout == "early\nlate\n"
    since = kgs("export", kernel_id, "--since", str(head), url=daemon.url)
    assert (since.returncode, since.stdout) == (0, "late\n")
    jsonl = kgs("export", kernel_id, "--since", str(head), "--format", "jsonl", url=daemon.url)
    assert [json.loads(line)["seq"] > head for line in jsonl.stdout.splitlines()] == [True] * len(
        jsonl.stdout.splitlines()
    )


@SHARED_DAEMON
def test_ctrl_c_on_a_live_follow_exits_130_quietly(module_daemon: Daemon) -> None:
    daemon = module_daemon
    with SyncGatewayClient(daemon.url, TOKEN) as client:
        kernel_id = client.start_kernel()
        client.execute(kernel_id, "print('early')")
        follower = start_kgs("follow", kernel_id, "--since", "0", url=daemon.url)
        assert follower.stdout is not None
        assert follower.stdout.readline() == "early\n"
        client.execute(kernel_id, "print('late')")
        assert follower.stdout.readline() == "late\n"
        follower.send_signal(signal.SIGINT)
        assert stopped_quietly(follower) == (130, "", [])
        client.shutdown(kernel_id)


@SHARED_DAEMON
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stopped_run_shuts_its_kernel_down(module_daemon: Daemon, signum: int, code: int) -> None:
    """SIGTERM, or SIGHUP from a closed terminal: the kernel ``kgs run`` started does not
    outlive it."""
    before = kernel_ids(module_daemon)
    running = start_run(module_daemon)
    assert len(kernel_ids(module_daemon) - before) == 1  # the run's, while it runs
    running.send_signal(signum)
    assert stopped_quietly(running) == (code, "", [])
    assert kernel_ids(module_daemon) == before


@SHARED_DAEMON
def test_a_stopped_run_with_keep_leaves_its_kernel_and_says_which(module_daemon: Daemon) -> None:
    before = kernel_ids(module_daemon)
    running = start_run(module_daemon, "--keep")
    running.send_signal(signal.SIGTERM)
    code, _, said = stopped_quietly(running)
    kept = kernel_ids(module_daemon) - before
    assert len(kept) == 1
    (kernel_id,) = kept
    with SyncGatewayClient(module_daemon.url, TOKEN) as client:
        assert code == 143
        assert said == [f"kgs: kernel {kernel_id} kept"]
        client.shutdown(kernel_id)


@SHARED_DAEMON
def test_a_second_ctrl_c_stops_waiting_for_the_interrupt(module_daemon: Daemon) -> None:
    """The first Ctrl-C interrupts the kernel; code that ignores it is left behind by the
    second, and the kernel is shut down."""
    daemon = module_daemon
    before = kernel_ids(daemon)
    running = start_run(daemon, ignore_sigint=True)
    assert running.stderr is not None
    running.send_signal(signal.SIGINT)
    told = " "
    while told and not told.startswith("kgs:"):  # past the kernel's own stderr
        told = running.stderr.readline()
    assert told == "kgs: interrupting the kernel (Ctrl-C again to stop waiting)\n"
    running.send_signal(signal.SIGINT)  # the code ignores the interrupt: stop waiting
    assert stopped_quietly(running) == (130, "", [])
    assert kernel_ids(daemon) == before


@SHARED_DAEMON
def test_follow_says_where_the_kernel_restarted_and_keeps_following(
    module_daemon: Daemon,
) -> None:
    """A restart is an epoch boundary on every surface: ``kgs follow`` says on stderr
    where the kernel's new life begins, between the old life's output and the new."""
    daemon = module_daemon
    with SyncGatewayClient(daemon.url, TOKEN) as client:
        kernel_id = client.start_kernel()
        client.execute(kernel_id, "print('before')")
        follower = start_kgs("follow", kernel_id, "--since", "0", url=daemon.url)
        assert follower.stdout is not None
        assert follower.stderr is not None
        assert follower.stdout.readline() == "before\n"
        client.restart(kernel_id)
        assert (
            follower.stderr.readline()
            == "kgs: the kernel restarted (restart_requested): life 1 begins\n"
        )
        client.execute(kernel_id, "print('after')")
        assert follower.stdout.readline() == "after\n"
        follower.send_signal(signal.SIGINT)
        finish(follower)
        client.shutdown(kernel_id)
