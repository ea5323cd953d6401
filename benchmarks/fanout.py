"""API writes one disruption costs in a large JobSet with ``peer-disruptions``:
``python -m benchmarks.fanout [PODS]``.

A JobSet admitted with ``peer-disruptions: ignore`` and ``ignore-disruptions`` (one
replicated Job, ``replicas`` child Jobs of ``parallelism`` pods each, made as the JobSet
controller makes them: ``testkit.audits.child_job``), all pods running. The
scheduler preempts one pod (``DisruptionTarget``, the deletion), the kubelet stops it a
second later. The controller (real, its own process: ``benchmarks.leader``) adds one
``FailureTarget`` to the preempted pod's child Job, on which the JobSet's first rule
restarts the set (``webhook.kinds.jobset.peers``); a JobSet without that rule gets
per-pod ``PeerDisrupted`` marks, at most ``--peer-mark-limit`` (``webhook.controller.peers``).
Counted: its writes until it has been quiet for a while.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

from benchmarks.leader import Leader, cluster_api, quiet, refused, writes
from testkit.audits import child_job
from testkit.builders import P, stored
from testkit.controllers import V136
from testkit.jobsim import JobRun
from testkit.kinds import jobset, replicated
from testkit.workloads import mutate
from webhook.kube import failurepolicy as fp

POLICY = {P + "peer-disruptions": "ignore", P + "ignore-disruptions": "true"}


def admitted_jobset(replicas: int, parallelism: int) -> dict:
    """The JobSet as admitted and stored: one replicated Job ``workers``."""
    workers = replicated("workers", restart_policy="Never")
    workers["replicas"] = replicas
    workers["template"]["spec"].update(parallelism=parallelism, completions=parallelism)
    verdict, out = mutate(jobset(POLICY, jobs=[workers]), V136)
    if not verdict.allowed:
        raise RuntimeError(verdict.message)
    return stored(out, uid="uid-pretrain")


def measure(
    workdir: Path,
    replicas: int = 10,
    parallelism: int = 1000,
    peer_limit: int = 1000,
    thread: bool = False,
) -> dict:
    with cluster_api() as api:
        stored_jobset = admitted_jobset(replicas, parallelism)
        api.put("jobsets", copy.deepcopy(stored_jobset))
        (rjob,) = stored_jobset["spec"]["replicatedJobs"]
        runs = [
            JobRun.store(api, child_job(stored_jobset, rjob, index, 0)) for index in range(replicas)
        ]
        pods = [run.new_pod() for run in runs for _ in range(parallelism)]
        with Leader.start(api, workdir, thread, peer_limit=peer_limit):
            first, first_failed = len(api.requests), len(api.failed_writes)
            began = time.monotonic()
            preempted = runs[0].disrupt(pods[0], "PreemptionByScheduler")
            time.sleep(1.0)  # its grace
            runs[0].fail(preempted)
            last = quiet(api, 3.0, 600)
        sent = writes(api, first)
        with api.lock:
            marked = sum(
                1
                for pod in api.objects["pods"].values()
                if any(c["type"] == fp.PEER_DISRUPTED for c in pod["status"]["conditions"])
            )
            events = [e for e in api.named["events"].values() if e.get("reason")]
        return {
            "pods": len(pods),
            "child_jobs": replicas,
            "peer_mark_limit": peer_limit,
            "disruptions": 1,
            "writes_per_disruption": sum(sent.values()),
            "controller_writes": dict(sent),
            "refused": dict(refused(api, first_failed)),
            "peers_marked": marked,
            "events": sorted(e["type"] + " " + e["note"][:90] for e in events),
            "marks_took_s": round(last - began, 1) if last is not None else None,
            "quiet_after": last is not None,
        }


def run(pods: int = 10_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return measure(Path(tmp), replicas=max(1, pods // 1000), parallelism=min(pods, 1000))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("pods", type=int, nargs="?", default=10_000)
    print(json.dumps(run(parser.parse_args().pods), indent=2))
