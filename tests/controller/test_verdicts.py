"""The failure verdicts (``webhook.controller.verdicts``) against the HTTP test API, with
the Job controller's, the kubelet's and the disruptors' parts played as upstream does them
(``testkit.jobsim``), and the chart's admission policy in front of every write of ours
(``testkit.vap``): the category written on the pod, in time where it can be and counted
late where it cannot, the free budget, the start deadline's two ways of ending a pod,
and what the user is told."""

from __future__ import annotations

import copy
import threading
import uuid

import pytest

from testkit.builders import P
from testkit.chart import NAMESPACE as CHART_NS
from testkit.chart import deployment_pod, one, render
from testkit.controllers import Counted, Running, admitted_job, client_of, events_of, record_of
from testkit.fakeapi import FakeAPI
from testkit.jobsim import JobRun
from testkit.servers import eventually, scaled
from testkit.tools import tool
from testkit.vap import Policy, gate
from webhook.cluster.events import EventRecorder
from webhook.controller.verdicts import Verdicts
from webhook.kube import failurepolicy as fp
from webhook.policy.config import Config, parse_config

FREE = {
    P + "free-categories": "DeviceFault,NodeFailure",
    P + "max-free-failures": "1",
    P + "fail-categories": "ImagePull",
    P + "backoff-limit": "1",
}
CATEGORY = P + "DeviceFault"


class Told(Counted):
    def failure(self, namespace: str, category: str, verdict: str) -> None:
        self.calls.append(("failure", namespace, category, verdict))


@pytest.fixture(scope="module")
def chart_policy():
    chart = render(tool("helm"), {})
    user = f"system:serviceaccount:{CHART_NS}:{deployment_pod(chart)['spec']['serviceAccountName']}"
    return gate(Policy(one(chart, "ValidatingAdmissionPolicy")), user)


@pytest.fixture
def api(chart_policy):
    fake = FakeAPI().start()
    fake.admit = chart_policy  # every write of ours, through the chart's admission policy
    yield fake
    assert fake.refused == []
    fake.stop()


def verdicts(fake: FakeAPI, tmp_path, metrics=None, config: Config | None = None) -> Verdicts:
    client = client_of(fake, tmp_path)
    events = EventRecorder(__import__("kubernetes").client.EventsV1Api(client), "test").start()
    return Verdicts(client, events, metrics, config=lambda: config or Config(), window=0.05)


def conditions(pod: dict) -> dict[str, dict]:
    return {c["type"]: c for c in pod["status"]["conditions"] if c.get("status") == "True"}


def node(name: str, taints: list[dict] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": str(uuid.uuid4())},
        "spec": {"taints": taints or []},
    }


UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}


def test_a_device_taint_is_free_and_a_lost_node_past_the_budget_counts(api, tmp_path):
    """upstream: the device taint eviction controller and the taint manager add
    ``DisruptionTarget`` and delete the pod while it runs (``addConditionAndDeletePod`` in
    pkg/controller/devicetainteviction and pkg/controller/tainteviction): the category is
    written before the kubelet fails the pod, and the Job controller reads it
    (``matchPodFailurePolicy``). One free failure is allowed (max-free-failures 1): the
    second gets FreeBudgetExhausted with its category, and the Count rule takes it."""
    run = JobRun.store(api, admitted_job(FREE, "train", parallelism=2, completions=2))
    metrics = Told()
    with Running(verdicts(api, tmp_path, metrics)) as reconciler:
        first = run.new_pod()
        run.disrupt(first, "DeletionByDeviceTaintManager")
        marked = eventually(lambda: CATEGORY in conditions(p := run.current(first)) and p, 10)
        assert marked["status"]["phase"] == "Running"  # in time
        assert conditions(marked)[CATEGORY]["reason"] == "DisruptionReason"
        run.terminate(first, code=143)
        assert run.judge(first) == "Ignore"
        second = run.new_pod()
        api.put("nodes", node(second["spec"]["nodeName"], [UNREACHABLE]))
        run.disrupt(second, "DeletionByTaintManager")
        over = eventually(
            lambda: fp.FREE_BUDGET_EXHAUSTED in conditions(p := run.current(second)) and p, 10
        )
        assert P + "NodeFailure" in conditions(over)
        run.terminate(second, code=143)
        assert run.judge(second) == "Count"
        record = eventually(lambda: (r := record_of(api, run.uid)) and r.free_of() == 2 and r, 10)
        assert record.freed_as(first["metadata"]["uid"]) == "free"
        assert record.freed_as(second["metadata"]["uid"]) == "over"
        eventually(lambda: len(events_of(api, "RetryFailureClassified")) == 2, 10)
        notes = [e["note"] for e in events_of(api, "RetryFailureClassified")]
        assert any("DeviceFault (DisruptionReason)" in n and "not counted" in n for n in notes)
        assert any("NodeFailure" in n and "counted against the retry budget" in n for n in notes)
        assert ("failure", "ml", "DeviceFault", "free") in metrics.calls
        assert ("failure", "ml", "NodeFailure", "counted") in metrics.calls
        assert metrics.calls.count(("condition", "category", "added")) == 2
        assert reconciler.stats()["late"] == 0


