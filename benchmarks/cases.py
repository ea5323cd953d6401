"""Benchmark inputs: real-shaped AdmissionReview bodies, built the way the API server sends
them (defaulted objects, uid, managedFields and a last-applied record like kubectl apply)."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from webhook.kinds import registry as defaults

P = "retry-policy.dev/"

ANNOTATED = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
    P + "backoff-limit": "3",
    P + "ignore-disruptions": "true",
    P + "non-spot-attempts": "1",
}


def _container(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": f"ghcr.io/example/{name}:1.4.2",
        "command": ["python", "-m", name],
        "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(8)],
        "resources": {
            "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"},
        },
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }


def _pod_spec() -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "containers": [_container("trainer"), _container("sidecar")],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [
            {
                "key": "cloud.google.com/gke-spot",
                "operator": "Equal",
                "value": "true",
                "effect": "NoSchedule",
            }
        ],
    }


def job(
    annotations: dict[str, str] | None = None, name: str = "train", run: int | None = None
) -> dict[str, Any]:
    """A Job as ``kubectl apply`` sends it; ``run`` makes it one run of a pipeline: its
    own image tag, arguments, run id (label and env var) and memory request."""
    manifest: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "labels": {"team": "ml"}},
        "spec": {"template": {"metadata": {"labels": {"app": "train"}}, "spec": _pod_spec()}},
    }
    if run is not None:
        manifest["metadata"]["labels"]["pipeline.example/run"] = f"run-{run:05d}"
        trainer = manifest["spec"]["template"]["spec"]["containers"][0]
        trainer["image"] = f"ghcr.io/example/trainer:2026.11.{run}"
        trainer["args"] = ["--run", f"run-{run:05d}", "--epochs", str(10 + run % 7)]
        trainer["env"][0]["value"] = f"run-{run:05d}"
        trainer["resources"]["requests"]["memory"] = f"{16 + run % 16}Gi"
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    obj = copy.deepcopy(manifest)
    obj["metadata"].setdefault("annotations", {})[
        "kubectl.kubernetes.io/last-applied-configuration"
    ] = json.dumps(manifest)
    obj["metadata"]["uid"] = str(uuid.uuid4())
    obj["metadata"]["creationTimestamp"] = "2026-11-22T00:00:00Z"
    obj["metadata"]["managedFields"] = [
        {
            "manager": "kubectl-client-side-apply",
            "operation": "Update",
            "apiVersion": "batch/v1",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}},
        }
    ]
    defaults.apply_defaults(obj)
    return obj


def pod_last_attempt(padding_bytes: int = 0, index_failures: int | None = None) -> dict[str, Any]:
    """A pod on the last of its Job's 4 attempts: from our ``attempt`` annotation (an
    orchestrator that knows), or with ``index_failures`` from an Indexed Job's per-index
    failure count (then the view keeps the owning Job's identity)."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-x7k2p",
            "namespace": "ml",
            "uid": str(uuid.uuid4()),
            "labels": {"batch.kubernetes.io/job-name": "train", "app": "train"},
            "annotations": {
                P + "backoff-limit": "3",
                P + "non-spot-attempts": "1",
                P + "attempt": "3",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": "u",
                    "controller": True,
                }
            ],
        },
        "spec": _pod_spec(),
    }
    if index_failures is not None:
        annotations = obj["metadata"]["annotations"]
        del annotations[P + "attempt"]
        annotations["batch.kubernetes.io/job-completion-index"] = "0"
        annotations["batch.kubernetes.io/job-index-failure-count"] = str(index_failures)
    if padding_bytes:
        # Large pods in practice: many env vars (configs injected as env), big commands.
        per = 1000
        count = padding_bytes // (per + 40)
        obj["spec"]["containers"][0]["env"] += [
            {"name": f"CONFIG_{i:05d}", "value": "x" * per} for i in range(count)
        ]
    defaults.apply_defaults(obj)
    return obj


