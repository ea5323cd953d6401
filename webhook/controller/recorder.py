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

A workload whose record another reconciler patches anyway (its disruption counts:
``webhook.controller.disruptions``; its free failures: ``webhook.controller.freebudget``)
gets its pending pods in that patch (``takers``, ``take``): one patch where two would
race, the second refused (409), read again and sent again. The pods come back to this
queue unless that patch lands, and what they wasted is counted when it does.

A workload is known by its namespace and UID: a pod names its Job or JobSet by UID labels
(and owner references) that a pod in another namespace could carry as well, and feeds only
the workload of that UID in its own namespace.

Whether a failure counted is the Job controller's judgement, made the same way here: the
child Job's rules on the pod (``matchPodFailurePolicy``; an ``Ignore`` rule's failures do
not count).

Every failed pod of a workload the webhook applied a retry plan to is recorded, not only
those whose later attempts learn from it, so that what the failures wasted
(``webhook.cluster.waste``) is counted once each: when the write that marks the pod in
the record lands. A pod the record already marks is never counted again (a relist, a
restarted controller, a new leader); a write whose answer was lost counts nothing (the
next one finds the pod marked), so a failure is counted at most once. A workload has a
plan when it carries ``retry-policy.dev/applied``, or its pod template our annotations or
labels; a CronJob's Jobs carry the CronJob's plan in their spec, not its record, which is
read from the CronJob (one GET per Job, at its first failure), and a JobSet's (or
TrainJob's) pods are its JobSet's, which carries the record.

A workload admitted with audited defaults (``retry-policy.dev/audit``, or the label
``retry-policy.dev/managed=audit``; a CronJob's Job: its CronJob's) counts as having a
plan, and its record keeps what the replay of its failures needs
(``webhook.cluster.tries``), for ``webhook.controller.audits`` when it ends: a JobSet's on
the JobSet, each with the run its child Job belonged to.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster import waste
from webhook.cluster.classify import classify, of_conditions
from webhook.cluster.events import JOB_API, Regarding
from webhook.cluster.history import jobset_place, wants_history
from webhook.cluster.informer import Informer
from webhook.cluster.record import (
    JOBSETS,
    MAX_MARKS,
    Record,
    text_of,
)
from webhook.controller.interning import RuleSets
from webhook.controller.jobwatch import SharedJobs
from webhook.controller.records import CUSTOM, Workloads
from webhook.controller.writes import Writes, rewrite
from webhook.kube.failurepolicy import PodFailure, counts, evaluate
from webhook.kube.objects import controller_of, items, mapping
from webhook.kube.wellknown import (
    JOB_UID_LABEL,
    JOBSET_GROUP,
    JOBSET_NAME,
    JOBSET_UID,
    JOBSET_VERSION,
    REPLICATED_JOB,
)
from webhook.plan.audit import AUDIT, AUDITED, MANAGED
from webhook.policy.categories import Category, condition_type
from webhook.policy.config import Config
from webhook.policy.model import APPLIED, PREFIX

log = logging.getLogger(__name__)


def _annotation(meta: Mapping[str, Any]) -> str | None:
    return text_of({"metadata": meta})


#: A failed pod whose Job the watch has not delivered yet is held until it does, this long
#: at most (a Job is created before its pods, but comes on another watch: its event can be
#: late, or in a relist after a 410), for at most this many Jobs.
HOLD_SECONDS = 10.0
MAX_HELD = 256
#: Failures no later attempt learns from (none of their pods' keys asks for history: only
#: ``status``, the waste and the audit read them, and not at once) wait this long to ride
#: another write of their workload's record (its next disruption's count, its next
#: failures), one patch where each would make its own. Shorter than the audit's grace.
LINGER_SECONDS = 10.0


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
    #: Whether the webhook applied a retry plan to it (``planned``); ``None``: a Job a
    #: CronJob made (``cronjob``: its name), whose plan its CronJob's record tells.
    managed: bool | None = True
    cronjob: str = ""
    #: Whether its defaults were audited (``webhook.plan.audit``): the record then keeps
    #: what the replay needs of each failure (``webhook.cluster.tries``). ``None``: a
    #: CronJob's Job, whose CronJob tells.
    audited: bool | None = False

    @property
    def record(self) -> Record | None:
        return Record.parse(self.text)


#: A workload: (kind, namespace, UID), kind "job" or "jobset".
Key = tuple[str, str, str]


