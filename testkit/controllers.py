"""The controller's reconcilers run against the HTTP test API with the real ``kubernetes``
client: a reconciler run in a thread until the test is done (once every watch has listed),
the Jobs it acts on as admission wrote them, and what it wrote (Events, records).
"""

from __future__ import annotations

import copy
import functools
import threading
import time

from kubernetes import config

from testkit import workloads
from testkit.builders import P
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.jobsim import JobRun
from testkit.servers import eventually, scaled
from webhook.cluster.events import EventRecorder
from webhook.cluster.record import Record
from webhook.controller.disruptions import Disruptions
from webhook.controller.restarts import InPlaceBudget
from webhook.kube import failurepolicy as fp
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config

V136 = Config(kubernetes_version=KubeVersion.parse("1.36"))


def client_of(fake: FakeAPI, tmp_path):
    path = write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}", fake.url)
    return config.new_client_from_config(str(path))


class Counted:
    """The controller's metrics, as calls."""

    def __init__(self):
        self.calls: list[tuple[str, ...]] = []

    def condition(self, kind: str, result: str) -> None:
        self.calls.append(("condition", kind, result))

    def disruption(self, result: str) -> None:
        self.calls.append(("disruption", result))

    def lowered(self) -> None:
        self.calls.append(("lowered",))

    def uncovered(self, reason: str) -> None:
        self.calls.append(("uncovered", reason))

    def peers_unmarked(self, count: int) -> None:
        self.calls.append(("peers_unmarked", count))


class Running:
    def __init__(self, reconciler):
        self.reconciler = reconciler
        self.stop = threading.Event()
        self.thread = threading.Thread(target=reconciler.run, args=(self.stop,), daemon=True)

    def __enter__(self):
        self.thread.start()
        # It sees only what is there when it lists, then what changes: a pod gone before
        # that (PodGC's) is never seen, so a test acts once every watch has listed.
        eventually(lambda: watching(self.reconciler), 10)
        return self.reconciler

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(scaled(5))


def watching(reconciler) -> bool:
    """Whether every watch the reconciler started has listed (``Reconciler.watches``)."""
    watches = getattr(reconciler, "watches", None)
    return bool(watches) and all(w.synced.is_set() for w in watches)


#: A Job admitted as a 1.36 API server's webhook would admit it.
admitted_job = functools.partial(workloads.admitted_job, config=V136)


def events_of(fake: FakeAPI, reason: str) -> list[dict]:
    with fake.lock:
        found = [dict(v) for v in fake.named["events"].values() if v.get("reason") == reason]
    return sorted(found, key=lambda e: e["note"])


def record_of(fake: FakeAPI, uid: str, resource: str = "jobs") -> Record | None:
    with fake.lock:
        return Record.of(copy.deepcopy(fake.objects[resource][uid]))


def disruptions(fake, tmp_path, metrics=None) -> Disruptions:
    client = client_of(fake, tmp_path)
    events = EventRecorder(__import__("kubernetes").client.EventsV1Api(client), "test")
    return Disruptions(client, events, metrics, window=0.05)


DISRUPTIONS = {
    P + "ignore-disruptions": "true",
    P + "max-disruptions": "2",
    P + "backoff-limit": "0",
}


def preempt(run: JobRun, reconciler=None) -> tuple[dict, str]:
    """One pod preempted: the condition, the reconciler's turn, then the kubelet's and the
    Job controller's; the pod as the Job controller judged it, and its action."""
    pod = run.new_pod()
    run.disrupt(pod)
    if reconciler is not None:
        eventually(lambda: acted(reconciler, run.current(pod)), 10)
    failed = run.fail(pod)
    return failed, run.judge(pod)


def handled(reconciler: Disruptions) -> set[str]:
    with reconciler._lock:
        return {uid for what, uid in reconciler._handled if what == "budget"}


def acted(reconciler: Disruptions, pod: dict) -> bool:
    """Whether the reconciler is done with a disrupted pod: counted it, and when it
    counted it over the budget, marked it (its workers write the condition) or, the pod
    failed first, settled it another way (``settle_late``)."""
    uid = pod["metadata"]["uid"]
    if uid not in handled(reconciler):
        return False
    states = list(reconciler._budgets.values())
    seen = {s.record.disrupted(uid) for s in states}
    marked = fp.DISRUPTION_BUDGET_EXHAUSTED in [c["type"] for c in pod["status"]["conditions"]]
    settled = any(s.record.settled(uid) or any(x.uid == uid for x in s.late) for s in states)
    return "over" not in seen or marked or settled


IN_PLACE = {
    P + "in-place-exit-codes": "42",
    P + "max-in-place-restarts": "5",
    P + "backoff-limit": "1",
    P + "fail-non-retriable": "true",
}


def in_place(fake, tmp_path, metrics=None) -> InPlaceBudget:
    client = client_of(fake, tmp_path)
    events = EventRecorder(__import__("kubernetes").client.EventsV1Api(client), "test")
    return InPlaceBudget(client, events, metrics)


def counting_flushes(reconciler) -> list[int]:
    flushes: list[int] = []
    flush = reconciler.flush

    def counted(**kw: object) -> None:
        flushes.append(1)
        flush(**kw)

    reconciler.flush = counted
    return flushes
