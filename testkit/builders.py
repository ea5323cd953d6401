"""Objects as a cluster sends them: a Job, a Pod, an AdmissionReview, what is stored.

They are built here, in code, the way the API server sends them: defaulted objects,
a ``last-applied-configuration`` when the test says the object came from ``kubectl
apply``, and on CREATE no ``uid``, ``creationTimestamp`` or ``resourceVersion``: the create
handler wipes the first two before admission and the store assigns them after
(``rest.WipeObjectMetaSystemFields`` in k8s.io/apiserver pkg/endpoints/handlers/create.go,
``rest.FillObjectMetaSystemFields`` in ``Store.create``), and a client that sends a
``resourceVersion`` is refused by the store. ``managedFields`` *are* there: the same
handler runs ``FieldManager.UpdateNoErrors`` before ``mutatingAdmission.Admit``. A
controller's pod has ``generateName`` and no ``name`` (the name is
generated in ``BeforeCreate``, after admission). Objects that exist already (UPDATE,
DELETE, what a watch delivers) get their system fields from ``stored``. No recorded
documents are copied.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

import jsonpatch

from webhook.kinds import registry as defaults
from webhook.kube.intent import LAST_APPLIED

P = "retry-policy.dev/"
#: Every annotation a Job takes at once: the policy most tests start from
#: (error-propagation belongs to PyTorchJobs only: ``podspec.NOT_A_PYTORCHJOB``).
FULL = {
    P + "fail-non-retriable": "true",
    P + "retriable-exit-codes": "137,143",
    P + "backoff-limit": "3",
    P + "ignore-disruptions": "true",
    P + "non-spot-attempts": "1",
}


def job(
    annotations: dict[str, str] | None = None,
    *,
    name: str = "train",
    namespace: str = "ml",
    restart_policy: str = "Never",
    containers: list[dict[str, Any]] | None = None,
    spec: dict[str, Any] | None = None,
    template_annotations: dict[str, str] | None = None,
    applied: bool = False,
    default: bool = True,
) -> dict[str, Any]:
    """A batch/v1 Job as admission sees it: defaulted, and with a last-applied record
    of the manifest when ``applied`` (it came from ``kubectl apply``)."""
    manifest: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": restart_policy,
                    "containers": containers or [{"name": "main", "image": "busybox:1.36"}],
                }
            }
        },
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    if template_annotations:
        manifest["spec"]["template"]["metadata"] = {"annotations": dict(template_annotations)}
    if spec:
        manifest["spec"].update(copy.deepcopy(spec))
    obj = copy.deepcopy(manifest)
    if applied:
        obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(manifest)
    if default:
        defaults.apply_defaults(obj)
    return obj


def pod(
    annotations: dict[str, str] | None = None,
    *,
    name: str | None = None,
    namespace: str = "ml",
    owner: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Pod as admission sees it on CREATE: a controller's pod (``owner``) has
    ``generateName`` (the Job controller's is ``<job>-``) and no name; a bare pod has the
    name its author wrote (``name``, default ``train-abcde``)."""
    metadata: dict[str, Any] = {"namespace": namespace}
    if owner and name is None:
        metadata["generateName"] = f"{owner.get('name', 'train')}-"
    else:
        metadata["name"] = name or "train-abcde"
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    if owner:
        obj["metadata"]["ownerReferences"] = [owner]
    if spec:
        obj["spec"].update(copy.deepcopy(spec))
    defaults.apply_defaults(obj)
    return obj


def stored(obj: dict[str, Any], *, uid: str | None = None, version: str = "1") -> dict[str, Any]:
    """``obj`` as it is once stored (an UPDATE's objects, a watch event): the system
    fields ``rest.FillObjectMetaSystemFields`` assigns, and a name for a generated one."""
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta.setdefault("uid", uid or str(uuid.uuid4()))
    meta.setdefault("resourceVersion", version)
    meta.setdefault("creationTimestamp", "2026-11-22T00:00:00Z")
    return obj


def with_record(obj: dict[str, Any], text: str) -> dict[str, Any]:
    """``obj`` with ``text`` as its ``retry-policy.dev/applied`` record."""
    changed = copy.deepcopy(obj)
    changed["metadata"]["annotations"][P + "applied"] = text
    return changed


def v1_of(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the previous version mutated it: the same, with its version-1 record
    (no ``v``, no rules' origins), as written before the record was versioned."""
    record = json.loads(obj["metadata"]["annotations"][P + "applied"])
    record.pop("v"), record.pop("origins", None)
    return with_record(obj, json.dumps(record, sort_keys=True, separators=(",", ":")))


def job_owner(name: str = "train", uid: str = "job-uid-1") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    uid: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview request for ``obj`` as the API server sends it. On CREATE the
    object must be shaped as the create handler hands it over (no system fields: see the
    module's doc); a test that needs otherwise builds the review itself."""
    if operation == "CREATE" and obj is not None:
        present = SYSTEM_FIELDS.intersection(obj.get("metadata") or {})
        assert not present, f"a CREATE review's object carries no {sorted(present)}"
    source = obj or old or {}
    api_version = source.get("apiVersion", "v1")
    group, _, version = api_version.rpartition("/")
    kind = source.get("kind", "Pod")
    plural = kind.lower() + "s"
    metadata = source.get("metadata") or {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": plural},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": plural},
            "name": metadata.get("name", ""),
            "namespace": metadata.get("namespace"),
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


#: What the API server assigns only after admission on CREATE.
SYSTEM_FIELDS = frozenset({"uid", "resourceVersion", "creationTimestamp"})


def leaves(value: Any, path: tuple = ()):
    """Every (path, scalar) of a document; nulls are skipped (null means unset in
    Kubernetes: filling one in loses nothing)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from leaves(child, (*path, index))
    elif value is not None:
        yield path, value


def decode_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    body = response["response"]
    if "patch" not in body:
        return []
    assert body["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(body["patch"]))


def apply(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.apply_patch(obj, patch) if patch else copy.deepcopy(obj)
