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

from webhook.cluster.events import Event, workload_of_job
from webhook.cluster.informer import Informer
from webhook.cluster.record import Record
from webhook.controller.recorder import audited
from webhook.controller.records import Workloads
from webhook.controller.writes import Writes, rewrite
from webhook.kube.objects import controller_of, mapping
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
    ):
        from kubernetes import client

        self.batch = client.BatchV1Api(api_client)
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

    def run(self, stop: threading.Event) -> None:
        jobs = Informer(
            "audit-jobs",
            self.batch.list_job_for_all_namespaces,
            lambda: None,  # a relist delivers every Job again: the told mark decides
            self._apply_job,
            {},
            stop,
            "controller",
        )
        self.watches = [jobs]
        threading.Thread(target=jobs.run, name="audit-jobs", daemon=True).start()
        while not stop.wait(self.period):
            self.flush()

    def _apply_job(self, event: str, job: Mapping[str, Any]) -> None:
        uid = mapping(job.get("metadata")).get("uid")
        if not isinstance(uid, str):
            return
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
            try:
                self.tell(job)
            except Exception as err:  # the loop must outlive any one Job
                self.counters["errors"] += 1
                regarding = workload_of_job(job)
                what = f"the audit of Job {_name(job)}"
                if self.writes.failed(uid, err, regarding, what):
                    continue
            with self._lock:
                if self._waiting.get(uid, (0, None))[1] is job:
                    del self._waiting[uid]

    def _ready(self, since: float, job: Mapping[str, Any]) -> bool:
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
        meta = mapping(job.get("metadata"))
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        audit = self._audit(job)
        if audit is None:
            return None
        record, part = audit
        current = job
        result: Replay | None = None

        def write() -> dict[str, Any]:
            nonlocal result
            before = Record.of(current) or Record()
            result = replay(current, part, before, record.settings)
            if before.told or result is None:
                result = None
                return {}
            told = replace(before, told=True)
            version = str(mapping(current.get("metadata")).get("resourceVersion") or "")
            return self.workloads.write_record("job", namespace, name, told.text(), version)

        def reread() -> bool:
            nonlocal current
            fresh = self.workloads.read("job", namespace, name)
            if fresh is None or mapping(fresh.get("metadata")).get("uid") != meta.get("uid"):
                return False
            current = fresh
            return True

        written = rewrite(write, reread, self.writes.conflict)
        if not written or result is None:
            return None
        self.writes.landed(str(meta.get("uid")))
        self._told(current, result)
        return result

    def _told(self, job: Mapping[str, Any], result: Replay) -> None:
        self.counters["told"] += 1
        namespace = str(mapping(job.get("metadata")).get("namespace") or "")
        if self.metrics is not None:
            self.metrics.audited(namespace, result.verdict, result.saved)
        regarding = workload_of_job(job)
        if self.events is not None and regarding is not None:
            note = result.sentence()
            if regarding.kind != "Job":
                note = f"Job {_name(job)}: {note}"
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
        return False  # its JobSet's audit: not replayed yet
    if audited(meta):
        return True
    # The recorder keeps tries only for an audited workload (a CronJob's Job: its CronJob's
    # audit, read at the Job's first failure), so a planned CronJob's Jobs cost no GET here.
    kept = record is not None and (record.tries or record.more_tries)
    return owner.get("kind") == "CronJob" and bool(kept)


def _name(job: Mapping[str, Any]) -> str:
    meta = mapping(job.get("metadata"))
    return f"{meta.get('namespace')}/{meta.get('name')}"
