"""CustomResourceDefinitions of the kinds we handle, for the real API server: each wraps the
vendored ``openAPIV3Schema`` (tests/data/crds, its README says from where) in the CRD its
project ships, with the group, version, names and scope it declares. The notes of what was
elided (``x-elided``) are not schema and go; what they stood for stays open
(``x-kubernetes-preserve-unknown-fields``). No controller of these kinds runs here: the
API server serves them, so admission of them is real.
"""

from __future__ import annotations

from typing import Any

from testkit.workloads import SCHEMAS, _load_schema

#: (group, kind) -> (plural, version, scope)
NAMES = {
    ("jobset.x-k8s.io", "JobSet"): ("jobsets", "v1alpha2", "Namespaced"),
    ("ray.io", "RayJob"): ("rayjobs", "v1", "Namespaced"),
    ("kubeflow.org", "PyTorchJob"): ("pytorchjobs", "v1", "Namespaced"),
    ("trainer.kubeflow.org", "TrainJob"): ("trainjobs", "v1alpha1", "Namespaced"),
    ("trainer.kubeflow.org", "TrainingRuntime"): ("trainingruntimes", "v1alpha1", "Namespaced"),
    ("trainer.kubeflow.org", "ClusterTrainingRuntime"): (
        "clustertrainingruntimes",
        "v1alpha1",
        "Cluster",
    ),
}


def without_notes(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: without_notes(v) for k, v in schema.items() if not k.startswith("x-elided")}
    if isinstance(schema, list):
        return [without_notes(item) for item in schema]
    return schema


def definitions() -> list[dict[str, Any]]:
    out = []
    for (group, kind), file in SCHEMAS.items():
        plural, version, scope = NAMES[(group, kind)]
        schema = without_notes(_load_schema(file))
        out.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{group}"},
                "spec": {
                    "group": group,
                    "scope": scope,
                    "names": {
                        "plural": plural,
                        "singular": kind.lower(),
                        "kind": kind,
                        "listKind": f"{kind}List",
                    },
                    "versions": [
                        {
                            "name": version,
                            "served": True,
                            "storage": True,
                            "schema": {"openAPIV3Schema": schema},
                            "subresources": {"status": {}},
                        }
                    ],
                },
            }
        )
    return out