def planned(metadata: Mapping[str, Any], template: Mapping[str, Any] | None = None) -> bool:
    """Whether the webhook applied a retry plan to a workload: its ``applied`` record, or
    (for a Job) our annotations or labels on its pod template, which a Job made from a
    CronJob's or JobSet's template carries too; or one it would have applied, had the
    defaults been enforced (``audited``)."""
    if APPLIED in mapping(metadata.get("annotations")) or audited(metadata):
        return True
    template = template or {}
    return any(
        isinstance(k, str) and k.startswith(PREFIX)
        for field_ in ("annotations", "labels")
        for k in mapping(template.get(field_))
    )


def audited(metadata: Mapping[str, Any]) -> bool:
    """Whether a workload's defaults were audited: its ``audit`` record, or its label."""
    return AUDIT in mapping(metadata.get("annotations")) or (
        mapping(metadata.get("labels")).get(MANAGED) == AUDITED
    )


@dataclass
class _Pending:
    workload: Key
    name: str
    #: Pod UID -> (the failed pod, whether it counted, whether it is recorded whatever its
    #: workload: its own keys ask for history), oldest first.
    pods: dict[str, tuple[Mapping[str, Any], bool, bool]] = field(default_factory=dict)
    #: When its first pod was queued (``time.monotonic``).
    since: float = field(default_factory=time.monotonic)

    def lingers(self, now: float, linger: float) -> bool:
        """Whether it may wait for another write (``LINGER_SECONDS``)."""
        return now - self.since < linger and not any(e[2] for e in self.pods.values())

    def regarding(self) -> Regarding:
        kind, namespace, uid = self.workload
        if kind == "job":
            return Regarding(JOB_API, "Job", namespace, self.name, uid)
        custom = CUSTOM[kind]  # a kind declared read: "jobset"
        return Regarding(custom.api_version, custom.kind, namespace, self.name, uid)

    def unwritten(self) -> str:
        """What a write that failed would have recorded (the log's and Event's words)."""
        ref = self.regarding()
        names = [
            str((pod.get("metadata") or {}).get("name") or "") for pod, *_ in self.pods.values()
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
        self,
        api_client: Any,
        window: float = 0.5,
        events: Any = None,
        metrics: Any = None,
        jobs: SharedJobs | None = None,
        config: Callable[[], Config] = Config,
        linger: float = LINGER_SECONDS,
    ):
        from kubernetes import client

        #: The cluster config as it is now: its failure categories name the waste's causes.
        self.config = config
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.workloads = Workloads(api_client)
        self.window = window
        self.linger = linger
        self._lock = threading.Lock()
        #: (kind, namespace, uid) -> the workloads whose pods may be recorded (Jobs with a
        #: plan, and a CronJob's Jobs; every JobSet, once one of its pods failed).
        self._workloads: dict[Key, _Workload] = {}
        self._pending: dict[Key, _Pending] = {}
        #: Job key -> (since when, its name, its failed pods by UID), until the Job comes.
        self._held: dict[Key, tuple[float, str, dict[str, Mapping[str, Any]]]] = {}
        self._rule_sets = RuleSets()
        self._jobsets: Informer | None = None
        self.counters = {"writes": 0, "conflicts": 0, "errors": 0, "recorded": 0}
        self.writes = Writes("history", events, metrics)
        #: The controller's metrics, when they count waste (``ControllerMetrics.wasted``).
        self.metrics = metrics if hasattr(metrics, "wasted") else None
        #: The controller's one watch of Jobs, or one of its own (``webhook.controller.jobwatch``).
        self._own_jobs = jobs is None
        self.jobs = jobs if jobs is not None else SharedJobs(self.batch)
        self.jobs.subscribe(
            lambda: self._reset("job"), lambda kind, job: self._apply_job(kind, job)
        )
        #: Whether another writer patches the record of a workload (namespace, UID) anyway
        #: and takes its pending pods along (``take``): ``Disruptions`` and the free
        #: budgets (``Verdicts``) join.
        self.takers: list[Callable[[str, str], bool]] = []

    # --- the watches ------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
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
        self.watches = [self.jobs, pods]
        if self._own_jobs:
            self.jobs.start(stop)
        self.jobs.synced.wait(30)  # a pod's Job (its rules) before the pod, where it can
        threading.Thread(target=pods.run, name="recorder-pods", daemon=True).start()
        while not stop.wait(self.window):
            self.flush()
        self.flush(final=True)

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
        with self._lock:
            known = self._workloads.get(key)
            found = None if event == "DELETED" else self._job_workload(job, known)
            if found is None:
                self._workloads.pop(key, None)
            else:
                self._workloads[key] = found
            held = self._held.pop(key, None)
        if held is not None and found is not None:
            for uid, pod in held[2].items():
                counted = (
                    counts(evaluate(found.rules, PodFailure.from_pod(pod))) if found.rules else True
                )
                self._add(_Pending(key, held[1], {uid: (pod, counted, False)}))

    def _job_workload(self, job: Mapping[str, Any], known: _Workload | None) -> _Workload | None:
        """What is kept of a Job (called with the lock held): one with a plan, or one a
        CronJob made (its CronJob's record, once read, kept from ``known``); ``None``
        for any other."""
        meta = job.get("metadata") or {}
        template = ((job.get("spec") or {}).get("template") or {}).get("metadata") or {}
        owner = controller_of(meta) or {}
        made_by_cronjob = owner.get("kind") == "CronJob" and str(
            owner.get("apiVersion") or ""
        ).startswith("batch/")
        managed: bool | None = wants_history(template) or planned(meta, template)
        audit: bool | None = audited(meta)
        if made_by_cronjob and not audit:
            audit = known.audited if known is not None else None
        if not managed:
            if not made_by_cronjob:
                return None
            managed = known.managed if known is not None else None
        policy = (job.get("spec") or {}).get("podFailurePolicy") or {}
        rules = tuple(policy.get("rules") or ())
        ignores = any(isinstance(r, dict) and r.get("action") == "Ignore" for r in rules)
        return _Workload(
            "job",
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            str(meta.get("resourceVersion") or ""),
            _annotation(meta),
            self._rule_sets.shared(rules) if ignores else (),
            managed,
            str(owner.get("name") or "") if made_by_cronjob else "",
            audit,
        )

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
            self._workloads[key] = _jobset_workload(jobset)

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
        if not meta.get("uid"):
            return
        owner = controller_of(meta)
        if owner is None or owner.get("kind") != "Job" or not owner.get("uid"):
            return
        namespace = str(meta.get("namespace") or "")
        if not namespace:
            return
        wanted = wants_history(meta)
        place = jobset_place(meta)
        labels = meta.get("labels") or {}
        with self._lock:
            job = self._workloads.get(("job", namespace, str(owner["uid"])))
        key: Key
        if place is not None and isinstance(labels.get(JOBSET_NAME), str):
            # Whether its JobSet has a plan is read from the JobSet when it is written.
            key, name = ("jobset", namespace, place[0]), labels[JOBSET_NAME]
            self._watch_jobsets()
        elif labels.get(REPLICATED_JOB) and not labels.get(JOBSET_UID):
            return  # a JobSet older than v0.9.0: no record can outlive its child Jobs
        elif wanted or (job is not None and job.managed is not False):
            key, name = ("job", namespace, str(owner["uid"])), str(owner.get("name") or "")
        elif job is None:
            self._hold(("job", namespace, str(owner["uid"])), str(owner.get("name") or ""), pod)
            return
        else:
            return  # a Job without a plan
        rules = job.rules if job is not None else ()
        counted = counts(evaluate(rules, PodFailure.from_pod(pod))) if rules else True
        self._add(_Pending(key, name, {str(meta.get("uid") or ""): (pod, counted, wanted)}))

    def _hold(self, key: Key, name: str, pod: Mapping[str, Any]) -> None:
        """Keep a failed pod of a Job not seen yet until it is (``_apply_job``)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        with self._lock:
            since, _, pods = self._held.pop(key, None) or (time.monotonic(), name, {})
            if len(pods) < MAX_MARKS:
                pods[uid] = pod
            self._held[key] = (since, name, pods)
            while len(self._held) > MAX_HELD:
                del self._held[next(iter(self._held))]

    def _expire_held(self) -> None:
        """Drop the pods whose Job did not come in time: a Job without a plan, or gone."""
        cutoff = time.monotonic() - HOLD_SECONDS
        with self._lock:
            for key in [k for k, (since, *_) in self._held.items() if since < cutoff]:
                del self._held[key]

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
    def flush(self, final: bool = False) -> None:
        """Write each workload's pending failures that are due (``final``: all); a write
        that failed stays pending (its back-off, then again), one refused is given up
        (``webhook.controller.writes``)."""
        self._expire_held()
        with self._lock:
            batch, self._pending = self._pending, {}
        now = time.monotonic()
        for key, pending in batch.items():
            if not final and pending.lingers(now, self.linger):
                self._requeue(pending)
                continue
            if not self.writes.ready(key) or self._handed(pending):
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
        (``rewrite``). ``False``: the workload is gone (or replaced). What the pods it
        marked wasted is counted once it lands."""
        with self._lock:
            known = self._workloads.get(pending.workload)
        if known is None or not known.version:
            known = self._read_workload(pending)
            if known is None:
                return False
        if not self._keep_planned(pending, known):
            return True  # nothing of a workload without a plan is recorded
        base = (known.version, known.record)
        history = History(self, pending, known)

        def reread() -> bool:
            nonlocal base
            fresh = self._read_workload(pending)
            base = (fresh.version, fresh.record) if fresh is not None else base
            return fresh is not None

        def write() -> dict[str, Any]:
            version, current = base
            record = history.apply(current or Record())
            if current is not None and record == current:
                return {}  # every pod already recorded
            return self._patch(pending, record.text(), version)

        written = rewrite(write, reread, self._conflict)
        if written is None:
            return False
        if written:
            self.counters["writes"] += 1
            history.landed(written)
        return True

    # --- the pods another writer's patch takes along (``webhook.controller.disruptions``) ---
    def waiting(self) -> set[tuple[str, str]]:
        """The workloads (namespace, UID) with pods pending and due (not lingering: they
        ride a write their workload gets anyway, or wait their turn)."""
        now = time.monotonic()
        with self._lock:
            return {
                (namespace, uid)
                for (_, namespace, uid), pending in self._pending.items()
                if not pending.lingers(now, self.linger)
            }

    def take(self, namespace: str, uid: str) -> History | None:
        """The pods pending for the workload, for another writer's patch of its record
        (``takers``): they leave the queue, and come back if that patch does not land
        (``along``). ``None``: none, or its plan not known yet (a CronJob's
        Job: a read, which this recorder makes when it writes them itself)."""
        with self._lock:
            for kind in ("job", "jobset"):
                key = (kind, namespace, uid)
                known = self._workloads.get(key)
                if key in self._pending and known is not None and _resolved(known):
                    pending = self._pending.pop(key)
                    break
            else:
                return None
        if not self._keep_planned(pending, known):
            return None
        return History(self, pending, known)

    def _handed(self, pending: _Pending) -> bool:
        """Whether ``pending``'s pods wait for a writer that patches their workload's
        record anyway (``takers``: its disruption or free-failure counts), to go in its
        patch."""
        _, namespace, uid = pending.workload
        with self._lock:
            known = self._workloads.get(pending.workload)
        if known is None or not _resolved(known):
            return False
        return any(takes(namespace, uid) for takes in self.takers)

    def _keep_planned(self, pending: _Pending, workload: _Workload) -> bool:
        """Leave in ``pending`` the pods to record: all of them when the workload has a plan
        (a CronJob's Job: its CronJob's record, read once), else those whose own keys ask
        for history. Whether any are left."""
        if workload.managed is None or workload.audited is None:
            plan, audit = self._cronjob_planned(workload.namespace, workload.cronjob)
            workload.managed = plan if workload.managed is None else workload.managed
            workload.audited = audit if workload.audited is None else workload.audited
        if all(wanted for *_, wanted in pending.pods.values()):
            return True
        if not workload.managed:
            pending.pods = {uid: e for uid, e in pending.pods.items() if e[2]}
        return bool(pending.pods)

    def _cronjob_planned(self, namespace: str, name: str) -> tuple[bool, bool]:
        """Whether the CronJob has a plan (its ``applied`` record), and whether its
        defaults were audited. Gone, or not ours to read (403: the chart grants it only
        with ``webhook.kinds.cronJobs``, without which no CronJob has a plan): no. Raises
        when the API fails (the pods stay pending, tried again after a back-off:
        ``webhook.controller.writes``)."""
        try:
            resp = self.batch.read_namespaced_cron_job(name, namespace, _preload_content=False)
        except Exception as err:
            if getattr(err, "status", None) in (403, 404):
                return False, False
            raise
        meta = mapping(json.loads(resp.data).get("metadata"))
        return planned(meta), audited(meta)

    def _count_waste(self, namespace: str, pods: list[Mapping[str, Any]]) -> None:
        """What the pods just marked wasted (``webhook.cluster.waste``), once each."""
        if self.metrics is None:
            return
        for pod in pods:
            why = waste.cause(pod, self.config().categories)
            for resource, amount in waste.wasted(pod).items():
                self.metrics.wasted(namespace, why, resource, amount)

    def _conflict(self) -> None:
        self.counters["conflicts"] += 1
        self.writes.conflict()

    def _read_workload(self, pending: _Pending) -> _Workload | None:
        """The workload as read (its resourceVersion, record and plan); ``None``: gone or
        replaced."""
        kind, namespace, uid = pending.workload
        obj = self._read(kind, namespace, pending.name)
        if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
            return None
        if kind == "jobset":
            return _jobset_workload(obj)
        with self._lock:
            found = self._job_workload(obj, self._workloads.get(pending.workload))
        # A Job without a plan: its pods' own keys are what is recorded.
        return found or _Workload(
            "job", namespace, pending.name, *_version_and_text(obj), managed=False
        )

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


