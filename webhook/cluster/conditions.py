"""Pod conditions the webhook adds, as the API takes them, and what a pod says of itself.

A condition is added with a strategic merge patch of ``pods/status``: ``status.conditions``
merges by ``type`` (``patchMergeKey: type`` on ``PodStatus.Conditions``, k8s.io/api
core/v1/types.go), so the kubelet's own conditions stay, and adding ours twice is one
condition. A custom condition's type must be a qualified name (``validatePodConditions``,
from ``ValidatePodStatusUpdate`` in pkg/apis/core/validation/validation.go): ours are
``retry-policy.dev/...`` (``webhook.kube.failurepolicy.OUR_CONDITIONS``), and
``DisruptionTarget``, which the webhook adds to a pod a disruptor deleted
(``webhook.cluster.deletions``).

When it must land: the Job controller reads a pod's conditions when it judges the pod,
which, for a Job with a podFailurePolicy, is once the pod's phase is ``Failed``
(``isPodFailed``: ``onlyReplaceFailedPods`` is true with a podFailurePolicy, so a
terminating pod is not failed before), in its next sync of the Job after that update
(``updatePod`` queues one ``syncJobBatchPeriod``, 1 s, later), and then removes its
``batch.kubernetes.io/job-tracking`` finalizer. A condition added while the pod
terminates is always read; one added after ``Failed`` is read only if that sync has not
run yet (``judged``); later, it changes nothing. Whether a condition added after
``Failed`` is read is a race the writer cannot see the end of: a writer that must count
exactly once writes only with a ``resourceVersion`` precondition on a pod it saw not yet
``Failed`` (every ``Failed`` version of the pod then carries the condition), and counts a
pod that failed first some other way (``webhook.controller.disruptions``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import JOB_TRACKING

STRATEGIC = "application/strategic-merge-patch+json"
TERMINAL = ("Succeeded", "Failed")


def condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The pod's condition of type ``kind`` when its status is True."""
    for found in items(mapping(pod.get("status")).get("conditions")):
        if isinstance(found, dict) and found.get("type") == kind and found.get("status") == "True":
            return found
    return None


def terminal(pod: Mapping[str, Any]) -> bool:
    return mapping(pod.get("status")).get("phase") in TERMINAL


def judged(pod: Mapping[str, Any], uncounted: Collection[str] = ()) -> bool:
    """Whether the Job controller has judged this finished pod already
    (``trackJobStatusAndRemoveFinalizers`` in pkg/controller/job/job_controller.go): a pod
    it counts goes into the Job's ``status.uncountedTerminatedPods`` (``uncounted``, from
    ``uncounted_of``) before it removes the pod's tracking finalizer, and a listed pod is
    never judged again; a pod it ignores only loses the finalizer."""
    if not terminal(pod):
        return False
    finalizers = items(mapping(pod.get("metadata")).get("finalizers"))
    return JOB_TRACKING not in finalizers or pod_uid(pod) in uncounted


def uncounted_of(job: Mapping[str, Any] | None) -> frozenset[str]:
    """The pod UIDs in a Job's ``status.uncountedTerminatedPods`` (failed and succeeded)."""
    found = mapping(mapping(mapping(job).get("status")).get("uncountedTerminatedPods"))
    return frozenset(
        uid
        for key in ("failed", "succeeded")
        for uid in items(found.get(key))
        if isinstance(uid, str) and uid
    )


def terminating(pod: Mapping[str, Any]) -> bool:
    return mapping(pod.get("metadata")).get("deletionTimestamp") is not None


def now_rfc3339(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_patch(kind: str, reason: str, message: str, when: float) -> dict[str, Any]:
    """The strategic merge patch that adds (or sets) one True condition."""
    return {
        "status": {
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": now_rfc3339(when),
                }
            ]
        }
    }


def add_condition(
    core_api: Any,
    pod: Mapping[str, Any],
    body: dict[str, Any],
    version: str | None = None,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Patch ``pods/status`` of ``pod`` with ``body``; with ``version``, only if the pod is
    still at that resourceVersion (else the API answers 409 Conflict). The pod as patched."""
    meta = mapping(pod.get("metadata"))
    if version is not None:
        body = {**body, "metadata": {"resourceVersion": version}}
    resp = core_api.patch_namespaced_pod_status(
        meta.get("name"),
        meta.get("namespace"),
        body,
        _content_type=STRATEGIC,
        _preload_content=False,
        _request_timeout=(timeout, timeout),
    )
    result: dict[str, Any] = json.loads(resp.data)
    return result


def read_pod(core_api: Any, pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod as it is now; ``None`` when it is gone (or its name is another pod's)."""
    meta = mapping(pod.get("metadata"))
    try:
        resp = core_api.read_namespaced_pod(
            meta.get("name"), meta.get("namespace"), _preload_content=False
        )
    except Exception as err:
        if getattr(err, "status", None) == 404:
            return None
        raise
    found: dict[str, Any] = json.loads(resp.data)
    return found if mapping(found.get("metadata")).get("uid") == meta.get("uid") else None


def pod_name(pod: Mapping[str, Any]) -> str:
    return str(mapping(pod.get("metadata")).get("name") or "")


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str(mapping(pod.get("metadata")).get("uid") or "")


def label(pod: Mapping[str, Any], key: str) -> str | None:
    value = mapping(mapping(pod.get("metadata")).get("labels")).get(key)
    return value if isinstance(value, str) else None


def label_value(pod: Mapping[str, Any], key: str, parse: Callable[[str], Any]) -> Any:
    """A label of ours in its key's grammar (``parse``); ``None`` when absent or bad."""
    raw = label(pod, key)
    try:
        return parse(raw) if raw is not None else None
    except ValueError:
        return None
