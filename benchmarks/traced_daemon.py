"""The gateway's daemon with ``tracemalloc`` on, for ``python -m benchmarks.idle_floor
--breakdown``: ``python -m benchmarks.traced_daemon ARGS`` runs ``python -m
kernel_gateway_stream ARGS``, and each SIGUSR2 writes a snapshot of the Python heap (after
a full collection) to ``$KGS_BENCH_SNAPSHOT.<n>``, n = 0, 1, ... (jupyter_server keeps
SIGUSR1 for itself)."""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc
from typing import Any


def main() -> None:
    tracemalloc.start(1)
    path = os.environ["KGS_BENCH_SNAPSHOT"]
    taken = 0

    def snapshot(*_: Any) -> None:
        nonlocal taken
        gc.collect()
        tracemalloc.take_snapshot().dump(f"{path}.{taken}")
        taken += 1

    signal.signal(signal.SIGUSR2, snapshot)
    sys.argv = ["kernel_gateway_stream", *sys.argv[1:]]
    from kernel_gateway_stream.__main__ import main as run

    run()


if __name__ == "__main__":
    main()
