"""What earlier attempts of a Job went through: OOM kills per container, and failed nodes.

``retry-policy.dev/oom-memory-factor`` and ``avoid-failed-nodes`` make a pod depend on how
the earlier attempts of its Job ended, which only their failed pods tell
(``status.containerStatuses[].state.terminated.reason: OOMKilled``, ``spec.nodeName``).
The attempt cache (``webhook.cluster.attempts.JobCache``) already watches the failed pods of Jobs;
it hands each one to ``FailureHistory.record``, which keeps, per *lineage*, what a later
pod needs and nothing else, so a pod's admission is a dictionary lookup:

- a lineage is one Job (its namespace and UID), or for an Indexed Job one index of it;
  for a JobSet (its namespace and UID), one
  replicated Job and job index of the set, across the set's restarts: a restart recreates
  the child Jobs under new UIDs, so their pods are found by the labels JobSet puts on
  every pod (``labelAndAnnotateObject`` in jobset pkg/controllers/jobset_controller.go,
  since v0.9.0): ``jobset.sigs.k8s.io/jobset-uid`` (the JobSet's UID) with
  ``replicatedjob-name`` and ``job-index``. The JobSet's own admission cannot say: on
  CREATE its ``metadata.uid`` is not assigned yet (``rest.WipeObjectMetaSystemFields``).
  The namespace is part of every key: a pod elsewhere can carry the same labels (a
  ``jobset-uid`` or ``controller-uid`` copied by hand, or an owner reference naming a UID
  of another namespace, which the API server does not refuse), and must feed nothing
  into that workload's history;
- a JobSet run's pods (``restart-attempt`` N > 0) need the earlier runs' failures, whose
  child Jobs and pods the restart deleted: when no failed pod of run N-1 was recorded
  here, the lookup says so (``earlier_runs_unseen``) and the pod is told in a warning;
- only the pods of workloads that asked (they carry ``oom-memory-factor`` or
  ``avoid-failed-nodes``) are recorded, and each once, however often it is seen again (a
  failed pod is modified again when the Job controller removes its finalizer, and every
  relist of the watch delivers it anew);
- what is kept is small and JSON-serialisable (``HistoryLookup.to_json``): per container
  the OOM kills and the most memory it was killed at (``Killed``), and the failed nodes;
- a record stays when its pod is deleted (a JobSet restart deletes the failed pods), until
  its Job is deleted; a JobSet's lineages, whose child Jobs are deleted at every restart,
  go when the store is full, oldest first.

A failed pod may reach the watch after the Job controller counted it. So a lookup is given
the failures the Job (or index) has on record, and when fewer of them were seen here, the
Job's failed pods are listed once (one bounded request, behind the same kind of breaker as
the attempt cache's GET). When the API cannot answer, the history is unknown and the pod
is admitted unchanged, with a warning.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.kube import podsignals, quantity
from webhook.kube.wellknown import (
    COMPLETION_INDEX,
    JOB_UID_LABEL,
    JOBSET_JOB_INDEX,
    JOBSET_UID,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
)
from webhook.policy.model import PREFIX

log = logging.getLogger(__name__)

#: On a pod: the keys that make its failures worth recording.
WANTS_HISTORY = (PREFIX + "oom-memory-factor", PREFIX + "avoid-failed-nodes")
#: On a pod: every key that makes its failures worth recording (the pods of later attempts
#: are told the last failure's cause, and wait from its time).
RECORDED = (*WANTS_HISTORY, PREFIX + "attempt-env", PREFIX + "retry-delay")
OOM_KILLED = "OOMKilled"

#: Bounds: failed nodes per lineage, and lineages in all (each lineage remembers every
#: failed pod it saw, 6 bytes each: see ``_Record``).
MAX_NODES = 16
MAX_LINEAGES = 100_000
MAX_LISTED = 10_000


@dataclass(frozen=True)
class HistoryKey:
    """What a pod asks: the history of its lineage, complete up to ``expected`` counted
    failures (of its index when ``per_index``, else of its Job); ``None``: unknown."""

    namespace: str
    job: str
    uid: str
    lineage: str
    index: int | None
    expected: int | None
    per_index: bool = False
    #: A JobSet's pod: the set's UID and the run (``restart-attempt``) the pod belongs to.
    jobset: str | None = None
    run: int = 0


class Killed(NamedTuple):
    """What the OOM killer did to one container of a lineage: how many of its pods it
    stopped, and the most memory (request, limit: whole bytes; ``None`` when unset) the
    container had when it was stopped. A raise starts from that memory
    (``webhook.kinds.pod``): sibling pods OOM-killed at the same size prove that size
    too small once, not once each."""

    container: str
    kills: int
    request: int | None = None
    limit: int | None = None

    def to_json(self) -> list[Any]:
        return [self.container, self.kills, self.request, self.limit]


@dataclass(frozen=True)
class HistoryLookup:
    """The answer: ``known`` false when the history cannot be told (``reason`` says why).
    ``oom_kills`` are ``Killed`` tallies sorted by container name; ``nodes`` the nodes
    where attempts failed, the most recent last; ``missing`` counted failures whose pods
    were not found (deleted before they were seen)."""

    known: bool
    oom_kills: tuple[Killed, ...] = ()
    nodes: tuple[str, ...] = ()
    failures: int = 0
    missing: int = 0
    source: str = ""
    reason: str = ""
    #: A JobSet's run N > 0 whose run N-1 left no failed pod recorded here (the webhook
    #: started after the restart deleted them): what earlier runs went through is unknown.
    earlier_runs_unseen: bool = False
    #: The most recent failure of the lineage: its cause (``failure_cause``'s grammar,
    #: "" when it cannot be told) and when it happened (Unix time; ``None``: unknown).
    last_cause: str = ""
    last_failed_at: float | None = None
    #: For an Indexed Job's pod: the counted failures of its index seen here (all of them
    #: when ``missing`` is 0), whether the Job's budget is per index or not.
    index_failures: int = 0

    def __post_init__(self) -> None:
        # (container, kills) pairs are accepted too: a tally without the memory.
        tally = tuple(k if isinstance(k, Killed) else Killed(*k) for k in self.oom_kills)
        object.__setattr__(self, "oom_kills", tally)

    def killed(self, container: str) -> Killed | None:
        for entry in self.oom_kills:
            if entry.container == container:
                return entry
        return None

    def kills(self, container: str) -> int:
        entry = self.killed(container)
        return entry.kills if entry is not None else 0

    def to_json(self) -> dict[str, Any]:
        """The tally as JSON (what a workload annotation would carry)."""
        return {"oomKills": [k.to_json() for k in self.oom_kills], "nodes": list(self.nodes)}


def parse_time(raw: Any) -> float | None:
    """An RFC 3339 time of the API (``2026-11-26T10:00:00Z``) as Unix time."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def failure_cause(pod: Mapping[str, Any]) -> tuple[str, float | None]:
    """Why and when a failed pod failed, in the fixed grammar the pods of the next
    attempts are told (``RETRY_POLICY_LAST_FAILURE``): ``disruption`` (a
    ``DisruptionTarget`` condition: preempted, evicted, its node lost), else
    ``oom-killed:<container>``, else ``exit-code:<code>:<container>`` (the first
    container that failed, regular containers before init containers, as the Job
    controller reads them: ``matchOnExitCodes``), else "" (a deadline, a pod deleted
    before any container ran). The time is the latest ``finishedAt`` of its containers,
    else the condition's ``lastTransitionTime``."""
    status = pod.get("status")
    status = status if isinstance(status, dict) else {}
    finished: list[float] = []
    oom: str | None = None
    code: str | None = None
    for group in ("containerStatuses", "initContainerStatuses"):
        statuses = status.get(group)
        for cs in statuses if isinstance(statuses, list) else ():
            if not isinstance(cs, dict) or not isinstance(cs.get("name"), str):
                continue
            terminated = (cs.get("state") or {}).get("terminated")
            if not isinstance(terminated, dict):
                continue
            at = parse_time(terminated.get("finishedAt"))
            if at is not None:
                finished.append(at)
            exit_code = terminated.get("exitCode")
            if terminated.get("reason") == OOM_KILLED and oom is None:
                oom = f"oom-killed:{cs['name']}"
            elif isinstance(exit_code, int) and exit_code != 0 and code is None:
                code = f"exit-code:{exit_code}:{cs['name']}"
    reason = disruption(pod)
    when = max(finished) if finished else None
    if reason is not None:
        if when is None:
            for condition in status.get("conditions") or ():
                if isinstance(condition, dict) and condition.get("type") == "DisruptionTarget":
                    when = parse_time(condition.get("lastTransitionTime"))
        return "disruption", when
    return oom or code or "", when


