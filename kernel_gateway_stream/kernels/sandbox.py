"""A kernel provisioner that runs each kernel in a sandbox: bubblewrap, its own user and
network, under limits.

A netns kernel (:mod:`.netns`) has a network and a user of its own but sees the host's
files and processes. :class:`SandboxProvisioner` is a :class:`~.netns.NetnsProvisioner`
(the same namespace, veth pair, firewall and per-kernel user, made and deleted by the same
code) whose kernel runs, inside that network namespace, under Debian's bubblewrap
(``bwrap``), which the gateway runs as root:

* new mount, PID, IPC and UTS namespaces (and a cgroup namespace where the kernel has
  them): the kernel is pid 2 of its own PID namespace (bwrap's init is pid 1) and its
  ``/proc`` shows only that namespace; its host name is ``sandbox``;
* a root of bwrap's own (a tmpfs) holding read-only binds of the system (``/usr``,
  ``/etc`` and the merged-usr links ``/bin``, ``/lib``...), of the kernel's interpreter
  (:attr:`SandboxProvisioner.exposed_directories`: this interpreter's prefixes and the
  gateway's package) and of the kernel's copy of its connection file
  (``/run/kernel/connection.json``); Jupyter's configuration directories
  (:attr:`SandboxProvisioner.hidden_directories`) are covered by empty tmpfs mounts. The
  gateway's state directory, configuration, runtime directory, home and every other
  kernel's files are not mounted at all;
* a private, writable home (``/home/kernel``) and ``/tmp``: two directories of one tmpfs
  of :attr:`SandboxProvisioner.storage_size` bytes that the gateway mounts on the kernel's
  directory. It stays mounted across a restart (the home is kept) and is detached and
  removed at the final cleanup, with the network;
* then, still in the sandbox, ``setpriv`` drops to the kernel's user (``uid_base + n``: no
  groups, no capabilities in any set, no_new_privs; bwrap keeps only the three it needs for
  that, CAP_SETUID, CAP_SETGID and CAP_SETPCAP) and ``prlimit`` sets the kernel's rlimits
  (address space, CPU time, processes, file size, open files: hard and soft), which every
  process the kernel starts inherits; then the kernelspec's command, the gateway's lossless
  launcher, runs.

Signals: the process the provisioner holds is bwrap's outer process (which waits for the
sandbox and exits with the kernel's status). SIGINT would end it, not reach the kernel, so
an interrupt goes to the kernel itself (the first child of bwrap's init, found in
``/proc``); SIGTERM and SIGKILL go to the whole process group, as for a netns kernel (the
sandbox's processes are in it: bwrap runs without ``--new-session``, and the kernel has no
terminal to share).

``python -m kernel_gateway_stream.kernels.sandbox check`` says whether this host can run
it; ``... install --user`` installs the kernelspec (``python3-sandbox``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from traitlets import Bool, Float, Int, List, TraitError, Unicode, default, validate

from .netns import KernelNetwork, NetnsProvisioner, install_netns_kernelspec, namespaces
from .netns import require_netns_support as _require_root_and_ip
from .netns_confinement import (
    KernelUser,
    kernel_environment,
    kill_user_processes,
    mounts_under,
    require_command,
)

__all__ = [
    "DEFAULT_DISPLAY_NAME",
    "DEFAULT_KERNEL_NAME",
    "PROVISIONER_NAME",
    "SANDBOX_CONNECTION_FILE",
    "SANDBOX_HOME",
    "SandboxProvisioner",
    "bwrap_arguments",
    "install_sandbox_kernelspec",
    "main",
    "missing_for_sandbox",
    "prlimit_arguments",
    "resident_bytes",
]

PROVISIONER_NAME = "sandbox-provisioner"
DEFAULT_KERNEL_NAME = "python3-sandbox"
DEFAULT_DISPLAY_NAME = "Python 3 (sandbox)"
#: Where the kernel finds its home and its connection file, inside the sandbox.
SANDBOX_HOME = "/home/kernel"
SANDBOX_CONNECTION_FILE = "/run/kernel/connection.json"
_HOST_NAME = "sandbox"
#: The system, read-only: what exists of these is bound (or linked, as merged-usr has it).
_SYSTEM_DIRECTORIES = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What bwrap, run as root, keeps for the sandbox's first process: enough for setpriv to
#: drop to the kernel's user and empty every capability set, nothing else.
_SETPRIV_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
_GIB = 1024**3
_COMMAND_TIMEOUT = 30.0


# -- command lines (pure) -----------------------------------------------------------------


def prlimit_arguments(
    *,
    address_space: int,
    cpu_seconds: int,
    processes: int,
    file_size: int,
    open_files: int,
) -> list[str]:
    """``prlimit``'s options for these limits, soft and hard alike, except the CPU time's
    hard limit, a second past its soft one: at the soft limit the kernel gets SIGXCPU, which
    ends it with a status that says why (with both alike it would get SIGKILL, as from
    anything else). A 0 leaves that limit as it is (unlimited, for a gateway that has none)."""
    limits = {
        "--as": address_space,
        "--cpu": cpu_seconds,
        "--nproc": processes,
        "--fsize": file_size,
        "--nofile": open_files,
    }
    return [
        f"{option}={value}:{value + 1}" if option == "--cpu" else f"{option}={value}"
        for option, value in limits.items()
        if value > 0
    ]


def bwrap_arguments(
    *,
    storage: str,
    connection_file: str,
    exposed: Sequence[str],
    hidden: Sequence[str],
) -> list[str]:
    """bwrap's options (up to its ``--``) for a kernel whose storage (``home`` and ``tmp``
    directories) is ``storage`` and whose copy of the connection file is
    ``connection_file``; ``exposed`` are bound read-only at their own paths, ``hidden``
    covered by empty tmpfs mounts. The system directories are read from this host (a link
    such as merged-usr's ``/bin -> usr/bin`` stays a link)."""
    options = [
        *("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"),
        *("--hostname", _HOST_NAME),
        *("--cap-drop", "ALL"),
    ]
    for capability in _SETPRIV_CAPABILITIES:
        options += ["--cap-add", capability]
    for directory in _SYSTEM_DIRECTORIES:
        if os.path.islink(directory):
            options += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            options += ["--ro-bind", directory, directory]
    # bwrap makes a bind's missing ancestors 0700, root's: the kernel's user could not
    # pass. Made first, searchable.
    destinations = [*exposed, SANDBOX_HOME, "/tmp", SANDBOX_CONNECTION_FILE]
    for ancestor in _ancestors(destinations):
        options += ["--perms", "0755", "--dir", ancestor]
    # The kernel's home and /tmp before what is exposed: bwrap mounts in order, and a
    # package or interpreter installed under /tmp (a clone or a virtualenv there) would be
    # covered by the kernel's own /tmp.
    options += [
        *("--bind", os.path.join(storage, "home"), SANDBOX_HOME),
        *("--bind", os.path.join(storage, "tmp"), "/tmp"),
    ]
    # Ancestors inside those two were covered by them: made again, searchable.
    for ancestor in _ancestors(list(exposed)):
        if any(_within(ancestor, root) and ancestor != root for root in ("/tmp", SANDBOX_HOME)):
            options += ["--perms", "0755", "--dir", ancestor]
    for directory in exposed:
        options += ["--ro-bind-try", directory, directory]
    for directory in hidden:
        if os.path.isdir(directory) and any(
            _within(directory, root) for root in (*_SYSTEM_DIRECTORIES, *exposed)
        ):
            options += ["--tmpfs", directory, "--remount-ro", directory]
    options += [
        *("--proc", "/proc", "--dev", "/dev"),
        *("--ro-bind", connection_file, SANDBOX_CONNECTION_FILE),
        # bwrap's own --chdir would run before the drop, as a root without
        # CAP_DAC_OVERRIDE, to whom the kernel's home (0700) is closed: env -C does it after.
        *("--chdir", "/"),
    ]
    return options


def _ancestors(paths: Sequence[str]) -> list[str]:
    """The ancestors of ``paths`` (``/`` and the system directories excluded), parents
    first."""
    found: set[str] = set()
    for path in paths:
        parent = os.path.dirname(os.path.normpath(path))
        while parent != os.sep and not any(_within(parent, root) for root in _SYSTEM_DIRECTORIES):
            found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda path: (path.count(os.sep), path))


