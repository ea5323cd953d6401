"""PyTorchJob: runPolicy.backoffLimit, fail-non-retriable as restartPolicy ExitCode (the
training operator retries exit codes >= 128), env vars in Master and Worker, denials."""

from __future__ import annotations

import copy

import pytest
from conftest import P
from workloads import (
    STRATEGY,
    WORKER_NAME,
    admitted,
    assert_idempotent,
    kubectl_patch,
    mutate,
    pod_template,
    validate,
    validate_schema,
)

from webhook import engine
from webhook.config import parse_config

POLICY = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
    P + "backoff-limit": "3",
    P + "error-propagation": "earliest",
}
ALL_SIGNALS = ",".join(str(code) for code in range(128, 256))


def pytorchjob(
    annotations=None, *, applied=False, restart_policy=None, container="pytorch", **spec
):
    replicas = {}
    for rtype, count in (("Master", 1), ("Worker", 3)):
        replicas[rtype] = {"replicas": count, "template": pod_template(container)}
        if restart_policy:
            replicas[rtype]["restartPolicy"] = restart_policy
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "finetune", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": replicas, **spec},
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    return admitted(manifest, applied=applied)


def test_full_policy():
    verdict, out = mutate(pytorchjob(POLICY))
    assert verdict.allowed, verdict.message
    assert out["spec"]["runPolicy"]["backoffLimit"] == 3
    for rtype in ("Master", "Worker"):
        rspec = out["spec"]["pytorchReplicaSpecs"][rtype]
        assert rspec["restartPolicy"] == "ExitCode"
        assert rspec["template"]["spec"]["containers"][0]["env"] == [WORKER_NAME, STRATEGY]
    assert verdict.warnings == [
        "retry-policy: spec.runPolicy.backoffLimit -> 3 "
        "(annotation retry-policy.dev/backoff-limit)",
        "retry-policy: spec.pytorchReplicaSpecs.{Master,Worker}.restartPolicy -> ExitCode "
        "(fail-non-retriable)",
        "retry-policy: ExitCode also retries exit codes 128-255 outside retriable-exit-codes, "
        "e.g. 139 (SIGSEGV)",
        "retry-policy: error-propagation env vars added to Master containers pytorch",
        "retry-policy: error-propagation env vars added to Worker containers pytorch",
        engine.EXPLAIN_HINT,
    ]


@pytest.mark.parametrize(
    ("codes", "failing"),
    [("128", None), ("127,143", "127"), ("1,2", "1,2"), (ALL_SIGNALS, None)],
)
def test_retriable_codes_must_fit_kubeflows_rule(codes, failing):
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
        "your spec.pytorchReplicaSpecs.Master.restartPolicy: OnFailure does not tell "
        "exit codes apart" in verdict.message
    )


def test_written_exit_code_policy_is_kept():
    verdict, out = mutate(pytorchjob(POLICY, restart_policy="ExitCode"))
    assert verdict.allowed
    assert out["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "ExitCode"
    assert not any("restartPolicy" in w for w in verdict.warnings)


def test_fail_non_retriable_needs_the_pytorch_container():
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
    verdict, _ = mutate(pytorchjob(POLICY, runPolicy={"backoffLimit": 5}))
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
