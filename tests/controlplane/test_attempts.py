"""Between attempts, against the real Job controller: more memory for the pod after an OOM
kill within the namespace's real LimitRange, the in-place budget ending a pod by the
``activeDeadlineSeconds`` the real API server accepts, an Indexed Job's FailIndex, and a
CronJob's Jobs made by the real CronJob controller."""

from __future__ import annotations

import json

import pytest

from testkit.controlplane.harness import Kube, PodWatch, Served, eventually, job_manifest

EXIT = "kubelet.retry-policy.dev/exit-code"


def memory(pod: dict) -> dict:
    return pod["spec"]["containers"][0]["resources"]


def test_after_an_oom_kill_the_next_pod_gets_more_memory_within_the_limit_range(
    kube: Kube, webhook: Served, ns: str
):
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "memory", "namespace": ns},
            "spec": {"limits": [{"type": "Container", "max": {"memory": "384Mi"}}]},
        }
    )
    policy = {
        "retry-policy.dev/backoff-limit": "1",
        "retry-policy.dev/oom-memory-factor": "2",
        "retry-policy.dev/oom-memory-limit": "1Gi",
    }
    job = job_manifest("oom", ns, policy, {EXIT: "137,0"})
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "256Mi"},
    }
    kube.apply(job)
    kube.finished(ns, "oom", 90)
    first, second = kube.pods_of(ns, "oom")
    killed = first["status"]["containerStatuses"][0]["state"]["terminated"]
    assert killed["reason"] == "OOMKilled" and killed["exitCode"] == 137
    assert memory(first)["limits"]["memory"] == "256Mi"
    # Twice what it was killed at is 512Mi; the LimitRange's max (384Mi) is the most the
    # real LimitRanger admits, so that is what the webhook gives it.
    assert memory(second)["limits"]["memory"] == "384Mi"
    assert kube.job_condition(ns, "oom", "Complete")


def test_the_in_place_budget_ends_the_pod_by_its_deadline(kube: Kube, webhook: Served, ns: str):
    policy = {
        "retry-policy.dev/backoff-limit": "0",
        "retry-policy.dev/in-place-exit-codes": "42",
        "retry-policy.dev/max-in-place-restarts": "2",
        "retry-policy.dev/fail-non-retriable": "true",
    }
    with PodWatch(kube, ns) as watched:
        kube.apply(job_manifest("inplace", ns, policy, {EXIT: "42"}))
        job = kube.finished(ns, "inplace", 120)
    assert kube.job_condition(ns, "inplace", "Failed")["reason"] == "BackoffLimitExceeded"
    (pod,) = kube.pods_of(ns, "inplace") or [watched.seen[-1]]
    uid = pod["metadata"]["uid"]
    last = [p for p in watched.seen if p["metadata"]["uid"] == uid][-1]
    assert last["spec"].get("activeDeadlineSeconds"), "no deadline was written"
    assert last["status"]["phase"] == "Failed" and last["status"]["reason"] == "DeadlineExceeded"
    assert last["status"]["containerStatuses"][0]["restartCount"] >= 2
    assert watched.condition(uid, "retry-policy.dev/InPlaceBudgetExhausted")
    assert job["status"]["failed"] == 1


def test_an_indexed_job_fails_only_the_index_of_a_non_retriable_exit(
    kube: Kube, webhook: Served, ns: str
):
    policy = {
        "retry-policy.dev/fail-non-retriable": "true",
        "retry-policy.dev/on-non-retriable": "fail-index",
        "retry-policy.dev/backoff-limit": "1",
    }
    spec = {
        "completionMode": "Indexed",
        "completions": 3,
        "parallelism": 1,
        "backoffLimitPerIndex": 1,
    }
    kube.apply(job_manifest("shards", ns, policy, {EXIT: "0,1,0"}, spec=spec))
    job = kube.finished(ns, "shards", 90)
    assert kube.job_condition(ns, "shards", "Failed")["reason"] == "FailedIndexes"
    assert job["status"]["failedIndexes"] == "1"
    assert job["status"]["completedIndexes"] == "0,2"
    # FailIndex: the failed index was not retried despite its budget of one retry.
    indexes = [
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        for p in kube.pods_of(ns, "shards")
    ]
    assert sorted(indexes) == ["0", "1", "2"]


