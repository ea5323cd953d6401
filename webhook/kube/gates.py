"""The retry-delay scheduling gate: how a pod is held back, found, and let go.

A scheduling gate (``spec.schedulingGates``, GA in 1.30) keeps a pod Pending with
``PodScheduled=False, reason SchedulingGated``: the scheduler does not try it until every
gate is gone. The API server takes gates only when a pod is created; afterwards a gate
may only be removed (``validateOnlyDeletedSchedulingGates`` in
pkg/apis/core/validation/validation.go), so the webhook adds ours at admission and the
controller removes it, and nothing ever adds it back.

Beside the gate the webhook writes two things: the annotation ``retry-policy.dev/not-before``
(when the pod may go, RFC 3339 in UTC: the users' contract) and the label ``GATED_LABEL``,
which lets the controller, and ``retry-webhook release-gates``, list and watch exactly the
pods it holds (a label selector) rather than every pod of the cluster. The watch is served
from the API server's watch cache; the list (no ``resourceVersion``: a consistent read) is
served from etcd on 1.30, where the API server reads every pod and filters by the label
itself, and from the watch cache from 1.31 (``ConsistentListFromCache``; see
``webhook.cluster.informer``). The label goes with the gate.

Removing the gate is a JSON patch that first ``test``s that the gate is still at the index
it was read at, then removes that entry and the label: a gate of someone else's (Kueue's,
a user's) is never touched, and a pod whose gates moved in the meantime answers 422, to be
read again and retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GATE = "retry-policy.dev/retry-delay"
NOT_BEFORE = "retry-policy.dev/not-before"
GATED_LABEL = "retry-policy.dev/retry-delay-gated"
GATED_VALUE = "true"


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def gate_index(pod: Mapping[str, Any]) -> int | None:
    """Where our gate is in the pod's ``spec.schedulingGates`` (``None``: not there)."""
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, dict) else None
    for index, gate in enumerate(gates if isinstance(gates, list) else ()):
        if isinstance(gate, dict) and gate.get("name") == GATE:
            return index
    return None


def labelled(pod: Mapping[str, Any]) -> bool:
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return isinstance(labels, dict) and GATED_LABEL in labels


def held(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries our gate or our label (either is ours to remove)."""
    return gate_index(pod) is not None or labelled(pod)


def release_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that removes our gate (tested at its index) and our label from
    ``pod`` as read; empty when it holds neither."""
    patch: list[dict[str, Any]] = []
    index = gate_index(pod)
    if index is not None:
        path = f"/spec/schedulingGates/{index}"
        patch += [
            {"op": "test", "path": f"{path}/name", "value": GATE},
            {"op": "remove", "path": path},
        ]
    if labelled(pod):
        path = f"/metadata/labels/{_pointer(GATED_LABEL)}"
        patch += [
            {"op": "test", "path": path, "value": pod["metadata"]["labels"][GATED_LABEL]},
            {"op": "remove", "path": path},
        ]
    return patch


def add_gate(pod: dict[str, Any], not_before: str) -> bool:
    """Hold ``pod`` back until ``not_before`` (RFC 3339): our gate, appended after any
    others, the annotation and the label; ``False`` when it is held already."""
    spec = pod.get("spec")
    metadata = pod.get("metadata")
    if not isinstance(spec, dict) or not isinstance(metadata, dict):
        return False
    if gate_index(pod) is not None:
        return False
    gates = spec.get("schedulingGates")
    if gates is None:
        gates = []
    labels = metadata.get("labels")
    if not isinstance(gates, list) or not isinstance(labels, dict | None):
        return False  # malformed: the API server refuses such a pod anyway
    spec["schedulingGates"] = [*gates, {"name": GATE}]
    annotations = metadata.get("annotations")
    metadata["annotations"] = {**(annotations if isinstance(annotations, dict) else {})}
    metadata["annotations"][NOT_BEFORE] = not_before
    metadata["labels"] = {**(labels or {}), GATED_LABEL: GATED_VALUE}
    return True


def not_before(pod: Mapping[str, Any]) -> str | None:
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    value = annotations.get(NOT_BEFORE) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else None
