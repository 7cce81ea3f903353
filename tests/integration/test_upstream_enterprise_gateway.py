"""The gateway in front of a real Enterprise Gateway 3.3 on its defaults (listing off,
``root`` refused), in a virtualenv of its own (see :mod:`.enterprise_gateway`).

The upstream's log is read from outside: its access log has one ``101 GET
/api/kernels/<id>/channels`` per WebSocket it serves, one ``GET /api/kernels`` line per
list it was asked for."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from kernel_gateway_stream.client import GatewayClient

from .daemon import TOKEN, Daemon
from .enterprise_gateway import EnterpriseGateway, ensure_venv
from .test_upstream import FLOOD, gateway_options, numbers
from .test_upstream_channels import all_records, lost_messages, reply_to, runs
from .waits import wait_until


@pytest.fixture(scope="session")
def enterprise_gateway_venv() -> Path:
    try:
        return ensure_venv()
    except RuntimeError as error:
        pytest.fail(str(error))


@pytest.fixture
def enterprise_gateway(
    enterprise_gateway_venv: Path, tmp_path: Path
) -> Iterator[EnterpriseGateway]:
    gateway = EnterpriseGateway(enterprise_gateway_venv, tmp_path / "eg", TOKEN)
    gateway.start()
    yield gateway
    gateway.stop()


def channels_connections(gateway: EnterpriseGateway, kernel_id: str) -> int:
    return gateway.log_text().count(f"101 GET /api/kernels/{kernel_id}/channels")


def list_requests(gateway: EnterpriseGateway) -> int:
    # Tornado's access log line: "403 GET /api/kernels (127.0.0.1) 1.02ms".
    return len(re.findall(r"\d{3} GET /api/kernels \([^)]*\) [0-9.]+ms", gateway.log_text()))


async def test_root_refused_with_the_upstreams_reason_then_listing_off_served_from_our_own(
    enterprise_gateway: EnterpriseGateway, daemon: Daemon, tmp_path: Path
) -> None:
    await enterprise_gateway.wait_ready()
    # As root with no KERNEL_USERNAME: Enterprise Gateway refuses the kernel.
    daemon.start(*gateway_options(enterprise_gateway.url), env={"KERNEL_USERNAME": "root"})
    await daemon.wait_ready()
    with pytest.raises(HTTPClientError) as refused:
        await daemon.fetch("/api/kernels", method="POST", body='{"name": "python3"}')
    assert refused.value.code == 403
    assert refused.value.response is not None
    message = refused.value.response.body.decode()
    assert "The upstream gateway answered 403" in message, message
    assert "not authorized" in message, message
    assert "KERNEL_USERNAME" in message, message
    assert "%s" not in message
    daemon.stop()
    daemon.start(*gateway_options(enterprise_gateway.url), env={"KERNEL_USERNAME": "kgs-test"})
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
        asked = list_requests(enterprise_gateway)
        for _ in range(3):
            # Listing is off upstream: the kernel we started is listed from our knowledge.
            assert [k["id"] for k in await client.list_kernels()] == [kernel_id]
        # The refused list is not asked for again at every poll.
        assert list_requests(enterprise_gateway) == asked <= 2
        result = await client.execute(kernel_id, "print(6 * 7)")
        assert result.stdout == "42\n"
        await client.shutdown(kernel_id)
        assert await client.list_kernels() == []


async def test_three_watchers_one_upstream_connection_every_line_or_a_gap(
    enterprise_gateway: EnterpriseGateway, daemon: Daemon
) -> None:
    await enterprise_gateway.wait_ready()
    daemon.start(*gateway_options(enterprise_gateway.url), env={"KERNEL_USERNAME": "kgs-test"})
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
    await wait_until(
        lambda: channels_connections(enterprise_gateway, kernel_id) == 1, "the Tap's WebSocket"
    )
    watchers = [await daemon.channels(kernel_id) for _ in range(3)]
    try:
        for ws in watchers:  # each with channels of its own on our side
            await reply_to(ws, ws.send("shell", "kernel_info_request", {}), "kernel_info_reply")
        msg_id = watchers[0].execute(FLOOD)
        texts = [(await ws.until_idle(msg_id, timeout=240)).text() for ws in watchers]
        async with GatewayClient(daemon.url, TOKEN) as client:
            records = await all_records(client, kernel_id)
            summary = await daemon.fetch(f"/api/kernels/{kernel_id}/executions/{msg_id}")
            await client.shutdown(kernel_id)
    finally:
        for ws in watchers:
            ws.close()
    recorded = numbers(records, msg_id)
    assert recorded == sorted(set(recorded))
    # Every watcher got every line the gateway's one connection received.
    for text in texts:
        assert [int(line) for line in text.split("\n") if line] == recorded
    # What is missing is inside upstream_lost gap records, recorded before the execution's
    # idle (each watcher read up to it), so its summary lists them.
    missing = sorted(set(range(20000)) - set(recorded))
    if missing:
        assert lost_messages(records) >= runs(missing), len(missing)
        assert summary["gaps"], "the execution's summary lists the gaps"
    assert channels_connections(enterprise_gateway, kernel_id) == 1


async def test_input_and_interrupt_through_enterprise_gateway(
    enterprise_gateway: EnterpriseGateway, daemon: Daemon
) -> None:
    """``input()`` answered by the watcher that ran it while another watches, and an
    interrupt through the gateway, over the one upstream WebSocket."""
    await enterprise_gateway.wait_ready()
    daemon.start(*gateway_options(enterprise_gateway.url), env={"KERNEL_USERNAME": "kgs-test"})
    await daemon.wait_ready()
    async with GatewayClient(daemon.url, TOKEN) as client:
        kernel_id = await client.start_kernel()
    asker, watcher = await daemon.channels(kernel_id), await daemon.channels(kernel_id)
    try:
        await reply_to(
            watcher, watcher.send("shell", "kernel_info_request", {}), "kernel_info_reply"
        )
        msg_id = asker.execute("print('got', input('name? '))", allow_stdin=True)
        request = await reply_to(asker, msg_id, "input_request")
        assert request["content"]["prompt"] == "name? "
        asker.send("stdin", "input_reply", {"value": "ada"})
        for ws in (asker, watcher):
            assert (await ws.until_idle(msg_id)).text() == "got ada\n"
        assert not [m for m in watcher.history if m["channel"] == "stdin"]
        sleeping = watcher.execute("import time; time.sleep(600)")
        await reply_to(watcher, sleeping, "execute_input")
        async with GatewayClient(daemon.url, TOKEN) as client:
            await client.interrupt(kernel_id)
            reply = await reply_to(watcher, sleeping, "execute_reply")
            assert reply["content"]["ename"] == "KeyboardInterrupt"
            await client.shutdown(kernel_id)
    finally:
        asker.close()
        watcher.close()
    assert channels_connections(enterprise_gateway, kernel_id) == 1
