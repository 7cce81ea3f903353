"""Metrics at /metrics (operators issue, item 1): the gateway's own, beside jupyter_server's,
counted from real kernels, clients and bad input."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from kernel_gateway_stream.metrics import PREFIX

from ..timing import seconds
from .daemon import Daemon
from .waits import wait_until
from .wsclient import KernelWS


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of an exposition."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((PREFIX + name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_count_messages_clients_writes_and_refusals(
    jp_fetch: Any, start_kernel: Any, connect: Any, services: Any
) -> None:
    async def scrape() -> dict[Any, float]:
        response = await jp_fetch("metrics")
        return parse(response.body.decode())

    kernel_id = await start_kernel()
    ws: KernelWS = await connect(kernel_id, protocol="v1")
    lines = 3000
    received = await ws.until_idle(ws.execute(f"for i in range({lines}): print(i, flush=True)"))
    assert len(received.text().splitlines()) == lines
    await services.store.flush(seconds(10))
    # A wrong method, and a frame that is not a message.
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("api", "kernels", kernel_id, "execute", method="GET")
    assert refused.value.code == 405
    bad: KernelWS = await connect(kernel_id)
    bad.ws.write_message("not json")
    await bad.drain_until_closed()
    # What the kernel published since the flush above is written too, and the pending
    # count goes back to 0. Waited for, not read once: the kernel may publish between a
    # flush and the scrape (fresh clones under load read 2 records, then 1, there).

    async def drained() -> bool:
        await services.store.flush(seconds(10))
        return value(await scrape(), "transcript_pending_records") == 0

    await wait_until(drained, "the pending records' gauge back at 0")

    samples = await scrape()
    assert value(samples, "iopub_messages_total", msg_type="stream") >= lines
    assert value(samples, "iopub_bytes_total", msg_type="stream") > lines * 10
    assert value(samples, "iopub_messages_total", msg_type="status") >= 2
    assert value(samples, "kernels_tapped") == 1
    assert value(samples, "subscribers", surface="channels_v1") == 1
    assert value(samples, "subscribers", surface="sse") == 0
    # Bursts were merged: fewer frames than records.
    assert value(samples, "records_published_total") >= lines
    assert value(samples, "frames_published_total") < value(samples, "records_published_total")
    assert value(samples, "coalescing_ratio") > 1
    assert value(samples, "transcript_write_batches_total") >= 1
    assert value(samples, "transcript_write_seconds_count") >= 1
    assert value(samples, "transcript_write_seconds_bucket", le="+Inf") == value(
        samples, "transcript_write_seconds_count"
    )
    assert value(samples, "transcript_disk_bytes") > 0
    assert value(samples, "refused_input_total", reason="method_not_allowed") == 1
    assert value(samples, "refused_input_total", reason="malformed_message") == 1
    assert value(samples, "subscriber_endings_total", reason="malformed_message") == 1
    # jupyter_server's own are there too, in the same registry.
    assert any(name == "kernel_currently_running_total" for name, _ in samples)

    # A client that resumes from the past is a replay, and its records are counted.
    again: KernelWS = await connect(kernel_id, since=0)
    await again.until_lines(lines)
    samples = await scrape()
    assert value(samples, "replays_total") == 1
    assert value(samples, "records_replayed_total") >= lines
    assert value(samples, "subscribers", surface="channels_legacy") == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_metrics_on_a_port_of_their_own_need_no_token(daemon: Daemon) -> None:
    """jupyter_server#1316: Prometheus without a token, on a separate listener; the main
    port's /metrics still needs one."""
    port = free_port()
    daemon.start(f"--GatewayStreamApp.metrics_port={port}")
    await daemon.wait_ready()
    client = AsyncHTTPClient()
    response = await client.fetch(f"http://127.0.0.1:{port}/metrics")
    samples = parse(response.body.decode())
    assert (PREFIX + "kernels_tapped", ()) in samples
    refused = await client.fetch(f"{daemon.url}/metrics", raise_error=False)
    assert refused.code == 403
    allowed = await client.fetch(f"{daemon.url}/metrics", headers=daemon.headers)
    assert allowed.code == 200
    # Nothing but /metrics there.
    other = await client.fetch(f"http://127.0.0.1:{port}/api/kernels", raise_error=False)
    assert other.code == 404


async def test_a_metrics_port_in_use_stops_the_start_with_one_line(daemon: Daemon) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon.start(f"--GatewayStreamApp.metrics_port={port}")
        assert daemon.process is not None
        code = await asyncio.get_running_loop().run_in_executor(
            None, lambda: daemon.process.wait(seconds(60)) if daemon.process else None
        )
    assert code != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in daemon.log_text()
    assert "Traceback" not in daemon.log_text()
