"""The intake rule (kernel_gateway_stream.core.intake): what a kernel may put into a
transcript, whatever kind of kernel it is."""

from __future__ import annotations

import pytest

from kernel_gateway_stream.core.intake import Accept, Refuse, check
from kernel_gateway_stream.core.messages import KernelMessage


def message(msg_type: str, content: dict[str, object] | None = None) -> KernelMessage:
    return KernelMessage.synthesize(
        msg_type, content or {}, msg_id="m", date="2026-01-01T00:00:00Z", session="s"
    )


@pytest.mark.parametrize(
    "msg_type",
    [
        "kernel_gateway_stream_gap",
        "kernel_gateway_stream_lifecycle",
        "kernel_gateway_stream_request",
        "kernel_gateway_stream_spool",
        "kernel_gateway_stream_anything",
    ],
)
def test_the_gateways_records_are_refused(msg_type: str) -> None:
    assert isinstance(check(message(msg_type)), Refuse)


@pytest.mark.parametrize("state", ["dead", "restarting"])
def test_a_kernels_end_is_the_gateways_to_say(state: str) -> None:
    verdict = check(message("status", {"execution_state": state}))
    assert isinstance(verdict, Refuse)
    assert state in verdict.reason


@pytest.mark.parametrize("state", ["busy", "idle", "starting"])
def test_a_kernels_own_statuses_and_output_pass(state: str) -> None:
    assert check(message("status", {"execution_state": state})) == Accept()
    assert check(message("stream", {"name": "stdout", "text": "x"})) == Accept()


def test_only_the_launchers_spool_notice_passes_and_only_where_allowed() -> None:
    spool = message("kernel_gateway_stream_spool", {"held": 1, "dropped": 0})
    assert check(spool, allow_spool=True) == Accept()
    assert isinstance(check(spool), Refuse)
    assert isinstance(check(message("kernel_gateway_stream_gap"), allow_spool=True), Refuse)
