"""The Job controller's and the kubelet's part, played against the HTTP test API
(``testkit/fakeapi/``) for the controller's tests: pods made from a Job's template as the
Job controller makes them, the conditions and states the scheduler, the Eviction API,
PodGC and the kubelet give them, and the Job controller's judgement of a failed pod.

What is reproduced, from upstream:

- a Job's pod is ``webhook.kube.jobcontroller.pod_from_template``'s (``manageJob``: the
  template's labels and annotations, its controller owner reference and the
  ``batch.kubernetes.io/job-tracking`` finalizer; an Indexed Job's pod its index as
  annotation, label, ``JOB_COMPLETION_INDEX`` env var, hostname and ``generateName``
  and, with ``backoffLimitPerIndex``, ``job-index-failure-count``), with the
  ``batch.kubernetes.io/controller-uid`` and ``job-name`` labels, stored with a generated
  name and its ``creationTimestamp``; the kubelet's ``status.startTime`` once it runs, its
  conditions (the scheduler's ``PodScheduled``; ``PodReadyToStartContainers``,
  ``Initialized``, ``Ready``, ``ContainersReady`` from ``generateAPIPodStatus``, each but
  ``Initialized`` and ``PodScheduled`` ``False`` once the pod has stopped), and a stopped
  container's ``startedAt`` and ``finishedAt`` (``KUBELET_NOW``: a minute later);
- preemption and the Eviction API add ``DisruptionTarget=True`` (reasons
  ``PreemptionByScheduler``, ``EvictionByEvictionAPI``) before the pod is deleted, while it
  runs; the kubelet then stops its containers (143) and sets phase ``Failed``;
- the kubelet's node-pressure eviction and graceful node shutdown send
  ``DisruptionTarget`` (``TerminationByKubelet``) in the very update that makes the pod
  ``Failed``, once its containers stopped (``mergePodStatus`` in
  pkg/kubelet/status/status_manager.go: ``evict_by_kubelet``); PodGC fails a pod whose
  node is gone with ``DisruptionTarget`` (``DeletionByPodGC``) in one status patch, then
  deletes it (``markFailedAndDeletePodWithCondition`` in pkg/controller/podgc: ``podgc``);
- the phase the kubelet gives a pod it stops because it was deleted or passed its
  ``activeDeadlineSeconds`` (``terminate``): ``getPhase`` (pkg/kubelet/kubelet_pods.go),
  ``Succeeded`` when every container exited 0, else ``Failed``; past the deadline
  ``activeDeadlineHandler.ShouldEvict`` (pkg/kubelet/active_deadline.go) overrides it:
  ``Failed``, reason ``DeadlineExceeded``, whatever the containers exited with;
- the Job controller judges a failed pod with its podFailurePolicy (the one evaluation,
  ``webhook.kube.failurepolicy.evaluate``, as ``matchPodFailurePolicy``: the first rule
  that matches) once it is ``Failed`` (``isPodFailed`` with a podFailurePolicy), reading
  its conditions as they are then, counts every failure but an Ignore rule's, fails the
  Job past ``backoffLimit`` (``BackoffLimitExceeded``: ``failed > backoffLimit``, read
  from the Job at each sync) or on FailJob, and removes its finalizer. ``judge`` does
  this for one pod; ``sync`` as ``syncJob`` does for all (``trackJobStatusAndRemoveFinalizers``:
  a counted pod's UID goes into ``status.uncountedTerminatedPods`` before its finalizer is
  removed, and a pod is judged once), and ``syncing`` runs it beside a test, each sync at
  most a batch period after the last (``syncJobBatchPeriod``, 1 s); ``conclude`` writes
  the Job's end as ``syncJob`` does: ``FailureTarget`` then ``Failed`` (with
  ``matchPodFailurePolicy``'s message for FailJob), or ``SuccessCriteriaMet`` then
  ``Complete``.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from testkit.fakeapi import FakeAPI
from webhook.kube import failurepolicy as fp
from webhook.kube.jobcontroller import failjob_message, pod_from_template
from webhook.kube.wellknown import JOB_TRACKING, JOB_UID_LABEL

T0 = "2026-11-26T10:00:00Z"
#: The kubelet's clock when it stops a pod: a minute after the pods started.
KUBELET_NOW = dt.datetime(2026, 11, 26, 10, 1, tzinfo=dt.timezone.utc)
STOPPED = KUBELET_NOW.strftime("%Y-%m-%dT%H:%M:%SZ")


#: A running pod's conditions, in the order the kubelet's status lists them
#: (``generateAPIPodStatus``, the scheduler's ``PodScheduled`` kept last), and those that
#: are ``False`` once it stopped.
KUBELET_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)
STOPPED_FALSE = ("PodReadyToStartContainers", "Ready", "ContainersReady")


def past_deadline(pod: dict[str, Any], now: dt.datetime = KUBELET_NOW) -> bool:
    """``pastActiveDeadline`` (pkg/kubelet/active_deadline.go): the pod has a deadline and
    has run that long since its ``status.startTime``."""
    deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    started = (pod.get("status") or {}).get("startTime")
    if deadline is None or not started:
        return False
    start = dt.datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    return (now - start).total_seconds() >= deadline


def kubelet_phase(pod: dict[str, Any], codes: list[int]) -> tuple[str, str | None]:
    """The phase and reason the kubelet gives a pod it stopped, its regular containers
    having exited with ``codes``: ``getPhase`` with ``podIsTerminal`` (every container
    exited 0: ``Succeeded``; else ``Failed``), then ``generateAPIPodStatus`` lets the pod
    sync handlers' ``ShouldEvict`` override it (past its deadline: ``Failed``,
    ``DeadlineExceeded``)."""
    phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
    if past_deadline(pod):
        return "Failed", "DeadlineExceeded"
    return phase, None


@dataclass
class JobRun:
    """One stored Job, its pods, and the Job controller's count of its failures."""

    api: FakeAPI
    job: dict[str, Any]
    counted: int = 0
    ended: str = ""
    judged: list[str] = field(default_factory=list)
    succeeded: int = 0
    #: Pod UID -> the action ``sync`` judged it with.
    verdicts: dict[str, str] = field(default_factory=dict)
    #: The Failed condition's message, when a FailJob rule ended the Job.
    message: str = ""
    #: When the next pods start and the kubelet stops them (a test moves it on to play
    #: attempts one after another).
    clock: tuple[str, str] = (T0, STOPPED)
    _syncs: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def store(cls, api: FakeAPI, admitted: dict[str, Any], uid: str | None = None) -> JobRun:
        job = copy.deepcopy(admitted)
        meta = job["metadata"]
        meta.setdefault("uid", uid or f"uid-{meta['name']}")
        job.setdefault("status", {})
        api.put("jobs", job)
        return cls(api, job)

    @property
    def uid(self) -> str:
        return str(self.job["metadata"]["uid"])

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    def new_pod(self, index: int | None = None, index_failures: int = 0) -> dict:
        """A running pod made from the template as the Job controller makes it
        (``pod_from_template``: for an Indexed Job its index, with ``backoffLimitPerIndex``
        the index's failures), stored with a generated name and a uid, on a node."""
        pod = pod_from_template(self.job, index, index_failures)
        meta, spec = pod["metadata"], pod["spec"]
        uid = str(uuid.uuid4())
        meta.update(name=meta["generateName"] + uid[:5], uid=uid, creationTimestamp=self.clock[0])
        meta["labels"].update({JOB_UID_LABEL: self.uid, "job-name": self.name})
        spec["nodeName"] = f"node-{uid[:4]}"
        pod["status"] = {
            "phase": "Running",
            "startTime": self.clock[0],
            "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": self.clock[0]}
                for kind in KUBELET_CONDITIONS
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "restartCount": 0,
                    "state": {"running": {"startedAt": self.clock[0]}},
                }
                for c in spec["containers"]
            ],
        }
        self.api.put("pods", pod)
        return pod

    def current(self, pod: dict[str, Any]) -> dict[str, Any]:
        found = self.api.pod(pod["metadata"]["uid"])
        assert found is not None, "the pod is gone"
        return found

    def update(self, pod: dict[str, Any], change: Any) -> dict[str, Any]:
        """One write of the pod by the kubelet or a controller: ``change`` applied to the
        pod as stored, at once, so that what others wrote meanwhile stays (the kubelet's
        status patch keeps the conditions it does not own: ``mergePodStatus``)."""
        uid = pod["metadata"]["uid"]
        assert self.api.pod(uid) is not None, "the pod is gone"
        return self.api.modify("pods", uid, change)

    def disrupt(
        self,
        pod: dict[str, Any],
        reason: str = "PreemptionByScheduler",
        delete: bool = True,
        at: str = T0,
    ) -> dict:
        """Preemption or eviction: ``DisruptionTarget=True`` on the running pod at ``at``,
        then its deletion (``addConditionAndDeletePod``; the preemptor's
        ``PrepareCandidate``). The kubelet's node-pressure eviction
        (``TerminationByKubelet``) deletes nothing."""
        pod = self.update(pod, lambda p: p["status"]["conditions"].append(_disruption(reason, at)))
        if delete:
            with self.api.lock:
                self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], None)
        return self.current(pod)

    def restart(self, pod: dict[str, Any], count: int) -> dict[str, Any]:
        """The kubelet restarted its main container in place ``count`` times so far."""

        def change(p: dict[str, Any]) -> None:
            p["status"]["containerStatuses"][0]["restartCount"] = count

        return self.update(pod, change)

    def fail(self, pod: dict[str, Any], code: int = 143) -> dict[str, Any]:
        """The kubelet: the containers stopped, the pod ``Failed``."""

        def change(p: dict[str, Any]) -> None:
            _stopped(p["status"], code, self.clock)
            p["status"]["phase"] = "Failed"

        return self.update(pod, change)

    def judge(self, pod: dict[str, Any]) -> str:
        """The Job controller's sync on a failed pod: its rules as they read it now;
        Ignore is not counted; FailJob or more than backoffLimit counted failures end the
        Job. Returns the action ("none" when no rule matched)."""
        pod = self.current(pod)
        assert fp.judged_failed(pod, self.job["spec"]), "not failed yet for the Job controller"
        rules = (self.job["spec"].get("podFailurePolicy") or {}).get("rules") or []
        match = fp.evaluate(rules, fp.PodFailure.from_pod(pod))
        action = match.action if match else "none"
        if fp.counts(match):
            self.counted += 1
        if action == "FailJob":
            self.ended = "PodFailurePolicy"
        elif self.counted > self.job["spec"]["backoffLimit"]:
            self.ended = "BackoffLimitExceeded"
        self.judged.append(action)
        self.api.remove_finalizer(pod["metadata"]["uid"])
        return action

    # --- the kubelet and PodGC ---------------------------------------------------------------
    def terminate(self, pod: dict[str, Any], code: int = 0) -> dict[str, Any]:
        """The kubelet stops a pod it must stop, deleted or past its deadline: the
        containers exit with ``code`` (0: the application handled SIGTERM), and the pod
        gets the phase ``kubelet_phase`` says, once they stopped."""

        def change(p: dict[str, Any]) -> None:
            deleted = p["metadata"].get("deletionTimestamp") is not None
            assert deleted or past_deadline(p), "the kubelet has no reason to stop this pod"
            status = p["status"]
            _stopped(status, code, self.clock)
            status["phase"], reason = kubelet_phase(p, [code] * len(status["containerStatuses"]))
            if reason is not None:
                status["reason"] = reason
                status["message"] = "Pod was active on the node longer than the specified deadline"

        return self.update(pod, change)

    def evict_by_kubelet(
        self, pod: dict[str, Any], code: int = 137, why: str = "Evicted", at: str = T0
    ) -> dict[str, Any]:
        """Node-pressure eviction (``Evicted``) or graceful node shutdown (``Terminated``):
        one status update with the containers stopped, ``Failed`` and ``DisruptionTarget``
        (``TerminationByKubelet``, at ``at``) together; nothing deletes the pod."""

        def change(p: dict[str, Any]) -> None:
            status = p["status"]
            _stopped(status, code, self.clock)
            status.update(phase="Failed", reason=why, message=f"The node {why.lower()} the pod")
            status["conditions"].append(_disruption("TerminationByKubelet", at))

        return self.update(pod, change)

    def podgc(self, pod: dict[str, Any]) -> dict[str, Any]:
        """PodGC, the pod's node gone: ``Failed`` and ``DisruptionTarget``
        (``DeletionByPodGC``) in one status patch (its containers' statuses as they were:
        no kubelet reports them), then a deletion with no grace period, which the tracking
        finalizer holds until the Job controller has judged the pod."""

        def change(p: dict[str, Any]) -> None:
            p["status"]["phase"] = "Failed"
            p["status"]["conditions"].append(_disruption("DeletionByPodGC"))

        pod = self.update(pod, change)
        with self.api.lock:
            self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], 0)
        return self.api.pod(pod["metadata"]["uid"]) or pod

    # --- the Job controller's sync -------------------------------------------------------------
    def sync(self, tracked: list[dict[str, Any]] | None = None) -> list[str]:
        """One ``syncJob``: each finished pod that keeps its tracking finalizer is judged
        once (a failed one by the rules, as it reads now; one already listed in
        ``uncountedTerminatedPods`` is not judged again), a counted pod's UID goes into
        ``uncountedTerminatedPods`` (one status write), the finalizers go, the counts move
        to ``failed`` and ``succeeded`` (another); then the Job fails when ``failed`` is
        more than its ``backoffLimit`` as it is now, or completes. The actions judged.
        ``tracked``: the Job's pods that keep the finalizer, read already (``JobController``)."""
        with self._syncs:
            job = self._job()
            spec = job["spec"]
            rules = (spec.get("podFailurePolicy") or {}).get("rules") or []
            uncounted = (job.get("status") or {}).get("uncountedTerminatedPods") or {}
            known = set(uncounted.get("failed") or []) | set(uncounted.get("succeeded") or [])
            failed, succeeded, judged, actions = [], [], [], []
            for pod in self._tracked() if tracked is None else tracked:
                uid = pod["metadata"]["uid"]
                if pod["status"].get("phase") == "Succeeded":
                    judged.append(uid)
                    succeeded += [] if uid in known else [uid]
                elif fp.judged_failed(pod, spec):
                    judged.append(uid)
                    if uid in known:
                        continue  # judged once
                    match = fp.evaluate(rules, fp.PodFailure.from_pod(pod))
                    actions.append(match.action if match else "none")
                    self.verdicts[uid] = actions[-1]
                    if match is not None and match.action == "FailJob" and not self.ended:
                        self.ended, self.message = "PodFailurePolicy", _failjob(pod, match)
                    failed += [uid] if fp.counts(match) else []
            if failed or succeeded:
                self.api.modify("jobs", self.uid, _uncount(failed, succeeded))
            for uid in judged:
                self.api.remove_finalizer(uid)
            if failed or succeeded or uncounted:
                job = self.api.modify("jobs", self.uid, _flush_uncounted)
            else:
                job = self._job()  # (its backoffLimit may have changed)
            self.judged += actions
            status = job.get("status") or {}
            self.counted, self.succeeded = status.get("failed", 0), status.get("succeeded", 0)
            if not self.ended and self.counted > job["spec"]["backoffLimit"]:
                self.ended = "BackoffLimitExceeded"
            if not self.ended and self.succeeded >= (job["spec"].get("completions") or 1):
                self.ended = "Complete"
            return actions

    def succeed(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The kubelet: every container exited 0, the pod ``Succeeded``."""

        def change(p: dict[str, Any]) -> None:
            _stopped(p["status"], 0, self.clock)
            p["status"]["phase"] = "Succeeded"

        return self.update(pod, change)

    def conclude(self, at: str = STOPPED) -> dict[str, Any]:
        """The Job's end as ``syncJob`` writes it (pkg/controller/job/job_controller.go),
        once ``sync`` found it, with ``delayTerminalCondition`` (JobManagedBy or
        JobPodReplacementPolicy, on by default): the interim ``FailureTarget``
        (``newFailureCondition``), then ``Failed`` with the same reason and message once no
        pod terminates (``newFailedConditionForFailureTarget``); or ``SuccessCriteriaMet``
        (``newSuccessCondition``), then ``Complete``. Each in its own status write, dated
        ``at``."""
        assert self.ended, "the Job has not ended"
        if self.ended == "Complete":
            kinds, reason, message = ("SuccessCriteriaMet", "Complete"), "", ""
        else:
            kinds, reason = ("FailureTarget", "Failed"), self.ended
            message = self.message or "Job has reached the specified backoff limit"
        stored = self.job
        for kind in kinds:
            condition = {"type": kind, "status": "True", "reason": reason, "message": message}
            condition["lastProbeTime"] = condition["lastTransitionTime"] = at

            def change(job: dict[str, Any], c: dict[str, Any] = condition) -> None:
                job.setdefault("status", {}).setdefault("conditions", []).append(c)

            stored = self.api.modify("jobs", self.uid, change)
        return stored

    @contextmanager
    def syncing(self, period: float = 1.0) -> Iterator[JobRun]:
        """The Job controller beside the test: a sync at most ``period`` after the last
        (``syncJobBatchPeriod``: pod updates are batched), and one more at the end."""
        with _beside(self.sync, period, 10):
            yield self

    def _job(self) -> dict[str, Any]:
        with self.api.lock:
            return copy.deepcopy(self.api.objects["jobs"][self.uid])

    def _tracked(self) -> list[dict[str, Any]]:
        """The Job's pods that keep its tracking finalizer."""
        with self.api.lock:
            return [
                copy.deepcopy(p)
                for p in self.api.objects["pods"].values()
                if p["metadata"]["labels"].get(JOB_UID_LABEL) == self.uid
                and JOB_TRACKING in (p["metadata"].get("finalizers") or [])
            ]


class JobController:
    """The Job controller of many Jobs (``JobRun.syncing`` for each would read every pod
    once per Job and round): each round one pass over the pods finds the Jobs with a
    finished or terminating pod that keeps its tracking finalizer (the pod updates that
    queue a Job's key, ``updatePod``), and each of those Jobs syncs once (``JobRun.sync``),
    a round at most ``period`` after the last (``syncJobBatchPeriod``). ``judged`` holds,
    per pod UID, when it was judged (``time.monotonic``) and with what action."""

    def __init__(self, api: FakeAPI, runs: list[JobRun]) -> None:
        self.api = api
        self.runs = {run.uid: run for run in runs}
        self.judged: dict[str, tuple[float, str]] = {}
        self.rounds = 0

    def round(self) -> int:
        """One round; how many pods it judged."""
        due: dict[str, list[dict[str, Any]]] = {}
        with self.api.lock:
            for pod in self.api.objects["pods"].values():
                meta = pod["metadata"]
                owner = meta["labels"].get(JOB_UID_LABEL)
                if owner in self.runs and JOB_TRACKING in (meta.get("finalizers") or []):
                    if pod["status"].get("phase") in ("Failed", "Succeeded") or meta.get(
                        "deletionTimestamp"
                    ):
                        due.setdefault(owner, [])
            for pod in self.api.objects["pods"].values():
                meta = pod["metadata"]
                owner = meta["labels"].get(JOB_UID_LABEL)
                if owner in due and JOB_TRACKING in (meta.get("finalizers") or []):
                    due[owner].append(copy.deepcopy(pod))
        judged = 0
        for uid, pods in due.items():
            run = self.runs[uid]
            before = dict(run.verdicts)
            run.sync(tracked=pods)
            now = time.monotonic()
            for pod, action in run.verdicts.items():
                if pod not in before:
                    self.judged[pod] = (now, action)
                    judged += 1
        self.rounds += 1
        return judged

    @contextmanager
    def syncing(self, period: float = 1.0) -> Iterator[JobController]:
        """Rounds beside the caller, each at most ``period`` after the last, and one more
        at the end."""
        with _beside(self.round, period, 60):
            yield self


@contextmanager
def _beside(sync: Any, period: float, patience: float) -> Iterator[None]:
    """``sync()`` on a thread every ``period`` seconds at most, then once more at the end
    (after waiting ``patience`` seconds at most for the thread's last)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period):
            sync()

    thread = threading.Thread(target=loop, name="job-controller", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(patience)
        sync()


def _failjob(pod: dict[str, Any], match: fp.Match) -> str:
    """``matchPodFailurePolicy``'s message for the FailJob rule ``match``."""
    meta = pod["metadata"]
    if match.container is not None:
        return failjob_message(
            meta["namespace"],
            meta["name"],
            match.index,
            container=match.container.name,
            code=match.container.exit_code,
        )
    return failjob_message(meta["namespace"], meta["name"], match.index, condition=match.condition)


def _uncount(failed: list[str], succeeded: list[str]):
    def change(job: dict[str, Any]) -> None:
        status = job.setdefault("status", {})
        uncounted = status.setdefault("uncountedTerminatedPods", {})
        uncounted["failed"] = [*(uncounted.get("failed") or []), *failed]
        uncounted["succeeded"] = [*(uncounted.get("succeeded") or []), *succeeded]

    return change


def _flush_uncounted(job: dict[str, Any]) -> None:
    status = job.setdefault("status", {})
    uncounted = status.pop("uncountedTerminatedPods", None) or {}
    status["failed"] = status.get("failed", 0) + len(uncounted.get("failed") or [])
    status["succeeded"] = status.get("succeeded", 0) + len(uncounted.get("succeeded") or [])


#: What each disruptor writes with ``DisruptionTarget``: the Eviction API
#: (pkg/registry/core/pod/storage/eviction.go), PodGC (``markFailedAndDeletePodWithCondition``),
#: the taint eviction controller (pkg/controller/tainteviction), the scheduler's preemption
#: (pkg/scheduler/framework/preemption/executor.go) and the kubelet's node shutdown
#: (pkg/kubelet/nodeshutdown), the device taint eviction controller
#: (pkg/controller/devicetainteviction); the cluster tier holds the first three and the last
#: to the real ones.
DISRUPTION_MESSAGES = {
    "DeletionByDeviceTaintManager": "Device Taint manager: deleting due to NoExecute taint",
    "EvictionByEvictionAPI": "Eviction API: evicting",
    "DeletionByPodGC": "PodGC: node no longer exists",
    "DeletionByTaintManager": "Taint manager: deleting due to NoExecute taint",
    "PreemptionByScheduler": "default-scheduler: preempting to accommodate a higher priority pod",
    "TerminationByKubelet": "Pod was terminated in response to imminent node shutdown.",
}


def _disruption(reason: str, at: str = T0) -> dict[str, Any]:
    return {
        "type": fp.DISRUPTION_TARGET,
        "status": "True",
        "reason": reason,
        "message": DISRUPTION_MESSAGES.get(reason, "disrupted"),
        "lastTransitionTime": at,
    }


def _stopped(status: dict[str, Any], code: int, clock: tuple[str, str] = (T0, STOPPED)) -> None:
    """Every container terminated with ``code``; the pod no longer ready, its sandbox gone
    (a terminal pod is not: ``mergePodStatus``; ``generateAPIPodStatus``)."""
    for cs in status["containerStatuses"]:
        why = "Completed" if code == 0 else "Error"
        cs["state"] = {
            "terminated": {
                "exitCode": code,
                "reason": why,
                "startedAt": clock[0],
                "finishedAt": clock[1],
            }
        }
    for c in status.get("conditions") or []:
        if c.get("type") in STOPPED_FALSE and c.get("status") != "False":
            c.update(status="False", lastTransitionTime=clock[1])
