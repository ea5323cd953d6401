"""Budgets per cause at admission: ``max-disruptions``, ``max-in-place-restarts`` and
``peer-disruptions`` (``webhook.plan.causes``): their grammar and what they need, the
rules they add and where those go, the template labels the controller and the chart select
pods by, and the upstream facts the rules rely on."""

from __future__ import annotations

import pytest

from testkit.builders import P, job, stored
from testkit.workloads import (
    assert_idempotent,
    kubectl_patch,
    mutate,
    validate,
    validate_schema,
)
from webhook.kube import failurepolicy as fp
from webhook.kube.failurepolicy import ContainerExit, PodFailure
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config

BUDGETS = {
    P + "ignore-disruptions": "true",
    P + "max-disruptions": "2",
    P + "fail-non-retriable": "true",
    P + "peer-disruptions": "ignore",
    P + "in-place-exit-codes": "42",
    P + "max-in-place-restarts": "5",
    P + "backoff-limit": "3",
}
V136 = Config(kubernetes_version=KubeVersion.parse("1.36"))
PARALLEL = {"parallelism": 4, "completions": 4}


def rules_of(obj: dict) -> list[dict]:
    return obj["spec"]["podFailurePolicy"]["rules"]


def condition_of(rule: dict) -> str | None:
    patterns = rule.get("onPodConditions")
    return patterns[0]["type"] if patterns else None


# --- grammar and what each key needs ------------------------------------------------------


def test_max_disruptions_without_ignore_disruptions_is_denied_with_the_reason():
    verdict = validate(job({P + "max-disruptions": "2"}))
    assert not verdict.allowed
    assert f"annotation {P}max-disruptions: needs ignore-disruptions, not set" in verdict.message
    assert "every disruption counts without it" in verdict.message


def test_max_in_place_restarts_without_in_place_exit_codes_is_denied_with_the_reason():
    verdict = validate(job({P + "max-in-place-restarts": "3"}), V136)
    assert not verdict.allowed
    assert f"{P}max-in-place-restarts: needs in-place-exit-codes, not set" in verdict.message
    assert "nothing restarts in place without it" in verdict.message


def test_a_default_budget_without_what_it_needs_is_skipped_with_a_warning():
    config = Config(defaults={"max-disruptions": 1})
    verdict, out = mutate(job({P + "backoff-limit": "2"}), config)
    assert verdict.allowed
    (said,) = [w for w in verdict.warnings if "max-disruptions (cluster default) skipped" in w]
    assert said.endswith("needs ignore-disruptions, not set: every disruption counts without it")
    assert len(said) < 130, len(said)
    assert "podFailurePolicy" not in out["spec"]


def test_ignore_disruptions_denied_here_leaves_max_disruptions_alone():
    """A Job whose restartPolicy is OnFailure gets no podFailurePolicy: ignore-disruptions
    is denied, and max-disruptions is not said to lack it (issue 49): the denied setting
    stays asked for, and with Never both are admitted."""
    annotations = {P + "ignore-disruptions": "true", P + "max-disruptions": "1"}
    verdict = validate(job(annotations, restart_policy="OnFailure"))
    assert not verdict.allowed
    assert [p.where for p in verdict.problems] == [f"annotation {P}ignore-disruptions"]
    assert "accepted: spec.template.spec.restartPolicy: Never" in verdict.message
    assert mutate(job(annotations, restart_policy="Never"))[0].allowed


@pytest.mark.parametrize("kind", ["RayJob", "PyTorchJob"])
@pytest.mark.parametrize("key", ["max-disruptions", "max-in-place-restarts", "peer-disruptions"])
def test_kinds_without_a_pod_failure_policy_deny_each_key(kind, key):
    from testkit.kinds import pytorchjob, rayjob

    value = {"max-disruptions": "0", "max-in-place-restarts": "2", "peer-disruptions": "count"}
    obj = (rayjob if kind == "RayJob" else pytorchjob)({P + key: value[key]})
    verdict = validate(obj, V136)
    assert not verdict.allowed
    assert f"annotation {P}{key}: cannot apply to a {kind}" in verdict.message


