"""The application: one ExtensionApp, two launches.

* Loaded by ``jupyter server`` (enabled by ``etc/jupyter/jupyter_server_config.d/
  kernel_gateway_stream.json``), it replaces the kernel channels WebSocket with the
  gateway's and adds the transcript API; JupyterLab users change nothing.
* Launched on its own (``kernel-gateway-stream`` or ``python -m kernel_gateway_stream``),
  it is the headless service: bound to 127.0.0.1 unless ``--ip`` says otherwise (and
  never to another address without authentication, unless the operator insists), token
  auth on, no browser, and only the kernel APIs (:attr:`StreamServerApp.services`). A
  start that cannot work (a transcript database that cannot be opened) stops with one
  line; SIGTERM, or SIGINT without a terminal, stops gracefully. Its kernel manager is
  the gateway's :class:`~kernel_gateway_stream.kernels.StreamMappingKernelManager`, whose
  shutdowns wait out a restart in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import hmac
import ipaddress
import logging
import os
import signal
import socket
import sys
import time
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from jupyter_core.utils import ensure_async
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.serverapp import ServerApp
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Dict, Float, Int, List, Type, Unicode, default

from . import metrics
from .broker.base import Broker
from .broker.memory import MemoryBroker
from .broker.subscriber import ReplayLimits
from .cluster import ClusterNode
from .core.errors import GatewayStreamError, StoreInUse, StoreUnavailable, UnsafeCluster
from .core.health import ComponentHealth, State
from .executions import ExecutionManager
from .handlers.cells import CellsHandler
from .handlers.channels import ChannelsHandler, StreamChannelsConnection
from .handlers.common import SETTINGS_KEY, QueuePolicy, Services
from .handlers.error_bodies import error_reasons
from .handlers.execute import (
    ExecuteHandler,
    ExecutionEventsHandler,
    ExecutionHandler,
    ExecutionInputHandler,
    ExecutionInterruptHandler,
)
from .handlers.health import HealthHandler
from .handlers.kernels import (
    AttachingKernelsHandler,
    DetachingKernelHandler,
    KernelActionsHandler,
)
from .handlers.page import PAGE_PATH, PageAssetHandler, PageHandler
from .handlers.sessions import SessionRegistry
from .handlers.stream import StreamHandler
from .handlers.transcript import TranscriptHandler
from .kernels import StreamKernelManager, StreamMappingKernelManager
from .kernels.attaching import KernelAttacher
from .kernels.pool import POOL_FILE, KernelPool
from .kernels.upstream_manager import UpstreamMappingKernelManager
from .kernels.zmq_kernel import KernelSockets
from .logs import LogSetup
from .memory import HeapTrimmer
from .recording.registry import KERNEL_ACTIONS_SCHEMA, RecorderRegistry
from .secrets import (
    RedactingFilter,
    forbid_dumping,
    login_cookie_key,
    remove_secrets_from_environment,
    wipe_from_arguments,
)
from .stores.base import TranscriptStore
from .stores.redis import RedisTranscriptStore
from .stores.redis_trust import password_of
from .stores.sqlite import SQLiteTranscriptStore
from .stores.sqlite_schema import create_private_file

__all__ = ["GatewayStreamApp", "StartRefused", "StreamServerApp", "main"]

DEFAULT_KM = "jupyter_server.services.kernels.kernelmanager.ServerKernelManager"
#: Variables kept from kernels whatever the configuration (see GatewayStreamApp.secret_env_vars).
ALWAYS_SECRET = (
    "JUPYTER_TOKEN",
    "JUPYTER_GATEWAY_AUTH_TOKEN",
    "KGS_TOKEN",
    "KGS_REDIS_URL",
    "KGS_CLUSTER_SECRET",
)

#: tornado's loggers (a handler an operator adds to them gets the redaction too).
_TORNADO_LOGGERS = ("tornado.access", "tornado.application", "tornado.general")

# Any id, so that an id of the wrong shape still gets a JSON 404 from us.
_KERNEL_ID = r"(?P<kernel_id>[^/]+)"
_MSG_ID = r"(?P<msg_id>[^/]+)"


class StartRefused(GatewayStreamError):
    """The daemon will not start as configured; the message says why, in one line."""


class StreamServerApp(ServerApp):
    """The ServerApp of the standalone daemon: kernels, not files."""

    name = "kernel-gateway-stream"
    description = "kernel_gateway_stream: durable, coalesced, resumable Jupyter kernel output."

    services = List(
        Unicode(),
        default_value=["api", "auth", "kernels", "kernelspecs", "sessions", "security"],
        config=True,
        help="jupyter_server services the daemon serves. Add 'contents', 'files', 'nbconvert', "
        "'config', 'view', 'shutdown' or 'events' to serve them too.",
    )

    @property  # type: ignore[override]
    def default_services(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.services)

    # A headless service, like Kernel Gateway: loopback unless told otherwise (defaults,
    # not forced values, so that --ip works), never a browser. jupyter_server's refusal to
    # run as root guards its notebook UI, which the daemon does not serve; the daemon
    # warns instead (run it as a dedicated user: etc/ has a unit).
    @default("ip")
    def _default_ip(self) -> str:
        return "127.0.0.1"

    @default("open_browser")
    def _default_open_browser(self) -> bool:
        return False

    @default("port_retries")
    def _default_port_retries(self) -> int:
        # A service behind a proxy, a load balancer or a scraper must be where it was told
        # to be: a busy port stops the start (--ServerApp.port_retries=N allows moving on).
        return 0

    @default("allow_root")
    def _default_allow_root(self) -> bool:
        return True

    @default("no_browser_open_file")
    def _default_no_browser_open_file(self) -> bool:
        return True  # it would hold the token, in a file kernels can read

    @default("kernel_manager_class")
    def _default_kernel_manager_class(self) -> Any:
        # The default, not a setting: --ServerApp.kernel_manager_class still wins; with
        # GatewayClient enabled the kernels are remote (jupyter_server's gateway manager).
        # An extension cannot swap the kernel manager of a `jupyter server` it is loaded
        # into without overriding that server's own configuration, so only the daemon,
        # whose ServerApp this is, changes the default.
        if self.gateway_config.gateway_enabled:
            # jupyter_server's gateway manager, with Enterprise Gateway's defaults handled.
            return UpstreamMappingKernelManager
        return StreamMappingKernelManager

    @default("reraise_server_extension_failures")
    def _default_reraise(self) -> bool:
        return True  # without the gateway, the daemon is not worth running

    @default("cookie_secret")
    def _default_cookie_secret(self) -> bytes:
        """Held in memory and never written: jupyter_server keeps its cookie secret in
        ``<runtime dir>/jupyter_cookie_secret``, where a kernel running as the same user
        reads it and signs itself a login cookie. Derived from the token (so that a new
        token ends every cookie signed under the old one), else random for this run; the
        password, if any, is mixed in as jupyter_server does."""
        key = login_cookie_key(self.identity_provider.token)
        digest = hmac.new(key, digestmod=hashlib.sha256)
        digest.update(self.password.encode())
        digest = self.identity_provider.cookie_secret_hook(digest)
        return digest.digest()

    def server_info(self) -> dict[str, Any]:
        """As jupyter_server's, without the token: kernels can read the runtime directory."""
        info: dict[str, Any] = super().server_info()
        info["token"] = ""
        return info

    def running_server_info(self, kernel_count: bool = True) -> str:
        """Where the daemon serves; no notebook directory (it serves kernels, not files)."""
        info: str = super().running_server_info(kernel_count)
        if "contents" not in self.services:
            lines = info.split("\n")
            info = "\n".join(lines[1:])  # the contents manager's "Serving notebooks from"
        return info

    def _signal_stop(self, sig: Any, frame: Any) -> None:
        # A stop asked for is normal operation (jupyter_server logs it as CRITICAL).
        self.log.info("Received signal %s, stopping", sig)
        self.stop(from_signal=True)

    def init_signal(self) -> None:
        super().init_signal()
        if not (sys.stdin and sys.stdin.isatty()):
            # No terminal to confirm on: SIGINT stops gracefully, as SIGTERM does.
            signal.signal(signal.SIGINT, self._signal_stop)


