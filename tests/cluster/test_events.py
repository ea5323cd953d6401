"""Events where users look (issue 32): each decision that shapes a new pod becomes a Normal
Event on the workload the user applied, and a Job our rules failed gets one Warning.

The decisions are the pod mutator's (run by the engine as admission runs it); the
workload is told from the pod as its CREATE review carries it, and a JobSet's TrainJob by
the real ``kubernetes`` client against the test suite's HTTP Kubernetes API
(testkit/fakeapi/), which stores the Events; the server tests run ``retry-webhook serve``
as deployed, its workers writing Events and its controller judging failed Jobs.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client, config

from testkit.builders import P, job, job_owner, pod, review, stored
from testkit.events import (
    FAIL_NON_RETRIABLE,
    JOBSET,
    NS,
    TRAINER,
    a_jobset,
    admitted_job,
    failed_by_policy,
    message_for,
    owner,
    put_cronjob_child,
    put_failed_indexes,
    put_trainjob_child,
    stored_events,
)
from testkit.failedpods import a_job, admit, admitted_until, failed, new_pod, with_spare_nodes
from testkit.failureaware import FACTOR, Source, job_pod, trainer
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.replicas import replica
from testkit.servers import eventually, free_port, metric, scaled, start, stop
from testkit.workloads import mutate
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.events import (
    Event,
    EventRecorder,
    Regarding,
    Workload,
    WorkloadKind,
    WorkloadResolver,
    Workloads,
)
from webhook.controller.failedjobs import FailedJobs
from webhook.kinds.registry import WORKLOADS

# --- decisions in the pod mutator ---------------------------------------------------------


class Budgeted(Source):
    """The attempt cache's answers with the Job's ``backoffLimit`` (its budget)."""

    def __init__(self, budget: int | None = 3, **kw):
        super().__init__(**kw)
        self.budget = budget

    def job_failures(self, namespace, name, uid):
        found = super().job_failures(namespace, name, uid)
        return AttemptLookup(found.failures, found.source, found.reason, budget=self.budget)


def test_a_memory_raise_and_avoided_nodes_are_decided_naming_the_attempt():
    source = Budgeted(3)
    first, _ = mutate(job_pod(), attempts=source)
    assert first.decisions == ()  # the first attempt: nothing decided
    source.fail(job_pod(), node="node-a")
    verdict, _ = mutate(job_pod(), attempts=source)
    assert verdict.decisions == (
        ("RetryMemoryIncreased", "attempt 2 of 4: container trainer 2Gi -> 3Gi after 1 OOM kill"),
        (
            "RetryNodesAvoided",
            "attempt 2 of 4: keeping off 1 node(s) where earlier attempts failed: node-a",
        ),
    )
    # The same admission again (a reinvocation of an unchanged pod, the memo): the same
    # words, so the server counts them into the same Events.
    again, _ = mutate(job_pod(), attempts=source)
    assert again.decisions == verdict.decisions
    assert all(len(note) < 200 for _, note in verdict.decisions)


def test_the_attempts_total_is_named_only_when_known_and_a_pod_changed_again_decides_nothing():
    source = Source()  # no budget: the Job's backoffLimit is not known for this pod
    source.fail(job_pod(), node="node-a")
    source.fail(job_pod(), node="node-b")
    verdict, out = mutate(job_pod(), attempts=source)
    memory_note = dict(verdict.decisions)["RetryMemoryIncreased"]
    assert memory_note == "attempt 3: container trainer 2Gi -> 3Gi after 2 OOM kills"
    # The webhook's own output, admitted again (reinvocationPolicy IfNeeded): no change,
    # no decision, no Event.
    second, _ = mutate(out, attempts=source)
    assert second.patch == [] and second.decisions == ()


def test_a_raise_held_by_the_limit_and_request_and_limit_moving_apart_are_said():
    source = Budgeted(2)
    containers = [trainer("1Gi", "2Gi")]
    annotations = {**FACTOR, P + "oom-memory-limit": "2560Mi"}
    source.fail(job_pod(annotations, containers=copy.deepcopy(containers)), node="n1")
    verdict, _ = mutate(job_pod(annotations, containers=containers), attempts=source)
    (decision,) = verdict.decisions
    assert decision == (
        "RetryMemoryIncreased",
        "attempt 2 of 3: container trainer request 1Gi -> 1536Mi, limit 2Gi -> 2560Mi after "
        "1 OOM kill (at most oom-memory-limit 2560Mi)",
    )


def test_an_indexed_jobs_pod_names_its_index():
    source = Budgeted(None)
    source.fail(job_pod(index=2), node="node-a")
    verdict, _ = mutate(job_pod(index=2), attempts=source)
    assert dict(verdict.decisions)["RetryNodesAvoided"].startswith("index 2, attempt 2: ")


def test_the_last_attempts_on_non_spot_nodes_are_decided():
    annotations = {P + "backoff-limit": "3", P + "non-spot-attempts": "1"}
    source = Budgeted(3, failures=3)
    verdict, _ = mutate(job_pod(annotations, containers=[trainer()]), attempts=source)
    assert verdict.decisions == (
        (
            "RetryOnNonSpot",
            "attempt 4 of 4: on non-spot nodes, as non-spot-attempts 1 asks for the last attempt",
        ),
    )
    earlier = Budgeted(3, failures=2)
    verdict, _ = mutate(job_pod(annotations, containers=[trainer()]), attempts=earlier)
    assert verdict.decisions == ()  # attempt 3 of 4 may run on spot nodes: nothing shaped


# --- the workload the user applied -------------------------------------------------------


def test_the_workload_is_told_from_the_pod_as_its_create_review_carries_it():
    job_pod_ = pod({}, owner=job_owner("train", "job-uid-1"))
    assert WORKLOADS.of_pod(job_pod_["metadata"], NS) == Regarding(
        "batch/v1", "Job", NS, "train", "job-uid-1"
    )
    # upstream: labelAndAnnotateObject (pkg/controllers/jobset_controller.go) labels a
    # JobSet's Jobs and pods with its name and, since v0.9.0, its UID.
    child = pod({}, owner=job_owner("train-workers-0", "child-uid"))
    child["metadata"]["labels"] = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/jobset-uid": "set-uid",
    }
    assert WORKLOADS.of_pod(child["metadata"], NS) == Regarding(
        JOBSET, "JobSet", NS, "train", "set-uid"
    )
    del child["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"]  # JobSet < v0.9.0
    assert WORKLOADS.of_pod(child["metadata"], NS) == Regarding(JOBSET, "JobSet", NS, "train", "")
    pytorch = pod({}, owner=owner("kubeflow.org/v1", "PyTorchJob", "bert", "pt-uid"))
    assert WORKLOADS.of_pod(pytorch["metadata"], NS) == Regarding(
        "kubeflow.org/v1", "PyTorchJob", NS, "bert", "pt-uid"
    )
    # A bare pod gets its UID after admission: no Event could be found on it.
    assert WORKLOADS.of_pod(pod({})["metadata"], NS) is None


def test_a_stored_job_is_its_own_workload_unless_a_jobset_made_it():
    plain = stored(job())
    assert WORKLOADS.of_job(plain) == Regarding(
        "batch/v1", "Job", NS, "train", plain["metadata"]["uid"]
    )
    cron = stored(job(name="nightly-2911"))
    cron["metadata"]["ownerReferences"] = [owner("batch/v1", "CronJob", "nightly", "cj-uid")]
    assert WORKLOADS.of_job(cron).kind == "Job"  # what kubectl describe job shows
    child = stored(job(name="train-workers-0"))
    child["metadata"]["ownerReferences"] = [owner(JOBSET, "JobSet", "train", "set-uid")]
    assert WORKLOADS.of_job(child) == Regarding(JOBSET, "JobSet", NS, "train", "set-uid")


def test_a_stored_pod_regards_its_labelled_workload_only_with_its_uid():
    """For its Events and its budget a stored pod regards the workload its labels name
    when they carry its UID too, else its Job; a pod no Job made regards nothing."""
    child = stored(pod({}, owner=job_owner("train-workers-0", "child-uid")))
    child["metadata"]["labels"] = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/jobset-uid": "set-uid",
    }
    assert WORKLOADS.of_stored_pod(child) == Regarding(JOBSET, "JobSet", NS, "train", "set-uid")
    del child["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"]  # JobSet < v0.9.0
    assert WORKLOADS.of_stored_pod(child) == Regarding(
        "batch/v1", "Job", NS, "train-workers-0", "child-uid"
    )
    pytorch = stored(pod({}, owner=owner("kubeflow.org/v1", "PyTorchJob", "bert", "pt-uid")))
    assert WORKLOADS.of_stored_pod(pytorch) is None
    declared = Workload(pod_labels=("example.dev/set", "example.dev/set-uid"))
    workloads = Workloads([WorkloadKind("example.dev", "v1", "Set", "sets", declared)])
    child["metadata"]["labels"] = {"example.dev/set": "a", "example.dev/set-uid": "a-uid"}
    assert workloads.of_stored_pod(child) == Regarding("example.dev/v1", "Set", NS, "a", "a-uid")


def test_the_kind_whose_records_pods_read_is_the_declared_one():
    """The admission's record cache watches the kind declared ``pod_records`` (a JobSet),
    by its group, version and plural; without one, it watches none."""
    assert (WORKLOADS.pod_records.api_version, WORKLOADS.pod_records.plural) == (
        JOBSET,
        "jobsets",
    )
    declared = WorkloadKind("example.dev", "v1", "Set", "sets", Workload(pod_records=True))
    assert Workloads([declared]).pod_records is declared
    assert Workloads([]).pod_records is None


def test_a_workload_is_found_as_its_kind_declares_it():
    """``cluster/events.py`` names no kind: a kind's ``Workload`` says whether its Jobs
    regard it and which labels its pods carry; an undeclared owner regards nothing."""
    declared = Workload(regards_jobs=True, pod_labels=("example.dev/set", "example.dev/set-uid"))
    workloads = Workloads([WorkloadKind("example.dev", "v1", "Set", "sets", declared)])
    child = stored(job(name="a-0"))
    child["metadata"]["ownerReferences"] = [owner("example.dev/v1", "Set", "a", "set-uid")]
    assert workloads.of_job(child) == Regarding("example.dev/v1", "Set", NS, "a", "set-uid")
    assert Workloads([]).of_job(child).kind == "Job"
    labelled = pod({}, owner=owner("batch/v1", "Job", "a-0", "job-uid"))
    labelled["metadata"]["labels"] = {"example.dev/set": "a"}
    assert workloads.of_pod(labelled["metadata"], NS) == Regarding(
        "example.dev/v1", "Set", NS, "a", ""
    )


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def api_client(fake: FakeAPI, tmp_path: Path):
    path = write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}", fake.url)
    return config.new_client_from_config(str(path))


def test_a_trainjobs_jobset_stands_for_the_trainjob(api, tmp_path):
    # upstream: JobSet.Build (kubeflow/trainer pkg/runtime/framework/plugins/jobset/
    # jobset.go, v2.2 and v2.3): the JobSet is named after the TrainJob and owned by it
    # (WithOwnerReferences ... WithUID(trainJob.UID).WithController(true)); the pods and
    # Jobs carry no TrainJob label.
    api.store("jobsets", a_jobset("llama", "set-1", trainjob=("llama", "tj-uid")))
    api.store("jobsets", a_jobset("plain", "set-2"))
    resolver = WorkloadResolver(client.CustomObjectsApi(api_client(api, tmp_path)), WORKLOADS)
    asked = Regarding(JOBSET, "JobSet", NS, "llama", "set-1")
    assert resolver.resolve(asked) == Regarding(TRAINER, "TrainJob", NS, "llama", "tj-uid")
    assert resolver.resolve(asked).uid == "tj-uid"
    gets = [p for p, _ in api.requests if p.endswith("/jobsets/llama")]
    assert len(gets) == 1  # asked once: the relation of a JobSet to its owner never changes
    # A JobSet of its own, its UID read when its pods could not say it (JobSet < v0.9.0).
    plain = Regarding(JOBSET, "JobSet", NS, "plain", "")
    assert resolver.resolve(plain) == Regarding(JOBSET, "JobSet", NS, "plain", "set-2")
    # Unreadable (RBAC): the JobSet itself when its UID is known, else no Event at all.
    api.forbidden.add(("jobsets", "gone"))
    known = Regarding(JOBSET, "JobSet", NS, "gone", "set-3")
    assert resolver.resolve(known) == known
    assert resolver.resolve(Regarding(JOBSET, "JobSet", NS, "gone", "")) is None
    job_ = Regarding("batch/v1", "Job", NS, "train", "job-uid")
    assert resolver.resolve(job_) == job_  # only JobSets are asked about


# --- the recorder: repeats still queued count into one write ------------------------------


def test_repeats_still_queued_are_one_write_with_their_count(api, tmp_path):
    events_api = client.EventsV1Api(api_client(api, tmp_path))
    recorder = EventRecorder(events_api, "webhook-0")
    gate = threading.Event()
    writing = threading.Event()
    api.before_write = lambda method, resource, name: writing.set() or gate.wait(scaled(5))
    job_ = Regarding("batch/v1", "Job", NS, "train", "job-uid-1")
    first = Event(job_, "Normal", "RetryNodesAvoided", "attempt 2 of 4: keeping off 1 node(s)")
    burst = Event(job_, "Normal", "RetryMemoryIncreased", "attempt 2 of 4: container x 1 -> 2")
    recorder.emit(first)
    assert writing.wait(scaled(5))  # the writer holds ``first`` in its POST (the API is slow)
    for _ in range(5):
        assert recorder.emit(burst)  # a thousand pods' same decision, here five
    gate.set()
    assert recorder.flush()
    events = {e["reason"]: e for e in stored_events(api)}
    assert "series" not in events["RetryNodesAvoided"]
    assert events["RetryMemoryIncreased"]["series"]["count"] == 5
    posts = [p for p, _ in api.requests if p.startswith("POST ")]
    assert len(posts) == 2
    assert recorder.stats()["written"] == 2 and recorder.stats()["aggregated"] == 4


def test_repeats_of_a_written_event_are_held_and_counted_in_one_write(api, tmp_path):
    """Repeats that come one by one, after their Event was written, are held: one update of
    its series when ``series_seconds`` have passed, however many came meanwhile (client-go
    writes a series' count every ``refreshTime`` and when it ends, ``finishSeries``); an
    Event gone meanwhile (the API server's TTL) is written anew with its count."""
    events_api = client.EventsV1Api(api_client(api, tmp_path))
    recorder = EventRecorder(events_api, "webhook-0", series_seconds=scaled(1.5))
    job_ = Regarding("batch/v1", "Job", NS, "train", "job-uid-1")
    said = Event(job_, "Normal", "RetryFailureClassified", "a pod failed: OOMKilled")
    recorder.emit(said)
    eventually(lambda: recorder.stats()["written"] == 1, 10)
    for _ in range(3):  # one at a time, each handled before the next comes
        recorder.emit(said)
        eventually(lambda: recorder._queue.unfinished_tasks == 0, 10)
    assert "series" not in stored_events(api)[0]  # held
    (event,) = eventually(lambda: (e := stored_events(api)) and "series" in e[0] and e, 10)
    assert event["series"]["count"] == 4
    eventually(lambda: recorder.stats()["aggregated"] == 3, 10)  # (counted once answered)
    assert len([p for p, _ in api.requests if p.startswith("PUT ")]) == 1

    recorder.emit(said)
    with api.lock:  # expired before its repeat's turn came
        api.named["events"].clear()
    assert recorder.flush()  # (a flush writes what is held, due or not)
    (event,) = stored_events(api)
    assert "series" not in event and recorder.stats()["written"] == 2

    recorder.emit(said)  # held, and then its namespace is deleted: nobody can read it
    with api.lock:
        api.named["events"].clear()
    api.gone_namespaces.add(NS)
    assert recorder.flush()
    stats = recorder.stats()
    assert (stats["moot"], stats["dropped"]) == (1, 0) and stored_events(api) == []


def test_a_held_repeat_is_written_when_due_though_the_queue_is_never_empty(api, tmp_path):
    """A backlog of other Events (a slow API): the repeat's series is written once it is
    due, between two of them, not when the queue has run dry."""
    events_api = client.EventsV1Api(api_client(api, tmp_path))
    recorder = EventRecorder(events_api, "webhook-0", series_seconds=0.3, burst=10_000)
    job_ = Regarding("batch/v1", "Job", NS, "train", "job-uid-1")
    said = Event(job_, "Normal", "RetryNodesAvoided", "attempt 2 of 4")
    recorder.emit(said)
    eventually(lambda: recorder.stats()["written"] == 1, 10)
    api.write_delay["events"] = 0.02
    recorder.emit(said)
    for n in range(60):  # a second of writes, queued at once
        recorder.emit(Event(job_, "Normal", "RetryMemoryIncreased", f"attempt {n}"))
    eventually(lambda: any(e.get("series") for e in stored_events(api)), 10)
    assert recorder._queue.unfinished_tasks > 0, "the repeat waited for the queue to run dry"
    assert recorder.flush(scaled(30))


def test_an_event_said_once_is_not_counted_again(api, tmp_path):
    job_ = Regarding("batch/v1", "Job", NS, "train", "job-uid-1")
    once = Event(job_, "Warning", "RetryPolicyFailedJob", "container main exited 42", once=True)
    for instance in ("controller-a", "controller-b"):  # a restart, or another replica
        recorder = EventRecorder(client.EventsV1Api(api_client(api, tmp_path)), instance)
        recorder.emit(once)
        recorder.emit(once)
        assert recorder.flush()
    (event,) = stored_events(api)
    assert "series" not in event and event["reportingInstance"] == "controller-a"
    assert ("POST", event["metadata"]["name"], 409) in api.failed_writes


def test_an_event_in_a_namespace_being_deleted_is_moot_not_dropped(api, tmp_path):
    """The API refuses it as the real one does (tests/controlplane/test_events.py); like
    client-go's ``recordEvent``, that is not an error: the Event is not retried, nor
    counted as lost (``dropped`` is what an admin alerts on)."""
    recorder = EventRecorder(client.EventsV1Api(api_client(api, tmp_path)), "webhook-0")
    api.terminating.add(NS)
    recorder.emit(Event(Regarding("batch/v1", "Job", NS, "train", "job-uid-1"), "Normal", "R", "n"))
    assert recorder.flush()
    assert stored_events(api) == []
    stats = recorder.stats()
    assert (stats["moot"], stats["dropped"], stats["written"]) == (1, 0, 0)
    assert [(m, code) for m, _, code in api.failed_writes] == [("POST", 403)]  # tried once


# --- RetryPolicyFailedJob: the controller's reconciler --------------------------------------


def reconcile(fake: FakeAPI, tmp_path: Path, instance: str = "controller-a", **kw):
    """A reconciler run until it has judged every Job the API holds; its recorder."""
    api = api_client(fake, tmp_path)
    recorder = EventRecorder(client.EventsV1Api(api), instance)
    resolver = WorkloadResolver(client.CustomObjectsApi(api), WORKLOADS)
    recorder.resolve = resolver.resolve
    reconciler = FailedJobs(client.BatchV1Api(api), client.CoreV1Api(api), recorder, resolver, **kw)
    handled: set[str] = set()  # judged, and its Event (if any) handed to the recorder
    seen = reconciler._seen

    def handling(kind: str, job: dict) -> None:
        seen(kind, job)
        handled.add(job["metadata"]["uid"])

    reconciler._seen = handling  # read by its informer when it starts
    stop_event = threading.Event()
    thread = threading.Thread(target=reconciler.run, args=(stop_event,), daemon=True)
    thread.start()
    with fake.lock:
        uids = set(fake.objects["jobs"])
        failed_uids = {
            uid
            for uid in uids
            if any(
                c["type"] == "Failed"
                for c in fake.objects["jobs"][uid]["status"].get("conditions", [])
            )
        }
    eventually(lambda: failed_uids <= handled, 10)  # (``_done`` is set before the emit)
    assert recorder.flush()
    stop_event.set()
    return recorder


def test_a_job_our_failjob_rule_failed_gets_one_warning_even_after_a_restart(api, tmp_path):
    train = admitted_job({**FAIL_NON_RETRIABLE, P + "backoff-limit": "3"})
    rules = train["spec"]["podFailurePolicy"]["rules"]
    assert rules[1]["action"] == "FailJob"  # after the Count rule on DisruptionTarget
    api.put("jobs", failed_by_policy(train, message_for(train, index=1)))
    reconcile(api, tmp_path)
    (event,) = stored_events(api)
    assert (event["type"], event["reason"]) == ("Warning", "RetryPolicyFailedJob")
    assert event["note"] == (
        "container main exited 42, not in retriable-exit-codes 143: failed at once as "
        "fail-non-retriable asked"
    )
    assert event["regarding"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "namespace": NS,
        "name": "train",
        "uid": train["metadata"]["uid"],
    }
    assert event["reportingController"] == "retry-policy.dev/webhook"
    # A new controller (a restart, or another replica taking the Lease) lists the Job
    # again: the Event is there (409), nothing is added to it.
    again = reconcile(api, tmp_path, instance="controller-b")
    (event,) = stored_events(api)
    assert "series" not in event and event["reportingInstance"] == "controller-a"
    assert again.stats()["written"] == 0 and again.stats()["aggregated"] == 0


def test_only_our_rules_within_the_window_get_a_warning(api, tmp_path):
    # A rule the user wrote (FailJob on 42) decided: the Job controller's words suffice.
    theirs = admitted_job(
        FAIL_NON_RETRIABLE,
        name="theirs",
        podFailurePolicy={
            "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
        },
    )
    assert theirs["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [42]
    api.put("jobs", failed_by_policy(theirs, message_for(theirs, index=0)))
    # Our rule, but an hour and more ago: a restarted controller does not say it again
    # (the API server has deleted the Event by then: --event-ttl, 1 h by default).
    old = admitted_job(FAIL_NON_RETRIABLE, name="old")
    api.put("jobs", failed_by_policy(old, message_for(old), ago=3700))
    # Our rules, but the budget ran out: the Job controller's condition says so.
    spent = admitted_job(FAIL_NON_RETRIABLE, name="spent")
    spent = failed_by_policy(spent, "Job has reached the specified backoff limit")
    for condition in spent["status"]["conditions"]:
        condition["reason"] = "BackoffLimitExceeded"
    api.put("jobs", spent)
    # A rule of our shape on a Job the webhook never admitted.
    hand = stored(job(name="hand"))
    hand["spec"]["podFailurePolicy"] = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [143]},
            }
        ]
    }
    api.put("jobs", failed_by_policy(hand, message_for(hand, index=0)))
    reconcile(api, tmp_path)
    assert stored_events(api) == []


