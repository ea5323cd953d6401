"""Kubernetes Events (``events.k8s.io/v1``) for what the webhook decided, where users look.

Users see ``kubectl describe job`` and ``kubectl get events``, not our logs or metrics, so
each decision that shapes a new pod, and each Job our rules failed, becomes an Event
regarding the workload they applied. Events are written off the admission path: ``emit``
only puts the Event on a bounded queue (full: the Event is dropped and counted), and one
thread per process writes them. An API error on an Event is retried a few times, then
dropped: it never reaches an admission.

Repeats are aggregated, not multiplied, across every process and replica: an Event's
name is derived from what it says (the workload's UID, type, reason and note), so the
same decision made again (a reinvocation, a pod creation the API refused and the Job
controller tried again, another replica admitting the next attempt's twin) finds the
Event already there (409 AlreadyExists) and counts itself into its ``series``, as
client-go's event broadcaster does for isomorphic events (``recordToSink`` in
tools/events/event_broadcaster.go; it keys on the reason but not the note, which would
fold "attempt 2" and "attempt 3" into one Event, hence the note in our key). Each
workload gets at most ``burst`` new Events, then one per ``refill_seconds`` (client-go's
spam filter for core Events: 25, one per 5 minutes). Repeats still queued are counted
into the queued Event (one write for a burst of a thousand pods' same decision), and
repeats of an Event already written are held and counted into its series at most once
every ``series_seconds`` (and when the recorder is flushed or stopped): client-go writes a
series' second occurrence, then only every ``refreshTime`` (30 minutes) or when the series
ends (``finishSeries``, 6 minutes without one); a repeat here waits half a minute at most,
one write where each repeat made one.

Regarding the workload the user applied (``Workloads``: what each kind declares, its
``KindSpec.workload``, handed in by the layers that know the kinds): a Job, the JobSet of
a JobSet's child Job, the TrainJob of a Kubeflow Trainer JobSet. What a pod
carries says the first two at admission (its owner reference; JobSet's ``jobset-name``
and ``jobset-uid`` labels); whether a JobSet is a TrainJob's, and the TrainJob's UID, only
the JobSet says (the trainer names it after the TrainJob and makes the TrainJob its
controller owner, ``JobSet.Build`` in pkg/runtime/framework/plugins/jobset/jobset.go; it
labels neither the JobSet's pods nor its Jobs with the TrainJob): the writer thread asks
for the JobSet once (``WorkloadResolver``, cached), never the admission. ``kubectl
describe`` finds Events by the object's name, namespace, kind *and* UID (``searchEvents``
in k8s.io/kubectl pkg/describe/describe.go), so an Event whose UID cannot be told is not
written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from webhook.kube.objects import controller_of, mapping
from webhook.kube.wellknown import NAMESPACE_TERMINATING
from webhook.policy.model import PREFIX

log = logging.getLogger(__name__)

REPORTING_CONTROLLER = "retry-policy.dev/webhook"
#: The API server's limit on an Event's note (``ValidateEventCreate``: 1 kB).
MAX_NOTE = 1024
#: Reasons the webhook writes: a fixed set, so that users and alerts can match on them.
REASONS = frozenset(
    {
        "RetryMemoryIncreased",
        "RetryNodesAvoided",
        "RetryOnNonSpot",
        "RetryDelayed",
        "RetryDelaySkipped",
        "RetryPolicyFailedJob",
        "RetryDisruptionCounted",
        "RetryInPlaceBudgetExhausted",
        "RetryDisruptionRecognized",
        "RetryPolicyWriteFailed",
        "RetryPolicyAudit",
        "RetryFailureClassified",
    }
)
#: Decisions that are Warnings: a retry delay asked for but not kept (no controller led to
#: end its gate, so the pod ran at once). Every other decision is Normal.
WARNING_DECISIONS = frozenset({"RetryDelaySkipped"})


def decision_type(reason: str) -> str:
    return "Warning" if reason in WARNING_DECISIONS else "Normal"


#: The ``result`` label of the Events metric: a new Event created, a repeat counted into
#: an existing one's series, an Event lost (queue full, rate limit, API errors), an Event
#: nobody could read (its namespace is being deleted: client-go's ``recordEvent`` in
#: tools/record/event.go does not report that as an error either).
RESULTS = ("written", "aggregated", "dropped", "moot")

JOB_API = "batch/v1"


@dataclass(frozen=True)
class Regarding:
    """The object an Event is about: the workload the user applied."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    def to_json(self) -> dict[str, str]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }


