"""``max-free-failures``: the first N free failures of a workload are free, later ones count
(``webhook.plan.verdicts``). Kept as ``max-disruptions`` keeps its count
(``webhook.controller.disruptions``), and for the same reasons: an ignored failure never
enters the Job's ``status.failed``, a JobSet's restart deletes its child Jobs, and the
controller that counted may be another replica's by the next failure.

The count lives in the workload's record (``webhook.cluster.record``: ``freeFailures`` by
lineage, and which pods were free and which over, ``freed`` and ``freeOver``). The
decision is made from the count as last read or written plus the failures counted since
(the leader is the only writer), so the pod's conditions go out at once (the category,
and past the budget ``retry-policy.dev/FreeBudgetExhausted`` in the same patch); the
count follows within ``window`` seconds, by a merge patch carrying the
``resourceVersion`` it was computed from (a 409 reads the workload again and applies the
pending failures to it). A pod the record marks is never counted twice: after a relist, a
restart, or on another replica, a pod marked over gets its condition again and one marked
free nothing.

The scope: a JobSet's pods count against the JobSet (across its runs), an Indexed Job's
with ``backoffLimitPerIndex`` against their index, every other pod against its Job
(``causes.disruption_scope``, as the disruptions).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.conditions import pod_name
from webhook.cluster.events import Regarding
from webhook.cluster.record import Record
from webhook.controller.recorder import History, HistoryRecorder, along
from webhook.controller.records import Workloads, WorkloadStates
from webhook.controller.writes import Writes, rewrite
from webhook.kube.objects import mapping
from webhook.plan.causes import disruption_scope

log = logging.getLogger(__name__)

#: Workloads remembered at most (the oldest without pending writes go first).
MOST = 10_000


@dataclass
class _State:
    kind: str  # "job" or "jobset"
    regarding: Regarding
    version: str
    record: Record
    #: Failures counted and not written yet: (pod, over, lineage).
    pending: list[tuple[Mapping[str, Any], bool, str | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    """What a free failure is: its number in its scope, whether it is over the budget,
    and whether the record counted it already (``again``: a restart, a relist)."""

    number: int
    over: bool
    again: bool = False
    where: str = ""


class FreeBudgets:
    """The free-failure counts of the workloads the leader has seen a free failure of."""

    def __init__(
        self, workloads: Workloads, writes: Writes, history: HistoryRecorder | None = None
    ) -> None:
        self.workloads = workloads
        self.writes = writes
        #: The failure history of the workloads whose counts this writes: their failed pods
        #: go in its patches (``HistoryRecorder.take``), one patch where there were two.
        self.history = history
        #: Whether its owner's loop flushes it (``Verdicts.run``): the history waits for it.
        self.running = False
        self._lock = threading.Lock()
        self._states: WorkloadStates[_State] = WorkloadStates(
            workloads,
            lambda kind, ref, version, record, _: _State(kind, ref, version, record),
            lambda s: bool(s.pending),
            MOST,
        )
        self.counters = {"free": 0, "over": 0, "writes": 0, "conflicts": 0}
        if history is not None:
            history.takers.append(self._takes)

    def _takes(self, namespace: str, uid: str) -> bool:
        """Whether this writes the workload's record and takes the history along."""
        with self._lock:
            return self.running and (namespace, uid) in self._states

    def decide(self, pod: Mapping[str, Any], regarding: Regarding, budget: int) -> Decision | None:
        """Count one free failure of ``pod`` (``None``: its workload is gone)."""
        with self._lock:
            state = self._state(regarding)
            if state is None:
                return None
            uid = str(mapping(pod.get("metadata")).get("uid") or "")
            scope = disruption_scope(pod)
            where = f" of index {scope}" if scope is not None else ""
            known = state.record.freed_as(uid)
            if known is not None:
                return Decision(0, known == "over", True, where)
            number = state.record.free_of(scope) + 1
            over = number > budget
            state.record = state.record.add_free(pod, over, scope)
            state.pending.append((pod, over, scope))
            self.counters["over" if over else "free"] += 1
            return Decision(number, over, False, where)

    def _state(self, regarding: Regarding) -> _State | None:
        return self._states.of(regarding)

    def flush(self) -> None:
        """Write each workload's pending count; a write that failed waits for its back-off,
        one refused is given up (``webhook.controller.writes``); and with them the
        history's pods pending for the same workloads, or for those only."""
        riding = self.history.waiting() if self.history is not None else set()
        with self._lock:
            states = [s for key, s in self._states.items() if s.pending or key in riding]
        for state in states:
            key = (state.regarding.namespace, state.regarding.uid)
            if not self.writes.ready(key):
                continue
            try:
                written = self._write(state)
            except Exception as err:
                if not self.writes.failed(key, err, state.regarding, _unwritten(state)):
                    with self._lock:
                        self._states.pop(key, None)
                continue
            if written:
                self.writes.landed(key)
            else:
                self.writes.forget(key)

    def _write(self, state: _State) -> bool:
        """Write the pending count, with the history's pods pending for the workload.
        ``False``: nothing written (gone, or only the history's pods, recorded already)."""
        with along(self.history, state.regarding.namespace, state.regarding.uid) as history:
            return self._write_with(state, history)

    def _write_with(self, state: _State, history: History | None) -> bool:
        ref = state.regarding
        with self._lock:
            pending = list(state.pending)
            record, version = state.record, state.version
        sent = record

        def write() -> dict[str, Any]:
            nonlocal sent
            sent = history.apply(record) if history is not None else record
            if history is not None and not (pending or history.marked):
                history.done = True  # (its pods, all recorded already)
                return {}
            return self.workloads.write_record(
                state.kind, ref.namespace, ref.name, sent.text(), version
            )

        def reread() -> bool:
            nonlocal record, version
            obj = self.workloads.current(state.kind, ref.namespace, ref.name, ref.uid)
            if obj is None:
                return False
            meta = mapping(obj.get("metadata"))
            fresh = Record.of(obj) or Record()
            for pod, over, scope in pending:
                fresh = fresh.add_free(pod, over, scope)
            record, version = fresh, str(meta.get("resourceVersion") or "")
            return True

        def conflict() -> None:
            self.counters["conflicts"] += 1
            self.writes.conflict()

        written = rewrite(write, reread, conflict)
        with self._lock:
            if written is None:
                self._states.pop((ref.namespace, ref.uid), None)
                return False
            if not written:
                return False
            self.counters["writes"] += 1
            done = {id(p) for p, *_ in pending}
            state.pending = [entry for entry in state.pending if id(entry[0]) not in done]
            record = sent
            for pod, over, scope in state.pending:  # counted while this write went out
                record = record.add_free(pod, over, scope)
            state.record = record
            state.version = str(mapping(written.get("metadata")).get("resourceVersion") or "")
        if history is not None:
            history.landed(written)
        return True

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


def _unwritten(state: _State) -> str:
    ref = state.regarding
    pods = ", ".join(pod_name(pod) for pod, *_ in state.pending[:5])
    return (
        f"the free-failure count on {ref.kind} {ref.namespace}/{ref.name} "
        f"({len(state.pending)} free failures: pods {pods})"
    )
