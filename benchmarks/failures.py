"""API writes a failed pod costs the controller, amortised: ``python -m benchmarks.failures``.

Annotated Jobs lose pods the way ``testkit.jobsim`` plays it, a few a second, interleaved:

- ``oom``: a container OOM-killed (``oom-memory-factor``, ``avoid-failed-nodes``: the
  leader writes the Job's failure history);
- ``non_retriable``: exit 1 under ``fail-non-retriable`` (the Job's FailJob rule ends it;
  the leader writes the ``RetryPolicyFailedJob`` Event once the Job has failed);
- ``evicted``: the Eviction API (``DisruptionTarget``, the deletion), the kubelet's 143 a
  grace later; under ``max-disruptions: 2`` the first two of each Job are free and the
  rest over it (the count on the Job, an Event each, the condition on the pods over it);
- ``delayed``: exit 1 under ``retry-delay``, then the retry pod the webhook holds back
  behind our scheduling gate for a second (the leader releases it).

The controller is the real one in its own process (``benchmarks.leader``); the played Job
controller judges the failed pods once a second (``testkit.jobsim.JobController``). Its
writes, every one it sent but the Lease's (``benchmarks.leader.writes``), are counted
once it has been quiet for a while and has stopped (what it holds, Events' series and
failures waiting to ride another write, it writes as it stops), and divided by the
failed pods. What it did is checked
against what each kind must get, so a run in which it did not do its work says so.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.leader import Leader, cluster_api, quiet, refused, writes
from benchmarks.played import Kubelet, gated_pod, store_jobs
from testkit.builders import P
from testkit.fakeapi import FakeAPI
from testkit.jobsim import T0, JobController, JobRun
from webhook.cluster.record import Record
from webhook.kube import gates

POLICIES = {
    "oom": {
        P + "oom-memory-factor": "1.5",
        P + "oom-memory-limit": "64Gi",
        P + "avoid-failed-nodes": "true",
        P + "backoff-limit": "100",
    },
    "non_retriable": {
        P + "fail-non-retriable": "true",
        P + "retriable-exit-codes": "137,143",
        P + "backoff-limit": "5",
    },
    "evicted": {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "2",
        P + "backoff-limit": "100",
    },
    "delayed": {P + "retry-delay": "30s", P + "backoff-limit": "100"},
}
#: kind -> (Jobs, failed pods each): 140 failed pods in all.
PLAN = {"oom": (10, 4), "non_retriable": (30, 1), "evicted": (10, 4), "delayed": (10, 3)}
GATE_SECONDS = 1.0


class Stream:
    """The cluster's side: one step a failed pod (``step``)."""

    def __init__(self, api: FakeAPI, plan: dict[str, tuple[int, int]]) -> None:
        self.api = api
        self.runs = {
            kind: store_jobs(api, POLICIES[kind], kind.replace("_", "-"), jobs)
            for kind, (jobs, _) in plan.items()
        }
        self.steps = [
            (kind, run)
            for kind, (_, failures) in plan.items()
            for run in self.runs[kind]
            for _ in range(failures)
        ]
        random.Random(7).shuffle(self.steps)
        self.kubelet = Kubelet()
        self.gated: list[str] = []
        self.concluded: set[str] = set()

    def all_runs(self) -> list[JobRun]:
        return [run for runs in self.runs.values() for run in runs]

    def step(self, kind: str, run: JobRun) -> None:
        pod = run.new_pod()
        if kind == "oom":
            run.update(pod, _oom_killed)
        elif kind == "evicted":
            run.disrupt(pod, "EvictionByEvictionAPI")
            self.kubelet.after(1.0, lambda: run.fail(pod))
        else:  # non_retriable, delayed: the application exits 1
            run.fail(pod, code=1)
            if kind == "delayed":
                self.gated.append(gated_pod(run, time.time() + GATE_SECONDS)["metadata"]["uid"])

    def conclude(self) -> None:
        """The Job controller's end of each Job it found ended (its FailJob rule)."""
        for run in self.runs.get("non_retriable", []):
            if run.ended and run.uid not in self.concluded:
                # (dated now: the judge tells only Jobs that failed within the hour)
                run.conclude(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                self.concluded.add(run.uid)


def _oom_killed(pod: dict) -> None:
    pod["status"]["phase"] = "Failed"
    for status in pod["status"]["containerStatuses"]:
        status["state"] = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": T0}}


def measure(
    workdir: Path,
    plan: dict[str, tuple[int, int]] = PLAN,
    per_second: float = 10.0,
    thread: bool = False,
) -> dict:
    with cluster_api() as api:
        stream = Stream(api, plan)
        with Leader.start(api, workdir, thread):
            first, first_failed = len(api.requests), len(api.failed_writes)
            controller = JobController(api, stream.all_runs())
            began = time.monotonic()
            with controller.syncing(1.0):
                for index, (kind, run) in enumerate(stream.steps):
                    stream.step(kind, run)
                    stream.conclude()
                    time.sleep(max(0.0, began + (index + 1) / per_second - time.monotonic()))
                while stream.kubelet.pending():
                    time.sleep(0.1)
                stream.kubelet.close()
            stream.conclude()
            drained = quiet(api, 3.0, 120)
        sent = writes(api, first)
        failed = len(stream.steps)
        return {
            "failed_pods": failed,
            "by_kind": {kind: jobs * each for kind, (jobs, each) in plan.items()},
            "writes": sum(sent.values()),
            "writes_per_failed_pod": round(sum(sent.values()) / failed, 3),
            "controller_writes": dict(sent),
            "refused": dict(refused(api, first_failed)),
            "done": done(api, stream),
            "quiet_after": drained is not None,
            "pods_per_second": per_second,
        }


def done(api: FakeAPI, stream: Stream) -> dict[str, int]:
    """What the controller did of what each kind must get: the OOM-killed Jobs with a
    failure history, the failed Jobs with their Event, the disruptions counted on their
    Jobs, the retry pods released."""
    with api.lock:
        jobs = {uid: Record.of(job) for uid, job in api.objects["jobs"].items()}
        events = [e for e in api.named["events"].values() if e.get("reason")]
        gated = [api.objects["pods"].get(uid) for uid in stream.gated]
    failed_events = {e["regarding"]["uid"] for e in events if e["reason"] == "RetryPolicyFailedJob"}
    return {
        "oom_jobs_with_history": sum(
            1 for run in stream.runs.get("oom", []) if jobs.get(run.uid) is not None
        ),
        "failed_jobs_told": sum(
            1 for run in stream.runs.get("non_retriable", []) if run.uid in failed_events
        ),
        "disruptions_recorded": sum(
            record.disruptions_of()
            for run in stream.runs.get("evicted", [])
            if (record := jobs.get(run.uid)) is not None
        ),
        "gates_released": sum(1 for pod in gated if pod is not None and not _gated(pod)),
    }


def _gated(pod: dict) -> bool:
    return any(g.get("name") == gates.GATE for g in pod["spec"].get("schedulingGates") or [])


def run(rounds: int = 1) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        return [measure(Path(tmp)) for _ in range(rounds)]


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