def _within(path: str, root: str) -> bool:
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# -- the host ---------------------------------------------------------------------------


def missing_for_sandbox(bwrap_command: str = "bwrap") -> list[str]:
    """What this host lacks to run sandbox kernels, one line each; empty if nothing.

    Tries the real thing too: bwrap making the namespaces and dropping to a user.
    """
    missing = []
    try:
        namespaces(_require_root_and_ip())
    except RuntimeError as error:
        missing.append(str(error))
    for command, package in (
        (bwrap_command, "bubblewrap"),
        ("setpriv", "util-linux"),
        ("prlimit", "util-linux"),
        ("nft", "nftables"),
        ("mount", "mount"),
        ("umount", "mount"),
    ):
        try:
            require_command(command, package)
        except RuntimeError:
            missing.append(f"{command!r} is not on PATH (apt-get install {package})")
    if missing:
        return missing
    trial = [
        require_command(bwrap_command, "bubblewrap"),
        *("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL"),
        *("--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"),
        *("--", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"),
    ]
    trial[trial.index("--cap-drop") + 2 : trial.index("--cap-drop") + 2] = [
        option for capability in _SETPRIV_CAPABILITIES for option in ("--cap-add", capability)
    ]
    done = subprocess.run(
        trial, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        missing.append(f"bwrap cannot make a sandbox here: {' '.join(done.stderr.split())}")
    return missing


def mount_storage(user: KernelUser, size: int) -> str:
    """Mount the kernel's storage (a tmpfs of ``size`` bytes, ``user``'s, 0700) on its
    home directory unless it is mounted already (a restart), with ``home`` and ``tmp``
    in it; the storage's path. Blocking.

    Raises:
        RuntimeError: ``mount`` failed.
    """
    storage = user.home
    if storage not in mounts_under(storage):
        options = f"size={size},mode=0700,uid={user.uid},gid={user.gid},nosuid,nodev"
        done = subprocess.run(
            [require_command("mount", "mount"), "-t", "tmpfs", "-o", options, "tmpfs", storage],
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            reason = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
            raise RuntimeError(f"mounting the kernel's storage on {storage}: {reason}")
    for name in ("home", "tmp"):
        path = os.path.join(storage, name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        # Safe by path: the tmpfs's root is the kernel's, but nothing of it runs yet.
        os.lchown(path, user.uid, user.gid)
    return storage


def resident_bytes(root: int) -> int:
    """Bytes resident in memory in ``root`` and every process below it (``VmRSS`` of
    ``/proc/<pid>/status``). The provisioner's process is bwrap: what the kernel starts
    stays below it, a process whose parent ends included (it goes to bwrap's init, the
    first process of the kernel's PID namespace). Not summed by the kernel's user: a user
    is its subnet's, and a process of the subnet's last kernel that is not gone yet, or
    any process given that uid, would count against this kernel."""
    total = 0
    pending, seen = [root], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status", "rb") as status:
                for line in status.read().splitlines():
                    if line.startswith(b"VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue  # gone meanwhile
        pending.extend(_all_children(pid))
    return total


def _all_children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (a child is listed under the thread that
    started it)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [child for task in tasks for child in _children(pid, int(task))]


def _children(pid: int, task: int | None = None) -> list[int]:
    """The children that thread ``task`` (by default the main one) of ``pid`` started."""
    try:
        with open(f"/proc/{pid}/task/{pid if task is None else task}/children") as file:
            return [int(child) for child in file.read().split()]
    except OSError:
        return []


# -- the provisioner --------------------------------------------------------------------


class SandboxProvisioner(NetnsProvisioner):
    """Runs each kernel under bubblewrap as a user of its own, in a network namespace of
    its own, under rlimits (see the module's docstring).

    Selected by a kernelspec's ``metadata.kernel_provisioner.provisioner_name`` of
    ``sandbox-provisioner`` (:func:`install_sandbox_kernelspec`). The network, user and
    directory traits are :class:`~.netns.NetnsProvisioner`'s (configuration of
    ``NetnsProvisioner`` applies here too: both kinds share the subnet pool and so never
    share a user).
    """

    bwrap_command = Unicode(
        "bwrap",
        config=True,
        help="bubblewrap's bwrap command (a name on PATH or a path), which builds each "
        "kernel's sandbox; the gateway runs it as root.",
    )
    prlimit_command = Unicode(
        "prlimit",
        config=True,
        help="util-linux's prlimit command (a name on PATH or a path), which sets the "
        "kernel's rlimits inside the sandbox, after the drop to its user.",
    )
    allow_outbound = Bool(
        False,
        config=True,
        help="Let the kernel open connections of its own. Off: the namespace's firewall "
        "drops every packet the kernel sends except replies to the gateway (a TCP connect "
        "times out). On: it accepts them and the namespace gets a default route through the "
        "host side of the veth pair; they go further only if the host forwards them "
        "(net.ipv4.ip_forward and a masquerade rule: the host's, not the gateway's, to set).",
    )
    memory_limit = Int(
        4 * _GIB,
        config=True,
        help="The kernel's address space in bytes (RLIMIT_AS, for every process it "
        "starts): an allocation past it fails (MemoryError in Python; the kernel lives "
        "on). Address space, not resident memory: threads and mapped libraries count, so "
        "ipykernel needs a few hundred MiB. 0: unlimited.",
    )
    cpu_time_limit = Int(
        0,
        config=True,
        help="CPU seconds each process of the kernel may use (RLIMIT_CPU); past it the "
        "process gets SIGXCPU (SIGKILL a second later if it goes on), and the kernel dies: "
        "its execution ends 'died' with the reason cpu_limit, and it restarts, as jupyter's "
        "restarter does. It counts over the kernel's whole life, so it ends long-lived busy "
        "kernels too. 0: unlimited.",
    )
    process_limit = Int(
        256,
        config=True,
        help="Processes and threads the kernel's user may have at once (RLIMIT_NPROC: its "
        "uid is the kernel's alone): a fork or thread past it fails with EAGAIN. ipykernel "
        "itself runs about ten threads. 0: unlimited.",
    )
    file_size_limit = Int(
        _GIB,
        config=True,
        help="The largest file the kernel may write, in bytes (RLIMIT_FSIZE): a write "
        "past it fails with EFBIG (SIGXFSZ is ignored by Python). 0: unlimited.",
    )
    open_files_limit = Int(
        1024,
        config=True,
        help="File descriptors each process of the kernel may hold (RLIMIT_NOFILE). "
        "0: as the gateway's.",
    )
    kernel_memory_limit = Int(
        0,
        config=True,
        help="Bytes of memory the kernel's processes may hold resident together (the sum "
        "of VmRSS over the sandbox's process tree, checked every memory_check_interval); "
        "past it the kernel is killed: its execution ends 'died' with the reason "
        "memory_limit, and "
        "it restarts, as jupyter's restarter does. A limit per kernel where memory_limit is "
        "per process; cgroups would enforce it in the kernel, this host has none to "
        "delegate. 0: off.",
    )
    memory_check_interval = Float(
        0.5,
        config=True,
        help="Seconds between two sums of a kernel's resident memory (kernel_memory_limit).",
    )
    storage_size = Int(
        _GIB,
        config=True,
        help="Bytes of the tmpfs that holds the kernel's home (/home/kernel) and /tmp, "
        "together; a write past it fails with ENOSPC. It lives in memory (and swap), "
        "mounted at the kernel's first start, kept across restarts, removed at shutdown.",
    )
    hidden_directories = List(
        Unicode(),
        config=True,
        help="Directories covered by an empty read-only tmpfs in every sandbox, if they "
        "lie in what the sandbox binds (the system's /etc and /usr, exposed_directories). "
        "Default: Jupyter's configuration path (jupyter --paths: /etc/jupyter, "
        "/usr/local/etc/jupyter, <prefix>/etc/jupyter), where a gateway's configuration "
        "and token may be. The gateway's state and runtime directories are never bound.",
    )

    #: Why the gateway ended the kernel it runs, if it did (``memory_limit``).
    _ended_by: str | None = None
    #: The task that sums the kernel's resident memory (kernel_memory_limit).
    _memory_watch: asyncio.Task[None] | None = None

    @default("exposed_directories")
    def _default_sandbox_exposed_directories(self) -> list[str]:
        package = str(Path(__file__).resolve().parent.parent)
        return list(dict.fromkeys([sys.base_prefix, sys.prefix, package]))

    @default("hidden_directories")
    def _default_hidden_directories(self) -> list[str]:
        from jupyter_core.paths import jupyter_config_path

        return [os.path.realpath(path) for path in jupyter_config_path()]

    @validate(
        "memory_limit",
        "kernel_memory_limit",
        "cpu_time_limit",
        "process_limit",
        "file_size_limit",
        "open_files_limit",
    )
    def _valid_limit(self, proposal: Any) -> int:
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name} must be 0 (unlimited) or more")
        return int(proposal["value"])

    @validate("storage_size")
    def _valid_storage_size(self, proposal: Any) -> int:
        if proposal["value"] < 1024 * 1024:
            raise TraitError("storage_size must be at least 1 MiB")
        return int(proposal["value"])

    @property
    def outbound_allowed(self) -> bool:
        return bool(self.allow_outbound)

    async def prepare_confinement(self, network: KernelNetwork) -> None:
        """Check for bwrap and prlimit, and mount the kernel's storage (kept from an
        earlier start of this kernel)."""
        require_command(self.bwrap_command, "bubblewrap")
        require_command(self.prlimit_command, "util-linux")
        user = network.user
        assert user is not None
        await asyncio.to_thread(mount_storage, user, self.storage_size)

    def confined_command(
        self, network: KernelNetwork, argv: list[str], connection_file: str, ip_command: str
    ) -> list[str]:
        """``ip netns exec <namespace> bwrap ... -- setpriv ... -- prlimit ... -- argv``,
        ``argv`` reading the sandbox's copy of the connection file."""
        from .netns_enter import setpriv_argv

        user = network.user
        assert user is not None
        argv = [argument.replace(connection_file, SANDBOX_CONNECTION_FILE) for argument in argv]
        limits = prlimit_arguments(
            address_space=self.memory_limit,
            cpu_seconds=self.cpu_time_limit,
            processes=self.process_limit,
            file_size=self.file_size_limit,
            open_files=self.open_files_limit,
        )
        inside = [
            *(require_command("env", "coreutils"), "--chdir", SANDBOX_HOME),
            *(require_command(self.prlimit_command, "util-linux"), *limits, "--", *argv),
        ]
        setpriv = require_command(self.setpriv_command, "util-linux")
        return [
            *(ip_command, "netns", "exec", network.namespace),
            require_command(self.bwrap_command, "bubblewrap"),
            *bwrap_arguments(
                storage=user.home,
                connection_file=user.connection_file,
                exposed=[os.path.realpath(path) for path in self.exposed_directories],
                hidden=self.hidden_directories,
            ),
            "--",
            *setpriv_argv(setpriv, user.uid, user.gid, inside),
        ]

    def confined_environment(
        self, environment: Mapping[str, str], user: KernelUser
    ) -> dict[str, str]:
        """The netns kernel's environment with the sandbox's home, and without
        ``JPY_PARENT_PID``: the gateway's pid means nothing in the kernel's PID namespace,
        where its parent is bwrap's init, pid 1 (ipykernel would take that for its
        parent's death and exit)."""
        kept = kernel_environment(environment, user)
        kept.pop("JPY_PARENT_PID", None)
        return {**kept, "HOME": SANDBOX_HOME}

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        """As :meth:`.netns.NetnsProvisioner.launch_kernel`, always ``independent``:
        jupyter_client would otherwise hand the kernel ``JPY_PARENT_PID``, a pid of the
        host's, which in the kernel's PID namespace looks like its parent's death. Then
        the kernel's memory is watched (:attr:`kernel_memory_limit`)."""
        info = await super().launch_kernel(cmd, **{**kwargs, "independent": True})
        self._ended_by = None
        self._stop_memory_watch()
        if self.kernel_memory_limit and self.network is not None and self.network.user:
            self._memory_watch = asyncio.ensure_future(
                self._watch_memory(self.process, self.network.user)
            )
        return info

    async def _watch_memory(self, process: Any, user: KernelUser) -> None:
        """Kill the kernel once its processes hold more than :attr:`kernel_memory_limit`
        resident together; until the kernel exits."""
        while self.process is process and process is not None and process.poll() is None:
            used = await asyncio.to_thread(resident_bytes, process.pid)
            if used > self.kernel_memory_limit:
                self._ended_by = "memory_limit"
                self.log.warning(
                    "Kernel %s holds %d MiB, past its limit of %d MiB: killed",
                    self.kernel_id, used >> 20, self.kernel_memory_limit >> 20,
                )  # fmt: skip
                await asyncio.to_thread(kill_user_processes, user)
                await self.send_signal(signal.SIGKILL)
                return
            await asyncio.sleep(self.memory_check_interval)

    def _stop_memory_watch(self) -> None:
        watch = self._memory_watch
        if watch is not None:
            watch.cancel()
            self._memory_watch = None

    async def cleanup(self, restart: bool = False) -> None:
        self._stop_memory_watch()
        await super().cleanup(restart=restart)

    def death_reason(self) -> str | None:
        """Why the kernel's process ended: ``memory_limit`` if the gateway killed it for
        its memory, ``cpu_limit`` if SIGXCPU ended it (bwrap exits with 128 + the signal
        that ended what it ran), else None (not known)."""
        if self._ended_by is not None:
            return self._ended_by
        status = self.process.returncode if self.process is not None else None
        if status in (128 + signal.SIGXCPU, -signal.SIGXCPU):
            return "cpu_limit"
        return None

    def kernel_process(self) -> int | None:
        """The kernel's pid (on the host): the first child of bwrap's init, which is the
        first child of the process the provisioner holds; None if there is none (yet)."""
        if self.pid is None:
            return None
        for init in _children(self.pid):
            for kernel in _children(init):
                return kernel
        return None

    async def send_signal(self, signum: int) -> None:
        """SIGINT (jupyter's interrupt) to the kernel itself, inside its PID namespace;
        every other signal as :class:`~.netns.NetnsProvisioner` sends it."""
        if signum == signal.SIGINT and self.process is not None:
            kernel = self.kernel_process()
            if kernel is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(kernel, signum)
            return
        await super().send_signal(signum)


# -- kernelspec ---------------------------------------------------------------------------


def install_sandbox_kernelspec(
    prefix_or_dir: str | os.PathLike[str] | None = None,
    name: str = DEFAULT_KERNEL_NAME,
    display_name: str = DEFAULT_DISPLAY_NAME,
    *,
    prefix: bool = False,
    user: bool = False,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Install the kernelspec ``name``: this interpreter's lossless kernel under
    ``sandbox-provisioner`` (``config`` configures it: ``{"memory_limit": 2**30}``); the
    directory written. Arguments as :func:`.netns.install_netns_kernelspec`'s.

    Raises:
        ValueError: ``name`` is not a valid kernel name, or the arguments contradict.
    """
    return install_netns_kernelspec(
        prefix_or_dir,
        name,
        display_name,
        prefix=prefix,
        user=user,
        config=config,
        provisioner_name=PROVISIONER_NAME,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kernel_gateway_stream.kernels.sandbox install|check``."""
    parser = argparse.ArgumentParser(
        prog="python -m kernel_gateway_stream.kernels.sandbox",
        description="Kernels in a sandbox: bubblewrap, their own user and network, limits.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="install a kernelspec that uses them")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="into the user's Jupyter data dir")
    where.add_argument("--prefix", metavar="P", help="into P/share/jupyter/kernels")
    where.add_argument("--dir", metavar="D", help="into the kernels directory D")
    install.add_argument("--name", default=DEFAULT_KERNEL_NAME, help="the kernel name")
    install.add_argument("--display-name", default=DEFAULT_DISPLAY_NAME)
    commands.add_parser("check", help="say whether this host can run them, and what is missing")
    options = parser.parse_args(argv)
    if options.command == "check":
        missing = missing_for_sandbox()
        for line in missing:
            print(f"missing: {line}", file=sys.stderr)
        if missing:
            print("no: this host cannot run sandbox kernels", file=sys.stderr)
            return 1
        print(
            "yes: root, ip netns, nft, bwrap (mount, PID, IPC, UTS namespaces), setpriv, "
            "prlimit (rlimits), mount (tmpfs storage); cgroups: not used"
        )
        return 0
    try:
        path = install_sandbox_kernelspec(
            options.prefix or options.dir,
            options.name,
            options.display_name,
            prefix=options.prefix is not None,
            user=options.user,
        )
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Installed kernelspec {options.name} in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
