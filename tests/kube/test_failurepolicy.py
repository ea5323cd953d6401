"""podFailurePolicy: the API server's validation rules (``validatePodFailurePolicyRule``,
pkg/apis/batch/validation/validation.go) and rule evaluation (``matchPodFailurePolicy``,
pkg/controller/job/pod_failure_policy.go)."""

from __future__ import annotations

import pytest

from testkit.builders import job
from webhook.kube import failurepolicy as fp
from webhook.kube.failurepolicy import ContainerExit, PodFailure


def spec(rules, **extra):
    base = {
        "podFailurePolicy": {"rules": rules},
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main"}],
                "initContainers": [{"name": "setup"}],
            }
        },
    }
    base.update(extra)
    return base


def codes(operator, values, **extra):
    return {"action": "FailJob", "onExitCodes": {"operator": operator, "values": values, **extra}}


def messages(job_spec):
    return [str(p) for p in fp.validate(job_spec)]


def test_valid_policy_has_no_problems():
    rules = [
        fp.ignore_disruptions_rule(),
        fp.non_retriable_rule([137, 143]),
        codes("In", [1, 2], containerName="setup"),
    ]
    assert messages(spec(rules, podReplacementPolicy="Failed")) == []


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (codes("In", [2, 1]), "must be sorted in ascending order"),
        (codes("In", [1, 1]), "must not repeat a value"),
        (codes("In", [0, 1]), "must not contain 0 with operator In"),
        (codes("Between", [1]), "'Between' is not In or NotIn"),
        (codes("In", []), "must be a non-empty list of integers"),
        (codes("In", list(range(1, 257))), "has 256 entries; at most 255"),
        (codes("In", [1], containerName="ghost"), "'ghost' is not a container"),
        (
            {"action": "Retry", "onExitCodes": {"operator": "In", "values": [1]}},
            "'Retry' is not one of",
        ),
        ({"action": "Count"}, "needs exactly one of onExitCodes or onPodConditions"),
        (
            {
                "action": "Count",
                "onExitCodes": {"operator": "In", "values": [1]},
                "onPodConditions": [{"type": "X"}],
            },
            "needs exactly one",
        ),
        ({"action": "Ignore", "onPodConditions": [{"type": "X", "status": "Yes"}]}, "is not True"),
        ({"action": "Ignore", "onPodConditions": [{"type": "X"}] * 21}, "has 21 patterns"),
        (
            codes("NotIn", [1]) | {"action": "FailIndex"},
            "FailIndex needs spec.backoffLimitPerIndex",
        ),
    ],
)
def test_each_api_rule(rule, expected):
    found = messages(spec([rule]))
    assert any(expected in m for m in found), found


def test_not_in_may_contain_zero():
    assert messages(spec([codes("NotIn", [0, 143])])) == []


def test_too_many_rules():
    rules = [codes("In", [i]) for i in range(1, 22)]
    assert any("has 21 rules; Kubernetes allows at most 20" in m for m in messages(spec(rules)))


def test_restart_policy_and_replacement_policy():
    job_spec = spec([fp.ignore_disruptions_rule()], podReplacementPolicy="TerminatingOrFailed")
    job_spec["template"]["spec"]["restartPolicy"] = "OnFailure"
    found = messages(job_spec)
    assert any("needs restartPolicy: Never" in m for m in found)
    assert any("only Failed is allowed" in m for m in found)


def test_TestValidateJob_onfailure_with_an_empty_rule_list_is_refused():
    # upstream: TestValidateJob, `spec.template.spec.restartPolicy: Invalid value:
    # "OnFailure": only "Never" is supported when podFailurePolicy is specified`
    # (pkg/apis/batch/validation/validation_test.go): validateJobSpec checks the pod's
    # restartPolicy whenever a podFailurePolicy is there, with no rule in it too.
    manifest = job(restart_policy="OnFailure", spec={"podFailurePolicy": {"rules": []}})
    found = fp.validate(manifest["spec"])
    assert [(p.where, p.reason) for p in found] == [
        ("spec.template.spec.restartPolicy", "restart-policy")
    ]
    assert "'OnFailure'; a podFailurePolicy needs restartPolicy: Never" in found[0].message
    never = job(spec={"podFailurePolicy": {"rules": []}})
    assert fp.validate(never["spec"]) == []


def test_no_policy_no_problems():
    assert fp.validate({"template": {}}) == []


def test_rule_key_treats_value_order_and_default_status_as_same():
    a = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert fp.rule_key(a) == fp.rule_key(fp.ignore_disruptions_rule())
    assert fp.rule_key(codes("In", [2, 1])) == fp.rule_key(codes("In", [1, 2]))
    assert fp.rule_key(codes("In", [1])) != fp.rule_key(codes("NotIn", [1]))


def test_merge_keeps_user_order_and_skips_duplicates():
    user = [codes("In", [3]), fp.ignore_disruptions_rule()]
    merged, added = fp.merge(user, [fp.ignore_disruptions_rule(), fp.non_retriable_rule([143])])
    assert merged == [*user, fp.non_retriable_rule([143])]
    assert added == [fp.non_retriable_rule([143])]


# --- evaluation: the Job controller's matching ------------------------------------

RULES = [
    fp.ignore_disruptions_rule(),
    codes("In", [42], containerName="main"),
    fp.non_retriable_rule([143]),
]


def test_first_match_wins():
    failure = PodFailure((ContainerExit("main", 1),), (("DisruptionTarget", "True"),))
    match = fp.evaluate(RULES, failure)
    assert (match.index, match.action) == (0, "Ignore")


def test_not_in_ignores_containers_that_exited_zero():
    failure = PodFailure((ContainerExit("main", 0), ContainerExit("side", 143)))
    assert fp.evaluate(RULES, failure) is None


def test_not_in_matches_other_codes():
    match = fp.evaluate(RULES, PodFailure((ContainerExit("main", 1),)))
    assert (match.index, match.action, match.container.exit_code) == (2, "FailJob", 1)


@pytest.mark.parametrize("values", [3, True, None, "1,2", [1, "2"], [True], [{}]])
def test_a_rule_whose_exit_codes_are_not_a_list_of_numbers_matches_nothing(values):
    """Only a file can hold one (the API server refuses it, ``validate`` says why); the
    rules after it are still evaluated."""
    rules = [
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": values}},
        {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [143]}},
    ]
    match = fp.evaluate(rules, PodFailure((ContainerExit("main", 1),)))
    assert (match.index, match.action) == (1, "Count")
    assert fp.validate({"podFailurePolicy": {"rules": rules[:1]}})  # and it is reported


def test_container_name_narrows():
    assert (
        fp.evaluate(
            [codes("In", [42], containerName="main")], PodFailure((ContainerExit("side", 42),))
        )
        is None
    )
    match = fp.evaluate(RULES, PodFailure((ContainerExit("main", 42),)))
    assert match.index == 1


def test_condition_status_must_match():
    rules = [fp.ignore_disruptions_rule()]
    assert fp.evaluate(rules, PodFailure(conditions=(("DisruptionTarget", "False"),))) is None


def test_pod_failure_from_pod_status():
    pod = {
        "status": {
            "conditions": [{"type": "DisruptionTarget", "status": "True"}],
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"exitCode": 137}}},
                {"name": "side", "state": {"running": {}}},
            ],
            "initContainerStatuses": [{"name": "setup", "state": {"terminated": {"exitCode": 0}}}],
        }
    }
    failure = PodFailure.from_pod(pod)
    assert failure.exits == (ContainerExit("main", 137), ContainerExit("setup", 0, init=True))
    assert failure.conditions == (("DisruptionTarget", "True"),)
