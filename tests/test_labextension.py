"""The JupyterLab extension (``labextension/``): its own unit tests, run by node's test
runner from here so that CI's one ``python -m pytest`` runs them, and its install.

``pip install -e .`` runs ``npm install`` in ``labextension/`` and builds the prebuilt
extension (pyproject.toml's jupyter-builder hook). Outside CI these tests skip when npm,
the npm packages or JupyterLab are missing; in CI they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .timing import seconds

ROOT = Path(__file__).resolve().parent.parent
LABEXTENSION = ROOT / "labextension"
NAME = "kernel-gateway-stream"


def missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs with `pip install -e .[test]`)")
    pytest.skip(reason)


@pytest.mark.slow  # node's test runner over the TypeScript: CI's run, not the edit loop
def test_the_lab_extension_unit_tests_pass() -> None:
    npm = shutil.which("npm")
    if npm is None:
        missing("npm is not installed")
    assert npm is not None
    if not (LABEXTENSION / "node_modules").is_dir():
        missing("labextension/node_modules is missing: `pip install -e .` runs npm install")
    result = subprocess.run(
        [npm, "test"],
        cwd=LABEXTENSION,
        capture_output=True,
        text=True,
        timeout=seconds(300),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-30000:]
    counts = dict(re.findall(r"^# (tests|pass|fail) (\d+)$", output, re.MULTILINE))
    assert counts.get("fail") == "0", output[-30000:]
    assert int(counts.get("pass", "0")) > 0, output[-30000:]
    print(f"labextension unit tests: {counts['pass']} passed")


def test_jupyterlab_lists_the_extension_enabled() -> None:
    """``pip install`` puts the prebuilt extension where JupyterLab finds it."""
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        missing("JupyterLab is not installed (it is in the test extra)")
    result = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    output = result.stdout + result.stderr
    line = next((x for x in output.splitlines() if x.strip().startswith(NAME)), "")
    assert "enabled" in line, output
    assert "OK" in line, output
