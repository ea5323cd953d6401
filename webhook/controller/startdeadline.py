"""``start-deadline``: a pod whose containers have not all started this long after it was
created is ended, so that the Job controller sees a failure and retries it (a pod stuck
pulling an image, on a bad ConfigMap, or unschedulable otherwise waits forever:
kubernetes#122300).

Its clock starts at its creation, or at its ``retry-policy.dev/not-before`` when our
retry-delay gate held it; a pod that carries a scheduling gate is not judged while it does
(it is held on purpose). The controller classifies the pod first (``ImagePull``,
``ConfigError``, ``Unschedulable`` where it can tell, else ``StartTimeout``:
``webhook.cluster.classify``, reason ``StartDeadline``) and then ends it, as upstream ends
such pods:

- **not scheduled** (no ``spec.nodeName``: no kubelet will ever run it): its status gets
  phase ``Failed`` and the category's condition in one patch, with the ``resourceVersion``
  of the version seen unscheduled (a pod bound meanwhile answers 409, and is read again),
  as PodGC fails a pod no kubelet will end (``markFailedAndDeletePodWithCondition`` in
  pkg/controller/podgc/gc_controller.go). It is not deleted: a ``Failed`` pod is what the
  Job controller judges with a podFailurePolicy (``isPodFailed``: a terminating pod is
  not failed until its phase is), and it stays, as every failed pod of a Job does;
- **scheduled** (its kubelet runs it): the category's condition is added with the
  ``resourceVersion`` of a version seen not ``Failed``, then the pod is ended by its own
  deadline, ``spec.activeDeadlineSeconds: 1`` (as ``max-in-place-restarts`` ends a pod:
  ``webhook.controller.restarts``); the kubelet fails it, reason ``DeadlineExceeded``
  (``activeDeadlineHandler.ShouldEvict``), keeping the condition (``mergePodStatus``). A
  deadline the API refuses takes the condition back (status ``False``), never half-done.

So the condition is on every ``Failed`` version of the pod: exactly once, in time.
"""

from __future__ import annotations

import datetime as dt
import heapq
import threading
from collections.abc import Callable, Mapping
from typing import Any

from webhook.cluster.conditions import label, pod_uid, terminal, terminating
from webhook.kube import gates, podsignals
from webhook.kube.objects import items, mapping
from webhook.plan.verdicts import START_DEADLINE_LABEL
from webhook.policy.grammar import BadValue, parse_start_deadline

#: Pods waited on at most (the furthest due go first).
MOST = 10_000
#: The deadline that ends a scheduled pod (``webhook.controller.restarts.DEADLINE``).
DEADLINE = 1


def deadline_of(pod: Mapping[str, Any]) -> int | None:
    """The pod's start deadline in seconds, from its label (``None``: none, or bad)."""
    raw = label(pod, START_DEADLINE_LABEL)
    try:
        return parse_start_deadline(raw) if raw is not None else None
    except BadValue:
        return None


def _time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        when = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=dt.timezone.utc).timestamp()


def due(pod: Mapping[str, Any]) -> float | None:
    """When the pod must have started (``None``: no deadline, or nothing to wait for)."""
    seconds = deadline_of(pod)
    if seconds is None or waiting_on_purpose(pod) or not pending(pod):
        return None
    meta = mapping(pod.get("metadata"))
    created = _time(meta.get("creationTimestamp"))
    if created is None:
        return None
    held = _time(mapping(meta.get("annotations")).get(gates.NOT_BEFORE))
    return max(created, held or created) + seconds


def waiting_on_purpose(pod: Mapping[str, Any]) -> bool:
    """A scheduling gate holds it (ours, Kueue's, anyone's)."""
    return bool(items(mapping(pod.get("spec")).get("schedulingGates")))


def pending(pod: Mapping[str, Any]) -> bool:
    """Not started, not ending, not ended."""
    return not (podsignals.started(pod) or terminal(pod) or terminating(pod))


def scheduled(pod: Mapping[str, Any]) -> bool:
    return bool(mapping(pod.get("spec")).get("nodeName"))


class Timers:
    """The pods waited on, by when each is due. Thread-safe."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._heap: list[tuple[float, str, tuple[str, str]]] = []
        self._due: dict[str, float] = {}

    def watch(self, pod: Mapping[str, Any]) -> None:
        """Wait on ``pod`` until it is due, or forget it (it started, ended, went)."""
        uid = pod_uid(pod)
        when = due(pod)
        with self._lock:
            if when is None:
                self._due.pop(uid, None)
                return
            if self._due.get(uid) == when:
                return
            self._due[uid] = when
            meta = mapping(pod.get("metadata"))
            ref = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            heapq.heappush(self._heap, (when, uid, ref))
            if len(self._due) > MOST:
                latest = max(self._due, key=self._due.__getitem__)
                del self._due[latest]

    def at(self, pod: Mapping[str, Any], when: float) -> None:
        """Be due for ``pod`` at ``when`` (a deadline's end the API failed: again)."""
        uid = pod_uid(pod)
        meta = mapping(pod.get("metadata"))
        ref = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        with self._lock:
            self._due[uid] = when
            heapq.heappush(self._heap, (when, uid, ref))

    def forget(self, uid: str) -> None:
        with self._lock:
            self._due.pop(uid, None)

    def ready(self) -> list[tuple[str, str, str]]:
        """The pods due now: (namespace, name, uid), each once."""
        now = self.clock()
        out = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                when, uid, ref = heapq.heappop(self._heap)
                if self._due.get(uid) == when:
                    del self._due[uid]
                    out.append((*ref, uid))
        return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)


def failed_status(conditions: list[dict[str, Any]], version: str) -> dict[str, Any]:
    """The status patch that fails an unscheduled pod with ``conditions``, only at
    ``version`` (as PodGC's ``markFailedAndDeletePodWithCondition`` fails an orphan)."""
    return {
        "metadata": {"resourceVersion": version},
        "status": {"phase": "Failed", "conditions": conditions},
    }
