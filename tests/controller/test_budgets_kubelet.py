"""The controller's budgets per cause against what the kubelet, PodGC and the Job
controller do (``testkit/jobsim.py``), through the real reconcilers
(``webhook.controller.restarts``, ``webhook.controller.disruptions``) and the real
``kubernetes`` client against the HTTP test API:

- a pod replaced for its restarts in place ends ``Failed``, whatever its containers exit
  with, and its condition is on it before;
- every disruption over ``max-disruptions`` counts exactly once, whatever the cause (the
  kubelet's and PodGC's come with ``Failed``) and whatever the race with the Job
  controller's sync;
- a pod listed in the Job's ``uncountedTerminatedPods`` is judged.
"""

from __future__ import annotations

import json
import random
import threading

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from testkit.builders import P, review
from testkit.controllers import (
    Counted,
    Running,
    acted,
    admitted_job,
    client_of,
    disruptions,
    events_of,
    in_place,
    record_of,
)
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JOB_TRACKING, JobRun
from testkit.servers import eventually
from webhook.admission import engine
from webhook.admission import review as codec
from webhook.cluster.conditions import judged, status_patch, uncounted_of
from webhook.kube import failurepolicy as fp
from webhook.kube.wellknown import MULTIKUEUE_ORIGIN
from webhook.policy.config import Config

IN_PLACE = {
    P + "in-place-exit-codes": "42",
    P + "max-in-place-restarts": "2",
    P + "backoff-limit": "1",
    P + "fail-non-retriable": "true",
}


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def conditions(pod: dict) -> list[str]:
    return [c["type"] for c in pod["status"].get("conditions") or []]


def job_of(api, run: JobRun) -> dict:
    with api.lock:
        return json.loads(json.dumps(api.objects["jobs"][run.uid]))


# --- max-in-place-restarts: the replaced pod fails ------------------------------------------


def test_a_deleted_pod_whose_containers_exit_0_succeeds_and_completes_the_job(api):
    """What deleting a replaced pod did: the application handles SIGTERM and exits 0, the
    kubelet makes the deleted pod ``Succeeded``, and the Job completes; its rules, and the
    condition on the pod, are never looked at."""
    # upstream: getPhase (pkg/kubelet/kubelet_pods.go): a terminal pod whose containers
    # all exited 0 is Succeeded; trackJobStatusAndRemoveFinalizers counts it a success.
    run = JobRun.store(api, admitted_job(IN_PLACE))
    pod = run.restart(run.new_pod(), 2)
    body = status_patch(fp.IN_PLACE_BUDGET_EXHAUSTED, "MaxInPlaceRestartsReached", "", 0)
    run.update(pod, lambda p: p["status"]["conditions"].extend(body["status"]["conditions"]))
    with api.lock:
        api.delete_pod("ml", pod["metadata"]["name"], None)
    done = run.terminate(pod, 0)
    assert done["status"]["phase"] == "Succeeded"
    assert run.sync() == []  # nothing judged by the rules
    assert (run.ended, run.counted) == ("Complete", 0)


@pytest.mark.parametrize("code", [0, 1, 42, 137, 143])
def test_a_replaced_pod_fails_past_its_deadline_whatever_it_exits_with(api, tmp_path, code):
    """The controller marks the pod, then sets its ``activeDeadlineSeconds`` to 1, and
    deletes nothing. Past it the kubelet stops the containers and fails the pod,
    ``DeadlineExceeded``, whatever they exit with: 0 (SIGTERM handled), 1 (non-retriable:
    fail-non-retriable's FailJob would match it), 42 (an in-place code), 137, 143. The
    first rule, Count on InPlaceBudgetExhausted, decides each."""
    # upstream: activeDeadlineHandler.ShouldEvict (pkg/kubelet/active_deadline.go), which
    # generateAPIPodStatus (pkg/kubelet/kubelet_pods.go) applies over getPhase;
    # matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go): the first rule
    # that matches decides.
    run = JobRun.store(api, admitted_job(IN_PLACE))
    rules = run.job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == fp.condition_rule(fp.IN_PLACE_BUDGET_EXHAUSTED)
    pod = run.restart(run.new_pod(), 2)
    reconciler = in_place(api, tmp_path)
    assert reconciler.replace(run.current(pod)) is True
    marked = run.current(pod)
    assert marked["spec"]["activeDeadlineSeconds"] == 1
    assert fp.IN_PLACE_BUDGET_EXHAUSTED in conditions(marked)
    name = pod["metadata"]["name"]
    writes = [path for path, _ in api.requests if path.startswith("PATCH ")]
    assert writes == [  # the condition first: the pod must carry it when it fails
        f"PATCH /api/v1/namespaces/ml/pods/{name}/status",
        f"PATCH /api/v1/namespaces/ml/pods/{name}",
    ]
    failed = run.terminate(pod, code)
    assert (failed["status"]["phase"], failed["status"]["reason"]) == (
        "Failed",
        "DeadlineExceeded",
    )
    assert run.sync() == ["Count"]
    assert (run.counted, run.ended) == (1, "")  # backoffLimit 1: one more pod to go
    assert api.deletions == []


