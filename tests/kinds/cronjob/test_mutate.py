"""batch/v1 CronJob: the policy goes into the jobTemplate; its Jobs are admitted unchanged."""

from __future__ import annotations

import copy
import json

import pytest

from testkit.builders import FULL, P
from testkit.kinds import cronjob, job_from
from testkit.workloads import (
    assert_idempotent,
    kubectl_patch,
    mutate,
    validate,
    validate_schema,
)
from webhook.kinds import registry as defaults
from webhook.kube.failurepolicy import (
    count_disruptions_rule,
    ignore_disruptions_rule,
    non_retriable_rule,
)
from webhook.kube.intent import LAST_APPLIED
from webhook.policy.config import parse_config

POLICY = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
    P + "backoff-limit": "2",
    P + "ignore-disruptions": "true",
}


def test_api_defaulting_leaves_the_job_template_spec_alone():
    # SetDefaults_Job takes a Job: a CronJob's JobSpec arrives without backoffLimit.
    obj = cronjob()
    job_spec = obj["spec"]["jobTemplate"]["spec"]
    assert "backoffLimit" not in job_spec and "podReplacementPolicy" not in job_spec
    assert job_spec["template"]["spec"]["dnsPolicy"] == "ClusterFirst"
    assert obj["spec"]["concurrencyPolicy"] == "Allow"


def test_policy_is_written_into_the_job_template():
    verdict, out = mutate(cronjob(POLICY))
    assert verdict.allowed, verdict.message
    job_spec = out["spec"]["jobTemplate"]["spec"]
    assert job_spec["backoffLimit"] == 2
    assert job_spec["podFailurePolicy"]["rules"] == [
        ignore_disruptions_rule(),
        non_retriable_rule([137, 143], "FailJob", "eval"),
    ]
    # Unset stays unset: the Job API defaults it to Failed once there is a podFailurePolicy.
    assert "podReplacementPolicy" not in job_spec
    # Only the managed label, which the CronJob controller copies onto each Job it makes.
    assert out["spec"]["jobTemplate"]["metadata"] == {"labels": {P + "managed": "enforce"}}
    assert out["metadata"]["labels"] == {P + "managed": "enforce"}
    assert json.loads(out["metadata"]["annotations"][P + "applied"])["backoffLimit"] == 2
    assert verdict.warnings[0] == (
        "retry-policy: spec.jobTemplate.spec.backoffLimit -> 2 "
        "(annotation retry-policy.dev/backoff-limit)"
    )


@pytest.mark.parametrize(
    "config_text",
    ["", "defaults: {fail-non-retriable: true, retriable-exit-codes: [143], backoff-limit: 5}"],
)
def test_jobs_it_creates_are_admitted_unchanged(config_text):
    # The policy was applied and validated at the CronJob's admission; applying it (or an
    # admin default that disagrees, like a NotIn [143] rule failing exit 137) again to its
    # Jobs could only contradict that.
    config = parse_config(config_text)
    _, mutated = mutate(cronjob(POLICY), config)
    job = job_from(mutated)
    verdict, out = mutate(job, config)
    assert verdict.allowed and verdict.patch == [] and out == job
    assert validate(job, config).allowed
    # The same Job without the CronJob owner would get the admin defaults.
    del job["metadata"]["ownerReferences"]
    if config_text:
        assert mutate(job, config)[0].patch


