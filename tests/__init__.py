"""The suite (``python -m tests``; see tests/__main__.py)."""

import sys

# jsonschema, imported by jupyter_server's event logger (tests/conftest.py imports
# jupyter_server), compiles rfc3987_syntax's grammar on import when that package is
# installed: about 1.5 s of CPU in each pytest process (the controller and every worker),
# for the "iri" formats, which no event schema of jupyter_server or of this gateway uses.
# The daemon does without them too (kernel_gateway_stream/__main__.py), so the in-process
# servers of the tests run as it does. Set here, before pytest imports the conftest.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
