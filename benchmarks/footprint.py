"""The controller's memory at scale: ``python -m benchmarks.footprint [JOBS] [PODS]``.

The controller as deployed, in a fresh process of its own (``benchmarks.leader``: the
controller process's body, every reconciler), leads against a test API that holds
``jobs`` annotated Jobs (``benchmarks.controller.annotated_job``: memory raises and
avoided nodes, each with a failure record of two OOM kills, as the leader writes it) and
``pods`` running pods its watches keep (of Jobs admitted with ``max-disruptions`` and
``peer-disruptions``: the disruption-budget and peer watches select them, and the peer
store keeps each). It lists them all through its real list-then-watch informers, over
HTTP, in pages of 500; its resident memory (``VmRSS``) is read from /proc once it has
listed and settled, with its peak (``VmHWM``: the lists' pages in flight), and beside it
the same process against an empty API (the interpreter, the client, our modules).

The objects are put in the API's store directly, not created through it: the controller
lists them as it finds them when it starts leading (a new leader's first list).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.controller import annotated_job
from benchmarks.leader import JOB_WATCHES, POD_WATCHES, Leader, cluster_api
from testkit.builders import P
from testkit.controllers import admitted_job
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun

#: What the watched pods' Jobs are admitted with: both disruption watches select them.
WATCHED = {
    P + "ignore-disruptions": "true",
    P + "max-disruptions": "2",
    P + "peer-disruptions": "ignore",
}
PODS_PER_JOB = 10


def fill(api: FakeAPI, jobs: int, pods: int) -> None:
    """``jobs`` annotated Jobs and ``pods`` watched pods (of ``pods / 10`` Jobs of their
    own), into the store as they are when a leader lists them."""
    random.seed(jobs)
    with api.lock:
        for i in range(jobs):
            job = annotated_job(i)
            api.objects["jobs"][job["metadata"]["uid"]] = job
    template = admitted_job(WATCHED, "watched", parallelism=PODS_PER_JOB)
    for j in range(max(1, pods // PODS_PER_JOB)):
        job = copy.deepcopy(template)
        job["metadata"].update(name=f"watched-{j}", uid=str(uuid.uuid4()))
        run = JobRun.store(api, job)
        for _ in range(min(PODS_PER_JOB, pods - j * PODS_PER_JOB)):
            run.new_pod()
    with api.lock:
        api.version += 1


def relisted(api: FakeAPI, leader: Leader, timeout: float = 600.0) -> float:
    """End every watch as a restarted API server does (its next watch is answered 410
    Gone), and wait until each of the controller's watches is open again: its cache
    listed everything again first (at 100,000 Jobs that takes longer than any fixed
    wait would safely allow). A watch opened since can only be a relist's: none has
    been open long enough to time out."""
    wanted = {"jobs": JOB_WATCHES, "pods": POD_WATCHES}
    before = {resource: api.opened[resource] for resource in wanted}
    for resource in wanted:
        api.expire(resource)
    start = time.monotonic()
    deadline = start + timeout
    while any(api.opened[r] - before[r] < n for r, n in wanted.items()):
        if leader.proc is not None and leader.proc.poll() is not None:
            tail = leader.log.read_text()[-2000:]
            raise RuntimeError(f"the controller exited while it listed again: {tail}")
        if time.monotonic() > deadline:
            tail = leader.log.read_text()[-2000:]
            raise RuntimeError(f"the controller did not list again: {tail}")
        time.sleep(0.1)
    return time.monotonic() - start


def controller_memory(api: FakeAPI, workdir: Path, settle: float, relist: bool = False) -> dict:
    """A fresh controller leading against ``api``: its memory once it has listed it all
    and ``settle`` seconds passed; with ``relist``, also its peak once every watch was
    answered 410 Gone (an API server restarted, its watch cache compacted), every cache
    listed again (``relisted``, how long that took) and ``settle`` seconds passed."""
    with Leader.process(api, workdir) as leader:
        led = time.monotonic()
        time.sleep(settle)
        memory = leader.memory()
        if relist:
            took = relisted(api, leader)
            time.sleep(settle)
            memory["relisted_in_s"] = round(took, 1)
            memory["relist_peak_rss_mb"] = leader.memory()["peak_rss_mb"]
            memory["relisted_rss_mb"] = leader.memory()["rss_mb"]
    return {**memory, "listed_in_s": round(led - leader.started, 1)}


def measure(workdir: Path, jobs: int = 100_000, pods: int = 10_000, settle: float = 10.0):
    with cluster_api() as api:
        empty = controller_memory(api, workdir, settle)
    with cluster_api() as api:
        fill(api, jobs, pods)
        full = controller_memory(api, workdir, settle, relist=True)
        with api.lock:
            stored = {"jobs": len(api.objects["jobs"]), "pods": len(api.objects["pods"])}
    return {
        "workloads": jobs,
        "watched_pods": pods,
        "stored": stored,
        "rss_mb": full["rss_mb"],
        "peak_rss_mb": full["peak_rss_mb"],
        "listed_in_s": full["listed_in_s"],
        "relist_peak_rss_mb": full["relist_peak_rss_mb"],
        "relisted_rss_mb": full["relisted_rss_mb"],
        "relisted_in_s": full["relisted_in_s"],
        "empty_rss_mb": empty["rss_mb"],
        "state_mb": round(full["rss_mb"] - empty["rss_mb"], 1),
    }


def run(jobs: int = 100_000, pods: int = 10_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return measure(Path(tmp), jobs, pods)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("jobs", type=int, nargs="?", default=100_000)
    parser.add_argument("pods", type=int, nargs="?", default=10_000)
    args = parser.parse_args()
    print(json.dumps(run(args.jobs, args.pods), indent=2))
