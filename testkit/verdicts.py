"""Pods as the kubelet leaves them when they fail or never start, for the failure verdicts'
tests (``webhook.cluster.classify``, ``webhook.controller.verdicts``): a terminated
container's state (``exitCode``, ``reason``, ``message``: the termination message,
``startedAt``, ``finishedAt``), a waiting one's (``reason``, ``message``), and the
kubelet's conditions (``generateAPIPodStatus``; ``testkit.jobsim.KUBELET_CONDITIONS``)."""

from __future__ import annotations

import uuid
from typing import Any

from testkit.jobsim import STOPPED, T0

#: What the container runtime reports for an exit code (``exitReason`` of the played
#: kubelet: ``testkit.controlplane.podstatus``).
REASONS = {0: "Completed", 137: "OOMKilled"}


def failed_pod(
    name: str,
    codes: dict[str, int] | None = None,
    reasons: dict[str, str] | None = None,
    messages: dict[str, str] | None = None,
    node: str = "node-a",
    namespace: str = "ml",
) -> dict[str, Any]:
    """A ``Failed`` pod whose containers exited with ``codes`` (default: main exited 1)."""
    codes = codes if codes is not None else {"main": 1}
    statuses = []
    for container, code in codes.items():
        terminated = {
            "exitCode": code,
            "reason": (reasons or {}).get(container) or REASONS.get(code, "Error"),
            "startedAt": T0,
            "finishedAt": STOPPED,
        }
        if messages and container in messages:
            terminated["message"] = messages[container]
        statuses.append(
            {
                "name": container,
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": c, "image": "registry.example/x:1"} for c in codes],
        },
        "status": {
            "phase": "Failed",
            "startTime": T0,
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodFailed"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": statuses,
        },
    }


def waiting_pod(
    name: str, reason: str, message: str = "", node: str | None = "node-a"
) -> dict[str, Any]:
    """A ``Pending`` pod whose one container waits with ``reason`` (the kubelet accepted
    it, on ``node``), or, without a node, one the scheduler has not placed."""
    pod = failed_pod(name, node=node or "")
    if node is None:
        pod["spec"].pop("nodeName")
        pod["status"] = {"phase": "Pending"}
        return pod
    pod["status"]["phase"] = "Pending"
    pod["status"]["containerStatuses"] = [
        {
            "name": "main",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}},
        }
    ]
    return pod
