"""Each workload's failure record as the controller's recorder writes it: Jobs and JobSet
children as the API stores them, pods failed as the kubelet reports them, the recorder
run in a thread, and another writer that makes its next PATCHes conflict.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid

from kubernetes import client, config

from testkit.builders import P, job_owner
from testkit.fakeapi import FakeAPI, write_kubeconfig
from webhook.cluster.attempts import JOB_UID_LABEL
from webhook.controller.recorder import HistoryRecorder

POLICY = {
    P + "oom-memory-factor": "1.5",
    P + "oom-memory-limit": "8Gi",
    P + "avoid-failed-nodes": "true",
}
T0 = "2026-11-26T10:00:00Z"


def trainer(memory: str = "2Gi") -> dict:
    return {
        "name": "trainer",
        "image": "ghcr.io/example/train:1.0.0",
        "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}},
    }


def failed_pod(
    owner_uid="job-1",
    owner_name="train",
    node="node-a",
    oom=True,
    memory="2Gi",
    at=T0,
    labels=None,
    annotations=None,
    conditions=(),
) -> dict:
    """A failed pod of a Job as the watch delivers it (named, with a UID; the Job
    controller's labels and ownerReference; the kubelet's terminated state)."""
    uid = str(uuid.uuid4())
    state = {
        "exitCode": 137 if oom else 42,
        "reason": "OOMKilled" if oom else "Error",
        "finishedAt": at,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{owner_name}-{uid[:5]}",
            "generateName": f"{owner_name}-",
            "namespace": "ml",
            "uid": uid,
            "labels": {JOB_UID_LABEL: owner_uid, **(labels or {})},
            "annotations": {**POLICY, **(annotations or {})},
            "ownerReferences": [job_owner(owner_name, owner_uid)],
        },
        "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [trainer(memory)]},
        "status": {
            "phase": "Failed",
            "conditions": list(conditions),
            "containerStatuses": [{"name": "trainer", "state": {"terminated": state}}],
        },
    }


def api_client(fake: FakeAPI, tmp_path) -> client.ApiClient:
    path = write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}", fake.url)
    return config.new_client_from_config(str(path))


def a_job(name="train", rules=None) -> dict:
    """A Job as the API stores it, whose template carries the failure-aware keys (as the
    webhook copied them at the Job's admission)."""
    spec = {"template": {"metadata": {"annotations": dict(POLICY)}, "spec": {}}}
    if rules:
        spec["podFailurePolicy"] = {"rules": rules}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": spec,
        "status": {},
    }


def stored_job(fake: FakeAPI, uid: str) -> dict:
    with fake.lock:
        return copy.deepcopy(fake.objects["jobs"][uid])


def running(recorder: HistoryRecorder):
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def concurrent_writer(fake: FakeAPI, uid: str, times: int) -> list[str]:
    """Another writer that changes the Job ``uid`` (a label ``team``) right before each of
    the next ``times`` PATCHes of Jobs: each of those is then 409 Conflict."""
    touched: list[str] = []

    def change(method, resource, name):
        if resource == "jobs" and method == "PATCH" and len(touched) < times:
            touched.append(name)
            with fake.lock:
                job = fake.objects["jobs"][uid]
                job["metadata"].setdefault("labels", {})["team"] = f"t{len(touched)}"
                fake.version += 1
                job["metadata"]["resourceVersion"] = str(fake.version)

    fake.before_write = change
    return touched


JOBSET_LABELS = {
    "jobset.sigs.k8s.io/jobset-name": "pretrain",
    "jobset.sigs.k8s.io/jobset-uid": "uid-pretrain",
    "jobset.sigs.k8s.io/replicatedjob-name": "workers",
    "jobset.sigs.k8s.io/job-index": "0",
}


def a_jobset() -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "pretrain", "namespace": "ml", "uid": "uid-pretrain"},
        "spec": {"replicatedJobs": []},
    }


def child_job(run: int) -> dict:
    job = a_job(f"pretrain-workers-0-r{run}")
    job["metadata"]["labels"] = {**JOBSET_LABELS, "jobset.sigs.k8s.io/restart-attempt": str(run)}
    return job


def relisted(api, since: int) -> bool:
    """Whether pods were listed again since request ``since`` and watched after that: an
    informer applies what it lists before it watches."""
    watches = [("watch" in q) for p, q in list(api.requests)[since:] if p.endswith("/pods")]
    return False in watches and True in watches[watches.index(False) :]
