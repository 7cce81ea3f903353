"""The configuration reference (operators issue, item 5) is made from the traits: every
option has its help, and the committed page is what the code makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kernel_gateway_stream.reference import configurable_classes, reference

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_every_option_says_what_it_does() -> None:
    missing = [
        f"{cls.__name__}.{name}"
        for cls in configurable_classes()
        for name, trait in cls.class_own_traits(config=True).items()
        if not (trait.help or "").strip()
    ]
    assert not missing, f"options without help=: {missing}"


def test_the_reference_page_is_what_the_code_makes() -> None:
    assert PAGE.read_text() == reference(), (
        "docs/configuration.md is stale: python -m kernel_gateway_stream.reference "
        "> docs/configuration.md"
    )


def test_the_reference_lists_every_class_with_options() -> None:
    names = {cls.__name__ for cls in configurable_classes()}
    assert {
        "GatewayStreamApp",
        "StreamServerApp",
        "SQLiteTranscriptStore",
        "MemoryBroker",
        "RecorderRegistry",
        "ExecutionManager",
    } <= names
    page = reference()
    for cls in configurable_classes():
        for name in cls.class_own_traits(config=True):
            assert f"`{cls.__name__}.{name}`" in page


def test_help_all_lists_the_daemons_own_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kernel_gateway_stream", "--help-all"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "--StreamServerApp.services" in result.stdout
    assert "--GatewayStreamApp.metrics_port" in result.stdout
    assert "--SQLiteTranscriptStore.max_pending_bytes" in result.stdout
