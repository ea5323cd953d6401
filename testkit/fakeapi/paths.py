"""Where the test API's resources live (``testkit.fakeapi``): the URL paths it lists,
watches, reads and writes, the targets a path names, the selectors a list takes, and the
Status bodies of its refusals."""

from __future__ import annotations

from typing import Any

from testkit.apivalidation import status_body

TRAINER = "/apis/trainer.kubeflow.org/v1alpha1"
#: Resources with list and watch (all namespaces): URL path -> resource.
LISTED = {
    "/apis/batch/v1/jobs": "jobs",
    "/api/v1/pods": "pods",
    "/apis/jobset.x-k8s.io/v1alpha2/jobsets": "jobsets",
    "/api/v1/limitranges": "limitranges",
    "/api/v1/nodes": "nodes",
    f"{TRAINER}/trainingruntimes": "trainingruntimes",
    f"{TRAINER}/clustertrainingruntimes": "clustertrainingruntimes",
}


def runtime_target(parts: list[str]) -> tuple[str, str, str] | None:
    """(resource, namespace, name) of a GET of one Kubeflow Trainer runtime."""
    if parts[:3] != ["apis", "trainer.kubeflow.org", "v1alpha1"]:
        return None
    rest = parts[3:]
    if len(rest) == 2 and rest[0] == "clustertrainingruntimes":
        return rest[0], "", rest[1]
    if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "trainingruntimes":
        return rest[2], rest[1], rest[3]
    return None


#: Named resources with write support: URL prefix -> (resource, namespaced, kind).
NAMED = {
    "secrets": ("/api/v1", True, "Secret"),
    "configmaps": ("/api/v1", True, "ConfigMap"),
    "mutatingwebhookconfigurations": (
        "/apis/admissionregistration.k8s.io/v1",
        False,
        "MutatingWebhookConfiguration",
    ),
    "validatingwebhookconfigurations": (
        "/apis/admissionregistration.k8s.io/v1",
        False,
        "ValidatingWebhookConfiguration",
    ),
    "leases": ("/apis/coordination.k8s.io/v1", True, "Lease"),
    "events": ("/apis/events.k8s.io/v1", True, "Event"),
    # Read by name only: a Job's parents (the Event writer, the controller) and the
    # workloads ``retry-webhook status`` reads (Jobs and JobSets are listed above).
    "cronjobs": ("/apis/batch/v1", True, "CronJob"),
    "trainjobs": ("/apis/trainer.kubeflow.org/v1alpha1", True, "TrainJob"),
    "rayjobs": ("/apis/ray.io/v1", True, "RayJob"),
}

#: Field selectors an events.k8s.io/v1 list accepts, and the field each reads: the
#: API server converts them to core Event fields (``regarding.*`` to
#: ``involvedObject.*``, ``reportingController`` to ``reportingComponent``) and selects
#: on ``ToSelectableFields`` (pkg/registry/core/event/strategy.go); any other label is
#: refused with 400 "field label not supported".
EVENT_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "regarding.kind": ("regarding", "kind"),
    "regarding.namespace": ("regarding", "namespace"),
    "regarding.name": ("regarding", "name"),
    "regarding.uid": ("regarding", "uid"),
    "regarding.apiVersion": ("regarding", "apiVersion"),
    "regarding.resourceVersion": ("regarding", "resourceVersion"),
    "regarding.fieldPath": ("regarding", "fieldPath"),
    "reason": ("reason",),
    "type": ("type",),
    "reportingController": ("reportingController",),
}


def named_target(path: str) -> tuple[str, str, str] | None:
    """(resource, namespace or "", name or "") for a URL of a ``NAMED`` resource."""
    parts = path.strip("/").split("/")
    for resource, (prefix, namespaced, _kind) in NAMED.items():
        base = prefix.strip("/").split("/")
        if parts[: len(base)] != base:
            continue
        rest = parts[len(base) :]
        if namespaced and len(rest) in (3, 4) and rest[0] == "namespaces" and rest[2] == resource:
            return resource, rest[1], rest[3] if len(rest) == 4 else ""
        if not namespaced and len(rest) in (1, 2) and rest[0] == resource:
            return resource, "", rest[1] if len(rest) == 2 else ""
    return None


#: Listed resources that also take PATCH of one object (``/<prefix>/namespaces/NS/<r>/NAME``,
#: ``.../pods/NAME/status``): resource -> URL prefix.
PATCHED = {"jobs": "/apis/batch/v1", "pods": "/api/v1", "jobsets": "/apis/jobset.x-k8s.io/v1alpha2"}


def listed_target(path: str) -> tuple[str, str, str, str] | None:
    """(resource, namespace, name, subresource or "") for a PATCH of a listed object."""
    parts = path.strip("/").split("/")
    for resource, prefix in PATCHED.items():
        base = prefix.strip("/").split("/")
        rest = parts[len(base) :]
        if parts[: len(base)] == base and len(rest) in (4, 5) and rest[0] == "namespaces":
            if rest[2] == resource:
                return resource, rest[1], rest[3], rest[4] if len(rest) == 5 else ""
    return None


#: A Status's reason for the codes ``write_status`` answers with (metav1.StatusReason).
REASONS = {403: "Forbidden", 422: "Invalid", 429: "TooManyRequests", 503: "ServiceUnavailable"}


def not_found(resource: str, name: str) -> tuple[int, dict]:
    return 404, status_body(
        404, "NotFound", f'{resource} "{name}" not found', name, NAMED[resource][2]
    )


def field_of(obj: dict[str, Any], path: tuple[str, ...]) -> str:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
    """The selectors the caches, the controller and ``status`` use: labels that exist, or
    have a value (``key=value``), comma-separated (all must hold); status.phase or
    metadata.name equals."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for requirement in filter(None, (query.get("labelSelector") or "").split(",")):
        key, equals, value = requirement.partition("=")
        if key not in labels or (equals and labels[key] != value):
            return False
    field = query.get("fieldSelector")
    if field:
        key, _, value = field.partition("=")
        if key == "status.phase" and (obj.get("status") or {}).get("phase") != value:
            return False
        if key == "metadata.name" and obj.get("metadata", {}).get("name") != value:
            return False
    return True
