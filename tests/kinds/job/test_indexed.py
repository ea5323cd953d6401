"""Indexed Jobs with backoffLimitPerIndex: the budget is per index, fail-index, attempts."""

from __future__ import annotations

import json

import pytest

from testkit.builders import P, job, job_owner, pod, stored
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JOB_UID_LABEL, JobRun
from testkit.workloads import (
    FixedAttempts,
    assert_idempotent,
    kubectl_patch,
    mutate,
    validate,
    validate_schema,
)
from webhook.admission import engine
from webhook.kube import jobcontroller
from webhook.kube.defaulting import INT32_MAX
from webhook.kube.failurepolicy import (
    count_disruptions_rule,
    ignore_disruptions_rule,
    non_retriable_rule,
)
from webhook.kube.wellknown import COMPLETION_INDEX_ENV, INDEX_FAILURE_COUNT
from webhook.plan.delays import ATTEMPT, LAST_FAILURE, MAX_ATTEMPTS
from webhook.policy.config import parse_config

INDEXED = {"completionMode": "Indexed", "completions": 8, "parallelism": 4}
PER_INDEX = {**INDEXED, "backoffLimitPerIndex": 2}
FAIL_INDEX = {P + "fail-non-retriable": "true", P + "on-non-retriable": "fail-index"}


def indexed(annotations=None, spec=PER_INDEX, **kw):
    return job(annotations, spec=spec, **kw)


def test_api_default_of_backoff_limit_with_per_index_is_int32_max():
    # The defaulting the written-or-defaulted rule must see through.
    # upstream: SetDefaults_Job (pkg/apis/batch/v1/defaults.go): math.MaxInt32 with
    # backoffLimitPerIndex, else 6.
    assert indexed()["spec"]["backoffLimit"] == INT32_MAX
    assert job(spec=INDEXED)["spec"]["backoffLimit"] == 6


def test_fail_index_rule_with_per_index_budget():
    verdict, out = mutate(indexed({**FAIL_INDEX, P + "ignore-disruptions": "true"}))
    assert verdict.allowed, verdict.message
    assert out["spec"]["podFailurePolicy"]["rules"] == [
        ignore_disruptions_rule(),
        non_retriable_rule([143], "FailIndex", "main"),
    ]
    assert "added podFailurePolicy rule FailIndex on exit codes NotIn [143]" in verdict.warnings[1]
    assert json.loads(out["metadata"]["annotations"][P + "applied"])["onNonRetriable"] == (
        "fail-index"
    )