def unknown(reason: str) -> HistoryLookup:
    return HistoryLookup(False, source="none", reason=reason)


def wants_history(metadata: Mapping[str, Any]) -> bool:
    annotations = metadata.get("annotations")
    return isinstance(annotations, dict) and any(k in annotations for k in RECORDED)


def pod_lineage(metadata: Mapping[str, Any], job_uid: str) -> tuple[str, int | None]:
    """The lineage of a pod of the Job ``job_uid`` and its completion index (``None``: not
    an Indexed Job): a JobSet's pods share theirs across the set's restarts."""
    annotations = metadata.get("annotations")
    annotations = annotations if isinstance(annotations, dict) else {}
    raw = annotations.get(COMPLETION_INDEX)
    index = int(raw) if isinstance(raw, str) and raw.isdigit() and len(raw) < 10 else None
    place = jobset_place(metadata)
    if place is not None:
        return "/".join(place), index
    return job_uid, index


def _labels(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = metadata.get("labels")
    return labels if isinstance(labels, dict) else {}


def jobset_place(metadata: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(JobSet UID, replicated Job, job index) of a JobSet's pod, from JobSet's labels;
    ``None`` for any other pod, and for a JobSet's pod without the UID label (JobSet
    before v0.9.0: ``jobset_without_uid``)."""
    labels = _labels(metadata)
    jobset, rjob, position = (labels.get(k) for k in (JOBSET_UID, REPLICATED_JOB, JOBSET_JOB_INDEX))
    if all(isinstance(v, str) and v for v in (jobset, rjob, position)):
        return jobset, rjob, position  # type: ignore[return-value]
    return None


def jobset_without_uid(metadata: Mapping[str, Any]) -> bool:
    """A JobSet's pod (it names its replicated Job) that does not name its JobSet's UID:
    made by a JobSet older than v0.9.0, its earlier runs cannot be found."""
    labels = _labels(metadata)
    return isinstance(labels.get(REPLICATED_JOB), str) and not labels.get(JOBSET_UID)


def jobset_run(metadata: Mapping[str, Any]) -> int:
    """The run (``restart-attempt`` label) a JobSet's pod belongs to; 0 when unknown."""
    raw = _labels(metadata).get(RESTART_ATTEMPT)
    return int(raw) if isinstance(raw, str) and raw.isdigit() and len(raw) < 10 else 0


def oom_killed(pod: Mapping[str, Any]) -> list[str]:
    """The containers (init containers included) the OOM killer stopped in this pod."""
    return sorted(_statuses(pod, oom_only=True))


def _statuses(pod: Mapping[str, Any], oom_only: bool = False) -> dict[str, dict[str, Any]]:
    """The pod's container statuses (init containers' too) by name; with ``oom_only``,
    those of containers the OOM killer stopped (now or before an in-place restart)."""
    status = pod.get("status")
    found: dict[str, dict[str, Any]] = {}
    if not isinstance(status, dict):
        return found
    for group in ("containerStatuses", "initContainerStatuses"):
        statuses = status.get(group)
        for cs in statuses if isinstance(statuses, list) else ():
            if not isinstance(cs, dict) or not isinstance(cs.get("name"), str):
                continue
            if oom_only and not any(
                isinstance(t := (cs.get(state) or {}).get("terminated"), dict)
                and t.get("reason") == OOM_KILLED
                for state in ("state", "lastState")
            ):
                continue
            found[cs["name"]] = cs
    return found


def _bytes(raw: Any) -> int | None:
    """A memory quantity in whole bytes (rounded up), ``None`` when it is not one."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        value = quantity.parse(str(raw)).value
    except quantity.QuantityError:
        return None
    return math.ceil(value) if value > 0 else None


def _memory(resources: Any, kind: str) -> int | None:
    values = resources.get(kind) if isinstance(resources, dict) else None
    return _bytes(values.get("memory")) if isinstance(values, dict) else None


def killed_at(pod: Mapping[str, Any]) -> list[Killed]:
    """What the OOM killer stopped in this failed pod, each container with the memory it
    had then. The limit is the one the kernel enforced: ``status.containerStatuses[]
    .resources`` holds the actual resources of a running container and the allocated
    ones of a stopped one, so it shows an in-place resize (KEP-1287 "API Changes";
    ``convertContainerStatusResources`` in pkg/kubelet/kubelet_pods.go), where the
    spec holds the desired size; the spec is the fallback (kubelets that leave the field
    out). The request likewise, then ``allocatedResources``; a container with a limit and
    no request has the limit as request (``SetDefaults_Pod``)."""
    spec = pod.get("spec")
    specs: dict[str, Any] = {}
    for group in ("initContainers", "containers"):
        items = spec.get(group) if isinstance(spec, dict) else None
        for c in items if isinstance(items, list) else ():
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                specs[c["name"]] = c.get("resources")
    out = []
    for name, cs in sorted(_statuses(pod, oom_only=True).items()):
        actual, declared = cs.get("resources"), specs.get(name)
        limit = _memory(actual, "limits") or _memory(declared, "limits")
        request = (
            _memory(actual, "requests")
            or _bytes((cs.get("allocatedResources") or {}).get("memory"))
            or _memory(declared, "requests")
            or limit
        )
        out.append(Killed(name, 1, request, limit))
    return out


#: ``DisruptionTarget`` reasons of a pod that its node failed, though it was being
#: deleted: the taint manager evicting it from a node tainted NoExecute (unreachable,
#: not ready; ``addConditionAndDeletePod`` in pkg/controller/tainteviction), PodGC
#: failing it after its node was deleted (``gcOrphaned`` in pkg/controller/podgc), the
#: device taint eviction controller evicting it from a faulty device of the node
#: (pkg/controller/devicetainteviction).
NODE_DISRUPTIONS = frozenset(
    {
        podsignals.DELETION_BY_TAINT_MANAGER,
        podsignals.DELETION_BY_POD_GC,
        podsignals.DELETION_BY_DEVICE_TAINT_MANAGER,
    }
)
#: The failure categories (``webhook.policy.categories``) that say the node failed the pod:
#: whatever the signal, its node is one to avoid (``avoid-failed-nodes``).
NODE_CATEGORIES = frozenset({"DeviceFault", "NodeFailure"})
#: The kubelet's own reason: node-pressure eviction (``synchronize`` in
#: pkg/kubelet/eviction) and graceful node shutdown (pkg/kubelet/nodeshutdown), which
#: count; and its preemption for a critical pod, whose pod status reason is
#: ``Preempting`` (``evictPodsToFreeRequests`` in pkg/kubelet/preemption), which does not.
BY_KUBELET = "TerminationByKubelet"
KUBELET_PREEMPTION = "Preempting"


def disruption(pod: Mapping[str, Any]) -> str | None:
    """The reason of the pod's ``DisruptionTarget`` condition (status True), if any."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if (
            isinstance(condition, dict)
            and condition.get("type") == "DisruptionTarget"
            and condition.get("status") == "True"
        ):
            return str(condition.get("reason") or "")
    return None


