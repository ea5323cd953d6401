"""Retry-delay gates end to end: pods a queue and the webhook hold back, failed and counted
as the Job controller counts them, admitted until the webhook's caches have seen the
failure, and the controller's ``GateReleaser`` run in a thread.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from pathlib import Path

from kubernetes import client, config

from testkit.builders import P, decode_patch, job_owner, pod, review, stored
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import scaled
from webhook.cluster.attempts import JOB_UID_LABEL
from webhook.controller.gates import GateReleaser
from webhook.kube import gates
from webhook.policy.grammar import format_time

QUOTA = {"name": "example.com/quota"}


def core(fake: FakeAPI, tmp_path: Path) -> client.CoreV1Api:
    path = write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}", fake.url)
    return client.CoreV1Api(config.new_client_from_config(str(path)))


def stored_pod(fake: FakeAPI, uid: str) -> dict:
    with fake.lock:
        return copy.deepcopy(fake.objects["pods"][uid])


def gate_names(obj: dict) -> list[str]:
    return [g["name"] for g in obj["spec"].get("schedulingGates") or []]


class Running:
    """A ``GateReleaser`` on a thread, as the Manager runs it while leading."""

    def __init__(self, releaser: GateReleaser):
        self.releaser = releaser
        self.stop = threading.Event()
        self.thread = threading.Thread(target=releaser.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> GateReleaser:
        self.thread.start()
        return self.releaser

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(scaled(5))


DELAY = {P + "retry-delay": "2s", P + "attempt-env": "true", P + "backoff-limit": "3"}


def a_job(name: str) -> dict:
    uid = f"uid-{name}-{uuid.uuid4().hex[:6]}"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"backoffLimit": 3, "template": {"metadata": {"annotations": dict(DELAY)}}},
        "status": {"failed": 0},
    }


def new_pod(job: dict) -> dict:
    """A pod of ``job`` as its CREATE review carries it (``generateName``, no name or
    uid), behind a queue's gate of its own."""
    meta = job["metadata"]
    made = pod(
        dict(DELAY),
        namespace="ml",
        owner=job_owner(meta["name"], meta["uid"]),
        spec={"schedulingGates": [dict(QUOTA)]},
    )
    made["metadata"]["labels"] = {JOB_UID_LABEL: meta["uid"]}
    return made


def fail(fake: FakeAPI, job: dict, made: dict, at: float, code: int = 2) -> None:
    """``made`` ran and failed at ``at``; the Job controller counted it."""
    failed = stored(made)
    failed["spec"].pop("schedulingGates", None)
    failed["status"] = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "main",
                "state": {"terminated": {"exitCode": code, "finishedAt": format_time(at)}},
            }
        ],
    }
    fake.put("pods", failed)
    job["status"]["failed"] += 1
    fake.put("jobs", job)


def admit_gated(server, made: dict, timeout: float = 15.0) -> tuple[dict, dict, list]:
    """Admit ``made`` until the webhook's caches have seen the failure (it is gated)."""
    deadline = time.monotonic() + timeout
    while True:
        response = server.review("/mutate", review(made))["response"]
        assert response["allowed"] is True, response
        patch = decode_patch({"response": response})
        if any(op["path"].startswith("/spec/schedulingGates") for op in patch):
            return response, made, patch
        assert time.monotonic() < deadline, response
        time.sleep(0.1)


def gated_pod(name: str, not_before: float, namespace: str = "ml") -> dict:
    """A pod as stored after the webhook held it back (``webhook.kube.gates``), behind
    another controller's gate."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": {gates.GATED_LABEL: gates.GATED_VALUE},
            "annotations": {gates.NOT_BEFORE: format_time(not_before)},
        },
        "spec": {
            "schedulingGates": [{"name": "example.com/quota"}, {"name": gates.GATE}],
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
        "status": {"phase": "Pending"},
    }
