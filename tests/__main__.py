"""The whole suite, as CI runs it: ``python -m tests`` (arguments go to both runs).

Two runs of pytest. First every test not marked ``alone``, on four workers (pytest-xdist:
each test owns its ports, directories, Redis keys and kernels, so any two run at once;
the tests mostly wait on their daemons and kernels, so on two cores four workers finished
this run in 569 s where ``-n auto``'s two took 793 s);
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
        ["-m", "not alone", "-n", "4", "--dist", "loadgroup", *arguments],
        ["-m", "alone", *arguments],
    )
    statuses = [subprocess.call([sys.executable, "-m", "pytest", *run]) for run in runs]
    if all(status == NO_TESTS for status in statuses):
        return NO_TESTS
    return next((status for status in statuses if status not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