def failed_node(pod: Mapping[str, Any]) -> str | None:
    """The node that failed this pod, if its node did: where an ordinary failure (an
    error, an OOM kill) happened, or a node lost or tainted under it (``NODE_DISRUPTIONS``,
    though the pod was being deleted), or the kubelet stopped it for node pressure or a
    shutdown. Not the node of a pod preempted by the scheduler (``PreemptionByScheduler``)
    or the kubelet, evicted through the API (``EvictionByEvictionAPI``: a drain, a
    person), nor of one deleted without a disruption condition (its Job, its JobSet's
    restart)."""
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    if not isinstance(node, str) or not node:
        return None
    if _node_category(pod):
        return node
    reason = disruption(pod)
    if reason is None:
        meta = pod.get("metadata")
        return None if isinstance(meta, dict) and meta.get("deletionTimestamp") else node
    if reason in NODE_DISRUPTIONS:
        return node
    status = pod.get("status")
    stopped_by = status.get("reason") if isinstance(status, dict) else None
    return node if reason == BY_KUBELET and stopped_by != KUBELET_PREEMPTION else None


def _node_category(pod: Mapping[str, Any]) -> bool:
    """Whether the controller classified the pod ``DeviceFault`` or ``NodeFailure``."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return any(
        isinstance(c, dict)
        and c.get("status") == "True"
        and str(c.get("type") or "").removeprefix("retry-policy.dev/") in NODE_CATEGORIES
        for c in (conditions if isinstance(conditions, list) else ())
    )


MARK = 6


def pod_mark(pod_uid: str) -> bytes:
    """A short stand-in for a pod's UID (48 bits): enough to tell apart the pods of one
    lineage, at a fraction of the UID's memory."""
    return hashlib.blake2b(pod_uid.encode(), digest_size=MARK).digest()


