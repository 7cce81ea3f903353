"""The jupyter_server activity bridge asks jupyter_server's kernel manager which message
types count as activity once per type, not once per message, and follows the manager's
``untracked_message_types`` when they change; what it remembers is bounded (a kernel
names its own msg_types)."""

from __future__ import annotations

from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

from kernel_gateway_stream.recording.activity import TRACKED_CACHE, ActivityBridge


def test_tracking_is_the_kernel_managers_and_follows_its_changes() -> None:
    manager = MappingKernelManager()
    bridge = ActivityBridge(manager)
    for msg_type in ("execute_request", "comm_info_request", "status", None):
        assert bridge.tracked(msg_type) is manager.track_message_type(msg_type)
    assert bridge.tracked("execute_request")
    assert not bridge.tracked("comm_info_request")
    manager.untracked_message_types = ["execute_request"]
    assert not bridge.tracked("execute_request")
    assert bridge.tracked("comm_info_request")


def test_what_it_remembers_is_bounded() -> None:
    bridge = ActivityBridge(MappingKernelManager())
    for index in range(3 * TRACKED_CACHE):
        assert bridge.tracked(f"made_up_{index}")
    assert len(bridge._tracked) <= TRACKED_CACHE
