"""What failed attempts wasted (``retry_webhook_wasted_resource_seconds_total``): a pod's
requests as the scheduler computes them, its run time and cause; counted by the real
controller against the HTTP test API once per failed pod of a workload with a retry plan
(when the write that marks it in the record lands: never again after a relist or a new
leader), and scraped from a real server's metrics port."""

from __future__ import annotations

import copy
import threading
from fractions import Fraction

import pytest

from testkit.builders import P, job, stored
from testkit.controllers import client_of
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.jobsim import T0, JobRun
from testkit.records import JOBSET_LABELS, failed_pod, relisted
from testkit.servers import eventually, free_port, metric, scaled, start, stop
from testkit.waste import MAIN, WASTED
from testkit.workloads import mutate
from webhook.cluster import waste
from webhook.cluster.record import Record
from webhook.controller import recorder as recorder_module
from webhook.controller.recorder import HistoryRecorder
from webhook.kube.podresources import is_extended, pod_requests
from webhook.policy.model import APPLIED
from webhook.serving.metrics import ControllerMetrics

GI = 2**30
#: What jobsim's kubelet gives a pod: started at T0, stopped a minute later.
RUN = 60.0
#: A recorder's batching window no test outlasts: it writes when the test flushes.
ONLY_FLUSHED = 3600.0
#: What one failed pod of such a Job wastes in a minute: cores, GiB, GPUs.
PER_POD = {"cpu": 2 * RUN, "memory": 4 * RUN, "nvidia.com/gpu": 1 * RUN}


# --- the pod's requests ------------------------------------------------------------------


def container(name, restart_policy=None, **requests):
    c = {"name": name, "image": "x", "resources": {"requests": dict(requests)}}
    if restart_policy:
        c["restartPolicy"] = restart_policy
    return c


def test_requests_are_the_schedulers_with_sidecars_init_containers_and_overhead():
    # upstream: PodRequests, AggregateContainerRequests, aggregateContainerResourcesByFn
    # (staging/src/k8s.io/component-helpers/resource/helpers.go): containers summed;
    # a sidecar (restartPolicy Always) added to them and to every init container after it;
    # the max with each init container's use; pod-level requests; then the overhead.
    spec = {
        "containers": [container("a", cpu="1", memory="1Gi"), container("b", cpu="500m")],
        "initContainers": [
            container("setup", cpu="2"),
            container("proxy", "Always", cpu="200m", memory="256Mi"),
            container("fetch", cpu="1", memory="3Gi", **{"nvidia.com/gpu": "1"}),
        ],
        "overhead": {"cpu": "100m", "memory": "64Mi"},
    }
    requests = pod_requests({"spec": spec})
    # cpu: max(1 + 0.5 + 0.2, setup 2, fetch 1 + 0.2) + 0.1; memory: max(1Gi + 256Mi,
    # fetch 3Gi + 256Mi) + 64Mi; the GPU only an init container asks for.
    assert requests == {
        "cpu": Fraction(21, 10),
        "memory": 3 * GI + 256 * 2**20 + 64 * 2**20,
        "nvidia.com/gpu": 1,
    }
    # Pod-level requests (PodLevelResources: applyPodLevelResources) replace the cpu and
    # memory of the containers, not what they do not set; the overhead still comes on top.
    spec["resources"] = {"requests": {"cpu": "4"}}
    assert pod_requests({"spec": spec})["cpu"] == Fraction(41, 10)
    assert pod_requests({"spec": spec})["nvidia.com/gpu"] == 1


def test_a_sidecar_counts_for_the_init_containers_after_it_only():
    # upstream: aggregateContainerResourcesByFn: InitContainerUse(i) is the sidecars with
    # an index below i plus the i-th init container.
    spec = {
        "containers": [container("main", cpu="1")],
        "initContainers": [
            container("first", cpu="3"),
            container("proxy", "Always", cpu="1"),
            container("last", cpu="2"),
        ],
    }
    assert pod_requests({"spec": spec})["cpu"] == 3  # max(1 + 1, 3, 2 + 1)


