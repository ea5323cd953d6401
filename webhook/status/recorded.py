"""``retry-webhook status -f FILE``: the story told from recorded objects, without a cluster.

The file is what ``kubectl get ... -o yaml`` prints (a ``List``, or documents), read as the
offline commands read theirs (``webhook.offline.inputs``, given by ``webhook.cli``):

    kubectl get jobs,pods,events -n ml -o yaml > recorded.yaml

``RecordedReader`` answers the requests ``reader.Reader`` makes of the API server, from
those objects and with the same selection: by kind, namespace and name, by label selector
(``key=value``, comma-separated) and, for Events, by ``regarding.kind`` and
``regarding.name``. So the story is told by the very code that tells a live one. What the
file lacks is answered as the API would answer a request for it: a workload not in it is
not found, a namespace without LimitRanges has none; Nodes, which many users cannot list,
are unreadable unless the file holds some.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.kube.objects import mapping
from webhook.status.reader import Kind, StatusError, Unreadable

#: Core v1 Event fields and their events.k8s.io/v1 names, as the API server converts them
#: (``Convert_core_Event_To_v1_Event``, pkg/apis/events/v1/conversion.go; the core JSON
#: name of ``ReportingController`` is ``reportingComponent``).
CORE_EVENT_FIELDS = {
    "involvedObject": "regarding",
    "message": "note",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
    "source": "deprecatedSource",
    "reportingComponent": "reportingController",
}


#: What reads a file's documents (``webhook.offline.inputs.read``): each with ``obj``, the
#: object, or ``error``, what is wrong with the document (or the file) in words.
Documents = Callable[[str], Iterable[Any]]


def read(path: str, documents: Documents) -> list[dict[str, Any]]:
    """Every object of the file (``-``: stdin) as ``documents`` reads it; ``StatusError``
    naming the file and the first document that cannot be used."""
    objects = []
    for doc in documents(path):
        if doc.error:
            raise StatusError(f"{doc.error}; give a file kubectl get -o yaml wrote")
        objects.append(doc.obj)
    return [o for o in objects if isinstance(o, dict)]


def as_events_v1(event: Mapping[str, Any]) -> dict[str, Any]:
    """An Event as events.k8s.io/v1 serves it (a core v1 Event converted)."""
    if str(event.get("apiVersion") or "") == "events.k8s.io/v1":
        return dict(event)
    out = {CORE_EVENT_FIELDS.get(k, k): v for k, v in event.items()}
    out["apiVersion"] = "events.k8s.io/v1"
    return out


def _group(obj: Mapping[str, Any]) -> str:
    return str(obj.get("apiVersion") or "").rpartition("/")[0]


def _selected(obj: Mapping[str, Any], selector: str | None) -> bool:
    """Whether the labels match an equality selector (``a=b,c=d``), as the ones
    ``Reader`` sends."""
    labels = mapping(mapping(obj.get("metadata")).get("labels"))
    for term in (selector or "").split(","):
        if term:
            key, _, value = term.partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
    return True


class RecordedReader:
    """``reader.Reader``'s requests, answered from recorded objects."""

    #: No API to read a pod the file lacks (the failure history's fallback).
    core = None

    def __init__(self, objects: list[dict[str, Any]], source: str):
        self.source = source
        self.objects = [
            as_events_v1(o) if o.get("kind") == "Event" else o for o in objects if o.get("kind")
        ]

    def _of(self, kind: str, group: str, namespace: str | None) -> list[dict[str, Any]]:
        return [
            o
            for o in self.objects
            if o.get("kind") == kind
            and (_group(o) == group or kind == "Event")
            and (namespace is None or mapping(o.get("metadata")).get("namespace") == namespace)
        ]

    def namespace_of(self, kind: Kind, name: str) -> str | None:
        """The namespace of the one recorded ``kind`` named ``name`` (``None``: none, or
        several): a recording needs no ``-n`` to find its workload."""
        found = {
            mapping(o.get("metadata")).get("namespace")
            for o in self._of(kind.kind, kind.group, None)
            if mapping(o.get("metadata")).get("name") == name
        }
        return str(found.pop()) if len(found) == 1 and None not in found else None

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        for obj in self._of(kind.kind, kind.group, namespace):
            if mapping(obj.get("metadata")).get("name") == name:
                return obj
        what = f"{kind.kind} {namespace}/{name}"
        raise Unreadable(what, 404, f"HTTP 404 not found: not in {self.source}")

    def jobs(self, namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [o for o in self._of("Job", "batch", namespace) if _selected(o, label_selector)]

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return [o for o in self._of("Pod", "", namespace) if _selected(o, label_selector)]

    def events_regarding(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self._of("Event", "", namespace)
            if mapping(e.get("regarding")).get("kind") == kind
            and mapping(e.get("regarding")).get("name") == name
        ]

    def limit_ranges(self, namespace: str) -> list[dict[str, Any]]:
        return self._of("LimitRange", "", namespace)

    def nodes(self) -> list[dict[str, Any]]:
        found = self._of("Node", "", None)
        if not found:
            raise Unreadable("Nodes", None, f"none in {self.source}")
        return found