def test_a_jobset_child_job_warns_on_the_trainjob_the_user_applied(api, tmp_path):
    """The Warning regards the TrainJob and names the child Job; the record is the
    JobSet's."""
    put_trainjob_child(api)
    reconcile(api, tmp_path)
    (event,) = stored_events(api)
    assert event["regarding"] == {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "namespace": NS,
        "name": "llama",
        "uid": "tj-uid",
    }
    assert event["note"].startswith("Job llama-node-0: container main exited 1, not in ")


def test_a_cronjobs_job_takes_the_cronjobs_record(api, tmp_path):
    put_cronjob_child(api)
    reconcile(api, tmp_path)
    (event,) = stored_events(api)
    assert event["regarding"]["name"] == "nightly-1" and event["regarding"]["kind"] == "Job"
    assert event["note"] == (
        "container main exited 2, not in retriable-exit-codes 137,143: failed at once as "
        "fail-non-retriable asked"
    )


def test_indexes_our_failindex_rule_failed_are_named(api, tmp_path):
    """The failed pods are judged by the Job's rules as the Job controller judges them:
    only index 2 failed by our FailIndex rule."""
    put_failed_indexes(api)
    reconcile(api, tmp_path)
    (event,) = stored_events(api)
    assert event["regarding"]["name"] == "indexed"
    assert event["note"] == (
        "index 2: container main exited 42, not in retriable-exit-codes 143: failed at once "
        "as fail-non-retriable asked (on-non-retriable fail-index); the Job failed: FailedIndexes"
    )


