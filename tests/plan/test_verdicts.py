"""Acting on failure categories at admission: ``free-categories``, ``max-free-failures``,
``fail-categories`` and ``start-deadline`` (``webhook.plan.verdicts``): their grammar,
unknown names, the rules they add and where those go, the template labels the controller
watches by, and what each kind maps them onto or denies."""

from __future__ import annotations

import pytest

from testkit.builders import P, job
from testkit.workloads import assert_idempotent, kubectl_patch, mutate, validate, validate_schema
from webhook.kube import failurepolicy as fp
from webhook.kube.failurepolicy import PodFailure
from webhook.policy.config import parse_config

FREE = {P + "free-categories": "NodeFailure,DeviceFault", P + "backoff-limit": "2"}
CUSTOM = parse_config(
    "categories:\n  - {name: NCCLTimeout, hint: a collective timed out, "
    "match: {terminationMessage: 'NCCL.*timeout'}}\n"
)


def rules_of(obj: dict) -> list[dict]:
    return obj["spec"]["podFailurePolicy"]["rules"]


def shape(rule: dict) -> tuple[str, list[str]]:
    return rule["action"], [p["type"] for p in rule.get("onPodConditions") or []]


def test_free_fail_and_the_budget_add_three_rules_first_in_their_order(tmp_path):
    """upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go): the first
    rule that matches decides, and a rule's pod condition patterns match when any one does
    (matchOnPodConditions): the budget's Count must come before the free categories'
    Ignore, as max-disruptions' does before ignore-disruptions'."""
    user = {"action": "Count", "onExitCodes": {"operator": "In", "values": [3]}}
    annotations = {
        **FREE,
        P + "max-free-failures": "1",
        P + "fail-categories": "ImagePull,ConfigError",
        P + "fail-non-retriable": "true",
    }
    obj = job(annotations, spec={"podFailurePolicy": {"rules": [user]}})
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    rules = rules_of(out)
    assert [shape(r) for r in rules[:3]] == [
        ("Count", [fp.FREE_BUDGET_EXHAUSTED]),
        ("FailJob", ["retry-policy.dev/ConfigError", "retry-policy.dev/ImagePull"]),
        ("Ignore", ["retry-policy.dev/DeviceFault", "retry-policy.dev/NodeFailure"]),
    ]
    assert rules[3] == user
    labels = out["spec"]["template"]["metadata"]["labels"]
    assert labels[P + "categories"] == "true" and labels[P + "max-free-failures"] == "1"
    # A free failure over the budget carries both conditions: the Count decides it.
    over = PodFailure(
        (), (("retry-policy.dev/NodeFailure", "True"), (fp.FREE_BUDGET_EXHAUSTED, "True"))
    )
    assert fp.evaluate(rules, over).action == "Count"
    free = PodFailure((), (("retry-policy.dev/DeviceFault", "True"),))
    assert fp.evaluate(rules, free).action == "Ignore"
    assert kubectl_patch(obj, verdict.patch, tmp_path) == out
    validate_schema(out)
    assert_idempotent(obj)


def test_an_unknown_category_is_denied_listing_the_categories_there_are():
    verdict = validate(job({P + "free-categories": "NodeFailure,GpuFault"}), CUSTOM)
    assert not verdict.allowed
    assert f"annotation {P}free-categories: GpuFault: no such category" in verdict.message
    assert "the categories are NCCLTimeout, DeviceFault, NodeFailure" in verdict.message
    assert mutate(job({P + "fail-categories": "NCCLTimeout"}), CUSTOM)[0].allowed


def test_a_category_both_free_and_failing_is_denied_and_every_problem_said_at_once():
    annotations = {P + "free-categories": "AppError,Nope", P + "fail-categories": "AppError"}
    verdict = validate(job(annotations))
    assert not verdict.allowed
    assert "Nope: no such category" in verdict.message
    assert "AppError is also in free-categories" in verdict.message


def test_max_free_failures_without_free_categories_is_denied_with_the_reason():
    verdict = validate(job({P + "max-free-failures": "2"}))
    assert not verdict.allowed
    assert f"annotation {P}max-free-failures: needs free-categories, not set" in verdict.message
    assert "no failure is free without it" in verdict.message


def test_free_categories_without_a_cap_warn_as_ignore_disruptions_does():
    verdict, _ = mutate(job(FREE))
    assert verdict.allowed, verdict.message
    assert (
        "retry-policy: set spec.activeDeadlineSeconds (or max-free-failures): free failures "
        "(free-categories) retry with no cap" in verdict.warnings
    )
    capped, _ = mutate(job({**FREE, P + "max-free-failures": "3"}))
    assert not any("no cap" in w for w in capped.warnings)


def test_fail_categories_fail_the_index_under_fail_index():
    annotations = {P + "fail-categories": "ImagePull", P + "on-non-retriable": "fail-index"}
    spec = {"completionMode": "Indexed", "completions": 4, "backoffLimitPerIndex": 1}
    verdict, out = mutate(job(annotations, spec=spec))
    assert verdict.allowed, verdict.message
    assert shape(rules_of(out)[0]) == ("FailIndex", ["retry-policy.dev/ImagePull"])
    without = validate(job(annotations))
    assert not without.allowed
    assert "fail-index needs spec.backoffLimitPerIndex" in without.message


