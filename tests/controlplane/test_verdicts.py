"""Failure verdicts against the real control plane: a DRA device taint evicting a pod
(the real scheduler allocates the device, the real device taint eviction controller
evicts with ``DeletionByDeviceTaintManager``), a node lost under a pod (the real node
lifecycle and taint eviction controllers), a played image pull that never ends and a pod
no node can run, both past their start deadline; each category written as the real Job
controller must read it, through the chart's RBAC and admission policy."""

from __future__ import annotations

import json
from typing import Any

from testkit.controlplane.harness import (
    UNREACHABLE_AT_ONCE,
    Kube,
    PodWatch,
    Served,
    as_played,
    eventually,
    job_manifest,
    node_of,
    running,
    stop_kubelet,
    wait_node_ready,
)

EXIT = "kubelet.retry-policy.dev/exit-code"
WAITING = "kubelet.retry-policy.dev/waiting-reason"
P = "retry-policy.dev/"
DRIVER = "gpu.example.com"
REASON = "RetryFailureClassified"


def category(watched: PodWatch, uid: str, name: str) -> dict[str, Any] | None:
    return watched.condition(uid, P + name)


def events_of(kube: Kube, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("events.events.k8s.io", ns) if e.get("reason") == reason]


def phase_when_marked(watched: PodWatch, uid: str, name: str) -> str:
    """The phase of the first version of the pod that carried the category."""
    for pod in watched.seen:
        conditions = pod.get("status", {}).get("conditions") or []
        if pod["metadata"]["uid"] == uid and any(c["type"] == P + name for c in conditions):
            return pod["status"].get("phase", "")
    return ""


def gpu_objects(ns: str, node: str) -> list[dict[str, Any]]:
    """A DeviceClass of the driver's devices, two devices on ``node`` (resource.k8s.io/v1:
    a ResourceSlice as a DRA driver publishes one) and a claim template for one device."""
    klass = f"gpu-{ns}"
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": klass},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"gpus-{ns}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": f"{node}-{ns}", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpu", "namespace": ns},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]
                    }
                }
            },
        },
    ]


def test_a_dra_device_taint_ends_as_a_free_device_fault(kube: Kube, webhook: Served, ns: str):
    """The device a pod was allocated is tainted NoExecute (a DRA driver found it faulty):
    upstream's device taint eviction controller adds ``DisruptionTarget``
    (``DeletionByDeviceTaintManager``) and deletes the pod (``addConditionAndDeletePod``
    in pkg/controller/devicetainteviction); our controller writes ``DeviceFault`` while
    the pod terminates, so the real Job controller reads it (``isPodFailed``: not before
    Failed) and its Ignore rule takes it: with backoffLimit 0 the Job still completes."""
    node = "ondemand-a"
    for obj in gpu_objects(ns, node):
        kube.apply(obj)
    policy = {P + "free-categories": "DeviceFault", P + "backoff-limit": "0"}
    pod_spec = {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
        "nodeSelector": {"kubernetes.io/hostname": node},
    }
    job = job_manifest("gpu", ns, policy, {EXIT: "run,0"}, pod_spec=pod_spec)
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    with PodWatch(kube, ns) as watched:
        kube.apply(job)
        first = running(kube, ns, "gpu")[0]
        uid = first["metadata"]["uid"]
        (claimed,) = first["status"]["resourceClaimStatuses"]
        claim = kube.get("resourceclaim", claimed["resourceClaimName"], ns)
        (device,) = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        taint = {"key": f"{DRIVER}/unhealthy", "value": "xid-79", "effect": "NoExecute"}
        sliced = kube.get("resourceslice", f"gpus-{ns}")
        for entry in sliced["spec"]["devices"]:
            if entry["name"] == device:
                entry["taints"] = [taint]  # what a DRA driver publishes for a faulty device
        kube.kubectl("replace", "-f", "-", stdin=json.dumps(sliced))
        target = eventually(
            lambda: watched.condition(uid, "DisruptionTarget"), 60, "the device taint's eviction"
        )
        assert target["reason"] == "DeletionByDeviceTaintManager"
        real, played = as_played(target)
        assert real == played
        marked = eventually(lambda: category(watched, uid, "DeviceFault"), 60, "DeviceFault")
        assert marked["reason"] == "DisruptionReason"
        assert phase_when_marked(watched, uid, "DeviceFault") != "Failed"  # in time
        done = kube.finished(ns, "gpu", 120)
    assert kube.job_condition(ns, "gpu", "Complete"), done["status"]
    assert done["status"].get("failed", 0) == 0
    notes = [e["note"] for e in events_of(kube, ns, REASON)]
    assert any("DeviceFault (DisruptionReason)" in n and "not counted" in n for n in notes), notes
    kube.kubectl("delete", "deviceclass", f"gpu-{ns}", "--wait=false", check=False)
    kube.kubectl("delete", "resourceslice", f"gpus-{ns}", "--wait=false", check=False)


def test_a_node_lost_under_a_pod_ends_as_a_free_node_failure(kube: Kube, webhook: Served, ns: str):
    """The node's kubelet goes silent: the real node lifecycle controller taints it
    unreachable and the taint eviction controller evicts the pod (``DeletionByTaintManager``,
    while the pod still runs on the silent node); our controller reads the Node, finds the
    unreachable taint, and writes ``NodeFailure`` before anything fails the pod."""
    policy = {P + "free-categories": "NodeFailure", P + "backoff-limit": "0"}
    job = job_manifest("lost", ns, policy, {EXIT: "run,0"}, pod_spec=UNREACHABLE_AT_ONCE)
    with PodWatch(kube, ns) as watched:
        kube.apply(job)
        first = running(kube, ns, "lost")[0]
        node, uid = node_of(first), first["metadata"]["uid"]
        stop_kubelet(kube, node)
        try:
            marked = eventually(
                lambda: category(watched, uid, "NodeFailure"), 120, "NodeFailure on the pod"
            )
            assert marked["reason"] == "DisruptionReason"
            assert phase_when_marked(watched, uid, "NodeFailure") == "Running"  # in time
        finally:
            stop_kubelet(kube, node, stopped=False)
        wait_node_ready(kube, node)
        done = kube.finished(ns, "lost", 120)
    assert kube.job_condition(ns, "lost", "Complete"), done["status"]
    assert done["status"].get("failed", 0) == 0


