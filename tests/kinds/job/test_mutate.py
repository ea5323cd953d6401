"""batch/v1 Job: each annotation, each denial, defaults precedence, idempotence."""

from __future__ import annotations

import copy
import json

import pytest

from testkit.builders import FULL, P, apply, job, leaves, review
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.kube.failurepolicy import (
    count_disruptions_rule,
    ignore_disruptions_rule,
    non_retriable_rule,
)
from webhook.plan.record import rule_id
from webhook.policy.config import Config, parse_config


def mutate(obj, config=None, operation="CREATE", old=None):
    request = admission.decode(json.dumps(review(obj, operation=operation, old=old)))
    verdict = engine.mutate(request, config or Config())
    return verdict, apply(obj, verdict.patch)


def validate(obj, config=None, operation="CREATE", old=None):
    request = admission.decode(json.dumps(review(obj, operation=operation, old=old)))
    return engine.validate(request, config or Config())


def rules(obj):
    return obj["spec"].get("podFailurePolicy", {}).get("rules", [])


def test_unannotated_job_is_untouched():
    obj = job()
    verdict, out = mutate(obj)
    assert verdict.allowed and verdict.patch == [] and verdict.warnings == []
    assert out == obj


def test_fail_non_retriable_adds_failjob_rule_with_default_codes():
    verdict, out = mutate(job({P + "fail-non-retriable": "true"}))
    assert verdict.allowed
    assert rules(out) == [
        {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [143]},
        },
    ]
    assert out["spec"]["podReplacementPolicy"] == "Failed"
    assert any("FailJob on exit codes NotIn [143] in main" in w for w in verdict.warnings)


def test_retriable_exit_codes_are_sorted_and_deduplicated():
    _, out = mutate(
        job({P + "fail-non-retriable": "true", P + "retriable-exit-codes": "143,137,143"})
    )
    assert rules(out)[1]["onExitCodes"]["values"] == [137, 143]


def test_fail_non_retriable_false_adds_nothing():
    _verdict, out = mutate(job({P + "fail-non-retriable": "false"}))
    assert "podFailurePolicy" not in out["spec"]


def test_backoff_limit_sets_spec():
    verdict, out = mutate(job({P + "backoff-limit": "2"}))
    assert out["spec"]["backoffLimit"] == 2
    assert verdict.warnings[0] == (
        "retry-policy: spec.backoffLimit 6 -> 2 (annotation retry-policy.dev/backoff-limit)"
    )


def test_ignore_disruptions_rule_comes_before_exit_code_rule():
    _, out = mutate(job({P + "fail-non-retriable": "true", P + "ignore-disruptions": "true"}))
    assert rules(out) == [ignore_disruptions_rule(), non_retriable_rule([143], "FailJob", "main")]


def test_error_propagation_is_denied_on_a_job_and_a_default_of_it_skipped():
    # upstream: _build_error_file_name in flytekit/bin/entrypoint.py names the error file
    # error-<uuid>.pb once FLYTE_INTERNAL_DIST_ERROR_STRATEGY (or _F_DES) is set, and only
    # the PyTorch plugin's earliest-file reader (newEarliestFileErrorReader in flyteplugins
    # ioutils/remote_file_output_reader.go) lists those; no Flyte plugin runs a Job.
    verdict, _ = mutate(job({P + "error-propagation": "earliest"}))
    assert not verdict.allowed
    assert "annotation retry-policy.dev/error-propagation: cannot apply to a Job" in (
        verdict.message
    )
    assert "error-<uuid>.pb instead of error.pb" in verdict.message
    config = parse_config("defaults: {error-propagation: earliest}\n")
    obj = job({P + "backoff-limit": "2"})
    verdict, out = mutate(obj, config)
    assert verdict.allowed
    assert "env" not in out["spec"]["template"]["spec"]["containers"][0]
    assert any(
        w.startswith("retry-policy: error-propagation (cluster default) skipped: cannot apply")
        for w in verdict.warnings
    ), verdict.warnings
    assert "errorPropagation" not in json.loads(out["metadata"]["annotations"][P + "applied"])


