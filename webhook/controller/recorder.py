"""The leader writes each annotated workload's failure history onto the workload.

It watches failed pods of Jobs (as the admission workers do) and, for each pod of a
workload that asked for something a later attempt learns from (``history.RECORDED``:
memory raises, avoided nodes, the attempt's env, retry delays), adds the failure to the
workload's record (``webhook.cluster.record``): the Job's, or for a JobSet's pods (and a
TrainJob's, whose JobSet it is) the JobSet's, which outlives the child Jobs a restart
deletes. Writes are batched per workload (``window`` seconds) and carry the
``resourceVersion`` they were computed from: on 409 Conflict the workload is read again
and the record recomputed, so a concurrent writer's change is never lost. A pod the record
already holds (its mark) is never added twice, however often a relist delivers it.

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

from webhook.cluster.history import JOBSET_UID, jobset_place, wants_history
from webhook.cluster.informer import Informer, short_error
from webhook.cluster.record import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    Record,
    text_of,
)
from webhook.controller.records import Workloads
from webhook.kube.failurepolicy import PodFailure, counts, evaluate
from webhook.kube.objects import controller_of

log = logging.getLogger(__name__)


def _annotation(meta: Mapping[str, Any]) -> str | None:
    return text_of({"metadata": meta})


JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
#: Tries of one write against concurrent writers (each a read and a write).
TRIES = 5


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


@dataclass
class _Pending:
    workload: tuple[str, str]  # (kind, uid)
    namespace: str
    name: str
    pods: list[tuple[Mapping[str, Any], bool]] = field(default_factory=list)


class HistoryRecorder:
    """A reconciler (``webhook.controller.manager.Reconciler``)."""

    name = "history"

    def __init__(self, api_client: Any, window: float = 0.5):
        from kubernetes import client

        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.workloads = Workloads(api_client)
        self.window = window
        self._lock = threading.Lock()
        #: (kind, uid) -> the workloads whose pods are recorded (Jobs whose template
        #: carries a recorded key; every JobSet, once one of its pods asked).
        self._workloads: dict[tuple[str, str], _Workload] = {}
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._rule_sets: dict[str, tuple] = {}
        self._jobsets: Informer | None = None
        self.counters = {"writes": 0, "conflicts": 0, "errors": 0, "recorded": 0}

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
        key = ("job", uid)
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
        with self._lock:
            if event == "DELETED":
                self._workloads.pop(("jobset", uid), None)
                return
            self._workloads[("jobset", uid)] = _Workload(
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
        if not wants_history(meta):
            return
        owner = controller_of(meta)
        if owner is None or owner.get("kind") != "Job" or not owner.get("uid"):
            return
        namespace = str(meta.get("namespace") or "")
        place = jobset_place(meta)
        labels = meta.get("labels") or {}
        if place is not None and isinstance(labels.get(JOBSET_NAME), str):
            key, name = ("jobset", place[0]), labels[JOBSET_NAME]
            self._watch_jobsets()
        elif labels.get("jobset.sigs.k8s.io/replicatedjob-name") and not labels.get(JOBSET_UID):
            return  # a JobSet older than v0.9.0: no record can outlive its child Jobs
        else:
            key, name = ("job", str(owner["uid"])), str(owner.get("name") or "")
        with self._lock:
            job = self._workloads.get(("job", str(owner["uid"])))
            rules = job.rules if job is not None else ()
            pending = self._pending.setdefault(key, _Pending(key, namespace, name))
        counted = counts(evaluate(rules, PodFailure.from_pod(pod))) if rules else True
        with self._lock:
            pending.pods.append((pod, counted))

    # --- the writes -------------------------------------------------------------------------
    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, {}
        for pending in batch.values():
            try:
                self._write(pending)
            except Exception as err:  # the loop must outlive any one workload
                self.counters["errors"] += 1
                log.warning(
                    "history of %s %s/%s not written: %s",
                    pending.workload[0],
                    pending.namespace,
                    pending.name,
                    short_error(err),
                )

    def _write(self, pending: _Pending) -> None:
        kind, uid = pending.workload
        with self._lock:
            known = self._workloads.get(pending.workload)
        version = known.version if known is not None else ""
        current = known.record if known is not None else None
        for _ in range(TRIES):
            if not version:
                obj = self._read(kind, pending.namespace, pending.name)
                if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
                    return  # gone (or replaced): nothing to keep the history on
                version = str(obj["metadata"].get("resourceVersion") or "")
                current = Record.of(obj)
            record = current or Record()
            for pod, counted in pending.pods:
                record = record.add(pod, counted)
            if current is not None and record == current:
                return  # every pod already recorded
            try:
                written = self._patch(kind, pending, record.text(), version)
            except Exception as err:
                status = getattr(err, "status", None)
                if status == 409:
                    self.counters["conflicts"] += 1
                    version = ""  # read again and recompute
                    continue
                if status == 404:
                    return
                raise
            self.counters["writes"] += 1
            self.counters["recorded"] += len(pending.pods)
            meta = written.get("metadata") or {}
            with self._lock:
                if known is not None:
                    known.version = str(meta.get("resourceVersion") or "")
                    known.text = _annotation(meta)
            return
        raise RuntimeError(f"{TRIES} conflicting writes in a row")

    def _read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.workloads.read(kind, namespace, name)

    def _patch(self, kind: str, pending: _Pending, text: str, version: str) -> dict[str, Any]:
        """A merge patch of our one annotation, with the resourceVersion it was computed
        from: the API server refuses it (409) if the workload changed since."""
        return self.workloads.write_record(kind, pending.namespace, pending.name, text, version)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "workloads": len(self._workloads)}
