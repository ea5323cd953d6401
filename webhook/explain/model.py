"""What explain shares besides the values kinds build (``webhook.plan.explained``): the
text width and a denial."""

from __future__ import annotations

from dataclasses import dataclass, field

WIDTH = 80


@dataclass
class Denial:
    kind: str
    api_version: str
    namespace: str
    name: str
    problems: list[str]
    changes: list[str] = field(default_factory=list)
