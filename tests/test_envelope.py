"""The published scale envelope (``benchmarks/envelope.yaml``, docs/SCALE.md) says, for
every line, its threshold, the runs it came from, the machine and what was simulated; and
the check ``make bench-scale`` runs tells a value outside its threshold. No timing here:
the figures come from ``python -m benchmarks.envelope``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from benchmarks.envelope import ENVELOPE, MARGIN, METRICS, check, threshold

DOCS = Path(__file__).resolve().parent.parent / "docs" / "SCALE.md"


def test_every_line_has_a_threshold_from_five_runs_and_its_machine() -> None:
    lines = yaml.safe_load(ENVELOPE.read_text())["lines"]
    assert set(lines) == set(METRICS)
    for metric, entry in lines.items():
        assert len(entry["runs"]) >= 5, metric
        assert entry["threshold"] == threshold(entry["runs"], METRICS[metric].direction), metric
        assert entry["direction"] == METRICS[metric].direction, metric
        assert {"nproc", "cpu", "memory_gb", "date"} <= set(entry["machine"]), metric
        assert "simulated" in entry and entry["scale"], metric


def test_a_threshold_is_the_mean_plus_or_minus_the_margin() -> None:
    runs = [2.0, 2.2, 2.4, 2.0, 2.4]
    mean = statistics.fmean(runs)
    assert threshold(runs, "at_most") == round(mean * (1 + MARGIN), 3)
    assert threshold(runs, "at_least") == round(mean * (1 - MARGIN), 3)


def test_the_check_tells_a_value_outside_its_threshold() -> None:
    envelope = {"lines": {"writes_per_failed_pod": {"threshold": 2.5}}}
    results = {"failures": {"runs": [{"values": {"writes_per_failed_pod": v}} for v in (2, 3)]}}
    rows = check(results, envelope)
    assert [row["within"] for row in rows] == [True, False]
    # a value never measured (a backlog not drained) is outside; a line with no threshold too
    results = {"backlog": {"runs": [{"values": {"backlog_drained_after_last_loss_s": None}}]}}
    assert [row["within"] for row in check(results, envelope)] == [False]


def test_the_scale_page_names_every_line() -> None:
    text = DOCS.read_text()
    for metric in METRICS:
        assert metric in text, metric
