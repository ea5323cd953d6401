"""``retry-webhook explain`` for a CronJob (``webhook.kinds.cronjob.explain``): each Job it
creates, explained and simulated as that Job; plan rows checked against the real pod
webhook."""

from __future__ import annotations

import pytest

from testkit.builders import FULL, P
from testkit.explain import rows, setting
from testkit.explainkinds import cronjob, items, placed_by_pod_webhook, reviewed
from webhook import explain
from webhook.policy.config import parse_config


def test_cronjob_explains_each_job_it_creates():
    (item,) = items(cronjob(FULL))
    assert (item.kind, item.part, item.owner) == ("CronJob", "each Job it creates", "Job")
    assert setting(item, "backoff-limit").text == "your annotation"
    assert item.attempts.limit_field == "spec.jobTemplate.spec.backoffLimit"
    assert [r.failures_before for r in rows(item.attempts)] == [0, 1, 2, 3]
    assert [r.origin for r in item.rules] == [
        "added by retry-policy for ignore-disruptions",
        "added by retry-policy for fail-non-retriable",
    ]
    assert any("next Job starts again at attempt 1" in note for note in item.notes)
    assert set(reviewed(cronjob(FULL)).outcome.policies) == {"spec.jobTemplate.spec"}


def test_cronjob_provenance_of_the_template_budget():
    # Annotations on the jobTemplate count as the CronJob's own.
    (item,) = items(cronjob(template_annotations={P + "backoff-limit": "4"}))
    assert (setting(item, "backoff-limit").value, setting(item, "backoff-limit").text) == (
        "4",
        "your annotation",
    )
    # A template is not API-defaulted: a 6 in it was written, an absent one is the default.
    (written,) = items(cronjob(backoffLimit=6))
    assert setting(written, "backoff-limit").text == "your own spec.jobTemplate.spec.backoffLimit"
    (plain,) = items(cronjob())
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").text) == (
        "6",
        "Kubernetes default",
    )
    config = parse_config("defaults: {backoff-limit: 2}")
    (default,) = items(cronjob(), config)
    assert setting(default, "backoff-limit").text == "cluster default"
    assert default.attempts.limit == 2


@pytest.mark.parametrize(("backoff", "n"), [(3, 1), (2, 3), (0, 1)])
def test_cronjob_plan_agrees_with_the_pod_webhook(backoff, n):
    obj = cronjob({P + "backoff-limit": str(backoff), P + "non-spot-attempts": str(n)})
    template = reviewed(obj).result["spec"]["jobTemplate"]["spec"]["template"]
    (item,) = items(obj)
    placements = [r.nodes == "non-spot only" for r in rows(item.attempts)]
    assert placements == [a >= backoff + 1 - n for a in range(backoff + 1)]
    for row in rows(item.attempts):
        attempt = {P + "attempt": str(row.failures_before)}
        assert placed_by_pod_webhook(template, annotations=attempt) is (row.nodes != "any node")


@pytest.mark.parametrize(
    ("events", "state", "reason"),
    [
        ("1", "Failed", "PodFailurePolicy"),
        ("143,143,143,143", "Failed", "BackoffLimitExceeded"),
        ("143,disruption,143", "Running", None),
    ],
)
def test_cronjob_simulates_its_jobs(events, state, reason):
    (item,) = items(cronjob(FULL), events=events)
    assert (item.simulation.ending.state, item.simulation.ending.reason) == (state, reason)
    text = " ".join(explain.render_text([item]).split())
    if state == "Failed":
        assert f"Outcome: the Job fails; condition Failed, reason {reason}" in text
    else:
        assert "Outcome: the Job is still running; attempt 3 runs next" in text