def test_a_pod_that_fails_by_itself_is_classified_late_and_said_so(api, tmp_path):
    """An OOM kill ends the pod in the kubelet's update that makes it ``Failed``
    (``getPhase``): nothing can land before; the condition is written then, counted
    ``late``, and the Event says the Job controller may have judged the pod without it."""
    run = JobRun.store(api, admitted_job(FREE, "oom"))
    metrics = Told()
    with Running(verdicts(api, tmp_path, metrics)):
        pod = run.new_pod()

        def oom(p: dict) -> None:
            p["status"]["phase"] = "Failed"
            p["status"]["containerStatuses"][0]["state"] = {
                "terminated": {"exitCode": 137, "reason": "OOMKilled"}
            }

        run.update(pod, oom)
        marked = eventually(lambda: P + "OOMKilled" in conditions(p := run.current(pod)) and p, 10)
        assert conditions(marked)[P + "OOMKilled"]["message"].startswith("a container ran out")
        eventually(lambda: ("condition", "category", "late") in metrics.calls, 10)
        (event,) = eventually(lambda: events_of(api, "RetryFailureClassified"), 10)
        assert "OOMKilled (ContainerReason)" in event["note"]
        assert "landed after the pod failed" in event["note"] and event["type"] == "Warning"


def test_a_pod_the_job_controller_judged_first_is_missed_and_not_written(api, tmp_path):
    run = JobRun.store(api, admitted_job(FREE, "judged"))
    pod = run.fail(run.new_pod(), code=3)
    run.judge(pod)  # its tracking finalizer removed before the controller saw it
    metrics = Told()
    with Running(verdicts(api, tmp_path, metrics)):
        eventually(lambda: ("condition", "category", "missed") in metrics.calls, 10)
        assert not any(k.startswith(P) for k in conditions(run.current(pod)))
        (event,) = eventually(lambda: events_of(api, "RetryFailureClassified"), 10)
        assert "AppError" in event["note"] and "had judged it before" in event["note"]


def stuck(run: JobRun, reason: str, scheduled: bool = True) -> dict:
    """A pod of ``run`` whose container never started: the kubelet reports it waiting
    (``reason``), or, unscheduled, the scheduler's ``PodScheduled=False``
    (``handleSchedulingFailure``)."""
    pod = run.new_pod()

    def change(p: dict) -> None:
        p["status"]["phase"] = "Pending"
        p["status"]["containerStatuses"][0]["state"] = {
            "waiting": {"reason": reason, "message": "Back-off pulling image"}
        }
        p["status"]["containerStatuses"][0]["started"] = False
        if not scheduled:
            p["spec"].pop("nodeName")
            p["status"] = {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                ],
            }

    return run.update(pod, change)


