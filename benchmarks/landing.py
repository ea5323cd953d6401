"""Do our pod conditions land before the Job controller judges the pod? For a group of N
pods all disrupted at once: ``python -m benchmarks.landing [N ...]``.

One Job of N pods (``parallelism`` and ``completions`` N) admitted with
``ignore-disruptions`` and ``max-disruptions: 0``, so that every disruption is over the
budget and its pod should get ``retry-policy.dev/DisruptionBudgetExhausted`` while it
terminates (``webhook.controller.disruptions``: the Count rule before the Ignore on
``DisruptionTarget``). The scheduler preempts all N at once (``DisruptionTarget``, then
the deletion: ``testkit.jobsim.JobRun.disrupt``); the played kubelet fails each
(``JobRun.fail``: containers stopped with 143, ``Failed``) after a grace drawn evenly from
0.5 to 3 s, a pod's SIGTERM handling; the played Job controller
(``testkit.jobsim.JobController``) judges the ``Failed`` pods once a second
(``syncJobBatchPeriod``). The controller is the real one, in its own process
(``benchmarks.leader``), with the chart's rate limits unless told otherwise.

A pod judged by the Count rule had our condition in time; one judged by the Ignore rule
had not (the controller then lowers the Job's ``backoffLimit`` for it instead: still
counted, not the way that is meant). The result: the share judged with it, and whether
every disruption was recorded on the Job in the end.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.leader import Leader, cluster_api, quiet, refused, writes
from benchmarks.played import Kubelet
from testkit.builders import P
from testkit.controllers import admitted_job
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobController, JobRun
from webhook.cluster.record import Record

#: The grace a pod takes to stop after it was told to, seconds (evenly between).
GRACE = (0.5, 3.0)
SIZES = (10, 100, 1000)


def budget_job(size: int, name: str = "group") -> dict:
    """A Job of ``size`` pods whose every disruption is over its budget."""
    policy = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "0",
        P + "backoff-limit": str(size + 10),
    }
    return admitted_job(policy, name, parallelism=size, completions=size)


def measure(size: int, workdir: Path, qps: float = 50, burst: int = 100, thread: bool = False):
    """One group of ``size`` pods disrupted at once; what the Job controller judged."""
    rng = random.Random(size)
    with cluster_api() as api:
        run = JobRun.store(api, budget_job(size))
        pods = [run.new_pod() for _ in range(size)]
        with Leader.start(api, workdir, thread, qps=qps, burst=burst):
            first, first_failed = len(api.requests), len(api.failed_writes)
            controller = JobController(api, [run])
            kubelet = Kubelet()
            with controller.syncing(1.0):
                began = time.monotonic()
                for pod in pods:
                    run.disrupt(pod, "PreemptionByScheduler")
                for pod in pods:
                    kubelet.after(rng.uniform(*GRACE), lambda pod=pod: run.fail(pod))
                deadline = began + GRACE[1] + 60
                while len(controller.judged) < size and time.monotonic() < deadline:
                    time.sleep(0.1)
                judged_in = time.monotonic() - began
            kubelet.close()
            drained = quiet(api, 2.0, 120)
        verdicts = [action for _, action in controller.judged.values()]
        with api.lock:
            record = Record.of(api.objects["jobs"][run.uid])
        with_condition = verdicts.count("Count")
        return {
            "pods": size,
            "judged": len(verdicts),
            "with_condition": with_condition,
            "without_condition": verdicts.count("Ignore"),
            "other_verdicts": len(verdicts) - with_condition - verdicts.count("Ignore"),
            "landed_share": round(with_condition / size, 4),
            "judged_within_s": round(judged_in, 1),
            # (a record names the last 256 pods it counted: the count is of them all)
            "recorded": record.disruptions_of() if record is not None else 0,
            "backoff_limit_lowered_by": size + 10 - _backoff_limit(api, run.uid),
            "controller_writes": dict(writes(api, first)),
            "refused": dict(refused(api, first_failed)),
            "quiet_after": drained is not None,
            "grace_s": list(GRACE),
            "qps": qps,
            "burst": burst,
        }


def _backoff_limit(api: FakeAPI, uid: str) -> int:
    with api.lock:
        return int(api.objects["jobs"][uid]["spec"]["backoffLimit"])


def run(sizes: tuple[int, ...] = SIZES, qps: float = 50, burst: int = 100) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            results.append(measure(size, Path(tmp), qps, burst))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--qps", type=float, default=50)
    parser.add_argument("--burst", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(run(tuple(args.sizes), args.qps, args.burst), indent=2))
