"""Service files in etc/ (operators issue, item 4): the systemd unit works as written on
Debian (systemd-analyze verify, against a root that has what its install steps put in
place), and the sample configuration names only options that exist."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_server.serverapp import ServerApp
from traitlets.config.loader import PyFileConfigLoader

from kernel_gateway_stream.app import GatewayStreamApp

ETC = Path(__file__).resolve().parent.parent / "etc"
UNIT = ETC / "kernel-gateway-stream.service"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


#: Where ExecStart runs the daemon from.
UNIT_COMMAND = unit_settings()["ExecStart"][0].split()[0]


def test_the_unit_hardens_the_service_as_operators_expect() -> None:
    settings = unit_settings()
    assert settings["User"] == ["kgs"]
    assert settings["UMask"] == ["0077"]
    assert settings["StateDirectory"] == ["kernel-gateway-stream"]
    assert settings["StateDirectoryMode"] == ["0700"]
    assert settings["ProtectSystem"] == ["strict"]
    assert settings["NoNewPrivileges"] == ["true"]
    assert settings["PrivateTmp"] == ["true"]
    # Kernels outlive the daemon: systemd must not kill them when it dies.
    assert settings["KillMode"] == ["process"]
    executable = settings["ExecStart"][0].split()[0]
    assert executable.startswith("/"), "ExecStart by absolute path, not through PATH"
    # The install steps in the unit's header put the command exactly there.
    venv = executable.rsplit("/bin/", 1)[0]
    header = UNIT.read_text()
    assert f"python3 -m venv {venv}" in header
    assert f"{venv}/bin/pip install ." in header


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None or not SYSTEM_UNITS.is_dir():
        if os.environ.get("CI"):
            pytest.fail("CI has systemd-analyze (Debian's systemd package)")
        pytest.skip("systemd-analyze is not installed")
    # A root with what the install steps leave: the command where ExecStart runs it,
    # kill for ExecReload, the unit in /etc/systemd/system, and the system's own units.
    root = tmp_path / "root"
    command = root / UNIT_COMMAND.lstrip("/")
    command.parent.mkdir(parents=True)
    shutil.copy(shutil.which("kernel-gateway-stream") or sys.executable, command)
    (root / "bin").mkdir()
    shutil.copy("/bin/kill", root / "bin" / "kill")
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    shutil.copy(UNIT, units / UNIT.name)
    result = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", UNIT.name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == "", "systemd-analyze has something to say"


@pytest.mark.parametrize(
    "sample", ["kernel_gateway_stream_config.py", "kernel_gateway_stream_cluster_config.py"]
)
def test_the_sample_configuration_names_only_real_options(sample: str) -> None:
    config = PyFileConfigLoader(sample, path=str(ETC)).load_config()
    classes = {cls.__name__: cls for cls in GatewayStreamApp().classes}
    classes["ServerApp"] = ServerApp
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager

    classes["MappingKernelManager"] = MappingKernelManager
    assert config, "the sample sets options"
    for section, values in config.items():
        assert section in classes, f"unknown class in the sample: {section}"
        traits = classes[section].class_traits(config=True)
        for name in values:
            assert name in traits, f"{section}.{name} is not an option"
