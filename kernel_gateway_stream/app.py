"""The application: one ExtensionApp, two launches.

* Loaded by ``jupyter server`` (enabled by ``etc/jupyter/jupyter_server_config.d/
  kernel_gateway_stream.json``), it replaces the kernel channels WebSocket with the
  gateway's and adds the transcript API; JupyterLab users change nothing.
* Launched on its own (``kernel-gateway-stream`` or ``python -m kernel_gateway_stream``),
  it is the headless service: bound to 127.0.0.1, token auth on, no browser, and only the
  kernel APIs (:attr:`StreamServerApp.services`): no contents, files, terminals or
  notebook UI unless an operator turns them on.
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.serverapp import ServerApp
from traitlets import Bool, Float, Int, List, Type, Unicode

from .broker.base import Broker
from .broker.memory import MemoryBroker
from .executions import ExecutionManager
from .handlers.channels import ChannelsHandler, StreamChannelsConnection, close_subscribers
from .handlers.common import SETTINGS_KEY, Services
from .handlers.execute import (
    ExecuteHandler,
    ExecutionEventsHandler,
    ExecutionHandler,
    ExecutionInputHandler,
    ExecutionInterruptHandler,
)
from .handlers.stream import StreamHandler
from .handlers.transcript import TranscriptHandler
from .kernels import StreamKernelManager
from .stores.base import TranscriptStore
from .stores.sqlite import SQLiteTranscriptStore
from .tap import KERNEL_ACTIONS_SCHEMA, TapManager

__all__ = ["GatewayStreamApp", "StreamServerApp", "main"]

DEFAULT_KM = "jupyter_server.services.kernels.kernelmanager.ServerKernelManager"

# Any id, so that an id of the wrong shape still gets a JSON 404 from us.
_KERNEL_ID = r"(?P<kernel_id>[^/]+)"
_MSG_ID = r"(?P<msg_id>[^/]+)"


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


class GatewayStreamApp(ExtensionApp):
    """kernel_gateway_stream's extension (and, launched on its own, its daemon)."""

    name = "kernel_gateway_stream"
    description = StreamServerApp.description
    extension_url = "/api/kernels"
    load_other_extensions = False
    serverapp_class = StreamServerApp
    # A headless service, like Kernel Gateway: loopback only unless told otherwise, never a
    # browser. jupyter_server's refusal to run as root guards its notebook UI, which the
    # daemon does not serve; run it as a dedicated user in production (etc/ has a unit).
    serverapp_config = {"ip": "127.0.0.1", "open_browser": False, "allow_root": True}

    classes = [*ExtensionApp.classes, TapManager, SQLiteTranscriptStore, MemoryBroker]

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
    sse_heartbeat_interval = Float(
        15.0,
        config=True,
        help="Seconds between the keep-alive comment lines of an idle SSE stream, so that "
        "proxies do not close it.",
    )
    subscriber_merge_max_bytes = Int(
        1024 * 1024,
        config=True,
        help="Largest stream message made by merging the backlog of a client that fell behind.",
    )

    def initialize_settings(self) -> None:
        serverapp = self.serverapp
        assert serverapp is not None
        assert serverapp.event_logger is not None
        if serverapp.gateway_config.gateway_enabled:
            self.log.warning(
                "kernel_gateway_stream taps kernels over ZMQ; with GatewayClient enabled the "
                "kernels are remote and are not tapped. Transcripts will stay empty."
            )
        # The Type traits hold concrete subclasses of these ABCs.
        self.store: TranscriptStore = self.transcript_store_class(parent=self, log=self.log)
        self.store.open()
        self.broker: Broker = self.broker_class(parent=self, log=self.log)
        self.taps = TapManager(
            serverapp.kernel_manager, self.store, self.broker, parent=self, log=self.log
        )
        self.taps.on_close(close_subscribers)
        self.settings[SETTINGS_KEY] = Services(
            store=self.store,
            broker=self.broker,
            taps=self.taps,
            subscriber_options={
                "max_bytes": self.subscriber_max_bytes,
                "max_lag": self.subscriber_max_lag,
                "merge_max_bytes": self.subscriber_merge_max_bytes,
            },
            sse_heartbeat=self.sse_heartbeat_interval,
        )
        self.executions = ExecutionManager(self.taps, self.store, parent=self, log=self.log)
        self.settings["kernel_gateway_stream_executions"] = self.executions
        self.settings["kernel_websocket_connection_class"] = StreamChannelsConnection
        kernel_manager = serverapp.kernel_manager
        if self.lossless_kernel_iopub and kernel_manager.kernel_manager_class == DEFAULT_KM:
            kernel_manager.kernel_manager_class = (
                f"{StreamKernelManager.__module__}.StreamKernelManager"
            )
        serverapp.event_logger.add_listener(
            schema_id=KERNEL_ACTIONS_SCHEMA, listener=self.taps.on_kernel_action
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(
            [
                (rf"/api/kernels/{_KERNEL_ID}/channels", ChannelsHandler),
                (rf"/api/kernels/{_KERNEL_ID}/transcript", TranscriptHandler),
                (rf"/api/kernels/{_KERNEL_ID}/stream", StreamHandler),
                (rf"/api/kernels/{_KERNEL_ID}/execute", ExecuteHandler),
                (rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}", ExecutionHandler),
                (rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}/events", ExecutionEventsHandler),
                (rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}/input", ExecutionInputHandler),
                (
                    rf"/api/kernels/{_KERNEL_ID}/executions/{_MSG_ID}/interrupt",
                    ExecutionInterruptHandler,
                ),
            ]
        )

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        self.taps.start()
        await self.taps.reconcile()

    async def stop_extension(self) -> None:
        # jupyter_server stops extensions before it shuts kernels down; record the end now.
        now = time.time()
        for kernel_id in list(self.taps.taps):
            self.store.kernel_ended(kernel_id, now)
        self.executions.close()
        self.taps.close()
        await self.store.flush()
        self.store.close()


def main() -> None:
    """The ``kernel-gateway-stream`` command."""
    GatewayStreamApp.launch_instance()
