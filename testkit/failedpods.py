"""A Job's pods failed on nodes (OOM-killed or not) as the HTTP test API stores them, and
admitted through the real server until its caches have seen those failures.
"""

from __future__ import annotations

import copy
import time
import uuid

from testkit.builders import P, apply, decode_patch, job_owner, pod, review
from testkit.fakeapi import FakeAPI
from webhook.cluster.attempts import JOB_UID_LABEL
from webhook.kube.jobcontroller import index_pod

POLICY = {
    P + "oom-memory-factor": "1.5",
    P + "oom-memory-limit": "8Gi",
    P + "avoid-failed-nodes": "true",
}


def trainer() -> dict:
    return {
        "name": "trainer",
        "image": "ghcr.io/example/train:1.0.0",
        "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "2Gi"}},
    }


def a_job(name: str, failed: int = 0, **spec) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}-{uuid.uuid4().hex[:6]}"},
        "spec": {"template": {"metadata": {"annotations": dict(POLICY)}}, **spec},
        "status": {"failed": failed},
    }


def new_pod(
    job: dict,
    annotations: dict | None = None,
    spec: dict | None = None,
    *,
    index: int | None = None,
    index_failures: int | None = None,
) -> dict:
    """A pod of ``job`` as its CREATE review carries it (``generateName``, no name or uid);
    with ``index``, an Indexed Job's pod of that index (``index_pod``)."""
    meta = job["metadata"]
    made = pod(
        {**POLICY, **(annotations or {})},
        namespace=meta["namespace"],
        owner=job_owner(meta["name"], meta["uid"]),
        spec={"containers": [trainer()], **(spec or {})},
    )
    for key in ("name", "uid", "creationTimestamp"):
        made["metadata"].pop(key, None)
    made["metadata"]["generateName"] = meta["name"] + "-"
    made["metadata"]["labels"] = {JOB_UID_LABEL: meta["uid"]}
    if index is not None:
        index_pod(made, meta["name"], index, index_failures)
    return made


def failed(made: dict, node: str, oom: bool = True) -> dict:
    out = copy.deepcopy(made)
    out["metadata"]["uid"] = str(uuid.uuid4())
    out["metadata"]["name"] = out["metadata"]["generateName"] + out["metadata"]["uid"][:5]
    out["spec"]["nodeName"] = node
    reason = "OOMKilled" if oom else "Error"
    out["status"] = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": reason}}}
        ],
    }
    return out


def admit(server, obj: dict) -> tuple[dict, dict]:
    response = server.review("/mutate", review(obj))["response"]
    assert response["allowed"] is True, response
    out = apply(obj, decode_patch({"response": response})) if "patch" in response else obj
    return response, out


def admitted_until(server, obj: dict, check, timeout: float = 15.0) -> tuple[dict, dict]:
    """Admit ``obj`` until the answer passes ``check`` (the watch delivers events a
    moment after they happen)."""
    deadline = time.monotonic() + timeout
    while True:
        response, out = admit(server, obj)
        if check(out) or time.monotonic() > deadline:
            return response, out
        time.sleep(0.1)


def with_spare_nodes(api: FakeAPI) -> FakeAPI:
    """Two Ready nodes nobody fails on: a pod kept off failed nodes has somewhere to go."""
    for name in ("spare-1", "spare-2"):
        api.put("nodes", {**gpu_node(name), "metadata": {"name": name, "uid": name}})
    return api


def gpu_node(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"node-{name}", "labels": {"pool": "gpu"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
