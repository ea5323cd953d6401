"""``peer-disruptions`` on a JobSet: one ``FailureTarget`` on the disrupted pod's child Job
stands for all its peers (``webhook.kinds.jobset.peers``), and the JobSet rule
admission puts first restarts the set on it.

upstream: ``syncJob`` (pkg/controller/job/job_controller.go) finishes a Job that has
``FailureTarget=True`` as ``Failed`` with that condition's reason and message
(``newFailedConditionForFailureTarget``) and deletes its active pods; JobSet v0.12's
``findFirstFailedPolicyRuleAndJob`` takes the rules in order against every failed child
Job, and ``ruleIsApplicable`` matches reason, message pattern and replicated Job
(pkg/controllers/failure_policy.go); its webhook accepts only the Job controller's
reasons in ``onJobFailureReasons`` (``validOnJobFailureReasons``)."""

from __future__ import annotations

import copy

import pytest

from testkit.builders import P
from testkit.controllers import Counted, disruptions, events_of
from testkit.fakeapi import FakeAPI
from testkit.workloads import mutate
from webhook.kinds.jobset import failurepolicy as jsp
from webhook.kinds.jobset.rules import FAILJOB_SHAPE, REASONS
from webhook.kube import failurepolicy as fp
from webhook.kube.goregexp import Wild

JOBS, PODS = 8, 125  # a thousand pods


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def a_jobset(rules: list | None = None, restarts: int = 0) -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "big", "namespace": "ml", "uid": "js-uid"},
        "spec": {"failurePolicy": {"rules": rules if rules is not None else []}},
        "status": {"restarts": restarts},
    }


def a_pod(job: int, index: int, how: str = "ignore") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"big-w-{job}-{index}",
            "namespace": "ml",
            "uid": f"pod-{job}-{index}",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "big",
                "jobset.sigs.k8s.io/jobset-uid": "js-uid",
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "batch.kubernetes.io/controller-uid": f"job-{job}",
                P + "peer-disruptions": how,
                P + "ignore-disruptions": "true",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": f"big-w-{job}",
                    "uid": f"job-{job}",
                    "controller": True,
                }
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "conditions": []},
    }


def a_set(api: FakeAPI, rules: list | None, how: str = "ignore") -> list[dict]:
    api.store("jobsets", a_jobset(rules))
    for j in range(JOBS):
        api.store(
            "jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": f"big-w-{j}",
                    "namespace": "ml",
                    "uid": f"job-{j}",
                    "labels": {"jobset.sigs.k8s.io/jobset-name": "big"},
                },
                "spec": {"backoffLimit": 0},
                "status": {"active": PODS},
            },
        )
    pods = [a_pod(j, i, how) for j in range(JOBS) for i in range(PODS)]
    for pod in pods:
        api.store("pods", pod)
    return pods


def evicted(pod: dict) -> dict:
    pod = copy.deepcopy(pod)
    pod["metadata"]["deletionTimestamp"] = "2026-11-26T10:00:30Z"
    pod["status"]["conditions"].append(
        {"type": fp.DISRUPTION_TARGET, "status": "True", "reason": "EvictionByEvictionAPI"}
    )
    return pod


def conditions(obj: dict) -> list[str]:
    return [c["type"] for c in (obj.get("status") or {}).get("conditions") or []]


def job_of(api: FakeAPI, name: str) -> dict:
    return next(j for j in api.objects["jobs"].values() if j["metadata"]["name"] == name)


@pytest.mark.parametrize("how", ["ignore", "count"])
def test_one_disruption_in_a_thousand_pods_costs_one_job_write(api, tmp_path, how):
    """Writes per disruption: one (at most the child Jobs plus a small constant), where
    the per-pod marks cost 999."""
    pods = a_set(api, [jsp.peer_rule(how)], how)
    metrics = Counted()
    reconciler = disruptions(api, tmp_path, metrics)
    for pod in pods:
        reconciler._peer_event("ADDED", pod)
    before = len(api.writes)
    reconciler.mark_peers(evicted(pods[0]))
    reconciler.events.flush()
    writes = api.writes[before:]
    assert len(writes) <= JOBS + 2
    assert [w for w in writes if w[1] != "events"] == [("PATCH", "jobs", "big-w-0")]
    job = job_of(api, "big-w-0")
    (target,) = [c for c in job["status"]["conditions"] if c["type"] == jsp.FAILURE_TARGET]
    assert target["status"] == "True" and target["reason"] == jsp.PEER_REASON
    assert target["message"].startswith(jsp.PEER_MESSAGE_PREFIX)
    assert f"peer-disruptions {how}" in target["message"]
    assert not any(fp.PEER_DISRUPTED in conditions(p) for p in api.objects["pods"].values())
    (event,) = events_of(api, "RetryDisruptionCounted")
    assert "FailureTarget" in event["note"] and jsp.PEER_RULE_NAME in event["note"]
    assert reconciler.counters["jobset_peers"] == 1 and reconciler.counters["peers"] == 0


def test_a_jobset_admitted_without_the_rule_gets_per_pod_marks(api, tmp_path):
    """The fallback: no rule of ours first (a JobSet admitted before it was written), so
    a FailureTarget would not restart it: the peers are marked one by one, up to the
    limit."""
    pods = a_set(api, [])
    reconciler = disruptions(api, tmp_path, Counted())
    reconciler.peers.limit = 10
    for pod in pods:
        reconciler._peer_event("ADDED", pod)
    reconciler.mark_peers(evicted(pods[0]))
    assert not any(w[1] == "jobs" for w in api.writes)
    assert sum(fp.PEER_DISRUPTED in conditions(p) for p in api.objects["pods"].values()) == 10