def test_non_spot_attempts_copies_policy_to_pod_template():
    verdict, out = mutate(job({P + "non-spot-attempts": "1", P + "backoff-limit": "3"}))
    annotations = out["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {P + "backoff-limit": "3", P + "non-spot-attempts": "1"}
    assert "the last 1 of 4 attempts will run on non-spot nodes" in verdict.warnings[-1]
    assert verdict.summary == engine.change_summary(verdict.changed)


def test_non_spot_attempts_uses_kubernetes_default_backoff():
    _, out = mutate(job({P + "non-spot-attempts": "2"}))
    annotations = out["spec"]["template"]["metadata"]["annotations"]
    assert annotations[P + "backoff-limit"] == "6"
    assert out["spec"]["backoffLimit"] == 6


def test_applied_record():
    _, out = mutate(
        job(
            {
                P + "fail-non-retriable": "true",
                P + "backoff-limit": "3",
                P + "ignore-disruptions": "true",
                P + "non-spot-attempts": "1",
            }
        )
    )
    ignore, failing = out["spec"]["podFailurePolicy"]["rules"]
    # The record keeps which annotation wrote which rule (their ids), and its format.
    assert json.loads(out["metadata"]["annotations"][P + "applied"]) == {
        "backoffLimit": 3,
        "failNonRetriable": [143],
        "ignoreDisruptions": True,
        "nonSpotAttempts": 1,
        "origins": {
            "fail-non-retriable": rule_id(failing),
            "ignore-disruptions": rule_id(ignore),
        },
        "v": 2,
    }


def test_user_rules_first_ours_after_without_duplicates():
    user_rules = [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [42]}},
        # The same rule as ours, written by the user with the values in another order
        # (invalid for the API, but still "the same rule": it must not be added twice).
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]
    obj = job(
        {P + "fail-non-retriable": "true", P + "ignore-disruptions": "true"},
        spec={"podFailurePolicy": {"rules": user_rules}},
    )
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    assert rules(out) == [
        *user_rules[:1],
        {**user_rules[1], "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        non_retriable_rule([143], "FailJob", "main"),
    ]


def test_merged_policy_over_twenty_rules_is_denied():
    user_rules = [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [i]}} for i in range(1, 20)
    ]
    obj = job(
        {P + "fail-non-retriable": "true", P + "ignore-disruptions": "true"},
        spec={"podFailurePolicy": {"rules": user_rules}},
    )
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert (
        "annotation retry-policy.dev/ignore-disruptions and annotation "
        "retry-policy.dev/fail-non-retriable: spec.podFailurePolicy would have 21 rules "
        "(19 yours, 2 added)"
    ) in verdict.message
    assert "Kubernetes allows at most 20" in verdict.message
    assert verdict.problems[0].reason == "too-many-rules"
    assert verdict.code == 422


@pytest.mark.parametrize("annotation", ["fail-non-retriable", "ignore-disruptions"])
def test_pod_failure_policy_needs_restart_policy_never(annotation):
    verdict, _ = mutate(job({P + annotation: "true"}, restart_policy="OnFailure"))
    assert not verdict.allowed
    assert f"annotation {P}{annotation}" in verdict.message
    assert "restartPolicy is OnFailure" in verdict.message
    assert "needs a podFailurePolicy, which Kubernetes allows only under Never" in verdict.message
    assert "accepted: spec.template.spec.restartPolicy: Never" in verdict.message


def test_explicit_terminating_or_failed_contradicts():
    obj = job(
        {P + "fail-non-retriable": "true"},
        spec={"podReplacementPolicy": "TerminatingOrFailed"},
        applied=True,
    )
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "podReplacementPolicy: TerminatingOrFailed is not allowed" in verdict.message


