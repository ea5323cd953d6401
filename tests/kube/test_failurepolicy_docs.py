"""Our podFailurePolicy evaluation against upstream Kubernetes: the Job controller's source
and the examples of the Kubernetes documentation.

Controller: kubernetes/kubernetes, pkg/controller/job/pod_failure_policy.go
(``matchPodFailurePolicy``, ``matchOnExitCodes``, ``matchOnPodConditions``,
``getMatchingContainerFromList``) and its table test pod_failure_policy_test.go; the Job's
failure reasons and their order: pkg/controller/job/job_controller.go (``syncJob``:
FailJob's PodFailurePolicy before ``exceedsBackoffLimit := jobCtx.failed >
*job.Spec.BackoffLimit``), pkg/controller/job/indexed_job_utils.go (``isIndexFailed``).

Documentation: kubernetes/website, content/en/docs/tasks/job/pod-failure-policy.md and
content/en/docs/concepts/workloads/controllers/job.md, with the manifests they show from
content/en/examples/controllers/ (rebuilt here as data; each test names its file).
Every example runs through ``explain`` (the same path as admission: API defaults, the
engine, then the one shared evaluation).
"""

from __future__ import annotations

import copy

import pytest

from testkit.explain import manifest
from webhook import cli, explain
from webhook.kube import failurepolicy as fp
from webhook.kube.failurepolicy import ContainerExit, PodFailure
from webhook.policy.config import Config


def rule(action, **match):
    return {"action": action, **match}


def exit_codes(operator, values, container=None):
    codes = {"operator": operator, "values": values}
    if container:
        codes["containerName"] = container
    return {"onExitCodes": codes}


def conditions(*patterns):
    return {"onPodConditions": [dict(p) for p in patterns]}


DISRUPTED = (("DisruptionTarget", "True"),)


# --- pod_failure_policy.go and pod_failure_policy_test.go ---------------------------------


def test_unknown_action_on_exit_codes_is_skipped_and_the_next_rule_matches():
    # "unknown action for rule matching by exit codes - skip rule with unknown action"
    rules = [
        rule("UnknownAction", **exit_codes("In", [1, 2])),
        rule("FailJob", **exit_codes("In", [2, 3])),
    ]
    match = fp.evaluate(rules, PodFailure((ContainerExit("main-container", 2),)))
    assert (match.index, match.action, match.container.name) == (1, "FailJob", "main-container")


def test_unknown_action_on_pod_conditions_is_skipped():
    # "unknown action for rule matching by pod conditions - skip rule with unknown action"
    rules = [
        rule("UnkonwnAction", **conditions({"type": "DisruptionTarget", "status": "True"})),
        rule("Ignore", **conditions({"type": "DisruptionTarget", "status": "True"})),
    ]
    match = fp.evaluate(rules, PodFailure(conditions=DISRUPTED))
    assert (match.index, match.action, fp.counts(match)) == (1, "Ignore", False)


def test_unknown_operator_never_matches():
    # "unknown operator - rule with unknown action is skipped for onExitCodes"
    rules = [
        rule("Ignore", **exit_codes("UnknownOperator", [1, 2])),
        rule("FailJob", **exit_codes("In", [2, 3])),
    ]
    match = fp.evaluate(rules, PodFailure((ContainerExit("main-container", 2),)))
    assert (match.index, match.action) == (1, "FailJob")


def test_no_rule_matched_counts():
    # matchPodFailurePolicy returns (nil, true, nil): the default handling counts the failure.
    assert fp.evaluate([], PodFailure((ContainerExit("main", 2),))) is None
    assert fp.counts(None) is True


@pytest.mark.parametrize(
    ("action", "counted"),
    [("Ignore", False), ("Count", True), ("FailJob", True), ("FailIndex", True)],
)
def test_only_ignore_is_not_counted(action, counted):
    # countFailed: false for Ignore only; Count, FailJob and FailIndex are counted (FailIndex
    # with the JobBackoffLimitPerIndex gate, GA and locked on since Kubernetes 1.33).
    match = fp.evaluate(
        [rule(action, **exit_codes("In", [1, 2, 3]))], PodFailure((ContainerExit("c", 2),))
    )
    assert match.action == action and fp.counts(match) is counted


