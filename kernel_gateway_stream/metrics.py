"""Prometheus metrics, named ``kernel_gateway_stream_*``, in jupyter_server's registry.

jupyter_server serves ``/metrics`` from ``prometheus_client.REGISTRY``
(``ServerApp.authenticate_prometheus`` says whether it needs a token); the gateway adds
one collector to that registry. The collector reads, at scrape time, the plain counters
the components keep anyway (the Tap, the broker, the subscribers, the store's writer):
the hot path pays an integer addition per message, never a metric library's locks and
label lookups.

One collector serves the process: each :class:`~.app.GatewayStreamApp` registers its
services when it starts and withdraws them when it stops (tests start many servers in
one process; a second registration of the same names would be refused).

For operators who want metrics without a token on the main port (jupyter_server#1316),
:class:`MetricsServer` serves ``/metrics`` alone on a port of its own
(``GatewayStreamApp.metrics_port``), for a scraper on a trusted network.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from tornado import httpserver, netutil, web

if TYPE_CHECKING:
    from .handlers.common import Services

__all__ = ["PREFIX", "GatewayCollector", "MetricsServer", "collector"]

PREFIX = "kernel_gateway_stream_"


class GatewayCollector(Collector):
    """The gateway's metrics, collected from every registered :class:`Services`."""

    def __init__(self) -> None:
        self._services: list[Services] = []
        self._lock = threading.Lock()

    def add(self, services: Services) -> None:
        with self._lock:
            self._services.append(services)

    def remove(self, services: Services) -> None:
        with self._lock:
            if services in self._services:
                self._services.remove(services)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            everything = list(self._services)
        families = _Families()
        for services in everything:
            families.add(services)
        yield from families.all()


#: The families whose samples are sums over the registered services.
_Family = CounterMetricFamily | GaugeMetricFamily


