"""Pods a disruptor deletes: the DELETE review the API server sends (its ``oldObject`` the
stored pod, the deleter's ``userInfo``, DeleteOptions), its verdict, and the marker
(``webhook.cluster.deletions``) against the HTTP test API.
"""

from __future__ import annotations

import json
import time
import uuid

from kubernetes import client, config

from testkit.fakeapi import FakeAPI, write_kubeconfig
from webhook.admission import engine
from webhook.admission import review as codec
from webhook.cluster.deletions import DeletionMarker
from webhook.cluster.events import EventRecorder
from webhook.kinds.registry import WORKLOADS
from webhook.policy.config import Config

KARPENTER = "system:serviceaccount:kube-system:karpenter"


def deletion(pod: dict, user: str = KARPENTER, grace: int | None = None, dry_run=False) -> dict:
    """The DELETE AdmissionReview the API server sends for ``pod``."""
    options: dict = {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"}
    if grace is not None:
        options["gracePeriodSeconds"] = grace
    meta = pod["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta["name"],
            "namespace": meta["namespace"],
            "operation": "DELETE",
            "userInfo": {
                "username": user,
                "uid": str(uuid.uuid4()),
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": None,
            "oldObject": pod,
            "dryRun": dry_run,
            "options": options,
        },
    }


def verdict_of(review: dict, cfg: Config | None = None):
    return engine.validate(codec.decode(json.dumps(review)), cfg or Config())


def marker(fake: FakeAPI, tmp_path) -> DeletionMarker:
    path = write_kubeconfig(tmp_path / f"kubeconfig-{time.monotonic_ns()}", fake.url)
    api_client = config.new_client_from_config(str(path))
    events = EventRecorder(client.EventsV1Api(api_client), "test")
    return DeletionMarker(client.CoreV1Api(api_client), events, WORKLOADS, wait=1.0)