class History:
    """Pods pending for one workload's record, and what becomes of them once written: the
    recorder's own patch, or another writer's that takes them along (``take``)."""

    def __init__(self, recorder: HistoryRecorder, pending: _Pending, known: _Workload):
        self.recorder = recorder
        self.pending = pending
        self.known = known
        #: The pods the last ``apply`` newly marked.
        self.marked: list[Mapping[str, Any]] = []
        #: Written, or found all recorded already: nothing goes back to the queue.
        self.done = False

    def apply(self, record: Record) -> Record:
        """``record`` with the pods added (each once: a pod it marks stays as it is)."""
        self.marked = []
        audit = bool(self.known.audited)
        for pod, counted, _ in self.pending.pods.values():
            if audit:  # its replay judges the audited rules on its category
                pod = categorized(pod, self.recorder.config().categories)
            added = record.add(pod, counted, audit)
            if added is not record:
                self.marked.append(pod)
            record = added
        return record

    def landed(self, written: Mapping[str, Any]) -> None:
        """The patch with them landed (``written``: the workload as it answered): what the
        pods it marked wasted is counted, once each."""
        self.done = True
        recorder = self.recorder
        recorder.writes.forget(self.pending.workload)  # (a back-off of its own ends)
        recorder._count_waste(self.pending.workload[1], self.marked)
        meta = written.get("metadata") or {}
        with recorder._lock:  # (another writer's thread, when its patch took them)
            recorder.counters["recorded"] += len(self.pending.pods)
            self.known.version = str(meta.get("resourceVersion") or "")
            self.known.text = _annotation(meta)

    def returned(self) -> None:
        """The patch that took them did not land: pending again, first in the queue."""
        self.recorder._requeue(self.pending)