def test_the_deadline_is_only_lowered_and_set_after_the_mark(api, tmp_path):
    """A pod with a deadline of its own gets 1; one marked by a controller that stopped
    before setting the deadline gets it, its condition left as it is. The API refuses a
    raised or removed deadline, and one under 1."""
    # upstream: ValidatePodUpdate and ValidatePodSpec (pkg/apis/core/validation/validation.go)
    run = JobRun.store(api, admitted_job(IN_PLACE))
    own = run.restart(run.new_pod(), 2)
    run.update(own, lambda p: p["spec"].update(activeDeadlineSeconds=3600))
    marked = run.restart(run.new_pod(), 2)
    body = status_patch(fp.IN_PLACE_BUDGET_EXHAUSTED, "MaxInPlaceRestartsReached", "earlier", 0)
    run.update(marked, lambda p: p["status"]["conditions"].extend(body["status"]["conditions"]))
    metrics = Counted()
    reconciler = in_place(api, tmp_path, metrics)
    for pod in (own, marked):
        assert reconciler.replace(run.current(pod)) is True
        assert run.current(pod)["spec"]["activeDeadlineSeconds"] == 1
    ours = [
        c["message"]
        for c in run.current(marked)["status"]["conditions"]
        if c["type"] == fp.IN_PLACE_BUDGET_EXHAUSTED
    ]
    assert ours == ["earlier"]
    assert metrics.calls == [("condition", fp.IN_PLACE_BUDGET_EXHAUSTED, "added")]  # own's
    restarted = in_place(api, tmp_path)  # a new leader: both done already, nothing to say
    assert not any(restarted.replace(run.current(pod)) for pod in (own, marked))
    core = client.CoreV1Api(client_of(api, tmp_path))
    for deadline in (5, None, 0):
        with pytest.raises(ApiException) as refused:
            core.patch_namespaced_pod(
                own["metadata"]["name"],
                "ml",
                {"spec": {"activeDeadlineSeconds": deadline}},
                _content_type="application/merge-patch+json",
            )
        assert refused.value.status == 422


def test_a_refused_deadline_takes_the_mark_back_and_is_told(api, tmp_path):
    """Another admission policy of the cluster refuses the pod's deadline: the pod runs on,
    restarting in place. Its mark (the Count rule's condition) goes back to False, so its
    later failure is judged by its own rules (fail-non-retriable's FailJob here), and the
    refusal is told (``RetryPolicyWriteFailed``); the pod is not marked again."""
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go)
    run = JobRun.store(api, admitted_job({**IN_PLACE, P + "fail-non-retriable": "true"}))
    pod = run.restart(run.new_pod(), 2)

    def no_deadlines(stored: dict, patched: dict):
        if patched["spec"].get("activeDeadlineSeconds") != stored["spec"].get(
            "activeDeadlineSeconds"
        ):
            return 403, 'admission webhook "deadlines.example.com" denied the request'
        return None

    api.admit_update["pods"] = no_deadlines
    metrics = Counted()
    reconciler = in_place(api, tmp_path, metrics)
    with pytest.raises(ApiException):
        reconciler.replace(run.current(pod))
    current = run.current(pod)
    assert "activeDeadlineSeconds" not in current["spec"]
    mark = [c for c in current["status"]["conditions"] if c["type"] == fp.IN_PLACE_BUDGET_EXHAUSTED]
    assert [c["status"] for c in mark] == ["False"]
    assert ("condition", fp.IN_PLACE_BUDGET_EXHAUSTED, "taken_back") in metrics.calls
    assert reconciler.replace(run.restart(pod, 3)) is False  # not marked again
    run.fail(pod, 1)
    assert run.judge(pod) == "FailJob"


# --- max-disruptions: each disruption over the budget counts once ---------------------------

LATE = {
    P + "ignore-disruptions": "true",
    P + "max-disruptions": "1",
    P + "backoff-limit": "2",
}


