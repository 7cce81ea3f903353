"""Floods of stream output from a real ipykernel, for tests whose point is what the gateway
does with many messages, not ipykernel's ``print``.

``print(i, flush=True)`` costs ipykernel 7 about 0.4 ms of CPU a line in the kernel: each
flush hands the line to the IOPub thread and waits until it is sent. A 20,000-line flood is
8 s of CPU before the gateway reads a byte, and the suite ran dozens of them on two cores.
:func:`flood_code` sends the same messages the way the flush does (``stream`` messages on
stdout, one line each, parented to the running execution, signed by the kernel's session
and sent through its IOPub thread under its stdout topic) without the wait, for about
55 µs a line: the gateway reads them faster than a print loop sends, which is the harder
case for it. Where what ``print`` does is the point (what JupyterLab shows, a kernel's own
buffering, a sandbox's stdout), tests print.
"""

from __future__ import annotations

__all__ = ["flood_code", "flood_text"]


def flood_code(lines: int, *, start: int = 0, line: str = "i") -> str:
    """Code that sends ``str(line) + "\\n"`` for ``i`` in ``range(start, start + lines)``,
    one ``stream`` message each, after what the cell printed before (flushed first)."""
    return (
        "import sys as _sys\n"
        "_out = _sys.stdout\n"
        "_out.flush()\n"
        "_send, _pub, _topic = _out.session.send, _out.pub_thread, _out.topic\n"
        "_parent = _out.parent_header\n"
        f"for i in range({start}, {start + lines}):\n"
        f"    _send(_pub, 'stream', {{'name': 'stdout', 'text': str({line}) + '\\n'}},"
        " parent=_parent, ident=_topic)\n"
    )


def flood_text(lines: int, *, start: int = 0) -> str:
    """What :func:`flood_code` with the default ``line`` prints."""
    return "".join(f"{i}\n" for i in range(start, start + lines))
