"""A kernel provisioner that runs each kernel in a network namespace of its own.

The honest stand-in for a containerized kernel on a host without a container engine: the
kernel shares the host's files and processes but not its network. The gateway reaches it
only over a veth pair and TCP, by its connection info, as it would reach a kernel in a
container or on another host.

For each kernel, :class:`NetnsProvisioner`

* creates the namespace ``kgs-<first 8 hex digits of the kernel id>`` and a veth pair:
  ``vkgs-<8 hex>`` on the host, ``eth0`` in the namespace, brought up with the namespace's
  ``lo``;
* gives the pair a /30 of :attr:`NetnsProvisioner.subnet_pool` that no address of the host
  overlaps (read from ``ip -j addr``): the host side gets the first address, the kernel
  the second. The choice and the creation hold a file lock, so kernels started at once, by
  one gateway or several, never get the same /30;
* writes the connection file with the kernel's address and ports of its own (the
  namespace is empty: any port is free there), so the kernel binds only there;
* runs the kernelspec's command as ``ip netns exec <namespace> python netns_enter.py ...
  <argv>``. ``ip`` enters the namespace; :mod:`.netns_enter`, still root, exposes the
  kernel's interpreter if an unsearchable directory hides it and execs ``setpriv``, which
  drops to the kernel's own user and execs the command. Each step *execs* the next: the
  process the provisioner holds is the kernel, and signals (interrupt, terminate, kill)
  reach it and its process group directly;
* runs that command as a user of its own, ``uid_base + n`` and ``gid_base + n`` for the
  n-th /30 of the pool (no two live kernels on the host share one), with no supplementary
  groups, no capabilities in any set and no_new_privs: the kernel cannot enter another
  namespace (``nsenter`` needs ``CAP_SYS_ADMIN``), change its network (``CAP_NET_ADMIN``)
  or signal, trace or read another kernel. Its home and working directory is
  ``<runtime_directory>/<namespace>/home`` (its own, mode 0700), and it reads a copy of
  its connection file in ``<runtime_directory>/<namespace>`` (root's, readable by its
  group only); :mod:`.netns_confinement` has the details;
* loads an nftables table into the namespace (root's: the kernel cannot change it) whose
  input accepts only new TCP connections to the kernel's five ports, and whose output
  accepts only the replies of connections made to the kernel: whatever the kernel itself
  tries to reach through the veth pair (the host's services bound to 0.0.0.0, the
  gateway's own port) is dropped;
* sets ``watch_heartbeat`` on its kernel manager: the gateway then pings the kernel's
  heartbeat port and reports the kernel ``unreachable`` while the link does not carry it.

A restart keeps the namespace, the veth pair and the addresses: the kernel comes back at
the same address and ports. The final cleanup (``cleanup(restart=False)``, which jupyter
calls after a shutdown and after a kernel died for good) kills whatever still runs in the
namespace and every process of the kernel's user, deletes the veth pair, the namespace and
the kernel's directory; it may be called any number of times. A gateway killed with SIGKILL
cleans up nothing: its kernels run on (see ``StreamKernelManager.outlive_gateway``) and so
do their namespaces.

It needs root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``), iproute2's ``ip``, util-linux's
``setpriv`` and ``nft`` (nftables); without them it refuses to start a kernel with a
one-line :class:`RuntimeError`.

Install a kernelspec that uses it with :func:`install_netns_kernelspec`, or::

    python -m kernel_gateway_stream.kernels.netns install --user
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.launcher import launch_kernel
from jupyter_client.manager import KernelManager
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Int, List, TraitError, Unicode, default, validate

from .netns_confinement import (
    DEFAULT_UID_BASE,
    KernelUser,
    apply_firewall,
    kernel_environment,
    kernel_user,
    kill_user_processes,
    prepare_kernel_directory,
    remove_kernel_directory,
    require_command,
)

__all__ = [
    "DEFAULT_DISPLAY_NAME",
    "DEFAULT_KERNEL_NAME",
    "DEFAULT_SUBNET_POOL",
    "PROVISIONER_NAME",
    "KernelNetwork",
    "NetnsProvisioner",
    "build_network",
    "choose_ports",
    "choose_subnet",
    "create_network",
    "delete_network",
    "host_interface_name",
    "host_networks",
    "install_netns_kernelspec",
    "main",
    "namespace_name",
    "namespaces",
    "netns_kernelspec",
    "parse_pool",
    "require_netns_support",
]

#: The entry point name (group ``jupyter_client.kernel_provisioners``).
PROVISIONER_NAME = "netns-provisioner"
DEFAULT_KERNEL_NAME = "python3-netns"
DEFAULT_DISPLAY_NAME = "Python 3 (own network namespace)"
DEFAULT_SUBNET_POOL = "10.213.0.0/16"

#: Each kernel's link: network, host side, kernel side, broadcast.
_LINK_PREFIX = 30
_NAMESPACE_INTERFACE = "eth0"
_PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
#: Ports the kernel listens on inside its namespace: below Linux's ephemeral range, so not
#: one the kernel's own outgoing connections could be holding at a restart.
_PORT_RANGE = range(20000, 32000)
_IP_TIMEOUT = 30.0
_KERNEL_NAME = re.compile(r"^[a-z0-9._-]+$", re.IGNORECASE)
_ENTER_SCRIPT = str(Path(__file__).with_name("netns_enter.py"))
# -- names and addresses (pure) ---------------------------------------------------------


def namespace_name(kernel_id: str) -> str:
    """The network namespace of kernel ``kernel_id``: ``kgs-`` and its first 8 hex digits."""
    return "kgs-" + _short_id(kernel_id)


def host_interface_name(kernel_id: str) -> str:
    """The host side of kernel ``kernel_id``'s veth pair (13 characters; Linux allows 15)."""
    return "vkgs-" + _short_id(kernel_id)