def validated_by_the_webhook(old: dict, new: dict) -> tuple[int, str] | None:
    """The webhook's validating answer to a Job UPDATE, as the API server asks for it
    (the chart sends it an annotated Job's UPDATE that changes backoffLimit)."""
    request = codec.decode(json.dumps(review(new, operation="UPDATE", old=old)))
    verdict = engine.validate(request, Config())
    return None if verdict.allowed else (verdict.code or 403, verdict.message)


def lose(run: JobRun, pod: dict, cause: str) -> dict:
    """The pod's node takes it: the kubelet's node-pressure eviction, or PodGC once the
    node is gone; either way ``DisruptionTarget`` arrives with ``Failed``."""
    return run.evict_by_kubelet(pod) if cause == "kubelet" else run.podgc(pod)


def _lowering_notes(api) -> list[str]:
    return [e["note"] for e in events_of(api, "RetryDisruptionCounted") if "lowering" in e["note"]]


@pytest.mark.parametrize("cause", ["kubelet", "podgc"])
def test_a_disruption_that_comes_with_failed_lowers_the_backoff_limit_once(api, tmp_path, cause):
    """The first disruption is free. The second is over the budget, but its pod is
    ``Failed`` when the controller sees it: no condition (the Job controller may or may
    not have read the pod already), the Job's backoffLimit 2 -> 1 instead, in the patch
    that marks the pod in the record, which the webhook admits. The Job controller ignores
    the pod; the Job then fails after 2 counted failures, not 3: the disruption counted
    once. A second controller (a restart: a relist) counts nothing again."""
    # upstream: mergePodStatus (pkg/kubelet/status/status_manager.go) and
    # markFailedAndDeletePodWithCondition (pkg/controller/podgc/gc_controller.go):
    # DisruptionTarget with Failed; exceedsBackoffLimit, failed > backoffLimit, in syncJob
    # (pkg/controller/job/job_controller.go); ValidateJobSpecUpdate
    # (pkg/apis/batch/validation/validation.go): backoffLimit is mutable.
    api.admit_update["jobs"] = validated_by_the_webhook
    run = JobRun.store(api, admitted_job(LATE))
    metrics = Counted()
    pods = [run.new_pod() for _ in range(4)]
    with Running(disruptions(api, tmp_path, metrics)) as reconciler:
        for pod in pods[:2]:
            lose(run, pod, cause)
            eventually(lambda p=pod: acted(reconciler, p), 10)
            assert run.sync() == ["Ignore"]
        eventually(lambda: job_of(api, run)["spec"]["backoffLimit"] == 1, 10)
        # The Event is emitted after the patch lands: wait for it, not for the patch.
        eventually(lambda: reconciler.events.flush() and _lowering_notes(api), 10)
    record = record_of(api, run.uid)
    second = pods[1]["metadata"]["uid"]
    assert record.disrupted(second) == "over" and record.settled(second)
    assert record.lowered == 1
    assert metrics.calls.count(("lowered",)) == 1
    assert ("condition", fp.DISRUPTION_BUDGET_EXHAUSTED, "added") not in metrics.calls
    if cause == "kubelet":  # (PodGC's pod went once judged)
        assert fp.DISRUPTION_BUDGET_EXHAUSTED not in conditions(run.current(pods[1]))
    (note,) = _lowering_notes(api)
    assert "counted by lowering the Job's backoffLimit by one, to 1" in note
    with Running(disruptions(api, tmp_path)) as second_controller:
        if cause == "kubelet":
            eventually(lambda: acted(second_controller, run.current(pods[1])), 10)
    assert job_of(api, run)["spec"]["backoffLimit"] == 1
    assert record_of(api, run.uid).lowered == 1
    for n, pod in enumerate(pods[2:]):
        run.fail(pod, 1)
        assert run.sync() == ["none"]  # no rule: counted
        assert run.ended == ("BackoffLimitExceeded" if n == 1 else "")


def test_a_pod_judged_before_any_leader_saw_it_still_counts_once(api, tmp_path):
    """No leader while the node evicts two pods and the Job controller judges them (both
    ignored: no condition could be there). A leader then lists them: the first is free,
    the second over the budget, ``Failed`` and judged: counted by lowering backoffLimit."""
    # upstream: trackJobStatusAndRemoveFinalizers (pkg/controller/job/job_controller.go):
    # a judged pod loses its finalizer and is never judged again.
    run = JobRun.store(api, admitted_job(LATE))
    pods = [run.evict_by_kubelet(run.new_pod()) for _ in range(2)]
    assert run.sync() == ["Ignore", "Ignore"]
    with Running(disruptions(api, tmp_path)) as reconciler:
        eventually(lambda: all(acted(reconciler, run.current(p)) for p in pods), 10)
        eventually(lambda: job_of(api, run)["spec"]["backoffLimit"] == 1, 10)
    assert record_of(api, run.uid).lowered == 1