class _Families:
    """The metric families of one scrape, summed over the registered services."""

    def __init__(self) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(PREFIX + name, doc, labels=labels)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(PREFIX + name, doc, labels=labels)

        self.iopub_messages = counter(
            "iopub_messages", "IOPub messages recorded, by msg_type.", ("msg_type",)
        )
        self.iopub_bytes = counter(
            "iopub_bytes", "Bytes of IOPub messages recorded, by msg_type.", ("msg_type",)
        )
        self.iopub_refused = counter(
            "iopub_refused",
            "IOPub messages refused, by reason: a bad signature or framing (invalid), or a "
            "verbatim replay of a signed message (replay).",
            ("reason",),
        )
        self.kernels = gauge("kernels_tapped", "Kernels whose IOPub the gateway records.")
        self.records = counter("records_published", "Records handed to the live fan-out.")
        self.frames = counter(
            "frames_published", "Frames sent to subscribers after coalescing bursts."
        )
        self.coalescing = gauge(
            "coalescing_ratio", "Records per frame since the start (1 is no coalescing)."
        )
        self.subscribers = gauge(
            "subscribers",
            "Clients following a kernel's output, by surface.",
            ("surface",),
        )
        self.lag_messages = gauge(
            "subscriber_lag_messages_max",
            "The largest number of sequence numbers a live subscriber is behind its kernel.",
        )
        self.lag_seconds = gauge(
            "subscriber_lag_seconds_max",
            "The longest a frame has waited in a subscriber's queue, in seconds.",
        )
        self.endings = counter(
            "subscriber_endings",
            "Client streams the gateway ended, by reason (slow_consumer, kernel_shutdown, "
            "gateway_shutdown, malformed_message, server_error).",
            ("reason",),
        )
        self.replays = counter("replays", "Subscriptions that asked for the past (since=).")
        self.replayed = counter("records_replayed", "Records read from transcripts for replays.")
        self.batches = counter("transcript_write_batches", "Transactions the writer committed.")
        self.failures = counter(
            "transcript_write_failures", "Transcript writes the database refused."
        )
        self.pending = gauge("transcript_pending_records", "Records appended but not yet durable.")
        self.pending_bytes = gauge(
            "transcript_pending_bytes", "Bytes of records appended but not yet durable."
        )
        self.disk = gauge("transcript_disk_bytes", "Bytes the transcript database takes on disk.")
        self.gaps = counter(
            "gap_records", "Gap records written: ranges the transcript could not keep."
        )
        self.deaths = counter(
            "kernel_deaths",
            "Kernels that died by themselves, by reason (cpu_limit: a sandbox kernel past its "
            "CPU time; kernel_died: any other).",
            ("reason",),
        )
        self.dropped = counter(
            "transcript_dropped_records",
            "Records the transcript could not keep (past the backlog bound), under gap records.",
        )
        self.refused = counter(
            "refused_input",
            "Client requests and frames refused as bad input, by reason.",
            ("reason",),
        )
        self.sessions_away = gauge(
            "sessions_away", "Client sessions held for their return after a disconnect."
        )
        self.latency: HistogramMetricFamily | None = None
        self._latency: tuple[list[float], float] | None = None
        self._sums: dict[int, dict[tuple[str, ...], float]] = {}
        self._order: list[tuple[_Family, dict[tuple[str, ...], float]]] = []

    def _add(self, family: _Family, value: float, *labels: str) -> None:
        values = self._sums.get(id(family))
        if values is None:
            values = self._sums[id(family)] = {}
            self._order.append((family, values))
        values[labels] = values.get(labels, 0.0) + value

    def add(self, services: Services) -> None:
        taps = services.taps
        for msg_type, (count, size) in taps.by_type.items():
            self._add(self.iopub_messages, count, msg_type)
            self._add(self.iopub_bytes, size, msg_type)
        tapped = list(taps.taps.values())
        self._add(self.iopub_refused, sum(t.rejected for t in tapped), "invalid")
        self._add(self.iopub_refused, sum(t.replays for t in tapped), "replay")
        self._add(self.kernels, len(tapped))
        for reason in ("kernel_died", "cpu_limit"):
            self._add(self.deaths, 0, reason)
        for reason, count in taps.deaths.items():
            self._add(self.deaths, count, reason)

        broker = services.broker.health().details
        self._add(self.records, broker.get("records_published", 0))
        self._add(self.frames, broker.get("frames_sent", 0))

        registry = services.subscribers
        lag_messages = lag_seconds = 0.0
        now = _loop_time()
        for surface in ("channels_legacy", "channels_v1", "sse", "execute"):
            self._add(self.subscribers, 0, surface)
        for subscriber in registry:
            surface = getattr(subscriber.transport, "surface", "other")
            self._add(self.subscribers, 1, surface)
            behind = services.broker.head(subscriber.kernel_id) - subscriber.last_seq
            lag_messages = max(lag_messages, behind)
            since = subscriber.queue.queued_since
            if since is not None and now is not None:
                lag_seconds = max(lag_seconds, now - since)
        self._add(self.lag_messages, lag_messages)
        self._add(self.lag_seconds, lag_seconds)
        for reason, count in registry.endings.items():
            self._add(self.endings, count, reason)
        self._add(self.replays, registry.replays)
        self._add(self.replayed, registry.records_replayed)

        store = services.store.health().details
        self._add(self.batches, store.get("write_batches", 0))
        self._add(self.failures, store.get("write_failures", 0))
        self._add(self.pending, store.get("pending_records", 0))
        self._add(self.pending_bytes, store.get("pending_bytes", 0))
        self._add(self.disk, store.get("bytes_on_disk", 0))
        self._add(self.gaps, store.get("gap_records", 0))
        self._add(self.dropped, store.get("dropped_records", 0))
        writer = getattr(getattr(services.store, "writer", None), "state", None)
        if writer is not None:
            self._add_latency(writer)

        for reason, count in services.refused.items():
            self._add(self.refused, count, reason)
        self._add(self.sessions_away, services.sessions.stats()["sessions_away"])

    def _add_latency(self, writer: Any) -> None:
        from .stores.sqlite_writer import BATCH_BUCKETS

        counts = list(writer.batch_seconds_counts)
        if self._latency is None:
            self._latency = ([float(c) for c in counts], float(writer.batch_seconds_sum))
        else:
            totals, total = self._latency
            self._latency = (
                [a + b for a, b in zip(totals, counts, strict=True)],
                total + writer.batch_seconds_sum,
            )
        self.latency = HistogramMetricFamily(
            PREFIX + "transcript_write_seconds",
            "Seconds each transcript transaction took.",
        )
        totals, total = self._latency
        cumulative, running = [], 0.0
        for bound, count in zip(BATCH_BUCKETS, totals, strict=True):
            running += count
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
        self.latency.add_metric([], cumulative, sum_value=total)

    def all(self) -> Iterator[Metric]:
        for family, values in self._order:
            for labels, value in values.items():
                family.add_metric(list(labels), value)
            yield family
        frames = self._sums.get(id(self.frames), {}).get((), 0.0)
        records = self._sums.get(id(self.records), {}).get((), 0.0)
        self.coalescing.add_metric([], records / frames if frames else 1.0)
        yield self.coalescing
        if self.latency is not None:
            yield self.latency


def _loop_time() -> float | None:
    """The event loop's clock (what subscriber queues are stamped with), when a scrape
    runs on the loop; None elsewhere (a scrape from another thread skips time lag)."""
    import asyncio

    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return None


_collector: GatewayCollector | None = None
_collector_lock = threading.Lock()


def collector() -> GatewayCollector:
    """The process's collector, registered with ``prometheus_client.REGISTRY`` once."""
    global _collector
    with _collector_lock:
        if _collector is None:
            _collector = GatewayCollector()
            prometheus_client.REGISTRY.register(_collector)
        return _collector


class _MetricsHandler(web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
        self.write(prometheus_client.generate_latest(prometheus_client.REGISTRY))


class MetricsServer:
    """``/metrics`` alone, unauthenticated, on a port of its own (``metrics_port``)."""

    def __init__(self, ip: str, port: int) -> None:
        self.ip = ip
        self.port = port
        self._sockets: list[socket.socket] = []
        self._server: httpserver.HTTPServer | None = None

    def bind(self) -> None:
        """Take the port, at start-up before the loop runs; raises OSError if it is taken
        (the start then stops with one line)."""
        self._sockets = netutil.bind_sockets(self.port, self.ip)

    def start(self) -> None:
        """Serve on the bound port; called once the loop runs."""
        app = web.Application([(r"/metrics", _MetricsHandler)])
        self._server = httpserver.HTTPServer(app)
        self._server.add_sockets(self._sockets)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        for sock in self._sockets:
            sock.close()
        self._sockets = []
