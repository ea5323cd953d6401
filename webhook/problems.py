"""Errors as values.

Every check in the engine returns a list of ``Problem`` instead of raising, so a single
request can report everything that is wrong with it at once: a user fixing a manifest
should not have to apply it five times to discover five mistakes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing a user must change, phrased so they can act on it.

    ``where`` names the annotation key or the field path (``spec.backoffLimit``);
    ``message`` says what is wrong and what would be accepted; ``reason`` is a short
    machine-readable slug used for metrics and tests.
    """

    where: str
    message: str
    reason: str = "invalid"

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def summarize(problems: list[Problem], limit: int = 3000) -> str:
    """Join problems into one denial message that kubectl prints on one screen."""
    if len(problems) == 1:
        text = str(problems[0])
    else:
        parts = [f"({i}) {p}" for i, p in enumerate(problems, 1)]
        text = f"{len(problems)} problems: " + "; ".join(parts)
    if len(text) > limit:
        text = text[: limit - 20].rstrip() + " ... (truncated)"
    return text
