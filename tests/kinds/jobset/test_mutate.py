"""JobSet: maxRestarts, child Job budgets, the FailJobSet rule, pods counting runs."""

from __future__ import annotations

import copy
import json

import pytest

from testkit.builders import FULL, P, job, job_owner, pod
from testkit.kinds import child, jobset, replicated
from testkit.workloads import (
    FixedAttempts,
    assert_idempotent,
    kubectl_patch,
    mutate,
    pod_template,
    validate,
    validate_schema,
)
from webhook.kinds.jobset.mutate import OWNERS, Owner, initializers, owner_of
from webhook.kinds.jobset.rules import RULE_NAME, our_rule, validate_rules
from webhook.kube import intent
from webhook.kube.failurepolicy import (
    count_disruptions_rule,
    ignore_disruptions_rule,
    non_retriable_rule,
)
from webhook.kube.podspec import spot_requirements
from webhook.policy.config import Config, parse_config

# upstream: labelAndAnnotateObject (pkg/controllers/jobset_controller.go) sets it to the
# JobSet's status.restarts on each child Job and its pod template.
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


def test_full_policy():
    verdict, out = mutate(jobset(FULL))
    assert verdict.allowed, verdict.message
    assert out["spec"]["failurePolicy"] == {"maxRestarts": 3, "rules": [our_rule()]}
    for index in (0, 1):
        spec = child(out, index)
        assert spec["backoffLimit"] == 0
        assert spec["podFailurePolicy"]["rules"] == [
            ignore_disruptions_rule(),
            non_retriable_rule([137, 143], "FailJob", "trainer"),
        ]
        pod_spec = spec["template"]["spec"]
        assert pod_spec["restartPolicy"] == "Never"
        assert "env" not in pod_spec["containers"][0]
        assert spec["template"]["metadata"]["annotations"] == {
            P + "backoff-limit": "3",
            P + "non-spot-attempts": "1",
        }
    assert json.loads(out["metadata"]["annotations"][P + "applied"])["backoffLimit"] == 3
    assert verdict.warnings[:2] == [
        "retry-policy: spec.failurePolicy.maxRestarts -> 3 "
        "(annotation retry-policy.dev/backoff-limit)",
        "retry-policy: spec.replicatedJobs[0].template.spec.backoffLimit -> 0 "
        "(annotation retry-policy.dev/backoff-limit)",
    ]
    # The same rule lines are said once, not once per replicated Job.
    assert len(verdict.warnings) == len(set(verdict.warnings))
    assert "retry-policy: the last 1 of 4 JobSet runs will run on non-spot nodes" in (
        verdict.warnings
    )
    assert all(len(w) < 120 for w in verdict.warnings), verdict.warnings


def test_a_problem_of_the_policy_is_said_once_not_once_per_replicated_job():
    """Each replicated Job is judged with the set's policy; a problem of the policy itself
    (the factor's missing limit) is one problem, whichever Jobs found it."""
    verdict, _ = mutate(jobset({P + "oom-memory-factor": "1.5"}))
    assert not verdict.allowed
    assert verdict.message == (
        f"retry-policy: annotation {P}oom-memory-factor: needs {P}oom-memory-limit, the "
        "most memory a container may get (e.g. 16Gi)"
    )
    assert len(verdict.problems) == 1


def test_user_rules_stay_first_and_ours_is_named_apart():
    mine = {
        "name": "failOnDeadline",
        "action": "FailJobSet",
        "onJobFailureReasons": ["DeadlineExceeded"],
    }
    verdict, out = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [mine]})
    )
    assert verdict.allowed, verdict.message
    assert out["spec"]["failurePolicy"]["rules"] == [mine, our_rule()]
    assert out["spec"]["failurePolicy"]["rules"][1]["name"] == "retryPolicyFailNonRetriable"


@pytest.mark.parametrize(
    "rule",
    [
        {"name": "restart", "action": "RestartJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
        {"name": "restartAny", "action": "RestartJobSet"},  # no reasons: every failure
        {
            "name": "ignore",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "targetReplicatedJobs": ["leader"],
        },
    ],
)
def test_user_rule_restarting_on_pod_failure_policy_contradicts(rule):
    verdict, _ = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [rule]})
    )
    assert not verdict.allowed
    assert (
        f"annotation {P}fail-non-retriable: your spec.failurePolicy.rules[0] ({rule['action']})"
        in (verdict.message)
    )


def test_user_rule_restarting_on_other_reasons_is_fine():
    rule = {
        "name": "restart",
        "action": "RestartJobSet",
        "onJobFailureReasons": ["BackoffLimitExceeded"],
    }
    verdict, out = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [rule]})
    )
    assert verdict.allowed, verdict.message
    assert out["spec"]["failurePolicy"]["rules"] == [rule, our_rule()]