def jobset(replicated: int = 4) -> dict[str, Any] | None:
    """A JobSet, when its mutator is registered (it is added with the workloads issue)."""
    from webhook.kinds.registry import lookup

    if lookup("jobset.x-k8s.io", "v1alpha2", "JobSet") is None:
        return None
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "pretrain",
            "namespace": "ml",
            "uid": str(uuid.uuid4()),
            "annotations": dict(ANNOTATED),
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": f"workers-{i}",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 8,
                            "completions": 8,
                            "backoffLimit": 0,
                            "template": {"spec": _pod_spec()},
                        }
                    },
                }
                for i in range(replicated)
            ]
        },
    }


def review(obj: dict[str, Any]) -> bytes:
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = obj["kind"]
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": kind.lower() + "s"},
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }
    return json.dumps(body).encode()


def all_cases() -> dict[str, bytes]:
    """One body per case (the first of its stream)."""
    return {name: bodies[0] for name, bodies in streams(1).items()}


def streams(count: int = 1000) -> dict[str, list[bytes]]:
    """Each case as a stream of ``count`` reviews, the way they reach a cluster's webhook.

    - ``job-plain``: Jobs without annotations (the common case).
    - ``job-annotated``: every Job new: ``kubectl apply`` of one manifest, each run under
      its own name, image tag, arguments, run id and memory request (a pipeline's runs):
      every body differs, but not in what the policy reads (``webhook.kinds.view``), so the
      memo answers all but the first.
    - ``job-annotated-distinct``: every Job with a policy of its own (its own
      ``backoff-limit``, 1 to 1000): no two views agree, the full policy runs for each.
      The worst case: real clusters repeat a handful of policies.
    - ``pod-last-attempt``: the pods of one Job on its last attempt (a parallel Job
      creates N of them, differing in name and uid): one policy run, then remembered.
    - ``pod-last-attempt-new``: every pod from a different Job, its attempt annotated (an
      orchestrator's pods): the owner is not in the view, so the memo answers.
    - ``pod-last-attempt-distinct``: every pod from a different Indexed Job, its attempt
      from the per-index failure count: the owning Job is in the view (the webhook must
      know whose pod it is), the full run for each.
    - ``pod-1MiB``: a pod with 1 MiB of config in env var values, measured with the memo
      off (``benchmarks.compute``): decoding, the view and the full policy run each time.
    - ``jobset-4``: every JobSet new (each with its own run label; JobSets have no view).
    """

    def distinct(make, vary) -> list[bytes]:
        return [review(vary(make(), i)) for i in range(count)]

    def rename(obj: dict[str, Any], i: int) -> dict[str, Any]:
        obj["metadata"]["name"] = f"{obj['metadata']['name']}-{i:05d}"
        obj["metadata"]["uid"] = str(uuid.uuid4())
        return obj

    def pod_of(job_uid: str):
        def vary(obj: dict[str, Any], i: int) -> dict[str, Any]:
            obj = rename(obj, i)
            obj["metadata"]["ownerReferences"][0]["uid"] = job_uid or str(uuid.uuid4())
            obj["metadata"]["ownerReferences"][0]["name"] = f"train-{i:05d}"
            return obj

        return vary

    def run_label(obj: dict[str, Any], i: int) -> dict[str, Any]:
        obj = rename(obj, i)
        obj["metadata"].setdefault("labels", {})["pipeline.example/run"] = f"run-{i:05d}"
        return obj

    def own_policy(i: int) -> dict[str, str]:
        return {**ANNOTATED, P + "backoff-limit": str(1 + i % 1000)}

    result = {
        "job-plain": [review(job(None, name=f"train-{i:05d}")) for i in range(count)],
        "job-annotated": [
            review(job(ANNOTATED, name=f"train-{i:05d}", run=i)) for i in range(count)
        ],
        "job-annotated-distinct": [
            review(job(own_policy(i), name=f"train-{i:05d}", run=i)) for i in range(count)
        ],
        "pod-last-attempt": distinct(pod_last_attempt, pod_of(str(uuid.uuid4()))),
        "pod-last-attempt-new": distinct(pod_last_attempt, pod_of("")),
        "pod-last-attempt-distinct": distinct(
            lambda: pod_last_attempt(index_failures=3), pod_of("")
        ),
        "pod-1MiB": [review(pod_last_attempt(padding_bytes=1024 * 1024))],  # memo off
    }
    if jobset() is not None:
        result["jobset-4"] = distinct(jobset, run_label)
    return result
