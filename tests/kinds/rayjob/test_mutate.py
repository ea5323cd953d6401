"""RayJob: spec.backoffLimit within KubeRay's rules, and a denial that says why for
everything a RayJob cannot do (error-propagation included)."""

from __future__ import annotations

import copy

import pytest

from testkit.builders import P
from testkit.kinds import rayjob
from testkit.workloads import (
    assert_idempotent,
    kubectl_patch,
    mutate,
    validate,
    validate_schema,
)
from webhook.admission import engine
from webhook.policy.config import parse_config


def selector_mode(annotations):
    obj = rayjob(annotations, clusterSelector={"ray.io/cluster": "shared"})
    del obj["spec"]["rayClusterSpec"]
    return obj


def test_crd_defaults_are_what_admission_sees():
    # upstream: ray-operator/config/crd/bases/ray.io_rayjobs.yaml (backoffLimit default 0)
    spec = rayjob()["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["submissionMode"] == "K8sJobMode"


def test_backoff_limit():
    verdict, out = mutate(rayjob({P + "backoff-limit": "2"}))
    assert verdict.allowed, verdict.message
    assert out["spec"]["backoffLimit"] == 2
    assert verdict.warnings == [
        "retry-policy: spec.backoffLimit 0 -> 2 (annotation retry-policy.dev/backoff-limit)",
    ]
    assert verdict.summary == engine.change_summary(1)


def test_crd_default_zero_is_not_a_written_value():
    verdict, out = mutate(rayjob({P + "backoff-limit": "2"}))
    assert verdict.allowed and out["spec"]["backoffLimit"] == 2


def test_written_backoff_limit_contradicting_annotation_is_denied():
    verdict, _ = mutate(rayjob({P + "backoff-limit": "2"}, backoffLimit=0, applied=True))
    assert not verdict.allowed
    assert "2 contradicts spec.backoffLimit: 0 in your spec" in verdict.message


def test_written_backoff_limit_beats_admin_default():
    config = parse_config("defaults: {backoff-limit: 4}")
    verdict, out = mutate(rayjob(backoffLimit=1), config)
    assert verdict.allowed and out["spec"]["backoffLimit"] == 1
    verdict, out = mutate(rayjob(), config)
    assert out["spec"]["backoffLimit"] == 4


@pytest.mark.parametrize(("limit", "allowed"), [("0", True), ("1", False)])
def test_backoff_limit_with_cluster_selector(limit, allowed):
    # upstream: ValidateRayJobSpec (ray-operator/controllers/ray/utils/validation.go) refuses
    # BackoffLimit > 0 with ClusterSelector and with InteractiveMode.
    verdict, _ = mutate(selector_mode({P + "backoff-limit": limit}))
    assert verdict.allowed is allowed
    if not allowed:
        assert (
            f"annotation {P}backoff-limit: 1 is not allowed: KubeRay retries a RayJob on a new "
            "RayCluster, which it cannot do with spec.clusterSelector" in verdict.message
        )


def test_backoff_limit_in_interactive_mode_is_denied():
    verdict, _ = mutate(rayjob({P + "backoff-limit": "1"}, submissionMode="InteractiveMode"))
    assert not verdict.allowed
    assert "KubeRay does not retry a RayJob in submissionMode InteractiveMode" in verdict.message


def test_admin_default_backoff_limit_is_skipped_where_kuberay_forbids_it():
    config = parse_config("defaults: {backoff-limit: 3}")
    verdict, out = mutate(selector_mode({}), config)
    assert verdict.allowed
    assert out["spec"]["backoffLimit"] == 0
    assert any(
        "backoff-limit (cluster default) skipped: 3 is not allowed" in w for w in verdict.warnings
    )


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("fail-non-retriable", "true", "it has no podFailurePolicy; KubeRay retries"),
        ("ignore-disruptions", "true", "KubeRay counts every failed RayJob attempt"),
        ("non-spot-attempts", "1", "each retry runs on a new RayCluster"),
        ("on-non-retriable", "fail-index", "a RayJob has no completion indexes"),
        # upstream: Flyte's Ray plugin has no ErrorAggregationStrategy, so propeller reads
        # error.pb alone (NewRemoteFileOutputReaderWithErrorAggregationStrategy in
        # flytepropeller plugin_manager.go), and flytekit would write error-<uuid>.pb.
        ("error-propagation", "earliest", "error-<uuid>.pb instead of error.pb"),
    ],
)
def test_what_a_rayjob_cannot_do_is_denied_with_the_reason(name, value, why):
    verdict, _ = mutate(rayjob({P + name: value, P + "backoff-limit": "1"}))
    assert not verdict.allowed
    assert f"annotation {P}{name}: cannot apply to a RayJob: " in verdict.message
    assert why in verdict.message
    assert validate(rayjob({P + name: value})).message == verdict.message


def test_admin_defaults_a_rayjob_cannot_honour_are_skipped_with_warnings():
    config = parse_config(
        "defaults: {fail-non-retriable: true, ignore-disruptions: true, non-spot-attempts: 1,"
        " backoff-limit: 2, error-propagation: earliest}"
    )
    verdict, out = mutate(rayjob(), config)
    assert verdict.allowed
    assert out["spec"]["backoffLimit"] == 2
    skipped = [w for w in verdict.warnings if "(cluster default) skipped" in w]
    assert len(skipped) == 4
    # The default error-propagation would have hidden the Ray task's errors: never applied.
    cluster = out["spec"]["rayClusterSpec"]
    assert "env" not in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert any("error-propagation (cluster default) skipped" in w for w in skipped)


def test_guard_rail():
    config = parse_config("guardRails: {maxBackoffLimit: 2}")
    verdict, _ = mutate(rayjob({P + "backoff-limit": "3"}), config)
    assert not verdict.allowed and verdict.code == 403


def test_rayjob_without_spec_is_denied():
    obj = rayjob({P + "backoff-limit": "1"})
    del obj["spec"]
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "spec: a RayJob needs a spec" in verdict.message


def test_unannotated_rayjob_is_untouched():
    obj = rayjob()
    verdict, out = mutate(obj)
    assert verdict.patch == [] and out == obj


def test_rayjob_is_idempotent_patch_applies_and_schema_valid(tmp_path):
    obj = rayjob({P + "backoff-limit": "2"}, applied=True)
    once = assert_idempotent(obj)
    verdict, _ = mutate(obj)
    assert kubectl_patch(obj, verdict.patch, tmp_path) == once
    validate_schema(once)
    bad = copy.deepcopy(once)
    bad["spec"]["backoffLimit"] = 2**31
    with pytest.raises(AssertionError, match="int32"):
        validate_schema(bad)
