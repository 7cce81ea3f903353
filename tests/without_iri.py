"""``python tests/without_iri.py MODULE ARG...``: ``python -m MODULE ARG...`` without
rfc3987_syntax, for the jupyter_server and JupyterLab servers the tests start.

jsonschema, imported by jupyter_server's event logger, compiles rfc3987_syntax's grammar
on import when that package is installed (it is, with jupyter_events): about 1.4 s of CPU
in every such server here (jupyter_server#1559), for the "iri" formats, which no event
schema of jupyter_server, JupyterLab or this gateway uses. The gateway's daemon does
without them for the same reason (``kernel_gateway_stream/__main__.py``); so do these
servers, which the suite starts a dozen times.
"""

from __future__ import annotations

import os
import runpy
import sys

#: The command line that runs ``python -m MODULE ...`` this way: ``[*RUN, MODULE, ...]``.
RUN = [sys.executable, os.path.abspath(__file__)]

if __name__ == "__main__":
    # Run as a script, its directory (tests/) heads sys.path: it is not the server's.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
