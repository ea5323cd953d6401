"""The attempt cache (``webhook.cluster.attempts``) against the HTTP test API with the real
``kubernetes`` client: Jobs and their failed pods as the API stores them, a cache started
and synced, and its answer for a Job.
"""

from __future__ import annotations

import time
import uuid

from kubernetes import client

from testkit.servers import scaled
from webhook.cluster.attempts import JOB_UID_LABEL, JobCache
from webhook.kinds.registry import WORKLOADS


def make_job(name, failed=0, uncounted=(), ignore_rule=False, uid=None):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": uid or str(uuid.uuid4())},
        "spec": {},
        "status": {"failed": failed, "uncountedTerminatedPods": {"failed": list(uncounted)}},
    }
    if ignore_rule:
        job["spec"]["podFailurePolicy"] = {
            "rules": [
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ]
        }
    return job


def failed_pod(job, disrupted=False, exit_code=1):
    conditions = [{"type": "DisruptionTarget", "status": "True"}] if disrupted else []
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job['metadata']['name']}-{uuid.uuid4().hex[:5]}",
            "namespace": "ml",
            "uid": str(uuid.uuid4()),
            "labels": {JOB_UID_LABEL: job["metadata"]["uid"]},
            "ownerReferences": [
                {
                    "kind": "Job",
                    "name": job["metadata"]["name"],
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "status": {
            "phase": "Failed",
            "conditions": conditions,
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"exitCode": exit_code}}}
            ],
        },
    }


def cache_for(api, **kwargs):
    configuration = client.Configuration(host=api.url)
    api_client = client.ApiClient(configuration)
    kwargs.setdefault("set_records", WORKLOADS.pod_records)
    cache = JobCache(client.BatchV1Api(api_client), client.CoreV1Api(api_client), **kwargs)
    cache.start()
    assert cache.wait_synced(scaled(10))
    return cache


def eventually(check, timeout=5.0):
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def lookup(cache, job):
    meta = job["metadata"]
    return cache.job_failures(meta["namespace"], meta["name"], meta["uid"])
