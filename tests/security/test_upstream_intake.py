"""Code in a kernel behind a stock jupyter_server against the gateway in front of it: the
records only the gateway writes (a kernel's ``dead`` status, gap records) are refused, as
from a kernel the gateway runs itself (kernel_gateway_stream.core.intake), and a seq the
kernel puts in a message's metadata is not taken for an upstream gateway's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_gateway_stream.client import GatewayClient

from ..integration.daemon import TOKEN, Daemon
from ..integration.test_upstream import GAP, Upstream
from ..integration.test_upstream_channels import all_records, in_front

FORGE = """
kernel = get_ipython().kernel
parent = kernel.get_parent()
send = kernel.session.send
send(kernel.iopub_socket, "status", {"execution_state": "dead"}, parent=parent)
send(kernel.iopub_socket, "kernel_gateway_stream_gap",
     {"first_seq": 1, "last_seq": 3, "reason": "forged", "lost": 9}, parent=parent)
send(kernel.iopub_socket, "kernel_gateway_stream_lifecycle",
     {"event": "unreachable", "reason": "forged"}, parent=parent)
send(kernel.iopub_socket, "stream", {"name": "stdout", "text": "high seq\\n"},
     parent=parent, metadata={"kernel_gateway_stream": {"seq": 10**12, "first_seq": 10**12}})
print("after")
"""


@pytest.fixture
def plain_upstream(tmp_path: Path) -> Iterator[Upstream]:
    upstream = Upstream(
        tmp_path / "upstream", "jupyter_server", "--ZMQChannelsWebsocketConnection.limit_rate=False"
    )
    upstream.start()
    yield upstream
    upstream.stop()


async def test_a_kernel_behind_jupyter_server_cannot_forge_the_gateways_records(
    plain_upstream: Upstream, daemon: Daemon
) -> None:
    kernel_id = await in_front(daemon, plain_upstream)
    async with GatewayClient(daemon.url, TOKEN) as client:
        result = await client.execute(kernel_id, FORGE)
        # Not ended by the forged "dead": the kernel's own idle ended it.
        assert result.status == "ok", result
        assert result.stdout == "high seq\nafter\n"
        # Later output is recorded: no forged seq swallowed it as a replay.
        again = await client.execute(kernel_id, "print('still here')")
        assert again.stdout == "still here\n"
        records = await all_records(client, kernel_id)
        model = await daemon.fetch(f"/api/kernels/{kernel_id}")
    assert model["execution_state"] != "dead"
    assert not [r for r in records if r["msg_type"] == GAP], "a forged gap was recorded"
    forged = [r for r in records if "forged" in str(r["content"].get("reason", ""))]
    assert not forged, forged
    statuses = [r["content"]["execution_state"] for r in records if r["msg_type"] == "status"]
    assert "dead" not in statuses
    # Control: the same kernel's ordinary output all arrived, in order.
    text = "".join(r["content"]["text"] for r in records if r["msg_type"] == "stream")
    assert text.endswith("high seq\nafter\nstill here\n")
    health = await daemon.fetch("/api/gateway/health")
    assert health["components"]["taps"]["refused_invalid"] >= 3, health
