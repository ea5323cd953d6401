"""The backlog after a zone's worth of nodes is lost: ``python -m benchmarks.backlog``.

``jobs`` Jobs of ``pods_per_job`` running pods each (1,000 of 8: 8,000 pods), admitted
with ``ignore-disruptions`` and ``max-disruptions: 3``, spread over ``nodes`` nodes so
that each node runs pods of different Jobs (1,000 nodes of 8 pods). The nodes are lost
one after another, evenly over ``seconds`` (60): for each of a lost node's pods, PodGC
sets ``Failed`` and ``DisruptionTarget`` in one status update, then deletes it
(``testkit.jobsim.JobRun.podgc``); the played Job controller judges them once a second
(``testkit.jobsim.JobController``: the Ignore rule on ``DisruptionTarget``, the tracking
finalizer removed, the pod gone).

The controller (real, its own process: ``benchmarks.leader``) must count every
disruption on its Job (the first 3 of each free, the other 5 over the budget) and, each
pod over it having failed before any condition could land, lower the Job's
``backoffLimit`` by one for each, in the record's write (``webhook.controller.disruptions``:
``settle_late``). Drained: every Job's record counts all its pods and settles every pod
over its budget. Reported: how long after the first node was lost, and after the last,
that held; the controller's writes and reads; the Events it wrote and dropped; the
writes refused, and of those the Jobs' record patches (a 409: record writers that raced);
how many lost pods the Jobs' failure histories mark by the end.

The API (``testkit.fakeapi``) answers every request ``latency`` seconds late and serves
at most ``rate`` requests a second (``testkit.pacing.Paced``): a loaded API server, as
far as the controller's requests go. Simulated: this 2-core machine runs the API, the
played cluster and the controller at once.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.leader import Leader, cluster_api, refused, writes
from benchmarks.played import store_jobs
from testkit.builders import P
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobController, JobRun
from testkit.pacing import Paced
from webhook.cluster.record import Record

POLICY = {P + "ignore-disruptions": "true", P + "max-disruptions": "3", P + "backoff-limit": "10"}
FREE = 3


class Zone:
    """The Jobs, their pods, and the nodes they run on."""

    def __init__(self, api: FakeAPI, jobs: int, pods_per_job: int, nodes: int) -> None:
        self.runs = store_jobs(api, POLICY, "train", jobs, parallelism=pods_per_job)
        self.pods: dict[str, tuple[JobRun, dict]] = {}
        self.nodes: list[list[str]] = [[] for _ in range(nodes)]
        for j, run in enumerate(self.runs):
            for i in range(pods_per_job):
                pod = run.new_pod()
                uid = pod["metadata"]["uid"]
                self.pods[uid] = (run, pod)
                # each node runs pods of different Jobs
                self.nodes[(j + i * (nodes // pods_per_job or 1)) % nodes].append(uid)
        random.Random(nodes).shuffle(self.nodes)

    def lose(self, node: list[str]) -> None:
        for uid in node:
            run, pod = self.pods[uid]
            run.podgc(pod)


def drained(api: FakeAPI, waiting: dict[str, set[str]]) -> bool:
    """Drop from ``waiting`` (Job UID -> its pods lost) each Job whose record counts every
    pod lost and settles each one over the budget; whether none is left."""
    with api.lock:
        annotated = {uid: api.objects["jobs"][uid] for uid in waiting}
    for uid, job in annotated.items():
        record = Record.of(job)
        lost = waiting[uid]
        if record is None or record.disruptions_of() < len(lost):
            continue
        over = [pod for pod in lost if record.disrupted(pod) == "over"]
        if len(over) == len(lost) - FREE and all(record.settled(pod) for pod in over):
            del waiting[uid]
    return not waiting


def measure(
    workdir: Path,
    jobs: int = 1000,
    pods_per_job: int = 8,
    nodes: int = 1000,
    seconds: float = 60.0,
    latency: float = 0.025,
    rate: float = 100.0,
    patience: float = 600.0,
    thread: bool = False,
) -> dict:
    with cluster_api() as api:
        zone = Zone(api, jobs, pods_per_job, nodes)
        pace = api.pace = Paced(latency, rate)
        with Leader.start(api, workdir, thread):
            first, first_failed = len(api.requests), len(api.failed_writes)
            waiting: dict[str, set[str]] = {run.uid: set() for run in zone.runs}
            controller = JobController(api, zone.runs)
            with controller.syncing(1.0):
                began = time.monotonic()
                for index, node in enumerate(zone.nodes):
                    zone.lose(node)
                    for uid in node:
                        waiting[zone.pods[uid][0].uid].add(uid)
                    time.sleep(max(0.0, began + (index + 1) * seconds / nodes - time.monotonic()))
                lost_by = time.monotonic() - began
                done_at = None
                while time.monotonic() - began < patience:
                    if drained(api, waiting):
                        done_at = time.monotonic() - began
                        break
                    time.sleep(1.0)
        sent = writes(api, first)
        with api.lock:
            reads = sum(1 for call, _ in api.requests[first:] if call.startswith("/"))
            lowered = sum(10 - job["spec"]["backoffLimit"] for job in api.objects["jobs"].values())
            names = {run.name for run in zone.runs}
            records = {run.uid: Record.of(api.objects["jobs"][run.uid]) for run in zone.runs}
            # The history's marks, which go in the same patches as the counts.
            marked = sum(
                1 for uid, (run, _) in zone.pods.items() if (r := records[run.uid]) and r.seen(uid)
            )
            # The Jobs' record patches refused: the writers' conflicts over one record.
            job_refused = Counter(
                str(status) for _, name, status in api.failed_writes[first_failed:] if name in names
            )
        return {
            "jobs": jobs,
            "pods": len(zone.pods),
            "nodes": nodes,
            "lost_over_s": round(lost_by, 1),
            "drained_s": round(done_at, 1) if done_at is not None else None,
            "drained_after_last_loss_s": (
                round(done_at - lost_by, 1) if done_at is not None else None
            ),
            "jobs_not_drained": len(waiting),
            "backoff_limit_lowered": lowered,
            "history_marked_at_end": marked,
            "controller_writes": dict(sent),
            "controller_reads": reads,
            "refused": dict(refused(api, first_failed)),
            "refused_job_patches": dict(job_refused),
            "api": {**pace.settings(), "queued_s": round(pace.waited, 1)},
            "judged": len(controller.judged),
        }


def run(**kw: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return measure(Path(tmp), **kw)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--latency", type=float, default=0.025)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    print(json.dumps(run(**vars(args)), indent=2))