# --- the rules and their order ---------------------------------------------------------------


def test_our_condition_rules_come_first_then_disruptions_then_fail_job(tmp_path):
    """upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go) takes the
    first rule that matches: a pod the controller replaced after its restarts in place
    must be counted before fail-non-retriable's FailJob (it exits 137 or 143) and before
    ignore-disruptions' Ignore could see it; a disrupted pod over its budget before the
    Ignore on DisruptionTarget; a marked peer before FailJob."""
    user = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}
    obj = job(BUDGETS, spec={**PARALLEL, "podFailurePolicy": {"rules": [user]}})
    verdict, out = mutate(obj, V136)
    assert verdict.allowed, verdict.message
    rules = rules_of(out)
    assert [(r["action"], condition_of(r)) for r in rules[:5]] == [
        ("Count", fp.IN_PLACE_BUDGET_EXHAUSTED),
        ("Count", fp.DISRUPTION_BUDGET_EXHAUSTED),
        ("Ignore", fp.PEER_DISRUPTED),
        ("FailJob", None),  # the user's own, after the rules on our conditions
        ("Ignore", fp.DISRUPTION_TARGET),
    ]
    assert rules[5]["action"] == "FailJob" and rules[5]["onExitCodes"]["operator"] == "NotIn"
    # As the API server applies the patch, and as its schemas take the result.
    assert kubectl_patch(obj, verdict.patch, tmp_path) == out
    for version in ("1.35", "1.36", "1.37"):
        validate_schema(out, version)
    assert not fp.validate(out["spec"])
    assert_idempotent(obj, V136)


def test_each_rule_decides_the_pod_our_controller_marked():
    """What the Job controller does with each pod (the one evaluation, as
    ``matchPodFailurePolicy``): a replaced pod that exited 137 counts; a disruption within
    the budget is ignored, past it counted; a peer that exited 1 is ignored, not FailJob."""
    _, out = mutate(job(BUDGETS, spec=PARALLEL), V136)
    rules = rules_of(out)
    killed = (ContainerExit("main", 137),)

    def judged(*conditions: str, exits=killed) -> str | None:
        match = fp.evaluate(rules, PodFailure(exits, tuple((c, "True") for c in conditions)))
        return match.action if match else None

    assert judged(fp.IN_PLACE_BUDGET_EXHAUSTED) == "Count"
    assert judged(fp.IN_PLACE_BUDGET_EXHAUSTED, fp.DISRUPTION_TARGET) == "Count"
    assert judged(fp.DISRUPTION_TARGET) == "Ignore"
    assert judged(fp.DISRUPTION_TARGET, fp.DISRUPTION_BUDGET_EXHAUSTED) == "Count"
    assert judged(fp.PEER_DISRUPTED, exits=(ContainerExit("main", 1),)) == "Ignore"
    assert judged(exits=(ContainerExit("main", 1),)) == "FailJob"


def test_peer_disruptions_count_counts_a_marked_peer():
    annotations = {P + "fail-non-retriable": "true", P + "peer-disruptions": "count"}
    _, out = mutate(job(annotations, spec=PARALLEL))
    match = fp.evaluate(
        rules_of(out), PodFailure((ContainerExit("main", 1),), ((fp.PEER_DISRUPTED, "True"),))
    )
    assert match is not None and match.action == "Count"


def test_custom_condition_types_are_what_the_api_and_the_job_controller_take():
    """upstream: validatePodFailurePolicyRuleOnPodConditions (pkg/apis/batch/validation/
    validation.go) holds a rule's condition type to ValidateQualifiedName, as
    validatePodConditions (pkg/apis/core/validation/validation.go, from
    ValidatePodStatusUpdate) holds a pod's custom conditions; matchPodFailurePolicy, through
    matchOnPodConditions (pkg/controller/job/pod_failure_policy.go), compares type and
    status, whatever the type, and takes the first rule that matches."""
    for condition in fp.OUR_CONDITIONS:
        assert fp.qualified_name(condition)
        rule = fp.condition_rule(condition)
        assert fp.evaluate([rule], PodFailure((), ((condition, "True"),))) is not None
        assert fp.evaluate([rule], PodFailure((), ((condition, "False"),))) is None
    bad = {"rules": [{"action": "Count", "onPodConditions": [{"type": "a/b/c", "status": "True"}]}]}
    problems = fp.validate(
        {"podFailurePolicy": bad, "template": {"spec": {"restartPolicy": "Never"}}}
    )
    assert any("is not a qualified name" in p.message for p in problems)


