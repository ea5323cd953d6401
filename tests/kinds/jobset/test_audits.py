"""A JobSet audited as a whole (``webhook.kinds.jobset.audits``), against a host that
stands for the controller's reporter (``webhook.kinds.services.AuditHost``); the reporter
with it, end to end: ``tests/controller/test_audits.py``."""

from __future__ import annotations

import threading
import time

from webhook.cluster.events import Regarding
from webhook.kinds.jobset.audits import JobSetAudit
from webhook.kube.wellknown import JOBSET_API_VERSION, RESTART_ATTEMPT


class Host:
    def __init__(self, running: bool = True) -> None:
        self.lock = threading.Lock()
        self.clock = time.monotonic
        self.workloads = None
        self.running = running
        self.held: dict = {}
        self.watches: list[str] = []

    def hold(self, uid, obj):
        self.held[uid] = obj

    def release(self, uid):
        self.held.pop(uid, None)

    def watch(self, name, listing, apply):
        if self.running:
            self.watches.append(name)
        return self.running

    def audited(self, metadata):
        return True


def child(uid: str, run: int, failed: int) -> dict:
    labels = {RESTART_ATTEMPT: str(run)}
    return {"metadata": {"uid": uid, "labels": labels}, "status": {"failed": failed}}


def a_jobset(*conditions: str) -> dict:
    status = {"restarts": 0, "conditions": [{"type": c, "status": "True"} for c in conditions]}
    return {"metadata": {"namespace": "ml", "name": "train", "uid": "set"}, "status": status}


def test_its_jobsets_are_watched_once_from_the_first_child_seen_while_running():
    idle = JobSetAudit(Host(running=False))
    idle.child("ADDED", child("a", 0, 0), "set")
    assert idle.host.watches == []
    audit = JobSetAudit(Host())
    for uid in ("a", "b"):
        audit.child("ADDED", child(uid, 0, 0), "set")
    assert audit.host.watches == ["audit-jobsets"]


def test_it_is_ready_once_its_record_holds_what_its_last_runs_jobs_counted():
    audit = JobSetAudit(Host())
    assert audit.ready(a_jobset("Completed"))
    audit.child("ADDED", child("a", 0, 2), "set")
    audit.child("ADDED", child("b", 0, 0), "set")
    assert not audit.ready(a_jobset("Completed"))  # 2 failures, none recorded
    audit.child("DELETED", child("a", 0, 2), "set")
    assert audit.ready(a_jobset("Completed"))


def test_an_ended_jobset_is_held_until_told_and_one_running_is_not():
    audit = JobSetAudit(Host())
    audit._apply("MODIFIED", a_jobset())
    assert audit.host.held == {}
    audit._apply("MODIFIED", a_jobset("Failed"))
    assert audit.host.held["set"]["kind"] == "JobSet"
    audit._apply("DELETED", a_jobset("Failed"))
    assert audit.host.held == {}
    assert audit.regarding(a_jobset()) == Regarding(
        JOBSET_API_VERSION, "JobSet", "ml", "train", "set"
    )
