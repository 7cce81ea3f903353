"""The whole suite, as CI runs it: ``python -m tests`` (arguments go to pytest).

One run of pytest on one worker more than there are cores (pytest-xdist: each test owns its
ports, directories, Redis keys and kernels, so any two run at once). The suite's tests wait
(on a restarter's poll, a lease's expiry, a flood's pace, a browser's page), and with one
worker per core the cores sat idle a fifth to a third of the time (``/proc/stat`` over a
fresh clone's ``.ci/run`` on 2026-12-08: 309 of 1,051 core-seconds; 503 s of pytest). A
third worker took that to 9 to 13 % and pytest's run to 431 to 469 s (nine fresh clones
that night, all passed).

It had been tried before and put back: on 2026-12-06 and 12-07 two of about ten
three-worker runs failed a browser test (a widgets page missed a line; a JupyterLab page
came up without its theme's stylesheet and waited out 180 s), and neither cause was found.
Neither came again in the nine three-worker fresh clones of 2026-12-08 (docs/guarantees.md,
"Known limits"); the browser tests print which of their page's requests failed, should it
come again. Four workers on two cores (569 s against 793 s in one measure) failed a
different time-sensitive test in each fresh clone (a 5 s close handshake, a browser page's
180 s wait, an upstream flood that stalled).

The tests marked ``alone`` measure the daemon's memory under a flood or a storm. They run
one after another on one worker (``tests/conftest.py`` puts them in one xdist group),
never beside each other, while the other workers run the rest. Until 2026-12-07 they ran
after the others, in a second run of their own: 144 to 170 s in which one core was about
half idle (``/proc/stat``: 146 s busy of 320). What they bound is the daemon's own memory,
which another test's processes do not add to; a bound that held only on an idle machine
would be no bound.
"""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kernel_gateway_stream"


def main(arguments: list[str]) -> int:
    # Where PYTHONDONTWRITEBYTECODE is set (this machine sets it), no process the suite
    # starts writes the package's bytecode, and each one (about 130 daemons, their kernels
    # and forkservers) compiled it again: about 0.1 s of CPU a daemon's start. Written
    # once here, every one of them reads it.
    compileall.compile_dir(str(PACKAGE), quiet=1)
    # The same goes for what is not the package: pytest's rewritten test modules (about
    # 4 s of CPU in each worker, every run, when none is cached), tests/ and benchmarks/
    # modules that daemons and kernels import. The suite's processes write their bytecode
    # (into __pycache__ directories, ignored by git), so each is compiled once a run.
    environment = dict(os.environ)
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    workers = len(os.sched_getaffinity(0)) + 1
    run = ["-n", str(workers), "--dist", "loadgroup", *arguments]
    return subprocess.call([sys.executable, "-m", "pytest", *run], env=environment)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
