"""The view a mutator runs on (``webhook.kinds.view``): what it keeps, what it drops, and the
check that a mutator reads nothing it drops."""

from __future__ import annotations

import copy
import json

import pytest

from testkit.builders import FULL, P, job, job_owner, pod, review
from testkit.workloads import FixedAttempts
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.kinds import registry, view
from webhook.kube.intent import LAST_APPLIED, user_wrote
from webhook.policy.config import Config


def request_for(obj):
    return admission.decode(json.dumps(review(obj)).encode())


def test_a_job_view_keeps_what_the_policy_reads_and_drops_the_rest():
    containers = [
        {
            "name": "main",
            "image": "trainer:1",
            "args": ["--lr", "0.1"],
            "env": [{"name": "RUN", "value": "r-17"}],
            "resources": {"limits": {"cpu": "4"}},
        }
    ]
    obj = job(FULL, applied=True, containers=containers, spec={"backoffLimit": 3})
    obj["metadata"]["labels"] = {"run": "17"}
    obj["metadata"]["annotations"]["example.com/run"] = "17"
    obj["metadata"]["ownerReferences"] = [job_owner(name="pipeline", uid="u-17")]
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"disk": "ssd"}
    before = copy.deepcopy(obj)
    seen = view.job_view(obj)
    assert seen["metadata"]["namespace"] == "ml"
    assert {"name", "uid", "creationTimestamp"}.isdisjoint(seen["metadata"])
    # The labels mapping stays (the managed label is written into it), without the user's.
    assert seen["metadata"]["labels"] == {}
    annotations = seen["metadata"]["annotations"]
    assert set(annotations) == {*FULL, LAST_APPLIED}
    # The record says only which fields under spec (but the pod template) were written.
    assert json.loads(annotations[LAST_APPLIED]) == {"spec": {"backoffLimit": None}}
    assert seen["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "controller": True}
    ]
    assert seen["spec"]["backoffLimit"] == 3 and seen["spec"]["completions"] == 1
    pod_spec = seen["spec"]["template"]["spec"]
    assert pod_spec == {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "env": [{"name": "RUN"}]}],
        "nodeSelector": {"disk": "ssd"},
    }
    # What intent answers from the reduced record is what it answers from the whole.
    for path in (("spec", "backoffLimit"), ("spec", "podReplacementPolicy")):
        assert user_wrote(seen, path) == user_wrote(obj, path)
    assert obj == before  # the object itself is never edited


@pytest.mark.parametrize(
    ("record", "reduced"),
    [
        ({"spec": {"parallelism": 2, "template": {}}}, {}),  # names none: not even parsed
        ({"spec": {"template": {"metadata": {"name": "backoffLimit"}}}}, {"spec": {}}),
        ({"spec": {"backoffLimitPerIndex": 1, "podReplacementPolicy": "Failed"}}, None),
        ({"metadata": {"name": "a\\b"}}, {}),  # escapes: parsed, and no spec at all
    ],
)
def test_a_last_applied_record_is_reduced_to_the_fields_intent_is_asked(record, reduced):
    obj = job(FULL, applied=True)
    obj["metadata"]["annotations"][LAST_APPLIED] = json.dumps(record)
    seen = view.job_view(obj)
    kept = json.loads(seen["metadata"]["annotations"][LAST_APPLIED])
    assert kept == (reduced if reduced is not None else {"spec": dict.fromkeys(record["spec"])})
    for name in ("backoffLimit", "backoffLimitPerIndex", "podReplacementPolicy", "template"):
        assert user_wrote(seen, ("spec", name)) == (name in kept.get("spec", {}))
        if name != "template":  # the only field the view answers for differently
            assert user_wrote(seen, ("spec", name)) == user_wrote(obj, ("spec", name))


def test_server_side_apply_records_keep_only_what_they_say_of_spec():
    obj = job(FULL)
    obj["metadata"]["managedFields"] = [
        {"manager": "job-controller", "operation": "Update", "fieldsV1": {"f:status": {}}},
        {
            "manager": "kubectl",
            "operation": "Apply",
            "time": "2026-11-22T00:00:00Z",
            "fieldsV1": {
                "f:metadata": {"f:name": {}},
                "f:spec": {"f:backoffLimit": {}, "f:template": {"f:spec": {}}},
            },
        },
    ]
    seen = view.job_view(obj)
    assert seen["metadata"]["managedFields"] == [
        {"operation": "Apply", "fieldsV1": {"f:spec": {"f:backoffLimit": None}}}
    ]
    assert user_wrote(seen, ("spec", "backoffLimit")) is True
    obj["metadata"]["managedFields"] = obj["metadata"]["managedFields"][:1]
    assert "managedFields" not in view.job_view(obj)["metadata"]  # no Apply entry: unknown


def test_a_pod_view_keeps_its_attempt_sources_and_its_owner_when_it_looks_up():
    labels = {"batch.kubernetes.io/job-name": "train", "jobset.sigs.k8s.io/restart-attempt": "2"}
    looked_up = pod({P + "non-spot-attempts": "1", P + "backoff-limit": "3"}, owner=job_owner())
    looked_up["metadata"]["labels"] = labels
    seen = view.pod_view(looked_up)
    assert seen["metadata"]["ownerReferences"] == [job_owner()]  # name and uid for the cache
    assert seen["metadata"]["labels"] == {"jobset.sigs.k8s.io/restart-attempt": "2"}
    annotated = pod({P + "attempt": "3", P + "backoff-limit": "3"}, owner=job_owner())
    assert view.pod_view(annotated)["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "controller": True}
    ]


def test_objects_of_a_shape_the_view_does_not_expect_run_whole():
    assert view.job_view({"apiVersion": "batch/v1", "kind": "Job", "spec": []}) is None
    assert view.pod_view({"apiVersion": "v1", "kind": "Pod", "metadata": "x"}) is None
    assert registry.view_of("batch", "v1", "CronJob", job(FULL)) is None  # a kind without a view


def test_the_check_catches_a_view_that_drops_what_a_mutator_reads(monkeypatch):
    """The safety net the whole suite runs under: a view without the restart policy
    would let fail-non-retriable through on a Job that restarts in place."""
    assert engine.CHECK_VIEWS  # set for every test by conftest

    def careless(obj, config=None):
        seen = view.job_view(obj, config)
        del seen["spec"]["template"]["spec"]["restartPolicy"]
        return seen

    monkeypatch.setitem(registry.VIEWS, ("batch", "v1", "Job"), careless)
    obj = job({P + "fail-non-retriable": "true"}, restart_policy="OnFailure")
    with pytest.raises(engine.ViewMismatch):
        engine.mutate(request_for(obj), Config())
    with pytest.raises(engine.ViewMismatch):
        engine.validate(request_for(obj), Config())


def test_the_check_catches_a_view_that_loses_an_attempt_lookup(monkeypatch):
    def anonymous(obj, config=None):
        seen = view.pod_view(obj, config)
        seen["metadata"]["ownerReferences"] = view._owners(seen["metadata"]["ownerReferences"])
        return seen

    monkeypatch.setitem(registry.VIEWS, ("", "v1", "Pod"), anonymous)
    obj = pod({P + "non-spot-attempts": "1", P + "backoff-limit": "3"}, owner=job_owner())
    attempts = FixedAttempts(3)
    with pytest.raises(engine.ViewMismatch):
        engine.mutate(request_for(obj), Config(), attempts)
