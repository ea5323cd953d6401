"""Failure-aware admission without a server: the attempt cache's answers (counted failures,
the real failure history, LimitRanges, Nodes), a Job's pod as its CREATE review carries
it, and the containers it runs.
"""

from __future__ import annotations

from typing import Any

from testkit.builders import P, job_owner, pod, stored
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.cluster.history import FailureHistory
from webhook.cluster.limits import LimitLookup
from webhook.cluster.nodes import NodeAnswer
from webhook.kube.jobcontroller import index_pod
from webhook.kube.limitrange import memory_limits
from webhook.kube.scheduling import fits, node_of

FACTOR = {P + "oom-memory-factor": "1.5", P + "oom-memory-limit": "8Gi"}
AVOID = {P + "avoid-failed-nodes": "true"}


def trainer(memory: str = "2Gi", limit: str | None = "2Gi", name: str = "trainer") -> dict:
    resources: dict = {"requests": {"cpu": "1", "memory": memory}}
    if limit is not None:
        resources["limits"] = {"memory": limit}
    return {"name": name, "image": "ghcr.io/example/train:1.0.0", "resources": resources}


def sidecar() -> dict:
    return {
        "name": "logger",
        "image": "busybox:1.36",
        "resources": {"requests": {"memory": "64Mi"}},
    }


def node(name, labels=None, taints=None, ready=True, unschedulable=False):
    """A Node object as the API returns it (the parts placement reads)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Source(NoCluster):
    """The attempt cache's answers: a Job's counted failures (fixed here), the failure
    history (the real ``FailureHistory``, fed failed pods by ``fail``), the namespace's
    LimitRanges (the real bounds of ``limit_ranges``' objects; unknown when ``None``) and
    whether a node remains (the real ``fits`` on ``nodes``; unknown when ``None``)."""

    def __init__(
        self, failures: int | None = 0, limit_ranges: list | None = (), nodes: Any = "spare"
    ):
        self.failures = failures
        self.history = FailureHistory()
        self.ranges = limit_ranges
        #: Node objects (``None``: unknown); by default two Ready nodes nobody failed on.
        self.nodes = [node("spare-1"), node("spare-2")] if nodes == "spare" else nodes

    def job_failures(self, namespace, name, uid):
        if self.failures is None:
            return AttemptLookup(None, "none", "Job unreadable")
        return AttemptLookup(self.failures, "Job status (cache)")

    def job_history(self, key):
        return self.history.fetch(key)

    def limit_ranges(self, namespace):
        if self.ranges is None:
            return LimitLookup(False, reason="LimitRanges unreadable: HTTP 403")
        return LimitLookup(True, memory_limits(self.ranges))

    def placement(self, question):
        if self.nodes is None:
            return NodeAnswer(False, reason="Nodes unreadable: HTTP 403")
        return NodeAnswer(True, any(fits(node_of(n), question) for n in self.nodes))

    def stats(self):
        return {}

    def fail(self, admitted, node="node-a", oom=("trainer",), job_uid="job-1", **status):
        """``admitted`` (a pod as the webhook let it through) failed on ``node``: its
        containers in ``oom`` OOM-killed, the others exited 0; ``status`` is added to
        its status (conditions, a reason) and ``deleting`` sets a deletionTimestamp."""
        failed = stored(admitted)  # as the watch delivers it: named, with a UID
        failed["spec"]["nodeName"] = node
        if status.pop("deleting", False):
            failed["metadata"]["deletionTimestamp"] = "2026-11-22T00:00:00Z"
        failed["status"] = {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": c["name"],
                    "state": {
                        "terminated": {
                            "exitCode": 137 if c["name"] in oom else 0,
                            "reason": "OOMKilled" if c["name"] in oom else "Completed",
                        }
                    },
                }
                for c in failed["spec"]["containers"]
            ],
            **status,
        }
        assert self.history.record(failed, job_uid, True)
        self.failures = (self.failures or 0) + 1
        return failed


def job_pod(
    annotations=None,
    containers=None,
    job_uid="job-1",
    spec=None,
    meta=None,
    index: int | None = None,
    index_failures: int | None = None,
):
    """A Job's pod as its CREATE review carries it: ``generateName``, no name or uid; with
    ``index``, an Indexed Job's pod of that index (``index_pod``)."""
    made = pod(
        {**FACTOR, **AVOID} if annotations is None else annotations,
        owner=job_owner("train", job_uid),
        spec={"containers": containers or [trainer(), sidecar()], **(spec or {})},
    )
    for key in ("name", "uid", "creationTimestamp"):
        made["metadata"].pop(key, None)
    made["metadata"]["generateName"] = "train-"
    for key, value in (meta or {}).items():
        made["metadata"].setdefault(key, {}).update(value)
    if index is not None:
        index_pod(made, "train", index, index_failures)
    return made