class GatewayStreamApp(ExtensionApp):
    """kernel_gateway_stream's extension (and, launched on its own, its daemon)."""

    name = "kernel_gateway_stream"
    description = StreamServerApp.description
    #: The daemon's / leads here, and its start-up line prints this URL: the live output
    #: page, its only web UI.
    extension_url = "/kernel_gateway_stream/"
    load_other_extensions = False
    serverapp_class = StreamServerApp

    classes = [
        *ExtensionApp.classes,
        StreamServerApp,
        RecorderRegistry,
        SQLiteTranscriptStore,
        RedisTranscriptStore,
        ClusterNode,
        MemoryBroker,
        ExecutionManager,
        KernelAttacher,
    ]

    @default("open_browser")
    def _default_open_browser(self) -> bool:
        return False

    redis_url = Unicode(
        config=True,
        help="Run as one node of several sharing this Redis (redis://host:port/db; rediss:// "
        "for TLS): transcripts, the record bus, the kernel directory and the kernels' leases "
        "live there (RedisTranscriptStore, ClusterNode), and transcript_store_class is not "
        "used. Defaults to the KGS_REDIS_URL environment variable; empty: one node, SQLite.",
    )

    @default("redis_url")
    def _default_redis_url(self) -> str:
        return os.environ.get("KGS_REDIS_URL", "")

    cluster_secret = Unicode(
        config=True,
        help="Several nodes: the secret every node signs its URL and its kernels' directory "
        "entries in Redis with, and checks the others' with (HMAC-SHA256), so that code that "
        "reaches Redis cannot point a node at its own listener or have it attach a kernel of "
        "its own. The same on every node, at least 16 characters; required with redis_url. "
        "Defaults to the KGS_CLUSTER_SECRET environment variable (kept from kernels like "
        "KGS_REDIS_URL): prefer it to a configuration file a kernel may read.",
    )

    @default("cluster_secret")
    def _default_cluster_secret(self) -> str:
        return os.environ.get("KGS_CLUSTER_SECRET", "")

    transcript_store_class = Type(
        default_value=SQLiteTranscriptStore,
        klass=TranscriptStore,
        config=True,
        help="The TranscriptStore subclass that keeps transcripts.",
    )
    broker_class = Type(
        default_value=MemoryBroker,
        klass=Broker,
        config=True,
        help="The Broker subclass that fans output out to subscribers.",
    )
    lossless_kernel_iopub = Bool(
        True,
        config=True,
        help="Start local ipykernels (those on the gateway's own interpreter) through "
        "kernel_gateway_stream.kernel_launcher, whose IOPub socket queues instead of dropping "
        "when the machine is too busy to drain it at once. Applies when the kernel manager's "
        "kernel_manager_class is jupyter_server's default.",
    )
    kernel_forkserver = Bool(
        True,
        config=True,
        help="Fork local ipykernels (those started through kernel_gateway_stream."
        "kernel_launcher) from a process that has imported ipykernel once "
        "(kernel_gateway_stream.kernel_forkserver), where that starts the kernel an exec "
        "would: about 0.6 s of CPU less a kernel start. Off: every kernel is exec'd.",
    )
    secret_env_vars = List(
        Unicode(),
        default_value=[],
        config=True,
        help="More environment variables that hold secrets (cloud credentials, database "
        "passwords), besides JUPYTER_TOKEN, JUPYTER_GATEWAY_AUTH_TOKEN, KGS_TOKEN, KGS_REDIS_URL "
        "(it may hold Redis's password) and any "
        "variable holding the token: all are removed from the gateway's environment before "
        "any kernel starts, so kernels never see them.",
    )
    kernel_pool = Dict(
        value_trait=Int(min=0),
        key_trait=Unicode(),
        default_value={},
        config=True,
        help="How many kernels of each kernelspec to keep started ahead, for the next starts "
        'of that kernelspec ({"python3-sandbox": 2}); a start takes a ready one in '
        "milliseconds and the pool starts another. Needs StreamMappingKernelManager (the "
        "daemon's default). See docs/sandbox.md.",
    )
    protect_process_memory = Bool(
        True,
        config=True,
        help="Daemon only: mark the process not dumpable (Linux prctl PR_SET_DUMPABLE), so that "
        "a kernel running as the same user cannot read the gateway's memory or environment "
        "through /proc or ptrace.",
    )
    keep_sessions = Bool(
        True,
        config=True,
        help="Keep jupyter_server's sessions (which notebook runs on which kernel) in "
        "sessions.sqlite3 beside the transcripts, so that a page reloaded after the gateway "
        "restarted finds its kernel again (kernels outlive the gateway; jupyter_server keeps "
        "sessions in memory). Only when SessionManager.database_filepath is not set.",
    )
    allow_unauthenticated_remote_access = Bool(
        False,
        config=True,
        help="Let the daemon serve on an address other than loopback with no token and no "
        "password. Anyone who can reach it can then run code on its kernels.",
    )
    subscriber_max_bytes = Int(
        32 * 1024 * 1024,
        config=True,
        help="A client with more than this many bytes queued is disconnected (close code 4008, "
        "with the last seq it was sent) and may resume from the transcript. Frames are shared "
        "between clients, so this bounds a client's backlog, not a copy of it.",
    )
    subscriber_max_lag = Float(
        60.0,
        config=True,
        help="A client whose oldest queued message has waited this many seconds is disconnected "
        "as too slow (close code 4008).",
    )
    subscriber_merge_max_bytes = Int(
        1024 * 1024,
        config=True,
        help="Largest stream message made by merging the backlog of a client that fell behind.",
    )
    sse_heartbeat_interval = Float(
        15.0,
        config=True,
        help="Seconds between the keep-alive comment lines of an idle SSE stream, so that "
        "proxies do not close it.",
    )
    max_request_bytes = Int(
        10 * 1024 * 1024,
        config=True,
        help="Largest request body the gateway's endpoints take (code to execute, input); a "
        "larger one gets 413 before it is held in memory.",
    )
    replay_page_records = Int(
        5000, config=True, help="Most records a replay reads from the transcript at once."
    )
    replay_page_bytes = Int(
        1024 * 1024,
        config=True,
        help="Most bytes of messages a replay reads from the transcript at once.",
    )
    max_concurrent_replays = Int(
        8,
        config=True,
        help="Replay pages read and sent at the same time, across all clients: what a storm "
        "of reconnecting clients costs in memory is this many pages.",
    )
    session_grace = Float(
        60.0,
        config=True,
        help="Seconds a client session's kernel channels outlive its dropped connection, "
        "holding the replies sent meanwhile for the client's return (same session_id).",
    )
    max_sessions_away = Int(
        1000,
        config=True,
        help="Most client sessions held for their return at once, across kernels (see "
        "session_grace; each may hold three kernel sockets). Past it, the session away "
        "longest is closed early; its client still resumes its output from the transcript.",
    )
    shutdown_drain_timeout = Float(
        5.0,
        config=True,
        help="Seconds a graceful stop gives clients to receive what is queued for them before "
        "they are told gateway_shutdown (with their last seq).",
    )
    heap_trim_interval = Float(
        10.0,
        config=True,
        help="Seconds between checks whether to give freed memory back to the operating system "
        "(glibc keeps it after a burst); 0 never does. See kernel_gateway_stream.memory.",
    )
    heap_trim_threshold = Int(
        32 * 1024 * 1024,
        config=True,
        help="Bytes the resident set must have grown by since the last trim for another one.",
    )
    log_json = Bool(
        False,
        config=True,
        help="Write the log as one JSON object per line (time, level, logger, message and the "
        "event's fields: kernel_id, session_id, reason, last_seq...).",
    )
    log_file = Unicode(
        "",
        config=True,
        help="Write the log to this file instead of standard error; SIGHUP reopens it (for "
        "logrotate). Empty: standard error.",
    )
    metrics_port = Int(
        0,
        config=True,
        help="Serve /metrics, with no authentication, on this port of its own as well (0: "
        "not). The main port's /metrics follows ServerApp.authenticate_prometheus (a token "
        "by default).",
    )
    metrics_ip = Unicode(
        "127.0.0.1",
        config=True,
        help="Address of the metrics_port listener. Anyone who reaches it reads the metrics "
        "(no output, no tokens: counts and sizes).",
    )
    health_check_interval = Float(
        1.0,
        config=True,
        help="Seconds between checks of the gateway's health; each change of state is logged.",
    )

    def initialize_settings(self) -> None:
        serverapp = self.serverapp
        assert serverapp is not None
        assert serverapp.event_logger is not None
        daemon = isinstance(serverapp, StreamServerApp)
        token = serverapp.identity_provider.token
        # Read before the secrets leave the environment (KGS_REDIS_URL and
        # KGS_CLUSTER_SECRET are among them).
        redis_url = self.redis_url
        cluster_secret = self.cluster_secret if redis_url else ""
        logged_secrets = [token, cluster_secret, (password_of(redis_url) if redis_url else "")]
        self._route_logs([each or "" for each in logged_secrets], serverapp.log)
        self._log_setup = LogSetup(
            [serverapp.log, self.log], json_lines=self.log_json, path=self.log_file
        )
        self._log_setup.apply()
        if daemon:
            self._refuse_unauthenticated_remote(serverapp)
        names = frozenset(ALWAYS_SECRET) | frozenset(self.secret_env_vars)
        removed = remove_secrets_from_environment(names, [token])
        StreamKernelManager.secret_names = names | frozenset(removed)
        StreamKernelManager.secret_values = frozenset([token]) if token else frozenset()
        if token and any(token in argument for argument in sys.argv):
            wiped = wipe_from_arguments([token])
            self.log.warning(
                "The token was given on the command line, where every local user can read "
                "it%s: give it in the JUPYTER_TOKEN environment variable instead",
                " (overwritten in this process's arguments now, visible until then)"
                if wiped
                else "",
            )
        if daemon and self.protect_process_memory:
            forbid_dumping()
        if daemon and os.geteuid() == 0:
            self.log.warning(
                "Running as root: kernels run as root too. Run the daemon as a dedicated user."
            )
        if serverapp.gateway_config.gateway_enabled:
            self.log.info(
                "Kernels are on the upstream gateway %s; each is tapped over its WebSocket",
                serverapp.gateway_config.url,
            )
        # The Type traits hold concrete subclasses of these ABCs.
        if redis_url:
            self.store: TranscriptStore = RedisTranscriptStore(
                parent=self, log=self.log, url=redis_url
            )
        else:
            self.store = self.transcript_store_class(parent=self, log=self.log)
        try:
            self.store.open()
        except StoreInUse as error:
            if not daemon:
                # Loaded into a `jupyter server` or `jupyter lab` beside a gateway on the
                # same store: the extension does not load (the server runs on without it,
                # touching no transcript), and says why in one line.
                self.log.error("kernel_gateway_stream is not loaded: %s", error)
            raise
        #: Set while the kernels an earlier run left are re-attached, and once they are (or
        #: are found gone).
        self.recovering = asyncio.Event()
        self.recovered = asyncio.Event()
        if self.keep_sessions:
            self._keep_sessions(serverapp)
        self.broker: Broker = self.broker_class(parent=self, log=self.log)
        self.sockets = KernelSockets()
        kernel_manager = serverapp.kernel_manager
        self.taps = RecorderRegistry(
            kernel_manager, self.store, self.broker, self.sockets, parent=self, log=self.log
        )
        self.executions = ExecutionManager(self.taps, self.store, parent=self, log=self.log)
        self.attacher = KernelAttacher(kernel_manager, self.sockets, parent=self, log=self.log)
        self.cluster: ClusterNode | None = None
        if isinstance(self.store, RedisTranscriptStore):
            self.cluster = ClusterNode(
                self.store, self.taps, self.attacher, kernel_manager, cluster_secret,
                parent=self, log=self.log,
            )  # fmt: skip
            self.cluster.hide_password_from_arguments()
            try:
                self.cluster.refuse_unsafe_start()
            except UnsafeCluster as error:
                raise StartRefused(str(error)) from error
            self.taps.cluster = self.cluster
            self.cluster.token = token
            if not self.cluster.url:
                host = serverapp.ip if serverapp.ip not in ("", "0.0.0.0", "::") else None
                host = host or socket.gethostname()
                host = f"[{host}]" if ":" in host else host
                self.cluster.url = f"http://{host}:{serverapp.port}{serverapp.base_url}"
            self.log.info("One node of several (Redis %s), named %s",
                          self.store.health().details["redis"], self.cluster.node)  # fmt: skip
        self.services = Services(
            store=self.store,
            broker=self.broker,
            taps=self.taps,
            sessions=SessionRegistry(
                self.log,
                grace=self.session_grace,
                max_away=self.max_sessions_away,
            ),
            executions=self.executions,
            attacher=self.attacher,
            recovering=self.recovering,
            recovered=self.recovered,
            policy=QueuePolicy(
                self.subscriber_max_bytes, self.subscriber_max_lag, self.subscriber_merge_max_bytes
            ),
            replay=ReplayLimits(
                page_records=self.replay_page_records,
                page_bytes=self.replay_page_bytes,
                live_within=self.replay_page_records,
                slots=asyncio.Semaphore(self.max_concurrent_replays),
            ),
            sse_heartbeat=self.sse_heartbeat_interval,
            max_request_bytes=self.max_request_bytes,
            cluster=self.cluster,
        )
        self.taps.on_close(self.services.kernel_closed)
        self.taps.on_lease_lost(self.services.kernel_lease_lost)
        metrics.collector().add(self.services)
        if self.metrics_port:
            self._metrics_server = metrics.MetricsServer(self.metrics_ip, self.metrics_port)
            try:
                self._metrics_server.bind()
            except OSError as error:
                raise StartRefused(
                    f"cannot serve metrics on {self.metrics_ip}:{self.metrics_port}: "
                    f"{error.strerror or error}"
                ) from error
        self.settings[SETTINGS_KEY] = self.services
        # Every refusal says why (a 403 to a wrong token: invalid_token); in the daemon,
        # every error is JSON, jupyter_server's HTML pages (/metrics, unknown paths) too.
        identity = serverapp.identity_provider
        serverapp.web_app.add_transform(
            error_reasons(lambda: str(identity.token or ""), html_to_json=daemon)
        )
        self.settings["kernel_websocket_connection_class"] = StreamChannelsConnection
        StreamKernelManager.lossless_iopub = self.lossless_kernel_iopub
        StreamKernelManager.use_forkserver = self.kernel_forkserver
        StreamKernelManager.output_directory = os.path.join(
            self._state_directory(), "kernel-output"
        )
        if kernel_manager.kernel_manager_class == DEFAULT_KM:
            kernel_manager.kernel_manager_class = (
                f"{StreamKernelManager.__module__}.StreamKernelManager"
            )
        serverapp.event_logger.add_listener(
            schema_id=KERNEL_ACTIONS_SCHEMA, listener=self.taps.on_kernel_action
        )
        self._health: dict[str, tuple[State, str | None]] = {}
        for kernel_id, first, last in self.store.recovered:
            self.log.info("Recovered transcript %s: seqs %d-%d were lost (a gap record)",
                          kernel_id, first, last)  # fmt: skip

    def _state_directory(self) -> str:
        """The gateway's own directory: the SQLite store's, else the default one."""
        path = getattr(self.store, "path", None)
        if isinstance(path, str) and path:
            return os.path.dirname(os.path.abspath(path))
        return os.path.join(jupyter_data_dir(), "kernel_gateway_stream")

    def _route_logs(self, secrets: list[str], server_log: logging.Logger) -> None:
        """The package's own loggers log through the server's handlers, and no handler
        writes the token, Redis's password or the cluster secret (``secrets``), or a
        ``?token=`` value, anywhere: not the extension's, not the
        server's (jupyter_server logs a failing request's URI, query string included,
        through its own logger), not tornado's, not the root logger's."""
        package = logging.getLogger("kernel_gateway_stream")
        package.parent = self.log
        package.setLevel(self.log.getEffectiveLevel())
        redacting = RedactingFilter(secrets)
        loggers = {logging.getLogger()}
        for logger in (self.log, server_log, *map(logging.getLogger, _TORNADO_LOGGERS)):
            while logger is not None:
                loggers.add(logger)
                logger = logger.parent  # type: ignore[assignment]
        for logger in loggers:
            for handler in logger.handlers:
                if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                    handler.addFilter(redacting)

    def _refuse_unauthenticated_remote(self, serverapp: ServerApp) -> None:
        provider = serverapp.identity_provider
        authenticated = bool(provider.token) or bool(getattr(serverapp, "password", ""))
        authenticated = authenticated or bool(getattr(provider, "hashed_password", ""))
        if authenticated or self.allow_unauthenticated_remote_access or _loopback(serverapp.ip):
            return
        raise StartRefused(
            f"refusing to serve kernels unauthenticated on {serverapp.ip or 'every address'}: "
            "set a token (JUPYTER_TOKEN), bind to 127.0.0.1, or set "
            "--GatewayStreamApp.allow_unauthenticated_remote_access=True"
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(
            [
                (r"/api/kernels", AttachingKernelsHandler),
                (rf"/api/kernels/{_KERNEL_ID}", DetachingKernelHandler),
                (rf"/api/kernels/{_KERNEL_ID}/(?P<action>restart|interrupt)", KernelActionsHandler),
                (rf"/api/kernels/{_KERNEL_ID}/channels", ChannelsHandler),
                (rf"/api/kernels/{_KERNEL_ID}/transcript", TranscriptHandler),
                (rf"/api/kernels/{_KERNEL_ID}/cells", CellsHandler),
                (rf"/api/kernels/{_KERNEL_ID}/stream", StreamHandler),
                (rf"/api/kernels/{_KERNEL_ID}/execute", ExecuteHandler),
                (rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}", ExecutionHandler),
                (rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}/events", ExecutionEventsHandler),
                (rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}/input", ExecutionInputHandler),
                (
                    rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}/interrupt",
                    ExecutionInterruptHandler,
                ),
                (r"/api/gateway/health", HealthHandler),
                (PAGE_PATH, PageHandler),
                (rf"{PAGE_PATH}static/(live\.js|live\.css)", PageAssetHandler),
            ]
        )

    def _keep_sessions(self, serverapp: ServerApp) -> None:
        """See :attr:`keep_sessions`. A session whose kernel is not known yet waits for the
        re-attachment (jupyter_server deletes a session whose kernel it does not know)."""
        sessions = getattr(serverapp, "session_manager", None)
        path = getattr(self.store, "path", None)
        if sessions is None or not isinstance(path, str):
            return
        if sessions.database_filepath == ":memory:" and sessions._connection is None:
            target = os.path.join(os.path.dirname(os.path.abspath(path)), "sessions.sqlite3")
            create_private_file(target)
            sessions.database_filepath = target
        culled = sessions.kernel_culled
        recovering, recovered = self.recovering, self.recovered

        async def kernel_culled(kernel_id: str) -> bool:
            if recovering.is_set() and not recovered.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(recovered.wait(), self.attacher.attach_timeout * 3)
            return bool(await ensure_async(culled(kernel_id)))

        sessions.kernel_culled = kernel_culled

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if isinstance(serverapp, StreamServerApp) and not gc.isenabled():
            # The daemon started with the collector off (``__main__``): what its imports and
            # set-up built lives as long as the process, and no collection walks it again.
            gc.freeze()
            gc.enable()
        if not hasattr(self, "services"):
            return  # the extension did not load (its store is another process's)
        self.recovering.set()
        self.taps.start()
        try:
            if self.cluster is not None:
                # The directory is the cluster's: each node joins its kernels (and takes
                # over those whose owner is gone), none re-attaches them as its own.
                try:
                    await self.cluster.sync()
                except Exception as error:  # Redis went away since open(): the loop retries
                    self.log.error("Joining the cluster's kernels failed: %s", error)
                self.cluster.start()
            else:
                await self.attacher.recover(await self.store.load_links(), self.taps, self.store)
        finally:
            self.recovered.set()
        self.attacher.start()
        await self._open_pool(serverapp.kernel_manager)
        self._health_watch = PeriodicCallback(self._watch_health, self.health_check_interval * 1000)
        self._health_watch.start()
        self.trimmer = HeapTrimmer(self.heap_trim_interval, self.heap_trim_threshold)
        self.trimmer.start()
        if hasattr(self, "_metrics_server"):
            self._metrics_server.start()
        if isinstance(serverapp, StreamServerApp):
            # SIGHUP would end the process (jupyter_server does not handle it): reopen the
            # log file instead, as daemons do.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._log_setup.reopen)
        await self.taps.reconcile()

    async def _open_pool(self, kernel_manager: Any) -> None:
        """Start filling the warm pool, if ``kernel_pool`` asks for one."""
        if not any(self.kernel_pool.values()):
            return
        if not isinstance(kernel_manager, StreamMappingKernelManager):
            self.log.warning(
                "kernel_pool is ignored: it needs --ServerApp.kernel_manager_class="
                "kernel_gateway_stream.kernels.StreamMappingKernelManager"
            )
            return
        path = os.path.join(self._state_directory(), POOL_FILE)
        kernel_manager.pool = KernelPool(kernel_manager, self.kernel_pool, path, log=self.log)
        await kernel_manager.pool.open()

    def _watch_health(self) -> None:
        """Log each change of a component's state, once."""
        for component in self.services.health():
            now = (component.state, component.reason)
            before = self._health.get(component.name, (State.OK, None))
            self._health[component.name] = now
            if now != before:
                self._log_health(component, before[0])

    def _log_health(self, component: ComponentHealth, before: State) -> None:
        if component.state is State.OK:
            self.log.info("The %s recovered (was %s)", component.name, before.value)
        else:
            log = self.log.error if component.state is State.FAILING else self.log.warning
            log("The %s is %s: %s", component.name, component.state.value, component.reason)

    async def stop_extension(self) -> None:
        """A graceful stop (jupyter_server stops extensions before it shuts kernels down):
        stop tapping, send every client what is queued and then ``gateway_shutdown`` with
        its last seq, make the transcript durable, each within a bounded time."""
        if not hasattr(self, "services"):
            return  # the extension never initialized (its start failed)
        if hasattr(self, "_health_watch"):
            self._health_watch.stop()
            self.trimmer.stop()
        metrics.collector().remove(self.services)
        if hasattr(self, "_metrics_server"):
            self._metrics_server.stop()
        # The warm pool's kernels go now: jupyter_server shuts kernels down after this only
        # when its kernel manager is truthy, and a MultiKernelManager is as long as its
        # list of kernels, so with none listed (only pooled ones) it never did, and they
        # outlived the gateway.
        pool = getattr(getattr(self.serverapp, "kernel_manager", None), "pool", None)
        if pool is not None:
            await pool.close()
        if self.cluster is not None:
            await self.cluster.stop()
            # The kernels this node records go to the others, running: the server's
            # shutdown of every kernel must not reach them.
            for kernel_id in await self.cluster.hand_over(self.shutdown_drain_timeout):
                self.taps.taps.pop(kernel_id, None)
                self._let_go(kernel_id)
        now = time.time()
        for kernel_id, tap in list(self.taps.taps.items()):
            if tap.following:
                # Another node records it: the server's shutdown of every kernel leaves it be.
                tap.kernel_manager.stop_on_shutdown = False
                continue
            self.store.kernel_ended(kernel_id, now)
            # jupyter_server shuts every kernel down after this: only a kernel that runs on
            # (attached, not the gateway's own: it is detached) is re-attached next time.
            kernel = tap.kernel_manager
            if getattr(kernel, "attachment", None) is None or kernel.stop_on_shutdown:
                self.store.save_link(kernel_id, None)
        self.attacher.stop()
        self.taps.close()
        await self.services.gateway_stopping(self.shutdown_drain_timeout)
        self.executions.close()
        self.services.sessions.close()
        await self.store.flush(self.store_close_timeout())
        self.store.close()
        self.sockets.close()

    def _let_go(self, kernel_id: str) -> None:
        """Forget a kernel without stopping it (handed over to another node)."""
        km = self.serverapp.kernel_manager if self.serverapp is not None else None
        if km is None or kernel_id not in km:
            return
        kernel: Any = km.get_kernel(kernel_id)
        if getattr(kernel, "attachment", None) is not None:
            kernel.stop_on_shutdown = False  # the server's shutdown detaches it
            return
        with contextlib.suppress(Exception):
            kernel.stop_restarter()
        km.remove_kernel(kernel_id)

    def store_close_timeout(self) -> float:
        return float(getattr(self.store, "close_timeout", 10.0))


def _loopback(ip: str) -> bool:
    if ip in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def main() -> None:
    """The ``kernel-gateway-stream`` command."""
    try:
        GatewayStreamApp.launch_instance()
    except (StartRefused, StoreUnavailable) as error:
        print(f"kernel-gateway-stream: {error}", file=sys.stderr)
        sys.exit(1)
