"""The controller's budgets per cause against the HTTP test API, with the real
``kubernetes`` client: the test plays the scheduler, the kubelet and the Job controller
(``testkit/jobsim.py``), the reconcilers (``webhook.controller.disruptions``,
``webhook.controller.restarts``) act on what they see, and the Job's own rules, as the
webhook wrote them, judge each pod."""

from __future__ import annotations

import copy
import time

import pytest

from testkit.builders import P, stored
from testkit.controllers import (
    DISRUPTIONS,
    IN_PLACE,
    Counted,
    Running,
    acted,
    admitted_job,
    disruptions,
    events_of,
    in_place,
    preempt,
    record_of,
)
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun
from testkit.servers import eventually
from testkit.workloads import mutate
from webhook.cluster.record import Record
from webhook.controller.restarts import InPlaceBudget
from webhook.kube import failurepolicy as fp
from webhook.kube.restartrules import restarts


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


# --- max-disruptions --------------------------------------------------------------------------


def test_two_preemptions_are_free_and_the_third_counts(api, tmp_path):
    """backoffLimit 0 and max-disruptions 2: two preempted pods are ignored as any
    disruption; the third gets DisruptionBudgetExhausted while it terminates, the Job's
    first rule counts it, and the Job fails (BackoffLimitExceeded)."""
    run = JobRun.store(api, admitted_job(DISRUPTIONS))
    metrics = Counted()
    with Running(disruptions(api, tmp_path, metrics)) as reconciler:
        assert [preempt(run, reconciler)[1] for _ in range(2)] == ["Ignore", "Ignore"]
        assert run.counted == 0 and not run.ended
        third, action = preempt(run, reconciler)
        assert action == "Count" and run.ended == "BackoffLimitExceeded"
        assert fp.DISRUPTION_BUDGET_EXHAUSTED in [c["type"] for c in third["status"]["conditions"]]
        record = eventually(
            lambda: (r := record_of(api, run.uid)) and r.disruptions_of() == 3 and r, 10
        )
        assert record.disrupted(third["metadata"]["uid"]) == "over"
        reconciler.events.flush()
    assert ("condition", fp.DISRUPTION_BUDGET_EXHAUSTED, "added") in metrics.calls
    assert metrics.calls.count(("disruption", "free")) == 2
    counted = events_of(api, "RetryDisruptionCounted")
    assert [e["type"] for e in counted].count("Normal") == 2
    (over,) = [e for e in counted if e["type"] == "Warning"]
    assert (
        "disruption 3, over max-disruptions 2: it counts against the retry budget" in (over["note"])
    )
    assert over["regarding"]["kind"] == "Job" and over["regarding"]["uid"] == run.uid
    assert any("disruption 1 of 2 free" in e["note"] for e in counted)


def test_the_count_survives_a_controller_restart_and_the_pods_going(api, tmp_path):
    """Two disruptions counted by one controller; their pods judged and deleted; a new
    controller (a restart, or another replica's) reads the count from the Job."""
    run = JobRun.store(api, admitted_job(DISRUPTIONS))
    with Running(disruptions(api, tmp_path)) as first:
        pods = [preempt(run, first)[0] for _ in range(2)]
        eventually(lambda: (r := record_of(api, run.uid)) and r.disruptions_of() == 2, 10)
    assert all(api.pod(pod["metadata"]["uid"]) is None for pod in pods)  # judged, deleted
    with Running(disruptions(api, tmp_path)) as second:
        assert preempt(run, second)[1] == "Count"


def test_a_pod_counted_over_before_a_restart_gets_its_condition_again(api, tmp_path):
    """The count was written but the condition lost (say the controller stopped in
    between): the record's mark says over, so the next controller adds it."""
    run = JobRun.store(api, admitted_job(DISRUPTIONS))
    pod = run.new_pod()
    run.disrupt(pod)
    record = Record()
    for _ in range(2):
        record = record.add_disruption({"metadata": {"uid": f"gone-{_}"}}, False)
    record = record.add_disruption(run.current(pod), True)
    with api.lock:
        api.objects["jobs"][run.uid]["metadata"].setdefault("annotations", {})[
            "retry-policy.dev/history"
        ] = record.text()
    with Running(disruptions(api, tmp_path)):
        eventually(
            lambda: (
                fp.DISRUPTION_BUDGET_EXHAUSTED
                in [c["type"] for c in run.current(pod)["status"]["conditions"]]
            ),
            10,
        )
    assert record_of(api, run.uid).disruptions_of() == 3  # not counted twice


