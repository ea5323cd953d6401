"""``peer-disruptions``: the running peers of a disrupted pod get
``retry-policy.dev/PeerDisrupted``, so that their failures, which the disruption caused
(a distributed training's workers exit with their own codes when one of them is preempted),
are ignored or counted instead of failing the workload by ``fail-non-retriable``.

A pod's peers are the pods it runs with (``peer_group``): its JobSet's run, else its Job.
The store of them is the peer-disruptions watch's (``Disruptions`` feeds it); a mark is
best effort (``webhook.cluster.conditions``: one that lands on a ``Failed`` pod is counted
``late``, one on a judged pod is not written).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from webhook.cluster.conditions import (
    add_condition,
    condition,
    judged,
    label,
    pod_name,
    pod_uid,
    read_pod,
    status_patch,
    terminal,
    uncounted_of,
)
from webhook.cluster.events import Event
from webhook.cluster.informer import short_error
from webhook.controller.records import workload_of
from webhook.controller.writes import FENCED, GONE, REFUSED, outcome, persist
from webhook.kube.failurepolicy import DISRUPTION_TARGET, PEER_DISRUPTED
from webhook.kube.objects import controller_of, items, mapping
from webhook.kube.wellknown import JOB_TRACKING, JOB_UID_LABEL, JOBSET_UID, RESTART_ATTEMPT
from webhook.plan.causes import PEERS_LABEL

log = logging.getLogger(__name__)

#: The reason of every Event about disruptions and their budgets (``Disruptions`` too).
REASON = "RetryDisruptionCounted"
#: Seconds a pod condition is tried again for after transient errors: past them the Job
#: controller has judged the pod (``webhook.cluster.conditions``).
MARK_PATIENCE = 5.0
#: Writes of an unmark tried before it is left (conflicts read the pod again).
UNMARK_TRIES = 5
UNMARKED = "this pod was disrupted itself: its own disruption decides, not its peer's"


def disrupted(pod: Mapping[str, Any]) -> bool:
    """A disruption that happened: ``DisruptionTarget=True`` on a pod being deleted or
    ended. The condition on a pod that runs on is one whose disruption never came (the
    preemption or eviction that set it did not delete the pod): the disruption controller
    resets it to False (``syncStalePodDisruption``, ``nonTerminatingPodHasStaleDisruption
    Condition``), and it marks no peer."""
    meta = mapping(pod.get("metadata"))
    return condition(pod, DISRUPTION_TARGET) is not None and (
        meta.get("deletionTimestamp") is not None or terminal(pod)
    )


def marked_to_count(pod: Mapping[str, Any]) -> bool:
    """A peer marked under ``peer-disruptions: count``: the Job controller counts it."""
    return condition(pod, PEER_DISRUPTED) is not None and label(pod, PEERS_LABEL) == "count"


class Peers:
    """The peer groups seen, and the marking of a disrupted pod's peers."""

    def __init__(
        self,
        core: Any,
        workloads: Any,
        events: Any,
        metrics: Any,
        conditions: Any,
        clock: Callable[[], float],
        limit: int = 1000,
    ) -> None:
        self.core = core
        self.workloads = workloads
        self.events = events
        self.metrics = metrics
        #: The pod conditions' failures (``webhook.controller.writes.Writes``).
        self.conditions = conditions
        self.clock = clock
        #: The most peers marked for one disruption (``--peer-mark-limit``): a disruption
        #: in a workload of thousands of pods costs no more writes than that.
        self.limit = limit
        self._lock = threading.Lock()
        #: Peer groups -> pod UID -> the pod (what the store keeps of it: ``_kept``).
        self._groups: dict[tuple[str, ...], dict[str, Mapping[str, Any]]] = {}

    # --- the store ----------------------------------------------------------------------
    def reset(self) -> None:
        with self._lock:
            self._groups.clear()

    def seen(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """Keep the pod (or forget it: ``DELETED``); whether it is one to keep at all."""
        group, uid = peer_group(pod), pod_uid(pod)
        if group is None or not uid:
            return False
        with self._lock:
            members = self._groups.setdefault(group, {})
            if kind == "DELETED":
                members.pop(uid, None)
                if not members:
                    del self._groups[group]
                return False
            members[uid] = _kept(pod)
        return True

    # --- marking ------------------------------------------------------------------------
    def mark(self, pod: Mapping[str, Any], pool: ThreadPoolExecutor | None = None) -> int:
        """Mark the peers of a disrupted pod that its loss may fail, several at once; how
        many were marked."""
        uid = pod_uid(pod)
        group = peer_group(pod)
        with self._lock:
            members = list(self._groups.get(group or (), {}).values())
        others = [p for p in members if pod_uid(p) != uid]
        uncounted = self._uncounted(others)
        peers = [p for p in others if _unmarked_peer(p, uncounted)]
        left = peers[self.limit :]
        peers = peers[: self.limit]
        how = label(pod, PEERS_LABEL)
        cause = str(mapping(condition(pod, DISRUPTION_TARGET)).get("reason") or "disruption")
        message = f"peer pod {pod_name(pod)} was disrupted ({cause}); peer-disruptions {how}"
        mark = (PEER_DISRUPTED, "PeerPodDisrupted", message, uncounted)
        if pool is None:
            results = [self._mark(p, *mark) for p in peers]
        else:
            results = [f.result() for f in [pool.submit(self._mark, p, *mark) for p in peers]]
        marked = sum(1 for r in results if r in ("added", "late"))
        regarding = workload_of(pod)
        if regarding is not None and peers:
            verb = "ignored" if how == "ignore" else "counted once each"
            note = (
                f"pod {pod_name(pod)} disrupted ({cause}): {marked} of its peers marked "
                f"{PEER_DISRUPTED}; their failures are {verb} (peer-disruptions {how})"
            )
            self.events.emit(Event(regarding, "Normal", REASON, note, action="Mark"))
        if left:
            self._unmarked(pod, regarding, cause, len(left))
        return marked

    def _unmarked(self, pod: Mapping[str, Any], regarding: Any, cause: str, left: int) -> None:
        """Peers past the limit: counted, logged, and told on the workload."""
        self.metrics.peers_unmarked(left)
        log.warning(
            "%d peers of pod %s left unmarked (peer mark limit %d)", left, pod_name(pod), self.limit
        )
        if regarding is not None:
            note = (
                f"pod {pod_name(pod)} disrupted ({cause}): {left} more of its peers not marked "
                f"{PEER_DISRUPTED}, past the controller's peer mark limit {self.limit} "
                "(controller.peerMarkLimit): their own rules decide their failures"
            )
            self.events.emit(Event(regarding, "Warning", REASON, note, action="Mark"))

    def unmark(self, pod: Mapping[str, Any]) -> str:
        """A peer marked ``PeerDisrupted`` under ``peer-disruptions: count`` that is then
        disrupted itself (a drain takes a node's pods a moment apart): its own disruption
        decides it (ignore-disruptions, max-disruptions), not its peer's. The Job
        controller takes the first rule that matches (``matchPodFailurePolicy``), and the
        Count on ``PeerDisrupted`` comes before the Ignore on ``DisruptionTarget``, so the
        mark goes to ``False``, written with the resourceVersion of a version not
        ``Failed``: it is then on every ``Failed`` version (``mergePodStatus`` keeps it).
        "unmarked", "late" (the pod failed first: the Job controller may count it as a
        peer's failure), "gone", or "error"."""
        for _ in range(UNMARK_TRIES):
            mark = next(
                (
                    c
                    for c in items(mapping(pod.get("status")).get("conditions"))
                    if isinstance(c, dict) and c.get("type") == PEER_DISRUPTED
                ),
                None,
            )
            if mark is None or mark.get("status") != "True":
                return "unmarked"
            if terminal(pod):
                self.metrics.condition(PEER_DISRUPTED, "late")
                return "late"
            version = str(mapping(pod.get("metadata")).get("resourceVersion") or "")
            body = status_patch(PEER_DISRUPTED, "PodDisrupted", UNMARKED, self.clock())
            body["status"]["conditions"][0]["status"] = "False"
            try:
                add_condition(self.core, pod, body, version or None)
            except Exception as err:
                kind = outcome(err)
                if kind == GONE:
                    return "gone"
                if kind in (REFUSED, FENCED):
                    what = f"condition {PEER_DISRUPTED} unset on pod {pod_name(pod)}"
                    self.conditions.failed(pod_uid(pod), err, workload_of(pod), what)
                    return "error"
                found = read_pod(self.core, pod)
                if found is None:
                    return "gone"
                pod = found
                continue
            self.metrics.condition(PEER_DISRUPTED, "unmarked")
            return "unmarked"
        return "error"

    def _uncounted(self, pods: list[Mapping[str, Any]]) -> frozenset[str]:
        """The ``uncountedTerminatedPods`` of the Jobs of those pods that finished and keep
        their tracking finalizer: only for them does the list tell whether they were
        judged (read once per Job, and only then)."""
        jobs = set()
        for pod in pods:
            meta = mapping(pod.get("metadata"))
            owner = controller_of(meta)
            if terminal(pod) and JOB_TRACKING in items(meta.get("finalizers")) and owner:
                jobs.add((str(meta.get("namespace")), str(owner.get("name"))))
        found: set[str] = set()
        for namespace, name in jobs:
            try:
                found |= uncounted_of(self.workloads.read("job", namespace, name))
            except Exception as err:  # unknown: the finalizer alone decides
                log.warning("Job %s/%s not read: %s", namespace, name, short_error(err))
        return frozenset(found)

    def _mark(
        self,
        pod: Mapping[str, Any],
        kind: str,
        reason: str,
        message: str,
        uncounted: frozenset[str] = frozenset(),
    ) -> str:
        """Add a condition to ``pod``: "added", "late" (the pod had failed: the Job
        controller may judge it without), "missed" (judged already: not written), or "gone"."""
        if judged(pod, uncounted):
            self.metrics.condition(kind, "missed")
            return "missed"
        what = f"condition {kind} on pod {pod_name(pod)}"
        try:
            patched = persist(
                self.conditions,
                pod_uid(pod),
                lambda: add_condition(
                    self.core, pod, status_patch(kind, reason, message, self.clock())
                ),
                workload_of(pod),
                what,
                MARK_PATIENCE,
            )
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return "gone"
            log.warning("%s not added to pod %s: %s", kind, pod_name(pod), short_error(err))
            return "error"
        result = "late" if terminal(pod) or terminal(patched) else "added"
        self.metrics.condition(kind, result)
        return result


def peer_group(pod: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The pods a pod runs with: its JobSet's run, else its Job, in its namespace (a pod
    elsewhere that carries the same UID labels is no peer: a JobSet's and a Job's pods
    are all in its namespace)."""
    meta = mapping(pod.get("metadata"))
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        return None
    labels = mapping(meta.get("labels"))
    jobset = labels.get(JOBSET_UID)
    if isinstance(jobset, str) and jobset:
        return ("jobset", namespace, jobset, str(labels.get(RESTART_ATTEMPT) or "0"))
    owner = controller_of(meta)
    job = labels.get(JOB_UID_LABEL) or (owner or {}).get("uid")
    return ("job", namespace, str(job)) if job else None


def _unmarked_peer(pod: Mapping[str, Any], uncounted: frozenset[str] = frozenset()) -> bool:
    """A peer to mark: not disrupted itself (its own rule decides it), not marked yet,
    and not judged by the Job controller already."""
    return (
        condition(pod, DISRUPTION_TARGET) is None
        and condition(pod, PEER_DISRUPTED) is None
        and not judged(pod, uncounted)
        and _phase(pod) != "Succeeded"
    )


def _kept(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the peer store keeps of a pod: enough to mark it."""
    meta = mapping(pod.get("metadata"))
    status = mapping(pod.get("status"))
    return {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "finalizers", "labels", "ownerReferences")
            if k in meta
        },
        "status": {k: status[k] for k in ("phase", "conditions") if k in status},
    }


def _phase(pod: Mapping[str, Any]) -> Any:
    return mapping(pod.get("status")).get("phase")
