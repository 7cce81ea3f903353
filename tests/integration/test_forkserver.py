"""Local kernels forked from the kernel forkserver: the kernel an exec would have started,
and an exec wherever a fork could not be that kernel."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import pytest

from kernel_gateway_stream.core.forking import FORKSERVER_MODULE, LAUNCHER_MODULE

from .daemon import Daemon
from .waits import wait_until

pytestmark = pytest.mark.timeout(300)

#: What a kernel reports of itself: its parent's command line, its own, its working
#: directory, ``sys.argv``, ``sys.path[0]``, a variable of its kernelspec, the token's
#: variable, a draw of ``random``, what its stdin is, its pid and its parent's, whether
#: it is dumpable, and whether the environment block it was exec'd with names its
#: kernelspec's variable.
REPORT = """
import ctypes, json, os, random, stat, sys
def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\\0", b" ").decode().strip()
print(json.dumps({
    "parent": cmdline(os.getppid()),
    "self": cmdline(os.getpid()),
    "pgid_is_pid": os.getpgid(0) == os.getpid(),
    "cwd": os.getcwd(),
    "argv": sys.argv,
    "path0": sys.path[0],
    "marker": os.environ.get("KGS_FORK_TEST"),
    "token": os.environ.get("JUPYTER_TOKEN"),
    "random": random.random(),
    "stdin_is_char_device": stat.S_ISCHR(os.fstat(0).st_mode),
    "pid": os.getpid(),
    "parent_pid": os.getppid(),
    "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
    "exec_block_has_marker": b"KGS_FORK_TEST" in open("/proc/self/environ", "rb").read(),
}))
"""


def install_kernelspec(
    daemon: Daemon, name: str, env: dict[str, str], options: list[str] | None = None
) -> None:
    directory = daemon.home / "data" / "kernels" / name
    directory.mkdir(parents=True)
    command = [sys.executable, *(options or []), "-m", "ipykernel_launcher"]
    spec = {
        "argv": [*command, "-f", "{connection_file}"],
        "display_name": name,
        "language": "python",
        "env": env,
    }
    (directory / "kernel.json").write_text(json.dumps(spec))


async def report(daemon: Daemon, kernel_id: str) -> dict[str, object]:
    ws = await daemon.channels(kernel_id)
    try:
        received = await ws.until_idle(ws.execute(REPORT))
    finally:
        ws.close()
    found: dict[str, object] = json.loads(received.text())
    return found


async def test_kernels_are_forked_and_are_what_an_exec_starts(daemon: Daemon) -> None:
    install_kernelspec(daemon, "marked", {"KGS_FORK_TEST": "from the kernelspec"})
    daemon.start()
    await daemon.wait_ready()
    first = await daemon.start_kernel("marked")
    second = await daemon.start_kernel("marked")
    reports = [await report(daemon, kernel_id) for kernel_id in (first, second)]
    for kernel_id, found in zip((first, second), reports, strict=True):
        assert FORKSERVER_MODULE in str(found["parent"]), found
        assert LAUNCHER_MODULE in str(found["self"]), found
        assert f"kernel-{kernel_id}.json" in str(found["self"]), found
        assert found["pgid_is_pid"] is True
        assert found["cwd"] == found["path0"] == os.path.realpath(daemon_root(daemon))
        argv = found["argv"]
        assert isinstance(argv, list)
        assert argv[1:] == ["-f", argv[2]], argv
        assert str(argv[2]).endswith(f"kernel-{kernel_id}.json")
        assert found["marker"] == "from the kernelspec"
        assert found["token"] is None  # the gateway's secrets stay out, forked or not
        assert found["stdin_is_char_device"] is True
        # It holds no socket of its parent's (the forkserver's end of the socket pair).
        assert not sockets(int(str(found["pid"]))) & sockets(int(str(found["parent_pid"])))
        assert found["dumpable"] == 1  # the forkserver is not; its forks are again
        # /proc/<pid>/environ shows the forkserver's own start: no kernelspec's variables.
        assert found["exec_block_has_marker"] is False
    assert reports[0]["random"] != reports[1]["random"]  # reseeded in each fork
    # The gateway's kernel list finds them; each one ends when asked, and is reaped.
    pids = daemon.kernel_pids()
    assert len(pids) == 2
    for kernel_id in (first, second):
        await daemon.fetch(f"/api/kernels/{kernel_id}", method="DELETE")
    assert daemon.kernel_pids() == []


def sockets(pid: int) -> set[str]:
    """The sockets process ``pid`` holds (``socket:[inode]``)."""
    found = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("socket:"):
                found.add(target)
    return found


def daemon_root(daemon: Daemon) -> str:
    """The daemon's root directory, where its kernels start: its working directory."""
    assert daemon.process is not None
    return os.readlink(f"/proc/{daemon.process.pid}/cwd")