def test_unreadable_requests_are_left_out_never_an_error():
    spec = {"containers": [container("a", cpu="lots", memory="1Gi"), "junk"], "overhead": []}
    assert pod_requests({"spec": spec}) == {"memory": GI}
    assert pod_requests({}) == {}


@pytest.mark.parametrize(
    ("name", "extended"),
    [
        ("nvidia.com/gpu", True),
        ("amd.com/gpu", True),
        ("cpu", False),
        ("hugepages-2Mi", False),
        ("kubernetes.io/something", False),
        ("requests.example.com/foo", False),
        ("Example.com/foo", False),
    ],
)
def test_extended_resources_are_the_apis(name, extended):
    # upstream: IsExtendedResourceName (pkg/apis/core/v1/helper/helpers.go): outside the
    # kubernetes.io/ domain, no requests. prefix, a qualified name once prefixed.
    assert is_extended(name) is extended


# --- cause and run time ------------------------------------------------------------------


def failed(*terminated, reason=None, conditions=(), start=T0, last=None):
    statuses = []
    for n, state in enumerate(terminated):
        cs = {"name": f"c{n}", "state": {"terminated": state}}
        if last:
            cs["lastState"] = {"terminated": last}
        statuses.append(cs)
    status = {"phase": "Failed", "containerStatuses": statuses, "conditions": list(conditions)}
    if start:
        status["startTime"] = start
    if reason:
        status["reason"] = reason
    return {"metadata": {"uid": "u"}, "spec": {"containers": [MAIN]}, "status": status}


def exited(code, reason="Error", at="2026-11-26T10:01:00Z", started=None):
    state = {"exitCode": code, "reason": reason, "finishedAt": at}
    if started:
        state["startedAt"] = started
    return state


DISRUPTED = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
IN_PLACE = {"type": "retry-policy.dev/InPlaceBudgetExhausted", "status": "True"}


@pytest.mark.parametrize(
    ("pod", "cause"),
    [
        (failed(exited(137, "OOMKilled"), exited(1)), "OOMKilled"),
        (failed(exited(1), conditions=[DISRUPTED]), "Preempted"),
        (failed(exited(137, "OOMKilled"), conditions=[DISRUPTED]), "Preempted"),
        (
            failed(exited(137), conditions=[{**DISRUPTED, "reason": "DeletionByPodGC"}]),
            "NodeFailure",
        ),
        (failed(exited(143), reason="DeadlineExceeded"), "AppError"),
        (failed(exited(137, "OOMKilled"), reason="DeadlineExceeded"), "OOMKilled"),
        (failed(exited(1)), "AppError"),
        (failed(exited(0), exited(2)), "AppError"),
        (failed(exited(0)), "AppError"),
        (failed(), "AppError"),
        # The category the controller wrote decides (an Xid told in an Event, say).
        (
            failed(exited(1), conditions=[{"type": P + "DeviceFault", "status": "True"}]),
            "DeviceFault",
        ),
        # The in-place budget ends a pod by its deadline: the exits it restarted on are
        # the cause.
        (failed(exited(137), reason="DeadlineExceeded", conditions=[IN_PLACE]), "AppError"),
        (
            failed(
                exited(137),
                reason="DeadlineExceeded",
                conditions=[IN_PLACE],
                last=exited(137, "OOMKilled"),
            ),
            "OOMKilled",
        ),
    ],
)
def test_the_cause_is_the_failures_category(pod, cause):
    assert waste.cause(pod) == cause


