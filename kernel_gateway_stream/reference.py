"""The configuration reference, made from the traits themselves.

``python -m kernel_gateway_stream.reference > docs/configuration.md`` writes it; a test
fails when the committed page differs from what this makes, or when a configurable trait
has no ``help=``. Only what this package defines is listed: jupyter_server's own options
(``--ip``, ``--port``, ``IdentityProvider.token``...) are in its documentation and in
``kernel-gateway-stream --help-all``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

from traitlets import TraitType
from traitlets.config import Configurable

import kernel_gateway_stream

__all__ = ["configurable_classes", "reference"]

INTRODUCTION = """\
# Configuration reference

Every option of kernel_gateway_stream, made from the code by
`python -m kernel_gateway_stream.reference` (a test keeps this page in step with the code).
Options go on the command line (`--MemoryBroker.coalesce_window=0.02`) or in a config file
(`kernel-gateway-stream --config=FILE`; `etc/kernel_gateway_stream_config.py` is a sample).
jupyter_server's own options (`--ip`, `--port`, `--ServerApp.base_url`,
`--IdentityProvider.token`, `ServerApp.authenticate_prometheus`, ...) work as usual;
`kernel-gateway-stream --help-all` lists them too.
"""


def configurable_classes() -> list[type[Configurable]]:
    """Every class of this package that has options of its own, in a stable order."""
    found: dict[str, type[Configurable]] = {}
    for module_info in pkgutil.walk_packages(
        kernel_gateway_stream.__path__, kernel_gateway_stream.__name__ + "."
    ):
        if module_info.name.endswith("__main__"):
            continue
        module = importlib.import_module(module_info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, Configurable)
                and cls.__module__.startswith(kernel_gateway_stream.__name__)
                and cls.class_own_traits(config=True)
            ):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found, key=lambda n: found[n].__name__)]


def _summary(cls: type) -> str:
    """The docstring's first paragraph, on one line, without Sphinx roles."""
    paragraph = (inspect.getdoc(cls) or "").split("\n\n")[0]
    return _ROLE.sub(r"`\1`", " ".join(paragraph.split())).replace("``", "`")


_ROLE = re.compile(r":[a-z]+:`~?(?:[\w.]*\.)?([\w]+)`")


def _own_traits(cls: type[Configurable]) -> Iterator[tuple[str, TraitType[Any, Any]]]:
    yield from sorted(cls.class_own_traits(config=True).items())


def _default(trait: TraitType[Any, Any]) -> str:
    text = trait.default_value_repr()
    if text in ("traitlets.Undefined", "''"):
        return "(computed)" if text == "traitlets.Undefined" else "''"
    return text.replace("|", "\\|")


def _help(trait: TraitType[Any, Any]) -> str:
    return " ".join((trait.help or "").split()).replace("|", "\\|")


def reference() -> str:
    """The reference page, as Markdown."""
    out = [INTRODUCTION]
    for cls in configurable_classes():
        base = cls.__mro__[1].__name__
        out.append(f"\n## `{cls.__name__}`\n")
        out.append(f"{_summary(cls)} (`{cls.__module__}`; subclass of `{base}`)\n")
        former = getattr(cls, "former_names", ())
        if former:
            names = ", ".join(f"`{name}`" for name in former)
            out.append(f"Its options are also read under its former name: {names}.\n")
        out.append("\n| option | type | default | meaning |\n|---|---|---|---|")
        for name, trait in _own_traits(cls):
            kind = type(trait).__name__
            out.append(
                f"| `{cls.__name__}.{name}` | {kind} | `{_default(trait)}` | {_help(trait)} |"
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