@contextmanager
def along(recorder: HistoryRecorder | None, namespace: str, uid: str) -> Iterator[History | None]:
    """The history's pods pending for a workload, for another writer's patch of its record
    (``HistoryRecorder.take``): back in the recorder's queue, first, unless they were
    written (``History.done``), whatever became of the patch."""
    history = recorder.take(namespace, uid) if recorder is not None else None
    try:
        yield history
    finally:
        if history is not None and not history.done:
            history.returned()


def _resolved(workload: _Workload) -> bool:
    """Whether a workload's plan is known without a read (a CronJob's Job: once read)."""
    return workload.managed is not None and workload.audited is not None


def categorized(pod: Mapping[str, Any], configured: Sequence[Category]) -> Mapping[str, Any]:
    """The pod with its failure category as a condition: the one the controller wrote
    (``webhook.controller.verdicts``), else what the classifier makes of the pod alone
    (the recorder may see the pod before the category's write)."""
    if of_conditions(pod) is not None:
        return pod
    found = classify(pod, configured)
    status = dict(mapping(pod.get("status")))
    condition = {"type": condition_type(found.category), "status": "True", "reason": found.signal}
    status["conditions"] = [*items(status.get("conditions")), condition]
    return {**pod, "status": status}


def _version_and_text(obj: Mapping[str, Any]) -> tuple[str, str | None]:
    meta = obj.get("metadata") or {}
    return str(meta.get("resourceVersion") or ""), _annotation(meta)


def _jobset_workload(jobset: Mapping[str, Any]) -> _Workload:
    meta = jobset.get("metadata") or {}
    return _Workload(
        "jobset",
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        *_version_and_text(jobset),
        managed=planned(meta),
        audited=audited(meta),
    )
