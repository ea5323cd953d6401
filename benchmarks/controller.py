"""The controller's memory for N annotated workloads, and what their records cost the
admission workers.

``python -m benchmarks.controller N`` (each size in a fresh process, so resident memory is
measured without leftovers) feeds N Jobs through the controller's history recorder's own
event path (``HistoryRecorder._apply_job``, what its list and watch call) and through an
admission worker's Job cache (``JobCache._apply_job``): each Job is annotated for memory
raises and avoided nodes (its template carries the keys the recorder writes a history
for), carries an Ignore rule (so its rules are kept, for counting), and a record of two
failures (``retry-policy.dev/history``, as the leader writes it). Reported: what Python
still holds for them (``tracemalloc``) and the resident memory growth, per side.
"""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
import uuid

from benchmarks.scale import rss_bytes

POLICY = {
    "retry-policy.dev/oom-memory-factor": "1.5",
    "retry-policy.dev/oom-memory-limit": "64Gi",
    "retry-policy.dev/avoid-failed-nodes": "true",
}


def _record(i: int) -> str:
    from webhook.cluster.record import Record

    record = Record()
    for attempt in range(2):
        n = random.randrange(2000)
        record = record.add(
            {
                "metadata": {"uid": str(uuid.UUID(int=random.getrandbits(128)))},
                "spec": {"nodeName": f"gke-ml-pool-{n:04d}-{n * 7919 % 65536:04x}"},
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [
                        {
                            "name": "trainer",
                            "state": {
                                "terminated": {
                                    "exitCode": 137,
                                    "reason": "OOMKilled",
                                    "finishedAt": f"2026-11-26T10:{attempt:02d}:00Z",
                                }
                            },
                        }
                    ],
                },
            },
            True,
        )
    return record.text()


def annotated_job(i: int) -> dict:
    uid = str(uuid.UUID(int=random.getrandbits(128)))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"train-{i}",
            "namespace": f"team-{i % 50}",
            "uid": uid,
            "resourceVersion": str(1000 + i),
            "annotations": {**POLICY, "retry-policy.dev/history": _record(i)},
        },
        "spec": {
            "backoffLimit": 3,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [143]}},
                ]
            },
            "template": {
                "metadata": {"annotations": dict(POLICY)},
                "spec": {"containers": [{"name": "trainer", "image": "x:1"}]},
            },
        },
        "status": {"failed": 2},
    }


def _held(feed) -> tuple[float, float]:
    """(MB Python still holds, MB of resident growth) after ``feed()``."""
    import tracemalloc

    gc.collect()
    before = rss_bytes()
    tracemalloc.start()
    feed()
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    after = rss_bytes()
    return round(held / 2**20, 1), round((after - before) / 2**20, 1)


def measure(count: int) -> dict:
    import types

    from webhook.cluster.attempts import JobCache
    from webhook.controller.recorder import HistoryRecorder

    random.seed(count)
    jobs = [annotated_job(i) for i in range(count)]

    # Made before measuring: the kubernetes client's modules are not the workloads' cost.
    recorder = HistoryRecorder(api_client=None)
    unused = types.SimpleNamespace(
        list_job_for_all_namespaces=None, list_pod_for_all_namespaces=None
    )
    cache = JobCache(batch_api=unused, core_api=unused, watch_pods=False)

    def controller():
        for job in jobs:
            recorder._apply_job("ADDED", job)
        assert recorder.stats()["workloads"] == count

    def admission():
        for job in jobs:
            cache._apply_job("ADDED", job)
        assert len(cache._records) == count

    controller_mb, controller_rss = _held(controller)
    admission_mb, admission_rss = _held(admission)
    return {
        "workloads": count,
        "record_bytes": len(jobs[0]["metadata"]["annotations"]["retry-policy.dev/history"]),
        "controller_held_mb": controller_mb,
        "controller_bytes_per_workload": round(controller_mb * 2**20 / count),
        "controller_extra_rss_mb": controller_rss,
        "admission_held_mb": admission_mb,
        "admission_bytes_per_workload": round(admission_mb * 2**20 / count),
        "admission_extra_rss_mb": admission_rss,
    }


def run(sizes: tuple[int, ...] = (10_000, 100_000)) -> list[dict]:
    results = []
    for size in sizes:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.controller", str(size)],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(out.stdout))
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(measure(int(sys.argv[1]))))
    else:
        print(json.dumps(run(), indent=2))
