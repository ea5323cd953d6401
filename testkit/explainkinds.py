"""What the tests of each kind's explainer share (``tests/kinds/<kind>/test_explain.py``,
``tests/explain/test_kinds.py``): objects as users write them, explained, and placed by
the real pod webhook."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import yaml

from testkit.builders import P, job_owner, pod, review
from testkit.explain import explained
from testkit.tools import ROOT
from webhook import cli
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.policy.config import Config

BIN = Path(sys.executable).parent / "retry-webhook"
EXAMPLES = ROOT / "examples"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


def pod_spec(*names, restart_policy="Never"):
    spec = {"containers": [{"name": n, "image": "ghcr.io/example/train:1.0.0"} for n in names]}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return spec


def manifest(api_version, kind, spec, annotations=None, name="train"):
    """An object as a user writes it (explain prepares it as the API server would)."""
    obj = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": "ml"},
        "spec": copy.deepcopy(spec),
    }
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    return obj


def items(obj, config=None, events=None):
    result = explained(obj, config, events)
    assert isinstance(result, list), result
    return result


def by_part(obj, config=None, events=None):
    return {item.part: item for item in items(obj, config, events)}


def example(name):
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def reviewed(obj, config=None):
    prepared, _ = cli.prepare(obj, None)
    return engine.review(prepared, config or Config())


def placed_by_pod_webhook(template, labels=None, annotations=None):
    """Whether the real pod webhook sends a pod made from ``template`` to non-spot nodes."""
    meta = dict((template.get("metadata") or {}).get("annotations") or {})
    obj = pod(meta | (annotations or {}), owner=job_owner(), spec=copy.deepcopy(template["spec"]))
    if labels:
        obj["metadata"]["labels"] = dict(labels)
    verdict = engine.mutate(admission.decode(json.dumps(review(obj))), Config())
    assert verdict.allowed, verdict.message
    return any(op["path"].startswith("/spec/affinity") for op in verdict.patch)


def cronjob(annotations=None, *, template_annotations=None, **job_spec):
    template = {"spec": {**job_spec, "template": {"spec": pod_spec("eval")}}}
    if template_annotations:
        template["metadata"] = {"annotations": dict(template_annotations)}
    spec = {"schedule": "0 3 * * *", "jobTemplate": template}
    return manifest("batch/v1", "CronJob", spec, annotations, name="nightly")


def replicated(name, replicas=1, restart_policy="Never", containers=("trainer",), **job_spec):
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": 1,
                "completions": 1,
                **job_spec,
                "template": {"spec": pod_spec(*containers, restart_policy=restart_policy)},
            }
        },
    }


def jobset(annotations=None, *, jobs=None, failure_policy=None, name="pretrain"):
    spec = {"replicatedJobs": jobs or [replicated("leader"), replicated("workers", 4)]}
    if failure_policy is not None:
        spec["failurePolicy"] = failure_policy
    return manifest("jobset.x-k8s.io/v1alpha2", "JobSet", spec, annotations, name=name)


def jobset_sim(obj, events, part="replicatedJob leader", config=None):
    return by_part(obj, config, events)[part].simulation


def rayjob(annotations=None, **spec):
    cluster = {
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {"spec": pod_spec("ray-head", restart_policy=None)},
        },
        "workerGroupSpecs": [
            {
                "groupName": "cpu",
                "minReplicas": 1,
                "maxReplicas": 2,
                "rayStartParams": {},
                "template": {"spec": pod_spec("ray-worker", restart_policy=None)},
            }
        ],
    }
    body = {"entrypoint": "python tune.py", "rayClusterSpec": cluster, **spec}
    return manifest("ray.io/v1", "RayJob", body, annotations, name="tune")


def pytorchjob(annotations=None, *, restart_policy=None, containers=("pytorch",), **spec):
    replicas = {}
    for rtype, count in (("Master", 1), ("Worker", 3)):
        replicas[rtype] = {
            "replicas": count,
            "template": {"spec": pod_spec(*containers, restart_policy=None)},
        }
        if restart_policy:
            replicas[rtype]["restartPolicy"] = restart_policy
    body = {"pytorchReplicaSpecs": replicas, **spec}
    return manifest("kubeflow.org/v1", "PyTorchJob", body, annotations, name="finetune")


POLICY = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
}
