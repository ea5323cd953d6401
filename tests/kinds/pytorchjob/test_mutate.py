"""PyTorchJob: runPolicy.backoffLimit, fail-non-retriable as restartPolicy ExitCode (the
training operator retries exit codes >= 128, and never enforces a backoffLimit >= 1 then),
env vars in Master and Worker, denials."""

from __future__ import annotations

import copy
import json

import pytest

from testkit.builders import P
from testkit.kinds import pytorchjob
from testkit.workloads import (
    STRATEGY,
    WORKER_NAME,
    assert_idempotent,
    kubectl_patch,
    mutate,
    validate,
    validate_schema,
)
from webhook.admission import engine
from webhook.kinds.pytorchjob.mutate import PEERS_EXIT_CODE
from webhook.kinds.workload import peers_note
from webhook.policy.config import parse_config

POLICY = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
    P + "error-propagation": "earliest",
}
ALL_SIGNALS = ",".join(str(code) for code in range(128, 256))


def test_full_policy():
    verdict, out = mutate(pytorchjob(POLICY))
    assert verdict.allowed, verdict.message
    assert "backoffLimit" not in out["spec"].get("runPolicy", {})
    for rtype in ("Master", "Worker"):
        rspec = out["spec"]["pytorchReplicaSpecs"][rtype]
        assert rspec["restartPolicy"] == "ExitCode"
        assert rspec["template"]["spec"]["containers"][0]["env"] == [WORKER_NAME, STRATEGY]
    assert verdict.warnings == [
        "retry-policy: spec.pytorchReplicaSpecs.{Master,Worker}.restartPolicy -> ExitCode "
        "(fail-non-retriable)",
        "retry-policy: ExitCode also retries exit codes 128-255 outside retriable-exit-codes, "
        "e.g. 139 (SIGSEGV)",
        "retry-policy: error-propagation env vars added to Master containers pytorch",
        "retry-policy: error-propagation env vars added to Worker containers pytorch",
        # What error-propagation assumes, said with the change (not a warning).
        "retry-policy: error-propagation needs Flyte's PyTorch plugin with "
        "enable-distributed-error-aggregation: true (propeller's k8s plugin config); without "
        "it the task's error is lost",
        "retry-policy: runPolicy.backoffLimit is not set: failed pods are retried without "
        "limit; bound the run with runPolicy.activeDeadlineSeconds",
        # A master and 3 workers run together (``note_peers``), with the advice ExitCode
        # takes: peer-disruptions is denied on a PyTorchJob.
        peers_note(4, PEERS_EXIT_CODE),
    ]
    assert verdict.summary == engine.change_summary(5)
    # No podFailurePolicy, so no Count rule on DisruptionTarget to record.
    assert json.loads(out["metadata"]["annotations"][P + "applied"]) == {
        "errorPropagation": "Earliest",
        "failNonRetriable": [137, 143],
        "v": 2,
    }


# upstream (training-operator release-1.9): ReconcileJobs in pkg/controller.v1/common/job.go
# enforces runPolicy.backoffLimit B only as NumRequeues + 1 > B, and the PyTorchJob
# controller's work queue is a FakeWorkQueue whose NumRequeues is 0 (so only B = 0 holds),
# or through PastBackoffLimit (pkg/core/job.go), which sums restartCount of running pods:
# always 0 under ExitCode, whose pods run with restartPolicy Never (SetRestartPolicy) and
# are deleted and recreated on a retryable exit (IsRetryableExitCode, exit code >= 128).
@pytest.mark.parametrize(
    ("annotations", "run_policy", "config_text"),
    [
        ({P + "backoff-limit": "3"}, None, ""),
        ({}, {"backoffLimit": 3}, ""),
        ({}, None, "defaults: {backoff-limit: 3}"),
        ({P + "backoff-limit": "1"}, {"activeDeadlineSeconds": 600}, ""),
    ],
)
def test_fail_non_retriable_with_a_backoff_limit_is_denied(annotations, run_policy, config_text):
    obj = pytorchjob({P + "fail-non-retriable": "true", **annotations})
    if run_policy:
        obj["spec"].setdefault("runPolicy", {}).update(run_policy)
    verdict, _ = mutate(obj, parse_config(config_text))
    assert not verdict.allowed
    assert verdict.message.startswith(
        f"retry-policy: annotation {P}fail-non-retriable: it needs restartPolicy ExitCode, "
        "under which the training operator never enforces runPolicy.backoffLimit"
    )
    assert "retriable failures would be retried forever (kubeflow/trainer#2045)" in (
        verdict.message
    )
    assert "accepted: backoff-limit 0" in verdict.message


