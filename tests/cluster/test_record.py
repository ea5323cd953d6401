"""Each workload's failure history on the workload (``retry-policy.dev/history``): the
record's grammar and bounds, the controller writing it (against the HTTP test API, with
the real ``kubernetes`` client and the API's write semantics: a stale ``resourceVersion``
is 409 Conflict), and every replica reading it, so a replica started after a JobSet's
restart decides as one that saw the earlier runs."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from kubernetes import client

from testkit.builders import P, apply, decode_patch, job_owner, pod, review
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.records import (
    JOBSET_LABELS,
    POLICY,
    T0,
    a_job,
    a_jobset,
    api_client,
    child_job,
    concurrent_writer,
    failed_pod,
    relisted,
    running,
    stored_job,
    trainer,
)
from testkit.servers import eventually, scaled, start, stop
from webhook.cluster import history
from webhook.cluster.attempts import JOB_UID_LABEL, JobCache
from webhook.cluster.history import HistoryKey, HistoryLookup, Killed
from webhook.cluster.record import (
    ANNOTATION,
    MAX_LINEAGES,
    MAX_MARKS,
    Lineage,
    Record,
    lineage_key,
    merge,
)
from webhook.controller.recorder import HistoryRecorder
from webhook.kinds.registry import WORKLOADS

GI = 1024**3


# --- the record ------------------------------------------------------------------------------


def test_a_record_adds_each_pod_once_and_reads_back_what_it_wrote():
    first, second = failed_pod(node="node-a"), failed_pod(node="node-b", memory="3Gi")
    record = Record().add(first, True).add(second, True)
    assert record.add(first, True) is record  # the same pod again: no change
    again = Record.parse(record.text())
    assert again == record
    (line,) = again.lineages.values()
    assert line.counted == 2 and line.ignored == 0
    assert line.oom_kills == (Killed("trainer", 2, 3 * GI, 3 * GI),)
    assert line.nodes == ("node-a", "node-b") and line.last_cause == "oom-killed:trainer"
    shown = json.loads(record.text())
    assert shown["v"] == 1 and shown["lineages"][""]["last"] == ["oom-killed:trainer", T0]


def test_lineages_are_indexes_and_a_jobsets_replicated_jobs():
    # upstream: labelAndAnnotateObject (jobset pkg/controllers/jobset_controller.go) labels
    # a pod with replicatedjob-name and job-index; the Job controller annotates the
    # completion index (addCompletionIndexAnnotation).
    assert lineage_key({}) == ""
    indexed = {"annotations": {"batch.kubernetes.io/job-completion-index": "3"}}
    assert lineage_key(indexed) == "3"
    jobset = {
        "labels": {
            "jobset.sigs.k8s.io/jobset-uid": "set",
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "jobset.sigs.k8s.io/job-index": "1",
        },
        **indexed,
    }
    assert lineage_key(jobset) == "workers/1/3"


def test_a_record_is_bounded_whatever_happens():
    record = Record()
    for n in range(MAX_LINEAGES + 20):
        pod_ = failed_pod(at=f"2026-11-26T10:{n // 60:02d}:{n % 60:02d}Z")
        pod_["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = str(n)
        for k in range(20):
            pod_["spec"]["nodeName"] = f"ip-10-0-{k}-{n}.{'zone.' * 8}compute.internal"
            pod_["metadata"]["uid"] = str(uuid.uuid4())
            record = record.add(pod_, True)
    assert len(record.lineages) == MAX_LINEAGES
    assert str(MAX_LINEAGES + 19) in record.lineages and "0" not in record.lineages  # newest
    assert len(record.marks) == MAX_MARKS * history.MARK
    assert all(len(line.nodes) == history.MAX_NODES for line in record.lineages.values())
    # the worst case, as written: far below the 256 KiB the API allows all annotations
    assert len(record.text()) < 128 * 1024


@pytest.mark.parametrize(
    "raw", ["", "not json", "[]", '{"v":2}', '{"v":1,"lineages":{"":{"counted":"x"}}}']
)
def test_a_record_that_cannot_be_read_is_none_or_empty_never_an_error(raw):
    record = Record.parse(raw)
    assert record is None or record.lineages.get("", Lineage()).counted == 0


def test_merging_with_a_workers_own_answer_counts_a_failure_once():
    pod_ = failed_pod()
    record = Record().add(pod_, True)
    h = history.FailureHistory()
    h.record(pod_, "job-1", True)
    mine = h.lookup(HistoryKey("ml", "train", "job-1", "job-1", None, 1))
    merged = merge(mine, record.lineages[""])
    assert merged.oom_kills == (Killed("trainer", 1, 2 * GI, 2 * GI),)
    assert merged.nodes == ("node-a",) and merged.failures == 1
    assert merge(merged, record.lineages[""]) == merged  # idempotent
    gone = merge(HistoryLookup(True, source="failed pods (cache)"), record.lineages[""])
    assert gone.oom_kills == merged.oom_kills and gone.last_cause == "oom-killed:trainer"


# --- the controller writes it ----------------------------------------------------------------


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def record_of(obj: dict) -> Record | None:
    return Record.of(obj)


def test_the_leader_writes_a_jobs_failures_on_the_job_once_each(api, tmp_path):
    job = a_job(rules=[{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}])
    api.put("jobs", job)
    recorder = HistoryRecorder(api_client(api, tmp_path), window=0.05, linger=0.0)
    stop, thread = running(recorder)
    try:
        api.put("pods", failed_pod("uid-train", node="node-a"))
        preempted = failed_pod(
            "uid-train",
            node="node-b",
            oom=False,
            conditions=[
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ],
        )
        api.put("pods", preempted)
        record = eventually(
            lambda: (
                (r := record_of(stored_job(api, "uid-train")))
                and r.lineages[""].counted + r.lineages[""].ignored == 2
                and r
            ),
            10,
        )
        line = record.lineages[""]
        assert (line.counted, line.ignored) == (1, 1)  # the Ignore rule's, as the Job controller
        assert line.nodes == ("node-a",)  # a preempted pod's node did not fail it
        writes = recorder.stats()["writes"]
        since = len(api.requests)
        api.expire("pods")  # the watch ends with 410; the recorder lists every pod again
        eventually(lambda: relisted(api, since))
        recorder.flush()
        after = record_of(stored_job(api, "uid-train"))
        assert after == record and recorder.stats()["writes"] == writes
    finally:
        stop.set()
        thread.join(scaled(5))


def test_a_concurrent_writer_is_never_overwritten(api, tmp_path):
    """The write carries the resourceVersion it was computed from; when another writer
    changed the Job first, the API answers 409 and the recorder reads it again."""
    api.put("jobs", a_job())
    concurrent_writer(api, "uid-train", 1)
    recorder = HistoryRecorder(api_client(api, tmp_path), window=0.05, linger=0.0)
    stop, thread = running(recorder)
    try:
        api.put("pods", failed_pod("uid-train"))
        job = eventually(lambda: (j := stored_job(api, "uid-train")) and record_of(j) and j, 10)
        assert job["metadata"]["labels"] == {"team": "t1"}  # the other writer's change kept
        assert record_of(job).lineages[""].counted == 1
        assert any(status == 409 for _, _, status in api.failed_writes)
        assert recorder.stats()["conflicts"] >= 1
    finally:
        stop.set()
        thread.join(scaled(5))


def test_a_jobsets_record_outlives_its_restarts_and_a_new_replica_reads_it(api, tmp_path):
    """Run 0's pod is OOM-killed; the JobSet restarts, deleting the child Job and its
    pods; a replica started only then (a fresh JobCache) answers run 1's pod from the
    JobSet's record as a replica that saw run 0 would."""
    api.put("jobsets", a_jobset())
    run0 = child_job(0)
    api.put("jobs", run0)
    recorder = HistoryRecorder(api_client(api, tmp_path), window=0.05, linger=0.0)
    stop, thread = running(recorder)
    try:
        labels = {**JOBSET_LABELS, "jobset.sigs.k8s.io/restart-attempt": "0"}
        dead = failed_pod(run0["metadata"]["uid"], run0["metadata"]["name"], labels=labels)
        api.put("pods", dead)

        def recorded():
            with api.lock:
                obj = api.objects["jobsets"]["uid-pretrain"]
            return record_of(obj)

        record = eventually(recorded, 10)
        assert record.run == 0 and record.lineages["workers/0"].oom_kills[0].kills == 1
    finally:
        stop.set()
        thread.join(scaled(5))
    # The restart: child Job and pod deleted, run 1 made.
    api.delete("pods", dead["metadata"]["uid"])
    api.delete("jobs", run0["metadata"]["uid"])
    run1 = child_job(1)
    api.put("jobs", run1)
    cache = JobCache(*_clients(api, tmp_path), set_records=WORKLOADS.pod_records).start()
    try:
        assert cache.wait_synced(scaled(10))
        key = HistoryKey(
            "ml",
            run1["metadata"]["name"],
            run1["metadata"]["uid"],
            "uid-pretrain/workers/0",
            None,
            0,
            jobset="uid-pretrain",
            run=1,
        )
        answer = eventually(lambda: (a := cache.job_history(key)).oom_kills and a, 10)
        assert answer.kills("trainer") == 1 and answer.killed("trainer").limit == 2 * GI
        assert not answer.earlier_runs_unseen and "record" in answer.source
    finally:
        cache.stop()


