"""What a policy run asks of the cluster besides the object: ``ClusterFacts``.

Four questions, each answered from a watch-backed cache in the server (never a request
per admission when a cache can answer) and from what was given or read elsewhere (the
offline CLI, ``status``):

- ``job_failures``: a Job's counted failures, the attempt number of its next pod
  (``webhook.cluster.attempts``);
- ``job_history``: how the earlier attempts of a pod's lineage failed: OOM kills, failed
  nodes (``webhook.cluster.history``);
- ``limit_ranges``: a namespace's memory bounds (``webhook.cluster.limits``);
- ``placement``: whether a Ready node remains for a pod kept off failed nodes
  (``webhook.cluster.nodes``).

``NoCluster`` answers all four as a process without an API connection must: unknown
where the answer would need the cluster, none where none is the honest answer (no
LimitRanges given is as a namespace without any).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from webhook.cluster.attempts import AttemptLookup
from webhook.cluster.history import HistoryKey, HistoryLookup, unknown
from webhook.cluster.limits import NO_LIMITS, LimitLookup, slim
from webhook.cluster.nodes import NO_NODES, NodeAnswer
from webhook.kube.limitrange import memory_limits
from webhook.kube.scheduling import Placement


class ClusterFacts(Protocol):
    """The questions a mutator asks of the cluster (``Context.cluster``)."""

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup: ...

    def job_history(self, key: HistoryKey) -> HistoryLookup: ...

    def limit_ranges(self, namespace: str) -> LimitLookup: ...

    def placement(self, question: Placement) -> NodeAnswer: ...

    def stats(self) -> dict[str, Any]: ...


class NoCluster:
    """No API connection (dry-run, local development): every lookup is unknown, and no
    namespace has LimitRanges."""

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        return AttemptLookup(None, "none", "no connection to a cluster")

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        return unknown("no connection to a cluster")

    def limit_ranges(self, namespace: str) -> LimitLookup:
        return NO_LIMITS

    def placement(self, question: Placement) -> NodeAnswer:
        return NO_NODES

    def stats(self) -> dict[str, Any]:
        return {"enabled": False}


class GivenLimits(NoCluster):
    """The LimitRanges among a set of objects (the documents of one CLI input), as the
    offline engine's cluster: a workload is judged against those of its namespace (none
    given: none, as in a namespace without any)."""

    def __init__(self, objects: Iterable[Mapping[str, Any]], namespace: str | None = None):
        self._by_namespace: dict[str, list[dict[str, Any]]] = {}
        for obj in objects:
            if obj.get("kind") == "LimitRange" and obj.get("apiVersion") == "v1":
                meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
                ns = meta.get("namespace") or namespace or "default"
                self._by_namespace.setdefault(str(ns), []).append(slim(obj))

    def limit_ranges(self, namespace: str) -> LimitLookup:
        given = self._by_namespace.get(namespace or "default")
        return LimitLookup(True, memory_limits(given)) if given else NO_LIMITS