def test_run_time_is_start_to_the_last_finish_else_what_tells():
    two = failed(exited(1, at="2026-11-26T10:00:30Z"), exited(1, at="2026-11-26T10:02:00Z"))
    assert waste.run_seconds(two) == 120
    # No startTime: the earliest container start.
    early = failed(exited(1, started="2026-11-26T10:00:20Z"), start=None)
    assert waste.run_seconds(early) == 40
    # PodGC failed it when its node went: its containers never stopped for a kubelet.
    lost = failed(conditions=[{**DISRUPTED, "lastTransitionTime": "2026-11-26T10:05:00Z"}])
    assert waste.run_seconds(lost) == 300
    # Never started, or no end known (the kubelet rejected it: only its conditions moved).
    assert waste.run_seconds(failed(exited(1), start=None)) == 0
    ready = {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-26T10:05:00Z"}
    assert waste.run_seconds(failed(conditions=[ready])) == 0
    # A clock that went back counts nothing, never less than nothing.
    assert waste.run_seconds(failed(exited(1, at="2026-11-26T09:00:00Z"))) == 0


def test_memory_is_in_gib_seconds_and_only_cpu_memory_and_extended_resources_count():
    pod = failed(exited(1))
    pod["spec"]["containers"] = [
        container(
            "main",
            cpu="500m",
            memory="512Mi",
            **{"nvidia.com/gpu": "2", "ephemeral-storage": "10Gi", "hugepages-2Mi": "1Gi"},
        )
    ]
    assert waste.wasted(pod) == {"cpu": 30.0, "memory": 30.0, "nvidia.com/gpu": 120.0}
    assert waste.wasted(failed(exited(1), start=None)) == {}


# --- counted by the controller -----------------------------------------------------------


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


class Running:
    """A recorder (the leader's) with real controller metrics, until the block ends; with
    a long ``window`` it writes only when the test flushes (and when it stops)."""

    def __init__(self, fake: FakeAPI, tmp_path, window: float = 0.05):
        self.metrics = ControllerMetrics()
        self.recorder = HistoryRecorder(
            client_of(fake, tmp_path), window, metrics=self.metrics, linger=0.0
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.recorder.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        eventually(lambda: getattr(self.recorder, "watches", None), 10)
        eventually(lambda: all(w.synced.is_set() for w in self.recorder.watches), 10)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(scaled(5))

    def wasted(self, namespace: str, cause: str, resource: str) -> float:
        labels = {"namespace": namespace, "cause": cause, "resource": resource}
        return self.metrics.registry.get_sample_value(WASTED, labels) or 0.0

    def total(self) -> float:
        return sum(
            s.value
            for family in self.metrics.registry.collect()
            for s in family.samples
            if s.name == WASTED
        )


def planned_job(name: str = "train", **annotations: str) -> dict:
    """A Job as the webhook admitted it: a plan of its own keys that touches nothing of
    its pods (``backoff-limit``: only ``retry-policy.dev/applied`` says it had one)."""
    manifest = job({P + "backoff-limit": "3", **annotations}, name=name, containers=[MAIN])
    verdict, out = mutate(manifest)
    assert verdict.allowed, verdict.message
    assert APPLIED in out["metadata"]["annotations"]
    assert not (out["spec"]["template"].get("metadata") or {}).get("annotations")
    return stored(out, uid=f"uid-{name}")


def record_of(fake: FakeAPI, resource: str, uid: str) -> Record | None:
    with fake.lock:
        return Record.of(copy.deepcopy(fake.objects[resource][uid]))


def oom_killed(run: JobRun, pod: dict) -> dict:
    """The kubelet: the OOM killer stopped the container a minute in, the pod ``Failed``."""

    def change(p):
        p["status"]["phase"] = "Failed"
        for cs in p["status"]["containerStatuses"]:
            cs["state"] = {"terminated": {**exited(137, "OOMKilled", started=T0)}}

    return run.update(pod, change)


def past_its_deadline(run: JobRun, pod: dict) -> dict:
    run.update(pod, lambda p: p["spec"].update(activeDeadlineSeconds=30))
    return run.terminate(pod, code=137)  # the kubelet: Failed, DeadlineExceeded


def test_each_failure_of_a_job_with_a_plan_is_counted_once_by_cause(api, tmp_path):
    run = JobRun.store(api, planned_job())
    with Running(api, tmp_path) as leader:
        run.fail(run.new_pod(), code=1)
        oom_killed(run, run.new_pod())
        preempted = run.disrupt(run.new_pod())
        run.fail(preempted)
        past_its_deadline(run, run.new_pod())
        eventually(lambda: (r := record_of(api, "jobs", run.uid)) and len(r.marks) == 4 * 6, 10)
        eventually(lambda: leader.total() == 4 * sum(PER_POD.values()), 10)
        # An exit, an OOM kill, a preemption, and a pod past its own deadline (AppError).
        for why, times in (("AppError", 2), ("OOMKilled", 1), ("Preempted", 1)):
            for resource, amount in PER_POD.items():
                assert leader.wasted("ml", why, resource) == times * amount, (why, resource)
        # The watch ends with 410: every failed pod is listed again, none counted again.
        since = len(api.requests)
        api.expire("pods")
        eventually(lambda: relisted(api, since))
        leader.recorder.flush()
        assert leader.total() == 4 * sum(PER_POD.values())
    # One more fails while no controller leads; a new leader (or this one restarted)
    # lists all five: the record marks four, the fifth alone is counted.
    run.fail(run.new_pod(), code=1)
    with Running(api, tmp_path, ONLY_FLUSHED) as successor:
        successor.recorder.flush()
        assert successor.recorder.stats()["writes"] == 1
        assert successor.total() == sum(PER_POD.values())
        assert successor.wasted("ml", "AppError", "memory") == PER_POD["memory"]
    assert len(record_of(api, "jobs", run.uid).marks) == 5 * 6


def test_a_job_without_a_plan_is_neither_recorded_nor_counted(api, tmp_path):
    plain = JobRun.store(api, stored(job(name="plain", containers=[MAIN]), uid="uid-plain"))
    plain.fail(plain.new_pod(), code=1)
    planned = JobRun.store(api, planned_job("planned"))
    planned.fail(planned.new_pod(), code=1)
    with Running(api, tmp_path, ONLY_FLUSHED) as leader:
        leader.recorder.flush()
        assert record_of(api, "jobs", planned.uid) is not None
        assert record_of(api, "jobs", plain.uid) is None
        assert leader.total() == sum(PER_POD.values())


def test_a_pod_that_failed_before_its_job_was_seen_is_counted_once_it_is(api, tmp_path):
    """A Job comes before its pods, but on another watch: a failed pod whose Job the
    recorder has not seen yet is held until the Job comes (and only so long)."""
    early = JobRun(api, planned_job("early"))  # not stored yet
    with Running(api, tmp_path, ONLY_FLUSHED) as leader:
        early.fail(early.new_pod(), code=1)
        eventually(lambda: leader.recorder._held, 10)
        leader.recorder.flush()
        assert record_of_job(api, early.uid) is None
        api.put("jobs", early.job)
        eventually(lambda: not leader.recorder._held, 10)
        leader.recorder.flush()
        assert len(record_of(api, "jobs", early.uid).marks) == 6
        assert leader.total() == sum(PER_POD.values())


def test_a_held_pod_whose_job_never_comes_is_dropped(api, tmp_path, monkeypatch):
    gone = JobRun(api, planned_job("gone"))
    with Running(api, tmp_path, ONLY_FLUSHED) as leader:
        gone.fail(gone.new_pod(), code=1)
        eventually(lambda: leader.recorder._held, 10)
        monkeypatch.setattr(recorder_module, "HOLD_SECONDS", 0.0)
        leader.recorder.flush()
        assert not leader.recorder._held and leader.total() == 0


def record_of_job(fake: FakeAPI, uid: str) -> Record | None:
    with fake.lock:
        found = fake.objects["jobs"].get(uid)
    return Record.of(found) if found else None


def cronjob(name: str, annotations: dict) -> dict:
    return stored(
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
            "spec": {"schedule": "@hourly", "jobTemplate": {"spec": {}}},
        },
        uid=f"uid-{name}",
    )


def cronjobs_job(cron: dict) -> dict:
    """A Job the CronJob made: its template's spec, none of the CronJob's annotations."""
    made = job(name=f"{cron['metadata']['name']}-29000000", containers=[MAIN])
    made["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "name": cron["metadata"]["name"],
            "uid": cron["metadata"]["uid"],
            "controller": True,
        }
    ]
    return stored(made, uid=f"uid-{made['metadata']['name']}")