def test_a_job_whose_end_is_decided_is_not_written(api, tmp_path):
    """Its own FailureTarget (say BackoffLimitExceeded) decides: no write, no marks."""
    pods = a_set(api, [jsp.peer_rule("ignore")])
    with api.lock:
        job_of(api, "big-w-0")["status"]["conditions"] = [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}
        ]
    assert writes_of_a_disruption(api, tmp_path, pods) == []


def test_an_ignored_peer_disruption_whose_own_disruption_counts_marks_pods(api, tmp_path):
    """No ignore-disruptions on the pod: its disruption counts; an uncounted restart of
    the set would drop that count, so its own failure decides and peers get marks."""
    pods = a_set(api, [jsp.peer_rule("ignore")])
    reconciler = disruptions(api, tmp_path, Counted())
    reconciler.peers.limit = 3
    for pod in pods:
        reconciler._peer_event("ADDED", pod)
    own = evicted(pods[0])
    del own["metadata"]["labels"][P + "ignore-disruptions"]
    reconciler.mark_peers(own)
    assert not any(w[1] == "jobs" for w in api.writes)


def test_a_pod_of_an_earlier_run_writes_nothing(api, tmp_path):
    pods = a_set(api, [jsp.peer_rule("ignore")])
    with api.lock:
        next(iter(api.objects["jobsets"].values()))["status"]["restarts"] = 1
    assert writes_of_a_disruption(api, tmp_path, pods) == []


def writes_of_a_disruption(api, tmp_path, pods):
    """The writes made when the first of ``pods`` is evicted, its peers all seen."""
    reconciler = disruptions(api, tmp_path, Counted())
    for pod in pods:
        reconciler._peer_event("ADDED", pod)
    before = len(api.writes)
    reconciler.mark_peers(evicted(pods[0]))
    return api.writes[before:]


# --- what JobSet does with the Job's failure ----------------------------------------------


def test_rule_is_applicable_to_the_failed_job_and_restarts_uncounted():
    """``newFailedConditionForFailureTarget`` copies reason and message to ``Failed``;
    ``ruleIsApplicable`` then matches our rule (first: ``findFirstFailedPolicyRuleAndJob``)
    even beside our FailJobSet rule on the same reason."""
    message = [jsp.peer_message("big-w-0-0", "EvictionByEvictionAPI", "ignore")]
    for how, counted in (("ignore", False), ("count", True)):
        rules = [
            jsp.peer_rule(how),
            {
                "name": "retryPolicyFailNonRetriable",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            },
        ]
        js = {"spec": {"failurePolicy": {"maxRestarts": 3, "rules": rules}}}
        decision = jsp.execute(js, jsp.PEER_REASON, message, "workers", 0)
        assert decision.rule == 0 and decision.name == jsp.PEER_RULE_NAME
        assert decision.counted is counted and not decision.failed


def test_our_pattern_matches_no_message_of_the_job_controller():
    """The Job controller's FailJob message (``matchPodFailurePolicy``) and its own
    reasons' messages never start with our prefix: the rule takes our failures only."""
    assert not jsp.pattern_applies(jsp.PEER_PATTERN, [str(FAILJOB_SHAPE)])[0]
    for text in ("Job has reached the specified backoff limit", "Job has failed indexes"):
        assert not jsp.pattern_applies(jsp.PEER_PATTERN, [text])[0]
    assert not jsp.pattern_applies(jsp.PEER_PATTERN, [Wild(), "Container c"])[0]
    assert jsp.PEER_REASON in REASONS  # validOnJobFailureReasons accepts it


def test_admission_puts_the_rule_first_and_denies_it_pruned():
    """First, before the user's rules and our FailJobSet; and a JobSet API without
    onJobFailureMessagePatterns (JobSet before v0.10 prunes it) is denied, not left with
    a rule that would restart the set on every PodFailurePolicy failure."""
    annotations = {
        P + "ignore-disruptions": "true",
        P + "peer-disruptions": "ignore",
        P + "fail-non-retriable": "true",
    }
    js = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "t", "namespace": "ml", "annotations": annotations},
        "spec": {
            "failurePolicy": {
                "rules": [
                    {
                        "name": "mine",
                        "action": "RestartJobSet",
                        "onJobFailureReasons": ["DeadlineExceeded"],
                    }
                ]
            },
            "replicatedJobs": [
                {
                    "name": "w",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                        }
                    },
                }
            ],
        },
    }
    verdict, obj = mutate(js)
    assert verdict.allowed, verdict.message
    names = [r["name"] for r in obj["spec"]["failurePolicy"]["rules"]]
    assert names == [jsp.PEER_RULE_NAME, "mine", "retryPolicyFailNonRetriable"]
    pruned = copy.deepcopy(obj)
    del pruned["spec"]["failurePolicy"]["rules"][0]["onJobFailureMessagePatterns"]
    verdict, _ = mutate(pruned)
    assert not verdict.allowed  # (here fail-non-retriable's check says it first)
    del pruned["metadata"]["annotations"][P + "fail-non-retriable"]
    verdict, _ = mutate(pruned)
    assert not verdict.allowed and "JobSet v0.10 or later" in verdict.message
