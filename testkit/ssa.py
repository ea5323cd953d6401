"""Server-side apply as the API server runs it, for the tests of a controller's re-apply:
enough of structured-merge-diff to build the UPDATE an admission webhook receives.

What the API server does with an apply patch (staging/src/k8s.io/apiserver/pkg/endpoints/
handlers/patch.go): ``patcher.applyPatch`` first applies it with the field manager
(``applyPatcher.applyPatchToCurrentObject`` -> ``FieldManager.Apply`` -> structured-merge-
diff's ``Updater.Apply``), defaults the result, and only then ``patcher.applyAdmission``
runs mutating admission on it (chained in that order by ``rest.DefaultUpdatedObjectInfo``);
the object does not exist yet -> ``createNewObject`` and a CREATE, else an UPDATE whose
``oldObject`` is the stored object. So managedFields never record what a mutating webhook
(or a defaulter) adds: such fields belong to no manager.

``apply`` below, for one manager's apply with ``force``:

- the manager's new field set is the fields of its configuration (``field_set``: leaves,
  the items of map lists, an atomic list as one leaf);
- the result is the live object with the configuration merged in: mappings field by
  field, items of map lists by their keys, anything else (a scalar, an atomic list)
  replaced whole;
- fields the manager owned before, no longer applies, and no other manager owns are
  removed (``Updater.Apply`` -> ``removeDisownedItems`` / prune);
- with force, fields other managers owned and this one applies change hands.

List types are those of the CRDs involved: ``x-kubernetes-list-type: map`` with its keys
for the lists below (JobSet CRD v0.11.1: ``replicatedJobs``, and the Kubernetes types it
embeds; TrainJob CRD v2.2.0: ``runtimePatches``); every other list is atomic (a CRD list
without ``x-kubernetes-list-type`` is atomic): a JobSet's ``failurePolicy.rules``, a Job's
``podFailurePolicy.rules``, ``command``, ``tolerations``...
"""

from __future__ import annotations

import copy
import json
from typing import Any

#: Map lists and their keys (``x-kubernetes-list-map-keys``), by field name: the webhook's
#: own table, held to the vendored CRDs by ``test_list_keys_are_the_crds``.
from webhook.kinds.trainjob.mutate import LIST_KEYS

Path = tuple[tuple[str, str], ...]


def _key(item: Any, keys: tuple[str, ...]) -> str:
    return json.dumps({k: item.get(k) for k in keys if k in item}, separators=(",", ":"))


def field_set(value: Any, name: str = "", prefix: Path = ()) -> set[Path]:
    """The fields a configuration sets, as paths of ("f", field) and ("k", item key)."""
    if isinstance(value, dict) and value:
        out: set[Path] = set()
        for key, sub in value.items():
            out |= field_set(sub, key, (*prefix, ("f", key)))
        return out
    if isinstance(value, list) and name in LIST_KEYS and value:
        out = set()
        for item in value:
            path = (*prefix, ("k", _key(item, LIST_KEYS[name])))
            out.add(path)
            if isinstance(item, dict):
                out |= field_set(item, "", path)
        return out
    return {prefix}


def fields_v1(paths: set[Path]) -> dict[str, Any]:
    """A field set as ``metadata.managedFields[].fieldsV1`` writes it."""
    root: dict[str, Any] = {}
    for path in paths:
        node = root
        for kind, key in path:
            node = node.setdefault(f"{kind}:{key}", {})
        if path and path[-1][0] == "k":
            node.setdefault(".", {})
    return root


def merge(live: Any, config: Any, name: str = "") -> Any:
    if isinstance(config, dict) and isinstance(live, dict):
        out = dict(live)
        for key, value in config.items():
            out[key] = merge(live.get(key), value, key)
        return out
    if isinstance(config, list) and isinstance(live, list) and name in LIST_KEYS:
        keys = LIST_KEYS[name]
        out_list = list(live)
        for item in config:
            found = next(
                (i for i, old in enumerate(out_list) if _key(old, keys) == _key(item, keys)), None
            )
            if found is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[found] = merge(out_list[found], item)
        return out_list
    return copy.deepcopy(config)


def _remove(obj: Any, path: Path) -> None:
    node = obj
    for kind, key in path[:-1]:
        node = _child(node, kind, key)
        if node is None:
            return
    kind, key = path[-1]
    if kind == "f" and isinstance(node, dict):
        node.pop(key, None)
    elif kind == "k" and isinstance(node, list):
        node[:] = [item for item in node if not _matches(item, key)]


def _child(node: Any, kind: str, key: str) -> Any:
    if kind == "f":
        return node.get(key) if isinstance(node, dict) else None
    return (
        next((item for item in node if _matches(item, key)), None)
        if isinstance(node, list)
        else None
    )


def _matches(item: Any, key: str) -> bool:
    wanted = json.loads(key)
    return isinstance(item, dict) and all(item.get(k) == v for k, v in wanted.items())


def apply(
    live: dict[str, Any],
    managed: dict[str, set[Path]],
    config: dict[str, Any],
    manager: str,
) -> tuple[dict[str, Any], dict[str, set[Path]]]:
    """``config`` applied by ``manager`` with force to ``live``, whose managers own
    ``managed``: the result and the new ownership."""
    new = field_set(config)
    result = merge(live, config)
    others = {m: owned - new for m, owned in managed.items() if m != manager}
    kept = set().union(*others.values()) if others else set()
    for path in sorted(managed.get(manager, set()) - new, key=len, reverse=True):
        if any(other[: len(path)] == path for other in kept):
            continue  # another manager still owns it, or something under it
        _remove(result, path)
    return result, {**others, manager: new}


def with_managed_fields(
    obj: dict[str, Any], managed: dict[str, set[Path]], api_version: str
) -> dict:
    """``obj`` with ``metadata.managedFields`` for ``managed`` (every entry an Apply)."""
    out = copy.deepcopy(obj)
    out.setdefault("metadata", {})["managedFields"] = [
        {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": api_version,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1(paths),
        }
        for manager, paths in sorted(managed.items())
    ]
    return out