def test_the_webhook_still_refuses_a_budget_the_annotation_contradicts(api):
    """The lowering is admitted because the record, in the same patch, says exactly that
    much more was lowered; any other change of backoffLimit must agree with the
    ``backoff-limit`` annotation, as before."""
    job = admitted_job(LATE)
    lowered = json.loads(json.dumps(job))
    lowered["spec"]["backoffLimit"] = 1
    assert validated_by_the_webhook(job, lowered) is not None  # without the record's word
    from webhook.cluster.record import ANNOTATION, Record

    said = Record().add_late("pod-1", True)
    lowered["metadata"]["annotations"][ANNOTATION] = said.text()
    assert validated_by_the_webhook(job, lowered) is None
    twice = json.loads(json.dumps(lowered))
    twice["spec"]["backoffLimit"] = 0  # two lower, one said
    assert validated_by_the_webhook(job, twice) is not None


def test_a_record_write_that_conflicts_lowers_from_the_job_as_it_is(api, tmp_path):
    """The Job controller writes the Job's status between the controller's read and its
    patch: 409, the Job read again, the record and the lowering computed anew from it;
    the backoffLimit lowered once."""
    # upstream: the resourceVersion precondition of a patch (409 Conflict when stale).
    run = JobRun.store(api, admitted_job(LATE))
    pods = [run.new_pod() for _ in range(2)]
    touched = []

    def job_status_first(method, resource, name):
        if resource == "jobs" and not touched:
            touched.append(name)
            api.modify("jobs", run.uid, lambda j: j["status"].update(active=1))

    api.before_write = job_status_first
    reconciler = disruptions(api, tmp_path)
    for pod in pods:
        reconciler.count(run.evict_by_kubelet(pod))
    reconciler.flush()
    assert touched and reconciler.counters["conflicts"] >= 1
    job = job_of(api, run)
    assert job["spec"]["backoffLimit"] == 1 and job["status"]["active"] == 1
    assert record_of(api, run.uid).lowered == 1


@pytest.mark.parametrize(
    ("annotations", "spec", "reason"),
    [
        ({**LATE, P + "backoff-limit": "0"}, {}, "backoff_limit_zero"),
        (
            {P + "ignore-disruptions": "true", P + "max-disruptions": "1"},
            {"completionMode": "Indexed", "completions": 2, "backoffLimitPerIndex": 1},
            "per_index",
        ),
    ],
    ids=["backoff-limit-0", "per-index"],
)
def test_what_cannot_be_lowered_is_said_and_counted(api, tmp_path, annotations, spec, reason):
    """backoffLimit 0 (nothing left to lower: the API takes no less), or a per-index budget
    (immutable): the disruption is not counted, and the metric, an Event and the log say so;
    the Job is left as it is."""
    # upstream: ValidateJobSpec (backoffLimit >= 0) and ValidateJobSpecUpdate
    # (backoffLimitPerIndex immutable) in pkg/apis/batch/validation/validation.go.
    run = JobRun.store(api, admitted_job(annotations, **spec))
    before = job_of(api, run)["spec"]
    metrics = Counted()
    reconciler = disruptions(api, tmp_path, metrics)
    indexed = "backoffLimitPerIndex" in spec
    for n in range(2):
        pod = run.new_pod(0, n) if indexed else run.new_pod()
        reconciler.count(run.evict_by_kubelet(pod))
    reconciler.flush()
    assert record_of(api, run.uid).late_lowered(pod["metadata"]["uid"]) is False
    reconciler.events.flush()
    assert metrics.calls.count(("uncovered", reason)) == 1
    assert ("lowered",) not in metrics.calls
    assert job_of(api, run)["spec"] == before
    (warning,) = [
        e
        for e in events_of(api, "RetryDisruptionCounted")
        if "this disruption is not counted" in e["note"]
    ]
    assert warning["type"] == "Warning"