def test_an_image_pull_past_the_start_deadline_is_classified_then_ended_by_its_deadline(
    api, tmp_path
):
    """upstream: ``activeDeadlineHandler.ShouldEvict`` (pkg/kubelet/active_deadline.go)
    fails a pod past ``activeDeadlineSeconds``, which may be set on a running pod
    (``ValidatePodUpdate``): the condition first (with the resourceVersion of the pod
    seen not Failed), then the deadline; the kubelet keeps the condition
    (``mergePodStatus``), and fail-categories' FailJob takes the pod."""
    annotations = {**FREE, P + "start-deadline": "10m"}
    run = JobRun.store(api, admitted_job(annotations, "pull"))
    with Running(verdicts(api, tmp_path)) as reconciler:
        pod = stuck(run, "ImagePullBackOff")  # created at T0: long past its 10 minutes
        ended = eventually(
            lambda: (p := run.current(pod))["spec"].get("activeDeadlineSeconds") == 1 and p, 10
        )
        condition = conditions(ended)[P + "ImagePull"]
        assert condition["reason"] == "StartDeadline"
        run.terminate(pod, code=137)
        assert run.judge(pod) == "FailJob" and run.ended == "PodFailurePolicy"
        eventually(lambda: reconciler.stats()["ended"] == 1, 10)
        said = "did not start within its start-deadline 10m: ImagePull"
        eventually(
            lambda: any(said in e["note"] for e in events_of(api, "RetryFailureClassified")), 10
        )


def test_an_unscheduled_pod_past_its_deadline_is_failed_as_podgc_fails_one(api, tmp_path):
    """upstream: ``markFailedAndDeletePodWithCondition`` (pkg/controller/podgc): no kubelet
    will end a pod no node was given, so its status gets ``Failed`` and the condition in
    one patch; the Job controller judges a Failed pod (``isPodFailed``)."""
    annotations = {P + "start-deadline": "10m", P + "backoff-limit": "2"}
    run = JobRun.store(api, admitted_job(annotations, "pending"))
    with Running(verdicts(api, tmp_path)):
        pod = stuck(run, "", scheduled=False)
        failed = eventually(lambda: (p := run.current(pod))["status"]["phase"] == "Failed" and p)
        assert conditions(failed)[P + "Unschedulable"]["reason"] == "StartDeadline"
        assert run.judge(pod) == "none" and run.counted == 1


def test_a_pod_not_due_yet_or_held_by_a_gate_is_left_alone(api, tmp_path):
    annotations = {P + "start-deadline": "10m", P + "backoff-limit": "2"}
    run = JobRun.store(api, admitted_job(annotations, "young"))
    clock = [0.0]
    reconciler = verdicts(api, tmp_path)
    reconciler.clock = lambda: clock[0]
    reconciler.timers.clock = reconciler.clock
    pod = stuck(run, "ContainerCreating")
    created = reconciler.timers
    held = copy.deepcopy(run.current(pod))
    held["spec"]["schedulingGates"] = [{"name": "retry-policy.dev/retry-delay"}]
    from webhook.controller import startdeadline as sd

    assert sd.due(held) is None
    when = sd.due(run.current(pod))
    clock[0] = when - 1
    created.watch(run.current(pod))
    assert created.ready() == []
    clock[0] = when
    assert [uid for *_, uid in created.ready()] == [pod["metadata"]["uid"]]


def test_a_failed_pod_of_a_managed_job_is_classified_for_the_people_who_read_it(api, tmp_path):
    """``categoryConditions: Always``: no rule of its Job reads a category, and the
    condition is written on the failed pod all the same (the admission policy allows it on
    a failed Job pod), and told; a Job without a plan is left alone."""
    managed = JobRun.store(api, admitted_job({P + "backoff-limit": "3"}, "managed"))
    plain = JobRun.store(api, admitted_job({}, "plain"))
    metrics = Told()
    config = parse_config(
        "categoryConditions: Always\n"
        "categories:\n  - {name: BadInput, hint: the input data is bad, match: {exitCodes: [3]}}\n"
    )
    with Running(verdicts(api, tmp_path, metrics, config)):
        pod = managed.fail(managed.new_pod(), code=3)
        other = plain.fail(plain.new_pod(), code=3)
        marked = eventually(lambda: P + "BadInput" in conditions(p := managed.current(pod)) and p)
        assert conditions(marked)[P + "BadInput"]["message"] == "the input data is bad"
        eventually(lambda: ("failure", "ml", "BadInput", "counted") in metrics.calls, 10)
        assert not any(k.startswith(P) for k in conditions(plain.current(other)))