def _short_id(kernel_id: str) -> str:
    digits = "".join(c for c in kernel_id.lower() if c in "0123456789abcdef")[:8]
    if len(digits) < 8:
        raise ValueError(f"kernel id {kernel_id!r} has fewer than 8 hex digits")
    return digits


@dataclass(frozen=True, slots=True)
class KernelNetwork:
    """One kernel's namespace, veth pair and /30, and the user the kernel runs as there
    (None until the provisioner has chosen it).

    :meth:`as_dict` is what the gateway keeps to re-attach the kernel after a restart and
    to delete all of this (:func:`delete_network`) once the kernel is shut down.
    """

    namespace: str
    host_interface: str
    subnet: ipaddress.IPv4Network
    user: KernelUser | None = None

    @property
    def host_address(self) -> str:
        """The host side of the link (the gateway's end)."""
        return str(self.subnet.network_address + 1)

    @property
    def kernel_address(self) -> str:
        """The namespace side: the only address the kernel listens on."""
        return str(self.subnet.network_address + 2)

    @classmethod
    def for_kernel(cls, kernel_id: str, subnet: ipaddress.IPv4Network) -> KernelNetwork:
        return cls(namespace_name(kernel_id), host_interface_name(kernel_id), subnet)

    def as_dict(self) -> dict[str, str]:
        data = {
            "namespace": self.namespace,
            "host_interface": self.host_interface,
            "subnet": str(self.subnet),
        }
        if self.user is not None:
            data.update(self.user.as_dict())
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, str]) -> KernelNetwork:
        user = KernelUser.from_dict(data) if "uid" in data else None
        subnet = ipaddress.IPv4Network(data["subnet"])
        return cls(data["namespace"], data["host_interface"], subnet, user)


