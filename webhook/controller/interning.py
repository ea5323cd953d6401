"""One copy of each distinct ``podFailurePolicy`` rule list among the Jobs a reconciler
keeps: the Jobs of one template (and most of a cluster's, since admission writes the same
rules for the same policy) carry equal rules, which decoded from each Job's JSON take
about a kilobyte a Job."""

from __future__ import annotations

import json

#: Distinct rule lists kept; past it the table starts again (a copy is then kept twice
#: at worst, never a wrong one).
MOST = 4096


class RuleSets:
    """Not thread-safe: called with its owner's lock held."""

    def __init__(self) -> None:
        self._sets: dict[str, tuple] = {}

    def shared(self, rules: tuple) -> tuple:
        """``rules``, or an equal tuple seen before."""
        if not rules:
            return ()
        key = json.dumps(rules, sort_keys=True)
        found = self._sets.get(key)
        if found is None:
            if len(self._sets) >= MOST:
                self._sets.clear()
            found = self._sets[key] = rules
        return found

    def __len__(self) -> int:
        return len(self._sets)