def test_a_default_fail_non_retriable_never_removes_a_cap():
    config = parse_config("defaults: {fail-non-retriable: true}")
    verdict, out = mutate(pytorchjob({P + "backoff-limit": "3"}), config)
    assert verdict.allowed, verdict.message
    assert out["spec"]["runPolicy"]["backoffLimit"] == 3
    for rspec in out["spec"]["pytorchReplicaSpecs"].values():
        assert "restartPolicy" not in rspec  # the operator's OnFailure, which enforces 3
    assert any(
        w.startswith("retry-policy: fail-non-retriable (cluster default) skipped: it needs")
        for w in verdict.warnings
    ), verdict.warnings


def test_fail_non_retriable_with_backoff_limit_0_fails_at_the_first_failure():
    # upstream: ReconcileJobs: NumRequeues (0) + 1 > 0 fails the job at its first failed pod.
    verdict, out = mutate(pytorchjob({P + "fail-non-retriable": "true", P + "backoff-limit": "0"}))
    assert verdict.allowed, verdict.message
    assert out["spec"]["runPolicy"]["backoffLimit"] == 0
    assert out["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "ExitCode"
    # Nothing is retried, so no warning says signals are.
    assert not any("also retries" in w or "without limit" in w for w in verdict.warnings)


def test_a_backoff_limit_beside_a_written_exit_code_is_denied_or_skipped():
    verdict, _ = mutate(pytorchjob({P + "backoff-limit": "2"}, restart_policy="ExitCode"))
    assert not verdict.allowed
    assert verdict.message.startswith(
        f"retry-policy: annotation {P}backoff-limit: 2 would not be enforced: your "
        "spec.pytorchReplicaSpecs.Master.restartPolicy, spec.pytorchReplicaSpecs.Worker."
        "restartPolicy: ExitCode replaces failed pods"
    )
    config = parse_config("defaults: {backoff-limit: 2}")
    verdict, out = mutate(pytorchjob(restart_policy="ExitCode"), config)
    assert verdict.allowed
    assert "backoffLimit" not in out["spec"].get("runPolicy", {})
    assert any(
        "backoff-limit (cluster default) skipped: 2 would not" in w for w in verdict.warnings
    )
    # 0 is enforced under ExitCode: accepted.
    verdict, out = mutate(pytorchjob({P + "backoff-limit": "0"}, restart_policy="ExitCode"))
    assert verdict.allowed and out["spec"]["runPolicy"]["backoffLimit"] == 0


def test_error_propagation_env_in_every_container_keeps_user_values():
    obj = pytorchjob({P + "error-propagation": "earliest"})
    pod_spec = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod_spec["containers"] += [
        {
            "name": "b",
            "image": "x:1",
            "env": [{"name": "FLYTE_INTERNAL_DIST_ERROR_STRATEGY", "value": "Mine"}],
        },
        # What Flyte's PyTorch plugin writes itself (the short names).
        {"name": "c", "image": "x:1", "env": [{"name": "_F_WN", "value": "custom"}]},
    ]
    pod_spec["initContainers"] = [{"name": "init", "image": "x:1"}]
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    pod_spec = out["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    env = {c["name"]: c.get("env", []) for c in pod_spec["containers"] + pod_spec["initContainers"]}
    assert env["pytorch"] == [WORKER_NAME, STRATEGY]
    assert env["init"] == [WORKER_NAME, STRATEGY]
    assert env["b"] == [
        {"name": "FLYTE_INTERNAL_DIST_ERROR_STRATEGY", "value": "Mine"},
        WORKER_NAME,
    ]
    assert env["c"] == [{"name": "_F_WN", "value": "custom"}, STRATEGY]


@pytest.mark.parametrize(
    ("codes", "failing"),
    [("128", None), ("127,143", "127"), ("1,2", "1,2"), (ALL_SIGNALS, None)],
)
def test_retriable_codes_must_fit_kubeflows_rule(codes, failing):
    # upstream: IsRetryableExitCode (pkg/util/train/train_util.go): exit code >= 128.
    verdict, out = mutate(
        pytorchjob({P + "fail-non-retriable": "true", P + "retriable-exit-codes": codes})
    )
    assert verdict.allowed is (failing is None), verdict.message
    if failing is None:
        assert out["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"
        # Only when every signal is retriable does ExitCode do exactly what was asked.
        assert any("also retries" in w for w in verdict.warnings) is (codes != ALL_SIGNALS)
    else:
        assert verdict.message.startswith(
            f"retry-policy: annotation {P}fail-non-retriable: on a PyTorchJob, the training "
            "operator's restartPolicy ExitCode retries exit codes 128-255 and fails on 1-127"
        )
        assert f"({failing} would fail the job)" in verdict.message


def test_written_restart_policy_that_does_not_tell_codes_apart_is_denied():
    verdict, _ = mutate(pytorchjob(POLICY, restart_policy="OnFailure"))
    assert not verdict.allowed
    assert (
        "your spec.pytorchReplicaSpecs.Master.restartPolicy, "
        "spec.pytorchReplicaSpecs.Worker.restartPolicy: OnFailure does not tell "
        "exit codes apart; use ExitCode or remove it" in verdict.message
    )
    assert len(verdict.problems) == 1  # the replicas that share the fix, in one problem


def test_written_exit_code_policy_is_kept():
    verdict, out = mutate(pytorchjob(POLICY, restart_policy="ExitCode"))
    assert verdict.allowed
    assert out["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"
    assert not any("restartPolicy" in w for w in verdict.warnings)


def test_fail_non_retriable_needs_the_pytorch_container():
    # upstream: ReconcilePods (pkg/controller.v1/common/pod.go) reads the exit code of the
    # container GetDefaultContainerName names, PyTorchJobDefaultContainerName "pytorch".
    verdict, _ = mutate(pytorchjob(POLICY, container="trainer"))
    assert not verdict.allowed
    assert (
        "reads the exit code of the container named pytorch, and spec.pytorchReplicaSpecs.Master"
        in (verdict.message)
    )


def test_admin_default_that_does_not_fit_is_skipped_and_nothing_half_done():
    config = parse_config("defaults: {fail-non-retriable: true}")
    obj = pytorchjob()
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    verdict, out = mutate(obj, config)
    assert verdict.allowed
    assert "restartPolicy" not in out["spec"]["pytorchReplicaSpecs"]["Master"]
    assert any("fail-non-retriable (cluster default) skipped" in w for w in verdict.warnings)


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("ignore-disruptions", "true", "counts every failed pod against runPolicy.backoffLimit"),
        ("non-spot-attempts", "1", "its pods carry no attempt number"),
        ("on-non-retriable", "fail-index", "a PyTorchJob has no completion indexes"),
    ],
)
def test_what_a_pytorchjob_cannot_do_is_denied_with_the_reason(name, value, why):
    verdict, _ = mutate(pytorchjob({P + name: value}))
    assert not verdict.allowed
    assert f"annotation {P}{name}: cannot apply to a PyTorchJob: " in verdict.message
    assert why in verdict.message


def test_written_backoff_limit_contradicting_annotation_is_denied():
    verdict, _ = mutate(pytorchjob({P + "backoff-limit": "3"}, runPolicy={"backoffLimit": 5}))
    assert not verdict.allowed
    assert "3 contradicts spec.runPolicy.backoffLimit: 5 in your spec" in verdict.message


def test_backoff_limit_keeps_the_rest_of_run_policy():
    verdict, out = mutate(
        pytorchjob({P + "backoff-limit": "2"}, runPolicy={"cleanPodPolicy": "None"})
    )
    assert verdict.allowed
    assert out["spec"]["runPolicy"] == {
        "cleanPodPolicy": "None",
        "suspend": False,
        "backoffLimit": 2,
    }


def test_replica_specs_are_required():
    obj = pytorchjob(POLICY)
    obj["spec"]["pytorchReplicaSpecs"] = {}
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "spec.pytorchReplicaSpecs: a PyTorchJob needs replica specs" in verdict.message


def test_other_kubeflow_kinds_pass_through():
    obj = pytorchjob(POLICY)
    obj["kind"] = "TFJob"
    verdict, out = mutate(obj)
    assert verdict.allowed and verdict.patch == [] and out == obj
    assert validate(obj).allowed


def test_pytorchjob_is_idempotent_patch_applies_and_schema_valid(tmp_path):
    obj = pytorchjob(POLICY, applied=True)
    once = assert_idempotent(obj)
    verdict, _ = mutate(obj)
    assert kubectl_patch(obj, verdict.patch, tmp_path) == once
    validate_schema(once)
    bad = copy.deepcopy(once)
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["restartPolicy"] = 3
    with pytest.raises(Exception, match="restartPolicy"):
        validate_schema(bad)
