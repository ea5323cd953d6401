"""Disruptions as the real components make them: the Eviction API's ``DisruptionTarget``,
PodGC's for a lost node, and our budgets under the real Job controller's timing."""

from __future__ import annotations

from testkit.controlplane.harness import (
    Kube,
    PodWatch,
    Served,
    as_played,
    eventually,
    evict,
    job_manifest,
    pod_condition,
    running,
)

EXIT = "kubelet.retry-policy.dev/exit-code"
IGNORE = {"retry-policy.dev/ignore-disruptions": "true"}


def test_an_eviction_is_marked_by_the_api_server_and_ignored(kube: Kube, webhook: Served, ns: str):
    policy = {**IGNORE, "retry-policy.dev/backoff-limit": "0"}
    kube.apply(job_manifest("evicted", ns, policy, {EXIT: "run,0"}))
    first = running(kube, ns, "evicted")[0]
    evict(kube, first)

    def marked() -> dict | None:
        pods = [
            p
            for p in kube.pods_of(ns, "evicted")
            if p["metadata"]["uid"] == first["metadata"]["uid"]
        ]
        return pod_condition(pods[0], "DisruptionTarget") if pods else None

    condition = eventually(marked, 30, "the evicted pod's DisruptionTarget")
    assert condition["reason"] == "EvictionByEvictionAPI" and condition["status"] == "True"
    real, played = as_played(condition)
    assert real == played
    job = kube.finished(ns, "evicted")
    assert kube.job_condition(ns, "evicted", "Complete"), job["status"]
    assert job["status"].get("failed", 0) == 0 and job["status"]["succeeded"] == 1


def test_without_ignore_disruptions_an_eviction_uses_up_the_budget(
    kube: Kube, webhook: Served, ns: str
):
    kube.apply(
        job_manifest("counted", ns, {"retry-policy.dev/backoff-limit": "0"}, {EXIT: "run,0"})
    )
    evict(kube, running(kube, ns, "counted")[0])
    job = kube.finished(ns, "counted")
    assert kube.job_condition(ns, "counted", "Failed")["reason"] == "BackoffLimitExceeded"
    assert job["status"]["failed"] == 1


def test_max_disruptions_is_exact_under_the_job_controller(kube: Kube, webhook: Served, ns: str):
    """One disruption free, the second counted: with backoffLimit 0 the Job fails on the
    second eviction, and not on the first."""
    policy = {
        **IGNORE,
        "retry-policy.dev/max-disruptions": "1",
        "retry-policy.dev/backoff-limit": "0",
    }
    kube.apply(job_manifest("budget", ns, policy, {EXIT: "run,run,0"}))
    first = running(kube, ns, "budget")[0]
    evict(kube, first)
    second = eventually(
        lambda: [
            p
            for p in running(kube, ns, "budget")
            if p["metadata"]["uid"] != first["metadata"]["uid"]
            and p["status"]["phase"] == "Running"
        ],
        60,
        "the replacement running",
    )[0]
    assert kube.job_condition(ns, "budget", "Failed") is None
    evict(kube, second)
    job = kube.finished(ns, "budget")
    assert kube.job_condition(ns, "budget", "Failed")["reason"] == "BackoffLimitExceeded"
    assert job["status"]["failed"] == 1
    assert len(kube.pods_of(ns, "budget")) <= 2


def test_a_disrupted_pod_that_exits_0_is_a_completion_not_a_failure(
    kube: Kube, webhook: Served, ns: str
):
    """An application that exits 0 on SIGTERM: the evicted pod ends ``Succeeded``
    (``getPhase``: every container exited 0), the Job controller counts a completion, and
    the pod is gone. Our budget must not count it as a failure either."""
    policy = {
        **IGNORE,
        "retry-policy.dev/max-disruptions": "0",
        "retry-policy.dev/backoff-limit": "1",
    }
    pods = {
        EXIT: "run,0",
        "kubelet.retry-policy.dev/stop-exit-code": "0",
        "kubelet.retry-policy.dev/stop-seconds": "0",
    }
    spec = {"completions": 2, "parallelism": 1}
    with PodWatch(kube, ns) as watched:
        kube.apply(job_manifest("graceful", ns, policy, pods, spec=spec))
        first = running(kube, ns, "graceful")[0]
        evict(kube, first)
        job = kube.finished(ns, "graceful")
    assert kube.job_condition(ns, "graceful", "Complete"), job["status"]
    uid = first["metadata"]["uid"]
    ended = [p for p in watched.seen if p["metadata"]["uid"] == uid][-1]
    assert ended["status"]["phase"] == "Succeeded"
    assert job["status"]["succeeded"] == 2 and job["status"].get("failed", 0) == 0
    eventually(
        lambda: (
            "retry-policy.dev/history"
            in kube.get("job", "graceful", ns)["metadata"].get("annotations", {})
        ),
        30,
        "the record",
    )
    assert kube.get("job", "graceful", ns)["spec"]["backoffLimit"] == 1
