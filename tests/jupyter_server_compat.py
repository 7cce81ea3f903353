"""jupyter_server's own tests of its kernels API, sessions API, kernel WebSocket and their
authorization, run with this package's extension enabled in every server they start (or,
``--without``, explicitly disabled: the baseline). Where jupyter_server tests a behaviour
of its kernels or its kernel WebSocket, the extension must match it or document why not
(docs/jupyterlab.md).

    python -m tests.jupyter_server_compat              # about 2 minutes on 2 cores
    python -m tests.jupyter_server_compat --without    # the baseline
    python -m tests.jupyter_server_compat -- -k pending   # extra pytest arguments

The tests come from the sdist of the installed jupyter_server's version (PyPI), unpacked
once under ``~/.cache/kernel_gateway_stream/``; the sdist's own copy of the package is
removed, so that the installed one is what runs. Their ``conftest.py`` gets a wrapper of
pytest-jupyter's ``jp_configurable_serverapp`` that sets the extension on or off in every
server's configuration (and gives it a transcript database in the test's directory), and
checks that it loaded (or did not). Not part of ``python -m tests``: its two minutes would
be spent on every run for tests that change only when jupyter_server does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import jupyter_server

#: What the runs cover, in jupyter_server's tree.
TESTS = (
    "tests/services/kernels",
    "tests/services/sessions",
    "tests/auth/test_authorizer.py",
    "tests/base/test_websocket.py",
)

REQUEST = "HTTPServerRequest"

#: Appended to jupyter_server's tests/conftest.py.
CONFTEST = """

# -- kernel_gateway_stream: the extension on (KGS_COMPAT=on) or off in every server ------
from traitlets.config import Config as _KgsConfig

_KGS_ON = os.environ.get("KGS_COMPAT", "off") == "on"


def _kgs_config(config, tmp_path):
    c = _KgsConfig(config)
    server = _KgsConfig(dict(c.get("ServerApp", {})))
    extensions = dict(server.get("jpserver_extensions", {}))
    extensions["kernel_gateway_stream"] = _KGS_ON
    server["jpserver_extensions"] = extensions
    c["ServerApp"] = server
    if _KGS_ON:
        store = _KgsConfig(dict(c.get("SQLiteTranscriptStore", {})))
        store["path"] = str(tmp_path / "transcripts.sqlite3")
        c["SQLiteTranscriptStore"] = store
    return c


@pytest.fixture
def jp_configurable_serverapp(jp_configurable_serverapp, jp_server_config, tmp_path):
    original = jp_configurable_serverapp

    def configurable(*args, config=None, **kwargs):
        base = jp_server_config if config is None else config
        app = original(*args, config=_kgs_config(base, tmp_path), **kwargs)
        connection = app.web_app.settings.get("kernel_websocket_connection_class")
        loaded = getattr(connection, "__name__", "") == "StreamChannelsConnection"
        assert loaded == _KGS_ON, f"kernel_gateway_stream loaded: {loaded}"
        return app

    return configurable
"""


def cache_directory() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "kernel_gateway_stream" / f"jupyter_server-{jupyter_server.__version__}"


def unpacked() -> Path:
    """jupyter_server's source tree for the installed version, with the wrapper in place."""
    tree = cache_directory()
    if (tree / "tests" / "conftest.py").exists():
        return tree
    version = jupyter_server.__version__
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"jupyter_server=={version}",
             "--no-binary", ":all:", "--no-deps", "--quiet", "-d", download],
            check=True,
        )  # fmt: skip
        [archive] = Path(download).glob("*.tar.gz")
        partial = tree.with_name(tree.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with tarfile.open(archive) as sdist:
            sdist.extractall(partial, filter="data")
        [source] = partial.iterdir()
        shutil.rmtree(source / "jupyter_server")  # the installed package runs, not this copy
        with open(source / "tests" / "conftest.py", "a") as conftest:
            conftest.write(CONFTEST)
        shutil.rmtree(tree, ignore_errors=True)
        source.rename(tree)
        shutil.rmtree(partial)
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--without", action="store_true", help="the extension off: the baseline")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    tree = unpacked()
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark",
        "-n", "2", "--timeout", "120", "-q",
        # tornado 6.6 deprecates arguments jupyter_server's tests still pass; their
        # settings turn warnings into errors, with the extension or without.
        "-W", f"ignore:The method, uri, and version arguments to {REQUEST}:DeprecationWarning",
        "-W", f"ignore:The start_line argument to {REQUEST}:DeprecationWarning",
        *TESTS, *args.pytest_args,
    ]  # fmt: skip
    environment = dict(os.environ, KGS_COMPAT="off" if args.without else "on")
    return subprocess.run(command, cwd=tree, env=environment).returncode


if __name__ == "__main__":
    sys.exit(main())
