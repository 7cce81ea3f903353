"""Configuration sections under a class's former name still configure it: an operator's
file written for an earlier layout keeps working (``TapManager`` is now
:class:`~kernel_gateway_stream.recording.registry.RecorderRegistry`)."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from kernel_gateway_stream.handlers.common import Services
from kernel_gateway_stream.recording.registry import RecorderRegistry


@pytest.fixture
def jp_server_config(jp_server_config: Config) -> Config:
    jp_server_config.TapManager.max_message_bytes = 123_456
    jp_server_config.TapManager.iopub_batch = 7
    jp_server_config.RecorderRegistry.iopub_batch = 9
    return jp_server_config


def test_a_former_section_name_configures_the_new_class(services: Services) -> None:
    registry = services.taps
    assert isinstance(registry, RecorderRegistry)
    assert registry.max_message_bytes == 123_456
    assert registry.context.policy.max_message_bytes == 123_456


def test_the_new_section_name_wins_over_the_former_one(services: Services) -> None:
    assert services.taps.iopub_batch == 9


def test_the_former_import_names_are_the_new_classes() -> None:
    from kernel_gateway_stream import tap
    from kernel_gateway_stream.recording.recorder import KernelRecorder

    assert tap.TapManager is RecorderRegistry
    assert tap.KernelTap is KernelRecorder