def test_successful_containers_are_skipped_by_the_rules():
    # "successful containers are skipped by the rules": NotIn [111] with main 111, others 0.
    failure = PodFailure(
        (
            ContainerExit("init-container", 0, init=True),
            ContainerExit("main-container", 111),
            ContainerExit("suppport-container", 0),
        )
    )
    assert fp.evaluate([rule("FailJob", **exit_codes("NotIn", [111]))], failure) is None


def test_not_in_zero_matches_a_failed_container():
    # "pod failure policy with NotIn operator and value 0"
    failure = PodFailure(
        (ContainerExit("main-container", 1), ContainerExit("suppport-container", 0))
    )
    match = fp.evaluate([rule("FailJob", **exit_codes("NotIn", [0]))], failure)
    assert (match.action, match.container.name, match.container.exit_code) == (
        "FailJob",
        "main-container",
        1,
    )


def test_regular_containers_are_examined_before_init_containers():
    # matchOnExitCodes: ContainerStatuses first, then InitContainerStatuses.
    failure = PodFailure((ContainerExit("setup", 2, init=True), ContainerExit("main", 1)))
    match = fp.evaluate([rule("Count", **exit_codes("In", [1, 2]))], failure)
    assert match.container == ContainerExit("main", 1)
    only_init = PodFailure((ContainerExit("setup", 2, init=True), ContainerExit("main", 0)))
    match = fp.evaluate([rule("Count", **exit_codes("In", [1, 2]))], only_init)
    assert match.container == ContainerExit("setup", 2, init=True)


def test_container_name_narrows_to_that_container():
    # getMatchingContainerFromList: requirement.ContainerName == nil || == status name.
    failure = PodFailure((ContainerExit("sidecar", 42), ContainerExit("main", 1)))
    assert fp.evaluate([rule("FailJob", **exit_codes("In", [42], "main"))], failure) is None
    match = fp.evaluate([rule("FailJob", **exit_codes("In", [1], "main"))], failure)
    assert match.container.name == "main"


def test_only_terminated_containers_have_exit_codes():
    # "This container is still be terminating. There is no exit code to match."
    pod = {
        "status": {
            "containerStatuses": [
                {"name": "foo", "state": {"running": {}}},
                {"name": "bar", "state": {"terminated": {"exitCode": 2}}},
            ]
        }
    }
    match = fp.evaluate([rule("Count", **exit_codes("In", [1, 2, 3]))], PodFailure.from_pod(pod))
    assert (match.action, match.container.name) == ("Count", "bar")


def test_condition_status_must_equal_the_pattern_status():
    # "ignore rule matches by the status=False" and its counterpart that does not match.
    pattern = rule("Ignore", **conditions({"type": "DisruptionTarget", "status": "False"}))
    assert fp.evaluate([pattern], PodFailure(conditions=(("DisruptionTarget", "False"),)))
    assert fp.evaluate([pattern], PodFailure(conditions=DISRUPTED)) is None


def test_pod_conditions_are_taken_in_the_pods_order():
    # matchOnPodConditions loops over the pod's conditions, then the patterns: the matched
    # condition is the pod's first one that any pattern matches.
    patterns = conditions({"type": "A", "status": "True"}, {"type": "B", "status": "True"})
    failure = PodFailure(conditions=(("B", "True"), ("A", "True")))
    assert fp.evaluate([rule("FailJob", **patterns)], failure).condition == "B"


def test_exit_codes_are_used_when_a_rule_has_both_requirements():
    # "if OnExitCodes != nil { ... } else if OnPodConditions != nil": conditions are not
    # looked at in a rule that has exit codes (the API forbids both; the controller
    # still decides this way).
    both = {
        **rule("FailJob", **exit_codes("In", [5])),
        **conditions({"type": "X", "status": "True"}),
    }
    failure = PodFailure((ContainerExit("main", 1),), (("X", "True"),))
    assert fp.evaluate([both], failure) is None


# --- the documented examples ----------------------------------------------------------


def docs_job(name, spec):
    return manifest(name=name, spec=spec)


def run(obj, events):
    prepared, _ = cli.prepare(obj, None)
    (item,) = explain.explain(prepared, Config(), None, explain.parse_events(events))
    return item