def test_a_cronjob_s_jobs_made_by_the_cronjob_controller_carry_the_policy(
    kube: Kube, webhook: Served, ns: str
):
    # No backoffLimit of the user's own: the API server does not default a CronJob's
    # jobTemplate (SetDefaults_Job runs on Jobs), so one written there contradicts ours.
    template = job_manifest("x", ns, {}, {EXIT: "0"})["spec"]
    cronjob = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": "nightly",
            "namespace": ns,
            "annotations": {
                "retry-policy.dev/backoff-limit": "2",
                "retry-policy.dev/fail-non-retriable": "true",
            },
        },
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {"spec": template},
        },
    }
    kube.apply(cronjob)
    jobs = eventually(lambda: kube.list("jobs", ns), 90, "a Job from the CronJob controller")
    kube.kubectl("patch", "cronjob", "nightly", "-n", ns, "-p", '{"spec":{"suspend":true}}')
    job = jobs[0]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    assert job["spec"]["backoffLimit"] == 2
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert any(rule["action"] == "FailJob" for rule in rules)
    assert kube.finished(ns, job["metadata"]["name"], 60)


@pytest.mark.refused_writes("in_place")
def test_a_deadline_another_policy_refuses_leaves_no_half_done_mark(
    kube: Kube, webhook: Served, ns: str
):
    """A cluster's own ValidatingAdmissionPolicy refuses every change of a pod's deadline
    in this namespace: the controller cannot end the pod whose restarts in place are used
    up, so it takes its mark back, and the pod's later real failure fails the Job by its
    own rules (fail-non-retriable), instead of being counted by our Count rule."""
    name = f"no-deadlines-{ns}"[:63]
    rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
        "operations": ["UPDATE"],
    }
    kube.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [
                    {
                        "expression": "!has(object.spec.activeDeadlineSeconds) || "
                        "(has(oldObject.spec.activeDeadlineSeconds) && object.spec."
                        "activeDeadlineSeconds == oldObject.spec.activeDeadlineSeconds)",
                        "message": "pod deadlines are managed by the platform team",
                    }
                ],
            },
        }
    )
    selector = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    kube.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": selector},
            },
        }
    )
    try:
        policy = {
            "retry-policy.dev/backoff-limit": "2",
            "retry-policy.dev/in-place-exit-codes": "42",
            "retry-policy.dev/max-in-place-restarts": "2",
            "retry-policy.dev/fail-non-retriable": "true",
        }
        probe = job_manifest("probe", ns, {}, {EXIT: "run"})
        kube.apply(probe)
        pod = eventually(lambda: kube.pods_of(ns, "probe"), 30)[0]
        seconds = iter(range(900, 100, -1))  # each try a change: an equal one is allowed

        def refused() -> bool:
            deadline = json.dumps({"spec": {"activeDeadlineSeconds": next(seconds)}})
            name = pod["metadata"]["name"]
            done = kube.kubectl("patch", "pod", name, "-n", ns, "-p", deadline, check=False)
            return "platform team" in done.stderr

        eventually(refused, 30, "the cluster's policy in force")
        with PodWatch(kube, ns) as watched:
            kube.apply(job_manifest("restarts", ns, policy, {EXIT: "42,42,1"}))
            job = kube.finished(ns, "restarts", 120)
        assert kube.job_condition(ns, "restarts", "Failed")["reason"] == "PodFailurePolicy"
        (only,) = kube.pods_of(ns, "restarts")
        versions = [p for p in watched.seen if p["metadata"]["uid"] == only["metadata"]["uid"]]
        marks = [
            c["status"]
            for p in versions
            for c in p["status"].get("conditions") or []
            if c["type"] == "retry-policy.dev/InPlaceBudgetExhausted"
        ]
        assert "True" in marks and marks[-1] == "False"
        assert "activeDeadlineSeconds" not in only["spec"]
        assert job["status"]["failed"] == 1
    finally:
        kube.kubectl("delete", "validatingadmissionpolicybinding", name, check=False)
        kube.kubectl("delete", "validatingadmissionpolicy", name, check=False)
