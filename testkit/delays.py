"""Retry delays at admission: a fixed wall clock (an autouse fixture: a module that imports
``fixed_time`` runs each test at ``NOW``), a leadership note, the attempt cache's
answers with the real failure history, a Job's pod, and the engine's verdict on it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testkit.builders import P, apply, job_owner, pod, review, stored
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster import leadership
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.cluster.history import FailureHistory
from webhook.cluster.leadership import LeaderState
from webhook.kube.jobcontroller import index_pod
from webhook.policy.config import parse_config
from webhook.policy.grammar import format_time

NOW = 1_795_000_000.0  # 2026-11-18T...: a fixed wall clock for every admission here
DELAY = {P + "retry-delay": "30s", P + "attempt-env": "true"}


@pytest.fixture(autouse=True)
def fixed_time(monkeypatch):
    """Admission reads the wall clock through ``leadership.wall``: fixed here (the
    controller's own clock is the real one, in tests/controller/test_gates.py)."""
    now = [NOW]
    monkeypatch.setattr(leadership, "wall", lambda: now[0])
    return now


class Leading:
    """A leadership note: a controller renewed the Lease just now (or never)."""

    def __init__(self, live: bool = True):
        self.live = live

    def read(self) -> LeaderState:
        if not self.live:
            return LeaderState(enabled=True, holder="", reason="standby")
        t = leadership.wall()
        return LeaderState(enabled=True, leader=True, holder="a", renewed_at=t, written_at=t)


class Source(NoCluster):
    """A Job's counted failures and budget (fixed), and the real failure history."""

    def __init__(self, failures: int = 0, budget: int | None = 6):
        self.failures = failures
        self.budget = budget
        self.history = FailureHistory()

    def job_failures(self, namespace, name, uid):
        return AttemptLookup(self.failures, "Job status (cache)", budget=self.budget)

    def job_history(self, key):
        return self.history.fetch(key)

    def stats(self):
        return {}

    def fail(self, made: dict, at: float, code: int = 1, oom: bool = False, uid="job-1"):
        """``made`` failed at ``at``: its container exited ``code`` (or was OOM-killed)."""
        failed = stored(made)
        stamp = format_time(at)
        terminated = {"exitCode": 137 if oom else code, "finishedAt": stamp}
        if oom:
            terminated["reason"] = "OOMKilled"
        failed["status"] = {
            "phase": "Failed",
            "containerStatuses": [{"name": "main", "state": {"terminated": terminated}}],
        }
        assert self.history.record(failed, uid, True)


def job_pod(
    policy: dict | None = None,
    uid: str = "job-1",
    index: int | None = None,
    index_failures: int | None = None,
    **meta,
) -> dict:
    """A pod of Job ``train`` as its CREATE review carries it; ``meta``: more
    annotations and labels; with ``index``, an Indexed Job's pod of that index
    (``index_pod``)."""
    made = pod({**DELAY, **(policy or {})}, owner=job_owner("train", uid))
    for key, value in meta.items():
        made["metadata"].setdefault(key, {}).update(value)
    if index is not None:
        index_pod(made, "train", index, index_failures)
    return made


NO_CONFIG = parse_config("{}")


def admit(obj: dict, source: Any = None, live: bool = True, config=None):
    request = admission.decode(json.dumps(review(obj)))
    verdict = engine.mutate(
        request, config or NO_CONFIG, source or Source(), leadership=Leading(live)
    )
    return verdict, apply(obj, verdict.patch)
