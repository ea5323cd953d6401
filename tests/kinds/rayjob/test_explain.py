"""``retry-webhook explain`` for a RayJob (``webhook.kinds.rayjob.explain``): provenance, the
budget, a plan of attempts and KubeRay's counting simulated."""

from __future__ import annotations

import pytest

from testkit.builders import P
from testkit.explain import rows, setting
from testkit.explainkinds import RESTART_ATTEMPT, items, placed_by_pod_webhook, rayjob, reviewed
from webhook import explain
from webhook.plan.explained import AttemptGap
from webhook.policy.config import parse_config


def test_rayjob_provenance_and_budget():
    (item,) = items(rayjob({P + "backoff-limit": "2"}))
    assert [s.name for s in item.settings] == ["backoff-limit", "error-propagation"]
    assert setting(item, "backoff-limit").text == "your annotation"
    assert "so it gets up to 3 attempts; failed attempt number 3 ends it" in item.budget
    assert reviewed(rayjob({P + "backoff-limit": "2"})).outcome.policies["spec"].backoff_limit == 2
    (plain,) = items(rayjob())
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").text) == (
        "0",
        "RayJob default",
    )
    assert plain.budget.startswith(
        "backoffLimit is 0 (from the RayJob default): KubeRay does not retry"
    )
    (spec,) = items(rayjob(backoffLimit=1))
    assert setting(spec, "backoff-limit").text == "your own spec.backoffLimit"
    (default,) = items(rayjob(), parse_config("defaults: {backoff-limit: 4}"))
    assert (setting(default, "backoff-limit").value, default.attempts.limit) == ("4", 4)
    assert setting(default, "backoff-limit").text == "cluster default"


def test_rayjob_has_no_rules_and_a_plan_of_attempts():
    (item,) = items(rayjob({P + "backoff-limit": "2"}))
    assert item.rules == []
    assert item.no_match.startswith("a RayJob has no failure rules")
    assert [r.failures_before for r in rows(item.attempts)] == [0, 1, 2]
    assert [r.if_fails for r in rows(item.attempts)] == [
        "retried, 2 retries left",
        "retried, 1 retry left",
        "the RayJob fails (AppFailed)",
    ]


@pytest.mark.parametrize("backoff", [0, 1, 40])
def test_rayjob_plan_rows_at_the_boundaries(backoff):
    obj = rayjob({P + "backoff-limit": str(backoff)})
    (item,) = items(obj)
    plan = rows(item.attempts)
    assert (plan[0].attempt, plan[-1].attempt) == (1, backoff + 1)
    assert plan[-1].if_fails == "the RayJob fails (AppFailed)"
    assert [r.retries_left for r in plan[:-1]] == [backoff - r.failures_before for r in plan[:-1]]
    gaps = [(g.first, g.last) for g in item.attempts.rows if isinstance(g, AttemptGap)]
    assert gaps == ([(4, backoff - 2)] if backoff + 1 > 12 else [])
    # No placement for a RayJob: its pods carry nothing the pod webhook could place them by.
    final = reviewed(obj).result["spec"]["rayClusterSpec"]
    for template in [final["headGroupSpec"]["template"], final["workerGroupSpecs"][0]["template"]]:
        assert {r.nodes for r in plan} == {"any node"}
        assert not placed_by_pod_webhook(template, labels={RESTART_ATTEMPT: str(backoff)})


def test_rayjob_on_an_existing_cluster_is_never_retried():
    obj = rayjob(clusterSelector={"ray.io/cluster": "shared"})
    del obj["spec"]["rayClusterSpec"]
    (item,) = items(obj, events="1")
    assert "which KubeRay cannot recreate" in item.budget
    assert [r.failures_before for r in rows(item.attempts)] == [0]
    assert item.simulation.ending.reason == "AppFailed"


@pytest.mark.parametrize(
    ("events", "state"),
    [("1,143", "Running"), ("1,143,disruption", "Failed"), ("oom,ray-worker:1,2", "Failed")],
)
def test_rayjob_simulate_counts_every_failed_attempt(events, state):
    (item,) = items(rayjob({P + "backoff-limit": "2"}), events=events)
    sim = item.simulation
    assert sim.ending.state == state
    assert [s.counted for s in sim.steps] == [True] * len(sim.steps)
    text = " ".join(explain.render_text([item]).split())
    if state == "Failed":
        assert sim.ending.reason == "AppFailed"
        assert "Outcome: the RayJob fails; jobDeploymentStatus Failed, reason AppFailed" in text
    else:
        assert sim.ending.message == (
            "attempt 3 runs next, on a new RayCluster; its failure, if counted, ends it"
        )
        assert "attempt 2: exit code 143 (SIGTERM) in container ray-head." in text