def test_a_category_no_rule_reads_is_told_and_not_written_by_default(api, tmp_path):
    """``categoryConditions: WhenRead``, the default: a failed pod whose Job has no rule on
    a category is classified and told (the metric, the Event), and nothing is written on
    it (one ``pods/status`` write a failed pod, that nothing reads); a Job whose own rule
    reads a category gets it on its pods, though no annotation of ours asked."""
    quiet_run = JobRun.store(api, admitted_job({P + "backoff-limit": "3"}, "quiet"))
    job = admitted_job({P + "backoff-limit": "3"}, "users-rule")
    job["spec"]["podFailurePolicy"] = {
        "rules": [
            {
                "action": "FailJob",
                "onPodConditions": [{"type": P + "BadInput", "status": "True"}],
            }
        ]
    }
    read_run = JobRun.store(api, job)
    metrics = Told()
    config = parse_config(
        "categories:\n  - {name: BadInput, hint: the input data is bad, match: {exitCodes: [3]}}\n"
    )
    with Running(verdicts(api, tmp_path, metrics, config)) as reconciler:
        quiet = quiet_run.fail(quiet_run.new_pod(), code=3)
        read = read_run.fail(read_run.new_pod(), code=3)
        eventually(lambda: P + "BadInput" in conditions(read_run.current(read)), 10)
        eventually(lambda: reconciler.stats()["told"] == 2, 10)
        reconciler.events.flush()
        told = eventually(lambda: events_of(api, "RetryFailureClassified"), 10)
    assert not any(k.startswith(P) for k in conditions(quiet_run.current(quiet)))
    assert ("failure", "ml", "BadInput", "counted") in metrics.calls
    assert any("BadInput" in e["note"] and "the input data is bad" in e["note"] for e in told)
    assert not any("could be written" in e["note"] or "landed" in e["note"] for e in told)


def test_an_xid_in_a_pods_event_makes_it_a_device_fault(api, tmp_path):
    run = JobRun.store(api, admitted_job({P + "backoff-limit": "3"}, "gpu"))
    pod = run.new_pod()
    meta = pod["metadata"]
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "gpu.1", "namespace": "ml"},
        "regarding": {
            "kind": "Pod",
            "name": meta["name"],
            "namespace": "ml",
            "uid": meta["uid"],
        },
        "reason": "GPUError",
        "note": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
        "type": "Warning",
    }
    with api.lock:  # as the API server stores an Event a node agent wrote about the pod
        api.named["events"][("ml", "gpu.1")] = event
    with Running(verdicts(api, tmp_path, config=parse_config("categoryConditions: Always"))):
        run.fail(pod, code=1)
        marked = eventually(lambda: CATEGORY in conditions(p := run.current(pod)) and p, 10)
        assert conditions(marked)[CATEGORY]["reason"] == "Event"


def test_a_restarted_controller_counts_no_free_failure_twice(api, tmp_path):
    run = JobRun.store(api, admitted_job(FREE, "again", parallelism=2, completions=2))
    with Running(verdicts(api, tmp_path)):
        pod = run.new_pod()
        run.disrupt(pod, "DeletionByDeviceTaintManager")
        eventually(lambda: (r := record_of(api, run.uid)) and r.free_of() == 1, 10)
    with Running(verdicts(api, tmp_path)) as again:
        run.terminate(pod, code=143)
        eventually(lambda: again.stats()["told"] == 1, 10)
        again.free.flush()
        assert record_of(api, run.uid).free_of() == 1


def test_a_condition_the_api_fails_is_written_again_after_its_back_off(api, tmp_path):
    """``webhook.controller.writes``: a 503 is tried again after a back-off (here the
    shortest, 0.5 s), while the pod may still be judged with it; the write lands."""
    run = JobRun.store(api, admitted_job(FREE, "flaky"))
    reconciler = verdicts(api, tmp_path)
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        api.write_status.pop("pods", None)  # the API is back

    reconciler.sleep = sleep
    pod = run.new_pod()
    run.disrupt(pod, "DeletionByDeviceTaintManager")
    api.write_status["pods"] = 503
    found = reconciler.classify(run.current(pod))
    assert reconciler.mark(run.current(pod), found) == "added"
    assert slept and 0 < slept[0] <= 0.5
    assert CATEGORY in conditions(run.current(pod))
    assert reconciler.writes.stats()["retried"] == 1