def test_the_condition_goes_with_the_latest_version_the_watch_brought(api, tmp_path):
    """Preemption adds DisruptionTarget, then deletes the pod (``PrepareCandidate``): two
    versions, both seen before the count, which was queued with the first. The condition
    is written with the latest: one request, no 409, no read (a group of a thousand pods
    preempted at once costs the critical limiter a thousand writes, not three thousand
    requests: benchmarks/landing.py)."""
    run = JobRun.store(api, admitted_job({**DISRUPTIONS, P + "max-disruptions": "0"}))
    pod = run.new_pod()
    targeted = run.disrupt(pod, delete=False)
    with api.lock:
        api.delete_pod(targeted["metadata"]["namespace"], targeted["metadata"]["name"], None)
    deleted = run.current(pod)
    reconciler = disruptions(api, tmp_path)
    for version in (targeted, deleted):  # as the watch delivers them
        reconciler._budget_event("MODIFIED", version)
    first = len(api.requests)
    reconciler.count(targeted)  # (what was queued first)
    patched = run.current(pod)
    assert _conditions(patched).get(fp.DISRUPTION_BUDGET_EXHAUSTED) == "True"
    assert api.failed_writes == []
    pods = [call for call, _ in api.requests[first:] if "/pods/" in call]
    assert pods == [f"PATCH /api/v1/namespaces/ml/pods/{pod['metadata']['name']}/status"]
    # A pod whose latest version is Failed gets no write: it is settled late at once.
    late = run.new_pod()
    targeted = run.disrupt(late, delete=False)
    failed = run.fail(late)
    for version in (targeted, failed):
        reconciler._budget_event("MODIFIED", version)
    first = len(api.requests)
    reconciler.count(targeted)
    assert not [call for call, _ in api.requests[first:] if "/pods/" in call]
    assert reconciler._latest == {}


def test_a_mark_whose_pod_ended_while_it_waited_for_its_token_is_not_sent(api, tmp_path):
    """A thousand pods preempted at once queue their marks behind the critical limiter
    for seconds; a pod the kubelet fails meanwhile (the watch brings it ``Failed``) is
    judged without the mark, and a write for it would be refused (409) or answered 404
    for a token a running pod could have had. It is not sent: the pod is settled late
    (its count lowers backoffLimit, as after the 409 and the read), with no request."""
    from kubernetes import client

    from testkit.controllers import client_of
    from webhook.cluster.events import EventRecorder
    from webhook.controller.disruptions import Disruptions
    from webhook.controller.fence import Fence, fenced_client
    from webhook.controller.ratelimit import Limits

    budget = {**DISRUPTIONS, P + "max-disruptions": "0", P + "backoff-limit": "1"}
    run = JobRun.store(api, admitted_job(budget))
    pod = run.new_pod()
    targeted = run.disrupt(pod)
    reconciler_box: list[Disruptions] = []
    now, ended = [0.0], []

    def sleep(seconds: float) -> None:  # the wait for a token: the kubelet fails the pod
        now[0] += seconds
        if not ended:
            ended.append(run.terminate(pod, code=143))
            reconciler_box[0]._budget_event("MODIFIED", ended[0])

    limits = Limits(1, 1, clock=lambda: now[0], sleep=sleep)
    limits.buckets["critical"].take()  # the burst spent on the pods before this one
    fence = Fence()
    fence.extend(time.monotonic() + 3600)
    acting = fenced_client(client_of(api, tmp_path).configuration, fence, limits)
    events = EventRecorder(client.EventsV1Api(acting), "test")
    reconciler = Disruptions(acting, events, None, window=0.05)
    reconciler_box.append(reconciler)
    reconciler._budget_event("MODIFIED", targeted)
    first = len(api.requests)
    reconciler.count(targeted)
    reconciler.flush()
    assert not [call for call, _ in api.requests[first:] if "/pods/" in call]
    assert fp.DISRUPTION_BUDGET_EXHAUSTED not in _conditions(run.current(pod))
    assert run._job()["spec"]["backoffLimit"] == 0 and record_of(api, run.uid).late_lowered(
        pod["metadata"]["uid"]
    )