def test_the_twenty_rule_limit_counts_the_new_rules():
    """upstream: validatePodFailurePolicy allows 20 rules. 17 of yours, and the three on our
    conditions with the Ignore on DisruptionTarget make 21: denied, naming the keys."""
    yours = [
        {"action": "Count", "onExitCodes": {"operator": "In", "values": [n]}} for n in range(1, 18)
    ]
    annotations = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "1",
        P + "peer-disruptions": "count",
        P + "in-place-exit-codes": "42",
        P + "max-in-place-restarts": "2",
    }
    obj = job(annotations, spec={"podFailurePolicy": {"rules": yours}})
    verdict = validate(obj, V136)
    assert not verdict.allowed
    assert "would have 21 rules (17 yours, 4 added)" in verdict.message
    assert f"annotation {P}max-disruptions" in verdict.message
    fits = job(annotations, spec={"podFailurePolicy": {"rules": yours[:16]}})
    verdict, out = mutate(fits, V136)
    assert verdict.allowed, verdict.message
    assert len(rules_of(out)) == 20


# --- the labels the controller and the chart select pods by ------------------------------------


def test_the_pod_template_is_labelled_for_the_controller():
    obj = job(BUDGETS, spec=PARALLEL)
    obj["spec"]["template"]["metadata"] = {"labels": {"app": "train"}}
    verdict, out = mutate(obj, V136)
    assert verdict.allowed
    assert out["spec"]["template"]["metadata"]["labels"] == {
        "app": "train",  # the user's label, kept
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "2",
        P + "max-in-place-restarts": "5",
        P + "peer-disruptions": "ignore",
    }
    # One label added at a time: the user's labels are never replaced.
    ops = [op for op in verdict.patch if "/template/metadata/labels" in op["path"]]
    assert all(op["op"] == "add" and op["path"].count("/labels/") == 1 for op in ops), ops
    assert out["metadata"]["annotations"][P + "applied"].count("maxDisruptions") == 1


def test_a_template_without_labels_gets_them_and_ignore_disruptions_alone_gets_one():
    verdict, out = mutate(job({P + "ignore-disruptions": "true"}))
    assert out["spec"]["template"]["metadata"]["labels"] == {P + "ignore-disruptions": "true"}
    assert not any("label" in w for w in verdict.warnings)  # bookkeeping, not a change


def test_a_jobsets_replicated_jobs_are_labelled():
    from testkit.kinds import jobset

    obj = jobset({P + "ignore-disruptions": "true", P + "max-disruptions": "3"})
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    for rjob in out["spec"]["replicatedJobs"]:
        labels = rjob["template"]["spec"]["template"]["metadata"]["labels"]
        assert labels[P + "max-disruptions"] == "3"
        rules = rjob["template"]["spec"]["podFailurePolicy"]["rules"]
        assert condition_of(rules[0]) == fp.DISRUPTION_BUDGET_EXHAUSTED
    validate_schema(out)


# --- in-place restarts bounded by their budget ----------------------------------------------


def test_max_in_place_restarts_bounds_restarts_without_a_deadline():
    """Without a deadline in-place restarts are denied (nothing ends them); with the budget
    each pod is replaced after N and counted, so backoffLimit ends them."""
    annotations = {P + "in-place-exit-codes": "42"}
    denied = validate(job(annotations), V136)
    assert not denied.allowed and "activeDeadlineSeconds" in denied.message
    verdict, out = mutate(job({**annotations, P + "max-in-place-restarts": "5"}), V136)
    assert verdict.allowed, verdict.message
    assert "activeDeadlineSeconds" not in out["spec"]
    assert condition_of(rules_of(out)[0]) == fp.IN_PLACE_BUDGET_EXHAUSTED