@dataclass(frozen=True)
class Event:
    """One thing to tell a user: ``type`` Normal or Warning, a reason from ``REASONS``,
    a plain note, and ``action`` (what the webhook did: Admit, Record, Release...)."""

    regarding: Regarding
    type: str
    reason: str
    note: str
    action: str = "Admit"
    #: Said once: a repeat (a restarted controller seeing the same failed Job again)
    #: finds the Event there and adds nothing to it.
    once: bool = False

    def name(self) -> str:
        """Deterministic: the same decision about the same workload is the same Event."""
        digest = hashlib.sha256(
            "\0".join((self.regarding.uid, self.type, self.reason, self.note)).encode()
        ).hexdigest()[:16]
        return f"{self.regarding.name[:200]}.{digest}"


#: On the queue: write the repeats held now (``flush``).
_SERIES: Any = object()


def micro_time(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class EventRecorder:
    """Queue and write Events; ``emit`` never blocks nor raises."""

    api: Any  # kubernetes.client.EventsV1Api, or None: Events are counted, not written
    instance: str  # reportingInstance: this replica (its pod name)
    capacity: int = 1000
    burst: int = 25
    refill_seconds: float = 300.0
    tries: int = 3
    retry_seconds: float = 1.0
    #: How long repeats of a written Event are held before their series is written.
    series_seconds: float = 30.0
    clock: Callable[[], float] = time.time
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "queued": 0,
            "written": 0,
            "aggregated": 0,
            "dropped": 0,
            "moot": 0,
        }
    )

    #: The workload an Event regards, as the writer thread resolves it (a JobSet's
    #: TrainJob: ``WorkloadResolver.resolve``); ``None`` drops the Event.
    resolve: Callable[[Regarding], Regarding | None] | None = None

    def __post_init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(self.capacity)
        #: Events queued and not yet taken by the writer, with how many times each was
        #: emitted meanwhile.
        self._pending: dict[Event, int] = {}
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._known: OrderedDict[str, str] = OrderedDict()  # names this process wrote
        #: Repeats held for an Event written: name -> [the Event, repeats, when due].
        self._series: OrderedDict[str, list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- the caller's side: never blocks ------------------------------------------------
    def emit(self, event: Event) -> bool:
        """Queue ``event`` (or count it into the same Event still queued); ``False`` when
        it was dropped (queue full)."""
        if self._thread is None:
            self.start()
        with self._lock:
            if event in self._pending:
                self._pending[event] += 1
                self.counters["queued"] += 1
                return True
            try:
                self._queue.put_nowait(event)
            except queue.Full:
                self.counters["dropped"] += 1
                return False
            self._pending[event] = 1
            self.counters["queued"] += 1
        return True

    def start(self) -> EventRecorder:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="events", daemon=True)
                self._thread.start()
        return self

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued Event was handled, and the repeats held written
        (tests, and a stop)."""
        deadline = time.monotonic() + timeout
        if self._thread is not None and self._thread.is_alive():  # (not after ``stop``)
            try:
                self._queue.put(_SERIES, timeout=timeout)
            except queue.Full:
                return False
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counters[what] = self.counters.get(what, 0) + n

    # --- the writer thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                event = self._queue.get(timeout=self._until_due())
            except queue.Empty:
                self._write_series(time.monotonic())
                continue
            times = 1
            try:
                if event is None or event is _SERIES:
                    self._write_series(None)
                    if event is None:
                        return
                    continue
                with self._lock:
                    times = self._pending.pop(event, 1)
                self._write(event, times)
                self._write_series(time.monotonic())  # (a queue never empty: still due)
            except Exception:  # the thread must outlive anything
                log.exception("event not written")
                self._count("dropped", times)
            finally:
                self._queue.task_done()

    def _until_due(self) -> float | None:
        """Seconds until the first held series is due (``None``: none held)."""
        if not self._series:
            return None
        return max(0.0, next(iter(self._series.values()))[2] - time.monotonic())

    def _hold(self, event: Event, name: str, times: int) -> None:
        """Count repeats of an Event written into its series, written when due."""
        held = self._series.get(name)
        if held is not None:
            held[1] += times
            return
        self._series[name] = [event, times, time.monotonic() + self.series_seconds]
        while len(self._series) > self.capacity:  # bounded: the oldest is written now
            oldest = next(iter(self._series))
            self._write_held(oldest, *self._series.pop(oldest)[:2])

    def _write_series(self, now: float | None) -> None:
        """Write the series held and due by ``now`` (``None``: all of them)."""
        while self._series:
            name, (event, times, due) = next(iter(self._series.items()))
            if now is not None and due > now:
                return
            del self._series[name]
            self._write_held(name, event, times)

    def _write_held(self, name: str, event: Event, times: int) -> None:
        def gone() -> None:  # (the API server's Event TTL): written anew
            with self._lock:
                self._known.pop(name, None)
            self._write(event, times)

        self._tried(lambda: self._count_into(event, name, times), event, times, gone)

    def _allowed(self, event: Event) -> bool:
        """The per-workload spam filter: a token bucket per UID (repeats of an Event
        already written do not take a token: they only count up its series)."""
        now = self.clock()
        key = event.regarding.uid
        bucket = self._buckets.pop(key, None) or _Bucket(float(self.burst), now)
        bucket.tokens = min(
            float(self.burst), bucket.tokens + (now - bucket.updated) / self.refill_seconds
        )
        bucket.updated = now
        self._buckets[key] = bucket
        while len(self._buckets) > 10_000:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _write(self, event: Event, times: int = 1) -> None:
        """Write ``event``, which was emitted ``times`` times since it was queued (an
        Event said ``once`` is said once however often it was emitted)."""
        if event.once:
            times = 1
        if self.api is None:
            self._count("written")
            self._count("aggregated", times - 1)
            return
        if self.resolve is not None:
            regarding = self.resolve(event.regarding)
            if regarding is None:
                self._count("dropped", times)
                return
            event = dataclasses.replace(event, regarding=regarding)
        name = event.name()
        if name not in self._known and not self._allowed(event):
            self._count("dropped", times)
            return
        self._tried(lambda: self._create_or_count(event, name, times), event, times)

    def _tried(
        self,
        act: Callable[[], None],
        event: Event,
        times: int,
        gone: Callable[[], None] | None = None,
    ) -> None:
        """``act``, tried ``tries`` times: an API error again after a back-off, a refusal
        (a 4xx but 409 and 429) at once: ``moot`` where the namespace is being deleted
        or gone, else ``dropped``; with ``gone``, a 404 of the Event itself is its."""
        for attempt in range(self.tries):
            try:
                act()
                return
            except Exception as err:
                status = getattr(err, "status", None)
                if status is not None and 400 <= status < 500 and status not in (409, 429):
                    if namespace_terminating(err):
                        ns = event.regarding.namespace
                        log.debug("event not written: namespace %s is being deleted", ns)
                        self._count("moot", times)
                    elif status == 404 and gone is not None:
                        gone()
                    else:
                        log.warning("event refused: HTTP %s %s", status, _body(err))
                        self._count("dropped", times)
                    return
                if attempt + 1 < self.tries:
                    time.sleep(self.retry_seconds * (attempt + 1))
        self._count("dropped", times)

    def _create_or_count(self, event: Event, name: str, times: int = 1) -> None:
        """Create the Event, or hold these repeats for the existing one's series
        (``_hold``). An Event said ``once`` that exists is left as it is."""
        ns = event.regarding.namespace
        now = micro_time(self.clock())
        if event.once and name in self._known:
            return
        if name not in self._known:
            body = {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": ns},
                "eventTime": now,
                "reportingController": REPORTING_CONTROLLER,
                "reportingInstance": self.instance[:128] or "retry-policy-webhook",
                "action": event.action,
                "reason": event.reason,
                "regarding": event.regarding.to_json(),
                "note": event.note[:MAX_NOTE],
                "type": event.type,
            }
            if times > 1:  # a series starts at 2 (``validateV1EventSeries``)
                body["series"] = {"count": times, "lastObservedTime": now}
            try:
                self.api.create_namespaced_event(ns, body, _preload_content=False)
                self._remember(name)
                self._count("written")
                self._count("aggregated", times - 1)
                return
            except Exception as err:
                if getattr(err, "status", None) != 409:
                    raise
                self._remember(name)
                if event.once:
                    return
        self._hold(event, name, times)

    def _count_into(self, event: Event, name: str, times: int) -> None:
        """Count ``times`` repeats into the existing Event's series: a read, then an
        update with its resourceVersion (a concurrent writer's 409: read again)."""
        ns = event.regarding.namespace
        resp = self.api.read_namespaced_event(name, ns, _preload_content=False)
        existing = json.loads(resp.data)
        series = existing.get("series") or {}
        count = int(series.get("count") or 1) + times
        existing["series"] = {"count": count, "lastObservedTime": micro_time(self.clock())}
        self.api.replace_namespaced_event(name, ns, existing, _preload_content=False)
        self._remember(name)
        self._count("aggregated", times)

    def _remember(self, name: str) -> None:
        with self._lock:
            self._known[name] = name
            self._known.move_to_end(name)
            while len(self._known) > 10_000:
                self._known.popitem(last=False)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "queue": self._queue.qsize()}