def _job_patches(api, since: int = 0) -> int:
    return sum(1 for call, _ in api.requests[since:] if call.startswith("PATCH /apis/batch"))


def test_a_pod_failed_before_its_count_is_settled_in_the_counts_write(api, tmp_path):
    """PodGC fails the pod with DisruptionTarget in one update: over the budget, no
    condition can land, and the Job's backoffLimit is lowered for it in the same write as
    its count, not in one more once a worker found it Failed."""
    from concurrent.futures import ThreadPoolExecutor

    run = JobRun.store(api, admitted_job({**DISRUPTIONS, P + "backoff-limit": "3"}))
    reconciler = disruptions(api, tmp_path)
    reconciler._pool = ThreadPoolExecutor(1)  # as while it runs
    try:
        for _ in range(3):  # two free, the third over
            pod = run.podgc(run.new_pod())
            reconciler._budget_event("MODIFIED", pod)
            first = len(api.requests)
            reconciler.count(pod)
            reconciler.flush()
            assert _job_patches(api, first) == 1
    finally:
        reconciler._pool.shutdown(wait=True)
    record = record_of(api, run.uid)
    assert record.disruptions_of() == 3
    assert record.late_lowered(pod["metadata"]["uid"]) is True
    assert run._job()["spec"]["backoffLimit"] == 2


def test_what_came_during_a_write_goes_in_the_next_one(api, tmp_path):
    """Disruptions of two Jobs, interleaved, queued while the API is slow (each request
    0.1 s, a Job read the first time each is counted): everything queued is counted
    before the next write, so each Job's disruptions go in one write, however long the
    writes and reads take (a node lost, a slow API, the limiter)."""
    from testkit.pacing import Paced

    runs = [JobRun.store(api, admitted_job(DISRUPTIONS, f"train-{i}")) for i in range(2)]
    pods = [run.podgc(run.new_pod()) for _ in range(3) for run in runs]
    reconciler = disruptions(api, tmp_path)
    for pod in pods:
        reconciler._budget_event("MODIFIED", pod)
    api.pace = Paced(latency=0.1)
    first = len(api.requests)
    with Running(reconciler):
        eventually(lambda: all(record_of(api, run.uid) for run in runs), 10)
        eventually(lambda: all(record_of(api, r.uid).disruptions_of() == 3 for r in runs), 10)
    assert _job_patches(api, first) == 2


def test_an_indexed_job_counts_per_index(api, tmp_path):
    """backoffLimitPerIndex: each index has its own N (its pods carry
    job-index-failure-count, ``addIndexFailureCountAnnotation``)."""
    spec = {
        "completionMode": "Indexed",
        "completions": 2,
        "parallelism": 2,
        "backoffLimitPerIndex": 1,
    }
    annotations = {P + "ignore-disruptions": "true", P + "max-disruptions": "1"}
    run = JobRun.store(api, admitted_job(annotations, **spec))
    with Running(disruptions(api, tmp_path)) as reconciler:
        judged = []
        for index in (0, 1, 0):
            pod = run.new_pod(index, 0)
            run.disrupt(pod)
            eventually(lambda p=pod: acted(reconciler, run.current(p)), 10)
            run.fail(pod)
            judged.append(run.judge(pod))
    assert judged == ["Ignore", "Ignore", "Count"]  # index 1's was its own first
    record = eventually(lambda: (r := record_of(api, run.uid)) and r.disruptions_of() == 3 and r)
    assert record.disruptions == {"0": 2, "1": 1}