#: content/en/examples/controllers/job-pod-failure-policy-example.yaml (the concepts page).
EXAMPLE = docs_job(
    "job-pod-failure-policy-example",
    {
        "completions": 12,
        "parallelism": 3,
        "backoffLimit": 6,
        "podFailurePolicy": {
            "rules": [
                rule("FailJob", **exit_codes("In", [42], "main")),
                # The example leaves status out: the API defaults it to "True".
                rule("Ignore", onPodConditions=[{"type": "DisruptionTarget"}]),
            ]
        },
    },
)


def test_example_exit_42_in_main_fails_the_job():
    # "an exit code of 42 means that the entire Job failed"
    item = run(EXAMPLE, "42")
    assert item.simulation.ending.reason == "PodFailurePolicy"
    assert item.simulation.steps[0].rule == 1


def test_example_other_exit_codes_are_retried_until_the_backoff_limit():
    # "any other exit code represents that the container failed ... The Pod will be
    # re-created if the total number of restarts is below backoffLimit". The page says the
    # Job fails when the limit "is reached"; the controller fails it when counted failures
    # exceed backoffLimit, so the 7th counted failure (6 retries) ends it.
    item = run(EXAMPLE, ",".join(["1"] * 6))
    assert item.simulation.ending.state == "Running"
    item = run(EXAMPLE, ",".join(["1"] * 7))
    assert item.simulation.ending.reason == "BackoffLimitExceeded"
    assert [s.counted for s in item.simulation.steps] == [True] * 7


def test_example_disruptions_are_ignored():
    # "The second rule ... specifying the Ignore action for failed Pods with condition
    # DisruptionTarget excludes Pod disruptions from being counted towards the
    # .spec.backoffLimit limit of retries."
    item = run(EXAMPLE, ",".join(["disruption"] * 20))
    assert item.simulation.ending.state == "Running"
    assert not any(s.counted for s in item.simulation.steps)
    assert all(s.rule == 2 and s.action == "Ignore" for s in item.simulation.steps)


def test_example_rules_read_as_the_documentation_says():
    item = run(EXAMPLE, "1")
    first, second = item.rules
    assert (first.when, first.then) == ("exit code 42 in container main", "the Job fails at once")
    assert second.when == (
        "the pod was disrupted (preemption, eviction, node drain, or the kubelet's "
        "node-pressure eviction)"
    )
    assert second.then == "retried, does not count"
    assert {first.origin, second.origin} == {"your rule"}


#: content/en/examples/controllers/job-pod-failure-policy-failjob.yaml
FAILJOB = docs_job(
    "job-pod-failure-policy-failjob",
    {
        "completions": 8,
        "parallelism": 2,
        "backoffLimit": 6,
        "podFailurePolicy": {"rules": [rule("FailJob", **exit_codes("In", [42], "main"))]},
    },
)


def test_failjob_example_ends_the_job_with_reason_pod_failure_policy():
    # "Container main for pod default/... failed with exit code 42 matching FailJob rule
    # at index 0", condition reason PodFailurePolicy.
    failure = PodFailure((ContainerExit("main", 42),))
    match = fp.evaluate(FAILJOB["spec"]["podFailurePolicy"]["rules"], failure)
    assert (match.index, match.action, match.container) == (0, "FailJob", ContainerExit("main", 42))
    item = run(FAILJOB, "42")
    assert (item.simulation.ending.state, item.simulation.ending.reason) == (
        "Failed",
        "PodFailurePolicy",
    )
    assert len(item.simulation.steps) == 1


def test_failjob_example_without_the_policy_takes_six_retries():
    # "if the Pod failure policy was disabled it would take 6 retries of the Pod"
    plain = copy.deepcopy(FAILJOB)
    del plain["spec"]["podFailurePolicy"]
    item = run(plain, ",".join(["42"] * 8))
    assert item.simulation.ending.reason == "BackoffLimitExceeded"
    assert len(item.simulation.steps) == 7  # the first pod and 6 retries
    assert item.simulation.unused == ["42"]


#: content/en/examples/controllers/job-pod-failure-policy-ignore.yaml
IGNORE = docs_job(
    "job-pod-failure-policy-ignore",
    {
        "completions": 4,
        "parallelism": 2,
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [rule("Ignore", onPodConditions=[{"type": "DisruptionTarget"}])]
        },
    },
)


