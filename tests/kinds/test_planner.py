"""The plan admission records (``Outcome.plans``), made into a ``PartPlan`` by the one
planner (``webhook.kinds.planner``) for ``explain`` and for a stored object read
without admission; and who wrote each rule, named from the applied record's origins."""

from __future__ import annotations

import copy

from testkit.builders import P, job
from testkit.kinds import cronjob, jobset
from webhook.admission import engine
from webhook.kinds import planner
from webhook.kinds.explaining import explain_job_spec
from webhook.kinds.jobset.explain import jobset_rule_lines
from webhook.plan.explained import Subject
from webhook.plan.outcome import Context
from webhook.plan.record import AppliedRecord, rule_id
from webhook.policy.config import Config
from webhook.policy.model import APPLIED

FAIL = {P + "backoff-limit": "3", P + "fail-non-retriable": "true"}


def test_admission_records_each_job_spec_part_it_wrote():
    reviewed = engine.review(cronjob(FAIL), Config())
    assert list(reviewed.outcome.plans) == ["spec.jobTemplate.spec"]
    planned = reviewed.outcome.plans["spec.jobTemplate.spec"]
    assert planned.path == ("spec", "jobTemplate", "spec")
    assert planned.policy == reviewed.outcome.policies["spec.jobTemplate.spec"]

    reviewed = engine.review(jobset(FAIL), Config())
    parts = reviewed.outcome.plans
    assert [p.path for p in parts.values()] == [
        ("spec", "replicatedJobs", i, "template", "spec") for i in range(len(parts))
    ]
    assert list(parts) == [f"spec.replicatedJobs[{i}].template.spec" for i in range(len(parts))]


def test_the_planner_makes_the_recorded_part_over_the_stored_object():
    written = job(FAIL)
    reviewed = engine.review(written, Config())
    planned = reviewed.outcome.plans["spec"]
    made = planner.part_plan(
        planned.policy, planned.path, written, reviewed.result, Context(Config())
    )
    assert made is not None and made.limit == 3
    assert made.rules == reviewed.result["spec"]["podFailurePolicy"]["rules"]
    assert made.user_rules == []  # the user wrote none: every rule is the webhook's
    assert set(made.origins.values()) == {"fail-non-retriable"}
    assert {rule_id(r) for r in made.rules} <= set(made.origins)


def _stored(obj):
    """A stored object as ``status`` reads it: written and stored are the same object, and
    there is no admission outcome."""
    return Subject(obj, obj, None, Context(Config()), [])


def test_a_rule_is_the_webhooks_when_the_record_says_so_whatever_its_shape():
    stored = engine.review(job(FAIL), Config()).result
    lines = explain_job_spec(_stored(stored)).rules
    assert lines and all(line.origin.startswith("added by retry-policy for") for line in lines)
    # A rule of the same shape the record does not name is the user's.
    record = AppliedRecord.of(stored)
    first = stored["spec"]["podFailurePolicy"]["rules"][0]
    unnamed = {k: v for k, v in record.origins.items() if k != rule_id(first)}
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["annotations"][APPLIED] = AppliedRecord(
        record.settings, unnamed
    ).to_annotation()
    lines = explain_job_spec(_stored(relabelled)).rules
    assert lines[0].origin == "your rule"
    assert all(line.origin.startswith("added by") for line in lines[1:])


def test_a_version_1_record_falls_back_to_the_rules_shape():
    stored = engine.review(job(FAIL), Config()).result
    record = AppliedRecord.of(stored)
    old = copy.deepcopy(stored)
    old["metadata"]["annotations"][APPLIED] = AppliedRecord(
        record.settings, {}, version=1
    ).to_annotation()
    assert planner.recorded_origins(old) is None
    # Written and stored are one object here, so by shape every rule reads as the user's
    # but ours, which the shape recognises.
    lines = explain_job_spec(Subject(job(FAIL), old, None, Context(Config()), [])).rules
    assert lines and all(
        line.origin == "added by retry-policy for fail-non-retriable" for line in lines
    )


def test_a_jobset_rule_is_named_by_the_record_and_by_name_only_under_version_1():
    ours = {"name": "anything", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    yours = {"name": "yours", "action": "RestartJobSet"}
    by_record = jobset_rule_lines([ours, yours], [yours], {rule_id(ours): "fail-non-retriable"})
    assert [line.origin for line in by_record] == [
        "added by retry-policy for fail-non-retriable (anything)",
        "your rule yours",
    ]
    by_shape = jobset_rule_lines([ours, yours], [yours], None)
    assert by_shape[0].origin == "rule anything"  # not our rule's name: not recognised