def test_backoff_limit_maps_to_backoff_limit_per_index():
    obj = indexed({P + "backoff-limit": "2", P + "non-spot-attempts": "1"})
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    assert out["spec"]["backoffLimitPerIndex"] == 2
    # The Job-wide limit keeps its API default: it is not what backoff-limit means here.
    assert out["spec"]["backoffLimit"] == INT32_MAX
    annotations = out["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {P + "backoff-limit": "2", P + "non-spot-attempts": "1"}
    assert verdict.warnings == [
        "retry-policy: the last 1 of 3 attempts of each index will run on non-spot nodes",
    ]
    assert verdict.summary == engine.change_summary(1)


def test_backoff_limit_contradicting_per_index_budget_is_denied():
    verdict, _ = mutate(indexed({P + "backoff-limit": "3"}))
    assert not verdict.allowed
    assert (
        f"annotation {P}backoff-limit: 3 contradicts spec.backoffLimitPerIndex: 2 in your spec"
        in verdict.message
    )


def test_written_per_index_budget_beats_admin_default():
    config = parse_config("defaults: {backoff-limit: 5}")
    verdict, out = mutate(indexed(), config)
    assert verdict.allowed
    assert out["spec"]["backoffLimitPerIndex"] == 2
    assert out["spec"]["backoffLimit"] == INT32_MAX
    assert not any("backoffLimit" in w for w in verdict.warnings)


@pytest.mark.parametrize(("per_index", "allowed"), [(3, True), (4, False)])
def test_guard_rail_applies_to_the_per_index_budget_only(per_index, allowed):
    config = parse_config("guardRails: {maxBackoffLimit: 3}")
    obj = indexed(
        {P + "fail-non-retriable": "true"}, spec={**INDEXED, "backoffLimitPerIndex": per_index}
    )
    verdict, out = mutate(obj, config)
    assert verdict.allowed is allowed, verdict.message
    if allowed:
        # The defaulted Job-wide 2147483647 is not "a value nobody wrote" to lower.
        assert out["spec"]["backoffLimit"] == INT32_MAX
    else:
        assert "spec.backoffLimitPerIndex (your spec spec.backoffLimitPerIndex): 4 is above" in (
            verdict.message
        )
        assert verdict.code == 403


def test_fail_index_without_per_index_budget_is_denied():
    verdict, _ = mutate(job(FAIL_INDEX, spec=INDEXED))
    assert not verdict.allowed
    assert f"annotation {P}on-non-retriable: fail-index needs spec.backoffLimitPerIndex" in (
        verdict.message
    )


def test_fail_index_admin_default_falls_back_to_fail_job():
    config = parse_config("defaults: {fail-non-retriable: true, on-non-retriable: fail-index}")
    verdict, out = mutate(job(), config)
    assert verdict.allowed
    assert out["spec"]["podFailurePolicy"]["rules"] == [
        count_disruptions_rule(),
        non_retriable_rule([143], "FailJob", "main"),
    ]
    assert any("on-non-retriable (cluster default) skipped" in w for w in verdict.warnings)


def test_on_non_retriable_grammar():
    verdict, _ = mutate(indexed({**FAIL_INDEX, P + "on-non-retriable": "fail-pod"}))
    assert not verdict.allowed
    assert "'fail-pod' is not valid; accepted: fail-job, or fail-index" in verdict.message


def test_on_non_retriable_alone_changes_nothing_and_says_so():
    verdict, out = mutate(indexed({P + "on-non-retriable": "fail-index"}))
    assert verdict.allowed
    assert "podFailurePolicy" not in out["spec"]
    assert verdict.warnings == [
        "retry-policy: on-non-retriable has no effect without fail-non-retriable or fail-categories"
    ]


def test_non_spot_attempts_above_the_per_index_budget_is_denied():
    verdict, _ = mutate(indexed({P + "non-spot-attempts": "4"}))
    assert not verdict.allowed
    assert (
        "4 is more than the 3 attempts each index of this Job has (backoffLimitPerIndex 2 + 1); "
        "accepted: 0 to 3" in verdict.message
    )


def test_user_fail_index_rule_on_a_retriable_code_contradicts():
    user = {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [143]}}
    obj = indexed(FAIL_INDEX, spec={**PER_INDEX, "podFailurePolicy": {"rules": [user]}})
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "rules[0] (FailIndex) matches a pod whose container main exited 143" in verdict.message


# --- pods of an Indexed Job: the attempt is the index's failure count -----------------


def indexed_pod(failures, attempts=None):
    template = mutate(indexed({P + "non-spot-attempts": "1"}))[1]["spec"]["template"]
    obj = pod(template["metadata"]["annotations"], owner=job_owner())
    jobcontroller.index_pod(obj, "train", 5, failures)
    return mutate(obj, attempts=attempts or FixedAttempts(0))


@pytest.mark.parametrize(("failures", "non_spot"), [(0, False), (1, False), (2, True)])
def test_pod_attempt_boundaries_per_index(failures, non_spot):
    cache = FixedAttempts(0)
    verdict, out = indexed_pod(failures, cache)
    assert verdict.allowed, verdict.message
    assert ("affinity" in out["spec"]) is non_spot
    # The index's own count wins: the Job-wide failure count is never looked up.
    assert cache.calls == []
    if non_spot:
        assert verdict.warnings[0].startswith(
            "retry-policy: attempt 3 of 3 (2 failures so far, from annotation "
            "batch.kubernetes.io/job-index-failure-count)"
        )


def test_indexed_job_is_idempotent_patch_applies_and_schema_valid(tmp_path):
    obj = indexed({**FAIL_INDEX, P + "ignore-disruptions": "true", P + "non-spot-attempts": "1"})
    once = assert_idempotent(obj)
    verdict, _ = mutate(obj)
    assert kubectl_patch(obj, verdict.patch, tmp_path) == once
    validate_schema(once)
    validate_schema(once, "1.33")


def test_validation_denies_a_fail_index_job_the_mutating_webhook_missed():
    obj = indexed(FAIL_INDEX)
    verdict = validate(obj)
    assert not verdict.allowed
    assert "FailIndex on exit codes NotIn [143]" in verdict.message


# --- an Indexed Job's pod as the Job controller makes it, admitted ------------------------

ATTEMPT_ENV = {P + "attempt-env": "true", P + "non-spot-attempts": "1"}