def marked(marks: bytes, mark: bytes) -> bool:
    """Whether ``mark`` is one of ``marks`` (a search in C, at mark boundaries)."""
    at = marks.find(mark)
    while at != -1:
        if at % MARK == 0:
            return True
        at = marks.find(mark, at + 1)
    return False


#: One lineage's record: (the marks of every failed pod seen, 6 bytes each; the OOM
#: tally, one ``Killed`` per container; failed nodes; the latest failure's cause and
#: time). Every mark is kept, so a pod seen
#: again (a relist of the watch after a 410, a restart of the API server, a dropped
#: connection; a list of the Job's failed pods) is never counted twice, however many
#: failed pods the lineage has: 6 bytes a pod (benchmarks/scale.py).
_Record = tuple[bytes, tuple[Killed, ...], tuple[str, ...], tuple[str, float | None]]
_EMPTY: _Record = (b"", (), (), ("", None))
#: A lineage's key: the lineage, or (lineage, completion index) for an Indexed Job.
_Key = str | tuple[str, int]


def _key(lineage: str, index: int | None) -> _Key:
    return lineage if index is None else (lineage, index)


def scoped(namespace: str, uid: str) -> str:
    """A workload's (or lineage's) key here: its namespace with it (a namespace holds no
    "/", so the pair reads back unambiguously)."""
    return f"{namespace}/{uid}"


