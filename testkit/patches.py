"""The patches the test API server applies, as the API server applies them: a JSON merge
patch (RFC 7386) and a strategic merge patch (k8s.io/apimachinery
pkg/util/strategicpatch), for the lists this suite patches."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    return _merged(target, patch, lambda key, old, value: merge_patch(old, value))


def _merged(target: Any, patch: Any, inner: Callable[[str, Any, Any], Any]) -> Any:
    """A patch's own value where it is not an object; else ``target`` with each key of
    ``patch`` removed (null) or merged by ``inner``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = inner(key, target.get(key), value)
    return target


#: Lists a strategic merge patch merges item by item, by this key (``patchMergeKey``):
#: a pod's ``status.conditions`` by ``type`` (k8s.io/api core/v1 types.go). Other lists
#: are replaced, as a merge patch does (none other is patched here).
MERGE_KEYS = {"conditions": "type"}


def strategic_patch(target: Any, patch: Any, key: str = "") -> Any:
    """A strategic merge patch, for the lists ``MERGE_KEYS`` names."""
    merge_key = MERGE_KEYS.get(key)
    if merge_key and isinstance(patch, list) and isinstance(target, list):
        merged = copy.deepcopy(target)
        for item in patch:
            found = next(
                (i for i, t in enumerate(merged) if t.get(merge_key) == item.get(merge_key)), None
            )
            if found is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[found] = strategic_patch(merged[found], item)
        return merged
    return _merged(target, patch, lambda name, old, value: strategic_patch(old, value, name))