@pytest.mark.parametrize("action", ["RestartJob", "RestartJobAndIgnoreMaxRestarts"])
def test_single_job_restarts_contradict_non_spot_attempts(action):
    # A RestartJob keeps the restart-attempt label, so pods could not tell their last
    # attempts: asked for by annotation it is denied, as an admin default it is skipped.
    # (on DeadlineExceeded: on BackoffLimitExceeded, the uncounted one would also leave
    # backoff-limit nothing to bound: test_uncounted_restarts_on_exhausted_pods_are_denied)
    rule = {"name": "again", "action": action, "onJobFailureReasons": ["DeadlineExceeded"]}
    policy = {P + "non-spot-attempts": "1", P + "backoff-limit": "2"}
    verdict, _ = mutate(jobset(policy, failure_policy={"rules": [rule]}))
    assert not verdict.allowed
    assert f"annotation {P}non-spot-attempts: your spec.failurePolicy.rules[0] ({action})" in (
        verdict.message
    )
    config = parse_config("defaults: {non-spot-attempts: 1}")
    verdict, out = mutate(
        jobset({P + "backoff-limit": "2"}, failure_policy={"rules": [rule]}), config
    )
    assert verdict.allowed, verdict.message
    assert P + "non-spot-attempts" not in child(out, 0)["template"].get("metadata", {}).get(
        "annotations", {}
    )
    assert any("non-spot-attempts (cluster default) skipped" in w for w in verdict.warnings)


def test_admin_default_that_cannot_apply_is_skipped_everywhere():
    rule = {"name": "restart", "action": "RestartJobSet"}
    config = parse_config("defaults: {fail-non-retriable: true}")
    verdict, out = mutate(jobset(failure_policy={"rules": [rule]}), config)
    assert verdict.allowed
    assert out["spec"]["failurePolicy"]["rules"] == [rule]
    assert "podFailurePolicy" not in child(out, 0)
    # ...and the pod templates keep their restart policy: nothing needs Never now.
    assert "restartPolicy" not in child(out, 0)["template"]["spec"]
    assert any("fail-non-retriable (cluster default) skipped" in w for w in verdict.warnings)


# upstream: ruleIsApplicable / anyMatchFound in kubernetes-sigs/jobset
# pkg/controllers/failure_policy.go match a rule's onJobFailureMessagePatterns (Go regexps)
# against the failed Job's message, which matchPodFailurePolicy (kubernetes
# pkg/controller/job/pod_failure_policy.go) writes as "Container <name> for pod
# <namespace>/<pod> failed with exit code <code> matching FailJob rule at index <i>".
@pytest.mark.parametrize(
    ("pattern", "denied"),
    [
        (".*", True),
        ("exit code 1 ", True),  # 1 is not retriable: our rule fails the Job with it
        ("Container trainer ", True),
        # Our Count rule on DisruptionTarget is rules[0], our FailJob rule rules[1].
        ("matching FailJob rule at index 1$", True),
        ("matching FailJob rule at index 0$", False),
        ("for pod ml/pretrain-workers-1-", True),  # some pod of the set is named so
        ("exit code 143 ", False),  # retriable: our rule never fails a Job with it
        ("at index 5$", False),
        ("Container sidecar ", False),  # no such container
        ("(?=lookahead)", True),  # not Go's syntax: cannot tell, taken to match
    ],
)
def test_user_rule_restarting_on_our_message_contradicts(pattern, denied):
    rule = {
        "name": "restartOnMessage",
        "action": "RestartJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [pattern],
    }
    verdict, out = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [rule]})
    )
    assert verdict.allowed is not denied, verdict.message
    if denied:
        assert verdict.message.startswith(
            f"retry-policy: annotation {P}fail-non-retriable: your spec.failurePolicy.rules[0] "
            f"(RestartJobSet) matches Jobs failed by their podFailurePolicy first (its pattern "
            f"/{pattern}/"
        )
        config = parse_config("defaults: {fail-non-retriable: true}")
        verdict, out = mutate(jobset(failure_policy={"rules": [rule]}), config)
        assert verdict.allowed
        assert "podFailurePolicy" not in child(out, 0)
    else:
        assert out["spec"]["failurePolicy"]["rules"] == [rule, our_rule()]