class FailureHistory:
    """The failure history of the Jobs whose pods asked for it (see the module's doc)."""

    def __init__(
        self,
        core_api: Any = None,
        job_label: str = JOB_UID_LABEL,
        counts: Callable[[str, Mapping[str, Any]], bool] | None = None,
        lookup_timeout: float = 0.5,
        breaker_seconds: float = 10.0,
        max_lineages: int = MAX_LINEAGES,
        recorded: Callable[[HistoryKey], int] | None = None,
    ):
        self.core_api = core_api
        #: Counted failures the workload's own record holds for a question
        #: (``webhook.cluster.record``): failures whose pods this replica never saw.
        self.recorded = recorded or (lambda key: 0)
        self.job_label = job_label
        self.counts = counts or (lambda job_uid, pod: True)
        self.lookup_timeout = lookup_timeout
        self.breaker_seconds = breaker_seconds
        self.max_lineages = max_lineages
        self._lock = threading.Lock()
        #: lineage key -> record; oldest first (a record moves last when it changes).
        self._lineages: dict[_Key, _Record] = {}
        #: Job UID -> counted failures seen; for an Indexed Job, [those, {index: those}].
        self._jobs: dict[str, int | list[Any]] = {}
        #: One copy of each distinct OOM tally: most Jobs share a few.
        self._tallies: dict[tuple[Killed, ...], tuple[Killed, ...]] = {}
        #: Job UID -> the failures it had on record when its failed pods were last listed.
        self._listed: dict[str, int] = {}
        #: JobSet UID -> the latest run (restart-attempt) with a failed pod recorded.
        self._runs: dict[str, int] = {}
        #: JobSet UID -> the set's latest failure (cause, time): what restarted it, which
        #: every pod of the next run is told and waits from, whatever its own lineage.
        self._set_last: dict[str, tuple[str, float | None]] = {}
        self._open_until = 0.0
        self._interned: dict[str, str] = {}
        self.counters = {"lists": 0, "list_errors": 0, "breaker_skips": 0, "evicted": 0}

    # --- recording (the attempt cache's pod watch) --------------------------------
    def record(self, pod: Mapping[str, Any], job_uid: str, counted: bool) -> bool:
        """Record one failed pod of the Job ``job_uid`` (once); ``True`` when it was new.
        Its failed node is ``failed_node``'s: none for a pod preempted or evicted, or
        stopped by its JobSet's restart."""
        meta = pod.get("metadata")
        if not isinstance(meta, dict) or not wants_history(meta):
            return False
        uid, namespace = meta.get("uid"), meta.get("namespace")
        if not isinstance(uid, str) or not uid or not isinstance(namespace, str):
            return False
        lineage, index = pod_lineage(meta, job_uid)
        key = _key(scoped(namespace, lineage), index)
        job_uid = scoped(namespace, job_uid)
        mark = pod_mark(uid)
        node = failed_node(pod)
        killed = killed_at(pod)
        place = jobset_place(meta)
        cause, when = failure_cause(pod)
        with self._lock:
            if place is not None:
                run, jobset = jobset_run(meta), scoped(namespace, place[0])
                if len(self._runs) >= MAX_LISTED and jobset not in self._runs:
                    self._runs.clear()
                self._runs[jobset] = max(run, self._runs.get(jobset, -1))
                latest = self._set_last.get(jobset, ("", None))
                if latest[1] is None or (when is not None and when >= latest[1]):
                    if len(self._set_last) >= MAX_LISTED and jobset not in self._set_last:
                        self._set_last.clear()
                    self._set_last[jobset] = (self._intern(cause), when)
            marks, ooms, nodes, last = self._lineages.pop(key, _EMPTY)
            if marked(marks, mark):
                self._lineages[key] = (marks, ooms, nodes, last)
                return False
            if last[1] is None or (when is not None and when >= last[1]):
                last = (self._intern(cause), when)
            marks += mark
            if killed:
                ooms = self._tally(ooms, killed)
            if node is not None:
                node = self._intern(node)
                nodes = (*(n for n in nodes if n != node), node)[-MAX_NODES:]
            self._lineages[key] = (marks, ooms, nodes, last)
            while len(self._lineages) > self.max_lineages:
                self._evict_oldest()
            job = self._jobs.get(job_uid, 0)
            if index is None and isinstance(job, int):
                self._jobs[job_uid] = job + int(counted)
            else:
                if isinstance(job, int):
                    job = self._jobs[job_uid] = [job, {}]
                job[0] += int(counted)
                if index is not None:
                    job[1][index] = job[1].get(index, 0) + int(counted)
        return True

    def _tally(self, ooms: tuple[Killed, ...], killed: list[Killed]) -> tuple[Killed, ...]:
        """``ooms`` with one more pod's OOM kills: counts add up, memory keeps the most.
        (Called with the lock held.)"""
        tally = {k.container: k for k in ooms}
        for kill in killed:
            before = tally.get(kill.container)
            if before is not None:
                kill = Killed(
                    before.container,
                    before.kills + 1,
                    _most(before.request, kill.request),
                    _most(before.limit, kill.limit),
                )
            tally[kill.container] = kill._replace(container=self._intern(kill.container))
        shared = tuple(sorted(tally.values()))
        if len(self._tallies) >= 10_000:
            self._tallies.clear()
        return self._tallies.setdefault(shared, shared)

    def _evict_oldest(self) -> None:
        """Drop the oldest lineage, and what its Job counted as seen: a later lookup then
        finds the Job's failures unseen and lists them again (a JobSet's earlier runs,
        whose pods are gone, are lost)."""
        key = next(iter(self._lineages))
        del self._lineages[key]
        self.counters["evicted"] += 1
        uid, index = (key, None) if isinstance(key, str) else key
        job = self._jobs.get(uid)
        self._listed.pop(uid, None)
        if isinstance(job, list) and index is not None:
            job[0] -= job[1].pop(index, 0)
        elif job is not None:
            del self._jobs[uid]

    def _counted(self, uid: str, index: int | None, per_index: bool) -> int:
        """Counted failures of a Job (of one of its indexes) recorded here."""
        job = self._jobs.get(uid, 0)
        if isinstance(job, int):
            return 0 if per_index else job
        return int(job[1].get(index, 0)) if per_index else int(job[0])

    def _intern(self, text: str) -> str:
        """One copy of each node and container name (thousands of records share them)."""
        shared = self._interned.get(text)
        if shared is None:
            if len(self._interned) >= 100_000:
                self._interned.clear()
            shared = self._interned[text] = text
        return shared

    def forget_job(self, uid: str, namespace: str) -> None:
        """The Job was deleted: its history goes (a JobSet's lineages stay, see above)."""
        uid = scoped(namespace, uid)
        with self._lock:
            job = self._jobs.pop(uid, None)
            self._listed.pop(uid, None)
            self._lineages.pop(uid, None)
            for index in job[1] if isinstance(job, list) else ():
                self._lineages.pop((uid, index), None)

    # --- lookups (hot path) -------------------------------------------------------
    def lookup(self, key: HistoryKey) -> HistoryLookup | None:
        """The answer when the records here can give it; ``None`` when the Job has more
        failures on record than were seen here and its failed pods were not listed since
        (``fetch`` lists them)."""
        if key.expected is None:
            return unknown("the Job's failure count is unknown")
        job = scoped(key.namespace, key.uid)
        with self._lock:
            record = self._lineages.get(_key(scoped(key.namespace, key.lineage), key.index), _EMPTY)
            seen = self._counted(job, key.index, key.per_index)
            listed = self._listed.get(job, -1)
        seen = max(seen, self.recorded(key))
        if seen < key.expected and listed < key.expected:
            return None
        return self._answer(record, key, seen, "failed pods (cache)")

    def _answer(self, record: _Record, key: HistoryKey, seen: int, source: str) -> HistoryLookup:
        marks, ooms, nodes, (cause, when) = record
        missing = max(0, (key.expected or 0) - seen)
        unseen = False
        index_failures = 0
        with self._lock:
            if key.jobset is not None:
                jobset = scoped(key.namespace, key.jobset)
                unseen = key.run > 0 and self._runs.get(jobset, -1) < key.run - 1
                latest = self._set_last.get(jobset)
                if latest is not None and (when is None or (latest[1] or 0) > when):
                    cause, when = latest
            if key.index is not None:
                index_failures = self._counted(scoped(key.namespace, key.uid), key.index, True)
        return HistoryLookup(
            True,
            ooms,
            nodes,
            len(marks) // MARK,
            missing,
            source,
            "",
            unseen,
            cause,
            when,
            index_failures,
        )

    def fetch(self, key: HistoryKey) -> HistoryLookup:
        """``lookup``, listing the Job's failed pods first when it needs them (one bounded
        request; after an error, none for ``breaker_seconds``)."""
        answer = self.lookup(key)
        if answer is not None:
            return answer
        if self.core_api is None:
            return unknown("no connection to a cluster")
        if time.monotonic() < self._open_until:
            self.counters["breaker_skips"] += 1
            return unknown("Kubernetes API unavailable (recent errors)")
        half = self.lookup_timeout / 2
        self.counters["lists"] += 1
        try:
            resp = self.core_api.list_namespaced_pod(
                key.namespace,
                label_selector=f"{self.job_label}={key.uid}",
                field_selector="status.phase=Failed",
                limit=500,
                _preload_content=False,
                _request_timeout=(half, half),
            )
            pods = json.loads(resp.data).get("items") or []
        except Exception as err:
            self.counters["list_errors"] += 1
            self._open_until = time.monotonic() + self.breaker_seconds
            status = getattr(err, "status", None)
            why = f"HTTP {status}" if status else type(err).__name__
            return unknown(f"failed pods of Job {key.namespace}/{key.job} unreadable: {why}")
        for pod in pods:
            if isinstance(pod, dict):
                self.record(pod, key.uid, self.counts(key.uid, pod))
        job = scoped(key.namespace, key.uid)
        with self._lock:
            if len(self._listed) >= MAX_LISTED:
                self._listed.clear()
            self._listed[job] = key.expected or 0
            record = self._lineages.get(_key(scoped(key.namespace, key.lineage), key.index), _EMPTY)
            seen = self._counted(job, key.index, key.per_index)
        return self._answer(record, key, max(seen, self.recorded(key)), "failed pods (API)")

    def at_once(self, key: HistoryKey) -> HistoryLookup | None:
        """The answer when it needs no request to the API (a lookup the records answer,
        or the breaker open); ``None`` when it needs ``fetch``'s list."""
        answer = self.lookup(key)
        if answer is None and time.monotonic() < self._open_until:
            self.counters["breaker_skips"] += 1
            return unknown("Kubernetes API unavailable (recent errors)")
        return answer

    def stats(self) -> dict[str, int]:
        with self._lock:
            lineages, jobs = len(self._lineages), len(self._jobs)
        return {"lineages": lineages, "jobs": jobs, **self.counters}


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
