"""``RetryPolicyAudit``: when an audited workload ends, what its defaults would have done.

A workload admitted under ``rollout: audit`` ran without the settings its cluster's or
namespace's defaults would have applied, and carries what they would have been
(``retry-policy.dev/audit``: ``webhook.plan.audit``). When it ends (``Complete`` or
``Failed``), this reconciler replays its real failures, as its record keeps them
(``webhook.cluster.tries``, written by ``webhook.controller.recorder``), against that plan
(``webhook.plan.replay``), and writes one Event on it in plain words, e.g. ``the defaults
would have failed it at once on exit 42 (fail-non-retriable) after attempt 1 of 3: 2
attempts, 120 s, 240 core-seconds, 480 GiB-seconds and 120 GPU-seconds saved``; and counts
it (``retry_webhook_audited_workloads_total``,
``retry_webhook_audit_saved_resource_seconds_total``).

Which Jobs: one carrying the record itself, or the label ``retry-policy.dev/managed=audit``;
and a CronJob's Job whose record keeps tries (the recorder keeps them only when its CronJob
carries the audit record), told from the CronJob's part ``spec.jobTemplate.spec`` (one GET
of the CronJob, when the Job has ended). A
CronJob's Job that never failed and carries neither is not told: nothing about it differs.
A JobSet's child Jobs are not told apart: the JobSet is, as a whole, once it ends
(``Completed`` or ``Failed``), from its own record and audit, run by run
(``webhook.kinds.jobset.replay``). JobSets are watched from the first child Job seen (a
cluster without JobSet never lists them); one is told once its record holds as many
failures of its last run as that run's child Jobs counted, or ``grace`` seconds after it
ended.

Its failures first: the last failed pod and the Job's end come on two watches, and the
recorder writes in batches. A Job is told once its record has counted as many failures as
the Job controller did (``status.failed``), or ``grace`` seconds after it ended, whatever
the record holds then (the sentence says what was not replayed); counted from when this
controller first saw it ended, not from the condition's time, which another clock wrote.

Once per workload, across controller restarts and replicas: the record's ``told`` mark is
written first, with the ``resourceVersion`` it was computed from (``webhook.controller.
records``: a 409 reads the Job again, and a Job already told is left alone); the Event and
the metrics follow only the write that landed. The Event's name is derived from what it
says (``webhook.cluster.events``), so a repeat would add nothing either.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from webhook.cluster.events import Event, Regarding, workload_of_job
from webhook.cluster.informer import Informer
from webhook.cluster.record import JOBSETS, Record
from webhook.controller.jobwatch import SharedJobs
from webhook.controller.recorder import audited
from webhook.controller.records import Workloads
from webhook.controller.writes import Writes, rewrite
from webhook.kinds.jobset import replay as jobsetreplay
from webhook.kinds.jobset.replay import JobSetReplay, replay_jobset
from webhook.kube.objects import controller_of, mapping
from webhook.kube.wellknown import JOBSET_GROUP, JOBSET_VERSION, RESTART_ATTEMPT
from webhook.plan.audit import AuditRecord
from webhook.plan.replay import CRONJOB_PART, Replay, ended, replay

log = logging.getLogger(__name__)

REASON = "RetryPolicyAudit"
#: Ended Jobs waiting for their record, at most (the oldest go first: told by a relist).
MAX_WAITING = 10_000


class AuditReporter:
    """A reconciler (``webhook.controller.manager.Reconciler``)."""

    name = "audits"

    def __init__(
        self,
        api_client: Any,
        events: Any = None,
        metrics: Any = None,
        grace: float = 60.0,
        period: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        jobs: SharedJobs | None = None,
    ):
        from kubernetes import client

        self.batch = client.BatchV1Api(api_client)
        #: The controller's one watch of Jobs, or one of its own (``webhook.controller.jobwatch``).
        self._own_jobs = jobs is None
        self.jobs = jobs if jobs is not None else SharedJobs(self.batch)
        # A relist delivers every Job again: the told mark decides.
        self.jobs.subscribe(lambda: None, lambda kind, job: self._apply_job(kind, job))
        self.workloads = Workloads(api_client)
        self.events = events
        self.metrics = metrics if hasattr(metrics, "audited") else None
        self.grace = grace
        self.period = period
        self.clock = clock
        self.writes = Writes("audit", events, metrics)
        self._lock = threading.Lock()
        #: Job UID -> since when it is seen ended, and the Job as last delivered, until
        #: it is told.
        self._waiting: dict[str, tuple[float, Mapping[str, Any]]] = {}
        #: JobSet UID -> its child Jobs (UID -> run, ``status.failed``), for whether the
        #: record holds its last run's failures (``_jobset_ready``).
        self._children: dict[str, dict[str, tuple[int, int]]] = {}
        self._jobsets: Informer | None = None
        self.counters = {"told": 0, "errors": 0}

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        self.watches = [self.jobs]
        if self._own_jobs:
            self.jobs.start(stop)
        while not stop.wait(self.period):
            self.flush()

    def _apply_job(self, event: str, job: Mapping[str, Any]) -> None:
        uid = mapping(job.get("metadata")).get("uid")
        if not isinstance(uid, str):
            return
        owner = controller_of(mapping(job.get("metadata"))) or {}
        if owner.get("kind") == "JobSet" and isinstance(owner.get("uid"), str):
            self._child(event, job, owner["uid"])
        with self._lock:
            if event == "DELETED" or not candidate(job):
                self._waiting.pop(uid, None)
                return
            since = self._waiting[uid][0] if uid in self._waiting else self.clock()
            self._waiting[uid] = (since, job)
            while len(self._waiting) > MAX_WAITING:
                del self._waiting[next(iter(self._waiting))]

    def flush(self) -> None:
        """Tell each ended Job whose failures are recorded (or whose grace is over)."""
        with self._lock:
            ready = [
                (uid, job) for uid, (since, job) in self._waiting.items() if self._ready(since, job)
            ]
        for uid, job in ready:
            if not self.writes.ready(uid):
                continue
            jobset = job.get("kind") == "JobSet"
            try:
                self.tell_jobset(job) if jobset else self.tell(job)
            except Exception as err:  # the loop must outlive any one workload
                self.counters["errors"] += 1
                regarding = _jobset_regarding(job) if jobset else workload_of_job(job)
                what = f"the audit of {'JobSet' if jobset else 'Job'} {_name(job)}"
                if self.writes.failed(uid, err, regarding, what):
                    continue
            with self._lock:
                if self._waiting.get(uid, (0, None))[1] is job:
                    del self._waiting[uid]

    def _ready(self, since: float, job: Mapping[str, Any]) -> bool:
        if job.get("kind") == "JobSet":
            return self._jobset_ready(job) or self.clock() - since >= self.grace
        record = Record.of(job) or Record()
        counted = sum(line.counted for line in record.lineages.values())
        failed = mapping(job.get("status")).get("failed")
        if not isinstance(failed, int) or counted >= failed:
            return True
        return self.clock() - since >= self.grace

    def tell(self, job: Mapping[str, Any]) -> Replay | None:
        """Replay ``job`` against its audit, mark its record told, then write the Event
        and count it; ``None`` when there is nothing to tell (not audited after all,
        already told, gone)."""
        audit = self._audit(job)
        if audit is None:
            return None
        record, part = audit

        def judge(current: Mapping[str, Any], before: Record) -> Replay | None:
            return replay(current, part, before, record.settings)

        told = self._mark_told("job", job, judge)
        if told is None:
            return None
        current, result = told
        regarding = workload_of_job(current)
        note = result.sentence()
        if regarding is not None and regarding.kind != "Job":
            note = f"Job {_name(current)}: {note}"
        self._told(current, regarding, note, result)
        return result

    def tell_jobset(self, jobset: Mapping[str, Any]) -> JobSetReplay | None:
        """As ``tell``, for an ended JobSet (``webhook.kinds.jobset.replay``): the Event on
        the JobSet."""
        audit = AuditRecord.of(jobset)
        if audit is None:
            return None

        def judge(current: Mapping[str, Any], before: Record) -> JobSetReplay | None:
            return replay_jobset(current, audit, before)

        told = self._mark_told("jobset", jobset, judge)
        if told is None:
            return None
        current, result = told
        self._told(current, _jobset_regarding(current), result.sentence(), result)
        return result

    def _mark_told(self, kind: str, obj: Mapping[str, Any], judge: Callable) -> Any:
        """``(the workload as written, judge's result)`` once the record's ``told`` mark
        landed, with the ``resourceVersion`` judged (a 409 reads it again); ``None``: told
        already, not ended, or gone."""
        meta = mapping(obj.get("metadata"))
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        current = obj
        result: Any = None

        def write() -> dict[str, Any]:
            nonlocal result
            before = Record.of(current) or Record()
            result = None if before.told else judge(current, before)
            if result is None:
                return {}
            told = replace(before, told=True)
            version = str(mapping(current.get("metadata")).get("resourceVersion") or "")
            return self.workloads.write_record(kind, namespace, name, told.text(), version)

        def reread() -> bool:
            nonlocal current
            fresh = self.workloads.read(kind, namespace, name)
            if fresh is None or mapping(fresh.get("metadata")).get("uid") != meta.get("uid"):
                return False
            current = fresh
            return True

        written = rewrite(write, reread, self.writes.conflict)
        if not written or result is None:
            return None
        self.writes.landed(str(meta.get("uid")))
        return current, result

    def _told(
        self,
        obj: Mapping[str, Any],
        regarding: Regarding | None,
        note: str,
        result: Replay | JobSetReplay,
    ) -> None:
        self.counters["told"] += 1
        namespace = str(mapping(obj.get("metadata")).get("namespace") or "")
        if self.metrics is not None:
            self.metrics.audited(namespace, result.verdict, result.saved)
        if self.events is not None and regarding is not None:
            self.events.emit(Event(regarding, "Normal", REASON, note, action="Audit", once=True))

    # --- JobSets ------------------------------------------------------------------------
    def _child(self, event: str, job: Mapping[str, Any], jobset_uid: str) -> None:
        """Keep a JobSet's child Job's run and failures (its JobSets watched from the
        first one: a cluster without JobSet never lists them)."""
        meta = mapping(job.get("metadata"))
        run = str(mapping(meta.get("labels")).get(RESTART_ATTEMPT) or "")
        failed = mapping(job.get("status")).get("failed")
        with self._lock:
            children = self._children.setdefault(jobset_uid, {})
            if event == "DELETED":
                children.pop(str(meta.get("uid")), None)
                if not children:
                    del self._children[jobset_uid]
            elif run.isdigit():
                children[str(meta.get("uid"))] = (int(run), failed if _count(failed) else 0)
            while len(self._children) > MAX_WAITING:
                del self._children[next(iter(self._children))]
        self._watch_jobsets()

    def _watch_jobsets(self) -> None:
        if self._jobsets is not None or not hasattr(self, "_stop"):
            return

        def list_jobsets(**kwargs: Any) -> Any:
            return self.workloads.custom.list_cluster_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, JOBSETS, **kwargs
            )

        self._jobsets = Informer(
            "audit-jobsets",
            list_jobsets,
            lambda: None,
            self._apply_jobset,
            {},
            self._stop,
            "controller",
        )
        self.watches.append(self._jobsets)
        threading.Thread(target=self._jobsets.run, name="audit-jobsets", daemon=True).start()

    def _apply_jobset(self, event: str, jobset: Mapping[str, Any]) -> None:
        meta = mapping(jobset.get("metadata"))
        uid = meta.get("uid")
        if not isinstance(uid, str):
            return
        with self._lock:
            if event == "DELETED" or not jobset_candidate(jobset):
                self._waiting.pop(uid, None)
                if event == "DELETED" or jobsetreplay.ended(jobset):
                    self._children.pop(uid, None)  # gone, told, or not audited
                return
            since = self._waiting[uid][0] if uid in self._waiting else self.clock()
            self._waiting[uid] = (since, {"kind": "JobSet", **jobset})
            while len(self._waiting) > MAX_WAITING:
                del self._waiting[next(iter(self._waiting))]

    def _jobset_ready(self, jobset: Mapping[str, Any]) -> bool:
        """Whether the record holds as many failures of the last run as its child Jobs
        counted (the last failed pods and the JobSet's end come on different watches).
        Called with the lock held."""
        record = Record.of(jobset) or Record()
        if record.more_tries:
            return True
        uid = str(mapping(jobset.get("metadata")).get("uid"))
        last = mapping(jobset.get("status")).get("restarts")
        last = last if _count(last) else 0
        children = self._children.get(uid, {}).values()
        failed = sum(n for run, n in children if run == last)
        return sum(t.run == last for t in record.tries) >= failed

    def _audit(self, job: Mapping[str, Any]) -> tuple[AuditRecord, Any] | None:
        """The audit that applies to ``job``, and its part: the Job's own, else its
        CronJob's (read once)."""
        own = AuditRecord.of(job)
        if own is not None:
            part = own.part("spec")
            return (own, part) if part is not None else None
        owner = controller_of(mapping(job.get("metadata"))) or {}
        if owner.get("kind") != "CronJob" or not str(owner.get("apiVersion")).startswith("batch/"):
            return None
        namespace = str(mapping(job.get("metadata")).get("namespace") or "")
        try:
            resp = self.batch.read_namespaced_cron_job(
                str(owner.get("name")), namespace, _preload_content=False
            )
        except Exception as err:
            if getattr(err, "status", None) in (403, 404):
                return None
            raise
        cron = AuditRecord.of(json.loads(resp.data))
        part = cron.part(CRONJOB_PART) if cron is not None else None
        return (cron, part) if cron is not None and part is not None else None

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "waiting": len(self._waiting)}


def candidate(job: Mapping[str, Any]) -> bool:
    """Whether ``job`` is an ended Job that may be audited and is not told yet: it carries
    the audit (record or label), or a CronJob made it and its failures were recorded."""
    if not ended(job)[0]:
        return False
    meta = mapping(job.get("metadata"))
    record = Record.of(job)
    if record is not None and record.told:
        return False
    owner = controller_of(meta) or {}
    if owner.get("kind") == "JobSet":
        return False  # told with its JobSet (``tell_jobset``)
    if audited(meta):
        return True
    # The recorder keeps tries only for an audited workload (a CronJob's Job: its CronJob's
    # audit, read at the Job's first failure), so a planned CronJob's Jobs cost no GET here.
    kept = record is not None and (record.tries or record.more_tries)
    return owner.get("kind") == "CronJob" and bool(kept)


def jobset_candidate(jobset: Mapping[str, Any]) -> bool:
    """Whether ``jobset`` is an ended JobSet whose defaults were audited, not told yet."""
    if not jobsetreplay.ended(jobset):
        return False
    record = Record.of(jobset)
    return audited(mapping(jobset.get("metadata"))) and not (record is not None and record.told)


def _jobset_regarding(jobset: Mapping[str, Any]) -> Regarding | None:
    meta = mapping(jobset.get("metadata"))
    fields = [meta.get(k) for k in ("namespace", "name", "uid")]
    if not all(isinstance(v, str) and v for v in fields):
        return None
    return Regarding.jobset(*fields)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _name(job: Mapping[str, Any]) -> str:
    meta = mapping(job.get("metadata"))
    return f"{meta.get('namespace')}/{meta.get('name')}"
