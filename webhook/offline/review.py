"""One object of a manifest through admission, offline, as the API server would hand it to
the webhook on ``kubectl apply``: API defaults applied first, and the manifest recorded as
``kubectl apply`` records it (so a written ``backoffLimit: 6`` is told apart from a
defaulted one)."""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from webhook.admission import engine
from webhook.admission.review import Verdict
from webhook.cluster.facts import ClusterFacts, NoCluster
from webhook.cluster.runtimes import RuntimeSource
from webhook.cluster.version import VersionSource
from webhook.kinds.registry import apply_defaults, handled, known_kind, spec_for
from webhook.kube.wellknown import (
    LAST_APPLIED,
)
from webhook.plan.policies import has_policy_annotations
from webhook.policy.config import Config
from webhook.policy.model import PREFIX


def prepare(obj: dict[str, Any], namespace: str | None) -> tuple[dict[str, Any], bool]:
    """The object as the API server would hand it to a webhook on ``kubectl apply``.

    Returns it and whether a last-applied record was added (to strip from the output).
    """
    manifest = copy.deepcopy(obj)
    prepared = copy.deepcopy(obj)
    metadata = prepared.get("metadata")
    if not isinstance(metadata, dict):
        metadata = prepared["metadata"] = {}
    # As kubectl: the object's own namespace, else -n's (``read_inputs`` refused the two
    # differing), else "default".
    metadata["namespace"] = metadata.get("namespace") or namespace or "default"
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
    synthetic = LAST_APPLIED not in annotations
    if synthetic:
        annotations[LAST_APPLIED] = json.dumps(manifest, separators=(",", ":"))
    apply_defaults(prepared)
    return prepared, synthetic


#: Who sends the manifest in a printed review: a kubeadm cluster's admin (the webhook
#: reads a requester only on a pod's DELETE).
REVIEW_USER = {
    "username": "kubernetes-admin",
    "groups": ["kubeadm:cluster-admins", "system:authenticated"],
}
#: What the create handler wipes before admission (``rest.WipeObjectMetaSystemFields``, in
#: k8s.io/apiserver pkg/endpoints/handlers/create.go), and ``resourceVersion``, which the
#: store refuses on a create: a CREATE review's object has none of them.
WIPED_ON_CREATE = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "resourceVersion",
)


def admission_review(obj: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """The AdmissionReview the API server sends a mutating webhook when ``kubectl apply``
    creates ``obj`` (fields: ``AdmissionRequest``, k8s.io/api admission/v1; filled as
    ``CreateV1AdmissionReview`` fills them, k8s.io/apiserver
    pkg/admission/plugin/webhook/request/admissionreview.go): the object as ``prepare``
    makes it, without the fields a create wipes; a request uid; ``name`` only when the
    object has one (a ``generateName`` leaves it empty, and then out)."""
    prepared, _ = prepare(obj, namespace)
    meta = prepared["metadata"]
    for wiped in WIPED_ON_CREATE:
        meta.pop(wiped, None)
    group, _, version = str(prepared.get("apiVersion") or "").rpartition("/")
    kind = str(prepared.get("kind") or "")
    gvk = {"group": group, "version": version, "kind": kind}
    # The resource each kind is served as (the registry's; a kind it does not list is
    # guessed as the API server's RESTMapper would: lowercase, plural).
    spec = spec_for(group, version, kind)
    resource = spec.plural if spec is not None else kind.lower() + "s"
    gvr = {"group": group, "version": version, "resource": resource}
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": meta.get("name"),
        "namespace": meta["namespace"],
        "operation": "CREATE",
        "userInfo": REVIEW_USER,
        "object": prepared,
        "oldObject": None,
        "dryRun": False,
        "options": {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "CreateOptions",
            "fieldManager": "kubectl-client-side-apply",  # kubectl apply's, on a create
        },
    }
    if not request["name"]:
        del request["name"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def strip(obj: dict[str, Any], synthetic: bool) -> dict[str, Any]:
    """``obj`` without the last-applied record ``prepare`` added."""
    if synthetic:
        annotations = obj.get("metadata", {}).get("annotations", {})
        annotations.pop(LAST_APPLIED, None)
        if not annotations:
            obj["metadata"].pop("annotations", None)
    return obj


@dataclass
class Checked:
    """One object reviewed: the verdict, the object as it would be stored (the input when
    denied), and its warnings split into what says something is off (``warnings``) and
    the record of each change (``changes``), which ``kubectl`` shows as warnings too
    (``verdict.warnings`` has them all, as it does)."""

    verdict: Verdict
    prepared: dict[str, Any]
    result: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)


def check(
    obj: dict[str, Any],
    config: Config,
    namespace: str | None,
    runtimes: RuntimeSource,
    version: VersionSource,
    attempts: ClusterFacts | None = None,
) -> Checked:
    """Prepare ``obj`` and review it (mutate, then validate) as admission would
    (``attempts``: what the input tells of the cluster, its LimitRanges)."""
    prepared, synthetic = prepare(obj, namespace)
    reviewed = engine.review(
        prepared, config, namespace, attempts or NoCluster(), runtimes=runtimes, version=version
    )
    texts = {c.text for c in reviewed.outcome.changes} if reviewed.outcome else set()
    warnings, changes = [], []
    for text in reviewed.verdict.warnings:
        (changes if text in texts else warnings).append(text)
    result = strip(reviewed.result, synthetic) if reviewed.verdict.allowed else reviewed.result
    unknown = unhandled(obj)
    if unknown:
        warnings.append(unknown)
    return Checked(reviewed.verdict, prepared, result, warnings, changes)


#: The API groups of kinds Kubernetes itself serves: their versions are known.
BUILT_IN_GROUPS = ("", "batch")


def unhandled(obj: dict[str, Any]) -> str:
    """The warning for an object the webhook would pass through unchanged, where that is
    not what its author expects: a kind it handles at a version it does not (matched on
    group, version and kind, as the API server names them), and any other kind that asks
    for a retry policy. "" for the rest (the server passes them through, silently)."""
    api_version = str(obj.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    kind = str(obj.get("kind") or "")
    if spec_for(group, version, kind) is not None:
        return ""
    known = known_kind(group, kind)
    if known is not None:
        served = "the API serves" if group in BUILT_IN_GROUPS else "the webhook handles"
        return (
            f"retry-policy: {kind} {api_version} is an unknown version ({served} "
            f"{kind} {known.api_version}): nothing here would apply to it"
        )
    metadata = obj.get("metadata")
    if has_policy_annotations(metadata if isinstance(metadata, dict) else None):
        return (
            f"retry-policy: {kind} {api_version} is not a kind the webhook handles, so its "
            f"{PREFIX} annotations would do nothing; it handles {handled()}"
        )
    return ""