def test_a_pod_deleted_before_its_category_is_written_is_told_and_not_written(api, tmp_path):
    """PodGC fails a lost node's pod and deletes it (``gcOrphaned``: the
    ``DisruptionTarget`` and ``Failed`` in one update, then the deletion): once a watch
    has seen the deletion, no condition is written (it would be answered 404, at the cost
    of a critical token); the category is still told, and the Event says why it is not on
    the pod. A deletion no watch has shown yet is found by the 404, and told the same."""
    run = JobRun.store(api, admitted_job({P + "backoff-limit": "3"}, "lost", parallelism=2))
    metrics = Told()
    reconciler = verdicts(api, tmp_path, metrics, parse_config("categoryConditions: Always"))
    seen, unseen = run.fail(run.new_pod(), code=1), run.fail(run.new_pod(), code=1)
    reconciler._failed_event("MODIFIED", seen)
    reconciler._failed_event("DELETED", seen)
    for pod in (seen, unseen):
        api.delete("pods", pod["metadata"]["uid"])
    before = len(api.requests)
    reconciler.record_failed(seen)
    assert not [r for r in api.requests[before:] if r[0].startswith("PATCH")]
    reconciler.record_failed(unseen)
    assert reconciler.stats()["gone"] == 2 and reconciler.stats()["told"] == 2
    assert metrics.calls.count(("condition", "category", "gone")) == 2
    assert metrics.calls.count(("failure", "ml", "AppError", "counted")) == 2
    reconciler.events.flush()
    told = eventually(lambda: events_of(api, "RetryFailureClassified"), 10)
    assert all("deleted before its category could be written" in e["note"] for e in told)
    assert {e["type"] for e in told} == {"Normal"}  # no rule of the Job reads a category


def test_the_same_failure_of_two_pods_is_one_event_counted_twice(api, tmp_path):
    """The note names no pod (``_event``): the second pod's Event is the first's (an
    Event's name is derived from what it says), counted into its ``series``
    (``webhook.cluster.events``): ``kubectl describe job`` shows one line, seen twice,
    not one line a pod."""
    run = JobRun.store(api, admitted_job({P + "backoff-limit": "3"}, "twice", parallelism=2))
    with Running(verdicts(api, tmp_path)) as reconciler:
        for pod in (run.new_pod(), run.new_pod()):
            run.fail(pod, code=3)
        eventually(lambda: reconciler.stats()["told"] == 2, 10)
        reconciler.events.flush()  # (the repeat is held for the series' next write)
        handled = reconciler.events.stats()
    assert handled["written"] == 1 and handled["aggregated"] == 1
    (event,) = events_of(api, "RetryFailureClassified")
    assert event["note"].startswith("a pod failed: AppError (ExitCode)")
    assert event["series"]["count"] == 2
    assert event["regarding"]["uid"] == run.uid


def test_a_classified_failure_is_exported_as_retry_webhook_failures_total(api, tmp_path):
    """The controller's own metrics (``ControllerMetrics``), handed to the reconcilers
    ``build`` makes: a free failure is counted once, exported as
    ``retry_webhook_failures_total{namespace, category, verdict}``."""
    from kubernetes import client as k8s
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from webhook.controller.manager import ControllerOptions
    from webhook.controller.reconcilers import build
    from webhook.serving.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    client = client_of(api, tmp_path)
    events = EventRecorder(k8s.EventsV1Api(client), "test").start()
    options = ControllerOptions(CHART_NS, "retry-policy-webhook-controller", "a")
    built = {r.name: r for r in build(client, options, events, None, metrics)}
    run = JobRun.store(api, admitted_job(FREE, "exported", parallelism=2, completions=2))
    stop = threading.Event()
    built["jobs"].start(stop)  # the one watch of Jobs, on a thread not waited for
    try:
        assert built["jobs"].synced.wait(scaled(10))
        with Running(built["verdicts"]) as reconciler:
            pod = run.new_pod()
            run.disrupt(pod, "DeletionByDeviceTaintManager")
            eventually(lambda: CATEGORY in conditions(run.current(pod)), 10)
            run.terminate(pod, code=143)
            eventually(lambda: reconciler.stats()["told"] == 1, 10)
    finally:
        stop.set()
    text = generate_latest(metrics.registry).decode()
    exported = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "retry_webhook_failures_total"
    }
    labels = (("category", "DeviceFault"), ("namespace", "ml"), ("verdict", "free"))
    assert exported == {("retry_webhook_failures_total", labels): 1.0}
