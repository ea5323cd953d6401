"""The chart's RBAC and admission policy for ``peer-disruptions`` on a JobSet: the
controller may add exactly one condition to a child Job's status, ``FailureTarget`` with
our reason and message (``webhook.kinds.jobset.peers``), and nothing else of it.

upstream: ``ValidateJobStatusUpdate`` (pkg/apis/batch/validation/validation.go) lets a
client add ``FailureTarget=True`` to a running Job (it refuses it beside Complete or
SuccessCriteriaMet, and taking it away), so the policy is what narrows that write."""

from __future__ import annotations

import copy

import pytest

from testkit.chart import NAMESPACE, RELEASE, WRITE_VERBS, deployment_pod, one, render
from testkit.rbac import granted
from testkit.vap import Policy, admitted, request
from webhook.cluster.conditions import status_patch
from webhook.kinds.jobset import failurepolicy as jsp

pytestmark = pytest.mark.tools

WEBHOOK = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-retry-policy-webhook"
T0 = "2026-11-26T10:00:00Z"


@pytest.fixture
def policy(helm) -> Policy:
    return Policy(one(render(helm, {}), "ValidatingAdmissionPolicy"))


def child_job(peers: str | None = "ignore", jobset: bool = True) -> dict:
    labels = {"batch.kubernetes.io/controller-uid": "u-job"}
    if jobset:
        labels["jobset.sigs.k8s.io/jobset-name"] = "train"
    template_labels = {"jobset.sigs.k8s.io/jobset-name": "train"}
    if peers:
        template_labels["retry-policy.dev/peer-disruptions"] = peers
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train-workers-0",
            "namespace": "ml",
            "uid": "u-job",
            "resourceVersion": "7",
            "generation": 1,
            "labels": labels,
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": template_labels},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]},
            },
        },
        "status": {"active": 4, "ready": 4, "startTime": T0},
    }


def with_condition(job: dict, kind: str, reason: str, message: str, status: str = "True") -> dict:
    job = copy.deepcopy(job)
    condition = status_patch(kind, reason, message, 0)["status"]["conditions"][0]
    condition["status"] = status
    job["status"].setdefault("conditions", []).append(condition)
    return job


OURS = jsp.peer_message("train-workers-0-3-abcde", "EvictionByEvictionAPI", "ignore")


def review(policy: Policy, new: dict, old: dict, sub: str = "status"):
    obj = admitted("jobs", sub, new, old)
    req = request(WEBHOOK, "UPDATE", "jobs", sub, old["metadata"]["name"], "ml")
    return policy.review(req, obj, old)


def test_our_failure_target_on_a_child_job_is_allowed(policy):
    old = child_job()
    new = with_condition(old, jsp.FAILURE_TARGET, jsp.PEER_REASON, OURS)
    verdict = review(policy, new, old)
    assert verdict.matched and verdict.allowed, verdict.denials


@pytest.mark.parametrize(
    ("old", "change"),
    [
        # Another message, reason, status or condition type.
        (child_job(), lambda j: with_condition(j, "FailureTarget", "PodFailurePolicy", "x")),
        (child_job(), lambda j: with_condition(j, "FailureTarget", "BackoffLimitExceeded", OURS)),
        (
            child_job(),
            lambda j: with_condition(j, "FailureTarget", "PodFailurePolicy", OURS, "False"),
        ),
        (child_job(), lambda j: with_condition(j, "Failed", "PodFailurePolicy", OURS)),
        (child_job(), lambda j: with_condition(j, "Complete", "PodFailurePolicy", OURS)),
        # Anything else of the status besides.
        (
            child_job(),
            lambda j: {
                **with_condition(j, "FailureTarget", "PodFailurePolicy", OURS),
                "status": {
                    **with_condition(j, "FailureTarget", "PodFailurePolicy", OURS)["status"],
                    "failed": 3,
                },
            },
        ),
        # A Job whose end is decided already: its own end decides.
        (
            with_condition(child_job(), "FailureTarget", "BackoffLimitExceeded", "own"),
            lambda j: {
                **j,
                "status": {
                    **j["status"],
                    "conditions": [
                        {**j["status"]["conditions"][0], "reason": "PodFailurePolicy"},
                    ],
                },
            },
        ),
        (
            with_condition(child_job(), "SuccessCriteriaMet", "SuccessPolicy", "met"),
            lambda j: with_condition(j, "FailureTarget", "PodFailurePolicy", OURS),
        ),
        # Not a JobSet's child, or its pods not labelled for peer-disruptions.
        (
            child_job(jobset=False),
            lambda j: with_condition(j, "FailureTarget", "PodFailurePolicy", OURS),
        ),
        (
            child_job(peers=None),
            lambda j: with_condition(j, "FailureTarget", "PodFailurePolicy", OURS),
        ),
    ],
    ids=[
        "message",
        "reason",
        "false",
        "failed",
        "complete",
        "counters",
        "rewrite-own",
        "success-met",
        "plain-job",
        "unlabelled",
    ],
)
def test_nothing_else_of_a_job_s_status_may_change(policy, old, change):
    verdict = review(policy, change(old), old)
    assert verdict.matched and not verdict.allowed
    assert any("of a Job's status, only FailureTarget" in d for d in verdict.denials)


def test_the_job_s_spec_or_labels_stay_as_they_are(policy):
    """A status write cannot change the rest (the API server keeps it), and a write of the
    Job itself stays what it was: its record and backoffLimit only."""
    old = child_job()
    new = with_condition(old, jsp.FAILURE_TARGET, jsp.PEER_REASON, OURS)
    new["metadata"]["labels"]["x"] = "y"
    assert not review(policy, new, old).allowed


@pytest.mark.parametrize(
    ("values", "granted_to"),
    [
        ({}, True),
        ({"webhook": {"kinds": {"jobSets": False, "trainJobs": False}}}, False),
        ({"controller": {"enabled": False}}, False),
    ],
    ids=["default", "no-jobsets", "no-controller"],
)
def test_rbac_grants_job_status_patch_only_with_the_controller_and_jobsets(
    helm, values, granted_to
):
    docs = render(helm, values)
    account = deployment_pod(docs)["spec"]["serviceAccountName"]
    writes = {
        (verb, resource)
        for _, rule in granted(docs, account, NAMESPACE)
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if verb in WRITE_VERBS
    }
    assert (("patch", "jobs/status") in writes) is granted_to
    if granted_to:
        policy = Policy(one(docs, "ValidatingAdmissionPolicy"))
        old = child_job()
        new = with_condition(old, jsp.FAILURE_TARGET, jsp.PEER_REASON, OURS)
        assert review(policy, new, old).allowed