def test_a_jobsets_budget_is_the_sets_across_its_runs(api, tmp_path):
    from testkit.kinds import jobset

    verdict, out = mutate(jobset({P + "ignore-disruptions": "true", P + "max-disruptions": "1"}))
    assert verdict.allowed
    jobset_obj = stored(out, uid="uid-pretrain")
    api.put("jobsets", jobset_obj)
    runs = []
    for run_number in (0, 1):
        child = copy.deepcopy(jobset_obj["spec"]["replicatedJobs"][1]["template"])
        labels = {
            "jobset.sigs.k8s.io/jobset-name": "pretrain",
            "jobset.sigs.k8s.io/jobset-uid": "uid-pretrain",
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "jobset.sigs.k8s.io/job-index": "0",
            "jobset.sigs.k8s.io/restart-attempt": str(run_number),
        }
        child["spec"]["template"]["metadata"]["labels"].update(labels)
        child["metadata"] = {"name": f"pretrain-workers-0-r{run_number}", "namespace": "ml"}
        child["apiVersion"], child["kind"] = "batch/v1", "Job"
        child["spec"]["backoffLimit"] = 0
        runs.append(JobRun.store(api, child, uid=f"child-{run_number}"))
    with Running(disruptions(api, tmp_path)) as reconciler:
        assert preempt(runs[0], reconciler)[1] == "Ignore"
        assert preempt(runs[1], reconciler)[1] == "Count"  # the set's second, in a new run
    record = eventually(lambda: (r := record_of(api, "uid-pretrain", "jobsets")) and r)
    assert record.disruptions_of() == 2 and record.disruptions == {"workers/0": 2}


# --- peer-disruptions -----------------------------------------------------------------------


def test_the_running_peers_of_a_preempted_pod_are_marked_and_ignored(api, tmp_path):
    """One of four workers preempted; torchrun's static rendezvous makes the others exit 1:
    with fail-non-retriable that would be FailJob, with peer-disruptions they are ignored.
    A peer that had already failed and been judged is not marked (missed)."""
    annotations = {
        P + "fail-non-retriable": "true",
        P + "ignore-disruptions": "true",
        P + "peer-disruptions": "ignore",
    }
    run = JobRun.store(api, admitted_job(annotations, parallelism=5, completions=5))
    metrics = Counted()
    pods = [run.new_pod() for _ in range(5)]
    done = run.fail(pods[4], 1)  # failed for its own reason earlier, judged: FailJob
    with Running(disruptions(api, tmp_path, metrics)) as reconciler:
        assert run.judge(done) == "FailJob"
        run.ended = ""  # (for the test: the rest is judged as if it had not failed the Job)
        run.disrupt(pods[0], "EvictionByEvictionAPI")
        eventually(
            lambda: all(
                fp.PEER_DISRUPTED in [c["type"] for c in run.current(p)["status"]["conditions"]]
                for p in pods[1:4]
            ),
            10,
        )
        reconciler.events.flush()
    disrupted = run.current(pods[0])["status"]["conditions"]
    assert fp.PEER_DISRUPTED not in [c["type"] for c in disrupted]
    for peer in pods[1:4]:
        run.fail(peer, 1)
        assert run.judge(peer) == "Ignore"
    run.fail(pods[0])
    assert run.judge(pods[0]) == "Ignore"
    assert metrics.calls.count(("condition", fp.PEER_DISRUPTED, "added")) == 3
    (event,) = events_of(api, "RetryDisruptionCounted")
    assert "3 of its peers marked retry-policy.dev/PeerDisrupted" in event["note"]