def namespace_terminating(err: Exception) -> bool:
    """Whether the API server refused a create because the namespace is being deleted
    (``errors.HasStatusCause(err, v1.NamespaceTerminatingCause)``; a cause's type is
    ``reason`` on the wire), or is gone (404 with the namespace as the details' kind:
    the lifecycle admission plugin's ``errors.NewNotFound(v1.Resource("namespaces"))``;
    a held repeat can outlive its namespace)."""
    details = _details(err)
    if getattr(err, "status", None) == 404 and details.get("kind") == "namespaces":
        return True
    causes = details.get("causes")
    return isinstance(causes, list) and any(
        isinstance(c, dict) and c.get("reason") == NAMESPACE_TERMINATING for c in causes
    )


def _details(err: Exception) -> dict[str, Any]:
    body = getattr(err, "body", None)
    try:
        status = json.loads(body) if isinstance(body, (str, bytes)) else None
    except ValueError:
        return {}
    details = status.get("details") if isinstance(status, dict) else None
    return details if isinstance(details, dict) else {}


def _body(err: Exception) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    return str(body or "")[:200]


class EventSink(Protocol):
    """Where Events go: an ``EventRecorder``, or ``NoEvents``."""

    def emit(self, event: Event) -> bool: ...

    def stats(self) -> dict[str, int]: ...

    def flush(self, timeout: float = 5.0) -> bool: ...


