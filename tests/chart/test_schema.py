"""The chart's JSON files are JSON a reader takes one way: no key given twice in one object
(Go's encoding/json, as Helm reads values.schema.json, keeps the last silently)."""

from __future__ import annotations

import json

from testkit.tools import ROOT

CHART = ROOT / "charts" / "retry-policy-webhook"


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    assert not twice, f"keys given twice: {twice}"
    return dict(pairs)


def test_no_json_file_of_the_chart_gives_a_key_twice() -> None:
    files = sorted(CHART.rglob("*.json"))
    assert CHART / "values.schema.json" in files
    for path in files:
        json.loads(path.read_text(), object_pairs_hook=_no_duplicates)
