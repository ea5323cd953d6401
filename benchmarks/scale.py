"""Scale: the attempt cache holding N Jobs — resident memory and lookup latency — and the
failure history (``webhook.cluster.history``) of N Jobs whose pods failed — resident memory.

Each size runs in a fresh process (``python -m benchmarks.scale N``) so resident memory
is measured without leftovers: baseline RSS with an empty cache, then RSS after N Jobs
went through the cache's own event path (``_apply_job``, what list and watch call).

Lookups of random Jobs get slower as the cache grows even where the structure does not:
100k Jobs' keys and entries no longer fit in the CPU's caches. So each lookup is timed
beside a baseline that has only that cost, a plain dict of the same keys looked up in the
same order, and the cache's own cost (lookup minus baseline) is what must stay flat. The
same Job looked up again (warm caches) is reported as a second check.
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import subprocess
import sys
import time
import types
import uuid


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def realistic_job(i: int) -> dict:
    uid = str(uuid.UUID(int=random.getrandbits(128)))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"job-{i}",
            "namespace": f"team-{i % 50}",
            "uid": uid,
            "resourceVersion": str(1000 + i),
            "labels": {"app": "train", "team": f"team-{i % 50}"},
            "annotations": {"retry-policy.dev/applied": '{"backoffLimit":3}'},
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
            "template": {"spec": {"containers": [{"name": "main", "image": "x:1"}]}},
        },
        "status": {"failed": i % 4, "uncountedTerminatedPods": {"failed": []}},
    }


def measure(count: int) -> dict:
    from webhook.cluster.attempts import JobCache

    random.seed(count)
    # Never started: no API calls; events are fed in directly.
    unused = types.SimpleNamespace(
        list_job_for_all_namespaces=None, list_pod_for_all_namespaces=None
    )
    cache = JobCache(batch_api=unused, core_api=unused, watch_pods=False)
    gc.collect()
    before = rss_bytes()
    uids = []
    for i in range(count):
        job = realistic_job(i)
        uids.append(job["metadata"]["uid"])
        cache._apply_job("ADDED", job)
    del job
    gc.collect()
    after = rss_bytes()
    baseline = {uid: i % 4 for i, uid in enumerate(uids)}
    sample = random.choices(uids, k=20000)
    timings, dict_timings, warm_timings = [], [], []
    clock = time.perf_counter_ns
    for uid in sample:
        started = clock()
        found = cache.job_failures("ns", "name", uid)
        timings.append(clock() - started)
        assert found.failures is not None
        started = clock()
        baseline.get(uid)
        dict_timings.append(clock() - started)
        started = clock()
        cache.job_failures("ns", "name", uid)
        warm_timings.append(clock() - started)
    lookup = statistics.median(timings)
    plain = statistics.median(dict_timings)
    return {
        "jobs": count,
        "extra_rss_mb": round((after - before) / 2**20, 1),
        "lookup_median_ns": lookup,
        "lookup_p99_ns": sorted(timings)[int(0.99 * len(timings))],
        "dict_median_ns": plain,
        "own_cost_ns": lookup - plain,
        "warm_median_ns": statistics.median(warm_timings),
    }


def failed_pods(job: int, failures: int, containers: int = 1) -> list[dict]:
    """The failed pods of one Job of a failure-aware workload, as the pod watch delivers
    them: each on its own node (of a pool of 2,000), every container OOM-killed."""
    uid = str(uuid.UUID(int=random.getrandbits(128)))
    pods = []
    for attempt in range(failures):
        n = random.randrange(2000)
        node = f"gke-ml-pool-{n:04d}-{n * 7919 % 65536:04x}"
        pods.append(
            {
                "metadata": {
                    "name": f"train-{job}-{attempt}",
                    "namespace": f"team-{job % 50}",
                    "uid": str(uuid.UUID(int=random.getrandbits(128))),
                    "annotations": {
                        "retry-policy.dev/oom-memory-factor": "1.5",
                        "retry-policy.dev/oom-memory-limit": "64Gi",
                        "retry-policy.dev/avoid-failed-nodes": "true",
                    },
                },
                "spec": {"nodeName": node},
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [
                        {
                            "name": f"c{c}",
                            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                        }
                        for c in range(containers)
                    ],
                },
                "job_uid": uid,
            }
        )
    return pods


def measure_history(count: int, failures: int, containers: int = 1) -> dict:
    """Memory of the failure history holding ``count`` Jobs with ``failures`` failed pods
    each (fed as the pod watch feeds it): what Python allocated for it and still holds
    (``tracemalloc``: the pods it was fed are freed, unlike in a resident-memory figure,
    where the allocator keeps their pages), and the process's resident memory growth."""
    import tracemalloc

    from webhook.cluster.history import FailureHistory

    random.seed(count * 100 + failures)
    gc.collect()
    before = rss_bytes()
    tracemalloc.start()
    history = FailureHistory(max_lineages=max(count, 1))
    for job in range(count):
        for pod in failed_pods(job, failures, containers):
            history.record(pod, pod["job_uid"], True)
    del pod
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    after = rss_bytes()
    return {
        "jobs": count,
        "failures_per_job": failures,
        "containers_oom_killed": containers,
        "held_mb": round(held / 2**20, 1),
        "bytes_per_job": round(held / count),
        "extra_rss_mb": round((after - before) / 2**20, 1),
        "lineages": history.stats()["lineages"],
    }


#: (Jobs, failed pods per Job, OOM-killed containers each): a typical retry history, and
#: the most a lineage keeps (32 failed pods, on 16 nodes and more, 4 containers), which
#: grows linearly with the Jobs (so 10,000 of them stand for 100,000 at a tenth the time).
HISTORY_CASES = ((100_000, 2, 1), (10_000, 32, 4))


def run(sizes: tuple[int, ...] = (10_000, 100_000)) -> dict:
    results = {}
    for size in sizes:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.scale", str(size)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[str(size)] = json.loads(out.stdout)
    return results


def run_history() -> list[dict]:
    """``measure_history`` for each of ``HISTORY_CASES``, each in a fresh process."""
    results = []
    for count, failures, containers in HISTORY_CASES:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.scale",
                "--history",
                str(count),
                str(failures),
                str(containers),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(out.stdout))
    return results


def flat(results: dict) -> float:
    """The cache's own lookup cost at the largest size over the smallest (1.0 = flat)."""
    sizes = sorted(results, key=int)
    return results[sizes[-1]]["own_cost_ns"] / results[sizes[0]]["own_cost_ns"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--history"]:
        if len(sys.argv) == 5:
            print(json.dumps(measure_history(*map(int, sys.argv[2:5]))))
        else:
            print(json.dumps(run_history(), indent=2))
    elif len(sys.argv) > 1:
        print(json.dumps(measure(int(sys.argv[1]))))
    else:
        print(json.dumps(run(), indent=2))