def test_start_deadline_labels_the_template_and_adds_no_rule():
    verdict, out = mutate(job({P + "start-deadline": "15m"}))
    assert verdict.allowed, verdict.message
    assert "podFailurePolicy" not in out["spec"]
    labels = out["spec"]["template"]["metadata"]["labels"]
    assert labels[P + "start-deadline"] == "15m" and labels[P + "categories"] == "true"


def test_a_namespaces_defaults_add_the_rules_and_labels_there_and_nowhere_else():
    """``namespaces.<ns>.defaults`` with the four keys: a Job in that namespace gets the
    Count, FailJob and Ignore rules and the template labels the controller watches by, as
    if annotated; a Job in another namespace gets none of them (annotated, so that the
    webhook plans it at all)."""
    config = parse_config(
        "namespaces:\n  ml:\n    defaults:\n"
        "      free-categories: [DeviceFault, NodeFailure]\n      max-free-failures: 1\n"
        "      fail-categories: ImagePull\n      start-deadline: 10m\n"
    )
    verdict, out = mutate(job({}, namespace="ml"), config)
    assert verdict.allowed, verdict.message
    assert [shape(r) for r in rules_of(out)] == [
        ("Count", [fp.FREE_BUDGET_EXHAUSTED]),
        ("FailJob", ["retry-policy.dev/ImagePull"]),
        ("Ignore", ["retry-policy.dev/DeviceFault", "retry-policy.dev/NodeFailure"]),
    ]
    labels = out["spec"]["template"]["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith(P)} == {
        P + "categories": "true",
        P + "max-free-failures": "1",
        P + "start-deadline": "10m",
    }
    assert_idempotent(job({}, namespace="ml"), config)
    verdict, other = mutate(job({P + "backoff-limit": "2"}, namespace="research"), config)
    assert verdict.allowed, verdict.message
    assert other["spec"]["backoffLimit"] == 2 and "podFailurePolicy" not in other["spec"]
    labels = (other["spec"]["template"].get("metadata") or {}).get("labels") or {}
    assert not any(k.startswith(P) for k in labels)


def test_a_default_that_cannot_apply_is_skipped_with_a_warning():
    config = parse_config("defaults:\n  free-categories: [DeviceFault]\n")
    verdict, out = mutate(job({}, restart_policy="OnFailure"), config)
    assert verdict.allowed, verdict.message
    assert any("free-categories (cluster default) skipped" in w for w in verdict.warnings)
    assert "podFailurePolicy" not in out["spec"]


def test_restart_policy_on_failure_denies_the_rule_keys_but_not_start_deadline():
    annotations = {P + "fail-categories": "ImagePull"}
    verdict = validate(job(annotations, restart_policy="OnFailure"))
    assert not verdict.allowed
    assert "a podFailurePolicy, which Kubernetes allows only under Never" in verdict.message
    allowed, _ = mutate(job({P + "start-deadline": "10m"}, restart_policy="OnFailure"))
    assert allowed.allowed, allowed.message


@pytest.mark.parametrize("kind", ["RayJob", "PyTorchJob"])
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("free-categories", "NodeFailure"),
        ("fail-categories", "ImagePull"),
        ("start-deadline", "10m"),
    ],
)
def test_kinds_that_cannot_honour_them_deny_each_key(kind, key, value):
    from testkit.kinds import pytorchjob, rayjob

    obj = (rayjob if kind == "RayJob" else pytorchjob)({P + key: value})
    verdict = validate(obj)
    assert not verdict.allowed
    assert f"annotation {P}{key}: cannot apply to a {kind}" in verdict.message


def test_a_bare_pod_is_told_these_are_a_workloads():
    from testkit.builders import pod

    verdict = validate(pod({P + "free-categories": "NodeFailure"}))
    assert not verdict.allowed
    assert "applies to workloads (Job, JobSet, ...) only" in verdict.message


def test_a_jobset_fails_as_a_whole_on_a_failing_category():
    """A child Job failed by a FailJob rule ends with reason PodFailurePolicy, which JobSet
    would restart on (``executeFailurePolicy``: no rule applies, the set restarts): our
    FailJobSet rule on that reason fails the set, as for fail-non-retriable."""
    from testkit.kinds import jobset

    verdict, out = mutate(jobset({P + "fail-categories": "ConfigError"}))
    assert verdict.allowed, verdict.message
    rules = out["spec"]["failurePolicy"]["rules"]
    assert rules[-1]["action"] == "FailJobSet"
    assert rules[-1]["onJobFailureReasons"] == ["PodFailurePolicy"]
    for rjob in out["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert shape(spec["podFailurePolicy"]["rules"][0])[0] == "FailJob"
    validate_schema(out)


def test_a_jobset_restarting_in_place_denies_the_rule_keys():
    from testkit.kinds import jobset

    obj = jobset(
        {P + "free-categories": "NodeFailure"}, failure_policy={"restartStrategy": "InPlaceRestart"}
    )
    verdict = validate(obj)
    assert not verdict.allowed
    assert f"annotation {P}free-categories: cannot apply to a JobSet" in verdict.message
