"""The leader counts disruptions against ``max-disruptions`` and marks a disrupted pod's
peers for ``peer-disruptions`` (``webhook.mutators.budgets``: the rules these conditions
meet).

It watches the pods labelled for either (``retry-policy.dev/max-disruptions``,
``retry-policy.dev/peer-disruptions``: the webhook labels their templates) and acts when
one gets ``DisruptionTarget=True``, which the scheduler's preemption, the Eviction API,
the taint manager, PodGC and the kubelet add before the pod stops (and the webhook
itself when a disruptor deletes it: ``webhook.cluster.deletions``):

- **max-disruptions N**: the disruption is the workload's next; the first N are free
  (the Ignore rule on DisruptionTarget takes them), and from N + 1 on the pod gets
  ``retry-policy.dev/DisruptionBudgetExhausted`` (Count, before that Ignore rule). The count
  is per JobSet for a JobSet's pods, per index for an Indexed Job with
  ``backoffLimitPerIndex`` (its pods carry ``job-index-failure-count``), else per Job, and
  is kept on the workload (``webhook.cluster.record``: why there), decided here from the
  count as last written plus those not written yet, so that the condition goes out at
  once; the count follows within ``window`` seconds.
- **peer-disruptions**: every other pod of the same Job (for a JobSet's pods, of the same
  JobSet run: ``jobset-uid`` and ``restart-attempt``) that is still running, or failed but
  not yet judged, gets ``retry-policy.dev/PeerDisrupted``, several at once (``workers``).

Each condition must land before the Job controller judges the pod
(``webhook.cluster.conditions``: once it is ``Failed``, in its next sync, at most a second
later); one that lands on a ``Failed`` pod is counted ``late``, one the Job controller had
already judged (its tracking finalizer gone) ``missed`` and not written
(``retry_webhook_controller_conditions_total``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.conditions import (
    add_condition,
    condition,
    judged,
    label,
    label_value,
    pod_name,
    pod_uid,
    status_patch,
    terminal,
    workload_of,
)
from webhook.cluster.events import Event, Regarding
from webhook.cluster.history import COMPLETION_INDEX, RESTART_ATTEMPT
from webhook.cluster.informer import Informer, short_error
from webhook.cluster.record import Record, lineage_key
from webhook.controller.records import Workloads
from webhook.controller.writes import Writes, persist, rewrite
from webhook.kube.failurepolicy import (
    DISRUPTION_BUDGET_EXHAUSTED,
    DISRUPTION_TARGET,
    PEER_DISRUPTED,
)
from webhook.kube.objects import controller_of, mapping
from webhook.mutators.budgets import MAX_DISRUPTIONS_LABEL, PEERS_LABEL
from webhook.policy.model import parse_count

log = logging.getLogger(__name__)

REASON = "RetryDisruptionCounted"
INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
#: Pods and workloads remembered at most (the oldest go first).
MOST = 10_000
#: Seconds a pod condition is tried again for after transient errors: past them the Job
#: controller has judged the pod (``webhook.cluster.conditions``).
MARK_PATIENCE = 5.0


class Metrics:
    """What the reconcilers report (``webhook.serving.metrics.ControllerMetrics``)."""

    def condition(self, kind: str, result: str) -> None:
        pass

    def disruption(self, result: str) -> None:
        pass


@dataclass
class _Budget:
    """A workload's record as this controller last read or wrote it, and the disruptions
    it counted since (``pending``, until written)."""

    kind: str  # "job" or "jobset"
    regarding: Regarding
    version: str
    record: Record
    pending: list[tuple[Mapping[str, Any], bool]] = field(default_factory=list)


class Disruptions:
    """A reconciler (``webhook.controller.manager.Reconciler``)."""

    name = "disruptions"

    def __init__(
        self,
        api_client: Any,
        events: Any,
        metrics: Any = None,
        window: float = 0.2,
        workers: int = 8,
        clock: Callable[[], float] = time.time,
    ):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.workloads = Workloads(api_client)
        self.events = events
        self.metrics = metrics or Metrics()
        self.window = window
        self.workers = workers
        self.clock = clock
        self._queue: queue.Queue[tuple[str, Mapping[str, Any]]] = queue.Queue()
        self._lock = threading.Lock()
        self._handled: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: (namespace, UID) of a workload -> its budget state: a pod names its workload by
        #: UID labels it could carry in any namespace, so the namespace is part of the key.
        self._budgets: OrderedDict[tuple[str, str], _Budget] = OrderedDict()
        #: Peer groups -> pod UID -> the pod (the peer-disruptions watch's store).
        self._groups: dict[tuple[str, ...], dict[str, Mapping[str, Any]]] = {}
        self.counters = {"counted": 0, "over": 0, "peers": 0, "writes": 0, "conflicts": 0}
        #: The record writes' and the pod conditions' failures (``webhook.controller.writes``).
        self.writes = Writes("disruptions", events, self.metrics)
        self.conditions = Writes("conditions", events, self.metrics)

    # --- the watches --------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        listing = self.core.list_pod_for_all_namespaces
        watches = [
            Informer(
                "disruption-budgets",
                listing,
                lambda: None,  # a relist delivers every pod again: marks make it a no-op
                self._budget_event,
                {"label_selector": MAX_DISRUPTIONS_LABEL},
                stop,
                "controller",
            ),
            Informer(
                "peer-disruptions",
                listing,
                self._reset_peers,
                self._peer_event,
                {"label_selector": PEERS_LABEL},
                stop,
                "controller",
            ),
        ]
        for informer in watches:
            threading.Thread(target=informer.run, name=informer.name, daemon=True).start()
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="peers")
        try:
            flushed = time.monotonic()
            while not stop.is_set():
                try:
                    what, pod = self._queue.get(timeout=0.05)
                except queue.Empty:
                    what, pod = "", {}
                if what == "budget":
                    self._guarded(self.count, pod)
                elif what == "peers":
                    self._guarded(self.mark_peers, pod, pool)
                if time.monotonic() - flushed >= self.window:
                    self.flush()
                    flushed = time.monotonic()
            self.flush()
        finally:
            pool.shutdown(wait=True)

    def _guarded(self, act: Callable[..., None], *args: Any) -> None:
        try:
            act(*args)
        except Exception as err:  # the loop must outlive any one pod
            log.warning("pod %s not handled: %s", pod_name(args[0]), short_error(err))

    def _budget_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        if kind != "DELETED" and condition(pod, DISRUPTION_TARGET) is not None:
            if not self._was_handled("budget", pod_uid(pod)):
                self._queue.put(("budget", pod))

    def _reset_peers(self) -> None:
        with self._lock:
            self._groups.clear()

    def _peer_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        group, uid = peer_group(pod), pod_uid(pod)
        if group is None or not uid:
            return
        with self._lock:
            members = self._groups.setdefault(group, {})
            if kind == "DELETED":
                members.pop(uid, None)
                if not members:
                    del self._groups[group]
                return
            members[uid] = _kept(pod)
        if condition(pod, DISRUPTION_TARGET) is not None and not self._was_handled("peers", uid):
            self._queue.put(("peers", pod))

    def _was_handled(self, what: str, uid: str) -> bool:
        with self._lock:
            return (what, uid) in self._handled

    def _handle(self, what: str, uid: str) -> None:
        with self._lock:
            self._handled[(what, uid)] = None
            while len(self._handled) > 5 * MOST:
                self._handled.popitem(last=False)

    # --- max-disruptions ----------------------------------------------------------------
    def count(self, pod: Mapping[str, Any]) -> None:
        """Count one disrupted pod against its workload's budget; past it, mark the pod."""
        uid = pod_uid(pod)
        if self._was_handled("budget", uid):
            return
        budget = label_value(pod, MAX_DISRUPTIONS_LABEL, parse_count)
        regarding = workload_of(pod)
        state = self._state(regarding) if budget is not None and regarding is not None else None
        if budget is None or state is None:
            self._handle("budget", uid)  # nothing to count against (or gone)
            return
        seen = state.record.disrupted(uid)
        if seen == "over" and condition(pod, DISRUPTION_BUDGET_EXHAUSTED) is None:
            self._mark(pod, DISRUPTION_BUDGET_EXHAUSTED, "MaxDisruptionsExceeded", "")
        if seen is not None:
            self._handle("budget", uid)
            return
        scope = disruption_scope(pod)
        number = state.record.disruptions_of(scope) + 1
        over = number > budget
        where = f" of index {scope}" if scope is not None else ""
        cause = str(mapping(condition(pod, DISRUPTION_TARGET)).get("reason") or "disruption")
        if over:
            self._mark(
                pod,
                DISRUPTION_BUDGET_EXHAUSTED,
                "MaxDisruptionsExceeded",
                f"disruption {number}{where}, over max-disruptions {budget}: counted against "
                "the retry budget",
            )
        state.record = state.record.add_disruption(pod, over)
        state.pending.append((pod, over))
        self._handle("budget", uid)
        self.counters["counted"] += 1
        self.counters["over"] += int(over)
        self.metrics.disruption("over" if over else "free")
        if over:
            note = (
                f"pod {pod_name(pod)} disrupted ({cause}): disruption {number}{where}, over "
                f"max-disruptions {budget}: it counts against the retry budget"
            )
        else:
            note = (
                f"pod {pod_name(pod)} disrupted ({cause}): disruption {number} of {budget} "
                f"free{where} (max-disruptions): not counted against the retry budget"
            )
        kind = "Warning" if over else "Normal"
        self.events.emit(Event(state.regarding, kind, REASON, note, action="Count"))

    def _state(self, regarding: Regarding) -> _Budget | None:
        """The workload's budget state: cached, else read (``None``: it is gone)."""
        known = self._budgets.get(_key(regarding))
        if known is not None:
            self._budgets.move_to_end(_key(regarding))
            return known
        kind = "jobset" if regarding.kind == "JobSet" else "job"
        obj = self.workloads.read(kind, regarding.namespace, regarding.name)
        meta = mapping((obj or {}).get("metadata"))
        if obj is None or meta.get("uid") != regarding.uid:
            return None
        state = _Budget(
            kind, regarding, str(meta.get("resourceVersion") or ""), Record.of(obj) or Record()
        )
        self._budgets[_key(regarding)] = state
        while len(self._budgets) > MOST:
            oldest = next(iter(self._budgets))
            if self._budgets[oldest].pending:
                break
            del self._budgets[oldest]
        return state

    def flush(self) -> None:
        """Write the disruptions counted since the last write, each workload's at once; a
        write that failed waits for its back-off, one refused is given up
        (``webhook.controller.writes``)."""
        for state in [s for s in list(self._budgets.values()) if s.pending]:
            key = _key(state.regarding)
            if not self.writes.ready(key):
                continue
            try:
                written = self._write(state)
            except Exception as err:
                if not self.writes.failed(key, err, state.regarding, _unwritten(state)):
                    self._budgets.pop(key, None)  # given up, or gone: read afresh next time
                continue
            if written:
                self.writes.landed(key)
            else:
                self.writes.forget(key)

    def _write(self, state: _Budget) -> bool:
        """Write the record with the pending disruptions; on a conflict, read the workload
        again and apply them to its record (``rewrite``). ``False``: the workload is gone."""
        ref = state.regarding

        def write() -> dict[str, Any]:
            return self.workloads.write_record(
                state.kind, ref.namespace, ref.name, state.record.text(), state.version
            )

        def reread() -> bool:
            obj = self.workloads.read(state.kind, ref.namespace, ref.name)
            meta = mapping((obj or {}).get("metadata"))
            if obj is None or meta.get("uid") != ref.uid:
                return False
            record = Record.of(obj) or Record()
            for pod, over in state.pending:
                record = record.add_disruption(pod, over)
            state.record, state.version = record, str(meta.get("resourceVersion") or "")
            return True

        written = rewrite(write, reread, self._conflict)
        if written is None:
            self._budgets.pop(_key(ref), None)
            return False
        self.counters["writes"] += 1
        state.version = str(mapping(written.get("metadata")).get("resourceVersion") or "")
        state.pending.clear()
        return True

    def _conflict(self) -> None:
        self.counters["conflicts"] += 1
        self.writes.conflict()

    # --- peer-disruptions ---------------------------------------------------------------
    def mark_peers(self, pod: Mapping[str, Any], pool: ThreadPoolExecutor | None = None) -> None:
        """Mark the peers of a disrupted pod that its loss may fail, several at once."""
        uid = pod_uid(pod)
        if self._was_handled("peers", uid):
            return
        self._handle("peers", uid)
        group = peer_group(pod)
        with self._lock:
            members = list(self._groups.get(group or (), {}).values())
        peers = [p for p in members if pod_uid(p) != uid and _unmarked_peer(p)]
        how = label(pod, PEERS_LABEL)
        cause = str(mapping(condition(pod, DISRUPTION_TARGET)).get("reason") or "disruption")
        message = f"peer pod {pod_name(pod)} was disrupted ({cause}); peer-disruptions {how}"
        if pool is None:
            results = [self._mark(p, PEER_DISRUPTED, "PeerPodDisrupted", message) for p in peers]
        else:
            futures = [
                pool.submit(self._mark, p, PEER_DISRUPTED, "PeerPodDisrupted", message)
                for p in peers
            ]
            results = [f.result() for f in futures]
        marked = sum(1 for r in results if r in ("added", "late"))
        self.counters["peers"] += marked
        regarding = workload_of(pod)
        if regarding is not None and peers:
            verb = "ignored" if how == "ignore" else "counted once each"
            note = (
                f"pod {pod_name(pod)} disrupted ({cause}): {marked} of its peers marked "
                f"{PEER_DISRUPTED}; their failures are {verb} (peer-disruptions {how})"
            )
            self.events.emit(Event(regarding, "Normal", REASON, note, action="Mark"))

    # --- one condition ----------------------------------------------------------------------
    def _mark(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> str:
        """Add a condition to ``pod``: "added", "late" (the pod had failed: the Job
        controller may judge it without), "missed" (judged already: not written), or "gone"."""
        if judged(pod):
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

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


def _key(regarding: Regarding) -> tuple[str, str]:
    return (regarding.namespace, regarding.uid)


def _unwritten(state: _Budget) -> str:
    """What a record write that failed would have written, for the log and the Event."""
    ref = state.regarding
    pods = ", ".join(pod_name(pod) for pod, _ in state.pending[:5])
    more = f" and {len(state.pending) - 5} more" if len(state.pending) > 5 else ""
    return (
        f"the disruption count on {ref.kind} {ref.namespace}/{ref.name} "
        f"({len(state.pending)} disruptions: pods {pods}{more})"
    )


def disruption_scope(pod: Mapping[str, Any]) -> str | None:
    """The lineage a disruption counts against: the index, for an Indexed Job's pod with a
    budget per index (only then does it carry ``job-index-failure-count``); ``None``: the
    whole workload (a Job, a JobSet)."""
    meta = mapping(pod.get("metadata"))
    annotations = mapping(meta.get("annotations"))
    labels = mapping(meta.get("labels"))
    if labels.get("jobset.sigs.k8s.io/jobset-uid"):
        return None
    if INDEX_FAILURE_COUNT in annotations and COMPLETION_INDEX in annotations:
        return lineage_key(meta)
    return None


def peer_group(pod: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The pods a pod runs with: its JobSet's run, else its Job, in its namespace (a pod
    elsewhere that carries the same UID labels is no peer: a JobSet's and a Job's pods
    are all in its namespace)."""
    meta = mapping(pod.get("metadata"))
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        return None
    labels = mapping(meta.get("labels"))
    jobset = labels.get("jobset.sigs.k8s.io/jobset-uid")
    if isinstance(jobset, str) and jobset:
        return ("jobset", namespace, jobset, str(labels.get(RESTART_ATTEMPT) or "0"))
    owner = controller_of(meta)
    job = labels.get(JOB_UID_LABEL) or (owner or {}).get("uid")
    return ("job", namespace, str(job)) if job else None


def _unmarked_peer(pod: Mapping[str, Any]) -> bool:
    """A peer to mark: not disrupted itself (its own rule decides it), not marked yet,
    and not judged by the Job controller already."""
    return (
        condition(pod, DISRUPTION_TARGET) is None
        and condition(pod, PEER_DISRUPTED) is None
        and not judged(pod)
        and mapping(pod.get("status")).get("phase") != "Succeeded"
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