class NoEvents:
    """Where no Event can be written (dry-run, the CLI, no cluster)."""

    def emit(self, event: Event) -> bool:
        return False

    def stats(self) -> dict[str, int]:
        return {}

    def flush(self, timeout: float = 5.0) -> bool:
        return True


# --- the workload the user applied ---------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What a kind declares (its ``KindSpec.workload``) of how Events find its objects from
    what they made; the kinds' declarations, gathered (``Workloads``), are handed to what
    finds a pod's or a Job's workload, this module names no kind."""

    #: Its child Jobs regard it, not themselves (``Workloads.of_job``).
    regards_jobs: bool = False
    #: The labels (name, UID) its Jobs' pods carry with its name and UID, told at their
    #: admission (``Workloads.of_pod``); ``None``: its pods name it only as their owner.
    pod_labels: tuple[str, str] | None = None
    #: Read from the API (once, cached: ``WorkloadResolver``) when an Event regards it: for
    #: what stands for it (its controller owner, see ``stands_for_owned``) and its UID.
    read: bool = False
    #: Stands for the objects it is the controller owner of, when those are read.
    stands_for_owned: bool = False
    #: Its record (``webhook.cluster.record``) is the one its pods' history questions
    #: read, by their set's UID (``HistoryKey.jobset``): kept by a watch of its objects.
    pod_records: bool = False


@dataclass(frozen=True)
class WorkloadKind:
    """A kind and its ``Workload`` declaration, as ``Workloads`` is handed them."""

    group: str
    version: str
    kind: str
    plural: str
    workload: Workload

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


class Workloads:
    """The kinds' ``Workload`` declarations, gathered by the layers that know the kinds
    (``kinds.registry.WORKLOADS``), and what they tell of a pod's or a Job's workload."""

    def __init__(self, kinds: Iterable[WorkloadKind]) -> None:
        self.kinds = tuple(kinds)
        #: (name label, UID label, kind) of each kind whose pods say it in labels.
        self.pod_labels = tuple(
            (*k.workload.pod_labels, k) for k in self.kinds if k.workload.pod_labels
        )
        self.regards_jobs = frozenset(
            (k.group, k.kind) for k in self.kinds if k.workload.regards_jobs
        )
        self.read = {(k.group, k.kind): k for k in self.kinds if k.workload.read}
        self.stands_for_owned = frozenset(
            (k.group, k.kind) for k in self.kinds if k.workload.stands_for_owned
        )
        #: The kind whose records pods read (one: a pod's question names one set).
        self.pod_records = next((k for k in self.kinds if k.workload.pod_records), None)

    def of_pod(self, metadata: Any, namespace: str | None) -> Regarding | None:
        """The workload a controller's pod belongs to, as its CREATE review tells: a Job's
        pod that carries a kind's labels (a JobSet's: ``jobset-name``) regards that kind's
        object (its UID from the UID label, else "" for the resolver to fill in), a Job's
        pod its Job, any other controller's pod that controller (a PyTorchJob...).
        ``None`` for a pod no controller made: its own UID is assigned after admission
        (``rest.FillObjectMetaSystemFields``), so nothing could find an Event about it."""
        meta = mapping(metadata)
        owner = controller_of(meta)
        ns = namespace or meta.get("namespace")
        if owner is None or not isinstance(ns, str) or not ns:
            return None
        if owner.get("kind") == "Job" and self.pod_labels:
            labels = mapping(meta.get("labels"))
            for name_label, uid_label, kind in self.pod_labels:
                name = labels.get(name_label)
                if isinstance(name, str) and name:
                    uid = labels.get(uid_label)
                    uid = uid if isinstance(uid, str) else ""
                    return Regarding(kind.api_version, kind.kind, ns, name, uid)
        return _owner(owner, ns)

    def of_stored_pod(self, pod: Mapping[str, Any]) -> Regarding | None:
        """The workload a Job's pod belongs to, for its Events and its budget, as the pod
        is stored: the kind whose labels it carries, name and UID both (a JobSet's: the UID
        since v0.9.0, ``labelAndAnnotateObject``), else its Job (its controller owner)."""
        meta = mapping(pod.get("metadata"))
        namespace = meta.get("namespace")
        if not isinstance(namespace, str):
            return None
        labels = mapping(meta.get("labels"))
        for name_label, uid_label, kind in self.pod_labels:
            name, uid = labels.get(name_label), labels.get(uid_label)
            if isinstance(name, str) and isinstance(uid, str) and name and uid:
                return Regarding(kind.api_version, kind.kind, namespace, name, uid)
        owner = controller_of(meta)
        if owner is None or owner.get("kind") != "Job":
            return None
        name, uid = owner.get("name"), owner.get("uid")
        if not (isinstance(name, str) and isinstance(uid, str) and name and uid):
            return None
        return Regarding(JOB_API, "Job", namespace, name, uid)

    def of_job(self, job: Any) -> Regarding | None:
        """The workload a stored Job belongs to: its controller owner when that kind's
        Jobs regard it (a JobSet), else the Job itself (a CronJob's Job too: that is the
        object ``kubectl describe job`` shows)."""
        meta = mapping(mapping(job).get("metadata"))
        ns, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
        if not all(isinstance(v, str) and v for v in (ns, name, uid)):
            return None
        owner = controller_of(meta)
        if owner is not None and _group_kind(owner) in self.regards_jobs:
            return _owner(owner, ns)
        return Regarding(JOB_API, "Job", ns, name, uid)


def _group_kind(ref: Mapping[str, Any]) -> tuple[str, str]:
    """(group, kind) of an owner reference."""
    return str(ref.get("apiVersion") or "").partition("/")[0], str(ref.get("kind") or "")


def _owner(owner: dict[str, Any], namespace: str) -> Regarding | None:
    fields = [owner.get(k) for k in ("apiVersion", "kind", "name", "uid")]
    if not all(isinstance(v, str) and v for v in fields):
        return None
    api_version, kind, name, uid = fields
    return Regarding(api_version, kind, namespace, name, uid)


class WorkloadResolver:
    """An object's place in what the user applied, for a kind declared ``read``, asked of
    the API once per object (a GET, cached; off the admission path: the Event writer's
    thread and the controller ask it): one whose controller owner is of a kind declared
    ``stands_for_owned`` (a JobSet a Kubeflow Trainer TrainJob made) stands for that
    owner; a UID missing from its pods (JobSet < v0.9.0) is read there. An object that
    cannot be read is left as the workload, when its UID is known; an error is
    remembered for ``retry_seconds``."""

    def __init__(
        self,
        custom_api: Any,
        workloads: Workloads,
        timeout: float = 2.0,
        retry_seconds: float = 30.0,
        size: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.api = custom_api  # kubernetes.client.CustomObjectsApi
        self.workloads = workloads
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.size = size
        self.clock = clock
        self._lock = threading.Lock()
        #: (kind, namespace, name) -> (the object, or None when unreadable; when read).
        self._found: OrderedDict[tuple[str, str, str], tuple[dict[str, Any] | None, float]] = (
            OrderedDict()
        )

    def read(
        self, kind: WorkloadKind, namespace: str, name: str, uid: str = ""
    ) -> dict[str, Any] | None:
        """The ``kind`` object ``namespace/name`` (the one with ``uid``, when given), or
        ``None``: its identity, owners and our annotations only."""
        key = (kind.kind, namespace, name)
        with self._lock:
            hit = self._found.get(key)
        if hit is not None:
            found, when = hit
            if found is None and self.clock() - when < self.retry_seconds:
                return None
            if found is not None and (not uid or _uid(found) == uid):
                return found
        found = self._get(kind, namespace, name)
        with self._lock:
            self._found[key] = (found, self.clock())
            self._found.move_to_end(key)
            while len(self._found) > self.size:
                self._found.popitem(last=False)
        if found is not None and uid and _uid(found) != uid:
            return None  # another object of that name
        return found

    def read_owner(self, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object of a controller owner reference of a kind this resolver reads (a
        JobSet), else ``None``: for what the webhook applied to a Job's workload."""
        kind = self.workloads.read.get(_group_kind(owner))
        if kind is None:
            return None
        return self.read(kind, namespace, str(owner.get("name")), str(owner.get("uid") or ""))

    def _get(self, kind: WorkloadKind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            resp = self.api.get_namespaced_custom_object(
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
                _preload_content=False,
                _request_timeout=(self.timeout, self.timeout),
            )
            found = json.loads(resp.data)
        except Exception as err:
            log.info("%s %s/%s unreadable: %s", kind.kind, namespace, name, _short(err))
            return None
        if not isinstance(found, dict):
            return None
        # Kept: what tells its owner and what the webhook applied, not its spec or status.
        meta = mapping(found.get("metadata"))
        kept = {k: meta[k] for k in ("name", "namespace", "uid", "ownerReferences") if k in meta}
        kept["annotations"] = {
            k: v for k, v in mapping(meta.get("annotations")).items() if k.startswith(PREFIX)
        }
        return {"apiVersion": found.get("apiVersion"), "kind": kind.kind, "metadata": kept}

    def resolve(self, regarding: Regarding) -> Regarding | None:
        group, slash, _ = regarding.api_version.partition("/")
        kind = self.workloads.read.get((group, regarding.kind)) if slash else None
        if kind is None:
            return regarding
        found = self.read(kind, regarding.namespace, regarding.name, regarding.uid)
        if found is None:
            return regarding if regarding.uid else None
        owner = controller_of(mapping(found.get("metadata")))
        if owner is not None and _group_kind(owner) in self.workloads.stands_for_owned:
            stands_for = _owner(owner, regarding.namespace)
            if stands_for is not None:
                return stands_for
        return dataclasses.replace(regarding, uid=_uid(found)) if _uid(found) else None


def _uid(obj: dict[str, Any]) -> str:
    uid = mapping(obj.get("metadata")).get("uid")
    return uid if isinstance(uid, str) else ""


def _short(err: Exception) -> str:
    status = getattr(err, "status", None)
    return f"HTTP {status}" if status else type(err).__name__


def instance_name() -> str:
    """This replica, as its Events name it (``reportingInstance``): its pod's name (the
    chart passes ``POD_NAME``), else the host's."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def recorder_for(
    api_client: Any, instance: str, workloads: Workloads, series_seconds: float = 30.0
) -> tuple[EventRecorder, WorkloadResolver]:
    """The Event recorder of a process with a cluster connection (Events through
    ``events.k8s.io/v1``, what the kinds declare ``read`` resolved to what stands for
    them: ``workloads``) and its resolver."""
    from kubernetes import client

    resolver = WorkloadResolver(client.CustomObjectsApi(api_client), workloads)
    recorder = EventRecorder(
        client.EventsV1Api(api_client),
        instance,
        series_seconds=series_seconds,
        resolve=resolver.resolve,
    )
    return recorder, resolver