# --- through the real server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    fake = with_spare_nodes(FakeAPI().start())
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, cluster):
    tmp = tmp_path_factory.mktemp("events")
    write_kubeconfig(tmp / "kubeconfig", cluster.url)
    srv = start(
        tmp / "certs",
        "--kube",
        "kubeconfig",
        "--no-controller",
        "--event-series-seconds",
        "0.2",  # repeats counted in a fifth of a second, not half a minute
        metrics_port=free_port(),
        env={"KUBECONFIG": str(tmp / "kubeconfig"), "POD_NAME": "webhook-7d9f-abcde"},
    )
    yield srv
    stop(srv)


def once_oom_killed(cluster: FakeAPI, name: str) -> dict:
    """A Job (backoffLimit 3) whose first pod was OOM-killed on node-a, as the cache sees it."""
    made = a_job(name, backoffLimit=3)
    cluster.put("jobs", made)
    cluster.put("pods", failed(new_pod(made), "node-a"))
    made["status"]["failed"] = 1
    cluster.put("jobs", made)
    return made


def events_of(cluster: FakeAPI, name: str) -> dict[str, dict]:
    return {e["reason"]: e for e in stored_events(cluster) if e["regarding"]["name"] == name}


def raised(obj: dict) -> bool:
    return obj["spec"]["containers"][0]["resources"]["limits"]["memory"] != "2Gi"


