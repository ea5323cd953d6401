"""Kubeflow Trainer runtimes, as a TrainJob's admission consults them: the runtime a
TrainJob names (``RuntimeSource``: ``runtime`` by kind, namespace and name, answered with
a ``RuntimeLookup``), the names of a runtime reference, and the Trainer's release.

A TrainJob (trainer.kubeflow.org/v1alpha1) names a TrainingRuntime (in its namespace) or a
ClusterTrainingRuntime in ``spec.runtimeRef``, and the trainer controller builds its
JobSet from that runtime's ``spec.template``. What answers the lookup is the TrainJob
kind's (``webhook.kinds.trainjob.runtimes``: the server's watch-backed cache, the CLI's
runtimes given in the same input); ``NoRuntimes`` where there is no cluster. Here stands
what ``Context`` (``webhook.plan.outcome``) carries and the admission reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

VERSION = "v1alpha1"
#: Runtime kinds and their resources; a TrainJob's ``runtimeRef.kind`` defaults to the
#: cluster-scoped one (``RuntimeRef`` in pkg/apis/trainer/v1alpha1/trainjob_types.go).
PLURALS = {
    "TrainingRuntime": "trainingruntimes",
    "ClusterTrainingRuntime": "clustertrainingruntimes",
}
CLUSTER_KIND = "ClusterTrainingRuntime"


def trainer_release(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a Trainer version such as ``v2.3.0``; ``None`` when not known
    (``dev`` builds, anything else)."""
    if not isinstance(version, str):
        return None
    parts = version.strip().removeprefix("v").split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


@dataclass(frozen=True)
class RuntimeLookup:
    """The runtime (``None``: not known) and, when there is none, why."""

    runtime: Mapping[str, Any] | None
    reason: str = ""
    #: True when the runtime certainly does not exist (the Trainer's own webhook then
    #: denies the TrainJob); False when it could not be read.
    missing: bool = False
    #: The Trainer's release (``v2.3.0``), ``None`` when not known.
    trainer: str | None = None


class RuntimeSource(Protocol):
    def runtime(self, kind: str, namespace: str | None, name: str) -> RuntimeLookup: ...

    def stats(self) -> dict[str, Any]: ...


def describe(kind: str, namespace: str | None, name: str) -> str:
    """``ClusterTrainingRuntime torch-distributed``, ``TrainingRuntime ml/torch-spot``."""
    return f"{kind} {name}" if kind == CLUSTER_KIND else f"{kind} {namespace}/{name}"


def runtime_key(kind: str, namespace: str | None, name: str) -> tuple[str, str, str]:
    return (kind, "" if kind == CLUSTER_KIND else namespace or "", name)


class NoRuntimes:
    """No API connection: every runtime is unknown."""

    def runtime(self, kind: str, namespace: str | None, name: str) -> RuntimeLookup:
        return RuntimeLookup(None, "no connection to a cluster")

    def stats(self) -> dict[str, Any]:
        return {"enabled": False}