def parse_pool(pool: str) -> ipaddress.IPv4Network:
    """``pool`` as an IPv4 network that holds at least one /30.

    Raises:
        ValueError: not an IPv4 network in CIDR notation, or smaller than a /30.
    """
    network = ipaddress.ip_network(pool, strict=True)
    if not isinstance(network, ipaddress.IPv4Network):
        raise ValueError(f"subnet pool {pool!r} is not IPv4")
    if network.prefixlen > _LINK_PREFIX:
        raise ValueError(f"subnet pool {pool!r} is smaller than one /{_LINK_PREFIX}")
    return network


def choose_subnet(
    pool: ipaddress.IPv4Network, used: Iterable[ipaddress.IPv4Network]
) -> ipaddress.IPv4Network | None:
    """The first /30 of ``pool`` that overlaps none of ``used`` (the networks of the host's
    addresses); None if every one does."""
    taken = [network for network in used if network.overlaps(pool)]
    for candidate in pool.subnets(new_prefix=_LINK_PREFIX):
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    return None


def choose_ports(count: int) -> list[int]:
    """``count`` distinct ports for a kernel in an empty namespace."""
    return random.SystemRandom().sample(_PORT_RANGE, count)


# -- the host's network (blocking: call from a thread) -----------------------------------


def require_netns_support(ip_command: str = "ip") -> str:
    """The path of ``ip_command``, if this process can create network namespaces.

    Raises:
        RuntimeError: not root, or no ``ip`` command.
    """
    if os.geteuid() != 0:
        raise RuntimeError(
            f"kernels in their own network namespace need root (uid {os.geteuid()} is not)"
        )
    found = shutil.which(ip_command)
    if found is None:
        raise RuntimeError(
            f"kernels in their own network namespace need iproute2's {ip_command!r} command, "
            "which is not on PATH"
        )
    return found