def test_a_jobsets_peers_are_its_runs_pods_only(api, tmp_path):
    """The same JobSet run (restart-attempt) across its replicated Jobs; not an older run."""
    from webhook.controller.peers import peer_group

    def pod(run: str, job_name: str, namespace: str = "ml") -> dict:
        labels = {
            "jobset.sigs.k8s.io/jobset-uid": "set",
            "jobset.sigs.k8s.io/restart-attempt": run,
            "batch.kubernetes.io/controller-uid": job_name,
        }
        return {"metadata": {"namespace": namespace, "labels": labels}}

    assert peer_group(pod("1", "leader")) == peer_group(pod("1", "workers"))
    assert peer_group(pod("0", "workers")) != peer_group(pod("1", "workers"))
    # The same UID labels in another namespace: another group.
    assert peer_group(pod("1", "workers", "other")) != peer_group(pod("1", "workers"))
    plain = {"metadata": {"namespace": "ml", "labels": {"batch.kubernetes.io/controller-uid": "j"}}}
    assert peer_group(plain) == ("job", "ml", "j")


# --- max-in-place-restarts --------------------------------------------------------------------


def judging(reconciler: InPlaceBudget) -> list[str]:
    """The pod versions the reconciler has judged (queued for replacing, or let be)."""
    judged: list[str] = []
    judge = reconciler._event

    def recorded(kind: str, pod: dict) -> None:
        judge(kind, pod)
        judged.append(pod["metadata"]["resourceVersion"])

    reconciler._event = recorded  # read by its informer when it starts
    return judged


def test_a_container_that_always_exits_42_is_replaced_after_five_restarts(api, tmp_path):
    """Each pod restarts in place five times, is marked, ended by its deadline (no
    deletion), stopped (SIGTERM: 143) and failed by the kubelet, and counted by the Job's
    first rule (not FailJob, not Ignore); with backoffLimit 1 the second replaced pod ends
    the Job: 5 x (1 + 1) restarts in all."""
    run = JobRun.store(api, admitted_job(IN_PLACE))
    metrics = Counted()
    total = 0
    reconciler = in_place(api, tmp_path, metrics)
    judged = judging(reconciler)
    with Running(reconciler):
        while not run.ended:
            pod = run.new_pod()
            for count in range(1, 6):
                version = run.restart(pod, count)["metadata"]["resourceVersion"]
                total += 1
                if count < 5:
                    eventually(lambda v=version: v in judged)  # seen, and let be
                    assert run.current(pod)["spec"].get("activeDeadlineSeconds") is None
            eventually(lambda p=pod: run.current(p)["spec"].get("activeDeadlineSeconds"), 10)
            marked = run.current(pod)
            assert fp.IN_PLACE_BUDGET_EXHAUSTED in [
                c["type"] for c in marked["status"]["conditions"]
            ]
            assert run.terminate(pod, 143)["status"]["reason"] == "DeadlineExceeded"
            assert run.sync() == ["Count"]
        reconciler.events.flush()
    assert run.ended == "BackoffLimitExceeded" and total == 10
    assert api.deletions == []  # ended by their deadline, and kept as failed pods are
    assert metrics.calls.count(("condition", fp.IN_PLACE_BUDGET_EXHAUSTED, "added")) == 2
    notes = [e["note"] for e in events_of(api, "RetryInPlaceBudgetExhausted")]
    assert len(notes) == 2 and all("5 restarts in place reach" in n for n in notes)
    assert all("ended by its deadline (activeDeadlineSeconds 1)" in n for n in notes)


def test_a_pod_that_failed_on_its_own_meanwhile_is_not_marked(api, tmp_path):
    """The mark carries the resourceVersion the controller saw: a pod that failed with a
    non-retriable code in between answers 409, is read again, and is left to its rules."""
    run = JobRun.store(api, admitted_job(IN_PLACE))
    pod = run.restart(run.new_pod(), 5)
    reconciler = in_place(api, tmp_path)
    run.fail(pod, 3)  # after the controller saw 5 restarts, before it acts
    assert reconciler.replace(pod) is False
    assert reconciler.counters["conflicts"] == 1
    assert run.judge(pod) == "FailJob"
    assert run.current(pod)["spec"].get("activeDeadlineSeconds") is None
    assert api.deletions == []


