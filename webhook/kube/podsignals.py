"""What a failed or stuck pod says about why, as Kubernetes writes it: the reasons of its
``DisruptionTarget`` condition, its containers' waiting and terminated reasons, its
``PodScheduled`` condition. Each name is spelled here once (the failure verdicts,
``webhook.policy.categories``, read them; ``webhook.cluster.history`` too).

- ``DisruptionTarget`` reasons (``v1.DisruptionTarget``, k8s.io/api core/v1/types.go):
  ``PreemptionByScheduler`` (the scheduler's preemption, ``prepareCandidate`` in
  pkg/scheduler/framework/preemption), ``EvictionByEvictionAPI`` (the ``pods/eviction``
  subresource, pkg/registry/core/pod/storage/eviction.go), ``DeletionByTaintManager`` (a
  NoExecute node taint: ``addConditionAndDeletePod`` in pkg/controller/tainteviction),
  ``DeletionByPodGC`` (a pod whose node is gone: ``gcOrphaned`` in pkg/controller/podgc),
  ``TerminationByKubelet`` (node-pressure eviction, pkg/kubelet/eviction; graceful node
  shutdown, pkg/kubelet/nodeshutdown), ``DeletionByDeviceTaintManager`` (a NoExecute taint
  on a DRA device the pod was allocated: ``addConditionAndDeletePod`` in
  pkg/controller/devicetainteviction).
- Waiting reasons of a container that never started: ``ErrImagePull``,
  ``ImagePullBackOff``, ``InvalidImageName`` (pkg/kubelet/images/types.go);
  ``CreateContainerConfigError``, ``CreateContainerError``
  (pkg/kubelet/kuberuntime/kuberuntime_container.go); ``RunContainerError``
  (pkg/kubelet/container/sync_result.go).
- ``PodScheduled=False`` with reason ``Unschedulable`` (no node fits) or
  ``SchedulingGated`` (a scheduling gate holds it: ``v1.PodReasonUnschedulable``,
  ``v1.PodReasonSchedulingGated``).
- The node taints the node lifecycle controller puts on a node that stopped reporting
  (``node.kubernetes.io/unreachable``) or reports not ready (``node.kubernetes.io/not-ready``):
  ``v1.TaintNodeUnreachable``, ``v1.TaintNodeNotReady`` (k8s.io/api core/v1/well_known_taints.go).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kube.objects import items, mapping

DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
EVICTION_BY_API = "EvictionByEvictionAPI"
DELETION_BY_TAINT_MANAGER = "DeletionByTaintManager"
DELETION_BY_POD_GC = "DeletionByPodGC"
TERMINATION_BY_KUBELET = "TerminationByKubelet"
DELETION_BY_DEVICE_TAINT_MANAGER = "DeletionByDeviceTaintManager"

ERR_IMAGE_PULL = "ErrImagePull"
IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
INVALID_IMAGE_NAME = "InvalidImageName"
IMAGE_PULL_REASONS = (ERR_IMAGE_PULL, IMAGE_PULL_BACK_OFF, INVALID_IMAGE_NAME)
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
CREATE_CONTAINER_ERROR = "CreateContainerError"
RUN_CONTAINER_ERROR = "RunContainerError"
CONFIG_ERROR_REASONS = (CREATE_CONTAINER_CONFIG_ERROR, CREATE_CONTAINER_ERROR, RUN_CONTAINER_ERROR)

OOM_KILLED = "OOMKilled"
POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"
SCHEDULING_GATED = "SchedulingGated"

TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
NODE_LOST_TAINTS = frozenset({TAINT_UNREACHABLE, TAINT_NOT_READY})


def condition_of(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The pod's condition of type ``kind``, whatever its status."""
    for found in items(mapping(pod.get("status")).get("conditions")):
        if isinstance(found, dict) and found.get("type") == kind:
            return found
    return None


def disruption_reason(pod: Mapping[str, Any]) -> str | None:
    """The reason of the pod's ``DisruptionTarget`` condition when it is True."""
    found = condition_of(pod, DISRUPTION_TARGET)
    if found is None or found.get("status") != "True":
        return None
    return str(found.get("reason") or "")


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """``PodScheduled=False`` with reason ``Unschedulable``: the scheduler found no node."""
    found = condition_of(pod, POD_SCHEDULED)
    return (
        found is not None
        and found.get("status") == "False"
        and found.get("reason") == UNSCHEDULABLE
    )


def container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every container's status: init containers first, as the kubelet runs them."""
    status = mapping(pod.get("status"))
    return [
        mapping(cs)
        for group in ("initContainerStatuses", "containerStatuses")
        for cs in items(status.get(group))
    ]


def waiting_reasons(pod: Mapping[str, Any]) -> list[str]:
    """The reasons of the containers waiting to start (``state.waiting``), in order."""
    return [
        str(mapping(mapping(cs.get("state")).get("waiting")).get("reason") or "")
        for cs in container_statuses(pod)
        if "waiting" in mapping(cs.get("state"))
    ]


def terminations(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``state.terminated`` of every container that ended, in order."""
    return [
        t
        for cs in container_statuses(pod)
        if (t := mapping(mapping(cs.get("state")).get("terminated")))
    ]


def started(pod: Mapping[str, Any]) -> bool:
    """Whether every regular container has started (``started``, or running, or ended):
    what ``start-deadline`` waits for. A pod with no container statuses yet has not."""
    statuses = items(mapping(pod.get("status")).get("containerStatuses"))
    if not statuses:
        return False
    for cs in statuses:
        cs = mapping(cs)
        state = mapping(cs.get("state"))
        if not (cs.get("started") is True or "running" in state or "terminated" in state):
            return False
    return True
