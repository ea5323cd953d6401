"""``explain`` and failure categories: what each category does to the workload, and
``--simulate`` taking a category as what a pod failed with (the controller's condition on
it), judged by the same rules the Job controller reads (``matchPodFailurePolicy``)."""

from __future__ import annotations

import pytest

from testkit.explain import manifest, one
from webhook import explain
from webhook.policy.config import parse_config

P = "retry-policy.dev/"
FREE = {
    P + "free-categories": "DeviceFault,NodeFailure",
    P + "max-free-failures": "1",
    P + "fail-categories": "ImagePull",
    P + "start-deadline": "15m",
    P + "backoff-limit": "2",
}


def test_the_notes_say_what_each_category_does():
    item = one(manifest(FREE, spec={"activeDeadlineSeconds": 3600}))
    notes = " ".join(" ".join(item.notes).split())
    assert "failure categories ImagePull: the controller writes the pod's category" in notes
    assert "fails the Job at once (fail-categories" in notes
    assert "failure categories DeviceFault, NodeFailure: free (free-categories)" in notes
    assert "max-free-failures 1: 1 free failure of this Job free" in notes
    assert "every other category (Preempted, ConfigError, Unschedulable, StartTimeout," in notes
    assert "start-deadline 15m: a pod whose containers have not all started" in notes
    assert {s.name for s in item.settings} >= {"free-categories", "start-deadline"}


def test_a_simulated_category_is_judged_with_the_free_budget_and_the_failing_rule():
    events = "DeviceFault,disruption+NodeFailure,1,ImagePull"
    item = one(manifest(FREE), events=events)
    steps = item.simulation.steps
    assert [(s.action, s.counted) for s in steps] == [
        ("Ignore", False),  # free failure 1 of 1
        ("Count", True),  # over max-free-failures: FreeBudgetExhausted's Count rule first
        (None, True),
        ("FailJob", True),
    ]
    said = " ".join(f"{s.what} {s.result}" for s in steps)
    assert "free failure 1 of 1" in said and "free failure 2, over max-free-failures 1" in said
    assert item.simulation.ending.reason == "PodFailurePolicy"


def test_a_category_the_workload_does_not_name_is_decided_by_its_exit_code():
    item = one(manifest(FREE), events="OOMKilled,Preempted")
    assert [(s.action, s.counted) for s in item.simulation.steps] == [(None, True), (None, True)]


def test_the_clusters_own_category_is_an_event_too():
    config = parse_config(
        "categories:\n  - {name: NCCLTimeout, hint: a collective timed out, "
        "match: {terminationMessage: NCCL}}\n"
    )
    events = explain.parse_events("main:1+NCCLTimeout", ["NCCLTimeout", "AppError"])
    (event,) = events
    assert event.category == "NCCLTimeout" and event.exits("main") == [("main", 1)]
    annotations = {P + "fail-categories": "NCCLTimeout"}
    item = one(manifest(annotations), config=config, events=None)
    assert item is not None
    with pytest.raises(explain.ExplainError) as caught:
        explain.parse_events("NCCLTimeout")
    assert "names no category; the categories are DeviceFault" in str(caught.value)


@pytest.mark.parametrize(
    ("token", "exits"),
    [
        ("ImagePull", []),
        ("Unschedulable", []),
        ("NodeFailure", [("main", 143)]),
        ("OOMKilled", [("main", 137)]),
        ("AppError", [("main", 1)]),
        ("main:3+AppError", [("main", 3)]),
    ],
)
def test_what_a_category_alone_stops_the_main_container_with(token, exits):
    (event,) = explain.parse_events(token)
    assert event.exits("main") == exits


def test_a_pod_has_one_category():
    with pytest.raises(explain.ExplainError) as caught:
        explain.parse_events("DeviceFault+NodeFailure")
    assert "a pod has one category" in str(caught.value)