def test_non_spot_attempts_at_most_all_attempts():
    verdict, _ = mutate(job({P + "non-spot-attempts": "5", P + "backoff-limit": "3"}))
    assert not verdict.allowed
    assert "5 is more than the 4 attempts" in verdict.message
    assert "accepted: 0 to 4" in verdict.message
    verdict, _out = mutate(job({P + "non-spot-attempts": "4", P + "backoff-limit": "3"}))
    assert verdict.allowed


def test_non_spot_attempts_with_template_pinned_to_spot():
    obj = job({P + "non-spot-attempts": "1"})
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"cloud.google.com/gke-spot": "true"}
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "requires spot nodes (nodeSelector cloud.google.com/gke-spot=true)" in verdict.message


def test_backoff_limit_above_guard_rail_is_forbidden():
    config = parse_config("guardRails: {maxBackoffLimit: 5}")
    verdict, _ = mutate(job({P + "backoff-limit": "9"}), config)
    assert not verdict.allowed
    assert verdict.code == 403
    assert f"annotation {P}backoff-limit: 9 is above this cluster's limit; accepted: 0 to 5" in (
        verdict.message
    )


def test_explicit_spec_above_guard_rail_is_forbidden():
    config = parse_config("guardRails: {maxBackoffLimit: 5}")
    verdict, _ = mutate(job(spec={"backoffLimit": 9}, applied=True), config)
    assert not verdict.allowed
    assert "spec.backoffLimit (your spec spec.backoffLimit): 9 is above" in verdict.message


def test_defaulted_backoff_limit_is_lowered_to_guard_rail():
    config = parse_config("guardRails: {maxBackoffLimit: 3}")
    verdict, out = mutate(job(), config)
    assert verdict.allowed
    assert out["spec"]["backoffLimit"] == 3
    assert "guardRails.maxBackoffLimit" in verdict.warnings[0]


def test_explicit_spec_contradicting_annotation_is_denied():
    obj = job({P + "backoff-limit": "2"}, spec={"backoffLimit": 4}, applied=True)
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "2 contradicts spec.backoffLimit: 4 in your spec" in verdict.message


def test_written_six_is_explicit_when_last_applied_says_so():
    obj = job({P + "backoff-limit": "2"}, spec={"backoffLimit": 6}, applied=True)
    verdict, _ = mutate(obj)
    assert not verdict.allowed


def test_defaulted_six_is_not_explicit():
    # No last-applied record: 6 equals the API default, so it is treated as unset.
    obj = job({P + "backoff-limit": "2"}, spec={"backoffLimit": 6})
    verdict, out = mutate(obj)
    assert verdict.allowed and out["spec"]["backoffLimit"] == 2


def test_non_default_without_record_is_explicit():
    obj = job({P + "backoff-limit": "2"}, spec={"backoffLimit": 4})
    verdict, _ = mutate(obj)
    assert not verdict.allowed


def test_server_side_apply_managed_fields_tell_intent():
    obj = job({P + "backoff-limit": "2"}, spec={"backoffLimit": 6})
    obj["metadata"]["managedFields"] = [
        {
            "manager": "kubectl",
            "operation": "Apply",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:backoffLimit": {}}},
        }
    ]
    verdict, _ = mutate(obj)
    assert not verdict.allowed


CONFIG = """
defaults:
  backoff-limit: 4
  fail-non-retriable: true
namespaces:
  research:
    defaults:
      backoff-limit: 8
"""


@pytest.mark.parametrize(
    ("annotations", "namespace", "spec", "applied", "expected"),
    [
        ({}, "ml", {}, False, 4),  # cluster default
        ({}, "research", {}, False, 8),  # namespace override beats cluster default
        ({P + "backoff-limit": "1"}, "research", {}, False, 1),  # annotation beats both
        ({}, "research", {"backoffLimit": 2}, True, 2),  # the user's own spec beats defaults
        ({}, "research", {"backoffLimit": 6}, False, 8),  # a defaulted 6 does not
    ],
)
def test_defaults_precedence(annotations, namespace, spec, applied, expected):
    config = parse_config(CONFIG)
    obj = job(annotations, namespace=namespace, spec=spec, applied=applied)
    verdict, out = mutate(obj, config)
    assert verdict.allowed, verdict.message
    assert out["spec"]["backoffLimit"] == expected
    assert rules(out) == [count_disruptions_rule(), non_retriable_rule([143], "FailJob", "main")]


