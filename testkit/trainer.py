"""Kubeflow Trainer v2: a TrainJob as admission sees it, the (Cluster)TrainingRuntimes it
names (built, or as a Trainer release ships them), and a TrainJob admitted against them.
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import yaml

from testkit.builders import P, apply, review
from testkit.tools import ROOT
from testkit.workloads import crd_defaults, crd_schema
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster.runtimes import NoRuntimes
from webhook.kinds.trainjob.mutate import MANAGER
from webhook.kube.intent import LAST_APPLIED
from webhook.policy.config import Config

TRAINER = "trainer.kubeflow.org/v1alpha1"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR = {ANCESTOR_LABEL: "trainer"}


def runtime(
    *,
    kind: str = "ClusterTrainingRuntime",
    name: str = "torch-distributed",
    failure_policy: dict[str, Any] | None = None,
    job_spec: dict[str, Any] | None = None,
    pod_spec: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A (Cluster)TrainingRuntime whose template has one replicated Job ``node`` (the
    shape of Trainer's own torch-distributed runtime), with the given extras."""
    pod = {"containers": [{"name": "node", "image": "pytorch/pytorch:2.10.0"}], **(pod_spec or {})}
    template_spec: dict[str, Any] = {
        "replicatedJobs": [
            {
                "name": "node",
                "template": {
                    "metadata": {"labels": dict(ANCESTOR)},
                    "spec": {**(job_spec or {}), "template": {"spec": pod}},
                },
            }
        ],
        **spec,
    }
    if failure_policy is not None:
        template_spec["failurePolicy"] = failure_policy
    template: dict[str, Any] = {"spec": template_spec}
    if annotations:
        template["metadata"] = {"annotations": dict(annotations)}
    meta: dict[str, Any] = {"name": name, "uid": str(uuid.uuid4())}
    if kind == "TrainingRuntime":
        meta["namespace"] = "ml"
    return {
        "apiVersion": TRAINER,
        "kind": kind,
        "metadata": meta,
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": template},
    }


def trainjob(
    annotations: dict[str, str] | None = None,
    *,
    ref: dict[str, str] | None = None,
    patches: list[dict[str, Any]] | None = None,
    applied: bool = True,
    suspend: bool | None = None,
) -> dict[str, Any]:
    """A TrainJob as admission sees it on ``kubectl apply``: the CRD's defaults
    (runtimeRef kind and apiGroup, suspend, managedBy) applied, a last-applied record."""
    manifest: dict[str, Any] = {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "metadata": {"name": "llm-finetune", "namespace": "ml"},
        "spec": {
            "runtimeRef": ref or {"name": "torch-distributed"},
            "trainer": {"numNodes": 4, "image": "ghcr.io/example/finetune:2.0.1"},
        },
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    if patches is not None:
        manifest["spec"]["runtimePatches"] = copy.deepcopy(patches)
    if suspend is not None:
        manifest["spec"]["suspend"] = suspend
    obj = copy.deepcopy(manifest)
    if applied:
        obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(manifest)
    crd_defaults(crd_schema(obj), obj)
    return obj


def request(obj, operation="CREATE", old=None):
    return admission.decode(json.dumps(review(obj, operation=operation, old=old)))


def mutate(obj, runtimes=None, config=None, operation="CREATE", old=None):
    verdict = engine.mutate(
        request(obj, operation, old), config or Config(), runtimes=runtimes or NoRuntimes()
    )
    return verdict, apply(obj, verdict.patch)


def validate(obj, runtimes=None, config=None, operation="CREATE", old=None):
    return engine.validate(
        request(obj, operation, old), config or Config(), runtimes or NoRuntimes()
    )


def our_patch(obj: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [p for p in obj["spec"]["runtimePatches"] if p["manager"] == MANAGER]
    return entry


def carried(obj: dict[str, Any]) -> dict[str, str]:
    return our_patch(obj)["trainingRuntimeSpec"]["template"]["metadata"]["annotations"]


#: The runtimes each Trainer release installs (tests/data/runtimes/README.md).
RUNTIMES = ROOT / "tests" / "data" / "runtimes"


def shipped(release: str, name: str) -> dict[str, Any]:
    """A runtime Kubeflow Trainer installs (tests/data/runtimes/README.md), as stored."""
    rt = yaml.safe_load((RUNTIMES / release / f"{name}.yaml").read_text())
    rt["metadata"]["uid"] = str(uuid.uuid4())
    return rt


def submitted(
    annotations: dict[str, str] | None, rt: dict[str, Any], **trainer: Any
) -> dict[str, Any]:
    """A TrainJob naming ``rt`` as its CREATE review carries it: CRD defaults, no uid nor
    creationTimestamp (assigned after admission); ``trainer`` replaces fields of
    ``spec.trainer``."""
    obj = trainjob(annotations, ref={"name": rt["metadata"]["name"], "kind": rt["kind"]})
    obj["spec"]["trainer"].update(copy.deepcopy(trainer))
    return obj


GPU = {"limits": {"nvidia.com/gpu": 1}}


#: A runtime whose node container asks for memory (the shipped ones do not).
def memory_runtime(release: str) -> dict[str, Any]:
    rt = shipped(release, "torch_distributed")
    (rjob,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
    (node,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    node["resources"] = {"requests": {"memory": "32Gi"}, "limits": {"memory": "32Gi"}}
    return rt


OOM = {P + "oom-memory-factor": "2", P + "oom-memory-limit": "16Gi", P + "backoff-limit": "3"}
