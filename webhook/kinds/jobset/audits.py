"""A JobSet's audit, told as a whole (``webhook.kinds.services.WholeAudit``): its child
Jobs are not told apart; the JobSet is, once it ends (``Completed`` or ``Failed``), from
its own record and audit, run by run (``webhook.kinds.jobset.replay``). JobSets are
watched from the first child Job seen (a cluster without JobSet never lists them); one is
told once its record holds as many failures of its last run as that run's child Jobs
counted, or the reporter's grace after it ended (``webhook.controller.audits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.cluster.events import Regarding
from webhook.cluster.record import JOBSETS, Record
from webhook.kinds.jobset import replay as jobsetreplay
from webhook.kinds.jobset.replay import JobSetReplay, replay_jobset
from webhook.kinds.services import AuditHost
from webhook.kube.objects import mapping
from webhook.kube.wellknown import JOBSET_API_VERSION, JOBSET_GROUP, JOBSET_VERSION, RESTART_ATTEMPT
from webhook.plan.audit import AuditRecord

#: JobSets whose child Jobs are kept, at most (the oldest go first).
MAX_KEPT = 10_000


class JobSetAudit:
    """The audit reporter's part for JobSets (``webhook.kinds.services.WholeAudit``)."""

    kind = "JobSet"

    def __init__(self, host: AuditHost) -> None:
        self.host = host
        #: JobSet UID -> its child Jobs (UID -> run, ``status.failed``), for whether the
        #: record holds its last run's failures (``ready``).
        self._children: dict[str, dict[str, tuple[int, int]]] = {}
        self._watched = False

    def child(self, event: str, job: Mapping[str, Any], owner_uid: str) -> None:
        """Keep a JobSet's child Job's run and failures (its JobSets watched from the
        first one: a cluster without JobSet never lists them)."""
        meta = mapping(job.get("metadata"))
        run = str(mapping(meta.get("labels")).get(RESTART_ATTEMPT) or "")
        failed = mapping(job.get("status")).get("failed")
        with self.host.lock:
            children = self._children.setdefault(owner_uid, {})
            if event == "DELETED":
                children.pop(str(meta.get("uid")), None)
                if not children:
                    del self._children[owner_uid]
            elif run.isdigit():
                children[str(meta.get("uid"))] = (int(run), failed if _count(failed) else 0)
            while len(self._children) > MAX_KEPT:
                del self._children[next(iter(self._children))]
        self._watch()

    def _watch(self) -> None:
        if self._watched:
            return

        def list_jobsets(**kwargs: Any) -> Any:
            return self.host.workloads.custom.list_cluster_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, JOBSETS, **kwargs
            )

        self._watched = self.host.watch("audit-jobsets", list_jobsets, self._apply)

    def _apply(self, event: str, jobset: Mapping[str, Any]) -> None:
        uid = mapping(jobset.get("metadata")).get("uid")
        if not isinstance(uid, str):
            return
        with self.host.lock:
            if event == "DELETED" or not self.candidate(jobset):
                self.host.release(uid)
                if event == "DELETED" or jobsetreplay.ended(jobset):
                    self._children.pop(uid, None)  # gone, told, or not audited
                return
            self.host.hold(uid, {"kind": self.kind, **jobset})

    def candidate(self, jobset: Mapping[str, Any]) -> bool:
        """Whether ``jobset`` is an ended JobSet whose defaults were audited, not told yet."""
        if not jobsetreplay.ended(jobset):
            return False
        record = Record.of(jobset)
        told = record is not None and record.told
        return self.host.audited(mapping(jobset.get("metadata"))) and not told

    def ready(self, jobset: Mapping[str, Any]) -> bool:
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

    def tell(self, jobset: Mapping[str, Any]) -> JobSetReplay | None:
        """As the reporter's ``tell``, for an ended JobSet (``webhook.kinds.jobset.
        replay``): the Event on the JobSet."""
        audit = AuditRecord.of(jobset)
        if audit is None:
            return None

        def judge(current: Mapping[str, Any], before: Record) -> JobSetReplay | None:
            return replay_jobset(current, audit, before)

        told = self.host.mark_told("jobset", jobset, judge)
        if told is None:
            return None
        current, result = told
        self.host.told(current, self.regarding(current), result.sentence(), result)
        return result

    def regarding(self, jobset: Mapping[str, Any]) -> Regarding | None:
        meta = mapping(jobset.get("metadata"))
        fields = [meta.get(k) for k in ("namespace", "name", "uid")]
        if not all(isinstance(v, str) and v for v in fields):
            return None
        return Regarding(JOBSET_API_VERSION, "JobSet", *fields)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
