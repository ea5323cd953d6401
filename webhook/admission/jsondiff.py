"""JSON Patch (RFC 6902) by diffing two JSON documents: ``diff(original, mutated)``.

The patch is always derived from the two objects, never written by hand at a mutation
site. This replaces ``jsonpatch.make_patch`` on the hot path: profiling showed it
spending three quarters of an admission in its list-matching heuristics (it serialises
list members to find moves). Our mutations only add keys, replace scalars and append to
lists, so this differ skips what the mutator left alone (the copy shares it:
``webhook.kube.owned``, so it is the very same object), walks the rest once, emits ``add``
for appended list items and ``replace`` for anything else, and never emits
``move``/``copy``. Property tests check that applying the result (with ``jsonpatch``,
and with Go's json-patch through kubectl) reproduces the mutated document exactly.

Scalars are compared by type and value: Python says ``0 == False == 0.0``, JSON does
not. The one whole-container comparison (are the items before an append unchanged?)
uses Python's C-speed ``==`` and confirms an equal answer by comparing JSON
serialisations (also C-speed), so no number-to-boolean edit can hide inside it.
"""

from __future__ import annotations

from operator import is_
from typing import Any

import orjson

Patch = list[dict[str, Any]]


def escape(token: str) -> str:
    """RFC 6901: ``~`` becomes ``~0`` and ``/`` becomes ``~1`` (in that order)."""
    if "~" in token or "/" in token:
        return token.replace("~", "~0").replace("/", "~1")
    return token


def diff(original: Any, mutated: Any) -> Patch:
    patch: Patch = []
    _diff(original, mutated, "", patch)
    return patch


def _diff(a: Any, b: Any, path: str, patch: Patch) -> None:
    if a is b:
        return
    kind = type(a)
    if kind is type(b):
        if kind is dict:
            _diff_dict(a, b, path, patch)
            return
        if kind is list:
            _diff_list(a, b, path, patch)
            return
        if a == b:  # (two scalars of one type: equal as JSON values too)
            return
    patch.append({"op": "replace", "path": path, "value": b})


def _diff_dict(a: dict, b: dict, path: str, patch: Patch) -> None:
    kept = 0
    for key, old in a.items():
        new = b.get(key, _ABSENT)
        if new is old:  # (shared by the copy: the usual case)
            kept += 1
            continue
        if new is _ABSENT:
            patch.append({"op": "remove", "path": f"{path}/{escape(key)}"})
            continue
        kept += 1
        # ``_diff``'s dispatch, inlined: this loop runs for every key on the way to a
        # change, and two calls a key were some 15% of the diff.
        kind = type(old)
        if kind is not type(new):
            patch.append({"op": "replace", "path": f"{path}/{escape(key)}", "value": new})
        elif kind is dict:
            _diff_dict(old, new, f"{path}/{escape(key)}", patch)
        elif kind is list:
            _diff_list(old, new, f"{path}/{escape(key)}", patch)
        elif old != new:
            patch.append({"op": "replace", "path": f"{path}/{escape(key)}", "value": new})
    if len(b) > kept:  # (only then has ``b`` a key ``a`` has not)
        for key, new in b.items():
            if key not in a:
                patch.append({"op": "add", "path": f"{path}/{escape(key)}", "value": new})


_ABSENT = object()


def _diff_list(a: list, b: list, path: str, patch: Patch) -> None:
    # The items are often the very same objects (``webhook.kube.owned`` shares them):
    # compared at C speed (``all(map(is_, ...))``).
    if len(b) == len(a) and all(map(is_, a, b)):
        return
    if len(b) > len(a):
        prefix = b[: len(a)]
        # The usual mutation: items appended (env vars, rules, requirements).
        kept = all(map(is_, a, prefix))
        if kept or (a == prefix and _same(a, prefix)):
            for index in range(len(a), len(b)):
                patch.append({"op": "add", "path": f"{path}/{index}", "value": b[index]})
            return
    common = min(len(a), len(b))
    for index in range(common):
        old, new = a[index], b[index]
        if old is not new and _differs(old, new):
            _diff(old, new, f"{path}/{index}", patch)
    for index in range(common, len(b)):
        patch.append({"op": "add", "path": f"{path}/{index}", "value": b[index]})
    # Remove from the end so earlier indices stay valid.
    for index in range(len(a) - 1, common - 1, -1):
        patch.append({"op": "remove", "path": f"{path}/{index}"})


def _differs(old: Any, new: Any) -> bool:
    """Whether ``_diff`` must look at this pair: two containers of one type always (it
    walks them once; comparing them whole first, at every level on the way down to the
    change, cost more than the walk), two scalars when they differ as JSON values (type
    first: in JSON, 1 and 1.0 and True are different values)."""
    kind = type(old)
    if kind is not type(new):
        return True
    return kind is dict or kind is list or old != new


def _same(a: Any, b: Any) -> bool:
    """For two containers Python found equal: are they equal as JSON too? (``[0]``,
    ``[0.0]`` and ``[False]`` are equal to Python, not in JSON.)"""
    try:
        return orjson.dumps(a) == orjson.dumps(b)
    except (TypeError, orjson.JSONEncodeError):  # values orjson cannot encode (huge ints)
        return _strict_equal(a, b)


def _strict_equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_strict_equal(v, b[k]) for k, v in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(_strict_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b
