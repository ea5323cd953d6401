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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import orjson

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def user_wrote(obj: Mapping[str, Any], path: Sequence[str]) -> bool | None:
    """Whether the user's own manifest set the field at ``path`` (``None``: unknown)."""
    metadata = obj.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    raw = annotations.get(LAST_APPLIED) if isinstance(annotations, dict) else None
    if isinstance(raw, str):
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
            fields_path = [f"f:{part}" for part in path]
            return any(_has_path(fields, fields_path) for fields in applies if fields)
    return None


@lru_cache(maxsize=256)
def _parse_record(raw: str) -> Any:
    """One parse per record, however many fields a request asks about (results are only
    read, never modified, so sharing them is safe)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _has_path(data: Any, path: Sequence[str]) -> bool:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def explicit(obj: Mapping[str, Any], path: Sequence[str], value: Any, api_default: Any) -> bool:
    """Whether ``value`` at ``path`` expresses the user's intent, not API defaulting."""
    if value is None:
        return False
    wrote = user_wrote(obj, path)
    if wrote is not None:
        return wrote
    return value != api_default
