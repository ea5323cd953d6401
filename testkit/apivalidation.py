"""What the test API server refuses, as the API server refuses it: the validation of
updates of pods and Jobs, of annotations' size, and the decoding of the objects it
stores (Secrets, webhook configurations); and the ``Status`` body every error carries
(``metav1.Status``)."""

from __future__ import annotations

import base64
import binascii
import copy
from typing import Any

from webhook.kube.wellknown import NAMESPACE_TERMINATING


def status_body(code: int, reason: str, message: str, name: str = "", kind: str = "") -> dict:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name:
        body["details"] = {"name": name, "kind": kind}
    return body


def namespace_terminating(resource: str, group: str, namespace: str, name: str) -> dict:
    """The NamespaceLifecycle admission plugin's refusal of a create in a namespace being
    deleted (``Admit`` in plugin/pkg/admission/namespace/lifecycle/admission.go: a
    Forbidden with the ``NamespaceTerminating`` cause), as the real API server sends it."""
    what = f"{resource}.{group}" if group else resource
    message = (
        f"unable to create new content in namespace {namespace} because it is being terminated"
    )
    body = status_body(403, "Forbidden", f'{what} "{name}" is forbidden: {message}')
    body["details"] = {
        "name": name,
        "group": group,
        "kind": resource,
        "causes": [
            {
                "reason": NAMESPACE_TERMINATING,
                "message": f"namespace {namespace} is being terminated",
                "field": "metadata.namespace",
            }
        ],
    }
    return body


#: Pod spec fields an update may change (``updatablePodSpecFields``, ``ValidatePodUpdate``
#: in pkg/apis/core/validation/validation.go), each checked by ``pod_update_error``.
POD_UPDATABLE = ("activeDeadlineSeconds", "tolerations", "schedulingGates")
#: Job spec fields an update may not change (``ValidateJobSpecUpdate`` in
#: pkg/apis/batch/validation/validation.go); ``backoffLimit`` may change, to >= 0.
JOB_IMMUTABLE = (
    "selector",
    "template",
    "completionMode",
    "podFailurePolicy",
    "backoffLimitPerIndex",
    "managedBy",
    "successPolicy",
)


def update_error(resource: str, new: dict, current: dict) -> tuple[int, str] | None:
    """The API's validation of an update of a pod or a Job, for the fields tests change."""
    if resource == "pods":
        return pod_update_error(new.get("spec") or {}, current.get("spec") or {})
    if resource == "jobs":
        spec, old = new.get("spec") or {}, current.get("spec") or {}
        for key in JOB_IMMUTABLE:
            if spec.get(key) != old.get(key):
                return 422, f"spec.{key}: Invalid value: field is immutable"
        limit = spec.get("backoffLimit")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            return (
                422,
                f"spec.backoffLimit: Invalid value: {limit}: must be greater than or equal to 0",
            )
    return None


def pod_update_error(spec: dict, old: dict) -> tuple[int, str] | None:
    """``ValidatePodUpdate``: ``activeDeadlineSeconds`` may be set, or lowered, never raised
    or removed, and is 1 to MaxInt32 (``ValidatePodSpec``); tolerations may only be added,
    scheduling gates only removed; containers' images may change; nothing else."""
    new_deadline, old_deadline = spec.get("activeDeadlineSeconds"), old.get("activeDeadlineSeconds")
    where = "spec.activeDeadlineSeconds: Invalid value"
    if new_deadline is None and old_deadline is not None:
        return 422, f"{where}: null: must not update from a positive integer to nil value"
    if new_deadline is not None and not (
        isinstance(new_deadline, int) and 1 <= new_deadline <= 2**31 - 1
    ):
        return 422, f"{where}: {new_deadline}: must be between 1 and 2147483647, inclusive"
    if old_deadline is not None and new_deadline > old_deadline:
        return 422, f"{where}: {new_deadline}: must be less than or equal to previous value"
    tolerations = spec.get("tolerations") or []
    if tolerations[: len(old.get("tolerations") or [])] != (old.get("tolerations") or []):
        return 422, "spec.tolerations: Forbidden: existing toleration can not be modified"
    gates = [
        g for g in spec.get("schedulingGates") or [] if g not in (old.get("schedulingGates") or [])
    ]
    if gates:
        return 422, "spec.schedulingGates: Forbidden: only deletion is allowed"
    rest = {k: v for k, v in spec.items() if k not in POD_UPDATABLE}
    before = {k: v for k, v in old.items() if k not in POD_UPDATABLE}
    for group in ("containers", "initContainers"):
        for side in (rest, before):
            side[group] = [{**c, "image": None} for c in side.get(group) or []]
    if rest != before:
        return 422, "spec: Forbidden: pod updates may not change fields other than those allowed"
    return None


#: ``TotalAnnotationSizeLimitB`` (k8s.io/apimachinery pkg/api/validation/objectmeta.go).
ANNOTATIONS_LIMIT = 256 * (1 << 10)


def annotations_too_long(resource: str, name: str, obj: dict) -> tuple[int, dict] | None:
    """``ValidateAnnotations``: every key and value together at most 256 KiB, else 422
    Invalid (``field.TooLong`` on ``metadata.annotations``)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    size = sum(len(k.encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size <= ANNOTATIONS_LIMIT:
        return None
    message = (
        f'{resource} "{name}" is invalid: metadata.annotations: Too long: may not be more '
        f"than {ANNOTATIONS_LIMIT} bytes"
    )
    return 422, status_body(422, "Invalid", message, name)


def comparable(obj: dict) -> dict:
    out = copy.deepcopy(obj)
    out.get("metadata", {}).pop("resourceVersion", None)
    return out


def _b64(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def invalid(resource: str, obj: Any, current: dict | None) -> tuple[int, dict] | None:
    """The API's decoding and validation for the fields these objects carry."""
    if not isinstance(obj, dict):
        return 400, status_body(400, "BadRequest", "the body must be a JSON object")
    if resource == "secrets":
        data = obj.get("data") or {}
        for key, value in data.items():
            if not _b64(value):
                return 400, status_body(
                    400,
                    "BadRequest",
                    f"Secret in version v1 cannot be handled: data[{key}]: illegal base64 data",
                )
        kind = obj.get("type") or "Opaque"
        if current is not None:
            if kind != (current.get("type") or "Opaque"):
                return 422, status_body(422, "Invalid", "type: Invalid value: field is immutable")
            if current.get("immutable") and (
                obj.get("data") != current.get("data") or not obj.get("immutable")
            ):
                return 422, status_body(
                    422, "Invalid", "data: Forbidden: field is immutable when `immutable` is set"
                )
        if kind == "kubernetes.io/tls":
            for key in ("tls.crt", "tls.key"):
                if key not in data:
                    return 422, status_body(422, "Invalid", f"data[{key}]: Required value")
    else:
        for index, hook in enumerate(obj.get("webhooks") or []):
            bundle = (hook.get("clientConfig") or {}).get("caBundle")
            if bundle is not None and not _b64(bundle):
                return 400, status_body(
                    400,
                    "BadRequest",
                    f"webhooks[{index}].clientConfig.caBundle: illegal base64 data",
                )
    return None
