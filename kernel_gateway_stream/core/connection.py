"""Connection info of a kernel to attach: checked and normalized (pure).

The fields are those of a Jupyter connection file (jupyter_client's ``connect.py``):
``ip``, ``transport`` (``tcp`` or ``ipc``), the five ``*_port``, ``key`` and
``signature_scheme``, and the kernel's CurveZMQ key pair (``curve_publickey``,
``curve_secretkey``: Z85 text, 40 characters each) when its transport is encrypted
(jupyter_server's ``transport_encryption``). Anything else in a connection file
(``kernel_name``, ``kernel_id``) is not connection info.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from .errors import InvalidConnectionInfo

__all__ = ["PORT_NAMES", "check_connection_info"]

PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
#: A CurveZMQ key in Z85 text.
_Z85_KEY = 40
_SCHEMES = ("hmac-sha256", "hmac-sha512", "hmac-sha384", "hmac-sha224", "hmac-md5", "hmac-sha1")


def check_connection_info(info: Any) -> dict[str, Any]:
    """``info`` as connection info the gateway can use (key as text).

    Raises:
        InvalidConnectionInfo: with what is wrong, in words a caller can act on.
    """
    if not isinstance(info, dict):
        raise InvalidConnectionInfo("connection_info must be a JSON object")
    transport = info.get("transport", "tcp")
    if transport not in ("tcp", "ipc"):
        raise InvalidConnectionInfo("transport must be 'tcp' or 'ipc'")
    ip = info.get("ip")
    if not isinstance(ip, str) or not ip:
        raise InvalidConnectionInfo("ip must be a non-empty string")
    if transport == "tcp":
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise InvalidConnectionInfo(f"ip {ip[:64]!r} is not an IP address") from None
    checked: dict[str, Any] = {"ip": ip, "transport": transport}
    for name in PORT_NAMES:
        port = info.get(name)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidConnectionInfo(f"{name} must be an integer from 1 to 65535")
        checked[name] = port
    if len({checked[name] for name in PORT_NAMES}) != len(PORT_NAMES):
        raise InvalidConnectionInfo("the five ports must differ")
    key = info.get("key", "")
    if not isinstance(key, str):
        raise InvalidConnectionInfo("key must be a string")
    if len(key) > 1024:
        raise InvalidConnectionInfo("key is longer than 1024 characters")
    scheme = info.get("signature_scheme", "hmac-sha256")
    if scheme not in _SCHEMES:
        raise InvalidConnectionInfo(f"signature_scheme must be one of {', '.join(_SCHEMES)}")
    checked["key"] = key
    checked["signature_scheme"] = scheme
    public, secret = info.get("curve_publickey"), info.get("curve_secretkey")
    if public or secret:
        for name, value in (("curve_publickey", public), ("curve_secretkey", secret)):
            if not isinstance(value, str) or len(value) != _Z85_KEY or not value.isascii():
                raise InvalidConnectionInfo(
                    f"{name} must be a CurveZMQ key in Z85 ({_Z85_KEY} characters), "
                    "given with the other"
                )
            checked[name] = value
    return checked
