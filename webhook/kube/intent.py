"""Tell fields a user wrote from fields the API server defaulted.

Objects reach admission webhooks already defaulted: a Job whose manifest has no
``backoffLimit`` arrives with ``backoffLimit: 6``. A webhook cannot see the difference
from the object alone, so this module reads the two records of intent the API server
keeps, in this order:

1. ``kubectl.kubernetes.io/last-applied-configuration`` (client-side ``kubectl apply``):
   the manifest exactly as the user wrote it.
2. ``metadata.managedFields`` entries with ``operation: Apply`` (server-side apply): the
   fields the applier owns. (``Update`` entries are not used: on create they also list
   defaulted fields, so they cannot tell.)

When neither exists (``kubectl create``, client libraries), the answer is ``None``
(unknown) and callers fall back to: a value equal to the API default was not written.

A path is a sequence of keys and list indexes, e.g. ``("spec", "replicatedJobs", 0,
"template", "spec", "backoffLimit")``: templates nested in lists (a JobSet's replicated
Jobs) are looked up at their real location, and ``dotted`` names it the way messages do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import orjson

from webhook.kube.wellknown import LAST_APPLIED

Path = Sequence[str | int]


def dotted(path: Path) -> str:
    """A field path as users read it: ``spec.replicatedJobs[0].template.spec``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else ("." if text else "") + part
    return text


def user_wrote(obj: Mapping[str, Any], path: Path) -> bool | None:
    """Whether the user's own manifest set the field at ``path`` (``None``: unknown)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return None
    annotations = metadata.get("annotations")
    raw = annotations.get(LAST_APPLIED) if isinstance(annotations, dict) else None
    if isinstance(raw, str):
        if _never_named(raw, path):
            return False
        applied = _parse_record(raw)
        if isinstance(applied, dict):
            return _has_path(applied, path)
    managed = metadata.get("managedFields")
    if isinstance(managed, list):
        applies = [
            entry.get("fieldsV1")
            for entry in managed
            if isinstance(entry, dict) and entry.get("operation") == "Apply"
        ]
        if applies:
            fields_path = _fields_path(obj, path)
            if fields_path is None:
                return None
            return any(_has_path(fields, fields_path) for fields in applies if fields)
    return None


def _never_named(raw: str, path: Path) -> bool:
    """A cheap certain "not written": the record never names the field (as a JSON key,
    quoted; with no escape sequences that could spell it otherwise). Each new Job's
    record is new, and most do not set the fields a policy asks about, so the parse is
    mostly skipped."""
    last = path[-1] if path else None
    return (
        isinstance(last, str) and raw.startswith("{") and f'"{last}"' not in raw and "\\" not in raw
    )


@lru_cache(maxsize=16)
def _parse_record(raw: str) -> Any:
    """One parse per record, however many fields a request asks about (results are only
    read, never modified, so sharing them is safe). Small: records may be large, and only
    the few requests in flight need theirs."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _has_path(data: Any, path: Path) -> bool:
    for part in path:
        if isinstance(part, int):
            if not isinstance(data, list) or not 0 <= part < len(data):
                return False
        elif not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _fields_path(obj: Mapping[str, Any], path: Path) -> list[str] | None:
    """The ``fieldsV1`` keys of ``path``: ``f:<field>``, and ``k:{"name":...}`` for an item of
    a list keyed by name (``x-kubernetes-list-type: map``, as a JobSet's replicatedJobs).
    ``None`` when a list item has no name to key it by: server-side apply then owns the
    list as a whole, which says nothing about the fields inside it."""
    keys: list[str] = []
    node: Any = obj
    for part in path:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str):
                return None
            keys.append("k:" + orjson.dumps({"name": name}).decode())
            node = item
        else:
            keys.append(f"f:{part}")
            node = node.get(part) if isinstance(node, dict) else None
    return keys


def explicit(obj: Mapping[str, Any], path: Path, value: Any, api_default: Any) -> bool:
    """Whether ``value`` at ``path`` expresses the user's intent, not API defaulting."""
    if value is None:
        return False
    wrote = user_wrote(obj, path)
    if wrote is not None:
        return wrote
    return value != api_default
