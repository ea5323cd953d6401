"""Workloads admitted and checked, for the workload tests (Indexed Jobs, CronJob, JobSet,
RayJob, PyTorchJob, TrainJob, examples; their builders are in ``testkit.kinds``).

Objects are built the way admission sees them on CREATE: API defaults applied (for custom
resources, the ``default`` values of their CRD schema, which the API server applies before
any webhook), no ``uid``, ``resourceVersion`` or ``creationTimestamp`` (see
``testkit.builders``), and a ``last-applied-configuration`` record when the test says the
object came from ``kubectl apply``. Results are checked with real parts: the Go json-patch
of ``kubectl patch --local``, ``kubernetes_validate`` (strict) for batch kinds and for the
Kubernetes types embedded in custom resources, and ``jsonschema`` against the vendored CRD
schemas (tests/data/crds, made strict about unknown fields as the API server's
``fieldValidation=Strict`` is).
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from testkit.builders import apply, job, review, stored
from testkit.servers import scaled
from testkit.tools import ROOT, tool
from webhook.admission import engine
from webhook.admission import review as admission
from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.facts import NoCluster
from webhook.cluster.history import HistoryKey, HistoryLookup, unknown
from webhook.kinds import registry as defaults
from webhook.kube.intent import LAST_APPLIED
from webhook.policy.config import Config

CRDS = ROOT / "tests" / "data" / "crds"
SCHEMAS = {
    # The release the cluster tests run (tests/data/crds/jobset-releases/README.md); the
    # file one directory up is from before v0.10 (no onJobFailureMessagePatterns).
    ("jobset.x-k8s.io", "JobSet"): "jobset-releases/jobsets.jobset.x-k8s.io.v0.12.0.yaml",
    ("ray.io", "RayJob"): "rayjobs.ray.io.v1.yaml",
    ("kubeflow.org", "PyTorchJob"): "pytorchjobs.kubeflow.org.v1.yaml",
    ("trainer.kubeflow.org", "TrainJob"): "trainjobs.trainer.kubeflow.org.v1alpha1.yaml",
    (
        "trainer.kubeflow.org",
        "TrainingRuntime",
    ): "trainingruntimes.trainer.kubeflow.org.v1alpha1.yaml",
    (
        "trainer.kubeflow.org",
        "ClusterTrainingRuntime",
    ): "trainingruntimes.trainer.kubeflow.org.v1alpha1.yaml",
}
WORKER_NAME = {
    "name": "FLYTE_INTERNAL_WORKER_NAME",
    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
}
STRATEGY = {"name": "FLYTE_INTERNAL_DIST_ERROR_STRATEGY", "value": "Earliest"}


def admitted(manifest: dict[str, Any], *, applied: bool = False) -> dict[str, Any]:
    """``manifest`` as the API server hands it to a webhook on CREATE."""
    obj = copy.deepcopy(manifest)
    metadata = obj.setdefault("metadata", {})
    metadata.setdefault("namespace", "ml")
    if applied:
        metadata.setdefault("annotations", {})[LAST_APPLIED] = json.dumps(manifest)
    defaults.apply_defaults(obj)
    schema = crd_schema(obj)
    if schema is not None:
        crd_defaults(schema, obj)
    return obj


def pod_template(*names: str, restart_policy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": n, "image": "ghcr.io/example/train:1.0.0"} for n in names]
    }
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return {"spec": spec}


# --- the engine round trip -----------------------------------------------------------


class FixedAttempts(NoCluster):
    """An attempt source answering a fixed count for every Job (the cache has its own
    tests against an HTTP Kubernetes API in tests/cluster/test_attempts.py), and a history in which
    each of those failures was an OOM kill of container ``main`` on its own node."""

    def __init__(self, failures: int | None):
        self.failures = failures
        self.calls: list[tuple[str, str, str]] = []

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        self.calls.append((namespace, name, uid))
        if self.failures is None:
            return AttemptLookup(None, "none", "unknown")
        return AttemptLookup(self.failures, "Job status (cache)")

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        if self.failures is None:
            return unknown("unknown")
        nodes = tuple(f"node-{n}" for n in range(self.failures))
        kills = (("main", self.failures),) if self.failures else ()
        return HistoryLookup(True, kills, nodes, self.failures, 0, "test")

    def stats(self) -> dict[str, Any]:
        return {}


def mutate(obj: dict[str, Any], config: Config | None = None, attempts: Any = None, **kw: Any):
    request = admission.decode(json.dumps(review(obj, **kw)))
    verdict = engine.mutate(request, config or Config(), attempts or NoCluster())
    return verdict, apply(obj, verdict.patch)


def admitted_job(
    annotations: dict, name: str = "train", config: Config | None = None, **spec: Any
) -> dict:
    """A Job as the webhook admitted it and the API server stored it (``spec``: fields
    added to its spec)."""
    verdict, out = mutate(job(annotations, name=name, spec=spec or None), config)
    assert verdict.allowed, verdict.message
    return stored(out)


def validate(obj: dict[str, Any], config: Config | None = None, **kw: Any):
    request = admission.decode(json.dumps(review(obj, **kw)))
    return engine.validate(request, config or Config())


def assert_idempotent(obj: dict[str, Any], config: Config | None = None) -> dict[str, Any]:
    """Mutating the mutated object changes nothing, and validation accepts it."""
    first, once = mutate(obj, config)
    assert first.allowed, first.message
    assert first.patch, "the scenario should change something"
    second, twice = mutate(once, config)
    assert second.allowed, second.message
    assert second.patch == []
    assert twice == once
    verdict = validate(once, config)
    assert verdict.allowed, verdict.message
    return once


def kubectl_patch(obj: dict[str, Any], patch: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    """Apply ``patch`` with Go's json-patch (the API server's library), via kubectl --local."""
    kubectl = tool("kubectl")
    source = tmp / "obj.json"
    source.write_text(json.dumps(obj))
    argv = [kubectl, "patch", "--local", "-f", str(source), "--type", "json"]
    result = subprocess.run(
        [*argv, "-p", json.dumps(patch), "-o", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp)},
        timeout=scaled(60),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- schemas -------------------------------------------------------------------------


def _group_kind(obj: dict[str, Any]) -> tuple[str, str]:
    return str(obj.get("apiVersion") or "").rpartition("/")[0], str(obj.get("kind"))


@functools.cache
def _load_schema(name: str) -> dict[str, Any]:
    return yaml.safe_load((CRDS / name).read_text())


def crd_schema(obj: dict[str, Any]) -> dict[str, Any] | None:
    name = SCHEMAS.get(_group_kind(obj))
    return _load_schema(name) if name else None


def crd_defaults(schema: dict[str, Any], value: Any) -> None:
    """Apply the schema's ``default`` values, as the API server does for custom resources."""
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and isinstance(sub, dict) and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                crd_defaults(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for item in value.values():
                crd_defaults(extra, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            crd_defaults(schema["items"], item)


def _strict(schema: Any) -> Any:
    """Unknown fields are errors (``fieldValidation=Strict``), except where the schema
    preserves them; ``x-*`` keys are dropped (jsonschema has no use for them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-")}
    if "properties" in schema and "additionalProperties" not in schema:
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("int32")
def _int32(value: Any) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_FORMATS.checks("int64")
def _int64(value: Any) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def _embedded(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Kubernetes types inside a custom resource, as objects kubernetes_validate knows."""
    kind = _group_kind(obj)[1]
    spec = obj.get("spec") or {}
    templates: list[Any] = []
    if kind == "JobSet":
        for rjob in spec.get("replicatedJobs") or []:
            job_spec = (rjob.get("template") or {}).get("spec")
            yield {"apiVersion": "batch/v1", "kind": "Job", "spec": job_spec}
    elif kind == "RayJob":
        cluster = spec.get("rayClusterSpec") or {}
        templates.append((cluster.get("headGroupSpec") or {}).get("template"))
        templates += [g.get("template") for g in cluster.get("workerGroupSpecs") or []]
        if "submitterPodTemplate" in spec:
            templates.append(spec["submitterPodTemplate"])
    elif kind == "PyTorchJob":
        templates += [r.get("template") for r in (spec.get("pytorchReplicaSpecs") or {}).values()]
    for template in templates:
        yield {"apiVersion": "v1", "kind": "PodTemplate", "template": template}


def validate_schema(
    obj: dict[str, Any], version: str = "1.37", schema: dict[str, Any] | None = None
) -> None:
    """Validate ``obj`` as the API server would: strict Kubernetes schemas for built-in
    kinds; the CRD schema (defaults applied first; ``schema`` for another release's than
    the vendored one) plus the embedded Kubernetes types for custom resources. Raises with
    every error found."""
    schema = schema or crd_schema(obj)
    if schema is None:
        kubernetes_validate.validate(obj, version, strict=True)
        return
    obj = copy.deepcopy(obj)
    crd_defaults(schema, obj)
    validator = jsonschema.Draft7Validator(_strict(schema), format_checker=_FORMATS)
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]
    assert not errors, errors
    for embedded in _embedded(obj):
        embedded["metadata"] = {"name": "embedded"}
        kubernetes_validate.validate(embedded, version, strict=True)
    template = (obj.get("spec") or {}).get("template")
    if _group_kind(obj)[1].endswith("TrainingRuntime") and isinstance(template, dict):
        # A runtime's template holds a JobSetSpec: checked with the JobSet CRD's schema.
        jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {}}
        validate_schema({**jobset, "spec": template.get("spec")}, version)