@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize(
    ("pattern", "denied"),
    [
        ("^Container a .* at index 1$", True),
        ("^Container b .* at index 2$", True),
        ("^Container a .* at index 2$", False),  # rules[2] reads only b's exit code
        ("^Container b .* at index 1$", False),
        ("at index 0$", False),  # our Count or Ignore rule there fails no Job
    ],
)
def test_ruleIsApplicable_sees_each_failjob_rule_at_its_index_with_its_container(
    pattern, denied, ignore
):
    """upstream: ruleIsApplicable (kubernetes-sigs/jobset pkg/controllers/failure_policy.go)
    matches the message matchPodFailurePolicy wrote for the pod's FailJob rule: "Container
    <name> ... matching FailJob rule at index <i>". With one rule per application
    container after a rule on DisruptionTarget (Count, or Ignore with ignore-disruptions),
    container a's rule is at index 1 and b's at 2: each message has exactly its own pair."""
    rjob = replicated("workers")
    rjob["template"]["spec"]["template"] = pod_template("a", "b", restart_policy="Never")
    rule = {
        "name": "restartOnMessage",
        "action": "RestartJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [pattern],
    }
    annotations = {P + "fail-non-retriable": "true"}
    if ignore:
        annotations[P + "ignore-disruptions"] = "true"
    verdict, out = mutate(jobset(annotations, jobs=[rjob], failure_policy={"rules": [rule]}))
    assert verdict.allowed is not denied, verdict.message
    if not denied:
        first = ignore_disruptions_rule() if ignore else count_disruptions_rule()
        assert child(out, 0)["podFailurePolicy"]["rules"] == [
            first,
            non_retriable_rule([143], "FailJob", "a"),
            non_retriable_rule([143], "FailJob", "b"),
        ]


def test_a_user_failjobset_rule_with_a_pattern_covers_only_when_it_matches_everything():
    every = {
        "name": "stop",
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [".*"],
    }
    some = every | {"onJobFailureMessagePatterns": ["exit code 1 "]}
    restart = {"name": "restart", "action": "RestartJobSet"}
    annotated = jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [every]})
    verdict, out = mutate(annotated)
    assert verdict.allowed and out["spec"]["failurePolicy"]["rules"] == [every]
    verdict, _ = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [every, restart]})
    )
    assert verdict.allowed, verdict.message
    # Exit code 2 gets past the narrower rule to the restart: a contradiction.
    verdict, _ = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [some, restart]})
    )
    assert not verdict.allowed
    assert "rules[1] (RestartJobSet)" in verdict.message


# upstream: exceededMaxRestarts and the InPlaceRestart checks of validateCreate
# (kubernetes-sigs/jobset pkg/controllers/in_place_restart.go, pkg/webhooks/jobset_webhook.go):
# every child backoffLimit must be 2147483647, and each pod failure restarts the whole set
# in place, counted against maxRestarts.
def test_in_place_restart_children_get_the_limit_jobset_requires():
    policy = {"restartStrategy": "InPlaceRestart"}
    annotations = {P + "backoff-limit": "3", P + "fail-non-retriable": "true"}
    config = parse_config("guardRails: {maxBackoffLimit: 5}")
    verdict, out = mutate(jobset(annotations, failure_policy=policy), config)
    assert verdict.allowed, verdict.message
    assert out["spec"]["failurePolicy"]["maxRestarts"] == 3
    assert [child(out, i)["backoffLimit"] for i in (0, 1)] == [2147483647, 2147483647]
    assert (
        "retry-policy: spec.replicatedJobs[0].template.spec.backoffLimit -> 2147483647 "
        "(annotation retry-policy.dev/backoff-limit)" in verdict.warnings
    )
    # The guard rail still bounds maxRestarts, the budget.
    verdict, _ = mutate(jobset({P + "backoff-limit": "6"}, failure_policy=policy), config)
    assert not verdict.allowed and "6 is above this cluster's limit" in verdict.message


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("ignore-disruptions", "true", "a disrupted one too, restarts the whole set in place"),
        ("non-spot-attempts", "1", "restart in place on their nodes"),
    ],
)
def test_in_place_restart_cannot_honour_disruptions_or_placement(name, value, why):
    policy = {"restartStrategy": "InPlaceRestart"}
    verdict, _ = mutate(jobset({P + name: value, P + "backoff-limit": "3"}, failure_policy=policy))
    assert not verdict.allowed
    assert f"annotation {P}{name}: cannot apply to a JobSet: with restartStrategy" in (
        verdict.message
    )
    assert why in verdict.message
    verdict, _ = mutate(
        jobset(failure_policy=policy), parse_config(f"defaults: {{{name}: {value}}}")
    )
    assert verdict.allowed
    assert any(f"{name} (cluster default) skipped" in w for w in verdict.warnings)


@pytest.mark.parametrize(
    "action", ["RestartJobSetAndIgnoreMaxRestarts", "RestartJobAndIgnoreMaxRestarts"]
)
def test_uncounted_restarts_on_exhausted_pods_are_denied(action):
    # With such a rule every Job that runs out of pod retries restarts the set uncounted:
    # no maxRestarts we write can bound it.
    rule = {"name": "forever", "action": action, "onJobFailureReasons": ["BackoffLimitExceeded"]}
    verdict, _ = mutate(jobset({P + "backoff-limit": "3"}, failure_policy={"rules": [rule]}))
    assert not verdict.allowed
    assert verdict.message.startswith(
        f"retry-policy: annotation {P}backoff-limit: 3 (maxRestarts) would bound nothing: your "
        f"spec.failurePolicy.rules[0] ({action}) restarts without counting"
    )
    config = parse_config("defaults: {backoff-limit: 3}")
    verdict, out = mutate(jobset(failure_policy={"rules": [rule]}), config)
    assert verdict.allowed
    assert "maxRestarts" not in out["spec"]["failurePolicy"]
    assert "backoffLimit" not in child(out, 0)  # no 0 forced on the children either
    # A rule that only some messages reach, or that a counted rule shadows, is fine.
    narrow = rule | {"onJobFailureMessagePatterns": ["^never$"]}
    counted = {"name": "counted", "action": "RestartJobSet"}
    for rules in ([narrow], [counted, rule]):
        verdict, _ = mutate(jobset({P + "backoff-limit": "3"}, failure_policy={"rules": rules}))
        assert verdict.allowed, verdict.message


