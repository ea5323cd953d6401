"""The leader counts disruptions against ``max-disruptions`` and marks a disrupted pod's
peers for ``peer-disruptions`` (``webhook.plan.causes``: the rules these conditions
meet).

It watches the pods labelled for either (``retry-policy.dev/max-disruptions``,
``retry-policy.dev/peer-disruptions``: the webhook labels their templates) and acts when
one gets ``DisruptionTarget=True``, which the scheduler's preemption, the Eviction API,
the taint manager, PodGC and the kubelet add (and the webhook itself when a disruptor
deletes a pod: ``webhook.cluster.deletions``):

- **max-disruptions N**: the disruption is the workload's next; the first N are free
  (the Ignore rule on DisruptionTarget takes them), and from N + 1 on each counts once
  against the retry budget. The count is per JobSet for a JobSet's pods, per index for an
  Indexed Job with ``backoffLimitPerIndex`` (its pods carry ``job-index-failure-count``),
  else per Job, and is kept on the workload (``webhook.cluster.record``: why there),
  decided here from the count as last written plus those not written yet; the count
  follows within ``window`` seconds. How a disruption over the budget counts:

  - a pod not yet ``Failed`` gets ``retry-policy.dev/DisruptionBudgetExhausted`` (Count,
    before that Ignore rule), written only with the ``resourceVersion`` of a version seen
    not ``Failed``: it then is on every ``Failed`` version of the pod (the kubelet keeps
    conditions it does not own: ``mergePodStatus`` in pkg/kubelet/status), which is all the
    Job controller judges (``isPodFailed``: only ``Failed`` pods, with a podFailurePolicy);
  - a pod that is ``Failed`` first (the kubelet's node-pressure eviction and node shutdown,
    and PodGC, add ``DisruptionTarget`` in the update that fails the pod; or the write
    lost the race) gets no condition, which the Job controller might or might not read:
    the Job's ``spec.backoffLimit`` is lowered by one instead (``exceedsBackoffLimit`` is
    ``failed > backoffLimit``: the same as one more counted failure), in the patch that
    writes the record with the pod marked ``late``, so it happens once. Unless the Job's
    rules count that pod already, or nothing can be lowered: a JobSet's pod, a Job with
    ``backoffLimitPerIndex`` (immutable, as ``podFailurePolicy``: ``ValidateJobSpecUpdate``
    in pkg/apis/batch/validation), or a ``backoffLimit`` of 0; those are counted in
    ``retry_webhook_controller_disruptions_uncovered_total{reason}`` and said in an Event.

  The conditions are written by ``workers`` threads at once: a node that goes takes many
  pods with it.
- **peer-disruptions**: every other pod of the same Job (for a JobSet's pods, of the same
  JobSet run: ``jobset-uid`` and ``restart-attempt``) that is still running, or failed but
  not yet judged, gets ``retry-policy.dev/PeerDisrupted``, several at once (``workers``).
  A peer mark is best effort: one that lands on a ``Failed`` pod is counted ``late`` (the
  Job controller may judge it without), one the Job controller had already judged (its
  tracking finalizer gone, or listed in the Job's ``uncountedTerminatedPods``) ``missed``
  and not written (``retry_webhook_controller_conditions_total``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from webhook.cluster.conditions import (
    TERMINAL,
    add_condition,
    condition,
    label,
    label_value,
    pod_name,
    pod_uid,
    read_pod,
    status_patch,
    terminal,
)
from webhook.cluster.events import Event, Regarding
from webhook.cluster.informer import Informer, short_error
from webhook.cluster.record import Record
from webhook.controller.budgetstate import (
    UNCOVERED,
    BudgetState,
    Late,
    Metrics,
    budget_key,
    unwritten,
)
from webhook.controller.kindservices import PeerWriters
from webhook.controller.peers import REASON, Peers, disrupted, marked_to_count, peer_group
from webhook.controller.ratelimit import Moot, unless
from webhook.controller.recorder import History, HistoryRecorder, along
from webhook.controller.records import Workloads, WorkloadStates, workload_of
from webhook.controller.writes import (
    CONFLICT,
    FENCED,
    GONE,
    REFUSED,
    Writes,
    outcome,
    rewrite,
)
from webhook.kube.failurepolicy import (
    DISRUPTION_BUDGET_EXHAUSTED,
    DISRUPTION_TARGET,
    PEER_DISRUPTED,
    PodFailure,
    counts,
    evaluate,
)
from webhook.kube.objects import mapping
from webhook.plan.causes import (
    IGNORE_LABEL,
    MAX_DISRUPTIONS_LABEL,
    PEERS_LABEL,
    disruption,
    disruption_scope,
)
from webhook.policy.grammar import parse_count

log = logging.getLogger(__name__)

#: Failed writes of one over-budget condition other than conflicts before the pod's next
#: update is left to try again.
TRANSIENT_TRIES = 5
#: Pods and workloads remembered at most (the oldest go first).
MOST = 10_000
#: How long a pod that was gone before it could be marked waits for its last version (the
#: watch's DELETED event) to say how it ended, before it is taken to have failed.
GONE_PATIENCE = 30.0
#: Disrupted pods not yet counted whose latest version the watch brought is kept (the
#: oldest go first), for the condition's first write (``_newest``).
LATEST = 2_000


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
        peer_mark_limit: int = 1000,
        history: HistoryRecorder | None = None,
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
        self._budgets: WorkloadStates[BudgetState] = WorkloadStates(
            self.workloads, BudgetState.read, lambda s: bool(s.pending or s.late), MOST
        )
        #: The workers that write conditions (while ``run`` runs; else, inline).
        self._pool: ThreadPoolExecutor | None = None
        #: Pod UID -> the phase a labelled pod ended in (its last version, or the watch's
        #: DELETED event), for a pod gone before it could be marked.
        self._ended: OrderedDict[str, str] = OrderedDict()
        #: Pods gone before they were marked, waiting for how they ended: (since, pod).
        self._gone_waiting: list[tuple[float, Mapping[str, Any]]] = []
        #: Pod UID -> the latest version the watch brought of a disrupted pod not counted
        #: yet, or counted over the budget and not marked yet (``_newest``).
        self._latest: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
        #: Pod UID -> the ended (``Failed``, ``Succeeded``) version of a disrupted pod, or
        #: ``None`` for one the watch saw deleted first: a mark waiting for its token is
        #: not sent for it (``ratelimit.unless``).
        self._final: OrderedDict[str, Mapping[str, Any] | None] = OrderedDict()
        self.counters = {
            "counted": 0,
            "over": 0,
            "peers": 0,
            "jobset_peers": 0,
            "writes": 0,
            "conflicts": 0,
            "lowered": 0,
            "uncovered": 0,
        }
        #: The record writes' and the pod conditions' failures (``webhook.controller.writes``).
        self.writes = Writes("disruptions", events, self.metrics)
        self.conditions = Writes("conditions", events, self.metrics)
        #: peer-disruptions: the peer-disruptions watch's store, and the marks.
        self.peers = Peers(
            self.core, self.workloads, events, self.metrics, self.conditions, clock, peer_mark_limit
        )
        #: peer-disruptions on a JobSet: one Job condition instead of the marks.
        self.peer_writers = PeerWriters(api_client, self.workloads, events, self.conditions, clock)
        #: The failure history of the workloads whose records this reconciler patches:
        #: their failed pods go in its patches (``HistoryRecorder.take``), one patch where
        #: two writers would each make one, and the second be refused (409) as often as not.
        self.history = history
        self._running = False
        #: The workloads (namespace, UID) of disrupted pods queued to count, whose budget
        #: state may not be read yet: their history waits for the count's patch too, not
        #: to be written first and make that patch's resourceVersion stale (a 409).
        self._coming: OrderedDict[tuple[str, str], None] = OrderedDict()
        if history is not None:
            history.takers.append(self._takes)

    def _takes(self, namespace: str, uid: str) -> bool:
        """Whether this reconciler patches the workload's record (it keeps its budget
        state, or is about to read it) and takes the history's pending pods along: while
        its loop runs."""
        key = (namespace, uid)
        with self._lock:
            coming = key in self._coming
        return self._running and (coming or key in self._budgets)

    def _counting(self, pod: Mapping[str, Any], queued: bool) -> None:
        """Note the pod's workload as ``_coming`` while the pod is queued to count."""
        regarding = workload_of(pod)
        if regarding is None:
            return
        key = budget_key(regarding)
        with self._lock:
            if queued:
                self._coming[key] = None
                while len(self._coming) > LATEST:
                    self._coming.popitem(last=False)
            else:
                self._coming.pop(key, None)

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
        self.watches = watches
        for informer in watches:
            threading.Thread(target=informer.run, name=informer.name, daemon=True).start()
        pool = self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="marks")
        self._running = True
        try:
            flushed = time.monotonic()
            while not stop.is_set():
                try:
                    self._take(*self._queue.get(timeout=0.05), pool)
                except queue.Empty:
                    pass
                if time.monotonic() - flushed >= self.window:
                    # What came while the last flush wrote is counted first, so that it
                    # goes in this one: a workload's disruptions in one write, however
                    # long the writes take (a node lost, the API slow, the limiter).
                    for _ in range(self._queue.qsize()):
                        self._take(*self._queue.get_nowait(), pool)
                    self._settle_waiting()
                    self.flush()
                    flushed = time.monotonic()
            pool.shutdown(wait=True)
            self._pool = None
            while not self._queue.empty():  # what the workers found late meanwhile
                what, pod = self._queue.get()
                if what == "late":
                    self._guarded(self.settle_late, pod)
                elif what == "gone":
                    self._gone_waiting.append((self.clock(), pod))
            self._settle_waiting()
            self._running = False  # what the history still holds, it writes itself
            self.flush()
        finally:
            self._running = False
            self._pool = None
            pool.shutdown(wait=True)

    def _take(self, what: str, pod: Mapping[str, Any], pool: ThreadPoolExecutor) -> None:
        """Act on one queued pod."""
        if what == "budget":
            self._guarded(self.count, pod)
            self._counting(pod, False)  # (its state kept now, if it has a budget)
        elif what == "late":
            self._guarded(self.settle_late, pod)
        elif what == "gone":
            self._gone_waiting.append((self.clock(), pod))
        elif what == "peers":
            self._guarded(self.mark_peers, pod, pool)
        elif what == "unmark":
            self._guarded(self.unmark, pod)

    def _guarded(self, act: Callable[..., None], *args: Any) -> None:
        try:
            act(*args)
        except Exception as err:  # the loop must outlive any one pod
            log.warning("pod %s not handled: %s", pod_name(args[0]), short_error(err))

    def _budget_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        phase = _phase(pod)
        if phase in ("Succeeded", "Failed"):
            with self._lock:
                self._ended[pod_uid(pod)] = phase
                while len(self._ended) > MOST:
                    self._ended.popitem(last=False)
        if condition(pod, DISRUPTION_TARGET) is not None and (
            kind == "DELETED" or phase in ("Succeeded", "Failed")
        ):
            with self._lock:
                self._final.setdefault(pod_uid(pod), pod if phase in TERMINAL else None)
                while len(self._final) > LATEST:
                    self._final.popitem(last=False)
        if kind != "DELETED" and condition(pod, DISRUPTION_TARGET) is not None:
            with self._lock:
                if pod_uid(pod) in self._latest or ("budget", pod_uid(pod)) not in self._handled:
                    self._latest[pod_uid(pod)] = pod
                    self._latest.move_to_end(pod_uid(pod))
                    while len(self._latest) > LATEST:
                        self._latest.popitem(last=False)
            if not self._was_handled("budget", pod_uid(pod)):
                self._counting(pod, True)
                self._queue.put(("budget", pod))
        elif kind == "DELETED":
            with self._lock:
                self._latest.pop(pod_uid(pod), None)

    def _reset_peers(self) -> None:
        self.peers.reset()

    def _peer_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        if not self.peers.seen(kind, pod) or not disrupted(pod):
            return  # (a DisruptionTarget on a pod that runs on: no disruption happened)
        uid = pod_uid(pod)
        if not self._was_handled("peers", uid):
            self._queue.put(("peers", pod))
        if marked_to_count(pod) and not self._was_handled("unmark", uid):
            self._queue.put(("unmark", pod))

    def unmark(self, pod: Mapping[str, Any]) -> str:
        """A counted peer disrupted itself: its own disruption decides it
        (``Peers.unmark``), once."""
        uid = pod_uid(pod)
        if self._was_handled("unmark", uid):
            return "unmarked"
        result = self.peers.unmark(pod)
        if result != "error":
            self._handle("unmark", uid)
        return result

    def mark_peers(self, pod: Mapping[str, Any], pool: ThreadPoolExecutor | None = None) -> None:
        """Mark the peers of a disrupted pod (``webhook.controller.peers``), once."""
        uid = pod_uid(pod)
        if self._was_handled("peers", uid):
            return
        self._handle("peers", uid)
        group = peer_group(pod)
        if group is not None and group[0] == "jobset":
            how = label(pod, PEERS_LABEL)
            if how == "count" or not self._own_counted(pod):
                cause = mapping(condition(pod, DISRUPTION_TARGET)).get("reason") or "disruption"
                result = self.peer_writers.fail_job(pod, str(cause))
                if result is not None:
                    self.counters["jobset_peers"] += int(result == "written")
                    return
        self.counters["peers"] += self.peers.mark(pod, pool)

    def _own_counted(self, pod: Mapping[str, Any]) -> bool:
        """Whether the disrupted pod's own rules count its disruption (no
        ignore-disruptions, or over max-disruptions: decided first, once). Under
        ``peer-disruptions: ignore`` an uncounted restart of the set would then drop that
        count: its own failure decides, and its peers are marked one by one."""
        if label(pod, IGNORE_LABEL) != "true":
            return True
        if condition(pod, DISRUPTION_BUDGET_EXHAUSTED) is not None:
            return True
        if label(pod, MAX_DISRUPTIONS_LABEL) is None:
            return False
        self.count(pod)
        regarding = workload_of(pod)
        state = self._state(regarding) if regarding is not None else None
        return state is not None and state.record.disrupted(pod_uid(pod)) == "over"

    def _was_handled(self, what: str, uid: str) -> bool:
        with self._lock:
            return (what, uid) in self._handled

    def _handle(self, what: str, uid: str) -> None:
        with self._lock:
            self._handled[(what, uid)] = None
            while len(self._handled) > 5 * MOST:
                self._handled.popitem(last=False)

    def _unhandle(self, what: str, uid: str) -> None:
        with self._lock:
            self._handled.pop((what, uid), None)

    # --- max-disruptions ----------------------------------------------------------------
    def count(self, pod: Mapping[str, Any]) -> None:
        """Count one disrupted pod against its workload's budget; past it, count the pod
        against the retry budget (``_over``)."""
        uid = pod_uid(pod)
        if self._was_handled("budget", uid):
            return
        budget = label_value(pod, MAX_DISRUPTIONS_LABEL, parse_count)
        regarding = workload_of(pod)
        state = self._state(regarding) if budget is not None and regarding is not None else None
        if budget is None or state is None:
            self._handle("budget", uid)  # nothing to count against (or gone)
            self._newest(pod)
            return
        seen = state.record.disrupted(uid)
        if seen is not None or _phase(pod) == "Succeeded":  # (a success is no failure)
            self._handle("budget", uid)
            if seen != "over" or self._settled(state, uid):
                self._newest(pod)
            else:
                # Counted over before a restart, its condition or lowering lost: again.
                self._settle(
                    pod, f"over max-disruptions {budget}: counted against the retry budget"
                )
            return
        if marked_to_count(pod) and self.unmark(pod) == "late":
            # Its peer's mark decided it (Count): a peer's failure, not a disruption of the
            # budget's. The record says nothing of it; the Event says why.
            self._handle("budget", uid)
            self._newest(pod)
            note = (
                f"pod {pod_name(pod)} disrupted after it was marked {PEER_DISRUPTED} "
                "(peer-disruptions count), and failed before the mark could be taken back: "
                "it counts as a peer's failure, not against max-disruptions"
            )
            self.events.emit(Event(state.regarding, "Warning", REASON, note, action="Count"))
            return
        scope = disruption_scope(pod)
        number = state.record.disruptions_of(scope) + 1
        over = disruption(number, budget) == "counted"
        where = f" of index {scope}" if scope is not None else ""
        cause = str(mapping(condition(pod, DISRUPTION_TARGET)).get("reason") or "disruption")
        state.record = state.record.add_disruption(pod, over)
        state.pending.append((pod, over))
        self._handle("budget", uid)
        if over:
            self._settle(
                pod,
                f"disruption {number}{where}, over max-disruptions {budget}: counted against "
                "the retry budget",
            )
        else:
            self._newest(pod)  # (no condition to write)
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

    def _settled(self, state: BudgetState, uid: str) -> bool:
        return state.record.settled(uid) or any(late.uid == uid for late in state.late)

    def _settle(self, pod: Mapping[str, Any], message: str) -> None:
        """Count a pod over the budget: by ``_over``, on a worker while ``run`` runs."""
        if condition(pod, DISRUPTION_BUDGET_EXHAUSTED) is not None:
            self._newest(pod)
            return  # (marked before a restart of the controller)
        with self._lock:
            latest = self._latest.get(pod_uid(pod), pod)
        if terminal(latest):
            # Failed first (PodGC, the kubelet): no condition can land. Settled here, so
            # that it goes in the same write as its count.
            self._newest(pod)
            self.settle_late(latest)
            return
        pool = self._pool
        if pool is None:
            self._over(pod, message)
        else:
            pool.submit(self._guarded, self._over, pod, message)

    def _over(self, pod: Mapping[str, Any], message: str) -> str:
        """Add ``DisruptionBudgetExhausted`` with the resourceVersion of a version seen not
        ``Failed``; a pod ``Failed`` first is handed to ``settle_late`` (through the queue:
        the workloads' state is the loop's). "added", "late", "gone", or "error"."""
        pod = self._newest(pod)
        errors = 0
        while errors < TRANSIENT_TRIES:  # a conflict (the pod changed) never ends the loop
            if condition(pod, DISRUPTION_BUDGET_EXHAUSTED) is not None:
                return "added"  # (an earlier write of ours whose answer was lost)
            if terminal(pod):
                self._late(pod)
                return "late"
            version = str(mapping(pod.get("metadata")).get("resourceVersion") or "")
            body = status_patch(
                DISRUPTION_BUDGET_EXHAUSTED, "MaxDisruptionsExceeded", message, self.clock()
            )
            uid = pod_uid(pod)
            try:
                if not version:
                    raise LookupError("no resourceVersion")  # (never sent without one)
                if self._ended_since(uid):
                    raise Moot(uid)
                with unless(lambda uid=uid: self._ended_since(uid)):
                    add_condition(self.core, pod, body, version)
            except Moot:
                return self._ended_unmarked(pod)
            except Exception as err:
                kind = outcome(err)
                if kind == GONE:
                    return self._gone(pod)
                if kind == CONFLICT:
                    with self._lock:
                        self.counters["conflicts"] += 1
                    self.conditions.conflict()
                elif kind in (REFUSED, FENCED):
                    what = f"condition {DISRUPTION_BUDGET_EXHAUSTED} on pod {pod_name(pod)}"
                    self.conditions.failed(pod_uid(pod), err, workload_of(pod), what)
                    return "error"
                else:
                    errors += 1
                    log.warning("%s not added to pod %s: %s", body, pod_name(pod), short_error(err))
                found = read_pod(self.core, pod)
                if found is None:
                    return self._gone(pod)
                pod = found
                continue
            self.metrics.condition(DISRUPTION_BUDGET_EXHAUSTED, "added")
            return "added"
        self._unhandle("budget", pod_uid(pod))  # its next update tries again
        return "error"

    def _ended_unmarked(self, pod: Mapping[str, Any]) -> str:
        """The pod ended, or went, before its mark could be sent: settled as the write's
        409 and the read after it (``late``), or its 404 (``gone``), would have settled it,
        without either request."""
        with self._lock:
            final = self._final.get(pod_uid(pod))
        if final is None:
            return self._gone(pod)
        if condition(final, DISRUPTION_BUDGET_EXHAUSTED) is not None:
            return "added"  # (an earlier write of ours whose answer was lost)
        self._late(final)
        return "late"

    def _ended_since(self, uid: str) -> bool:
        """Whether the watch has brought the pod's end (or deletion) since its mark was
        computed."""
        with self._lock:
            return uid in self._final

    def _newest(self, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        """The latest version of ``pod`` the watch brought, for the condition's first
        write: the version the count was queued with is usually behind by the pod's
        deletion (preemption and eviction add ``DisruptionTarget``, then delete), and a
        write with it is refused (409) and costs a read and a second write, a thousand of
        each when a group of a thousand pods is preempted, under the critical limiter."""
        with self._lock:
            return self._latest.pop(pod_uid(pod), None) or pod

    def _late(self, pod: Mapping[str, Any]) -> None:
        if self._pool is None:
            self.settle_late(pod)
        else:
            self._queue.put(("late", pod))

    def _gone(self, pod: Mapping[str, Any]) -> str:
        """A pod gone before it was marked: the Job controller judged it (its finalizer
        removed) without the condition. How it ended decides: one that ``Succeeded`` (an
        application that exits 0 on SIGTERM: ``getPhase``) was a completion to the Job
        controller (``isPodFailed`` is false), no failure to count; one that failed counts
        unmarked (``settle_late``). Its last version says which; until the watch brought
        it, the pod waits (``settle_gone``)."""
        if self._pool is not None:
            self._queue.put(("gone", pod))
        elif not self.settle_gone(pod, self.clock()):
            self._gone_waiting.append((self.clock(), pod))
        return "gone"

    def settle_gone(self, pod: Mapping[str, Any], since: float | None = None) -> bool:
        """Settle a gone pod by how it ended; ``False`` while that is not known yet (and
        ``GONE_PATIENCE`` has not passed: then it is taken to have failed, as a pod
        deleted while it ran is failed to the Job controller)."""
        with self._lock:
            ended = self._ended.get(pod_uid(pod))
        waited = self.clock() - (since if since is not None else self.clock())
        if ended is None and waited < GONE_PATIENCE:
            return False
        status = {**mapping(pod.get("status")), "phase": ended or "Failed"}
        self.settle_late({**pod, "status": status})
        return True

    def _settle_waiting(self) -> None:
        waiting, self._gone_waiting = self._gone_waiting, []
        for since, pod in waiting:
            try:
                if not self.settle_gone(pod, since):
                    self._gone_waiting.append((since, pod))
            except Exception as err:  # the loop must outlive any one pod
                log.warning("pod %s not handled: %s", pod_name(pod), short_error(err))

    def settle_late(self, pod: Mapping[str, Any]) -> None:
        """A pod over the budget that is ``Failed`` without its condition (it can never
        get it now: every write carried the resourceVersion of a version not ``Failed``):
        count it once more another way (``Late``), in the record's next write."""
        uid, regarding = pod_uid(pod), workload_of(pod)
        state = self._state(regarding) if regarding is not None else None
        if state is None or self._settled(state, uid):
            return
        if _phase(pod) == "Succeeded":
            how = "succeeded"
        elif state.kind != "job":
            how = "jobset"
        elif counts(evaluate(state.rules, PodFailure.from_pod(pod))):
            how = "counted"  # (its rules count it already: a second count would be wrong)
        elif state.per_index:
            how = "per_index"
        elif state.copy:
            how = "multikueue"
        else:
            how = "lower"
        state.late.append(Late(uid, pod_name(pod), how))

    def _state(self, regarding: Regarding) -> BudgetState | None:
        """The workload's budget state: kept, else read (``None``: it is gone)."""
        return self._budgets.of(regarding)

    def flush(self) -> None:
        """Write the disruptions counted since the last write, each workload's at once; a
        write that failed waits for its back-off, one refused is given up
        (``webhook.controller.writes``); and with them the history's pods pending for
        the same workloads, or for those only (``HistoryRecorder.take``)."""
        riding = self.history.waiting() if self.history is not None else set()
        for state in list(self._budgets.values()):
            key = budget_key(state.regarding)
            if not (state.pending or state.late or key in riding):
                continue
            if not self.writes.ready(key):
                continue
            try:
                written = self._write(state)
            except Exception as err:
                if not self.writes.failed(key, err, state.regarding, unwritten(state)):
                    self._budgets.pop(key, None)  # given up, or gone: read afresh next time
                continue
            if written:
                self.writes.landed(key)
            else:
                self.writes.forget(key)

    def _write(self, state: BudgetState) -> bool:
        """Write the record with the pending disruptions and the late pods (the Job's
        backoffLimit lowered in the same patch), and the history's pods pending for the
        workload; on a conflict, read the workload again and apply them to its record and
        limit as they are now (``rewrite``). ``False``: nothing written (the workload
        is gone, or the history's pods were all it had, recorded already). The history's
        pods go back to it unless the patch lands."""
        with along(self.history, state.regarding.namespace, state.regarding.uid) as history:
            return self._write_with(state, history)

    def _write_with(self, state: BudgetState, history: History | None) -> bool:
        ref = state.regarding
        said: list[tuple[Late, str]] = []
        record = state.record

        def write() -> dict[str, Any]:
            nonlocal record, said
            record, limit, said = self._with_late(state)
            if history is not None:
                record = history.apply(record)
                if not (state.pending or state.late or history.marked):
                    history.done = True  # (its pods, all recorded already)
                    return {}
            return self.workloads.write_record(
                state.kind, ref.namespace, ref.name, record.text(), state.version, limit
            )

        def reread() -> bool:
            obj = self.workloads.current(state.kind, ref.namespace, ref.name, ref.uid)
            if obj is None:
                return False
            meta = mapping(obj.get("metadata"))
            fresh = Record.of(obj) or Record()
            for pod, over in state.pending:
                fresh = fresh.add_disruption(pod, over)
            state.record, state.version = fresh, str(meta.get("resourceVersion") or "")
            if state.kind == "job":
                state.facts(obj)  # the backoffLimit to lower from, as it is now
            return True

        written = rewrite(write, reread, self._conflict)
        if written is None:
            self._budgets.pop(budget_key(ref), None)
            return False  # (the history, given its pods back, finds the workload gone)
        if not written:
            return False
        self.counters["writes"] += 1
        state.version = str(mapping(written.get("metadata")).get("resourceVersion") or "")
        state.pending.clear()
        if state.kind == "job":
            state.facts(written)
        self._wrote_late(state, record, said)
        if history is not None:
            history.landed(written)
        return True

    def _conflict(self) -> None:
        self.counters["conflicts"] += 1
        self.writes.conflict()

    # --- pods over the budget that failed unmarked (``settle_late``) ------------------------
    def _with_late(self, state: BudgetState) -> tuple[Record, int | None, list[tuple[Late, str]]]:
        """The record to write with the late pods marked, the Job's backoffLimit one lower
        for each that lowers it (``None``: not written), and how each counts, from the
        record and limit as last read (a pod the record marks already was written: an
        answer lost). Each lowering and its mark go in one patch: exactly once."""
        record, limit, lowered, said = state.record, state.limit, 0, []
        for late in state.late:
            if record.settled(late.uid):
                continue
            how = late.how
            if how == "lower" and (limit is None or limit - lowered <= 0):
                how = "backoff_limit_zero"
            record = record.add_late(late.uid, how == "lower")
            lowered += int(how == "lower")
            said.append((late, how if how != "lower" else f"lower:{limit - lowered}"))
        return record, (limit - lowered if lowered and limit is not None else None), said

    def _wrote_late(self, state: BudgetState, record: Record, said: list[tuple[Late, str]]) -> None:
        """After the write: the record as written, and each late pod said."""
        state.record = record
        state.late.clear()
        ref = state.regarding
        for late, how in said:
            head = f"pod {late.name} had failed before it could be marked over max-disruptions"
            if how.startswith("lower:"):
                self.counters["lowered"] += 1
                self.metrics.lowered()
                note = (
                    f"{head}: counted by lowering the Job's backoffLimit by one, to "
                    f"{how.partition(':')[2]}"
                )
                self.events.emit(Event(ref, "Normal", REASON, note, action="LowerBackoffLimit"))
            elif how in UNCOVERED:
                self.counters["uncovered"] += 1
                self.metrics.uncovered(how)
                note = f"{head}, and {UNCOVERED[how]}: this disruption is not counted"
                log.warning("%s %s/%s: %s", ref.kind, ref.namespace, ref.name, note)
                self.events.emit(Event(ref, "Warning", REASON, note, action="Count"))

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


def _phase(pod: Mapping[str, Any]) -> Any:
    return mapping(pod.get("status")).get("phase")
