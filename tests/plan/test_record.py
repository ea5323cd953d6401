"""The ``retry-policy.dev/applied`` record (``webhook.plan.record``): one writer, one parser,
a format version, the rules' origins; and the records already on clusters (version 1, as
the webhook wrote them before) still read, and never rewritten for the format alone."""

from __future__ import annotations

import copy

from testkit.builders import FULL, P, job, v1_of
from testkit.kinds import cronjob, jobset
from testkit.workloads import mutate
from webhook.kube.failurepolicy import ignore_disruptions_rule, non_retriable_rule
from webhook.plan.record import (
    VERSION,
    AppliedRecord,
    policy_settings,
    rule_id,
    settings_as_annotations,
)
from webhook.policy.model import KEYS, PREFIX, Layer, Scope, Source, parse_annotations, resolve
from webhook.status import story

#: Records as the webhook wrote them up to version 1 (the examples' and the README's, and
#: a pod's), byte for byte.
V1_JOB = (
    '{"backoffLimit":3,"failNonRetriable":[137,143],"ignoreDisruptions":true,"nonSpotAttempts":1}'
)
V1_POD = '{"attempt":3,"attempts":4,"nonSpot":true}'
POLICY = FULL


def test_a_version_1_record_is_read_as_it_was_written():
    record = AppliedRecord.parse(V1_JOB)
    assert record is not None and record.version == 1
    assert dict(record.settings) == {
        "backoffLimit": 3,
        "failNonRetriable": [137, 143],
        "ignoreDisruptions": True,
        "nonSpotAttempts": 1,
    }
    assert record.origins == {} and record.origin(ignore_disruptions_rule()) is None
    pod = AppliedRecord.parse(V1_POD)
    assert pod is not None and pod.get("nonSpot") is True and pod.version == 1


def test_what_is_not_a_record_reads_as_none():
    for raw in (None, 3, "", "not json", "[1, 2]", '"text"', '{"v": "two"}', '{"v": true}'):
        assert AppliedRecord.parse(raw) is None, raw


def test_the_record_is_compact_sorted_versioned_and_keeps_the_rules_origins():
    _, out = mutate(job(POLICY))
    text = out["metadata"]["annotations"][P + "applied"]
    ignore, failing = out["spec"]["podFailurePolicy"]["rules"]
    assert text == (
        V1_JOB[:-1] + ',"origins":{"fail-non-retriable":"' + rule_id(failing) + '",'
        '"ignore-disruptions":"' + rule_id(ignore) + '"},"v":' + str(VERSION) + "}"
    )
    # The origins cost a few dozen bytes; written again, the text is the same.
    assert len(text) - len(V1_JOB) < 90
    record = AppliedRecord.of(out)
    assert record is not None and record.to_annotation() == text
    assert record.origin(failing) == "fail-non-retriable"
    assert record.origin(ignore) == "ignore-disruptions"


def test_a_user_rule_equal_to_ours_is_not_recorded_as_ours():
    """A manifest copied from a mutated Job holds our rule as its own: merge does not add
    it again (``failurepolicy.merge``), so the record does not say it is ours."""
    copied = job(POLICY, spec={"podFailurePolicy": {"rules": [ignore_disruptions_rule()]}})
    _, out = mutate(copied)
    record = AppliedRecord.of(out)
    assert record is not None
    assert record.origin(ignore_disruptions_rule()) is None
    assert record.origin(non_retriable_rule([137, 143], "FailJob", "main")) == (
        "fail-non-retriable"
    )


def test_a_reinvocation_keeps_the_origins_of_the_rules_already_written():
    _, once = mutate(job(POLICY))
    verdict, twice = mutate(once)
    assert verdict.patch == [] and twice == once


