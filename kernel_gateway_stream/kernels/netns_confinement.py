"""Who a kernel in its own network namespace runs as, and what it can reach from there.

:class:`~.netns.NetnsProvisioner` confines each kernel with these, after ``ip netns exec``
has entered the namespace and before the kernel starts (the last root step is
:mod:`.netns_enter`):

* a user of its own (:func:`kernel_user`): ``uid_base + n`` and ``gid_base + n`` for the
  n-th /30 of the subnet pool, with no supplementary groups, no capabilities in any set and
  no_new_privs. A /30 belongs to one live kernel on the host, so does its user: no kernel
  can signal, trace or read another, and none can enter another namespace (``nsenter``
  needs ``CAP_SYS_ADMIN``) or change its network (``CAP_NET_ADMIN``);
* a directory of its own (:func:`prepare_kernel_directory`): root's
  ``<runtime directory>/<namespace>``, readable by the kernel's group only, holding the
  copy of the connection file the kernel reads (the gateway's runtime directory is closed
  to it) and ``home``, the kernel's home and working directory;
* a firewall in the namespace (:func:`firewall_ruleset`), root's, which the kernel cannot
  change: new TCP connections to the kernel's five ports come in, replies go out, and
  nothing the kernel opens leaves the namespace.

At the final cleanup :func:`kill_user_processes` kills every process of the kernel's user
(a process that made namespaces of its own too) and :func:`remove_kernel_directory`
deletes the directory. Everything that runs a command blocks: call it from a thread.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_UID_BASE",
    "FIREWALL_TABLE",
    "KernelUser",
    "apply_firewall",
    "firewall_ruleset",
    "kernel_environment",
    "kernel_user",
    "kill_user_processes",
    "mounts_under",
    "prepare_kernel_directory",
    "remove_kernel_directory",
    "require_command",
    "unmount_under",
]

#: The first of the kernels' users and groups: 0x70000000, above the ranges that systemd
#: gives to users, dynamic users and containers (systemd's "UIDs and GIDs" document).
DEFAULT_UID_BASE = 0x70000000
#: The nftables table loaded into each kernel's namespace.
FIREWALL_TABLE = "kernel_gateway_stream"
_COMMAND_TIMEOUT = 30.0
_CONNECTION_FILE_NAME = "connection.json"
#: Variables that would point the kernel at directories of the gateway's user; without
#: them Jupyter and IPython use the kernel's own home.
_HOME_VARIABLES = (
    "IPYTHONDIR",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_RUNTIME_DIR",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
)


# -- the user, its directory and its firewall (pure) ------------------------------------


@dataclass(frozen=True, slots=True)
class KernelUser:
    """The user and group a kernel runs as, and its directory.

    ``directory`` (root's, mode 0750, group ``gid``) holds the copy of the connection file
    the kernel reads and ``home``, the kernel's home and working directory (``uid``'s,
    mode 0700).
    """

    uid: int
    gid: int
    directory: str

    @property
    def home(self) -> str:
        return os.path.join(self.directory, "home")

    @property
    def connection_file(self) -> str:
        return os.path.join(self.directory, _CONNECTION_FILE_NAME)

    def as_dict(self) -> dict[str, str]:
        return {"uid": str(self.uid), "gid": str(self.gid), "directory": self.directory}

    @classmethod
    def from_dict(cls, data: Mapping[str, str]) -> KernelUser:
        return cls(int(data["uid"]), int(data["gid"]), str(data["directory"]))


def kernel_user(
    namespace: str,
    subnet: ipaddress.IPv4Network,
    pool: ipaddress.IPv4Network,
    uid_base: int,
    gid_base: int,
    runtime_directory: str,
) -> KernelUser:
    """The user of the kernel in ``namespace`` on ``subnet``: ``uid_base + n`` and
    ``gid_base + n`` for the n-th subnet of its size in ``pool``. A subnet belongs to one
    live kernel on the host, so does its user.

    Raises:
        ValueError: ``subnet`` is not in ``pool``, or the uid or gid would be 0 or
            beyond 2**31 - 2.
    """
    if not subnet.subnet_of(pool):
        raise ValueError(f"kernel network {subnet} is not in subnet pool {pool}")
    index = (int(subnet.network_address) - int(pool.network_address)) >> (32 - subnet.prefixlen)
    uid, gid = uid_base + index, gid_base + index
    for name, value in (("uid", uid), ("gid", gid)):
        if not 0 < value < 2**31 - 1:
            raise ValueError(f"kernel {name} {value} is out of range (1 to 2**31 - 2)")
    return KernelUser(uid, gid, os.path.join(runtime_directory, namespace))


def firewall_ruleset(interface: str, ports: Iterable[int], allow_outbound: bool = False) -> str:
    """The nftables script for a kernel's namespace whose kernel listens on ``ports``.

    Input: loopback, replies, and new TCP connections to ``ports`` through ``interface``
    (the namespace's end of the veth pair).
    Output: loopback and replies only, so a connection the kernel opens is dropped (a
    TCP ``connect`` sends its SYN again and again, and times out); with
    ``allow_outbound``, everything (the kernel's own connections, and the input chain's
    replies to them). The ``inet`` family covers IPv6 too (the veth pair has link-local
    addresses). Loading it replaces the table whole, atomically.
    """
    listed = ", ".join(str(port) for port in sorted(set(ports)))
    output_policy = "accept" if allow_outbound else "drop"
    return (
        f"table inet {FIREWALL_TABLE} {{}}\n"
        f"delete table inet {FIREWALL_TABLE}\n"
        f"table inet {FIREWALL_TABLE} {{\n"
        "  chain input {\n"
        "    type filter hook input priority filter; policy drop;\n"
        '    iif "lo" accept\n'
        "    ct state established,related accept\n"
        f'    iifname "{interface}" tcp dport {{ {listed} }} ct state new accept\n'
        "  }\n"
        "  chain output {\n"
        f"    type filter hook output priority filter; policy {output_policy};\n"
        '    oif "lo" accept\n'
        "    ct state established,related accept\n"
        "  }\n"
        "}\n"
    )


# -- on the host (blocking: call from a thread) ------------------------------------------


def require_command(command: str, package: str) -> str:
    """The path of ``command``.

    Raises:
        RuntimeError: it is not on PATH (the message names Debian's ``package``).
    """
    found = shutil.which(command)
    if found is None:
        raise RuntimeError(
            f"kernels in their own network namespace need {command!r}, which is not on PATH "
            f"(apt-get install {package})"
        )
    return found


def apply_firewall(
    namespace: str,
    interface: str,
    ports: Iterable[int],
    ip_command: str = "ip",
    nft_command: str = "nft",
    allow_outbound: bool = False,
) -> None:
    """Load :func:`firewall_ruleset` into network namespace ``namespace`` (replacing what
    was there).

    Raises:
        RuntimeError: ``nft`` failed; the message is its one-line reason.
    """
    done = subprocess.run(
        [ip_command, "netns", "exec", namespace, nft_command, "-f", "-"],
        input=firewall_ruleset(interface, ports, allow_outbound),
        capture_output=True,
        text=True,
        timeout=_COMMAND_TIMEOUT,
    )
    if done.returncode != 0:
        reason = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise RuntimeError(f"nft in {namespace}: {reason}")


def _private_root_directory(path: str) -> None:
    """Make ``path`` (mode 0711), or check that it is root's and only root can write in it:
    a directory that someone else made (in /tmp, say) could be theirs to swap."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o711)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise RuntimeError(f"{path} must be a directory of root's that nobody else can write to")
    os.chmod(path, (info.st_mode & 0o7777) | 0o111)  # every kernel's user passes through


def prepare_kernel_directory(
    user: KernelUser, runtime_directory: str, connection_file: str
) -> None:
    """Make ``user``'s directory and home, and copy ``connection_file`` for it to read.

    The directory is root's (group ``user.gid``, 0750), so the kernel can neither replace
    the copy nor anyone else's directory be entered by it; the copy is root's, group
    ``user.gid``, 0440; the home is ``user.uid``'s, 0700 (made again if another user owns
    it: a kernel whose network was made again has a new user). Run at every start.

    Raises:
        RuntimeError: ``runtime_directory`` is not safely root's.
        OSError: a file operation failed.
    """
    _private_root_directory(runtime_directory)
    with contextlib.suppress(FileExistsError):
        os.mkdir(user.directory, 0o750)
    info = os.lstat(user.directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise RuntimeError(f"{user.directory} is not a directory of root's")
    os.chown(user.directory, 0, user.gid)
    os.chmod(user.directory, 0o750)
    with contextlib.suppress(FileNotFoundError):
        if os.lstat(user.home).st_uid != user.uid:
            shutil.rmtree(user.home)
    with contextlib.suppress(FileExistsError):
        os.mkdir(user.home, 0o700)
    # Safe by path: only root can change the entries of user.directory.
    os.chown(user.home, user.uid, user.gid)
    os.chmod(user.home, 0o700)
    content = Path(connection_file).read_bytes()
    staged = user.connection_file + ".new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staged)
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o440)
    try:
        os.fchown(descriptor, 0, user.gid)
        os.fchmod(descriptor, 0o440)
        os.write(descriptor, content)
    finally:
        os.close(descriptor)
    os.replace(staged, user.connection_file)


def mounts_under(directory: str) -> list[str]:
    """The mount points of this mount namespace at or below ``directory``, deepest first
    (``/proc/self/mountinfo``; its octal escapes of spaces and the like decoded)."""
    prefix = os.path.normpath(directory)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point == prefix or point.startswith(prefix + os.sep):
                found.append(point)
    return sorted(set(found), key=len, reverse=True)


def unmount_under(directory: str) -> None:
    """Detach every mount at or below ``directory`` (a sandbox kernel's storage).

    Raises:
        RuntimeError: ``umount`` failed on a mount that is still there.
    """
    for point in mounts_under(directory):
        done = subprocess.run(
            [require_command("umount", "mount"), "--lazy", point],
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0 and point in mounts_under(point):
            reason = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
            raise RuntimeError(f"umount {point}: {reason}")


def remove_kernel_directory(user: KernelUser) -> None:
    """Delete ``user``'s directory, home included, after detaching what is mounted there
    (a sandbox kernel's storage); what is gone already is skipped."""
    if os.path.isdir(user.directory):
        unmount_under(user.directory)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(user.directory)


def kill_user_processes(user: KernelUser) -> None:
    """SIGKILL every process of ``user.uid``: a process that made a namespace of its own
    (``unshare -Urn``) is no longer in the kernel's, and the next kernel on its /30 gets
    its user. Sent by a process of that user, as ``kill(-1, SIGKILL)``: it reaches them
    all at once, those forking meanwhile included, and nothing else.

    Raises:
        RuntimeError: ``kill`` could not be run.
    """
    kill = require_command("kill", "procps")
    try:
        subprocess.run(
            [kill, "-KILL", "--", "-1"],
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            capture_output=True,
            timeout=_COMMAND_TIMEOUT,
            stdin=subprocess.DEVNULL,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise RuntimeError(f"killing the processes of uid {user.uid}: {error}") from error


def kernel_environment(environment: Mapping[str, str], user: KernelUser) -> dict[str, str]:
    """``environment`` for a kernel running as ``user``: its own home, and none of the
    variables that would point it at the gateway user's Jupyter and IPython directories."""
    kept = {name: value for name, value in environment.items() if name not in _HOME_VARIABLES}
    return {**kept, "HOME": user.home, "USER": f"uid{user.uid}", "LOGNAME": f"uid{user.uid}"}
