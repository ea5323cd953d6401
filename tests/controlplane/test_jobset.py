"""JobSets under the real JobSet controller (sigs.k8s.io/jobset v0.12.0: its reconcilers and
webhooks, ``cluster/jobset``) on top of the real Job controller: the JobSet's own failure
policy acting on the child Jobs' failures our rules cause (``executeFailurePolicy``,
``findFirstFailedPolicyRuleAndJob``, ``ruleIsApplicable``), with the reasons
``webhook.kinds.jobset.failurepolicy`` names, which explain and the audit replay use."""

from __future__ import annotations

from typing import Any

from testkit.controlplane.harness import Kube, Served, eventually
from webhook.kinds.jobset import failurepolicy as jsp

EXIT = "kubelet.retry-policy.dev/exit-code"


def jobset(name: str, ns: str, annotations: dict[str, str], codes: str) -> dict[str, Any]:
    """Two workers that run together, as a user writes them."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "template": {
                                "metadata": {"annotations": {EXIT: codes}},
                                "spec": {
                                    "containers": [
                                        {"name": "trainer", "image": "registry.example/t:1"}
                                    ]
                                },
                            },
                        }
                    },
                }
            ]
        },
    }


def ended(kube: Kube, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        found = kube.get("jobset", name, ns) or {}
        state = (found.get("status") or {}).get("terminalState")
        return found if state in ("Completed", "Failed") else None

    return eventually(done, timeout, f"jobset {ns}/{name} ended")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found["type"] == kind and found["status"] == "True":
            return found
    return None


def test_a_non_retriable_exit_fails_the_jobset_in_its_first_run(
    kube: Kube, webhook: Served, ns: str
):
    """Our rule on the child Job's podFailurePolicy fails the child Job (PodFailurePolicy),
    and the rule we add to the JobSet's failurePolicy (FailJobSet on that reason) ends the
    JobSet there: no restart, although backoff-limit allows three."""
    policy = {"retry-policy.dev/fail-non-retriable": "true", "retry-policy.dev/backoff-limit": "3"}
    kube.apply(jobset("fatal", ns, policy, "1"))
    done = ended(kube, ns, "fatal")
    assert done["status"]["terminalState"] == "Failed"
    assert done["status"].get("restarts", 0) == 0
    failed = condition(done, "Failed")
    assert failed is not None and failed["reason"] == jsp.FAIL_ACTION
    assert done["spec"]["failurePolicy"]["maxRestarts"] == 3


def test_a_retriable_exit_restarts_the_jobset_up_to_its_budget(
    kube: Kube, webhook: Served, ns: str
):
    """backoff-limit 2 is maxRestarts 2 with child backoffLimit 0: each retriable failure
    fails its child Job (BackoffLimitExceeded), which the JobSet restarts, twice, then
    fails (ReachedMaxRestarts)."""
    policy = {"retry-policy.dev/fail-non-retriable": "true", "retry-policy.dev/backoff-limit": "2"}
    kube.apply(jobset("retried", ns, policy, "143"))
    done = ended(kube, ns, "retried", 180)
    assert done["status"]["terminalState"] == "Failed"
    assert done["status"]["restarts"] == 2
    assert condition(done, "Failed")["reason"] == jsp.MAX_REACHED


def test_the_jobset_s_children_carry_our_rules_through_the_real_jobset_webhooks(
    kube: Kube, webhook: Served, ns: str
):
    policy = {
        "retry-policy.dev/fail-non-retriable": "true",
        "retry-policy.dev/backoff-limit": "1",
        "retry-policy.dev/ignore-disruptions": "true",
    }
    kube.apply(jobset("ok", ns, policy, "0"))
    done = ended(kube, ns, "ok")
    assert done["status"]["terminalState"] == "Completed"
    (child,) = kube.list("jobs", ns, "jobset.sigs.k8s.io/jobset-name=ok")
    assert child["spec"]["backoffLimit"] == 0
    actions = [r["action"] for r in child["spec"]["podFailurePolicy"]["rules"]]
    assert "Ignore" in actions and "FailJob" in actions
    assert child["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_an_evicted_pod_restarts_the_set_uncounted_with_one_job_write(
    kube: Kube, webhook: Served, ns: str
):
    """peer-disruptions ignore on a JobSet of two replicated Jobs (three child Jobs, six
    pods): one pod evicted (``pods/eviction``, DisruptionTarget EvictionByEvictionAPI).
    The controller adds FailureTarget to its child Job, once; the real Job controller
    fails that Job with the same reason and message (``syncJob``,
    ``newFailedConditionForFailureTarget``); the real JobSet controller's first rule,
    ours, applies to it (``ruleIsApplicable``) and restarts the set without counting
    (``RestartJobSetAndIgnoreMaxRestarts``). No peer gets a per-pod mark."""
    from testkit.controlplane.harness import evict
    from testkit.servers import metric
    from webhook.kinds.jobset import failurepolicy as jsp

    policy = {
        "retry-policy.dev/fail-non-retriable": "true",
        "retry-policy.dev/backoff-limit": "1",
        "retry-policy.dev/ignore-disruptions": "true",
        "retry-policy.dev/peer-disruptions": "ignore",
    }
    obj = jobset("peers", ns, policy, "run")
    workers = obj["spec"]["replicatedJobs"][0]
    obj["spec"]["replicatedJobs"] = [
        {**workers, "name": "leader", "replicas": 1},
        {**workers, "name": "workers", "replicas": 2},
    ]
    kube.apply(obj)
    stored = kube.get("jobset", "peers", ns)
    assert stored["spec"]["failurePolicy"]["rules"][0] == jsp.peer_rule("ignore")

    def all_running() -> list[dict[str, Any]] | None:
        pods = kube.list("pods", ns, "jobset.sigs.k8s.io/jobset-name=peers")
        live = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return live if len(live) == 6 else None

    pods = eventually(all_running, 120, "six pods of the JobSet running")
    before = metric(
        webhook.server.metrics(),
        "retry_webhook_controller_writes_total",
        writer="conditions",
        result="written",
    )
    evict(kube, pods[0])

    def restarted() -> dict[str, Any] | None:
        found = kube.get("jobset", "peers", ns) or {}
        return found if (found.get("status") or {}).get("restarts", 0) >= 1 else None

    done = eventually(restarted, 120, "the JobSet restarted")
    assert done["status"].get("restartsCountTowardsMax", 0) == 0
    assert not done["status"].get("terminalState")
    events = kube.list("events.events.k8s.io", ns)
    assert any(
        e.get("reason") == "RetryDisruptionCounted" and "FailureTarget" in (e.get("note") or "")
        for e in events
    )
    after = metric(
        webhook.server.metrics(),
        "retry_webhook_controller_writes_total",
        writer="conditions",
        result="written",
    )
    assert 1 <= after - before <= 3 + 2  # child Jobs + a small constant: here exactly one
    marked = [
        p
        for p in kube.list("pods", ns, "jobset.sigs.k8s.io/jobset-name=peers")
        if condition(p, "retry-policy.dev/PeerDisrupted")
    ]
    assert marked == []
    # The next run comes up whole (new restart-attempt).
    eventually(
        lambda: (
            len(
                [
                    p
                    for p in (all_running() or [])
                    if p["metadata"]["labels"].get("jobset.sigs.k8s.io/restart-attempt") == "1"
                ]
            )
            == 6
            or None
        ),
        120,
        "the second run's six pods running",
    )