def test_a_multikueue_workers_copy_keeps_the_managers_backoff_limit(api, tmp_path):
    """On a MultiKueue worker, the Job is the manager's copy (its metadata cloned, its
    label ``kueue.x-k8s.io/multikueue-origin`` added): its spec stays the manager's, so a
    late disruption is said and counted as uncovered, never by lowering backoffLimit."""
    # upstream: kueue SyncJob (pkg/controller/jobs/job/job_multikueue_adapter.go) creates
    # the copy with CloneObjectMetaForCreation and the MultiKueueOriginLabel.
    manager = admitted_job(LATE)
    manager["metadata"].setdefault("labels", {})[MULTIKUEUE_ORIGIN] = "manager-cluster"
    run = JobRun.store(api, manager)
    before = job_of(api, run)["spec"]
    metrics = Counted()
    reconciler = disruptions(api, tmp_path, metrics)
    for _ in range(2):
        reconciler.count(run.evict_by_kubelet(run.new_pod()))
    reconciler.flush()
    reconciler.events.flush()
    assert metrics.calls.count(("uncovered", "multikueue")) == 1
    assert ("lowered",) not in metrics.calls
    assert job_of(api, run)["spec"] == before


def test_a_pod_its_rules_count_already_lowers_nothing(api, tmp_path):
    """A peer marked PeerDisrupted (peer-disruptions count) that its node then evicts,
    failed at once: its rule counts it (the rules on our conditions come before the
    Ignore on DisruptionTarget), so lowering backoffLimit too would count it twice, and
    it uses none of max-disruptions' free disruptions either."""
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go)
    annotations = {**LATE, P + "peer-disruptions": "count"}
    run = JobRun.store(api, admitted_job(annotations, parallelism=2, completions=2))
    metrics = Counted()
    reconciler = disruptions(api, tmp_path, metrics)
    reconciler.count(run.evict_by_kubelet(run.new_pod()))  # the free one
    peer = run.new_pod()
    body = status_patch(fp.PEER_DISRUPTED, "PeerPodDisrupted", "", 0)
    run.update(peer, lambda p: p["status"]["conditions"].extend(body["status"]["conditions"]))
    reconciler.count(run.evict_by_kubelet(peer))
    reconciler.flush()
    assert sorted(run.sync()) == ["Count", "Ignore"]
    assert job_of(api, run)["spec"]["backoffLimit"] == 2
    record = record_of(api, run.uid)
    assert record.disrupted(peer["metadata"]["uid"]) is None and record.disruptions_of() == 1
    assert metrics.calls.count(("lowered",)) == 0


@pytest.mark.slow  # real back-off and races: wall-clock time
def test_a_node_lost_with_many_pods_counts_each_disruption_over_the_budget_once(api, tmp_path):
    """A node goes with 16 pods of a Job at once: some are preempted first
    (DisruptionTarget while they run, stopped a moment later), the rest failed by the
    kubelet or PodGC (DisruptionTarget with Failed), while the Job controller syncs at
    most 0.05 s apart and
    the controller's workers mark pods several at once. However the races end, the Job
    controller's count plus the backoffLimit lowered is the 13 disruptions over the
    budget of 3, exactly: none missed, none twice."""
    # upstream: syncJobBatchPeriod, trackJobStatusAndRemoveFinalizers and exceedsBackoffLimit
    # (pkg/controller/job/job_controller.go); markFailedAndDeletePodWithCondition
    # (pkg/controller/podgc/gc_controller.go).
    annotations = {
        P + "ignore-disruptions": "true",
        P + "max-disruptions": "3",
        P + "backoff-limit": "30",
    }
    run = JobRun.store(api, admitted_job(annotations, parallelism=16, completions=16))
    pods = [run.new_pod() for _ in range(16)]
    rng = random.Random(38)  # noqa: S311 (a reproducible order, not a secret)
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def slow_marks(method, resource, name):  # the API slow to write: marks overlap
        if resource == "pods":
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            threading.Event().wait(0.1)
            with lock:
                in_flight[0] -= 1

    api.before_write = slow_marks
    timers = []
    with Running(disruptions(api, tmp_path)) as reconciler, run.syncing(0.05):
        for pod in pods:
            cause = rng.choice(["preempted", "kubelet", "podgc"])
            if cause == "preempted":
                run.disrupt(pod)
                timer = threading.Timer(rng.uniform(0, 1.0), run.terminate, (pod, 143))
                timers.append(timer)
                timer.start()
            else:
                lose(run, pod, cause)
        for timer in timers:
            timer.join()
        eventually(lambda: not run._tracked(), 20)  # every pod judged
        eventually(lambda: every_over_pod_counted(reconciler, run), 20)
    job = job_of(api, run)
    lowered = 30 - job["spec"]["backoffLimit"]
    record = record_of(api, run.uid)
    assert record.disruptions_of() == 16 and record.lowered == lowered
    assert run.counted + lowered == 13, (run.counted, lowered, run.judged)
    assert run.judged.count("Count") == run.counted
    assert most[0] > 1  # conditions written several at once