def test_a_pod_given_more_memory_writes_events_on_its_job(server, cluster):
    made = once_oom_killed(cluster, "ev-oom")
    admitted_until(server, new_pod(made), raised)
    events = eventually(lambda: (e := events_of(cluster, "ev-oom")) and len(e) == 2 and e, 10)
    memory = events["RetryMemoryIncreased"]
    assert memory["note"] == "attempt 2 of 4: container trainer 2Gi -> 3Gi after 1 OOM kill"
    assert memory["type"] == "Normal" and memory["action"] == "Admit"
    assert memory["regarding"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "namespace": NS,
        "name": "ev-oom",
        "uid": made["metadata"]["uid"],
    }
    assert memory["reportingController"] == "retry-policy.dev/webhook"
    assert memory["reportingInstance"] == "webhook-7d9f-abcde"  # $POD_NAME
    assert events["RetryNodesAvoided"]["note"] == (
        "attempt 2 of 4: keeping off 1 node(s) where earlier attempts failed: node-a"
    )

    def counted():
        return metric(server.metrics(), "retry_webhook_events_total", result="written") >= 2

    eventually(counted)


def test_a_dry_run_writes_none_and_a_repeat_counts_into_the_same_event(server, cluster):
    made = once_oom_killed(cluster, "ev-dry")
    pod_ = new_pod(made)
    admitted_until(server, pod_, raised)  # until the cache knows: the first real admission
    events = eventually(lambda: (e := events_of(cluster, "ev-dry")) and len(e) == 2 and e, 10)
    assert all("series" not in e for e in events.values())
    dry = server.review("/mutate", review(pod_, dry_run=True))["response"]
    assert "patch" in dry  # the answer is the same, only nothing is recorded
    # The same pod again (the API server refused the first create, the Job controller
    # tries again; or another replica admits the twin): counted, not multiplied.
    admit(server, pod_)

    def counted_twice():
        found = events_of(cluster, "ev-dry")
        counts = [(e.get("series") or {}).get("count") for e in found.values()]
        return counts == [2, 2]

    # One worker writes in order: the dry run came before the repeat, so had it been
    # written, the count would be 3 by now.
    eventually(counted_twice, 10)
    counts = [e["series"]["count"] for e in events_of(cluster, "ev-dry").values()]
    assert counts == [2, 2]


