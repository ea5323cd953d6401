"""The LimitRanges of every namespace, for memory raises that LimitRanger lets through.

A raise after an OOM kill (``webhook.kinds.pod``) must stay within the namespace's
LimitRanges (``webhook.kube.limitrange`` says what they refuse), and a workload whose
``oom-memory-limit`` is above what they allow is told so at its admission. Admission
must not ask the API per pod, so ``LimitRangeCache`` lists and watches LimitRanges (a
cluster has few, and they change rarely) and answers from memory: the tightest memory
bounds of a namespace, computed when a LimitRange changes.

Until the first list (at start, or when it fails: RBAC, an API outage) the bounds are
unknown and a pod is admitted without a raise, with a warning: a raise that the
namespace refuses would cost more (the Job controller retries the pod's creation, with
back-off, until the Job's deadline). A relist swaps in the new LimitRanges at once, so
no lookup sees half a list.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.cluster.informer import ListedWhole
from webhook.kube.limitrange import NONE, MemoryLimits, memory_limits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LimitQuestion:
    """What a policy run asks (``webhook.admission.memo`` records it with the answer)."""

    namespace: str


@dataclass(frozen=True)
class LimitLookup:
    """A namespace's memory bounds; ``known`` false when they cannot be told (``reason``)."""

    known: bool
    limits: MemoryLimits = NONE
    reason: str = ""


#: What a source that reads no LimitRanges answers (the offline CLI, tests that model no
#: namespace): none, as in a namespace without any.
NO_LIMITS = LimitLookup(True)


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the bounds are made of: a LimitRange's name and its memory ``max`` and
    ``maxLimitRequestRatio`` per type."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    items = []
    for item in spec.get("limits") or []:
        if not isinstance(item, dict):
            continue
        kept: dict[str, Any] = {"type": item.get("type")}
        for field in ("max", "maxLimitRequestRatio"):
            values = item.get(field)
            if isinstance(values, dict) and "memory" in values:
                kept[field] = {"memory": values["memory"]}
        if len(kept) > 1:
            items.append(kept)
    return {
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": {"limits": items},
    }


class LimitRangeCache(ListedWhole):
    """Watch-backed LimitRanges of all namespaces, as memory bounds per namespace."""

    def __init__(self, core_api: Any):
        super().__init__(
            "limitranges", core_api.list_limit_range_for_all_namespaces, "limit range cache"
        )
        #: (``_objects``: namespace -> LimitRange uid -> slim LimitRange.) The bounds of
        #: each namespace that has LimitRanges.
        self._bounds: dict[str, MemoryLimits] = {}
        self._counters = {"lookups": 0, "unknown": 0}

    # --- store updates (informer thread, lock held) --------------------------------
    def _store(self, store: dict[Any, Any], kind: str, obj: Mapping[str, Any]) -> Any:
        meta = obj.get("metadata") or {}
        uid, namespace = meta.get("uid"), meta.get("namespace")
        if not uid or not isinstance(namespace, str):
            return None
        ranges = store.setdefault(namespace, {})
        if kind == "DELETED":
            ranges.pop(uid, None)
        else:
            ranges[uid] = slim(obj)
        if not ranges:
            del store[namespace]
        return namespace

    def _refresh(self, keys: set[Any] | None) -> None:
        for namespace in self._objects if keys is None else keys:
            ranges = self._objects.get(namespace)
            if ranges:
                self._bounds[namespace] = memory_limits(ranges.values())
            else:
                self._bounds.pop(namespace, None)
        if keys is None:
            self._bounds = {ns: b for ns, b in self._bounds.items() if ns in self._objects}

    # --- lookups (hot path: a dictionary lookup) -------------------------------------
    def limit_ranges(self, namespace: str) -> LimitLookup:
        self._counters["lookups"] += 1
        informer = self._informers[0]
        if not informer.synced.is_set():
            self._counters["unknown"] += 1
            why = informer.last_error or "not listed yet"
            return LimitLookup(False, reason=f"LimitRanges unreadable: {why}")
        with self._lock:
            bounds = self._bounds.get(namespace, NONE)
        return LimitLookup(True, bounds)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            namespaces = len(self._bounds)
        return {
            "synced": self.synced,
            "namespaces": namespaces,
            "watch_errors": sum(i.errors for i in self._informers),
            **self._counters,
        }
