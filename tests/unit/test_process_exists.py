"""Whether the process a kernel of the previous run had is still on this host: the restarted
gateway asks a kernel whose process is gone only briefly whether it answers, instead of
waiting ``attach_timeout`` for it while every surface waits for the recovery."""

from __future__ import annotations

import os
import subprocess
import sys

from kernel_gateway_stream.kernels.attaching import process_exists


def test_a_running_process_exists() -> None:
    assert process_exists(os.getpid())
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as child:
        try:
            assert process_exists(child.pid)
        finally:
            child.kill()


def test_an_ended_process_does_not_exist_reaped_or_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # Ended, not reaped yet: a zombie, which is all a kernel killed with its gateway leaves
    # where the init system does not reap the orphans it inherits.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert not process_exists(child.pid)
    child.wait()
    assert not process_exists(child.pid)