def test_an_image_pull_past_the_start_deadline_ends_as_image_pull(
    kube: Kube, webhook: Served, ns: str
):
    """The played kubelet reports the image pull backing off for ever
    (``waiting-reason``); past the start deadline our controller writes ``ImagePull``
    (reason ``StartDeadline``) and lowers the pod's ``activeDeadlineSeconds``, which the
    real API server allows (``ValidatePodUpdate``) and the chart's policy lets through;
    the kubelet fails the pod, and the real Job controller's FailJob rule
    (fail-categories) ends the Job at once."""
    policy = {
        P + "start-deadline": "15s",
        P + "fail-categories": "ImagePull",
        P + "backoff-limit": "3",
    }
    job = job_manifest("pull", ns, policy, {WAITING: "ImagePullBackOff"})
    with PodWatch(kube, ns) as watched:
        kube.apply(job)
        pod = eventually(lambda: kube.pods_of(ns, "pull"), 60, "the pod")[0]
        uid = pod["metadata"]["uid"]
        marked = eventually(lambda: category(watched, uid, "ImagePull"), 90, "ImagePull")
        assert marked["reason"] == "StartDeadline"
        assert phase_when_marked(watched, uid, "ImagePull") == "Pending"
        done = kube.finished(ns, "pull", 90)
    failed = kube.job_condition(ns, "pull", "Failed")
    assert failed["reason"] == "PodFailurePolicy", failed
    assert P + "ImagePull" in failed["message"]
    assert done["status"]["failed"] == 1
    notes = [e["note"] for e in events_of(kube, ns, REASON)]
    assert any("did not start within its start-deadline 15s: ImagePull" in n for n in notes)


def test_a_pod_no_node_can_run_is_failed_past_its_start_deadline(
    kube: Kube, webhook: Served, ns: str
):
    """No node matches the pod: the real scheduler marks it ``Unschedulable`` and no
    kubelet will ever end it. Our controller fails it as PodGC fails a pod no kubelet will
    end (phase Failed and the condition in one status patch: ``Pending`` to ``Failed`` is a
    transition the real API server takes), and the real Job controller counts it: with
    backoffLimit 0 the Job fails, instead of waiting for ever (kubernetes#122300)."""
    policy = {P + "start-deadline": "15s", P + "backoff-limit": "0"}
    pod_spec = {"nodeSelector": {"kubernetes.io/hostname": "no-such-node"}}
    job = job_manifest("nowhere", ns, policy, pod_spec=pod_spec)
    with PodWatch(kube, ns) as watched:
        kube.apply(job)
        pod = eventually(lambda: kube.pods_of(ns, "nowhere"), 60, "the pod")[0]
        uid = pod["metadata"]["uid"]
        marked = eventually(lambda: category(watched, uid, "Unschedulable"), 90, "Unschedulable")
        assert marked["reason"] == "StartDeadline"
        done = kube.finished(ns, "nowhere", 90)
    assert kube.job_condition(ns, "nowhere", "Failed")["reason"] == "BackoffLimitExceeded"
    assert done["status"]["failed"] == 1


def test_a_category_known_only_once_the_pod_failed_is_late_and_said_so(
    kube: Kube, webhook: Served, ns: str
):
    """An OOM kill fails a pod in the kubelet's one update (``getPhase``): no condition
    can land before. Ours lands a moment after, with the real Job controller's sync of the
    pod batched a second later (``syncJobBatchPeriod``): whether it read the condition
    shows in how the Job ends (``fail-categories: OOMKilled`` with backoffLimit 0: FailJob
    if it did, BackoffLimitExceeded if not). Either may happen; the controller counts the
    condition ``late`` (or ``missed``, when the pod was judged before it was classified)
    and the Event says so. The share read is printed (a measurement,
    benchmarks/results/verdicts-late.md)."""
    policy = {P + "fail-categories": "OOMKilled", P + "backoff-limit": "0"}
    names = [f"oom-{i}" for i in range(6)]
    for name in names:
        kube.apply(job_manifest(name, ns, policy, {EXIT: "137"}))
    ends = {name: kube.finished(ns, name, 120) for name in names}
    reasons = [kube.job_condition(ns, name, "Failed")["reason"] for name in names]
    assert set(reasons) <= {"PodFailurePolicy", "BackoffLimitExceeded"}, reasons
    assert all(job["status"]["failed"] == 1 for job in ends.values())
    notes = eventually(
        lambda: (n := [e["note"] for e in events_of(kube, ns, REASON)]) and len(n) >= 1 and n,
        30,
        "the Events",
    )
    # Late, or (a loaded leader) missed: the Job controller judged the pod before the
    # category was known, and then nothing is written; the Event says which.
    said = ("landed after the pod failed", "had judged it before its category was known")
    assert all(any(s in n for s in said) for n in notes), notes
    read = reasons.count("PodFailurePolicy")
    print(f"\nlate OOMKilled conditions read by the Job controller: {read} of {len(names)}")