async def test_other_start_up_variables_fork_elsewhere_and_other_commands_exec(
    daemon: Daemon,
) -> None:
    # Python reads PYTHONPATH when it starts: a kernelspec of its own gets a forkserver of
    # its own, started with it, and its kernel imports from there as an exec'd one would.
    extra = daemon.home / "extra"
    extra.mkdir()
    (extra / "only_here.py").write_text("VALUE = 'found'\n")
    install_kernelspec(daemon, "own-path", {"PYTHONPATH": str(extra)})
    # An interpreter option: not the launcher's command, so not a fork.
    install_kernelspec(daemon, "utf8-mode", {}, options=["-X", "utf8"])
    daemon.start()
    await daemon.wait_ready()
    plain = await report(daemon, await daemon.start_kernel())
    own_id = await daemon.start_kernel("own-path")
    own = await report(daemon, own_id)
    assert FORKSERVER_MODULE in str(own["parent"]), own
    assert own["parent_pid"] != plain["parent_pid"]
    ws = await daemon.channels(own_id)
    try:
        received = await ws.until_idle(ws.execute("import only_here; print(only_here.VALUE)"))
    finally:
        ws.close()
    assert received.text() == "found\n"
    assert daemon.process is not None
    execd = await report(daemon, await daemon.start_kernel("utf8-mode"))
    assert execd["parent_pid"] == daemon.process.pid, execd


async def test_with_the_forkserver_off_every_kernel_is_an_exec(daemon: Daemon) -> None:
    daemon.start("--GatewayStreamApp.kernel_forkserver=False")
    await daemon.wait_ready()
    kernel_id = await daemon.start_kernel()
    found = await report(daemon, kernel_id)
    assert FORKSERVER_MODULE not in str(found["parent"]), found
    assert LAUNCHER_MODULE in str(found["self"])


async def test_a_forkserver_killed_leaves_its_kernels_running_and_the_next_start_execs(
    daemon: Daemon,
) -> None:
    daemon.start()
    await daemon.wait_ready()
    forked_id = await daemon.start_kernel()
    forked = await report(daemon, forked_id)
    forkserver = int(str(forked["parent_pid"]))
    os.kill(forkserver, signal.SIGKILL)
    await wait_until(lambda: not alive(forkserver), "the forkserver gone")
    assert daemon.process is not None
    after = await report(daemon, await daemon.start_kernel())
    assert after["parent_pid"] == daemon.process.pid, after
    assert "Kernel started with exec: the forkserver" in daemon.log_text()
    # The forked kernel runs on, and its end is seen without the forkserver's report.
    again = await report(daemon, forked_id)
    assert again["pid"] == forked["pid"]
    await daemon.fetch(f"/api/kernels/{forked_id}", method="DELETE")
    kernels = {kernel["id"] for kernel in await daemon.fetch("/api/kernels")}
    assert forked_id not in kernels
    await wait_until(lambda: not alive(int(str(forked["pid"]))), "the forked kernel ended")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


async def test_a_package_directory_changed_since_the_forkserver_started_gets_a_new_one(
    daemon: Daemon,
) -> None:
    # The forkserver holds the code it imported; a directory on the path that changed since
    # (what pip install does to site-packages) gets the next start a new forkserver.
    extra = daemon.home / "extra"
    extra.mkdir()
    install_kernelspec(daemon, "own-path", {"PYTHONPATH": str(extra)})
    daemon.start()
    await daemon.wait_ready()
    before = await report(daemon, await daemon.start_kernel("own-path"))
    same = await report(daemon, await daemon.start_kernel("own-path"))
    assert same["parent_pid"] == before["parent_pid"]
    (extra / "installed_later.py").write_text("VALUE = 'new'\n")
    after = await report(daemon, await daemon.start_kernel("own-path"))
    assert FORKSERVER_MODULE in str(after["parent"]), after
    assert after["parent_pid"] != before["parent_pid"]
    await wait_until(lambda: not alive(int(str(before["parent_pid"]))), "the old forkserver gone")
    # The kernels of the old forkserver run on.
    assert alive(int(str(before["pid"])))
