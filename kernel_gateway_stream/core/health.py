"""Health: what each part of the gateway says of itself, and what that adds up to.

``GET /api/gateway/health`` answers with the overall state and each component's. The
rules (DESIGN, "Trust": faults degrade explicitly and visibly, never silently):

* ``ok``: working as designed.
* ``degraded``: still keeping its promises, at a cost or at risk (a store retrying
  refused writes while records wait safely in memory; a kernel whose Tap is not ready).
* ``failing``: a promise is broken now (the transcript is not being kept: records become
  gap records), or the component cannot work at all.

The overall state is the worst component's; HTTP 200 for ok and degraded (the node still
serves), 503 for failing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ComponentHealth", "State", "overall", "to_json"]


class State(enum.Enum):
    OK = "ok"
    DEGRADED = "degraded"
    FAILING = "failing"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def http_status(self) -> int:
        return 503 if self is State.FAILING else 200


_RANK = {State.OK: 0, State.DEGRADED: 1, State.FAILING: 2}


@dataclass(frozen=True, slots=True)
class ComponentHealth:
    """One component's state; ``reason`` is short and machine-readable (None when ok),
    ``details`` whatever figures explain it."""

    name: str
    state: State
    reason: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "reason": self.reason, **self.details}


def overall(components: Iterable[ComponentHealth]) -> State:
    """The worst state among ``components`` (ok if there are none)."""
    return max(
        (component.state for component in components), key=lambda s: s.rank, default=State.OK
    )


def to_json(components: Iterable[ComponentHealth]) -> dict[str, Any]:
    """The health endpoint's body: ``{"status", "components": {name: {...}}}``."""
    listed = list(components)
    return {
        "status": overall(listed).value,
        "components": {component.name: component.to_json() for component in listed},
    }
