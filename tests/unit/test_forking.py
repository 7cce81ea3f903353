"""The forkserver's frames, and which kernel starts may fork (pure)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernel_gateway_stream.core.forking import (
    LAUNCHER_MODULE,
    MAX_FRAME,
    decode_status,
    encode_frame,
    encode_status,
    take_frame,
)
from kernel_gateway_stream.kernels.forkserver import code_stamp, fork_key

COMMAND = [sys.executable, "-m", LAUNCHER_MODULE, "-f", "kernel-1.json"]


def test_frames_come_whole_and_in_order() -> None:
    stream = encode_frame({"pid": 1}) + encode_frame({"error": "é"})
    assert take_frame(stream[:3]) is None
    assert take_frame(stream[:10]) is None
    first, rest = take_frame(stream) or (None, b"")
    assert first == {"pid": 1}
    second, rest = take_frame(rest) or (None, b"")
    assert second == {"error": "é"}
    assert rest == b""


def test_an_oversized_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="forkserver frame"):
        take_frame((MAX_FRAME + 1).to_bytes(4, "big") + b"{}")


@pytest.mark.parametrize("returncode", [0, 1, -9, -15, 255])
def test_statuses(returncode: int) -> None:
    assert decode_status(encode_status(returncode)) == returncode
    assert decode_status(encode_status(returncode)[:3]) is None


def test_a_start_forks_only_what_an_exec_would_start_alike() -> None:
    env = {"PATH": "/bin", "PYTHONPATH": "/a", "JUPYTER_DATA_DIR": "/d", "LANG": "C.UTF-8"}
    key = fork_key(COMMAND, env, independent=True)
    assert key is not None
    # Variables read only once the kernel runs do not matter; those read at start do.
    assert fork_key(COMMAND, {**env, "JUPYTER_DATA_DIR": "/e", "X": "1"}, True) == key
    assert fork_key(COMMAND, {**env, "PYTHONPATH": "/b"}, True) != key
    assert fork_key(COMMAND, {**env, "LANG": "de_DE.UTF-8"}, True) != key
    assert fork_key(COMMAND, {**env, "LD_PRELOAD": "x.so"}, True) != key
    # A kernel that must end with the gateway, another interpreter, another module: exec.
    assert fork_key(COMMAND, env, independent=False) is None
    assert fork_key(COMMAND, {**env, "JPY_PARENT_PID": "1"}, True) is None
    assert fork_key(["/usr/bin/python3", *COMMAND[1:]], env, True) is None
    assert fork_key([sys.executable, "-m", "ipykernel_launcher", "-f", "k.json"], env, True) is None


def test_another_home_forks_only_without_a_user_site(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "a")}
    other = {"HOME": str(tmp_path / "b")}
    assert fork_key(COMMAND, env, True) == fork_key(COMMAND, other, True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / "b" / ".local" / "lib" / version / "site-packages").mkdir(parents=True)
    assert fork_key(COMMAND, env, True) != fork_key(COMMAND, other, True)


def test_a_new_package_changes_the_code_stamp_and_a_new_notebook_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started_in = tmp_path / "notebooks"  # sys.path[0] of ``python -m``: not imported from
    packages = tmp_path / "site-packages"
    own = tmp_path / "own"  # a kernelspec's PYTHONPATH
    for directory in (started_in, packages, own):
        directory.mkdir()
    monkeypatch.setattr(sys, "path", [str(started_in), str(packages), *sys.path[1:]])
    env = {"PYTHONPATH": str(own)}
    stamp = code_stamp(env)
    (started_in / "Untitled.ipynb").write_text("{}")
    assert code_stamp(env) == stamp
    (packages / "new_package").mkdir()
    assert code_stamp(env) != stamp
    stamp = code_stamp(env)
    (own / "module.py").write_text("")
    assert code_stamp(env) != stamp
