"""Marks the pods a disruptor deleted ``DisruptionTarget=True`` (``webhook.admission.deletions``
decides which), off the admission path: ``submit`` only queues, a few threads per process
write, as the Event recorder's does.

Why here, in the worker that answered the DELETE, and not in the leading controller:
the condition must land before the kubelet reports the pod ``Failed`` (a pod that stops
promptly on SIGTERM, or a forced deletion, leaves seconds at most; see
``webhook.cluster.conditions``), and handing the pod to the leader would add a write and
a watch's delivery to that, and depend on a leader being there (a failover leaves none for
up to the Lease's duration). The write needs no leader: it is one pod's, the same
whoever makes it (a strategic merge of one condition by its type), so two replicas, or a
DELETE retried, mark it once. The leader then sees the condition like any other
disruption (``max-disruptions``, ``peer-disruptions``).

For each pod: read it until the deletion is stored (its ``deletionTimestamp``; the DELETE
is admitted before it is stored, and a later admission plugin may still refuse it), for at
most ``wait`` seconds; then add the condition, with the resourceVersion just read as a
precondition (a 409 reads it again). A pod gone by then, replaced (another UID), never
deleted, or already disrupted is left alone. Each outcome is counted (``stats``):
``marked``; ``late`` (it was already ``Failed``: the Job controller may judge it
without); ``missed`` (already judged: not written); ``gone``, ``not_deleted``,
``already``; ``dropped`` (the queue was full, or the API kept failing).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from webhook.cluster.conditions import (
    add_condition,
    condition,
    judged,
    status_patch,
    terminal,
    terminating,
)
from webhook.cluster.events import Event, Workloads
from webhook.kube.failurepolicy import DISRUPTION_TARGET
from webhook.kube.objects import mapping

log = logging.getLogger(__name__)

#: Ours: no upstream component writes it (theirs: PreemptionByScheduler,
#: EvictionByEvictionAPI, DeletionByTaintManager, DeletionByPodGC, TerminationByKubelet).
REASON = "DeletionByDisruptor"
EVENT_REASON = "RetryDisruptionRecognized"
RESULTS = ("marked", "late", "missed", "gone", "not_deleted", "already", "dropped")


class DeletionMarker:
    """``submit`` a ``webhook.admission.deletions.Deleted``; never blocks nor raises.
    ``threads`` mark pods at once: a node's reclaim deletes all its pods together."""

    def __init__(
        self,
        core_api: Any,
        events: Any,
        workloads: Workloads,
        capacity: int = 1000,
        wait: float = 2.0,
        poll: float = 0.05,
        tries: int = 5,
        threads: int = 4,
        clock: Callable[[], float] = time.time,
    ):
        self.core = core_api
        self.events = events
        #: What the kinds declare of their pods: the workload an Event regards.
        self.workloads = workloads
        self.wait = wait
        self.poll = poll
        self.tries = tries
        self.threads = threads
        self.clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(capacity)
        self._lock = threading.Lock()
        self._started = False
        self.counters = dict.fromkeys(RESULTS, 0)

    def submit(self, deleted: Any) -> bool:
        with self._lock:
            if not self._started:
                self._started = True
                for n in range(self.threads):
                    name = f"deletions-{n}"
                    threading.Thread(target=self._run, name=name, daemon=True).start()
        try:
            self._queue.put_nowait(deleted)
        except queue.Full:
            self._count("dropped")
            return False
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued pod was handled (tests, and a stop)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _count(self, result: str) -> None:
        with self._lock:
            self.counters[result] += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)

    def _run(self) -> None:
        while True:
            deleted = self._queue.get()
            try:
                self._count(self.mark(deleted))
            except Exception as err:  # the thread must outlive anything
                log.warning("pod %s/%s not marked: %s", deleted.namespace, deleted.name, err)
                self._count("dropped")
            finally:
                self._queue.task_done()

    # --- one pod ---------------------------------------------------------------------------
    def mark(self, deleted: Any) -> str:
        """Mark one deleted pod; what became of it (``RESULTS``)."""
        deadline = time.monotonic() + self.wait
        for _ in range(self.tries):
            pod = self._read(deleted)
            while pod is not None and not terminating(pod) and time.monotonic() < deadline:
                time.sleep(self.poll)
                pod = self._read(deleted)
            if pod is None:
                return "gone"
            if not terminating(pod):
                return "not_deleted"
            if condition(pod, DISRUPTION_TARGET) is not None:
                return "already"
            if judged(pod):
                return "missed"
            how = "forced deletion" if deleted.grace == 0 else "deletion"
            message = (
                f"{how} by {deleted.user}, a disruptor (retry-policy.dev): a disruption, as "
                "an eviction would mark it"
            )
            body = status_patch(DISRUPTION_TARGET, REASON, message, self.clock())
            version = str(mapping(pod.get("metadata")).get("resourceVersion") or "") or None
            try:
                patched = add_condition(self.core, pod, body, version)
            except Exception as err:
                status = getattr(err, "status", None)
                if status == 404:
                    return "gone"
                if status == 409:
                    continue  # changed since it was read: read it again
                raise
            result = "late" if terminal(pod) or terminal(patched) else "marked"
            self._tell(pod, deleted, result)
            return result
        return "dropped"

    def _read(self, deleted: Any) -> dict[str, Any] | None:
        try:
            resp = self.core.read_namespaced_pod(
                deleted.name, deleted.namespace, _preload_content=False, _request_timeout=(5, 5)
            )
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return None
            raise
        pod: dict[str, Any] = json.loads(resp.data)
        return pod if mapping(pod.get("metadata")).get("uid") == deleted.uid else None

    def _tell(self, pod: dict[str, Any], deleted: Any, result: str) -> None:
        regarding = self.workloads.of_stored_pod(pod)
        if regarding is None:
            return
        how = "force-deleted" if deleted.grace == 0 else "deleted"
        note = (
            f"pod {deleted.name} {how} by {deleted.user}: marked DisruptionTarget "
            f"({REASON}), so ignore-disruptions takes it as it takes an evicted pod"
        )
        if result == "late":
            note += "; it had already failed: the Job controller may have counted it"
        self.events.emit(Event(regarding, "Normal", EVENT_REASON, note, action="Recognize"))
