"""``python -m kernel_gateway_stream``, and the ``kernel-gateway-stream`` command: the daemon."""

from __future__ import annotations

import gc
import sys


def main() -> None:
    # jsonschema, imported by jupyter_server's event logger, compiles rfc3987_syntax's
    # grammar on import when that package is installed (it is, with jupyter_events): 0.8 s
    # of the 1.1 s that jupyter_server's imports take, on every start of the daemon, for
    # the "iri" formats, which no event schema of jupyter_server or of this gateway uses.
    # The daemon does without them (jsonschema then checks no "iri" format).
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    # The start builds tens of thousands of objects that live as long as the process
    # (modules, classes, traitlets, handlers), and the collector walked them over and over
    # while it did: about a sixth of the start's CPU. It collects again once the daemon
    # serves, with those frozen out of its walks (GatewayStreamApp's
    # _start_jupyter_server_extension).
    gc.disable()
    from kernel_gateway_stream.app import main as run

    run()


if __name__ == "__main__":
    main()