def _clients(fake: FakeAPI, tmp_path):
    c = api_client(fake, tmp_path)
    return client.BatchV1Api(c), client.CoreV1Api(c)


# --- through the real server -----------------------------------------------------------------


def new_pod(job: dict, labels: dict) -> dict:
    """A pod of ``job`` as its CREATE review carries it (generateName, no name or uid)."""
    meta = job["metadata"]
    made = pod(
        dict(POLICY),
        namespace="ml",
        owner=job_owner(meta["name"], meta["uid"]),
        spec={"containers": [trainer()]},
    )
    made["metadata"]["labels"] = {JOB_UID_LABEL: meta["uid"], **labels}
    return made


def test_a_replica_started_after_a_restart_raises_memory_as_the_others(api, tmp_path):
    """Two servers as deployed: the first (its controller leading) sees run 0 fail and
    writes the JobSet's record; run 0's pods go with the restart; a second server started
    afterwards admits run 1's pod with the raise, from the record alone."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    env = {"KUBECONFIG": str(kubeconfig)}
    fast = ["--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period", "0.2"]
    api.put("jobsets", a_jobset())
    run0 = child_job(0)
    api.put("jobs", run0)
    first = start(tmp_path / "certs", "--kube", "kubeconfig", *fast, env=env)
    try:
        labels = {**JOBSET_LABELS, "jobset.sigs.k8s.io/restart-attempt": "0"}
        dead = failed_pod(run0["metadata"]["uid"], run0["metadata"]["name"], labels=labels)
        api.put("pods", dead)

        def recorded():
            with api.lock:
                return record_of(api.objects["jobsets"]["uid-pretrain"])

        eventually(recorded, 15)
    finally:
        stop(first)
    api.delete("pods", dead["metadata"]["uid"])
    api.delete("jobs", run0["metadata"]["uid"])
    run1 = child_job(1)
    api.put("jobs", run1)
    second = start(tmp_path / "certs", "--kube", "kubeconfig", *fast, env=env)
    try:
        labels = {**JOBSET_LABELS, "jobset.sigs.k8s.io/restart-attempt": "1"}
        made = new_pod(run1, labels)

        def raised():
            answer = second.review("/mutate", review(made))
            out = apply(made, decode_patch(answer))
            memory = out["spec"]["containers"][0]["resources"]["limits"]["memory"]
            return memory == "3Gi" and answer

        answer = eventually(raised, 15, 0.3)
        assert not any("left no failed pod" in w for w in answer["response"].get("warnings", []))
    finally:
        stop(second)


def test_the_record_is_no_policy_of_the_webhooks():
    """The controller's writes (and a manifest copied from ``kubectl get -o yaml``) carry
    the record: neither webhook denies or changes anything for it."""
    from testkit.builders import job, stored
    from testkit.workloads import mutate, validate

    old = stored(job({P + "backoff-limit": "2"}))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][ANNOTATION] = Record().add(failed_pod(), True).text()
    assert validate(new, operation="UPDATE", old=old).allowed
    verdict, _ = mutate(new, operation="UPDATE", old=old)
    assert verdict.allowed and verdict.patch == []
    copied = job({P + "backoff-limit": "2", ANNOTATION: new["metadata"]["annotations"][ANNOTATION]})
    verdict, out = mutate(copied)
    assert verdict.allowed, verdict.message
    assert (
        out["metadata"]["annotations"][ANNOTATION] == copied["metadata"]["annotations"][ANNOTATION]
    )
