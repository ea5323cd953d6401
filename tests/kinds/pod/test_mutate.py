"""v1 Pod: attempt arithmetic at the boundaries, attempt sources, placement, env vars."""

from __future__ import annotations

import json

import pytest

from testkit.builders import P, apply, job_owner, pod, review
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.kube import jobcontroller
from webhook.kube.podspec import spot_requirements
from webhook.policy.config import Config, parse_config


class FixedAttempts(NoCluster):
    """An attempt source answering a fixed count: stands in for the cluster cache,
    which has its own tests against an HTTP Kubernetes API (tests/cluster/test_attempts.py)."""

    def __init__(self, failures: int | None, reason: str = "API down"):
        self.failures = failures
        self.reason = reason
        self.calls: list[tuple[str, str, str]] = []

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        self.calls.append((namespace, name, uid))
        if self.failures is None:
            return AttemptLookup(None, "none", self.reason)
        return AttemptLookup(self.failures, "Job status (cache)")

    def stats(self):
        return {}


def mutate(obj, attempts=None, config=None):
    request = admission.decode(json.dumps(review(obj)))
    verdict = engine.mutate(request, config or Config(), attempts or FixedAttempts(None))
    return verdict, apply(obj, verdict.patch)


def required_terms(obj):
    return (
        obj["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )


NON_SPOT = spot_requirements(Config().spot_node_labels)


@pytest.mark.parametrize(
    ("backoff", "n", "attempt", "non_spot"),
    [
        (3, 1, 2, False),  # a = B - N: still spot
        (3, 1, 3, True),  # a = B + 1 - N: the last attempt
        (3, 2, 1, False),
        (3, 2, 2, True),
        (3, 4, 0, True),  # N = B + 1: every attempt
        (0, 1, 0, True),  # a single attempt, and it is non-spot
        (5, 0, 5, False),  # N = 0: never
    ],
)
def test_attempt_boundaries(backoff, n, attempt, non_spot):
    # upstream: isAboveInterruptibleFailureThreshold (flytepropeller
    # pkg/controller/nodes/node_exec_context.go): with threshold -N, failures >= maxAttempts - N
    # run non-interruptible; maxAttempts = B + 1 here. (Flyte also keeps a first attempt
    # interruptible when N = maxAttempts; non-spot-attempts B + 1 places every attempt.)
    annotations = {
        P + "backoff-limit": str(backoff),
        P + "attempt": str(attempt),
    }
    if n:
        annotations[P + "non-spot-attempts"] = str(n)
    verdict, out = mutate(pod(annotations))
    assert verdict.allowed, verdict.message
    assert (required_terms(out) == [{"matchExpressions": NON_SPOT}]) is non_spot
    if non_spot:
        assert f"attempt {attempt + 1} of {backoff + 1}" in verdict.warnings[0]


def annotated(**extra):
    base = {P + "backoff-limit": "3", P + "non-spot-attempts": "1"}
    base.update({P + k: v for k, v in extra.items()})
    return base


def test_attempt_from_index_failure_count():
    made = jobcontroller.index_pod(pod(annotated(), owner=job_owner()), "train", 0, 3)
    verdict, out = mutate(made)
    assert required_terms(out)
    assert "from annotation batch.kubernetes.io/job-index-failure-count" in verdict.warnings[0]


def test_attempt_annotation_wins_over_index_count():
    made = jobcontroller.index_pod(pod(annotated(attempt="0"), owner=job_owner()), "train", 0, 3)
    _, out = mutate(made)
    assert required_terms(out) is None


def test_attempt_from_owning_job_via_cache():
    source = FixedAttempts(3)
    _verdict, out = mutate(pod(annotated(), owner=job_owner("train", "u-1")), source)
    assert source.calls == [("ml", "train", "u-1")]
    assert required_terms(out)
    assert json.loads(out["metadata"]["annotations"][P + "applied"]) == {
        "v": 2,
        "attempt": 3,
        "attempts": 4,
        "nonSpot": True,
    }


def test_unknown_attempt_admits_unchanged_with_warning():
    obj = pod(annotated(), owner=job_owner())
    verdict, _out = mutate(obj, FixedAttempts(None, "Job ml/train unreadable: HTTP 503"))
    assert verdict.allowed and verdict.patch == []
    assert verdict.warnings == [
        "retry-policy: attempt number unknown (Job ml/train unreadable: HTTP 503); "
        "pod admitted without non-spot placement"
    ]


def test_bare_pod_without_attempt_is_denied_saying_what_would_work():
    """Nothing counts a bare Pod's attempts: without ``retry-policy.dev/attempt`` its
    non-spot placement could never act (issue 49), as attempt-env and retry-delay."""
    verdict, _ = mutate(pod(annotated()))
    assert not verdict.allowed
    assert verdict.problems[0].reason == "missing-attempt"
    assert f"annotation {P}non-spot-attempts: a Pod no controller made needs {P}attempt" in (
        verdict.message
    )
    assert "accepted: that annotation, or the Pod run from a Job" in verdict.message
    verdict, _ = mutate(pod(annotated(attempt="3")))  # what the message asks for
    assert verdict.allowed, verdict.message
    assert required_terms(apply(pod(annotated(attempt="3")), verdict.patch))


def test_bare_pod_without_backoff_limit_or_attempt_hears_both():
    verdict, _ = mutate(pod({P + "non-spot-attempts": "1"}))
    assert [p.reason for p in verdict.problems] == ["missing-backoff-limit", "missing-attempt"]


@pytest.mark.parametrize("key", ["oom-memory-factor", "avoid-failed-nodes"])
def test_bare_pod_learning_from_earlier_attempts_is_denied(key):
    """Failure history is kept for a Job's pods only (``failure_history``): a bare Pod
    has none, whatever it says; a controller's pod keeps the warning."""
    annotations = {P + "oom-memory-factor": "1.5", P + "oom-memory-limit": "8Gi"}
    if key == "avoid-failed-nodes":
        annotations = {P + key: "true"}
    verdict, _ = mutate(pod({**annotations, P + "attempt": "1"}))
    assert not verdict.allowed
    assert f"annotation {P}{key}: a Pod no controller made has no earlier attempts" in (
        verdict.message
    )
    assert "accepted: run the Pod from a Job" in verdict.message
    verdict, _ = mutate(pod(annotations, owner=job_owner()))
    assert verdict.allowed
    assert any(w.startswith("retry-policy: failure history unknown") for w in verdict.warnings)


def test_affinity_is_anded_into_every_user_term_and_keeps_them():
    # upstream: AddRequiredNodeSelectorRequirements (flyteplugins flytek8s) appends the
    # requirement to every nodeSelectorTerm, or makes one term when there is none.
    user_terms = [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]},
                    }
                ],
            },
            "podAntiAffinity": {"x": 1},
        }
    }
    obj = pod(annotated(attempt="3"), spec=spec)
    _verdict, out = mutate(obj)
    terms = required_terms(out)
    assert terms[0]["matchExpressions"] == [user_terms[0]["matchExpressions"][0], *NON_SPOT]
    assert terms[1]["matchFields"] == user_terms[1]["matchFields"]
    assert terms[1]["matchExpressions"] == NON_SPOT
    node = out["spec"]["affinity"]["nodeAffinity"]
    assert (
        node["preferredDuringSchedulingIgnoredDuringExecution"]
        == spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    )
    assert out["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    again, twice = mutate(out)
    assert again.patch == [] and twice == out


def test_custom_spot_labels():
    config = parse_config("spotNodeLabels: {pool.example.com/kind: [spot, preempt]}")
    _, out = mutate(pod(annotated(attempt="3")), config=config)
    assert required_terms(out) == [
        {
            "matchExpressions": [
                {"key": "pool.example.com/kind", "operator": "NotIn", "values": ["preempt", "spot"]}
            ]
        }
    ]


def test_pod_pinned_to_spot_bare_is_denied_owned_is_warned():
    spec = {"nodeSelector": {"karpenter.sh/capacity-type": "spot"}}
    verdict, _ = mutate(pod(annotated(attempt="3"), spec=spec))
    assert not verdict.allowed
    assert "requires spot nodes (nodeSelector karpenter.sh/capacity-type=spot)" in verdict.message
    verdict, out = mutate(
        pod(annotated(attempt="3"), spec=spec, owner=job_owner()), FixedAttempts(3)
    )
    assert verdict.allowed and required_terms(out) is None
    assert "not applied to this pod" in verdict.warnings[0]


def test_spot_pinning_only_when_every_term_requires_spot():
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "karpenter.sh/capacity-type",
                                    "operator": "In",
                                    "values": ["spot"],
                                }
                            ]
                        },
                        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                    ]
                }
            }
        }
    }
    verdict, out = mutate(pod(annotated(attempt="3"), spec=spec))
    assert verdict.allowed
    assert all(NON_SPOT[0] in t["matchExpressions"] for t in required_terms(out))


