"""What explain shares besides the values kinds build (``webhook.plan.explained``): the
text width, a denial, and the registry of per-kind explainers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from webhook.plan.explained import Explainer

WIDTH = 80


@dataclass
class Denial:
    kind: str
    api_version: str
    namespace: str
    name: str
    problems: list[str]
    changes: list[str] = field(default_factory=list)


# --- the per-kind registry -----------------------------------------------------------

_EXPLAINERS: dict[tuple[str, str], Explainer] = {}


def explainer(group: str, kind: str) -> Callable[[Explainer], Explainer]:
    """Register the function that explains one kind (``group`` is "" for the core API)."""

    def register(function: Explainer) -> Explainer:
        _EXPLAINERS[(group, kind)] = function
        return function

    return register


def explained_kinds() -> list[tuple[str, str]]:
    return sorted(_EXPLAINERS)