def test_restarts_in_all_and_of_a_whole_pod():
    def pod(counts, whole=False):
        rule = {"action": "RestartAllContainers" if whole else "Restart"}
        containers = [{"name": f"c{n}", "restartPolicyRules": [rule]} for n in range(len(counts))]
        statuses = [{"name": f"c{n}", "restartCount": c} for n, c in enumerate(counts)]
        return {"spec": {"containers": containers}, "status": {"containerStatuses": statuses}}

    assert restarts(pod([2, 3])) == 5
    assert restarts(pod([3, 3], whole=True)) == 3  # each restart of the pod restarts both


def test_a_disrupted_pod_gone_after_it_succeeded_is_no_failure(api, tmp_path):
    """A preempted pod whose application exits 0 on SIGTERM ends ``Succeeded``
    (``getPhase``: every container exited 0); the Job controller counts a completion
    (``isPodFailed`` is false) and removes its finalizer, and the pod is gone before our
    condition lands (404). That is no failure: nothing lowers the Job's backoffLimit."""
    budget = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "0",
        P + "backoff-limit": "1",
    }
    run = JobRun.store(api, admitted_job(budget))
    pod = run.new_pod()
    run.disrupt(pod)
    seen = run.current(pod)  # Running, disrupted: what the controller saw
    ended = run.terminate(pod, code=0)
    assert ended["status"]["phase"] == "Succeeded"
    reconciler = disruptions(api, tmp_path)
    reconciler._budget_event("DELETED", ended)  # the watch's last word on it
    api.delete("pods", pod["metadata"]["uid"])
    reconciler.count(seen)  # its condition: 404
    reconciler.flush()
    job = run._job()
    assert job["spec"]["backoffLimit"] == 1
    record = record_of(api, run.uid)
    assert record is None or not record.late_lowered(pod["metadata"]["uid"])


def test_a_disrupted_pod_gone_after_it_failed_still_counts(api, tmp_path):
    """The same, but the pod failed (143 on SIGTERM): over the budget and judged without
    our condition, it is counted by lowering backoffLimit."""
    budget = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "0",
        P + "backoff-limit": "1",
    }
    run = JobRun.store(api, admitted_job(budget))
    pod = run.new_pod()
    run.disrupt(pod)
    seen = run.current(pod)
    ended = run.terminate(pod, code=143)
    reconciler = disruptions(api, tmp_path)
    reconciler._budget_event("DELETED", ended)
    api.delete("pods", pod["metadata"]["uid"])
    reconciler.count(seen)
    reconciler.flush()
    job = run._job()
    assert job["spec"]["backoffLimit"] == 0


def _conditions(pod: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}


def test_a_stale_disruption_target_marks_no_peer(api, tmp_path):
    """A DisruptionTarget on a pod that is neither deleted nor ended is a disruption that
    never came (the preemption that set it did not delete the pod): the disruption
    controller resets it (``syncStalePodDisruption``). Its peers stay unmarked, and are
    marked once a disruption does happen."""
    annotations = {
        P + "fail-non-retriable": "true",
        P + "ignore-disruptions": "true",
        P + "peer-disruptions": "ignore",
    }
    run = JobRun.store(api, admitted_job(annotations, parallelism=2, completions=2))
    first, peer = run.new_pod(), run.new_pod()
    with Running(disruptions(api, tmp_path)) as reconciler:
        stale = run.disrupt(first, delete=False)
        uid = stale["metadata"]["uid"]

        def stored() -> bool:  # the peer watch has seen the condition, and decided
            with reconciler.peers._lock:
                groups = list(reconciler.peers._groups.values())
            kept = [g[uid] for g in groups if uid in g]
            return bool(kept) and fp.DISRUPTION_TARGET in _conditions(kept[0])

        eventually(stored, 10)
        eventually(reconciler._queue.empty, 10)
        assert not reconciler._was_handled("peers", uid)
        assert fp.PEER_DISRUPTED not in _conditions(run.current(peer))
        with api.lock:  # now it happens: the pod is deleted
            api.delete_pod(stale["metadata"]["namespace"], stale["metadata"]["name"], None)
        eventually(lambda: fp.PEER_DISRUPTED in _conditions(run.current(peer)), 10)