def test_a_cronjobs_jobs_are_counted_when_the_cronjob_has_a_plan(api, tmp_path):
    with_plan = cronjob("nightly", {APPLIED: '{"backoffLimit":3}'})
    without = cronjob("hourly", {})
    deleted = cronjob("weekly", {APPLIED: "{}"})  # never stored: its Jobs were orphaned
    for cron in (with_plan, without):
        api.store("cronjobs", cron)
    runs = [JobRun.store(api, cronjobs_job(c)) for c in (with_plan, without, deleted)]
    for run in runs:
        run.fail(run.new_pod(), code=1)
    with Running(api, tmp_path, ONLY_FLUSHED) as leader:
        leader.recorder.flush()
        assert record_of(api, "jobs", runs[0].uid) is not None
        assert record_of(api, "jobs", runs[1].uid) is None
        assert record_of(api, "jobs", runs[2].uid) is None
        assert leader.wasted("ml", "AppError", "nvidia.com/gpu") == RUN
        assert leader.recorder.stats()["errors"] == 0


def a_jobset(name: str, uid: str, annotations: dict) -> dict:
    worker = {
        "name": "workers",
        "replicas": 1,
        "template": {"spec": {"template": {"spec": {"containers": [MAIN]}}}},
    }
    manifest = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {"replicatedJobs": [worker]},
    }
    if annotations:
        verdict, manifest = mutate(manifest)
        assert verdict.allowed, verdict.message
    return stored(manifest, uid=uid)


