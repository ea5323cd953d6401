"""Reading objects that may hold a field of the wrong JSON type: only a file can (the API
server refuses them), and the dry-run must say what is wrong rather than crash."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a mapping, else an empty one: a field of the wrong JSON type
    reads as absent (only a file can hold one: the API server refuses them)."""
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one (as ``mapping``, for list fields)."""
    return value if isinstance(value, list) else []


def controller_of(metadata: Any) -> dict[str, Any] | None:
    """The owner reference with ``controller: true``, if any: the controller that made
    the object and manages it."""
    refs = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def get_path(obj: Any, path: Sequence[str | int]) -> Any:
    """The value at ``path`` (keys and list indexes), ``None`` where it is not there."""
    for part in path:
        if isinstance(part, int):
            obj = obj[part] if isinstance(obj, list) and 0 <= part < len(obj) else None
        else:
            obj = obj.get(part) if isinstance(obj, dict) else None
    return obj
