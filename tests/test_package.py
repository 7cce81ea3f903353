"""The package as users install it: static checks, the extension's enable file, exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    result = run(
        sys.executable, "-m", "ruff", "check", "kernel_gateway_stream", "tests", "benchmarks"
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # a whole-package type check: CI's run, not the edit loop
def test_mypy_is_clean() -> None:
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_extension_is_enabled_after_install() -> None:
    """``pip install`` puts the enable file where ``jupyter server`` finds it."""
    result = run(sys.executable, "-m", "jupyter", "server", "extension", "list")
    output = result.stdout + result.stderr
    line = next(
        (x for x in output.splitlines() if x.strip().startswith("kernel_gateway_stream")), ""
    )
    assert "enabled" in line, output


def test_enable_file_content() -> None:
    path = ROOT / "jupyter_config" / "jupyter_server_config.d" / "kernel_gateway_stream.json"
    config = json.loads(path.read_text())
    assert config["ServerApp"]["jpserver_extensions"]["kernel_gateway_stream"] is True


def test_daemon_help_lists_every_configurable() -> None:
    """Every trait an operator can set shows up in ``--help-all``."""
    result = run(sys.executable, "-m", "kernel_gateway_stream", "--help-all")
    assert result.returncode == 0, result.stderr
    for trait in (
        "GatewayStreamApp.subscriber_max_bytes",
        "SQLiteTranscriptStore.path",
        "SQLiteTranscriptStore.max_bytes_per_kernel",
        "MemoryBroker.coalesce_window",
        "RecorderRegistry.iopub_receive_buffer",
    ):
        assert trait in result.stdout
