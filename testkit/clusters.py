"""A cluster as its controllers build it, for ``retry-webhook status``: each workload admitted
by the webhook's own engine and stored with the fields the API server adds, pods as the Job
controller creates them and the kubelet fails them, a JobSet's child Jobs, Events as the
webhook's recorder writes them; and the installed CLI run against it.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.builders import FULL, P
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import scaled
from testkit.tools import ROOT
from webhook.admission import engine
from webhook.cluster.attempts import JOB_UID_LABEL
from webhook.cluster.events import Event, EventRecorder, Regarding
from webhook.cluster.facts import NoCluster
from webhook.kinds.registry import apply_defaults
from webhook.kube.jobcontroller import pod_from_template
from webhook.policy.config import Config

BIN = Path(sys.executable).parent
NS = "ml"
T0 = "2026-11-26T10:00:00Z"

POLICY = {
    **FULL,
    P + "non-spot-attempts": "3",
    P + "oom-memory-factor": "1.5",
    P + "oom-memory-limit": "8Gi",
    P + "avoid-failed-nodes": "true",
}


def at_minute(minute: int) -> str:
    return f"2026-11-26T10:{minute:02d}:00Z"


def admit(
    manifest: dict[str, Any], attempts: Any = None, config: Config | None = None
) -> dict[str, Any]:
    """What the API server stores for ``manifest`` created in ``NS``: API defaults, then
    the webhook's mutation (the real engine, with ``config``), then the system fields."""
    obj = copy.deepcopy(manifest)
    obj.setdefault("metadata", {}).setdefault("namespace", NS)
    apply_defaults(obj)
    kwargs = {"attempts": attempts} if attempts is not None else {}
    verdict, result = engine.review_object(obj, config or Config(), NS, **kwargs)
    assert verdict.allowed, verdict.message
    meta = result["metadata"]
    if not meta.get("name"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta.update(
        uid=str(uuid.uuid4()),
        resourceVersion="1",
        creationTimestamp=T0,
        generation=1,
        managedFields=[{"manager": "kubectl-client-side-apply", "operation": "Update"}],
    )
    return result


def store_job(
    api: FakeAPI, manifest: dict[str, Any], status: dict[str, Any], config: Config | None = None
) -> dict[str, Any]:
    """A Job as stored: the webhook's mutation, then ``generateSelector``
    (pkg/registry/batch/job/strategy.go): the selector and the template's labels."""
    job = admit(manifest, config=config)
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    labels = {
        JOB_UID_LABEL: uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }
    job["spec"]["selector"] = {"matchLabels": {JOB_UID_LABEL: uid}}
    template_meta = job["spec"]["template"].setdefault("metadata", {})
    template_meta.setdefault("labels", {}).update(labels)
    job["status"] = status
    api.put("jobs", job)
    return job


class Attempts(NoCluster):
    """What the webhook's attempt cache answers for these pods (the test's own count)."""

    def __init__(self, failures: int):
        self.failures = failures

    def job_failures(self, namespace: str, name: str, uid: str):
        from webhook.cluster.attempts import AttemptLookup

        return AttemptLookup(self.failures, "test")

    def job_history(self, key):
        from webhook.cluster.history import HistoryLookup

        return HistoryLookup(True)

    def stats(self):
        return {}


def owner_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The controller ownerReference a controller puts on what it makes."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_pod(
    job: dict[str, Any], failures: int, created: str, index: int | None = None
) -> dict[str, Any]:
    """A pod the Job controller creates (``pod_from_template``; an Indexed Job's of
    ``index``), admitted by the pod webhook, then stored with its generated name."""
    stored = admit(pod_from_template(job, index), Attempts(failures))
    stored["metadata"]["creationTimestamp"] = created
    return stored


def failed(pod: dict[str, Any], node: str, container: str, code: int, at: str, *, oom=False):
    """The pod as the kubelet reports it failed on ``node``."""
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    out["status"] = {
        "phase": "Failed",
        "conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": at},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": at},
        ],
        "containerStatuses": [
            {
                "name": container,
                "ready": False,
                "restartCount": 0,
                "image": "ghcr.io/example/train:1.0.0",
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "reason": "OOMKilled" if oom else "Error",
                        "startedAt": T0,
                        "finishedAt": at,
                    }
                },
            }
        ],
    }
    return out


def preempted(pod: dict[str, Any], node: str, container: str, at: str) -> dict[str, Any]:
    """Preempted by the scheduler: ``DisruptionTarget`` (reason PreemptionByScheduler),
    then SIGTERM (143)."""
    out = failed(pod, node, container, 143, at)
    out["status"]["conditions"].insert(
        0,
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "default-scheduler: preempting to accommodate a higher priority pod",
            "lastTransitionTime": at,
        },
    )
    return out


