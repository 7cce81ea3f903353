"""docs/how-it-works.md's layout lists every module of the package, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "how-it-works.md"
PACKAGE = ROOT / "kernel_gateway_stream"


def listed_modules() -> set[str]:
    """The modules the page's layout block names, as paths below the package."""
    text = PAGE.read_text()
    block = re.search(r"## Layout\n.*?```\n(.*?)```", text, re.DOTALL)
    assert block, "docs/how-it-works.md has no layout block"
    names: set[str] = set()
    package = ""
    for line in block.group(1).splitlines():
        entry = re.split(r"\s{2,}", line.strip())[0]
        if not line.startswith(" "):
            if entry.endswith("/"):
                package = entry
                continue
            package = ""
            names.update(name.strip() for name in entry.split(","))
        else:
            names.add(package + entry)
    return names


def test_the_layout_names_every_module_and_no_other() -> None:
    modules = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    }
    listed = listed_modules()
    assert modules - listed == set(), "modules missing from the layout"
    assert listed - modules == set(), "the layout names modules that do not exist"