def test_bad_annotations_bare_pod_denied_owned_pod_admitted():
    verdict, _ = mutate(pod({P + "attempt": "-1"}))
    assert not verdict.allowed and "accepted: a whole number" in verdict.message
    verdict, _out = mutate(pod({P + "attempt": "-1"}, owner=job_owner()))
    assert verdict.allowed and verdict.patch == []
    assert "not applied to this pod" in verdict.warnings[0]


def test_pod_non_spot_needs_backoff_limit():
    verdict, _ = mutate(pod({P + "non-spot-attempts": "1", P + "attempt": "0"}))
    assert not verdict.allowed
    assert "needs retry-policy.dev/backoff-limit" in verdict.message


PYTORCHJOB_OWNER = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "name": "finetune",
    "uid": "pt-uid-1",
    "controller": True,
}


def test_pod_error_propagation_only_in_a_pytorchjobs_pods():
    # upstream: with FLYTE_INTERNAL_DIST_ERROR_STRATEGY set, flytekit writes error-<uuid>.pb
    # (_build_error_file_name in flytekit/bin/entrypoint.py); Flyte reads those for PyTorch
    # tasks only (pytorchOperatorResourceHandler.GetProperties, flyteplugins kfoperators).
    verdict, out = mutate(pod({P + "error-propagation": "earliest"}, owner=PYTORCHJOB_OWNER))
    env = out["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == [
        "FLYTE_INTERNAL_WORKER_NAME",
        "FLYTE_INTERNAL_DIST_ERROR_STRATEGY",
    ]
    assert verdict.warnings == [
        "retry-policy: error-propagation env vars added to containers main",
    ]
    # A Flyte container task's pod (or any pod no PyTorchJob owns) would lose its error.
    verdict, out = mutate(pod({P + "error-propagation": "earliest"}, owner=job_owner()))
    assert verdict.allowed and "env" not in out["spec"]["containers"][0]
    assert verdict.warnings[0].startswith(
        "retry-policy: not applied to this pod: annotation retry-policy.dev/error-propagation: "
        "cannot apply to a Pod that no PyTorchJob owns"
    )
    # A bare pod was written by a person: denied, as a workload is.
    verdict, _ = mutate(pod({P + "error-propagation": "earliest"}))
    assert not verdict.allowed
    assert "error-<uuid>.pb instead of error.pb" in verdict.message


def test_pod_without_annotations_skips_the_cache():
    source = FixedAttempts(3)
    verdict, _ = mutate(pod(owner=job_owner()), source)
    assert verdict.patch == [] and source.calls == []


def test_validate_does_not_enforce_placement():
    obj = pod(annotated(), owner=job_owner())
    request = admission.decode(json.dumps(review(obj)))
    assert engine.validate(request, Config()).allowed


def test_a_pods_policy_is_resolved_once_per_distinct_annotation_set():
    from webhook.plan.policies import pod_policy

    ours = {P + "backoff-limit": "3", P + "non-spot-attempts": "1", "other": "x"}
    first, _ = pod_policy(dict(ours))
    again, _ = pod_policy({**ours, "other": "y"})  # only ours are the key
    assert again is first and first.backoff_limit == 3
    changed, _ = pod_policy({**ours, P + "backoff-limit": "4"})
    assert changed.backoff_limit == 4
    bad = {P + "backoff-limit": "lots"}
    _, problems = pod_policy(bad)
    problems.clear()  # a caller's list: the next caller still gets the problem
    assert pod_policy(bad)[1] and "lots" in str(pod_policy(bad)[1][0])