def pending(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    return out


def trainer(memory: str = "2Gi") -> dict[str, Any]:
    return {
        "name": "trainer",
        "image": "ghcr.io/example/train:1.0.0",
        "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}},
    }


def job_manifest(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "annotations": dict(annotations)},
        "spec": {
            "activeDeadlineSeconds": 86400,
            "template": {"spec": {"restartPolicy": "Never", "containers": [trainer()]}},
        },
    }


def emit(
    api_client: Any, kind: str, obj: dict[str, Any], reason: str, note: str, at: float = 0.0
) -> None:
    """An Event as the webhook's recorder writes it (the real ``EventRecorder``), at ``at``
    (Unix time; now when 0)."""
    from kubernetes import client

    clock = {"clock": lambda: at} if at else {}
    recorder = EventRecorder(client.EventsV1Api(api_client), "retry-policy-webhook-0", **clock)
    meta = obj["metadata"]
    api_version = obj["apiVersion"]
    regarding = Regarding(api_version, kind, meta["namespace"], meta["name"], meta["uid"])
    kind_of = "Warning" if reason == "RetryPolicyFailedJob" else "Normal"
    recorder.emit(Event(regarding, kind_of, reason, note))
    assert recorder.flush()
    recorder.stop()


@pytest.fixture
def cluster(tmp_path):
    api = FakeAPI().start()
    for name in ("od-1", "od-2"):
        api.put(
            "nodes",
            {
                "metadata": {"name": name, "uid": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
        )
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    yield api, kubeconfig
    api.stop()


def client_for(url: str):
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = url
    return client.ApiClient(configuration)


def run(kubeconfig: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed CLI, as a user runs it."""
    return subprocess.run(
        [str(BIN / "retry-webhook"), "status", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(kubeconfig), **(env or {})},
        timeout=scaled(60),
        check=False,
    )


def running_job(api: FakeAPI) -> tuple[dict, list[dict]]:
    """Attempt 1 OOM-killed on node-a (counted), attempt 2 preempted on spot-2 (ignored by
    the Ignore rule on DisruptionTarget), attempt 3 pending."""
    job = store_job(api, job_manifest("train", POLICY), {})
    first = failed(
        controller_pod(job, 0, at_minute(0)), "node-a", "trainer", 137, at_minute(5), oom=True
    )
    second = preempted(controller_pod(job, 1, at_minute(6)), "spot-2", "trainer", at_minute(9))
    third = pending(controller_pod(job, 1, at_minute(10)))
    pods = [first, second, third]
    for pod in pods:
        pod["metadata"]["uid"] = str(uuid.uuid4())
        api.put("pods", pod)
    # The Job controller's status: one counted failure (the Ignore'd one is not), one active.
    job["status"] = {
        "startTime": T0,
        "active": 1,
        "failed": 1,
        "ready": 0,
        "terminating": 0,
        "uncountedTerminatedPods": {},
    }
    api.put("jobs", job)
    return job, pods


def jobset_cluster(
    api: FakeAPI,
    status: dict[str, Any],
    child_status: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """examples/jobset.yaml (with ``annotations`` added) admitted, with ``status``, and its
    child Jobs of run 1."""
    manifest = yaml.safe_load((ROOT / "examples" / "jobset.yaml").read_text())
    manifest["metadata"]["annotations"].update(annotations or {})
    jobset = admit(manifest)
    jobset["status"] = status
    api.store("jobsets", jobset)
    uid, name = jobset["metadata"]["uid"], jobset["metadata"]["name"]
    jobs = []
    # JobSet's child Jobs of run 1 (``constructJob`` and ``labelAndAnnotateObject`` in
    # jobset pkg/controllers/jobset_controller.go): named <set>-<rjob>-<index>, labelled
    # and annotated, their pod templates too.
    for rjob in jobset["spec"]["replicatedJobs"]:
        child = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{name}-{rjob['name']}-0",
                "namespace": NS,
                "ownerReferences": [owner_of(jobset)],
            },
            "spec": copy.deepcopy(rjob["template"]["spec"]),
        }
        labels = {
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/jobset-uid": uid,
            "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
            "jobset.sigs.k8s.io/job-index": "0",
            "jobset.sigs.k8s.io/restart-attempt": "1",
        }
        child["metadata"]["labels"] = dict(labels)
        template = child["spec"]["template"].setdefault("metadata", {})
        template.setdefault("labels", {}).update(labels)
        jobs.append(store_job(api, child, copy.deepcopy(child_status)))
    return jobset, jobs


def tree(job: dict[str, Any], pods: list[dict[str, Any]] | None = None):
    from webhook.status.reader import KINDS, Tree

    return Tree(KINDS[0], job, jobs=[job], pods={job["metadata"]["uid"]: pods or []})