def jobset_pod(name: str, uid: str) -> dict:
    labels = {**JOBSET_LABELS, "jobset.sigs.k8s.io/jobset-name": name}
    labels["jobset.sigs.k8s.io/jobset-uid"] = uid
    labels["jobset.sigs.k8s.io/restart-attempt"] = "0"
    pod = failed_pod(f"{uid}-child", f"{name}-workers-0", oom=False, labels=labels)
    pod["metadata"]["annotations"] = {}  # nothing of ours: a plan of the JobSet's alone
    pod["spec"]["containers"] = [MAIN]
    pod["status"]["startTime"] = "2026-11-26T09:59:00Z"
    return pod


def test_a_jobsets_pods_are_counted_on_the_jobset_with_a_plan(api, tmp_path):
    api.put("jobsets", a_jobset("pretrain", "uid-pretrain", {P + "backoff-limit": "3"}))
    api.put("jobsets", a_jobset("plain", "uid-plain", {}))
    api.put("pods", jobset_pod("plain", "uid-plain"))
    api.put("pods", jobset_pod("pretrain", "uid-pretrain"))
    with Running(api, tmp_path, ONLY_FLUSHED) as leader:
        leader.recorder.flush()
        assert record_of(api, "jobsets", "uid-pretrain") is not None
        assert record_of(api, "jobsets", "uid-plain") is None
        assert leader.wasted("ml", "AppError", "cpu") == 2 * RUN


# --- scraped from the real server --------------------------------------------------------


def test_the_server_exports_what_failures_wasted(api, tmp_path):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    fast = ["--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period", "0.2"]
    run = JobRun.store(api, planned_job())
    srv = start(
        tmp_path / "certs",
        "--kube",
        "kubeconfig",
        *fast,
        metrics_port=free_port(),
        env={"KUBECONFIG": str(kubeconfig)},
    )
    try:
        oom_killed(run, run.new_pod())
        oom_killed(run, run.new_pod())

        def scraped():
            samples = srv.metrics()
            found = metric(samples, WASTED, namespace="ml", cause="OOMKilled", resource="memory")
            return found == 2 * PER_POD["memory"] and samples

        samples = eventually(scraped, 20, 0.3)
        labels = {"namespace": "ml", "cause": "OOMKilled"}
        assert metric(samples, WASTED, resource="cpu", **labels) == 2 * PER_POD["cpu"]
        assert metric(samples, WASTED, resource="nvidia.com/gpu", **labels) == 2 * RUN
        # No pod or workload name is a label: the series are namespace x cause x resource.
        names = [{name for name, _ in k[1]} for k in samples if k[0] == WASTED]
        assert names and all(n == {"namespace", "cause", "resource"} for n in names)
    finally:
        stop(srv)
