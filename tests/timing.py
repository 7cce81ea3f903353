"""One scalable time unit for every test timeout (KGS_TEST_TIME_SCALE=3 on a slow machine)."""

from __future__ import annotations

import os

SCALE = float(os.environ.get("KGS_TEST_TIME_SCALE", "1"))


def seconds(value: float) -> float:
    """``value`` seconds, scaled for this machine. Timeouts only; never an assertion."""
    return value * SCALE