def test_an_object_the_previous_version_mutated_is_not_rewritten_for_the_format():
    """Re-admitting what a webhook writing version-1 records mutated (a reinvocation in an
    upgrade, a CronJob's unrelated update) keeps its record: no patch for the format."""
    _, once = mutate(job(POLICY))
    old = v1_of(once)
    verdict, again = mutate(old)
    assert verdict.patch == [] and again == old
    _, made = mutate(cronjob(POLICY))
    legacy = v1_of(made)
    changed = copy.deepcopy(legacy)  # (its template changes: the policy is applied again)
    changed["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] = "v2"
    verdict, out = mutate(changed, operation="UPDATE", old=legacy)
    assert verdict.allowed and verdict.patch == [] and out == changed


def test_a_changed_policy_writes_the_new_record_with_its_origins():
    _, made = mutate(cronjob(POLICY))
    legacy = v1_of(made)
    changed = copy.deepcopy(legacy)
    changed["metadata"]["annotations"][P + "backoff-limit"] = "5"
    verdict, out = mutate(changed, operation="UPDATE", old=legacy)
    assert verdict.allowed, verdict.message
    record = AppliedRecord.of(out)
    assert record is not None and record.version == VERSION and record.get("backoffLimit") == 5
    rules = out["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert {record.origin(rule) for rule in rules} == {
        "ignore-disruptions",
        "fail-non-retriable",
    }


def test_a_jobsets_own_rule_is_recorded_with_its_childrens():
    _, out = mutate(jobset({P + "fail-non-retriable": "true", P + "backoff-limit": "2"}))
    record = AppliedRecord.of(out)
    assert record is not None
    (ours,) = out["spec"]["failurePolicy"]["rules"]
    assert record.origin(ours) == "fail-non-retriable"
    for rjob in out["spec"]["replicatedJobs"]:
        for rule in rjob["template"]["spec"]["podFailurePolicy"]["rules"]:
            assert record.origin(rule) == "fail-non-retriable"


def test_status_tells_our_rules_by_the_origins_and_an_old_record_by_their_shape():
    _, out = mutate(job(POLICY))
    rules = out["spec"]["podFailurePolicy"]["rules"]
    current = story.applied_record(out)
    assert [story.origin_of(rule, current) for rule in rules] == [
        "ignore-disruptions",
        "fail-non-retriable",
    ]
    old = story.applied_record(v1_of(out))
    assert old.version == 1
    assert [story.origin_of(rule, old) for rule in rules] == [
        "ignore-disruptions",
        "fail-non-retriable",
    ]
    # What the record says the admins' defaults chose reads the same from either.
    assert story.recorded_config(out) == story.recorded_config(v1_of(out))


def test_the_records_settings_said_back_as_annotations_give_the_same_record():
    """``settings_as_annotations`` reads ``policy_settings`` backwards, every setting the
    record keeps (``status`` judges a stored workload with them)."""
    annotations = {
        "backoff-limit": "5",
        "fail-non-retriable": "true",
        "retriable-exit-codes": "137,143",
        "on-non-retriable": "fail-index",
        "ignore-disruptions": "true",
        "max-disruptions": "2",
        "non-spot-attempts": "1",
        "error-propagation": "earliest",
        "oom-memory-factor": "1.5",
        "oom-memory-limit": "8Gi",
        "avoid-failed-nodes": "true",
        "in-place-exit-codes": "3",
        "in-place-scope": "pod",
        "max-in-place-restarts": "4",
        "peer-disruptions": "ignore",
        "attempt-env": "true",
        "retry-delay": "30s",
        "retry-delay-factor": "2",
        "retry-delay-max": "10m",
    }

    def record_of(said: dict[str, str]) -> dict:
        values, problems = parse_annotations(
            {PREFIX + k: v for k, v in said.items()}, Scope.WORKLOAD
        )
        assert problems == []
        return policy_settings(resolve([Layer(Source.ANNOTATION, values)]))

    record = record_of(annotations)
    assert {"retryDelay", "retryDelayFactor", "retryDelayMax", "attemptEnv"} <= set(record)
    said = settings_as_annotations(AppliedRecord(record))
    assert record_of(said) == record
    assert all(KEYS[name].settable_default for name in said)


def test_a_damaged_setting_in_a_record_is_left_out_not_guessed():
    said = settings_as_annotations(AppliedRecord({"backoffLimit": [3], "attemptEnv": "yes"}))
    assert said == {}
