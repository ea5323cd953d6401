"""A workload is its namespace and UID, never a UID label alone.

A pod names its workload by labels and an owner reference (``jobset.sigs.k8s.io/
jobset-uid``, ``batch.kubernetes.io/controller-uid``) that anyone who can create pods in
another namespace can copy; the API server refuses neither (a namespaced owner in another
namespace is only treated as absent by the garbage collector: ``ownerReferences`` are
namespace-local, k8s.io/apimachinery ObjectMeta). Such a pod must feed nothing into that
workload's history, its attempt count or its disruption budget, nor mark its pods
``PeerDisrupted``. The record's own lineage keys (``webhook.cluster.record``) hold no UID
and no namespace: records already written read as before.

Against the HTTP test API with the real ``kubernetes`` client, the test playing the
kubelet and the Job controller (``testkit/jobsim.py``)."""

from __future__ import annotations

import copy
import dataclasses
import uuid

import pytest

from testkit.attempts import cache_for, failed_pod, lookup, make_job
from testkit.builders import P
from testkit.controllers import (
    DISRUPTIONS,
    Running,
    admitted_job,
    counting_flushes,
    disruptions,
    handled,
    preempt,
    record_of,
)
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun
from testkit.records import JOBSET_LABELS, a_job, a_jobset, api_client, running, stored_job
from testkit.records import failed_pod as history_pod
from testkit.servers import eventually
from webhook.cluster.history import FailureHistory, HistoryKey
from webhook.cluster.record import Record
from webhook.controller.recorder import HistoryRecorder
from webhook.kube import failurepolicy as fp

RUN0 = {**JOBSET_LABELS, "jobset.sigs.k8s.io/restart-attempt": "0"}


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def elsewhere(pod: dict, namespace: str = "other") -> dict:
    """``pod`` as made in another namespace by someone who copied its labels and owner."""
    copied = copy.deepcopy(pod)
    uid = str(uuid.uuid4())
    copied["metadata"].update(namespace=namespace, uid=uid, name=f"copy-{uid[:5]}")
    copied["metadata"].pop("resourceVersion", None)
    return copied


# --- the admission workers' caches ---------------------------------------------------------------


def test_a_failed_pod_elsewhere_feeds_nothing_into_a_lineages_history():
    history = FailureHistory()
    ours = history_pod("child-0", labels=RUN0, node="node-a", oom=False)
    assert history.record(ours, "child-0", True)
    theirs = elsewhere(history_pod("child-0", labels=RUN0, node="node-b", at="2026-11-26T11:00Z"))
    assert history.record(theirs, "child-0", True)
    key = HistoryKey(
        "ml", "child", "child-0", "uid-pretrain/workers/0", None, 1, jobset="uid-pretrain"
    )
    answer = history.lookup(key)
    assert answer is not None and answer.nodes == ("node-a",) and answer.oom_kills == ()
    assert answer.failures == 1 and answer.last_cause == "exit-code:42:trainer"
    # Theirs is theirs: found under their namespace.
    other = history.lookup(dataclasses.replace(key, namespace="other"))
    assert other is not None and other.nodes == ("node-b",)


def test_a_failed_pod_elsewhere_counts_no_failure_of_a_job(api):
    job = make_job("train")
    api.put("jobs", job)
    cache = cache_for(api)
    try:
        eventually(lambda: api.watcher_count("pods") == 1)
        api.put("pods", elsewhere(failed_pod(job)))
        api.put("pods", failed_pod(job))
        eventually(lambda: cache.stats()["failed_pods"] == 2)
        assert lookup(cache, job).failures == 1
    finally:
        cache.stop()


# --- the controller's history recorder ----------------------------------------------------------


def test_the_recorder_writes_no_failure_from_elsewhere_on_a_job_or_jobset(api, tmp_path):
    """A failed pod in another namespace with a Job's owner and a JobSet's labels, in the
    same batch as the workloads' own: only their own are written, each once."""
    api.put("jobs", a_job())
    api.put("jobsets", a_jobset())
    recorder = HistoryRecorder(api_client(api, tmp_path), window=0.05, linger=0.0)
    flushes = counting_flushes(recorder)
    stop, thread = running(recorder)
    try:
        for pod in (history_pod("uid-train"), history_pod("child-0", labels=RUN0)):
            api.put("pods", elsewhere(pod))
            api.put("pods", pod)

        def written() -> tuple[Record, Record] | None:
            job = Record.of(stored_job(api, "uid-train"))
            with api.lock:
                jobset = Record.of(copy.deepcopy(api.objects["jobsets"]["uid-pretrain"]))
            return (job, jobset) if job and jobset else None

        eventually(written, 10)
        seen = len(flushes)
        eventually(lambda: len(flushes) >= seen + 10, 10)
        job, jobset = written()
    finally:
        stop.set()
        thread.join(5)
    assert job.lineages[""].counted == 1
    assert jobset.lineages["workers/0"].counted == 1


# --- the controller's disruption budgets ---------------------------------------------------------


def test_a_disruption_elsewhere_takes_nothing_from_a_jobs_budget(api, tmp_path):
    """max-disruptions 2: the Job's first preemption is free; a pod elsewhere with its
    labels preempted between counts nothing, so the Job's second is still free."""
    run = JobRun.store(api, admitted_job(DISRUPTIONS))
    with Running(disruptions(api, tmp_path)) as reconciler:
        assert preempt(run, reconciler)[1] == "Ignore"
        made = run.new_pod()
        api.delete("pods", made["metadata"]["uid"])  # made elsewhere instead:
        theirs = elsewhere(made)
        api.put("pods", theirs)
        run.disrupt(theirs)
        eventually(lambda: theirs["metadata"]["uid"] in handled(reconciler), 10)
        assert preempt(run, reconciler)[1] == "Ignore"  # its second: free
        record = eventually(
            lambda: (r := record_of(api, run.uid)) and r.disruptions_of() == 2 and r, 10
        )
    assert record.disrupted(theirs["metadata"]["uid"]) is None


def test_a_disruption_elsewhere_marks_no_peer_of_a_job(api, tmp_path):
    """A Job's three running workers; a pod in another namespace with the Job's labels (and
    a peer of its own there) is preempted: its own peer is marked, the Job's are not."""
    annotations = {
        P + "fail-non-retriable": "true",
        P + "ignore-disruptions": "true",
        P + "peer-disruptions": "ignore",
    }
    run = JobRun.store(api, admitted_job(annotations, parallelism=3, completions=3))
    ours = [run.new_pod() for _ in range(3)]
    theirs = [elsewhere(run.current(ours[0])) for _ in range(2)]
    for pod in theirs:
        api.put("pods", pod)
    with Running(disruptions(api, tmp_path)):
        run.disrupt(theirs[0])

        def marked(pod: dict) -> bool:
            found = run.current(pod)["status"].get("conditions") or []
            return fp.PEER_DISRUPTED in [c["type"] for c in found]

        eventually(lambda: marked(theirs[1]), 10)  # their own peer: marked
    assert not any(marked(pod) for pod in ours)