def test_default_conflict_is_skipped_with_warning_not_denied():
    config = parse_config("defaults: {fail-non-retriable: true}")
    verdict, out = mutate(job(restart_policy="OnFailure"), config)
    assert verdict.allowed
    assert "podFailurePolicy" not in out["spec"]
    assert any("fail-non-retriable (cluster default) skipped" in w for w in verdict.warnings)


def test_user_rule_failing_a_retriable_code_contradicts():
    user = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [143]}}
    obj = job({P + "fail-non-retriable": "true"}, spec={"podFailurePolicy": {"rules": [user]}})
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert (
        "your spec.podFailurePolicy.rules[0] (FailJob) matches a pod whose container main "
        "exited 143, which retriable-exit-codes (143) says to retry"
    ) in verdict.message


def test_user_rule_counting_disruptions_contradicts():
    user = {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    obj = job({P + "ignore-disruptions": "true"}, spec={"podFailurePolicy": {"rules": [user]}})
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert (
        "rules[0] (Count) matches a disrupted pod first (condition DisruptionTarget): "
        "disruptions would not be ignored"
    ) in verdict.message


def test_template_attempt_annotation_is_denied():
    verdict, _ = mutate(job({P + "backoff-limit": "1"}, template_annotations={P + "attempt": "0"}))
    assert not verdict.allowed
    assert "set attempt on individual Pods only" in verdict.message


def test_template_annotation_contradicting_resolved_value():
    obj = job(
        {P + "backoff-limit": "3", P + "non-spot-attempts": "1"},
        template_annotations={P + "backoff-limit": "5"},
    )
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "'5' contradicts the Job's resolved value '3'" in verdict.message


def test_all_problems_in_one_denial():
    obj = job(
        {P + "backof-limit": "3", P + "non-spot-attempts": "x", P + "fail-non-retriable": "true"},
        restart_policy="OnFailure",
    )
    verdict, _ = mutate(obj)
    assert verdict.message.startswith("retry-policy: 3 problems: (1)")


@pytest.mark.parametrize(
    "obj",
    [
        job(FULL),
        job(FULL, applied=True),
        job({P + "backoff-limit": "0"}),
        job(spec={"backoffLimit": 6}),
        job(
            {P + "ignore-disruptions": "true"},
            spec={
                "podFailurePolicy": {
                    "rules": [{"action": "Count", "onExitCodes": {"operator": "In", "values": [3]}}]
                }
            },
        ),
    ],
)
@pytest.mark.parametrize("config_text", ["", CONFIG, "guardRails: {maxBackoffLimit: 3}"])
def test_mutation_is_idempotent(obj, config_text):
    config = parse_config(config_text)
    first, once = mutate(obj, config)
    assert first.allowed, first.message
    second, twice = mutate(once, config)
    assert second.allowed
    assert second.patch == []
    assert second.warnings == []
    assert twice == once


def test_update_is_not_mutated():
    obj = job(FULL)
    verdict, out = mutate(obj, operation="UPDATE", old=copy.deepcopy(obj))
    assert verdict.patch == [] and out == obj


def test_mutation_keeps_every_user_field():
    obj = job(FULL, applied=True)
    obj["spec"]["template"]["spec"]["affinity"] = {"podAffinity": {}}
    obj["spec"]["activeDeadlineSeconds"] = 600
    obj["metadata"]["labels"] = {"team": "ml"}
    _, out = mutate(obj)

    owned = {("spec", "backoffLimit"), ("spec", "podReplacementPolicy")}
    for path, value in leaves(obj):
        if path in owned:
            continue
        node = out
        for part in path:
            node = node[part]
        assert node == value, path


def test_warnings_are_short():
    verdict, _ = mutate(job(FULL))
    # five changes, the missing activeDeadlineSeconds and that 137 is retried only where an
    # OOM kill exits 137 (failureaware.OOM_SIGNAL); kubectl shows the changes in one line
    assert len(verdict.warnings) == 7
    assert all(len(w) < 120 for w in verdict.warnings), verdict.warnings
    assert len(verdict.summary) < 130


def test_validate_allows_mutated_and_denies_unmutated_annotated_job():
    obj = job(FULL)
    assert not validate(obj).allowed
    assert "was not applied" in validate(obj).message
    _, out = mutate(obj)
    assert validate(out).allowed


def test_validate_reports_the_same_problems_as_mutate():
    obj = job({P + "backoff-limit": "x"})
    assert validate(obj).message == mutate(obj)[0].message


def test_validate_update_only_checks_changed_annotations():
    old = job({P + "backoff-limit": "1"})
    new = copy.deepcopy(old)
    assert validate(new, operation="UPDATE", old=old).allowed
    new["metadata"]["annotations"][P + "backoff-limit"] = "lots"
    verdict = validate(new, operation="UPDATE", old=old)
    assert not verdict.allowed and "'lots' is not valid" in verdict.message
    new["metadata"]["annotations"][P + "backoff-limit"] = "2"
    verdict = validate(new, operation="UPDATE", old=old)
    assert verdict.allowed and "apply to objects created from now on" in verdict.warnings[0]


def test_validate_update_ignores_preexisting_problems():
    # A Job created before a guard rail existed must stay updatable (finalizers, labels).
    old = job({P + "backoff-limit": "50"})
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    config = parse_config("guardRails: {maxBackoffLimit: 5}")
    assert validate(new, config, operation="UPDATE", old=old).allowed


def test_unknown_kinds_pass_through():
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x", "annotations": {P + "backoff-limit": "nope"}},
        "spec": {},
    }
    verdict, out = mutate(obj)
    assert verdict.allowed and verdict.patch == [] and out == obj
    assert validate(obj).allowed