def every_over_pod_counted(reconciler, run: JobRun) -> bool:
    """Every pod the record counts over the budget was counted by the Job controller
    (its condition) or settled another way, and nothing is left to write."""
    record = record_of(reconciler.workloads and run.api, run.uid)
    if record is None or record.disruptions_of() != 16:
        return False
    if any(s.pending or s.late for s in list(reconciler._budgets.values())):
        return False
    over = [u for u in run.verdicts if record.disrupted(u) == "over"]
    return len(over) == 13 and all(run.verdicts[u] == "Count" or record.settled(u) for u in over)


# --- judged: the Job's uncountedTerminatedPods ---------------------------------------------


def test_a_pod_listed_in_uncounted_terminated_pods_is_judged(api, tmp_path):
    """The Job controller lists a counted pod's UID in ``uncountedTerminatedPods`` before
    it removes the pod's finalizer, and never judges a listed pod again: a peer there, its
    finalizer still on, is not marked (``missed``)."""
    # upstream: trackJobStatusAndRemoveFinalizers (pkg/controller/job/job_controller.go)
    annotations = {P + "ignore-disruptions": "true", P + "peer-disruptions": "ignore"}
    run = JobRun.store(api, admitted_job(annotations, parallelism=3, completions=3))
    disrupted, listed, running = (run.new_pod() for _ in range(3))
    listed = run.fail(listed, 1)
    uid = listed["metadata"]["uid"]
    api.modify(
        "jobs",
        run.uid,
        lambda j: j["status"].update(uncountedTerminatedPods={"failed": [uid]}),
    )
    assert JOB_TRACKING in listed["metadata"]["finalizers"]
    assert not judged(listed) and judged(listed, uncounted_of(job_of(api, run)))
    metrics = Counted()
    with Running(disruptions(api, tmp_path, metrics)):
        run.disrupt(disrupted, "EvictionByEvictionAPI")
        eventually(lambda: fp.PEER_DISRUPTED in conditions(run.current(running)), 10)
    assert fp.PEER_DISRUPTED not in conditions(run.current(listed))
    assert metrics.calls.count(("condition", fp.PEER_DISRUPTED, "added")) == 1


def test_the_metrics_of_what_was_lowered_and_what_was_not():
    """``retry_webhook_controller_backoff_limit_lowered_total`` and
    ``retry_webhook_controller_disruptions_uncovered_total{reason}``, beside the
    controller's other budget counters; an unknown reason is no series."""
    from prometheus_client import generate_latest

    from webhook.serving.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    metrics.lowered()
    metrics.lowered()
    for reason in ("jobset", "per_index", "backoff_limit_zero", "made-up"):
        metrics.uncovered(reason)
    text = generate_latest(metrics.registry).decode()
    assert "retry_webhook_controller_backoff_limit_lowered_total 2.0" in text
    for reason in ("jobset", "per_index", "backoff_limit_zero"):
        assert (
            f'retry_webhook_controller_disruptions_uncovered_total{{reason="{reason}"}} 1.0' in text
        )
    assert "made-up" not in text


def test_status_tells_a_disruption_counted_by_lowering_the_backoff_limit(api, tmp_path):
    """``retry-webhook status`` reads the record's ``late`` mark: the pod over the budget
    that failed unmarked was counted by lowering backoffLimit, not missed."""
    from testkit.clusters import tree
    from webhook.status.render import render_text, to_json
    from webhook.status.story import tell

    run = JobRun.store(api, admitted_job(LATE))
    pods = [run.evict_by_kubelet(run.new_pod()) for _ in range(2)]
    reconciler = disruptions(api, tmp_path)
    for pod in pods:
        reconciler.count(pod)
    reconciler.flush()
    run.sync()
    story = tell(tree(job_of(api, run), [run.current(p) for p in pods]))
    told = to_json(story)["jobs"][0]["attempts"]
    late = next(a for a in told if a["pod"] == pods[1]["metadata"]["name"])
    assert late["disruptionBudget"]["late"] == "lowered" and late["counted"] is False
    flat = " ".join(render_text(story).split())
    assert "failed before it could be marked: counted by the controller lowering" in flat
