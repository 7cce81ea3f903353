"""kernel_gateway_stream: a Jupyter kernel gateway that never loses output.

Every IOPub message of every kernel is recorded once, durably, with a per-kernel
sequence number, and fanned out to any number of clients, bursts of ``stream`` output
coalesced instead of dropped. docs/how-it-works.md states the invariants and draws the
layout: each package's docstring says what may import it, and no import runs from a lower
package to a higher one (:mod:`.core` at the bottom; :mod:`.kernels`, :mod:`.broker`,
:mod:`.stores` on it; :mod:`.recording`, then :mod:`.cluster`; the executions and
:mod:`.handlers`; :mod:`.app` at the top).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import GatewayStreamApp

    return [{"module": "kernel_gateway_stream.app", "app": GatewayStreamApp}]