def test_an_api_failing_event_writes_neither_slows_nor_fails_admission(server, cluster):
    made = once_oom_killed(cluster, "ev-down")
    pod_ = new_pod(made)
    admitted_until(server, pod_, raised)
    eventually(lambda: len(events_of(cluster, "ev-down")) == 2, 10)
    cluster.write_status["events"] = 500
    cluster.write_delay["events"] = scaled(1.0)  # and slow: each write waits before failing
    try:
        other = once_oom_killed(cluster, "ev-down-2")
        admitted_until(server, new_pod(other), raised)
        for _ in range(3):
            started = time.monotonic()
            response, out = admit(server, new_pod(other))
            assert time.monotonic() - started < 1.5 * cluster.write_delay["events"], "it waited"
            assert raised(out) and response["allowed"]

        def dropped():
            return metric(server.metrics(), "retry_webhook_events_total", result="dropped") >= 2

        eventually(dropped, 40)
    finally:
        cluster.write_status.clear()
        cluster.write_delay.clear()
    assert events_of(cluster, "ev-down-2") == {}


# --- the controller, as deployed ----------------------------------------------------------


def test_the_controller_warns_once_even_after_it_restarts(api, tmp_path):
    train = admitted_job(
        {**FAIL_NON_RETRIABLE, P + "backoff-limit": "2"}, name=f"t-{uuid.uuid4().hex[:6]}"
    )
    api.put("jobs", failed_by_policy(train, message_for(train)))
    first = replica(tmp_path, api, "one")
    try:
        (event,) = eventually(lambda: stored_events(api), 20)
    finally:
        stop(first)
    assert event["reason"] == "RetryPolicyFailedJob" and event["reportingInstance"] == "one"
    name = event["metadata"]["name"]
    second = replica(tmp_path, api, "two")
    try:
        # The new controller judged the Job again: its create found the Event (409).
        eventually(lambda: ("POST", name, 409) in api.failed_writes, 20)
    finally:
        stop(second)
    (event,) = stored_events(api)
    assert "series" not in event and event["reportingInstance"] == "one"