def test_a_template_annotation_the_user_spelled_their_way_is_kept():
    """A pod-level setting the user also wrote on the pod template, spelled otherwise but
    meaning the same (``20000M`` is ``20G``), is theirs: not rewritten to our spelling
    (a mutation never rewrites a user's field it need not), and admission is idempotent
    (hypothesis found it: tests/admission/test_properties.py)."""
    from testkit.workloads import assert_idempotent, mutate, validate

    annotations = {P + "oom-memory-factor": "1.5", P + "oom-memory-limit": "20000M"}
    obj = job(annotations)
    obj["spec"]["template"]["metadata"] = {"annotations": {P + "oom-memory-limit": "20000M"}}
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    written = out["spec"]["template"]["metadata"]["annotations"]
    assert written[P + "oom-memory-limit"] == "20000M"
    assert written[P + "oom-memory-factor"] == "1.5"
    assert validate(out).allowed
    assert_idempotent(obj)


def test_a_job_made_from_a_declared_template_owner_is_left_alone(monkeypatch):
    """Which owners' Jobs are left alone is what those kinds declare, not a list of names
    here: a made-up owner declared like CronJob and JobSet gets the same."""
    from webhook.kinds import registry  # noqa: F401 (the kinds declare on loading)
    from webhook.kinds.job import mutate as job_mutate

    assert {("batch", "CronJob"), ("jobset.x-k8s.io", "JobSet")} <= job_mutate.TEMPLATE_OWNERS
    ref = {"apiVersion": "example.dev/v1", "kind": "Maker", "name": "m", "uid": "u1"}
    made = {"ownerReferences": [{**ref, "controller": True}]}
    assert not job_mutate.made_from_template(made)
    monkeypatch.setattr(job_mutate, "TEMPLATE_OWNERS", set(job_mutate.TEMPLATE_OWNERS))
    job_mutate.makes_jobs_from_template("example.dev", "Maker")
    assert job_mutate.made_from_template(made)