def test_user_rule_failing_the_jobset_already_covers_ours():
    rule = {"name": "stop", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    verdict, out = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [rule]})
    )
    assert verdict.allowed
    assert out["spec"]["failurePolicy"]["rules"] == [rule]
    assert child(out, 0)["podFailurePolicy"]["rules"] == [
        count_disruptions_rule(),
        non_retriable_rule([143], "FailJob", "trainer"),
    ]


def test_a_user_rule_with_our_name_is_denied():
    rule = {
        "name": RULE_NAME,
        "action": "RestartJobSet",
        "onJobFailureReasons": ["DeadlineExceeded"],
    }
    verdict, _ = mutate(
        jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [rule]})
    )
    assert not verdict.allowed
    assert (
        "spec.failurePolicy.rules[0].name: retryPolicyFailNonRetriable is the name of the rule"
        in (verdict.message)
    )


def test_merged_rules_are_checked_as_jobset_checks_them():
    rules = [
        {"name": "9lives", "action": "FailJobSet", "onJobFailureReasons": ["OOMKilled"]},
        {
            "action": "RestartJobSet",
            "onJobFailureReasons": ["DeadlineExceeded"],
            "targetReplicatedJobs": ["ps"],
        },
        {
            "name": "failurePolicyRule1",
            "action": "FailJobSet",
            "onJobFailureReasons": ["DeadlineExceeded"],
        },
    ]
    verdict, _ = mutate(jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": rules}))
    assert not verdict.allowed
    message = verdict.message
    assert "spec.failurePolicy.rules[0].name: '9lives' is not a valid rule name" in message
    assert "rules[0].onJobFailureReasons: 'OOMKilled' is not a Job failure reason" in message
    assert "rules[1].targetReplicatedJobs: 'ps' is not the name of a replicated Job" in message
    # JobSet names the unnamed rules[1] failurePolicyRule1: a clash with rules[2].
    assert "rules[2].name: 'failurePolicyRule1' is also the name of rules[1]" in message


def test_rule_name_limits():
    ok = [{"name": "a" * 128, "action": "FailJobSet"}, {"name": "a_b,c:d_", "action": "FailJobSet"}]
    assert validate_rules(ok, []) == []
    bad = [
        {"name": "a" * 129, "action": "FailJobSet"},
        {"name": "ends:", "action": "FailJobSet"},
        {"name": "ok", "action": "FailJob"},
    ]
    assert [p.where for p in validate_rules(bad, [])] == [
        "spec.failurePolicy.rules[0].name",
        "spec.failurePolicy.rules[1].name",
        "spec.failurePolicy.rules[2].action",
    ]


def rj(replicas: int) -> dict:
    """upstream TestValidateCreate's replicated Job ``rj``: Indexed, one pod."""
    out = replicated("rj", restart_policy="Never", completionMode="Indexed")
    out["template"]["spec"].update(parallelism=1, completions=1)
    out["replicas"] = replicas
    return out


@pytest.mark.parametrize(
    ("action", "name"),
    [
        # "jobset failure policy rule has RestartJob action and a replicated job with
        # replicas > 1024"
        ("RestartJob", "restartJobRule"),
        # "... has RestartJobAndIgnoreMaxRestarts action and a replicated job with replicas
        # > 1024"
        ("RestartJobAndIgnoreMaxRestarts", "restartJobAndIgnoreMaxRestartsRule"),
    ],
)
def test_TestValidateCreate_restart_job_rules_with_over_1024_replicas(action, name):
    # upstream: TestValidateCreate, validateFailurePolicy (maxReplicasPerReplicatedJob) in
    # kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go: JobSet refuses it whatever
    # we write, so admission says so rather than admit it.
    rules = [{"action": action, "name": name}]
    annotations = {P + "attempt-env": "true"}
    verdict, _ = mutate(jobset(annotations, jobs=[rj(1025)], failure_policy={"rules": rules}))
    assert not verdict.allowed
    assert (
        f"spec.failurePolicy.rules[0].action: {action} is refused by JobSet with a "
        "replicated Job of more than 1024 replicas (replicated Job rj has 1025)"
    ) in verdict.message
    assert not validate(
        jobset(annotations, jobs=[rj(1025)], failure_policy={"rules": rules})
    ).allowed
    # At the limit it is admitted, as is a whole-set restart beside 1025 replicas.
    verdict, _ = mutate(jobset(annotations, jobs=[rj(1024)], failure_policy={"rules": rules}))
    assert verdict.allowed, verdict.message
    whole = [{"action": "RestartJobSet", "name": name}]
    verdict, _ = mutate(jobset(annotations, jobs=[rj(1025)], failure_policy={"rules": whole}))
    assert verdict.allowed, verdict.message


def test_written_max_restarts_contradicting_annotation_is_denied():
    verdict, _ = mutate(jobset({P + "backoff-limit": "3"}, failure_policy={"maxRestarts": 2}))
    assert not verdict.allowed
    assert "3 contradicts spec.failurePolicy.maxRestarts: 2 in your spec" in verdict.message


def test_written_max_restarts_beats_admin_default():
    config = parse_config("defaults: {backoff-limit: 5}")
    verdict, out = mutate(jobset(failure_policy={"maxRestarts": 2}), config)
    assert verdict.allowed
    assert out["spec"]["failurePolicy"]["maxRestarts"] == 2
    # The user's own maxRestarts is no request for child budgets: those are left alone.
    assert "backoffLimit" not in child(out, 0)


def test_guard_rail_on_max_restarts():
    config = parse_config("guardRails: {maxBackoffLimit: 2}")
    verdict, _ = mutate(jobset({P + "backoff-limit": "3"}), config)
    assert not verdict.allowed and verdict.code == 403
    verdict, _ = mutate(jobset(failure_policy={"maxRestarts": 4}), config)
    assert (
        "spec.failurePolicy.maxRestarts (your spec spec.failurePolicy.maxRestarts): 4 is above"
        in (verdict.message)
    )


def test_child_backoff_limit_written_by_the_user_is_kept_and_budgets_multiply():
    jobs = [replicated("workers", backoffLimit=1)]
    annotations = {P + "backoff-limit": "3", P + "non-spot-attempts": "3"}
    verdict, out = mutate(jobset(annotations, jobs=jobs))
    assert verdict.allowed, verdict.message
    spec = child(out, 0)
    assert spec["backoffLimit"] == 1
    # (3 + 1) runs x (1 + 1) attempts each: the last 3 attempts lie in the last 2 runs.
    assert spec["template"]["metadata"]["annotations"] == {
        P + "backoff-limit": "3",
        P + "non-spot-attempts": "2",
    }
    assert (
        "retry-policy: the last 2 of 4 JobSet runs will run on non-spot nodes "
        "(at least the last 3 of 8 attempts)" in verdict.warnings
    )


@pytest.mark.parametrize(("n", "allowed"), [(8, True), (9, False)])
def test_non_spot_attempts_at_most_every_attempt_of_the_jobset(n, allowed):
    jobs = [replicated("workers", backoffLimit=1)]
    verdict, _ = mutate(
        jobset({P + "backoff-limit": "3", P + "non-spot-attempts": str(n)}, jobs=jobs)
    )
    assert verdict.allowed is allowed
    if not allowed:
        assert (
            "9 is more than the 8 attempts this JobSet has ((maxRestarts 3 + 1) x "
            "(backoffLimit 1 + 1)); accepted: 0 to 8" in verdict.message
        )


def test_written_on_failure_restart_policy_contradicts():
    jobs = [replicated("workers", restart_policy="OnFailure")]
    verdict, _ = mutate(jobset({P + "fail-non-retriable": "true"}, jobs=jobs, applied=True))
    assert not verdict.allowed
    assert (
        "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy is OnFailure: "
        "fail-non-retriable needs a podFailurePolicy" in verdict.message
    )


def test_on_failure_from_jobsets_own_webhook_is_changed_to_never():
    # upstream: jobSetWebhook.Default (pkg/webhooks/jobset_webhook.go) defaults an unset
    # restartPolicy to OnFailure (and completionMode to Indexed); with no record of the
    # manifest, a value equal to that default counts as unset.
    jobs = [replicated("workers", restart_policy="OnFailure")]
    verdict, out = mutate(jobset({P + "ignore-disruptions": "true"}, jobs=jobs))
    assert verdict.allowed, verdict.message
    assert child(out, 0)["template"]["spec"]["restartPolicy"] == "Never"
    assert (
        "retry-policy: spec.replicatedJobs[0].template.spec.template.spec.restartPolicy OnFailure "
        "-> Never (for the podFailurePolicy)" in verdict.warnings
    )


def test_contradictions_name_the_replicated_job():
    user = {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    jobs = [replicated("leader"), replicated("workers", podFailurePolicy={"rules": [user]})]
    verdict, _ = mutate(jobset({P + "ignore-disruptions": "true"}, jobs=jobs))
    assert not verdict.allowed
    assert "your spec.replicatedJobs[1].template.spec.podFailurePolicy.rules[0] (Count)" in (
        verdict.message
    )


def test_server_side_apply_ownership_of_a_child_field_is_read_through_the_list_key():
    obj = jobset({P + "backoff-limit": "3"}, jobs=[replicated("workers", backoffLimit=1)])
    owned = {"f:template": {"f:spec": {"f:backoffLimit": {}}}}
    fields = {"f:spec": {"f:replicatedJobs": {'k:{"name":"workers"}': owned}}}
    obj["metadata"]["managedFields"] = [
        {"manager": "kubectl", "operation": "Apply", "fieldsV1": fields}
    ]
    verdict, out = mutate(obj)
    assert verdict.allowed, verdict.message
    assert child(out, 0)["backoffLimit"] == 1  # the applier owns it: the user's own value
    owned.clear()
    verdict, out = mutate(obj)
    assert child(out, 0)["backoffLimit"] == 0  # set by someone else: the policy's to choose
    assert (
        "retry-policy: spec.replicatedJobs[0].template.spec.backoffLimit 1 -> 0 "
        "(annotation retry-policy.dev/backoff-limit)" in verdict.warnings
    )


def test_server_side_apply_records_say_nothing_about_items_of_unkeyed_lists():
    # An item without a name cannot be found in managedFields: unknown, so the rule for
    # no record applies (a value other than the default was written).
    obj = {
        "spec": {"items": [{"backoffLimit": 2}]},
        "metadata": {
            "managedFields": [{"operation": "Apply", "fieldsV1": {"f:spec": {"f:items": {}}}}]
        },
    }
    assert intent.user_wrote(obj, ("spec", "items", 0, "backoffLimit")) is None
    assert intent.explicit(obj, ("spec", "items", 0, "backoffLimit"), 2, None) is True
    assert intent.dotted(("spec", "items", 0, "backoffLimit")) == "spec.items[0].backoffLimit"


def test_fail_index_is_denied_on_a_jobset():
    verdict, _ = mutate(
        jobset({P + "fail-non-retriable": "true", P + "on-non-retriable": "fail-index"})
    )
    assert not verdict.allowed
    assert f"annotation {P}on-non-retriable: cannot apply to a JobSet" in verdict.message


def test_policy_annotations_on_a_replicated_job_template_are_denied():
    jobs = [replicated("workers")]
    jobs[0]["template"]["metadata"] = {"annotations": {P + "backoff-limit": "1"}}
    verdict, _ = mutate(jobset(jobs=jobs))
    assert not verdict.allowed
    assert (
        f"spec.replicatedJobs[0].template.metadata annotation {P}backoff-limit: a JobSet's Jobs "
        "follow the JobSet's policy" in verdict.message
    )


def test_jobset_without_replicated_jobs_is_denied():
    obj = jobset({P + "backoff-limit": "1"})
    obj["spec"]["replicatedJobs"] = []
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    assert "spec.replicatedJobs: a JobSet needs at least one replicated Job" in verdict.message
    obj["spec"]["replicatedJobs"] = [{"name": "w", "template": {}}]
    verdict, _ = mutate(obj)
    assert "spec.replicatedJobs[0].template.spec: a replicated Job needs a Job spec" in (
        verdict.message
    )


def test_written_terminating_or_failed_in_a_template_contradicts():
    jobs = [replicated("w", podReplacementPolicy="TerminatingOrFailed")]
    verdict, _ = mutate(jobset({P + "ignore-disruptions": "true"}, jobs=jobs))
    assert not verdict.allowed
    assert (
        "your spec.replicatedJobs[0].template.spec.podReplacementPolicy: TerminatingOrFailed"
        in verdict.message
    )


def test_child_jobs_are_left_alone_at_their_own_admission():
    owner = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "name": "pretrain",
        "uid": "u1",
        "controller": True,
    }
    obj = job({P + "backoff-limit": "3"}, spec={"backoffLimit": 0})
    obj["metadata"]["ownerReferences"] = [owner]
    config = parse_config("defaults: {backoff-limit: 5, fail-non-retriable: true}")
    verdict, out = mutate(obj, config)
    assert verdict.allowed and verdict.patch == [] and out == obj
    assert validate(obj, config).allowed


# --- pods of a JobSet: the attempt is the run (restart-attempt) -------------------------


def jobset_pod(restart_attempt, *, index_failures=None, where="labels", annotations=None):
    obj = pod(
        annotations or {P + "backoff-limit": "3", P + "non-spot-attempts": "1"}, owner=job_owner()
    )
    if restart_attempt is not None:
        obj["metadata"].setdefault(where, {})[RESTART_ATTEMPT] = str(restart_attempt)
    if index_failures is not None:
        obj["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] = str(
            index_failures
        )
    return obj


NON_SPOT = [{"matchExpressions": spot_requirements(Config().spot_node_labels)}]


def terms(obj):
    affinity = obj["spec"].get("affinity") or {}
    return (
        affinity.get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )


@pytest.mark.parametrize(
    ("restart_attempt", "non_spot"),
    [
        (0, False),
        (2, False),  # a = B - N: still spot
        (3, True),  # a = B + 1 - N: the last run
        (5, True),  # restarts that did not consume maxRestarts count too: early, never late
    ],
)
def test_pod_attempt_boundaries_count_runs(restart_attempt, non_spot):
    cache = FixedAttempts(0)
    # The pod's index has failed twice within this run: that must not move it.
    verdict, out = mutate(jobset_pod(restart_attempt, index_failures=2), attempts=cache)
    assert verdict.allowed, verdict.message
    assert (terms(out) == NON_SPOT) is non_spot
    assert cache.calls == []  # the restart-attempt label wins over the child Job's count
    if non_spot:
        assert f"from label {RESTART_ATTEMPT}" in verdict.warnings[0]


@pytest.mark.parametrize(("restart_attempt", "non_spot"), [(1, False), (2, True)])
def test_pod_boundaries_with_child_retries(restart_attempt, non_spot):
    # maxRestarts 3, child backoffLimit 1, non-spot-attempts 3 -> the last 2 runs.
    annotations = {P + "backoff-limit": "3", P + "non-spot-attempts": "2"}
    _, out = mutate(jobset_pod(restart_attempt, annotations=annotations), attempts=FixedAttempts(0))
    assert (terms(out) == NON_SPOT) is non_spot


def test_restart_attempt_annotation_when_the_label_is_missing():
    verdict, out = mutate(jobset_pod(3, where="annotations"), attempts=FixedAttempts(0))
    assert terms(out) == NON_SPOT
    assert f"from annotation {RESTART_ATTEMPT}" in verdict.warnings[0]


def test_malformed_restart_attempt_fails_open_without_asking_the_child_job():
    cache = FixedAttempts(3)
    verdict, out = mutate(jobset_pod("three"), attempts=cache)
    assert verdict.allowed and "affinity" not in out["spec"]
    assert cache.calls == []
    assert (
        f"attempt number unknown (label {RESTART_ATTEMPT} is not a number)" in verdict.warnings[0]
    )


def test_pods_from_a_mutated_jobset_get_placed_on_the_last_run():
    _, mutated = mutate(jobset(FULL))
    template = child(mutated, 1)["template"]
    obj = pod(template["metadata"]["annotations"], owner=job_owner())
    obj["metadata"]["labels"] = {RESTART_ATTEMPT: "3"}
    verdict, out = mutate(obj, attempts=FixedAttempts(0))
    assert terms(out) == NON_SPOT
    assert verdict.warnings[0].startswith("retry-policy: attempt 4 of 4")


# --- real parts ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        jobset(FULL),
        jobset(FULL, applied=True),
        jobset(
            {P + "fail-non-retriable": "true"},
            failure_policy={
                "rules": [
                    {
                        "name": "r",
                        "action": "RestartJobSet",
                        "onJobFailureReasons": ["DeadlineExceeded"],
                    }
                ]
            },
        ),
        jobset(
            {P + "non-spot-attempts": "3", P + "backoff-limit": "3"},
            jobs=[replicated("w", backoffLimit=1)],
        ),
    ],
    ids=["full", "applied", "user-rules", "child-budget"],
)
def test_jobset_is_idempotent_patch_applies_and_schema_valid(obj, tmp_path):
    once = assert_idempotent(obj)
    verdict, _ = mutate(obj)
    assert kubectl_patch(obj, verdict.patch, tmp_path) == once
    validate_schema(once)


