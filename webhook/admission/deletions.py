"""Disruptions by deletion: a pod a disruptor deletes is marked ``DisruptionTarget`` as an
evicted one would be.

Preemption, the Eviction API, the taint manager, PodGC and the kubelet's evictions all add
``DisruptionTarget=True`` before the pod stops, and ``ignore-disruptions``' Ignore rule
takes the pod by it. A node autoscaler that deletes pods instead (Karpenter's forced
termination: kubernetes#141316, karpenter#3218) adds nothing, so the Job controller
charges the reclaim to the application: a pod deleted so stops (143, or 137 after its
grace period) and fails, and with a podFailurePolicy it is judged on that failure like
any other (``isPodFailed``: a terminating pod is failed only once ``Failed``).

Only admission knows who deletes a pod (the API server records no deleter on the object),
so the validating webhook receives the DELETE of the pods whose workloads ignore
disruptions (the chart's matchConditions: the pod's label
``retry-policy.dev/ignore-disruptions``, and conditions that keep out every deleter but
the disruptors, pods already disrupted and pods already terminal), always allows it,
and when the deleter is one of the config's ``disruptors`` hands the pod to
``webhook.cluster.deletions``, which adds the condition once the deletion is stored. Not
on the admission path: the answer waits for nothing.

What is left alone, and why:

- a pod already ``Succeeded`` or ``Failed``: its deletion stops nothing (the Job
  controller, a TTL, a person cleaning up) and its failure was judged as it was;
- a pod that has ``DisruptionTarget=True`` already (an eviction's own deletion);
- a dry run (``--dry-run=server``): nothing is deleted.

A forced deletion (``gracePeriodSeconds: 0``) is marked as any other: a Job's pod keeps
its tracking finalizer, so it stays, terminating, until the Job controller judged it; the
kubelet still stops it (``killPod``), with the least grace it gives, and the condition
must land before the pod is ``Failed`` and the Job controller's next sync (see
``webhook.cluster.conditions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.admission.review import Request, Verdict
from webhook.kube.failurepolicy import DISRUPTION_TARGET
from webhook.kube.objects import items, mapping
from webhook.plan.causes import IGNORE_LABEL
from webhook.policy.config import Config

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Deleted:
    """A pod a disruptor deleted: where it is, who deleted it, with what grace."""

    namespace: str
    name: str
    uid: str
    user: str
    grace: int | None

    @property
    def forced(self) -> bool:
        return self.grace == 0


def judge(request: Request, config: Config) -> Verdict:
    """The answer to a DELETE: always allowed; ``deleted`` set for a pod to mark."""
    pod = request.old_object
    if request.kind.kind != "Pod" or request.kind.group or pod is None:
        return Verdict()
    meta = mapping(pod.get("metadata"))
    if mapping(meta.get("labels")).get(IGNORE_LABEL) != "true":
        return Verdict()
    if not config.disruptors.deleted_by(request.user, request.groups):
        return Verdict()
    status = mapping(pod.get("status"))
    if status.get("phase") in TERMINAL or any(
        mapping(c).get("type") == DISRUPTION_TARGET and mapping(c).get("status") == "True"
        for c in items(status.get("conditions"))
    ):
        return Verdict()
    name, uid = meta.get("name") or request.name, meta.get("uid")
    namespace = request.namespace or meta.get("namespace")
    if not all(isinstance(v, str) and v for v in (name, uid, namespace)):
        return Verdict()
    grace = _grace(request.options)
    who = request.user or "a member of a disruptors group"
    return Verdict(deleted=Deleted(str(namespace), str(name), str(uid), who, grace))


def _grace(options: Any) -> int | None:
    value = mapping(options).get("gracePeriodSeconds")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
