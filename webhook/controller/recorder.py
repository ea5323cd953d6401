"""The leader writes each annotated workload's failure history onto the workload.

It watches failed pods of Jobs (as the admission workers do) and, for each pod of a
workload that asked for something a later attempt learns from (``history.RECORDED``:
memory raises, avoided nodes, the attempt's env, retry delays), adds the failure to the
workload's record (``webhook.cluster.record``): the Job's, or for a JobSet's pods (and a
TrainJob's, whose JobSet it is) the JobSet's, which outlives the child Jobs a restart
deletes. Writes are batched per workload (``window`` seconds) and carry the
``resourceVersion`` they were computed from: on 409 Conflict the workload is read again
and the record recomputed, so a concurrent writer's change is never lost, and the write is
made again until it lands. A write the API fails (429, 5xx, no answer) stays pending and is
tried again after a back-off; one it refuses (another 4xx: the record would push the
workload's annotations past their 256 KiB, a webhook refuses the update) is given up with
a ``RetryPolicyWriteFailed`` Event (``webhook.controller.writes``). A pod the record
already holds (its mark) is never added twice, however often a relist delivers it.

A workload is known by its namespace and UID: a pod names its Job or JobSet by UID labels
(and owner references) that a pod in another namespace could carry as well, and feeds only
the workload of that UID in its own namespace.

Whether a failure counted is the Job controller's judgement, made the same way here: the
child Job's rules on the pod (``matchPodFailurePolicy``; an ``Ignore`` rule's failures do
not count).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.events import JOB_API, Regarding
from webhook.cluster.history import jobset_place, wants_history
from webhook.cluster.informer import Informer
from webhook.cluster.record import (
    JOBSETS,
    MAX_MARKS,
    Record,
    text_of,
)
from webhook.controller.records import Workloads
from webhook.controller.writes import Writes, rewrite
from webhook.kube.failurepolicy import PodFailure, counts, evaluate
from webhook.kube.objects import controller_of
from webhook.kube.wellknown import (
    JOB_UID_LABEL,
    JOBSET_API_VERSION,
    JOBSET_GROUP,
    JOBSET_NAME,
    JOBSET_UID,
    JOBSET_VERSION,
    REPLICATED_JOB,
)

log = logging.getLogger(__name__)


def _annotation(meta: Mapping[str, Any]) -> str | None:
    return text_of({"metadata": meta})


@dataclass(slots=True)
class _Workload:
    """What the recorder keeps of a workload it may write: where it is, its record as
    written (parsed only when a failure is added to it) and the resourceVersion it was
    read at. Small: one per annotated workload (benchmarks/controller.py)."""

    kind: str  # "job" or "jobset"
    namespace: str
    name: str
    version: str = ""
    text: str | None = None
    #: A Job's rules, when an Ignore rule makes counting depend on them (one shared copy
    #: of each distinct list).
    rules: tuple = ()

    @property
    def record(self) -> Record | None:
        return Record.parse(self.text)


#: A workload: (kind, namespace, UID), kind "job" or "jobset".
Key = tuple[str, str, str]


@dataclass
class _Pending:
    workload: Key
    name: str
    #: Pod UID -> (the failed pod, whether it counted), oldest first.
    pods: dict[str, tuple[Mapping[str, Any], bool]] = field(default_factory=dict)

    def regarding(self) -> Regarding:
        kind, namespace, uid = self.workload
        if kind == "job":
            return Regarding(JOB_API, "Job", namespace, self.name, uid)
        return Regarding(JOBSET_API_VERSION, "JobSet", namespace, self.name, uid)

    def unwritten(self) -> str:
        """What a write that failed would have recorded (the log's and Event's words)."""
        ref = self.regarding()
        names = [
            str((pod.get("metadata") or {}).get("name") or "") for pod, _ in self.pods.values()
        ]
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        return (
            f"the failure history on {ref.kind} {ref.namespace}/{ref.name} ({len(names)} failed "
            f"pods: {', '.join(names[:5])}{more}; later attempts do not learn from them)"
        )


class HistoryRecorder:
    """A reconciler (``webhook.controller.manager.Reconciler``)."""

    name = "history"

    def __init__(
        self, api_client: Any, window: float = 0.5, events: Any = None, metrics: Any = None
    ):
        from kubernetes import client

        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.workloads = Workloads(api_client)
        self.window = window
        self._lock = threading.Lock()
        #: (kind, namespace, uid) -> the workloads whose pods are recorded (Jobs whose
        #: template carries a recorded key; every JobSet, once one of its pods asked).
        self._workloads: dict[Key, _Workload] = {}
        self._pending: dict[Key, _Pending] = {}
        self._rule_sets: dict[str, tuple] = {}
        self._jobsets: Informer | None = None
        self.counters = {"writes": 0, "conflicts": 0, "errors": 0, "recorded": 0}
        self.writes = Writes("history", events, metrics)

    # --- the watches ------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        jobs = Informer(
            "recorder-jobs",
            self.batch.list_job_for_all_namespaces,
            lambda: self._reset("job"),
            self._apply_job,
            {},
            stop,
            "controller",
        )
        pods = Informer(
            "recorder-failed-pods",
            self.core.list_pod_for_all_namespaces,
            lambda: None,  # a relist delivers every pod again: marks make it a no-op
            self._apply_pod,
            {"label_selector": JOB_UID_LABEL, "field_selector": "status.phase=Failed"},
            stop,
            "controller",
        )
        self._stop = stop
        self.watches = [jobs, pods]
        threading.Thread(target=jobs.run, name="recorder-jobs", daemon=True).start()
        jobs.synced.wait(30)  # a pod's Job (its rules) before the pod, where it can
        threading.Thread(target=pods.run, name="recorder-pods", daemon=True).start()
        while not stop.wait(self.window):
            self.flush()
        self.flush()

    def _reset(self, kind: str) -> None:
        with self._lock:
            for key in [k for k in self._workloads if k[0] == kind]:
                del self._workloads[key]

    def _apply_job(self, event: str, job: Mapping[str, Any]) -> None:
        meta = job.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str):
            return
        key = ("job", str(meta.get("namespace") or ""), uid)
        template = ((job.get("spec") or {}).get("template") or {}).get("metadata") or {}
        with self._lock:
            if event == "DELETED" or not wants_history(template):
                self._workloads.pop(key, None)
                return
            policy = (job.get("spec") or {}).get("podFailurePolicy") or {}
            rules = tuple(policy.get("rules") or ())
            ignores = any(isinstance(r, dict) and r.get("action") == "Ignore" for r in rules)
            self._workloads[key] = _Workload(
                "job",
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
                str(meta.get("resourceVersion") or ""),
                _annotation(meta),
                self._shared(rules) if ignores else (),
            )

    def _shared(self, rules: tuple) -> tuple:
        """One copy of each distinct rule list (called with the lock held): the Jobs of
        one template carry the same rules."""
        key = json.dumps(rules, sort_keys=True)
        shared = self._rule_sets.get(key)
        if shared is None:
            if len(self._rule_sets) >= 4096:
                self._rule_sets.clear()
            shared = self._rule_sets[key] = rules
        return shared

    def _apply_jobset(self, event: str, jobset: Mapping[str, Any]) -> None:
        meta = jobset.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str):
            return
        key = ("jobset", str(meta.get("namespace") or ""), uid)
        with self._lock:
            if event == "DELETED":
                self._workloads.pop(key, None)
                return
            self._workloads[key] = _Workload(
                "jobset",
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
                str(meta.get("resourceVersion") or ""),
                _annotation(meta),
            )

    def _watch_jobsets(self) -> None:
        """JobSets are watched from the first JobSet pod that asks (else never)."""
        if self._jobsets is not None:
            return

        def list_jobsets(**kwargs: Any) -> Any:
            return self.custom.list_cluster_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, JOBSETS, **kwargs
            )

        self._jobsets = Informer(
            "recorder-jobsets",
            list_jobsets,
            lambda: self._reset("jobset"),
            self._apply_jobset,
            {},
            self._stop,
            "controller",
        )
        threading.Thread(target=self._jobsets.run, name="recorder-jobsets", daemon=True).start()

    def _apply_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        if event == "DELETED" or (pod.get("status") or {}).get("phase") != "Failed":
            return
        if not wants_history(meta) or not meta.get("uid"):
            return
        owner = controller_of(meta)
        if owner is None or owner.get("kind") != "Job" or not owner.get("uid"):
            return
        namespace = str(meta.get("namespace") or "")
        if not namespace:
            return
        place = jobset_place(meta)
        labels = meta.get("labels") or {}
        key: Key
        if place is not None and isinstance(labels.get(JOBSET_NAME), str):
            key, name = ("jobset", namespace, place[0]), labels[JOBSET_NAME]
            self._watch_jobsets()
        elif labels.get(REPLICATED_JOB) and not labels.get(JOBSET_UID):
            return  # a JobSet older than v0.9.0: no record can outlive its child Jobs
        else:
            key, name = ("job", namespace, str(owner["uid"])), str(owner.get("name") or "")
        with self._lock:
            job = self._workloads.get(("job", namespace, str(owner["uid"])))
            rules = job.rules if job is not None else ()
        counted = counts(evaluate(rules, PodFailure.from_pod(pod))) if rules else True
        self._add(_Pending(key, name, {str(meta.get("uid") or ""): (pod, counted)}))

    def _add(self, pending: _Pending) -> None:
        """Queue ``pending``'s pods after those already queued for its workload (each pod
        once; at most as many as the record remembers)."""
        with self._lock:
            queued = self._pending.setdefault(pending.workload, _Pending(pending.workload, ""))
            queued.name = queued.name or pending.name
            for uid, entry in pending.pods.items():
                queued.pods.setdefault(uid, entry)
            while len(queued.pods) > MAX_MARKS:
                del queued.pods[next(iter(queued.pods))]

    # --- the writes -------------------------------------------------------------------------
    def flush(self) -> None:
        """Write each workload's pending failures; a write that failed stays pending (its
        back-off, then again), one refused is given up (``webhook.controller.writes``)."""
        with self._lock:
            batch, self._pending = self._pending, {}
        for key, pending in batch.items():
            if not self.writes.ready(key):
                self._requeue(pending)
                continue
            try:
                written = self._write(pending)
            except Exception as err:  # the loop must outlive any one workload
                self.counters["errors"] += 1
                if self.writes.failed(key, err, pending.regarding(), pending.unwritten()):
                    self._requeue(pending)
                continue
            if written:
                self.writes.landed(key)
            else:
                self.writes.forget(key)

    def _requeue(self, pending: _Pending) -> None:
        """Put ``pending`` back, before what was queued for its workload since."""
        with self._lock:
            since = self._pending.pop(pending.workload, None)
            self._pending[pending.workload] = pending
        if since is not None:
            self._add(since)

    def _write(self, pending: _Pending) -> bool:
        """Write the record with ``pending``'s pods, from the workload as the watch last
        delivered it, else as read; after a conflict, read again and recompute
        (``rewrite``). ``False``: the workload is gone (or replaced)."""
        with self._lock:
            known = self._workloads.get(pending.workload)
        base = (known.version, known.record) if known is not None and known.version else None
        if base is None:
            base = self._read_record(pending)
            if base is None:
                return False

        def reread() -> bool:
            nonlocal base
            fresh = self._read_record(pending)
            base = fresh if fresh is not None else base
            return fresh is not None

        def write() -> dict[str, Any]:
            version, current = base
            record = current or Record()
            for pod, counted in pending.pods.values():
                record = record.add(pod, counted)
            if current is not None and record == current:
                return {}  # every pod already recorded
            return self._patch(pending, record.text(), version)

        written = rewrite(write, reread, self._conflict)
        if written is None:
            return False
        if written:
            self.counters["writes"] += 1
            self.counters["recorded"] += len(pending.pods)
            meta = written.get("metadata") or {}
            with self._lock:
                if known is not None:
                    known.version = str(meta.get("resourceVersion") or "")
                    known.text = _annotation(meta)
        return True

    def _conflict(self) -> None:
        self.counters["conflicts"] += 1
        self.writes.conflict()

    def _read_record(self, pending: _Pending) -> tuple[str, Record | None] | None:
        """The workload's resourceVersion and record, read; ``None``: gone or replaced."""
        kind, namespace, uid = pending.workload
        obj = self._read(kind, namespace, pending.name)
        if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
            return None
        return str(obj["metadata"].get("resourceVersion") or ""), Record.of(obj)

    def _read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.workloads.read(kind, namespace, name)

    def _patch(self, pending: _Pending, text: str, version: str) -> dict[str, Any]:
        """A merge patch of our one annotation, with the resourceVersion it was computed
        from: the API server refuses it (409) if the workload changed since."""
        kind, namespace, _ = pending.workload
        return self.workloads.write_record(kind, namespace, pending.name, text, version)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "workloads": len(self._workloads)}
