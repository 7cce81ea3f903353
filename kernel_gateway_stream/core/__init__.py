"""The pure core of kernel_gateway_stream.

Everything under this package is sans-I/O: it parses and encodes bytes, numbers
messages, decides when to coalesce and when a subscriber is too slow, and returns
those decisions to the adapters (``recording``, ``broker``, ``stores``, ``handlers``).
It never reads a clock (``now`` is passed in), never touches a socket or a file,
and imports neither asyncio, tornado nor zmq. ``tests/unit/test_purity.py``
keeps it that way.

Any part of the package (and the client) may import it; it imports nothing of the
package outside itself.
"""