def test_the_admins_default_deadline_is_not_written_where_the_budget_bounds():
    config = Config(
        kubernetes_version=KubeVersion.parse("1.36"),
        guard_rails=Config().guard_rails.__class__(in_place_deadline_seconds=3600),
    )
    annotations = {P + "in-place-exit-codes": "42", P + "max-in-place-restarts": "2"}
    _, out = mutate(job(annotations), config)
    assert "activeDeadlineSeconds" not in out["spec"]
    _, without = mutate(job({P + "in-place-exit-codes": "42"}), config)
    assert without["spec"]["activeDeadlineSeconds"] == 3600


# --- peers ---------------------------------------------------------------------------------------


def test_the_peers_warning_names_peer_disruptions_until_it_is_set():
    obj = job({P + "fail-non-retriable": "true"}, spec=PARALLEL)
    verdict, _ = mutate(obj)
    (said,) = [w for w in verdict.warnings if "pods run as one" in w]
    assert said.endswith("set peer-disruptions: ignore") and len(said) < 120
    marked = {P + "fail-non-retriable": "true", P + "peer-disruptions": "count"}
    verdict, _ = mutate(job(marked, spec=PARALLEL))
    assert verdict.allowed and not any("pods run as one" in w for w in verdict.warnings)


def test_ignored_peers_without_a_deadline_are_warned_once():
    verdict, _ = mutate(job({P + "peer-disruptions": "ignore"}, spec=PARALLEL))
    assert (
        verdict.warnings.count(
            "retry-policy: set spec.activeDeadlineSeconds: ignored peers retry with no cap"
        )
        == 1
    )


def test_the_policy_record_is_no_policy_of_the_update_webhook():
    """The labels are on the template; an UPDATE of the admitted Job changes nothing."""
    _, out = mutate(job(BUDGETS, spec=PARALLEL), V136)
    old = stored(out)
    assert validate(old, V136, operation="UPDATE", old=old).allowed


def test_bare_pods_cannot_carry_the_budgets():
    from testkit.builders import pod

    verdict = validate(pod({P + "max-disruptions": "1"}))
    assert not verdict.allowed
    assert "applies to workloads (Job, JobSet, ...) only" in verdict.message


def test_a_cronjobs_jobs_get_the_rules_and_labels():
    from testkit.kinds import cronjob

    verdict, out = mutate(cronjob({P + "ignore-disruptions": "true", P + "max-disruptions": "0"}))
    assert verdict.allowed, verdict.message
    spec = out["spec"]["jobTemplate"]["spec"]
    assert condition_of(spec["podFailurePolicy"]["rules"][0]) == fp.DISRUPTION_BUDGET_EXHAUSTED
    assert spec["template"]["metadata"]["labels"][P + "max-disruptions"] == "0"


def test_a_terminating_pods_conditions_are_read_once_it_fails():
    """upstream: isPodFailed and onlyReplaceFailedPods (pkg/controller/job/job_controller.go).
    With a podFailurePolicy (every Job our rules are in has one) a pod being deleted is not
    failed before its phase is Failed: the Job controller judges it then, with the
    conditions it has then, so a condition added while it terminates is read. Without one,
    a terminating pod is failed at once, before a condition could be added."""
    _, out = mutate(job({P + "ignore-disruptions": "true", P + "max-disruptions": "1"}))
    spec = out["spec"]
    terminating = {
        "metadata": {"deletionTimestamp": "2026-11-26T10:00:30Z"},
        "status": {"phase": "Running"},
    }
    assert not fp.judged_failed(terminating, spec)
    failed = {**terminating, "status": {"phase": "Failed"}}
    assert fp.judged_failed(failed, spec)
    plain = {"template": spec["template"]}
    assert fp.judged_failed(terminating, plain)
    assert not fp.judged_failed({**terminating, "status": {"phase": "Succeeded"}}, plain)
    assert not fp.judged_failed(terminating, {**plain, "podReplacementPolicy": "Failed"})
