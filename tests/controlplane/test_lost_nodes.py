"""Nodes lost for real: the node lifecycle and taint eviction controllers for a node whose
kubelet went silent (``DeletionByTaintManager``), PodGC for a Node object that is gone
(``DeletionByPodGC``), and what our budgets make of each."""

from __future__ import annotations

from testkit.controlplane.harness import (
    UNREACHABLE_AT_ONCE,
    Kube,
    PodWatch,
    Served,
    as_played,
    eventually,
    job_manifest,
    lose_node,
    node_of,
    restore_node,
    running,
    stop_kubelet,
    wait_node_ready,
)

EXIT = "kubelet.retry-policy.dev/exit-code"
IGNORE = {"retry-policy.dev/ignore-disruptions": "true"}


def test_a_silent_node_s_pod_is_evicted_by_the_taint_manager_and_ignored(
    kube: Kube, webhook: Served, ns: str
):
    policy = {**IGNORE, "retry-policy.dev/backoff-limit": "0"}
    job = job_manifest("silent", ns, policy, {EXIT: "run,0"}, pod_spec=UNREACHABLE_AT_ONCE)
    with PodWatch(kube, ns) as watched:
        kube.apply(job)
        first = running(kube, ns, "silent")[0]
        node = node_of(first)
        stop_kubelet(kube, node)
        try:
            uid = first["metadata"]["uid"]
            condition = eventually(
                lambda: watched.condition(uid, "DisruptionTarget"), 90, "the taint manager's mark"
            )
            assert condition["reason"] == "DeletionByTaintManager"
            real, played = as_played(condition)
            assert real == played
        finally:
            stop_kubelet(kube, node, stopped=False)
        wait_node_ready(kube, node)
        done = kube.finished(ns, "silent", 90)
    assert kube.job_condition(ns, "silent", "Complete"), done["status"]
    assert done["status"].get("failed", 0) == 0


def test_a_pod_lost_with_its_node_over_the_budget_lowers_backoff_limit(
    kube: Kube, webhook: Served, ns: str
):
    """PodGC fails the pod with ``DeletionByPodGC`` in the same patch that makes it
    ``Failed`` (``markFailedAndDeletePodWithCondition``), so no condition of ours can land
    first: with no free disruption left (``max-disruptions: 0``) the controller counts it
    by lowering the Job's backoffLimit, and the next failure ends the Job."""
    policy = {
        **IGNORE,
        "retry-policy.dev/max-disruptions": "0",
        "retry-policy.dev/backoff-limit": "1",
    }
    with PodWatch(kube, ns) as watched:
        kube.apply(job_manifest("lost", ns, policy, {EXIT: "run,143"}))
        first = running(kube, ns, "lost")[0]
        node = node_of(first)
        lose_node(kube, node)
        try:
            uid = first["metadata"]["uid"]
            condition = eventually(
                lambda: watched.condition(uid, "DisruptionTarget"), 120, "PodGC's mark"
            )
            assert condition["reason"] == "DeletionByPodGC"
            real, played = as_played(condition)
            assert real == played
            done = kube.finished(ns, "lost", 90)
        finally:
            restore_node(kube, node)
    assert kube.job_condition(ns, "lost", "Failed")["reason"] == "BackoffLimitExceeded"
    assert done["spec"]["backoffLimit"] == 0
    assert done["status"]["failed"] == 1
    assert len({p["metadata"]["uid"] for p in watched.seen}) == 2


def test_two_pods_lost_at_once_over_the_budget_lower_backoff_limit_by_two(
    kube: Kube, webhook: Served, ns: str
):
    """A node takes two pods of a Job with it, both past ``max-disruptions``: PodGC fails
    them in one pass, the controller counts both by lowering ``backoffLimit`` by two in
    one write, and the chart's admission policy allows it (``ValidateJobSpecUpdate``
    allows any change of ``backoffLimit``; the policy any lowering of ours)."""
    policy = {
        **IGNORE,
        "retry-policy.dev/max-disruptions": "0",
        "retry-policy.dev/backoff-limit": "3",
    }
    pinned = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": ["ondemand-b"],
                                }
                            ]
                        }
                    ]
                }
            }
        }
    }
    spec = {"completions": 2, "parallelism": 2}
    job = job_manifest("pair", ns, policy, {EXIT: "run,run,0"}, spec=spec, pod_spec=pinned)
    with PodWatch(kube, ns) as watched:
        kube.apply(job)
        first = running(kube, ns, "pair", count=2)
        lose_node(kube, "ondemand-b")
        try:
            for pod in first:
                eventually(
                    lambda pod=pod: watched.condition(pod["metadata"]["uid"], "DisruptionTarget"),
                    120,
                    "PodGC's mark",
                )
            eventually(
                lambda: kube.get("job", "pair", ns)["spec"]["backoffLimit"] == 1,
                60,
                "backoffLimit lowered by two",
            )
        finally:
            restore_node(kube, "ondemand-b")
        done = kube.finished(ns, "pair", 90)
    assert kube.job_condition(ns, "pair", "Complete"), done["status"]
    assert done["spec"]["backoffLimit"] == 1
