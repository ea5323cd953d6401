"""The Job controller's and the kubelet's part, played against the HTTP test API
(``tests/fakeapi.py``) for the controller's tests: pods made from a Job's template as the
Job controller makes them, the conditions and states the scheduler, the Eviction API and
the kubelet give them, and the Job controller's judgement of a failed pod.

What is reproduced, from upstream:

- a Job's pod carries the template's labels and annotations, ``batch.kubernetes.io/
  controller-uid`` and ``job-name`` labels, the completion index (Indexed Jobs) and, with
  ``backoffLimitPerIndex``, ``job-index-failure-count``; its controller owner reference and
  the ``batch.kubernetes.io/job-tracking`` finalizer (``getPodsForJob``,
  ``addCompletionIndexAnnotation``, ``addIndexFailureCountAnnotation`` in
  pkg/controller/job);
- preemption and the Eviction API add ``DisruptionTarget=True`` (reasons
  ``PreemptionByScheduler``, ``EvictionByEvictionAPI``) before the pod is deleted, while it
  runs; the kubelet then stops its containers (143) and sets phase ``Failed``;
- the Job controller judges a failed pod with its podFailurePolicy (the one evaluation,
  ``webhook.kube.failurepolicy.evaluate``, as ``matchPodFailurePolicy``) once it is
  ``Failed`` (``isPodFailed`` with a podFailurePolicy), reading its conditions as they are
  then, counts every failure but an Ignore rule's, fails the Job past ``backoffLimit``
  (``BackoffLimitExceeded``) or on FailJob, and removes its finalizer.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

from conftest import job_owner
from fakeapi import JOB_TRACKING, FakeAPI

from webhook.kube import failurepolicy as fp

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
T0 = "2026-11-26T10:00:00Z"


@dataclass
class JobRun:
    """One stored Job, its pods, and the Job controller's count of its failures."""

    api: FakeAPI
    job: dict[str, Any]
    counted: int = 0
    ended: str = ""
    judged: list[str] = field(default_factory=list)

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

    def new_pod(self, index: int | None = None, index_failures: int | None = None) -> dict:
        """A running pod made from the template, as the Job controller makes it."""
        template = self.job["spec"]["template"]
        meta = template.get("metadata") or {}
        uid = str(uuid.uuid4())
        labels = {**meta.get("labels", {}), JOB_UID_LABEL: self.uid, "job-name": self.name}
        annotations = dict(meta.get("annotations") or {})
        if index is not None:
            annotations[COMPLETION_INDEX] = str(index)
            if index_failures is not None:
                annotations[INDEX_FAILURE_COUNT] = str(index_failures)
        spec = copy.deepcopy(template["spec"])
        spec["nodeName"] = f"node-{uid[:4]}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{self.name}-{uid[:5]}",
                "generateName": f"{self.name}-",
                "namespace": self.job["metadata"]["namespace"],
                "uid": uid,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [job_owner(self.name, self.uid)],
                "finalizers": [JOB_TRACKING],
            },
            "spec": spec,
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {"name": c["name"], "restartCount": 0, "state": {"running": {"startedAt": T0}}}
                    for c in spec["containers"]
                ],
            },
        }
        self.api.put("pods", pod)
        return pod

    def current(self, pod: dict[str, Any]) -> dict[str, Any]:
        found = self.api.pod(pod["metadata"]["uid"])
        assert found is not None, "the pod is gone"
        return found

    def disrupt(
        self, pod: dict[str, Any], reason: str = "PreemptionByScheduler", delete: bool = True
    ) -> dict:
        """Preemption or eviction: ``DisruptionTarget=True`` on the running pod, then its
        deletion (``addConditionAndDeletePod``; the preemptor's ``PrepareCandidate``). The
        kubelet's node-pressure eviction (``TerminationByKubelet``) deletes nothing."""
        pod = self.current(pod)
        pod["status"].setdefault("conditions", []).append(
            {
                "type": fp.DISRUPTION_TARGET,
                "status": "True",
                "reason": reason,
                "message": "disrupted",
                "lastTransitionTime": T0,
            }
        )
        self.api.put("pods", pod)
        if delete:
            with self.api.lock:
                self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], None)
        return self.current(pod)

    def restart(self, pod: dict[str, Any], count: int) -> dict[str, Any]:
        """The kubelet restarted its main container in place ``count`` times so far."""
        pod = self.current(pod)
        pod["status"]["containerStatuses"][0]["restartCount"] = count
        self.api.put("pods", pod)
        return pod

    def fail(self, pod: dict[str, Any], code: int = 143) -> dict[str, Any]:
        """The kubelet: the containers stopped, the pod ``Failed``."""
        pod = self.current(pod)
        status = pod["status"]
        status["phase"] = "Failed"
        for cs in status["containerStatuses"]:
            cs["state"] = {"terminated": {"exitCode": code, "reason": "Error", "finishedAt": T0}}
        self.api.put("pods", pod)
        return pod

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