def _ip(ip_command: str, *args: str) -> str:
    """Run ``ip args``; its stdout.

    Raises:
        RuntimeError: it failed; the message is its one-line reason.
    """
    done = subprocess.run(
        [ip_command, *args],
        capture_output=True,
        text=True,
        timeout=_IP_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        reason = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise RuntimeError(f"ip {' '.join(args)}: {reason}")
    return done.stdout


def host_networks(ip_command: str = "ip") -> list[ipaddress.IPv4Network]:
    """The network of every IPv4 address on the host (``ip -j -4 addr``)."""
    interfaces = json.loads(_ip(ip_command, "-j", "-4", "addr", "show") or "[]")
    return [
        ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
        for interface in interfaces
        for info in interface.get("addr_info", [])
        if "local" in info and "prefixlen" in info
    ]


def namespaces(ip_command: str = "ip") -> set[str]:
    """The names of the host's named network namespaces (``ip netns list``)."""
    return {line.split()[0] for line in _ip(ip_command, "netns", "list").splitlines() if line}


def _lock_path() -> str:
    base = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else None
    return os.path.join(base or tempfile.gettempdir(), "kernel_gateway_stream-netns.lock")


@contextlib.contextmanager
def _host_network_lock() -> Iterator[None]:
    """Held while a /30 is chosen and taken, by every gateway process on this host."""
    with open(_lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def create_network(
    kernel_id: str, pool: ipaddress.IPv4Network, ip_command: str = "ip"
) -> KernelNetwork:
    """Create kernel ``kernel_id``'s namespace and veth pair on a free /30 of ``pool``.

    Nothing is left behind if it fails.

    Raises:
        RuntimeError: the namespace exists already, ``pool`` is full, or an ``ip`` command
            failed.
    """
    with _host_network_lock():
        name = namespace_name(kernel_id)
        if name in namespaces(ip_command):
            raise RuntimeError(
                f"network namespace {name} exists already (left over? `ip netns del {name}`)"
            )
        subnet = choose_subnet(pool, host_networks(ip_command))
        if subnet is None:
            raise RuntimeError(f"no free /{_LINK_PREFIX} left in subnet pool {pool}")
        network = KernelNetwork.for_kernel(kernel_id, subnet)
        build_network(network, ip_command)
        return network


def build_network(network: KernelNetwork, ip_command: str = "ip") -> None:
    """Create ``network``'s namespace, veth pair and addresses, and bring them up.

    Raises:
        RuntimeError: an ``ip`` command failed (what was created is deleted again).
    """
    host, inside, namespace = network.host_interface, _NAMESPACE_INTERFACE, network.namespace
    prefix = f"/{network.subnet.prefixlen}"
    steps = [
        f"netns add {namespace}",
        f"link add {host} type veth peer name {inside} netns {namespace}",
        f"addr add {network.host_address}{prefix} dev {host}",
        f"link set {host} up",
        f"-n {namespace} addr add {network.kernel_address}{prefix} dev {inside}",
        f"-n {namespace} link set lo up",
        f"-n {namespace} link set {inside} up",
    ]
    try:
        for step in steps:  # names and addresses hold no spaces
            _ip(ip_command, *step.split())
    except BaseException:
        delete_network(network, ip_command)
        raise


def delete_network(network: KernelNetwork, ip_command: str = "ip") -> None:
    """Kill every process of the kernel's user and what still runs in ``network``'s
    namespace, delete its veth pair, the namespace and the kernel's directory. What is
    gone already is skipped: it may be called any number of times.

    Raises:
        RuntimeError: an ``ip`` command failed on something that exists, or ``kill``
            could not be run.
    """
    if network.user is not None:
        kill_user_processes(network.user)
    exists = network.namespace in namespaces(ip_command)
    if exists:
        for pid in _ip(ip_command, "netns", "pids", network.namespace).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    # The namespace's end of the pair goes with the namespace, but only once the kernel
    # has torn the namespace down, asynchronously: delete the host's end now, so that its
    # /30 is free as soon as this returns.
    try:
        _ip(ip_command, "link", "del", network.host_interface)
    except RuntimeError as error:
        if "Cannot find device" not in str(error):
            raise
    if exists:
        _ip(ip_command, "netns", "del", network.namespace)
    if network.user is not None:
        remove_kernel_directory(network.user)


# -- the provisioner ---------------------------------------------------------------------


class NetnsProvisioner(KernelProvisionerBase):
    """Runs each kernel in a network namespace of its own, reached over a veth pair.

    Selected by a kernelspec's ``metadata.kernel_provisioner.provisioner_name`` of
    ``netns-provisioner`` (see :func:`install_netns_kernelspec`); jupyter_client's
    ``KernelProvisionerFactory`` makes one per kernel manager, and the kernel manager calls
    its methods as the base class documents. The module's docstring says what it does to
    the host.
    """

    subnet_pool = Unicode(
        DEFAULT_SUBNET_POOL,
        config=True,
        help="IPv4 network (CIDR) from which each kernel's veth pair gets a /30 that no "
        "address of the host overlaps: the host side gets its first address, the kernel the "
        "second.",
    )
    ip_command = Unicode(
        "ip",
        config=True,
        help="iproute2's ip command (a name on PATH or a path).",
    )
    setpriv_command = Unicode(
        "setpriv",
        config=True,
        help="util-linux's setpriv command (a name on PATH or a path), which drops the "
        "kernel's privileges inside its namespace.",
    )
    nft_command = Unicode(
        "nft",
        config=True,
        help="nftables' nft command (a name on PATH or a path), which loads each kernel "
        "namespace's firewall.",
    )
    uid_base = Int(
        DEFAULT_UID_BASE,
        config=True,
        help="The first of the kernels' user ids. The kernel on the n-th /30 of "
        "subnet_pool runs as uid uid_base + n (a /16 pool: 16384 uids), so no two live "
        "kernels on the host share a user and none can signal, trace or read another. The "
        "range needs no /etc/passwd entries and must hold no other user's files or "
        "processes: shutting a kernel down kills every process of its uid. Gateways on one "
        "host with different subnet pools need disjoint ranges.",
    )
    gid_base = Int(
        DEFAULT_UID_BASE,
        config=True,
        help="The first of the kernels' group ids: the kernel on the n-th /30 of "
        "subnet_pool runs with gid gid_base + n and no supplementary groups; its copy of "
        "the connection file is readable by that group only. Same rules as uid_base.",
    )
    runtime_directory = Unicode(
        config=True,
        help="Where each kernel gets a directory <namespace>/ of root's (its copy of the "
        "connection file) holding home/, the kernel's own home and working directory; "
        "deleted with the kernel. Made with mode 0711 if missing; it must be root's and "
        "writable by nobody else, and its parent searchable by the kernels' users. "
        "Default: /run/kernel_gateway_stream-netns (the temporary directory without /run).",
    )
    exposed_directories = List(
        Unicode(),
        config=True,
        help="Directories the kernel needs to run (its interpreter and packages) that an "
        "ancestor hides from the kernel's user, as /root hides a Python installed in "
        "root's home. In the kernel's own mount namespace, the highest such ancestor is "
        "covered by an empty tmpfs holding read-only binds of these directories only; "
        "directories the kernel's user can reach anyway are left alone. Default: this "
        "interpreter's prefixes (sys.base_prefix and sys.prefix), which the kernelspec "
        "of install_netns_kernelspec runs.",
    )

    @default("runtime_directory")
    def _default_runtime_directory(self) -> str:
        base = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else None
        return os.path.join(base or tempfile.gettempdir(), "kernel_gateway_stream-netns")

    @default("exposed_directories")
    def _default_exposed_directories(self) -> list[str]:
        return list(dict.fromkeys([sys.base_prefix, sys.prefix]))

    @validate("uid_base", "gid_base")
    def _valid_id_base(self, proposal: Any) -> int:
        if proposal["value"] <= 0:
            raise TraitError(f"{proposal['trait'].name} must be above 0 (root)")
        return int(proposal["value"])

    @validate("subnet_pool")
    def _valid_subnet_pool(self, proposal: Any) -> str:
        try:
            parse_pool(proposal["value"])
        except ValueError as error:
            raise TraitError(str(error)) from error
        return str(proposal["value"])

    process: subprocess.Popen[Any] | None = None
    pid: int | None = None
    pgid: int | None = None
    network: KernelNetwork | None = None

    @property
    def has_process(self) -> bool:
        return self.process is not None

    async def poll(self) -> int | None:
        """The kernel's exit status, None while it runs (0 once it has been waited for)."""
        if self.process is None:
            return 0
        return self.process.poll()

    async def wait(self) -> int | None:
        """Wait until the kernel has exited; its exit status. Callers bound the wait."""
        if self.process is None:
            return 0
        while await self.poll() is None:
            await asyncio.sleep(0.1)
        status = self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        self.process = None
        return status

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel's process group (the kernel and what it started), or, if that
        fails, the kernel alone. ``ip netns exec`` exec'ed the kernel: it is this process."""
        if self.process is None:
            return
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signum)
                return
            except OSError:
                pass  # the process itself, below
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Create the kernel's network (a restart reuses it), point the kernel manager at
        its address and ports, write the connection file and the kernel's copy of it,
        load the namespace's firewall and build the command.

        Called by ``KernelManager.pre_start_kernel``, at every start and restart.

        Raises:
            RuntimeError: not root, no ``ip``, ``setpriv`` or ``nft``, no kernel manager as
                parent, a transport other than tcp, or the network, the kernel's directory
                or its firewall could not be made.
        """
        km = self.parent
        if not isinstance(km, KernelManager):
            raise RuntimeError("NetnsProvisioner runs only under a jupyter_client KernelManager")
        if km.transport != "tcp":
            raise RuntimeError(f"NetnsProvisioner needs the tcp transport, not {km.transport}")
        ip_command = require_netns_support(self.ip_command)
        require_command(self.setpriv_command, "util-linux")
        nft_command = require_command(self.nft_command, "nftables")
        kwargs.pop("transport_encryption", None)  # tcp to the namespace, unencrypted
        extra_arguments = kwargs.pop("extra_arguments", [])
        created = await self._ensure_network(ip_command)
        assert self.network is not None
        try:
            if km.ip != self.network.kernel_address:
                # A new address (first start, or a network made again): new connection file.
                km.cleanup_connection_file()
                km.ip = self.network.kernel_address
            ports = iter(choose_ports(len(_PORT_NAMES)))
            for name in _PORT_NAMES:
                if not getattr(km, name):
                    setattr(km, name, next(ports))
            if "env" in kwargs:  # as LocalProvisioner does
                km.write_connection_file(jupyter_session=kwargs["env"].get("JPY_SESSION_NAME", ""))
            else:
                km.write_connection_file()
            self.connection_info = km.get_connection_info()
            # The gateway pings the heartbeat of such a kernel (the link may fail).
            km.watch_heartbeat = True  # type: ignore[attr-defined]
            argv = km.format_kernel_cmd(extra_arguments=extra_arguments)
            network = self._with_user(self.network)
            user = network.user
            assert user is not None
            await asyncio.to_thread(
                prepare_kernel_directory, user, self.runtime_directory, km.connection_file
            )
            kernel_ports = [getattr(km, name) for name in _PORT_NAMES]
            await asyncio.to_thread(
                apply_firewall,
                network.namespace,
                _NAMESPACE_INTERFACE,
                kernel_ports,
                ip_command,
                nft_command,
                self.outbound_allowed,
            )
            if self.outbound_allowed:  # through the host, which must forward it on
                await asyncio.to_thread(
                    _ip,
                    ip_command,
                    *("-n", network.namespace, "route", "replace", "default"),
                    *("via", network.host_address),
                )
            await self.prepare_confinement(network)
        except BaseException:
            if created:
                await self._delete_network()
            raise
        command = self.confined_command(network, argv, km.connection_file, ip_command)
        kwargs["env"] = self.confined_environment(kwargs.get("env", os.environ), user)
        kwargs["cwd"] = user.home
        return await super().pre_launch(cmd=command, **kwargs)

    @property
    def outbound_allowed(self) -> bool:
        """Whether the namespace's firewall lets the kernel's own connections out (never,
        for netns kernels; a trait of the sandbox's)."""
        return False

    async def prepare_confinement(self, network: KernelNetwork) -> None:
        """What a subclass makes for the kernel besides its network, user and directory;
        called by :meth:`pre_launch` at every start, after the firewall is loaded. On
        failure, a network made by this start is deleted (with the kernel's directory)."""

    def confined_command(
        self, network: KernelNetwork, argv: list[str], connection_file: str, ip_command: str
    ) -> list[str]:
        """The command that runs the kernelspec's ``argv`` in ``network``, as its user:
        ``ip netns exec`` and :mod:`.netns_enter`. ``connection_file`` (the gateway's)
        becomes the kernel's own copy in ``argv``. Called by :meth:`pre_launch`."""
        user = network.user
        assert user is not None
        # The kernel reads its own copy (the gateway's runtime directory is closed to it).
        argv = [argument.replace(connection_file, user.connection_file) for argument in argv]
        exposed = [
            option for directory in self.exposed_directories for option in ("--expose", directory)
        ]
        setpriv_command = require_command(self.setpriv_command, "util-linux")
        return [
            *(ip_command, "netns", "exec", network.namespace),
            *(sys.executable, "-I", "-S", _ENTER_SCRIPT),
            *("--uid", str(user.uid), "--gid", str(user.gid), "--setpriv", setpriv_command),
            *exposed,
            "--",
            *argv,
        ]

    def confined_environment(
        self, environment: Mapping[str, str], user: KernelUser
    ) -> dict[str, str]:
        """The kernel's environment (:func:`.netns_confinement.kernel_environment`)."""
        return kernel_environment(environment, user)

    def _with_user(self, network: KernelNetwork) -> KernelNetwork:
        """``network`` with the kernel's user, chosen now if it has none (a new network;
        a network kept across a restart keeps its user)."""
        if network.user is None:
            user = kernel_user(
                network.namespace,
                network.subnet,
                parse_pool(self.subnet_pool),
                self.uid_base,
                self.gid_base,
                self.runtime_directory,
            )
            network = self.network = dataclasses.replace(network, user=user)
            self.log.info(
                "Kernel %s runs as uid %d, gid %d, in %s",
                self.kernel_id,
                user.uid,
                user.gid,
                user.home,
            )
        return network

    async def _ensure_network(self, ip_command: str) -> bool:
        """Make the kernel's network unless it exists; True if it was made now."""
        if self.network is not None:
            if self.network.namespace in await asyncio.to_thread(namespaces, ip_command):
                return False
            self.log.warning(
                "Network namespace %s of kernel %s vanished; making it again",
                self.network.namespace,
                self.kernel_id,
            )
            await self._delete_network()
        pool = parse_pool(self.subnet_pool)
        kernel_id = str(self.kernel_id)
        self.network = await asyncio.to_thread(create_network, kernel_id, pool, ip_command)
        self.log.info(
            "Kernel %s gets network namespace %s, %s (host) <-> %s (kernel) on %s",
            self.kernel_id,
            self.network.namespace,
            self.network.host_address,
            self.network.kernel_address,
            self.network.host_interface,
        )
        return True

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start ``cmd`` (``ip netns exec ...``); the kernel's connection info.

        Called by ``KernelManager.launch_kernel`` right after :meth:`pre_launch`. If the
        command cannot be started, nobody will clean up after it: the network goes now (a
        later start makes it again).
        """
        popen_kwargs = {
            k: v for k, v in kwargs.items() if k not in ("extra_arguments", "kernel_id")
        }
        try:
            self.process = launch_kernel(cmd, **popen_kwargs)
        except BaseException:
            await self._delete_network()
            raise
        self.pid = self.process.pid
        try:
            self.pgid = os.getpgid(self.pid)
        except OSError:
            self.pgid = None
        return self.connection_info

    async def cleanup(self, restart: bool = False) -> None:
        """Kill the kernel user's processes, delete the kernel's network and directory,
        unless a restart follows (it keeps them).

        Called by ``KernelManager.cleanup_resources`` after a shutdown, a restart's
        shutdown, and a kernel that died for good. Safe to call again.
        """
        if restart:
            return
        await self._delete_network()
        if self.process is not None and self.process.poll() is not None:
            self.process = None  # reaped: deleting the network killed what was left

    async def _delete_network(self) -> None:
        network = self.network
        if network is None:
            return
        await asyncio.to_thread(delete_network, network, self.ip_command)
        self.network = None
        self.log.info(
            "Deleted network namespace %s of kernel %s", network.namespace, self.kernel_id
        )

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update(
            pid=self.pid,
            pgid=self.pgid,
            network=None if self.network is None else self.network.as_dict(),
        )
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.pid = provisioner_info.get("pid")
        self.pgid = provisioner_info.get("pgid")
        network = provisioner_info.get("network")
        self.network = None if network is None else KernelNetwork.from_dict(network)


# -- kernelspec --------------------------------------------------------------------------


def netns_kernelspec(
    display_name: str = DEFAULT_DISPLAY_NAME,
    config: Mapping[str, Any] | None = None,
    provisioner_name: str = PROVISIONER_NAME,
) -> dict[str, Any]:
    """The ``kernel.json`` of a Python kernel (this interpreter, lossless IOPub) in a
    network namespace of its own; ``config`` configures the provisioner
    (``{"subnet_pool": "10.99.0.0/16"}``), ``provisioner_name`` names it (the sandbox's
    is a netns provisioner too)."""
    return {
        "argv": [
            sys.executable,
            "-m",
            "kernel_gateway_stream.kernel_launcher",
            "-f",
            "{connection_file}",
        ],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {
            "kernel_provisioner": {
                "provisioner_name": provisioner_name,
                "config": dict(config or {}),
            }
        },
    }


def install_netns_kernelspec(
    prefix_or_dir: str | os.PathLike[str] | None = None,
    name: str = DEFAULT_KERNEL_NAME,
    display_name: str = DEFAULT_DISPLAY_NAME,
    *,
    prefix: bool = False,
    user: bool = False,
    config: Mapping[str, Any] | None = None,
    provisioner_name: str = PROVISIONER_NAME,
) -> Path:
    """Install the kernelspec ``name`` (:func:`netns_kernelspec`); the directory written.

    ``prefix_or_dir`` is a kernels directory (the spec goes to ``prefix_or_dir/name``), or
    with ``prefix=True`` an installation prefix (``prefix_or_dir/share/jupyter/kernels/
    name``). Without it, the spec goes to the user's Jupyter data directory if ``user``,
    else to the system's (as ``jupyter kernelspec install`` does).

    Raises:
        ValueError: ``name`` is not a valid kernel name, or the arguments contradict.
    """
    if not _KERNEL_NAME.match(name):
        raise ValueError(f"invalid kernel name {name!r}: use letters, digits, '.', '_', '-'")
    if prefix and prefix_or_dir is None:
        raise ValueError("prefix=True needs a prefix")
    if user and prefix_or_dir is not None:
        raise ValueError("user=True installs into the user's data directory: no path")
    spec = netns_kernelspec(display_name, config, provisioner_name)
    if prefix_or_dir is not None and not prefix:
        target = Path(prefix_or_dir) / name
        target.mkdir(parents=True, exist_ok=True)
        (target / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        return target
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as source:
        Path(source, "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        installed = KernelSpecManager().install_kernel_spec(
            source,
            kernel_name=name,
            user=user,
            prefix=None if prefix_or_dir is None else os.fspath(prefix_or_dir),
        )
    return Path(installed)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kernel_gateway_stream.kernels.netns install|check``."""
    parser = argparse.ArgumentParser(
        prog="python -m kernel_gateway_stream.kernels.netns",
        description="Kernels in a network namespace of their own.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="install a kernelspec that uses them")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="into the user's Jupyter data dir")
    where.add_argument("--prefix", metavar="P", help="into P/share/jupyter/kernels")
    where.add_argument("--dir", metavar="D", help="into the kernels directory D")
    install.add_argument("--name", default=DEFAULT_KERNEL_NAME, help="the kernel name")
    install.add_argument("--display-name", default=DEFAULT_DISPLAY_NAME)
    install.add_argument(
        "--subnet-pool",
        metavar="CIDR",
        help=f"the pool of /30s for this kernelspec (default: {DEFAULT_SUBNET_POOL}, or "
        "NetnsProvisioner.subnet_pool in the gateway's configuration)",
    )
    commands.add_parser("check", help="say whether this host can run them")
    options = parser.parse_args(argv)
    if options.command == "check":
        try:
            ip_command = require_netns_support()
            namespaces(ip_command)
            require_command("setpriv", "util-linux")
            require_command("nft", "nftables")
        except RuntimeError as error:
            print(f"no: {error}", file=sys.stderr)
            return 1
        print("yes: root, setpriv, nft, and", ip_command, "lists network namespaces")
        return 0
    config: dict[str, Any] = {}
    if options.subnet_pool:
        try:
            config["subnet_pool"] = str(parse_pool(options.subnet_pool))
        except ValueError as error:
            parser.error(str(error))
    try:
        path = install_netns_kernelspec(
            options.prefix or options.dir,
            options.name,
            options.display_name,
            prefix=options.prefix is not None,
            user=options.user,
            config=config,
        )
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Installed kernelspec {options.name} in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