def test_annotations_on_the_job_template_count_as_the_cronjobs_own():
    verdict, out = mutate(cronjob(template_annotations={P + "backoff-limit": "1"}))
    assert verdict.allowed, verdict.message
    assert out["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 1


def test_job_template_annotation_contradicting_the_cronjob_is_denied():
    obj = cronjob({P + "backoff-limit": "2"}, template_annotations={P + "backoff-limit": "4"})
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert (
        f"spec.jobTemplate.metadata annotation {P}backoff-limit: '4' contradicts the CronJob's "
        "annotation '2'" in verdict.message
    )


def test_bad_value_on_the_job_template_names_where_it_is():
    verdict, _ = mutate(cronjob(template_annotations={P + "backoff-limit": "two"}))
    assert not verdict.allowed
    assert f"spec.jobTemplate.metadata annotation {P}backoff-limit: 'two' is not valid" in (
        verdict.message
    )


def test_restart_policy_on_failure_is_denied_with_the_real_field_path():
    obj = cronjob({P + "fail-non-retriable": "true"})
    obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "spec.jobTemplate.spec.template.spec.restartPolicy is OnFailure" in verdict.message
    accepted = "accepted: spec.jobTemplate.spec.template.spec.restartPolicy: Never"
    assert accepted in verdict.message


def test_written_backoff_limit_in_the_template_contradicts():
    obj = cronjob({P + "backoff-limit": "2"}, job_spec={"backoffLimit": 6}, applied=True)
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "2 contradicts spec.jobTemplate.spec.backoffLimit: 6 in your spec" in verdict.message


@pytest.mark.parametrize(
    ("job_spec", "expected"),
    [
        # The API does not default a CronJob's JobSpec: a 6 or a TerminatingOrFailed there
        # was written, even with no record of the manifest.
        ({"backoffLimit": 6}, "2 contradicts spec.jobTemplate.spec.backoffLimit: 6"),
        (
            {"podReplacementPolicy": "TerminatingOrFailed"},
            "your spec.jobTemplate.spec.podReplacementPolicy: TerminatingOrFailed is not allowed",
        ),
    ],
)
def test_values_in_the_template_count_as_written_without_a_record(job_spec, expected):
    obj = cronjob({P + "backoff-limit": "2", P + "fail-non-retriable": "true"}, job_spec=job_spec)
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert expected in verdict.message


def test_cronjob_without_job_template_is_denied():
    obj = cronjob(POLICY)
    del obj["spec"]["jobTemplate"]
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "spec.jobTemplate.spec: a CronJob needs a Job template" in verdict.message


def test_admin_defaults_reach_unannotated_cronjobs():
    config = parse_config("defaults: {backoff-limit: 3}")
    verdict, out = mutate(cronjob(), config)
    assert verdict.allowed
    assert out["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 3
    # Nothing annotated, nothing to copy: only the managed label, for the Jobs it makes.
    assert out["spec"]["jobTemplate"]["metadata"] == {"labels": {P + "managed": "enforce"}}


# --- UPDATE: a CronJob is a template, checked again when its template or policy changes


@pytest.mark.parametrize("applied", [False, True])
def test_update_changing_the_policy_replaces_what_the_old_one_wrote(applied):
    # Without a record of the manifest (kubectl create, then kubectl annotate) the old
    # backoffLimit 2 and NotIn [137, 143] rule look like the user's own; the applied
    # record says they were the webhook's, so the new policy replaces them.
    _, old = mutate(cronjob(POLICY, applied=applied))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][P + "backoff-limit"] = "1"
    new["metadata"]["annotations"][P + "retriable-exit-codes"] = "143"
    verdict, out = mutate(new, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    job_spec = out["spec"]["jobTemplate"]["spec"]
    assert job_spec["backoffLimit"] == 1
    assert job_spec["podFailurePolicy"]["rules"] == [
        ignore_disruptions_rule(),
        non_retriable_rule([143], "FailJob", "eval"),
    ]
    assert json.loads(out["metadata"]["annotations"][P + "applied"])["failNonRetriable"] == [143]
    assert validate(out, operation="UPDATE", old=old).allowed
    # Reinvoked, the update changes nothing more.
    assert mutate(out, operation="UPDATE", old=old)[0].patch == []


def test_update_keeps_what_the_user_wrote_in_the_template():
    user = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}
    manifest_spec = {"podFailurePolicy": {"rules": [user]}, "activeDeadlineSeconds": 60}
    _, old = mutate(cronjob(POLICY, job_spec=manifest_spec, applied=True))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][P + "fail-non-retriable"] = "false"
    verdict, out = mutate(new, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    assert out["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"] == [
        user,
        ignore_disruptions_rule(),
    ]


def test_update_keeps_the_job_wide_limit_of_a_per_index_template():
    per_index = {"completionMode": "Indexed", "completions": 4, "backoffLimitPerIndex": 2}
    _, old = mutate(cronjob({P + "backoff-limit": "2"}, job_spec={**per_index, "backoffLimit": 2}))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][P + "non-spot-attempts"] = "1"
    verdict, out = mutate(new, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    assert out["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 2
    assert out["spec"]["jobTemplate"]["spec"]["backoffLimitPerIndex"] == 2


def test_error_propagation_is_denied_on_a_cronjob():
    # upstream: _build_error_file_name in flytekit/bin/entrypoint.py (error-<uuid>.pb),
    # read only by the PyTorch plugin's earliest-file reader (flyteplugins
    # ioutils/remote_file_output_reader.go): no Flyte plugin runs a CronJob's Jobs.
    verdict, _ = mutate(cronjob({P + "error-propagation": "earliest"}))
    assert not verdict.allowed
    assert "error-propagation: cannot apply to a CronJob" in verdict.message
    assert "error-<uuid>.pb" in verdict.message


def test_removing_a_policy_drops_what_it_wrote():
    _, old = mutate(cronjob({P + "backoff-limit": "2", P + "non-spot-attempts": "1"}))
    new = copy.deepcopy(old)
    del new["metadata"]["annotations"][P + "non-spot-attempts"]
    verdict, out = mutate(new, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    template = out["spec"]["jobTemplate"]["spec"]["template"]
    assert template["metadata"]["annotations"] == {}
    assert out["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 2


def test_removing_fail_non_retriable_takes_out_its_count_rule():
    """The applied record names the Count rule on DisruptionTarget (countDisruptions), so
    an update that drops fail-non-retriable takes it out with the exit-code rule; kept, it
    would look like the user's own, and every Job the CronJob controller makes from the
    template (getJobFromTemplate2 in pkg/controller/cronjob/utils.go) would carry it. A
    CronJob admitted before the rule existed gets it at its next re-check: a template is
    mutable, unlike its Jobs' podFailurePolicy."""
    policy = {P + "fail-non-retriable": "true", P + "backoff-limit": "2"}
    _, old = mutate(cronjob(policy))
    rules = [count_disruptions_rule(), non_retriable_rule([143], "FailJob", "eval")]
    assert old["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"] == rules
    assert json.loads(old["metadata"]["annotations"][P + "applied"])["countDisruptions"]
    new = copy.deepcopy(old)
    del new["metadata"]["annotations"][P + "fail-non-retriable"]
    verdict, out = mutate(new, operation="UPDATE", old=old)
    assert verdict.allowed, verdict.message
    assert "podFailurePolicy" not in out["spec"]["jobTemplate"]["spec"]
    assert validate(out, operation="UPDATE", old=old).allowed
    # Admitted before the Count rule: the next change of the policy adds it.
    legacy = copy.deepcopy(old)
    legacy["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"] = rules[1:]
    legacy["metadata"]["annotations"][P + "applied"] = '{"backoffLimit":2,"failNonRetriable":[143]}'
    changed = copy.deepcopy(legacy)
    changed["metadata"]["annotations"][P + "backoff-limit"] = "1"
    verdict, out = mutate(changed, operation="UPDATE", old=legacy)
    assert verdict.allowed, verdict.message
    assert out["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"] == rules
    assert (
        "retry-policy: added podFailurePolicy rule Count on DisruptionTarget (fail-non-retriable)"
        in verdict.warnings
    )


def test_update_into_a_bad_template_is_denied():
    _, old = mutate(cronjob(POLICY))
    new = copy.deepcopy(old)
    new["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    verdict = validate(new, operation="UPDATE", old=old)
    assert not verdict.allowed
    assert "restartPolicy: Never" in verdict.message


def test_unrelated_update_is_not_blocked_by_rules_added_later():
    _, old = mutate(cronjob({P + "backoff-limit": "8"}))
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = True
    config = parse_config("guardRails: {maxBackoffLimit: 5}")
    verdict, out = mutate(new, config, operation="UPDATE", old=old)
    assert verdict.patch == [] and out == new
    assert validate(new, config, operation="UPDATE", old=old).allowed
    # ...while touching the template re-checks it against today's rules.
    new["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] = 600
    verdict = validate(new, config, operation="UPDATE", old=old)
    assert not verdict.allowed and verdict.code == 403


def test_cronjob_is_idempotent_patch_applies_and_schema_valid(tmp_path):
    obj = cronjob({**FULL, P + "backoff-limit": "2"}, applied=True)
    once = assert_idempotent(obj)
    verdict, _ = mutate(obj)
    assert kubectl_patch(obj, verdict.patch, tmp_path) == once
    for version in ("1.33", "1.37"):
        validate_schema(once, version)
    # The Job it creates is valid too, once the Job API has defaulted it.
    job = job_from(once)
    defaults.apply_defaults(job)
    job["metadata"]["annotations"].pop(LAST_APPLIED, None)
    validate_schema(job)
