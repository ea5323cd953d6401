"""One denial says every problem, and its advice leads to an admitted object (issue 49).

Each case is a manifest with several problems. The denial must report each one, with
the advice its message gives; doing what one problem's message says must bring up no
problem the denial did not report, and doing them all must admit the object. The
advice is written here as a change to the manifest, beside the words of the message
that ask for it, so a message that stops asking for it fails too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from testkit.builders import P, job, pod
from testkit.failureaware import trainer
from testkit.kinds import pytorchjob
from testkit.workloads import mutate, validate

Fix = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Advice:
    """One problem of a denial: where it is (its subject, in part), its reason, words of
    its message that say what to do, and that doing, on the manifest."""

    where: str
    reason: str
    says: str
    fix: Fix


def annotate(**values: str | None) -> Fix:
    def fix(obj: dict[str, Any]) -> None:
        annotations = obj["metadata"].setdefault("annotations", {})
        for key, value in values.items():
            name = P + key.replace("_", "-")
            if value is None:
                annotations.pop(name, None)
            else:
                annotations[name] = value

    return fix


def template(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def never(obj: dict[str, Any]) -> None:
    template(obj)["restartPolicy"] = "Never"


def no_spot_selector(obj: dict[str, Any]) -> None:
    template(obj).pop("nodeSelector")


def no_restart_policy(obj: dict[str, Any]) -> None:
    for replica in obj["spec"]["pytorchReplicaSpecs"].values():
        replica.pop("restartPolicy", None)


SPOT = {"cloud.google.com/gke-spot": "true"}


def on_failure_spot_job() -> dict[str, Any]:
    obj = job({P + "non-spot-attempts": "1"}, restart_policy="OnFailure")
    template(obj)["nodeSelector"] = dict(SPOT)
    return obj


def oom_job(limit: str | None) -> dict[str, Any]:
    annotations = {P + "oom-memory-factor": "1.5"}
    if limit is not None:
        annotations[P + "oom-memory-limit"] = limit
    return job(annotations, restart_policy="OnFailure", containers=[trainer("2Gi", None)])


NEVER = "accepted: spec.template.spec.restartPolicy: Never"

CASES: dict[str, tuple[Callable[[], dict[str, Any]], list[Advice]]] = {
    # The if/elif chain of the non-spot check said only the first.
    "on-failure-and-spot-pinned": (
        on_failure_spot_job,
        [
            Advice("non-spot-attempts", "restart-policy", NEVER, never),
            Advice(
                "non-spot-attempts",
                "contradiction",
                "accepted: a template that does not require them",
                no_spot_selector,
            ),
        ],
    ),
    # The factor turned off by OnFailure hid the limit below the request, and warned
    # that the limit had no effect without the factor.
    "oom-on-failure-and-limit-too-low": (
        lambda: oom_job("1Gi"),
        [
            Advice("oom-memory-factor", "restart-policy", NEVER, never),
            Advice(
                "oom-memory-limit",
                "memory-limit-too-low",
                "accepted: a quantity of at least 2Gi",
                annotate(oom_memory_limit="2Gi"),
            ),
        ],
    ),
    # A missing limit says what the limit will be checked against.
    "oom-on-failure-and-no-limit": (
        lambda: oom_job(None),
        [
            Advice("oom-memory-factor", "restart-policy", NEVER, never),
            Advice(
                "oom-memory-factor",
                "missing-memory-limit",
                "accepted: at least 2Gi (container trainer's memory request)",
                annotate(oom_memory_limit="2Gi"),
            ),
        ],
    ),
    # ignore-disruptions denied for OnFailure no longer makes max-disruptions lack it.
    "ignore-disruptions-on-failure-with-a-budget": (
        lambda: job(
            {P + "ignore-disruptions": "true", P + "max-disruptions": "2"},
            restart_policy="OnFailure",
        ),
        [Advice("ignore-disruptions", "restart-policy", NEVER, never)],
    ),
    # More non-spot attempts than attempts, and a template pinned to spot nodes.
    "too-many-non-spot-and-spot-pinned": (
        lambda: {
            **(obj := job({P + "non-spot-attempts": "9", P + "backoff-limit": "2"})),
            "spec": {
                **obj["spec"],
                "template": {
                    **obj["spec"]["template"],
                    "spec": {**template(obj), "nodeSelector": dict(SPOT)},
                },
            },
        },
        [
            Advice(
                "non-spot-attempts",
                "too-many-non-spot",
                "accepted: 0 to 3",
                annotate(non_spot_attempts="3"),
            ),
            Advice(
                "non-spot-attempts",
                "contradiction",
                "accepted: a template that does not require them",
                no_spot_selector,
            ),
        ],
    ),
    # A bare Pod: nothing counts its attempts, so it says its own (issue 49).
    "bare-pod-non-spot": (
        lambda: pod({P + "non-spot-attempts": "1"}),
        [
            Advice(
                "non-spot-attempts",
                "missing-backoff-limit",
                f"needs {P}backoff-limit",
                annotate(backoff_limit="3"),
            ),
            Advice(
                "non-spot-attempts",
                "missing-attempt",
                "accepted: that annotation, or the Pod run from a Job",
                annotate(attempt="0"),
            ),
        ],
    ),
    # On a PyTorchJob, backoff-limit >= 1 and fail-non-retriable can never be admitted
    # together (the training operator does not enforce runPolicy.backoffLimit under
    # ExitCode: ReconcileJobs, kubeflow/trainer#2045): the restartPolicy problem says so
    # instead of advising ExitCode. Following the first advice (backoff-limit 0) leaves
    # only the second.
    "pytorchjob-capped-exit-code": (
        lambda: pytorchjob(
            {P + "backoff-limit": "3", P + "fail-non-retriable": "true"},
            restart_policy="OnFailure",
        ),
        [
            Advice(
                "fail-non-retriable",
                "unenforced-limit",
                "accepted: backoff-limit 0",
                annotate(backoff_limit="0"),
            ),
            Advice(
                "fail-non-retriable",
                "not-applicable",
                "ExitCode, which does, is accepted only with backoff-limit 0 or none",
                no_restart_policy,
            ),
        ],
    ),
}


def problems(obj: dict[str, Any]) -> set[tuple[str, str]]:
    verdict, _ = mutate(obj)
    return {(p.where, p.reason) for p in verdict.problems}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_denial_says_every_problem_and_its_advice_is_admitted(name):
    build, advice = CASES[name]
    obj = build()
    verdict, _ = mutate(obj)
    assert not verdict.allowed
    said = list(verdict.problems)
    assert len(said) == len(advice), verdict.message
    for expected in advice:
        matching = [
            p
            for p in said
            if expected.where in p.where
            and p.reason == expected.reason
            and expected.says in p.message
        ]
        assert matching, (expected, verdict.message)
    assert validate(obj).message == verdict.message  # validation runs the same checks
    assert not any("has no effect without" in w for w in verdict.warnings), verdict.warnings
    reported = {(p.where, p.reason) for p in said}
    done = copy.deepcopy(obj)
    for expected in advice:
        alone = copy.deepcopy(obj)
        expected.fix(alone)
        assert problems(alone) <= reported, (expected, mutate(alone)[0].message)
        expected.fix(done)
    admitted, _ = mutate(done)
    assert admitted.allowed, admitted.message


def test_pytorchjob_capped_pair_is_admitted_without_fail_non_retriable():
    """The other way out the cap problem gives: no fail-non-retriable. The replicas'
    OnFailure then enforces runPolicy.backoffLimit through restart counts."""
    obj = pytorchjob(
        {P + "backoff-limit": "3", P + "fail-non-retriable": "true"}, restart_policy="OnFailure"
    )
    annotate(fail_non_retriable=None)(obj)
    verdict, _ = mutate(obj)
    assert verdict.allowed, verdict.message


def test_a_default_skipped_for_on_failure_is_said_once_and_the_rest_goes_on():
    """A default a check skips is turned off (said once, as a warning); an annotated
    setting beside it is still denied."""
    from webhook.policy.config import parse_config

    config = parse_config("defaults:\n  non-spot-attempts: 1\n")
    obj = job({P + "attempt-env": "true"}, restart_policy="OnFailure")
    verdict, _ = mutate(obj, config)
    assert [p.where for p in verdict.problems] == [f"annotation {P}attempt-env"]
    skipped = [w for w in verdict.warnings if "non-spot-attempts (cluster default) skipped" in w]
    assert len(skipped) == 1, verdict.warnings


def test_a_controllers_pod_with_pod_level_memory_is_not_raised():
    """A pod a controller made is never denied: what check_memory finds is a warning, and
    the factor is off for it (a denied setting stays on only where it is denied)."""
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "t", "uid": "u", "controller": True}
    obj = pod(
        {P + "oom-memory-factor": "1.5", P + "oom-memory-limit": "8Gi"},
        owner=owner,
        spec={"resources": {"limits": {"memory": "2Gi"}}},
    )
    verdict, _ = mutate(obj)
    assert verdict.allowed
    assert any("pod-level memory" in w for w in verdict.warnings), verdict.warnings


def test_in_place_restarts_say_every_problem_and_the_advice_is_admitted():
    """OnFailure and no deadline: both said at once (the in-place checks went on only
    while the setting was on); Never and a deadline, as they ask, are admitted."""
    from webhook.kube.versions import KubeVersion
    from webhook.policy.config import Config

    config = Config(kubernetes_version=KubeVersion.parse("1.36"))
    obj = job({P + "in-place-exit-codes": "42"}, restart_policy="OnFailure")
    verdict, _ = mutate(obj, config)
    assert [p.reason for p in verdict.problems] == ["restart-policy", "unbounded"]
    assert "in-place-exit-codes needs Never" in verdict.problems[0].message
    assert "set spec.activeDeadlineSeconds" in verdict.problems[1].message
    never(obj)
    assert {p.reason for p in mutate(obj, config)[0].problems} == {"unbounded"}
    obj["spec"]["activeDeadlineSeconds"] = 3600
    assert mutate(obj, config)[0].allowed
