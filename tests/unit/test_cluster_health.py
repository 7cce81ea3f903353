"""cluster/node.py ``ClusterNode.health``: a pass over the kernel directory that hangs on
Redis turns health degraded within ``stall_after``, counted from the last pass that ended
well, however late a busy node's loop began the next one."""

from __future__ import annotations

import time
from typing import Any

from kernel_gateway_stream.cluster.node import ClusterNode
from kernel_gateway_stream.core.health import State
from kernel_gateway_stream.stores.redis import RedisTranscriptStore


class Taps:
    def on_close(self, callback: Any) -> None:
        pass


def _node() -> ClusterNode:
    store = RedisTranscriptStore(url="redis://127.0.0.1:1/0")  # never reached here
    return ClusterNode(store, Taps(), None, None, sync_interval=0.3, stall_after=1.0)  # type: ignore[arg-type]


def test_a_pass_waiting_past_stall_after_is_a_stall() -> None:
    node = _node()
    node._pass_started = time.monotonic() - 1.2
    health = node.health()
    assert (health.state, health.reason) == (State.DEGRADED, "directory_stalled")


def test_a_pass_begun_late_still_counts_from_the_last_pass_that_ended() -> None:
    node = _node()
    # The last pass ended 1.5 s ago; the next was due after 0.3 s but the loop was busy,
    # and began just now: Redis has not answered this node for 1.5 s.
    node._pass_ended = time.monotonic() - 1.5
    node._pass_started = time.monotonic()
    health = node.health()
    assert (health.state, health.reason) == (State.DEGRADED, "directory_stalled")
    assert health.details["pass_waiting_seconds"] >= 1.2


def test_passes_on_time_are_ok() -> None:
    node = _node()
    node._pass_ended = time.monotonic() - 1.2  # within sync_interval + stall_after
    node._pass_started = time.monotonic()
    assert node.health().state is State.OK
    node._pass_started = None
    assert node.health().state is State.OK
