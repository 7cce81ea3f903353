"""The whole suite, as CI runs it: ``python -m tests`` (arguments go to both runs).

Two runs of pytest. First every test not marked ``alone``, on one worker per core
(pytest-xdist: each test owns its ports, directories, Redis keys and kernels, so any two
run at once). Four workers on two cores finished this run sooner (569 s against 793 s in
one measure) but starved the machine: fresh-clone runs then failed a different
time-sensitive test each time (a 5 s close handshake, a browser page's 180 s wait, an
upstream flood that stalled), so CI runs as many workers as cores;
then the ``alone`` ones, one at a time: they measure the daemon's memory, which a test
beside them would disturb. The exit status is the first failing run's, else 0.
"""

from __future__ import annotations

import subprocess
import sys

#: pytest's exit status when a run selected no test (not a failure here: the arguments
#: may select tests of one kind only).
NO_TESTS = 5


def main(arguments: list[str]) -> int:
    runs = (
        ["-m", "not alone", "-n", "auto", "--dist", "loadgroup", *arguments],
        ["-m", "alone", *arguments],
    )
    statuses = [subprocess.call([sys.executable, "-m", "pytest", *run]) for run in runs]
    if all(status == NO_TESTS for status in statuses):
        return NO_TESTS
    return next((status for status in statuses if status not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
