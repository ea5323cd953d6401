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
A kind whose child Jobs are told with it, as a whole (a JobSet's:
``webhook.kinds.jobset.audits``), says so in its ``KindSpec`` (``whole_audit``): this
reporter hands it those Jobs, and holds it until it says it is ready, or ``grace`` seconds
after it ended.

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
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from webhook.cluster.events import Event, Regarding
from webhook.cluster.informer import Informer
from webhook.cluster.record import Record
from webhook.controller.jobwatch import SharedJobs
from webhook.controller.recorder import audited
from webhook.controller.records import Workloads
from webhook.controller.writes import Writes, rewrite
from webhook.kinds.registry import KINDS, WORKLOADS
from webhook.kinds.services import WholeAudit
from webhook.kube.objects import controller_of, mapping
from webhook.plan.audit import AuditRecord
from webhook.plan.replay import CRONJOB_PART, Replay, ended, replay

log = logging.getLogger(__name__)

REASON = "RetryPolicyAudit"
#: Ended Jobs waiting for their record, at most (the oldest go first: told by a relist).
MAX_WAITING = 10_000


class AuditReporter:
    """A reconciler (``webhook.controller.manager.Reconciler``), and the host of the kinds'
    ``WholeAudit`` (``webhook.kinds.services.AuditHost``)."""

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
        self.counters = {"told": 0, "errors": 0}
        #: The kinds whose child Jobs are told with them, as a whole, by kind.
        self.wholes: dict[str, WholeAudit] = {
            spec.kind: spec.whole_audit.load()(self)
            for spec in KINDS
            if spec.whole_audit is not None
        }

    @property
    def lock(self) -> threading.Lock:
        return self._lock

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
        whole = self.wholes.get(str(owner.get("kind")))
        if whole is not None and isinstance(owner.get("uid"), str):
            whole.child(event, job, owner["uid"])
        with self._lock:
            if event == "DELETED" or not candidate(job, self.wholes):
                self.release(uid)
                return
            self.hold(uid, job)

    def hold(self, uid: str, obj: Mapping[str, Any]) -> None:
        """Wait with ``obj`` until it is ready (called with the lock held)."""
        since = self._waiting[uid][0] if uid in self._waiting else self.clock()
        self._waiting[uid] = (since, obj)
        while len(self._waiting) > MAX_WAITING:
            del self._waiting[next(iter(self._waiting))]

    def release(self, uid: str) -> None:
        self._waiting.pop(uid, None)

    def audited(self, metadata: Mapping[str, Any]) -> bool:
        return audited(metadata)

    def watch(
        self, name: str, listing: Callable[..., Any], apply: Callable[[str, Any], None]
    ) -> bool:
        """A watch of a ``WholeAudit``'s own, once this reporter runs."""
        if not hasattr(self, "_stop"):
            return False
        informer = Informer(name, listing, lambda: None, apply, {}, self._stop, "controller")
        self.watches.append(informer)
        threading.Thread(target=informer.run, name=name, daemon=True).start()
        return True

    def flush(self) -> None:
        """Tell each ended Job whose failures are recorded (or whose grace is over)."""
        with self._lock:
            ready = [
                (uid, job) for uid, (since, job) in self._waiting.items() if self._ready(since, job)
            ]
        for uid, job in ready:
            if not self.writes.ready(uid):
                continue
            whole = self.wholes.get(str(job.get("kind")))
            try:
                whole.tell(job) if whole is not None else self.tell(job)
            except Exception as err:  # the loop must outlive any one workload
                self.counters["errors"] += 1
                regarding = whole.regarding(job) if whole is not None else WORKLOADS.of_job(job)
                what = f"the audit of {whole.kind if whole is not None else 'Job'} {_name(job)}"
                if self.writes.failed(uid, err, regarding, what):
                    continue
            with self._lock:
                if self._waiting.get(uid, (0, None))[1] is job:
                    del self._waiting[uid]

    def _ready(self, since: float, job: Mapping[str, Any]) -> bool:
        whole = self.wholes.get(str(job.get("kind")))
        if whole is not None:
            return whole.ready(job) or self.clock() - since >= self.grace
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

        told = self.mark_told("job", job, judge)
        if told is None:
            return None
        current, result = told
        regarding = WORKLOADS.of_job(current)
        note = result.sentence()
        if regarding is not None and regarding.kind != "Job":
            note = f"Job {_name(current)}: {note}"
        self.told(current, regarding, note, result)
        return result

    def mark_told(self, kind: str, obj: Mapping[str, Any], judge: Callable) -> Any:
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

    def told(
        self,
        obj: Mapping[str, Any],
        regarding: Regarding | None,
        note: str,
        result: Any,  # a Replay, or what a WholeAudit tells (its verdict, saved)
    ) -> None:
        self.counters["told"] += 1
        namespace = str(mapping(obj.get("metadata")).get("namespace") or "")
        if self.metrics is not None:
            self.metrics.audited(namespace, result.verdict, result.saved)
        if self.events is not None and regarding is not None:
            self.events.emit(Event(regarding, "Normal", REASON, note, action="Audit", once=True))

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


def candidate(job: Mapping[str, Any], wholes: Collection[str] = ()) -> bool:
    """Whether ``job`` is an ended Job that may be audited and is not told yet: it carries
    the audit (record or label), or a CronJob made it and its failures were recorded; not
    the child of a kind in ``wholes``, told with it (``WholeAudit``)."""
    if not ended(job)[0]:
        return False
    meta = mapping(job.get("metadata"))
    record = Record.of(job)
    if record is not None and record.told:
        return False
    owner = controller_of(meta) or {}
    if owner.get("kind") in wholes:
        return False
    if audited(meta):
        return True
    # The recorder keeps tries only for an audited workload (a CronJob's Job: its CronJob's
    # audit, read at the Job's first failure), so a planned CronJob's Jobs cost no GET here.
    kept = record is not None and (record.tries or record.more_tries)
    return owner.get("kind") == "CronJob" and bool(kept)


def _name(job: Mapping[str, Any]) -> str:
    meta = mapping(job.get("metadata"))
    return f"{meta.get('namespace')}/{meta.get('name')}"