def test_a_peer_disrupted_itself_is_decided_by_its_own_disruption(api, tmp_path):
    """``peer-disruptions: count``: a drain marks B a peer of A, then evicts B too. The
    Count on PeerDisrupted comes first (``matchPodFailurePolicy``), so the controller sets
    B's mark back to False before B fails: B's own disruption is free (Ignore), as the
    budget says."""
    annotations = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "2",
        P + "peer-disruptions": "count",
        P + "backoff-limit": "0",
    }
    run = JobRun.store(api, admitted_job(annotations, parallelism=2, completions=2))
    a, b = run.new_pod(), run.new_pod()
    with Running(disruptions(api, tmp_path)) as reconciler:
        run.disrupt(a, "EvictionByEvictionAPI")
        eventually(lambda: _conditions(run.current(b)).get(fp.PEER_DISRUPTED) == "True", 10)
        run.disrupt(b, "EvictionByEvictionAPI")
        eventually(lambda: _conditions(run.current(b)).get(fp.PEER_DISRUPTED) == "False", 10)
        eventually(lambda: acted(reconciler, run.current(b)), 10)
    run.fail(b)
    assert run.judge(b) == "Ignore"
    record = eventually(
        lambda: (r := record_of(api, run.uid)) and r.disruptions_of() >= 2 and r, 10
    )
    assert record.disrupted(b["metadata"]["uid"]) == "free"


def test_a_peer_that_failed_before_its_mark_was_taken_back_is_no_budget_s(api, tmp_path):
    """The same, but B failed before the controller could take the mark back: the Job
    controller counts it as a peer's failure, and the budget does not count it at all."""
    annotations = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "2",
        P + "peer-disruptions": "count",
        P + "backoff-limit": "3",
    }
    run = JobRun.store(api, admitted_job(annotations, parallelism=2, completions=2))
    a, b = run.new_pod(), run.new_pod()
    reconciler = disruptions(api, tmp_path)
    for pod in (a, b):
        reconciler._peer_event("ADDED", run.current(pod))  # the watch's store
    run.disrupt(a, "EvictionByEvictionAPI")
    reconciler.mark_peers(run.current(a))
    assert _conditions(run.current(b)).get(fp.PEER_DISRUPTED) == "True"
    run.disrupt(b, "EvictionByEvictionAPI")
    failed = run.fail(b)
    reconciler.count(failed)
    reconciler.flush()
    assert _conditions(run.current(b)).get(fp.PEER_DISRUPTED) == "True"
    assert run.judge(b) == "Count"
    record = record_of(api, run.uid)
    assert record is None or record.disrupted(b["metadata"]["uid"]) is None


def test_one_disruption_marks_at_most_the_peer_mark_limit_and_tells_the_rest(api, tmp_path):
    """--peer-mark-limit bounds the writes one disruption costs: past it the peers are not
    marked, a Warning Event says how many, and the metric counts them (nothing dropped
    unsaid)."""
    annotations = {P + "ignore-disruptions": "true", P + "peer-disruptions": "ignore"}
    run = JobRun.store(api, admitted_job(annotations, parallelism=6, completions=6))
    pods = [run.new_pod() for _ in range(6)]
    metrics = Counted()
    reconciler = disruptions(api, tmp_path, metrics)
    reconciler.peers.limit = 2
    for pod in pods:
        reconciler._peer_event("ADDED", run.current(pod))
    disrupted = run.disrupt(pods[0], "EvictionByEvictionAPI")
    reconciler.mark_peers(disrupted)
    reconciler.events.flush()
    marked = [p for p in pods[1:] if fp.PEER_DISRUPTED in _conditions(run.current(p))]
    assert len(marked) == 2
    assert ("peers_unmarked", 3) in metrics.calls
    warnings = [e for e in events_of(api, "RetryDisruptionCounted") if e["type"] == "Warning"]
    (warning,) = warnings
    assert "3 more of its peers not marked" in warning["note"]
    assert "peer mark limit 2" in warning["note"]