def test_idempotent_with_admin_defaults():
    assert_idempotent(
        jobset(), parse_config("defaults: {backoff-limit: 2, ignore-disruptions: true}")
    )


def test_schema_validation_would_catch_bad_fields():
    _, out = mutate(jobset(FULL))
    bad = copy.deepcopy(out)
    bad["spec"]["failurePolicy"]["rules"][0]["action"] = "FailJob"
    with pytest.raises(AssertionError, match="is not one of"):
        validate_schema(bad)
    bad = copy.deepcopy(out)
    bad["spec"]["failurePolicy"]["maxRetries"] = 3
    with pytest.raises(AssertionError, match="Additional properties"):
        validate_schema(bad)
    bad = copy.deepcopy(out)
    child(bad, 0)["podFailurePolicy"]["rules"][0]["onPodCondition"] = []
    with pytest.raises(Exception, match="onPodCondition"):
        validate_schema(bad)


def test_validation_denies_a_jobset_the_mutating_webhook_missed():
    verdict = validate(jobset({P + "backoff-limit": "2"}))
    assert not verdict.allowed
    assert "spec.failurePolicy.maxRestarts -> 2" in verdict.message


# --- every conflicting rule, in one denial ---------------------------------------------------


def test_every_rule_that_keeps_fail_non_retriable_from_firing_is_named():
    """Errors are values: dropping only the first such rule would let the next one take
    the failure, so one denial names them all."""
    rules = [
        {"name": "restart", "action": "RestartJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
        {"name": "deadline", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]},
        {"name": "restartAny", "action": "RestartJobSetAndIgnoreMaxRestarts"},
    ]
    verdict, _ = mutate(jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": rules}))
    assert not verdict.allowed
    assert verdict.message == (
        f"retry-policy: annotation {P}fail-non-retriable: your spec.failurePolicy.rules[0] "
        "(RestartJobSet) and rules[2] (RestartJobSetAndIgnoreMaxRestarts) match Jobs failed by "
        "their podFailurePolicy first (JobSet takes the first that applies: drop or narrow "
        "each), so a non-retriable exit would not fail the JobSet"
    )


def test_every_rule_restarting_exhausted_jobs_uncounted_is_named():
    leader = {
        "name": "leaderForever",
        "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": ["BackoffLimitExceeded"],
        "targetReplicatedJobs": ["leader"],
    }
    workers = {
        "name": "workersForever",
        "action": "RestartJobAndIgnoreMaxRestarts",
        "targetReplicatedJobs": ["workers"],
    }
    verdict, _ = mutate(
        jobset({P + "backoff-limit": "3"}, failure_policy={"rules": [leader, workers]})
    )
    assert not verdict.allowed
    message = verdict.message
    assert message.count(f"annotation {P}backoff-limit") == 1
    assert (
        "your spec.failurePolicy.rules[0] (RestartJobSetAndIgnoreMaxRestarts) restarts without "
        "counting when a Job's pods run out of retries (BackoffLimitExceeded) and "
        "spec.failurePolicy.rules[1] (RestartJobAndIgnoreMaxRestarts) restarts without "
        "counting when a Job's pods run out of retries (BackoffLimitExceeded or FailedIndexes "
        "or MaxFailedIndexesExceeded), so the set would restart forever; drop the rules or "
        "backoff-limit"
    ) in message


def test_every_replicated_job_an_oom_would_fail_the_set_for_is_named():
    rules = [
        {"name": "leaderFails", "action": "FailJobSet", "targetReplicatedJobs": ["leader"]},
        {"name": "workersFail", "action": "FailJobSet", "targetReplicatedJobs": ["workers"]},
    ]
    factor = {P + "oom-memory-factor": "1.5", P + "oom-memory-limit": "16Gi"}
    verdict, _ = mutate(jobset(factor, failure_policy={"rules": rules}))
    assert not verdict.allowed
    assert (
        f"annotation {P}oom-memory-factor: your spec.failurePolicy.rules[0] (FailJobSet) "
        "applies when replicated Job leader fails with BackoffLimitExceeded and "
        "spec.failurePolicy.rules[1] (FailJobSet) applies when replicated Job workers fails "
        "with BackoffLimitExceeded, which is how an OOM kill ends them"
    ) in verdict.message


def test_every_single_job_restart_rule_beside_too_many_replicas_is_a_problem():
    rules = [
        {"action": "RestartJob", "name": "one"},
        {"action": "RestartJobSet", "name": "whole"},
        {"action": "RestartJobAndIgnoreMaxRestarts", "name": "two"},
    ]
    problems = validate_rules(rules, [rj(1025)])
    assert [p.where for p in problems] == [
        "spec.failurePolicy.rules[0].action",
        "spec.failurePolicy.rules[2].action",
    ]


def test_what_an_owner_changes_about_its_jobset_is_what_it_declares(monkeypatch):
    """The JobSet's folder names no owner: a kind that makes JobSets declares what that
    changes there (``Owner``, ``owned_by``): its steps kept out of the policy, what bounds
    the set's restarts in place; an owner that declared nothing changes nothing."""
    declared = Owner(
        "example.dev",
        "example.dev/step",
        ("fetch",),
        "the pipeline's fetch keeps its own retries",
        bound="its Pipeline",
        bound_explained="its Pipeline's deadline",
    )
    monkeypatch.setitem(OWNERS, "Pipeline", declared)
    made = jobset(jobs=[replicated("fetch"), replicated("train")])
    made["spec"]["replicatedJobs"][0]["template"]["metadata"] = {
        "labels": {"example.dev/step": "fetch"}
    }
    ref = {"apiVersion": "example.dev/v1", "kind": "Pipeline", "name": "p", "uid": "p-uid"}
    made["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
    assert owner_of(made) == (declared, "example.dev/v1")
    assert initializers(made) == [0]
    ref["apiVersion"] = "other.dev/v1"  # the same kind's name in another group
    made["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
    assert initializers(made) == []
    made["metadata"]["ownerReferences"] = [{**ref, "kind": "Workflow", "controller": True}]
    assert owner_of(made) is None and initializers(made) == []
