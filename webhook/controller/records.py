"""Reading a workload and writing its record (``webhook.cluster.record``): the one place
the controller's reconcilers do either, so every writer of the annotation writes it the
same way: a merge patch of that one annotation carrying the ``resourceVersion`` the record
was computed from, which the API server refuses (409 Conflict) when the workload changed
since. A writer then reads it again and recomputes, so no writer's change is lost."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from webhook.cluster.events import WorkloadKind
from webhook.cluster.record import ANNOTATION, Record
from webhook.kinds.registry import WORKLOADS

MERGE_PATCH = "application/merge-patch+json"

#: The kinds declared ``read`` (``KindSpec.workload``: a JobSet), by the reconcilers' name
#: for them (their kind in lower case, "jobset"): read and patched as custom objects.
CUSTOM: dict[str, WorkloadKind] = {k.kind.lower(): k for k in WORKLOADS.read.values()}
_NAMED = {k.kind: name for name, k in CUSTOM.items()}

#: The workload a Job's pod belongs to, for its Events and its budget, by what the kinds
#: declare of their pods' labels (``Workloads.of_stored_pod``).
workload_of = WORKLOADS.of_stored_pod


class Workloads:
    """Jobs and JobSets, read and patched through one API client."""

    def __init__(self, api_client: Any):
        from kubernetes import client

        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The workload (``kind`` "job" or "jobset"), or ``None`` when it is gone."""
        try:
            if kind == "job":
                resp = self.batch.read_namespaced_job(name, namespace, _preload_content=False)
            else:
                custom = CUSTOM[kind]
                resp = self.custom.get_namespaced_custom_object(
                    custom.group,
                    custom.version,
                    namespace,
                    custom.plural,
                    name,
                    _preload_content=False,
                )
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return None
            raise
        result: dict[str, Any] = json.loads(resp.data)
        return result

    def current(self, kind: str, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The workload as it is now, if it is still the one of ``uid`` (``None``: gone,
        or replaced by another of the same name)."""
        obj = self.read(kind, namespace, name)
        meta = (obj or {}).get("metadata")
        if obj is None or not isinstance(meta, dict) or meta.get("uid") != uid:
            return None
        return obj

    def of(self, regarding: Any) -> tuple[str, dict[str, Any]] | None:
        """The workload an Event regards (``cluster.events.Regarding``: a Job or a JobSet)
        as it is now, with its kind ("job" or "jobset"); ``None``: gone or replaced."""
        kind = _NAMED.get(regarding.kind, "job")
        obj = self.current(kind, regarding.namespace, regarding.name, regarding.uid)
        return None if obj is None else (kind, obj)

    def write_record(
        self,
        kind: str,
        namespace: str,
        name: str,
        text: str,
        version: str,
        backoff_limit: int | None = None,
    ) -> dict[str, Any]:
        """Our one annotation, with the resourceVersion it was computed from; and with
        ``backoff_limit``, a Job's ``spec.backoffLimit`` in the same patch (mutable:
        ``ValidateJobSpecUpdate``), so that the record says exactly what was lowered."""
        body: dict[str, Any] = {
            "metadata": {"resourceVersion": version, "annotations": {ANNOTATION: text}}
        }
        if backoff_limit is not None and kind == "job":
            body["spec"] = {"backoffLimit": backoff_limit}
        if kind == "job":
            resp = self.batch.patch_namespaced_job(
                name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False
            )
        else:
            custom = CUSTOM[kind]
            resp = self.custom.patch_namespaced_custom_object(
                custom.group,
                custom.version,
                namespace,
                custom.plural,
                name,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        result: dict[str, Any] = json.loads(resp.data)
        return result


S = TypeVar("S")
#: What a ``WorkloadStates`` makes a state of: the workload's kind ("job" or "jobset"),
#: the Event reference it was read for, its resourceVersion and record as read, and the
#: object itself.
Make = Callable[[str, Any, str, Record, Mapping[str, Any]], S]


class WorkloadStates(OrderedDict[tuple[str, str], S], Generic[S]):
    """Per-workload state of a reconciler, keyed by (namespace, UID), made from the
    workload as read (``Workloads.of``) the first time it is asked for, and kept for the
    ``most`` workloads asked for last: the oldest goes first, but never one with writes
    still to make (``busy``), which stays however many come."""

    def __init__(self, workloads: Workloads, make: Make[S], busy: Callable[[S], bool], most: int):
        super().__init__()
        self.workloads = workloads
        self.make = make
        self.busy = busy
        self.most = most

    def of(self, regarding: Any) -> S | None:
        """The workload's state: kept, else read (``None``: it is gone or replaced)."""
        key = (regarding.namespace, regarding.uid)
        known = self.get(key)
        if known is not None:
            self.move_to_end(key)
            return known
        found = self.workloads.of(regarding)
        if found is None:
            return None
        kind, obj = found
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        state = self.make(kind, regarding, version, Record.of(obj) or Record(), obj)
        self[key] = state
        while len(self) > self.most:
            oldest = next(iter(self))
            if self.busy(self[oldest]):
                break
            del self[oldest]
        return state