def made_pod(index: int = 5, failures: int = 2) -> dict:
    """The pod of ``index`` the Job controller makes from an admitted, stored Indexed Job."""
    verdict, admitted = mutate(indexed(ATTEMPT_ENV))
    assert verdict.allowed, verdict.message
    return jobcontroller.pod_from_template(stored(admitted, uid="u-1"), index, failures)


def test_an_indexed_jobs_pod_keeps_its_index_env_and_hostname_when_admitted(tmp_path):
    # upstream: manageJob (pkg/controller/job/job_controller.go): the hostname and
    # generateName of an index; addCompletionIndexEnvVariable, addCompletionIndexLabel
    # (pkg/controller/job/indexed_job_utils.go).
    made = made_pod()
    index_env = made["spec"]["containers"][0]["env"]
    assert [e["name"] for e in index_env] == [COMPLETION_INDEX_ENV]
    verdict, out = mutate(made)
    assert verdict.allowed, verdict.message
    env = out["spec"]["containers"][0]["env"]
    assert env[0] == index_env[0]  # its valueFrom untouched, still first
    assert {e["name"]: e.get("value") for e in env[1:]} == {
        ATTEMPT: "2",
        MAX_ATTEMPTS: "3",
        LAST_FAILURE: "",
    }
    assert "affinity" in out["spec"]  # the last attempt of the index: non-spot
    assert out["spec"]["hostname"] == "train-5"
    assert out["metadata"]["generateName"] == "train-5-"
    assert out["metadata"]["labels"] == made["metadata"]["labels"]
    assert kubectl_patch(made, verdict.patch, tmp_path) == out
    once = assert_idempotent(made)
    assert once == out
    validate_schema(once)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2", 2),  # valid value
        (str(INT32_MAX), INT32_MAX),  # valid maxint32 value
        (str(INT32_MAX + 1), 0),  # too large value
        ("-1", 0),  # negative value
        ("xyz", 0),  # invalid int value
    ],
)
def test_TestGetIndexFailureCount(value, expected):
    # upstream: TestGetIndexFailureCount, getIndexFailureCount / parseInt32
    # (pkg/controller/job/indexed_job_utils.go): a value that is not an int32 of 0 or more
    # is read as 0 failures of the index, not as no annotation.
    made = made_pod(index=5, failures=2)
    made["metadata"]["annotations"][INDEX_FAILURE_COUNT] = value
    assert jobcontroller.index_failure_count(made["metadata"]["annotations"]) == expected
    if expected == INT32_MAX:
        return
    verdict, out = mutate(made, attempts=FixedAttempts(1))
    assert verdict.allowed, verdict.message
    env = {e["name"]: e.get("value") for e in out["spec"]["containers"][0]["env"][1:]}
    # The index's count, never the Job's (1): attempt 0 past a malformed value.
    assert env[ATTEMPT] == str(expected)
    assert ("affinity" in out["spec"]) is (expected >= 2)


def test_TestGetIndexFailureCount_no_annotation_is_no_per_index_count():
    # upstream: TestGetIndexFailureCount "no annotation" reads 0; the controller writes
    # the annotation on every pod of an index with a per-index budget
    # (addIndexFailureCountAnnotation), so a pod without it has none: its attempt is the
    # Job's count.
    made = made_pod(index=5, failures=2)
    del made["metadata"]["annotations"][INDEX_FAILURE_COUNT]
    assert jobcontroller.index_failure_count(made["metadata"]["annotations"]) is None


def test_the_played_job_controller_makes_an_indexs_pod_as_pod_from_template():
    # upstream: manageJob (pkg/controller/job/job_controller.go); the name generated from
    # generateName (names.SimpleNameGenerator, k8s.io/apiserver pkg/storage/names).
    _, admitted = mutate(indexed(ATTEMPT_ENV))
    run = JobRun.store(FakeAPI(), admitted, uid="u-1")
    made = run.new_pod(3, 1)
    expected = jobcontroller.pod_from_template(run.job, 3, 1)
    meta = made["metadata"]
    assert meta["generateName"] == "train-3-"
    assert meta["name"].startswith("train-3-") and len(meta["name"]) == len("train-3-") + 5
    assert meta["labels"] == {
        **expected["metadata"]["labels"],
        JOB_UID_LABEL: "u-1",
        "job-name": "train",
    }
    assert meta["annotations"] == expected["metadata"]["annotations"]
    assert {k: v for k, v in made["spec"].items() if k != "nodeName"} == expected["spec"]