def test_ignore_example_a_drain_does_not_count_with_backoff_limit_zero():
    # Draining the node evicts the pod; ".status.failed ... the counter for the Job is not
    # incremented"; "The Job resumes and succeeds."
    item = run(IGNORE, "disruption")
    assert item.simulation.ending.state == "Running"
    assert item.simulation.steps[0].counted is False


def test_ignore_example_without_the_policy_the_drain_fails_the_job():
    # "if the Pod failure policy was disabled the Pod disruption would result in
    # terminating the entire Job (as the .spec.backoffLimit is set to 0)"
    plain = copy.deepcopy(IGNORE)
    del plain["spec"]["podFailurePolicy"]
    item = run(plain, "disruption")
    assert item.simulation.ending.reason == "BackoffLimitExceeded"


#: content/en/examples/controllers/job-pod-failure-policy-config-issue.yaml
CONFIG_ISSUE = docs_job(
    "job-pod-failure-policy-config-issue",
    {
        "completions": 8,
        "parallelism": 2,
        "backoffLimit": 6,
        "podFailurePolicy": {
            "rules": [rule("FailJob", **conditions({"type": "ConfigIssue", "status": "True"}))]
        },
    },
)


def test_config_issue_example_custom_condition_fails_the_job():
    # "Pod default/... has condition ConfigIssue matching FailJob rule at index 0"; the pod
    # never started (Pending, then deleted), so it has no exit code at all.
    pod = {"status": {"phase": "Failed", "conditions": [{"type": "ConfigIssue", "status": "True"}]}}
    match = fp.evaluate(CONFIG_ISSUE["spec"]["podFailurePolicy"]["rules"], PodFailure.from_pod(pod))
    assert (match.index, match.action, match.condition) == (0, "FailJob", "ConfigIssue")
    item = run(CONFIG_ISSUE, "1")
    assert item.rules[0].when == "the pod has condition ConfigIssue"
    assert item.simulation.ending.state == "Running"  # an exit code alone is not the condition


#: content/en/examples/controllers/job-backoff-limit-per-index-failindex.yaml
FAILINDEX = docs_job(
    "job-backoff-limit-per-index-failindex",
    {
        "completions": 4,
        "parallelism": 2,
        "completionMode": "Indexed",
        "backoffLimitPerIndex": 1,
        "backoffLimit": 6,
        "podFailurePolicy": {"rules": [rule("FailIndex", **exit_codes("In", [42], "main"))]},
    },
)


def test_failindex_example_index_zero_is_retried_once():
    # "there are two Pods with index 0, because the backoff limit allowed for one retry"
    item = run(FAILINDEX, "1,1")
    steps = item.simulation.steps
    assert [s.counted for s in steps] == [True, True]
    assert item.simulation.ending.state == "IndexFailed"
    assert item.simulation.ending.reason == "FailedIndexes"
    assert [row.failures_before for row in item.attempts.rows] == [0, 1]


def test_failindex_example_index_one_fails_without_retry():
    # "there is only one Pod with index 1, because the exit code of the failed Pod matched
    # the Pod failure policy with the FailIndex action"
    item = run(FAILINDEX, "42,42")
    assert len(item.simulation.steps) == 1
    assert item.simulation.steps[0].action == "FailIndex"
    assert item.simulation.ending.state == "IndexFailed"
    assert item.simulation.unused == ["42"]


def test_failindex_example_failed_pods_add_up_to_three():
    # "the number of failed Pods, indicated by the status field "failed" equals 3":
    # index 0's two failures and index 1's one; FailIndex failures are counted.
    index0 = run(FAILINDEX, "1,1").simulation.steps
    index1 = run(FAILINDEX, "42").simulation.steps
    assert sum(s.counted for s in index0 + index1) == 3


@pytest.mark.parametrize("obj", [EXAMPLE, FAILJOB, IGNORE, CONFIG_ISSUE, FAILINDEX])
def test_documented_examples_pass_our_api_validation(obj):
    prepared, _ = cli.prepare(obj, None)
    assert fp.validate(prepared["spec"]) == []
