"""What the scale benchmarks play of a cluster besides the Job controller
(``testkit.jobsim.JobController``): a kubelet that stops each pod once its grace has
passed, the retry pod the webhook holds back behind our scheduling gate, and the
Jobs admitted with a policy.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from testkit.controllers import admitted_job
from testkit.jobsim import T0, JobRun
from webhook.kube import gates
from webhook.kube.jobcontroller import pod_from_template
from webhook.kube.wellknown import JOB_UID_LABEL
from webhook.policy.grammar import format_time


class Kubelet:
    """Runs ``stop(pod)`` (``JobRun.fail`` by default) for each pod handed to ``after``
    once its grace has passed, in the order they come due, on a thread of its own."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Callable[[], Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self.done = 0
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._thread.start()

    def after(self, grace: float, stop: Callable[[], Any]) -> None:
        with self._ready:
            heapq.heappush(self._due, (time.monotonic() + grace, next(self._order), stop))
            self._ready.notify()

    def pending(self) -> int:
        with self._ready:
            return len(self._due)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._ready:
                now = time.monotonic()
                if not self._due or self._due[0][0] > now:
                    wait = self._due[0][0] - now if self._due else 0.1
                    self._ready.wait(min(wait, 0.1))
                    continue
                _, _, stop = heapq.heappop(self._due)
            stop()
            self.done += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def gated_pod(run: JobRun, not_before: float) -> dict[str, Any]:
    """A Job's retry pod as the webhook admits it with ``retry-delay`` (``webhook.kube.gates``:
    our scheduling gate, its label, the time it may start), stored: ``Pending``."""
    pod = pod_from_template(run.job, None, 0)
    meta = pod["metadata"]
    uid = str(uuid.uuid4())
    meta.update(name=meta["generateName"] + uid[:5], uid=uid, creationTimestamp=T0)
    meta["labels"].update({JOB_UID_LABEL: run.uid, "job-name": run.name})
    meta["labels"][gates.GATED_LABEL] = gates.GATED_VALUE
    meta.setdefault("annotations", {})[gates.NOT_BEFORE] = format_time(not_before)
    pod["spec"]["schedulingGates"] = [{"name": gates.GATE}]
    pod["status"] = {"phase": "Pending"}
    run.api.put("pods", pod)
    return pod


def store_jobs(api: Any, policy: dict[str, str], prefix: str, count: int, **spec: Any):
    """``count`` Jobs admitted with ``policy`` (one admission, as a pipeline's runs are),
    stored under names and UIDs of their own."""
    import copy

    admitted = admitted_job(policy, prefix, **spec)
    runs = []
    for i in range(count):
        job = copy.deepcopy(admitted)
        job["metadata"]["name"] = f"{prefix}-{i}"
        job["metadata"]["uid"] = str(uuid.uuid4())
        runs.append(JobRun.store(api, job))
    return runs
