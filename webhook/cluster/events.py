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
spam filter for core Events: 25, one per 5 minutes).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
        "RetryPolicyFailedJob",
        "RetryDisruptionCounted",
        "RetryInPlaceBudgetExhausted",
        "RetryDisruptionRecognized",
    }
)


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

    def name(self) -> str:
        """Deterministic: the same decision about the same workload is the same Event."""
        digest = hashlib.sha256(
            "\0".join((self.regarding.uid, self.type, self.reason, self.note)).encode()
        ).hexdigest()[:16]
        return f"{self.regarding.name[:200]}.{digest}"


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
    clock: Callable[[], float] = time.time
    counters: dict[str, int] = field(
        default_factory=lambda: {"queued": 0, "written": 0, "aggregated": 0, "dropped": 0}
    )

    def __post_init__(self) -> None:
        self._queue: queue.Queue[Event | None] = queue.Queue(self.capacity)
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._known: OrderedDict[str, str] = OrderedDict()  # names this process wrote
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- the caller's side: never blocks ------------------------------------------------
    def emit(self, event: Event) -> bool:
        """Queue ``event``; ``False`` when it was dropped (queue full)."""
        if self._thread is None:
            self.start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._count("dropped")
            return False
        self._count("queued")
        return True

    def start(self) -> EventRecorder:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="events", daemon=True)
                self._thread.start()
        return self

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued Event was handled (tests, and a stop)."""
        deadline = time.monotonic() + timeout
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
            event = self._queue.get()
            try:
                if event is None:
                    return
                self._write(event)
            except Exception:  # the thread must outlive anything
                log.exception("event not written")
                self._count("dropped")
            finally:
                self._queue.task_done()

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

    def _write(self, event: Event) -> None:
        if self.api is None:
            self._count("written")
            return
        name = event.name()
        if name not in self._known and not self._allowed(event):
            self._count("dropped")
            return
        for attempt in range(self.tries):
            try:
                if self._create_or_count(event, name):
                    return
            except Exception as err:
                status = getattr(err, "status", None)
                if status is not None and 400 <= status < 500 and status not in (409, 429):
                    log.warning("event refused: HTTP %s %s", status, _body(err))
                    self._count("dropped")
                    return
                if attempt + 1 < self.tries:
                    time.sleep(self.retry_seconds * (attempt + 1))
        self._count("dropped")

    def _create_or_count(self, event: Event, name: str) -> bool:
        """Create the Event, or count this repeat into the existing one's series (a
        read, then an update with its resourceVersion: a concurrent writer's 409 makes
        the caller try again)."""
        ns = event.regarding.namespace
        now = micro_time(self.clock())
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
            try:
                self.api.create_namespaced_event(ns, body, _preload_content=False)
                self._remember(name)
                self._count("written")
                return True
            except Exception as err:
                if getattr(err, "status", None) != 409:
                    raise
        resp = self.api.read_namespaced_event(name, ns, _preload_content=False)
        existing = json.loads(resp.data)
        series = existing.get("series") or {}
        count = int(series.get("count") or 1) + 1
        existing["series"] = {"count": count, "lastObservedTime": now}
        self.api.replace_namespaced_event(name, ns, existing, _preload_content=False)
        self._remember(name)
        self._count("aggregated")
        return True

    def _remember(self, name: str) -> None:
        with self._lock:
            self._known[name] = name
            self._known.move_to_end(name)
            while len(self._known) > 10_000:
                self._known.popitem(last=False)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "queue": self._queue.qsize()}


def _body(err: Exception) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    return str(body or "")[:200]


class NoEvents:
    """Where no Event can be written (dry-run, the CLI, no cluster)."""

    def emit(self, event: Event) -> bool:
        return False

    def stats(self) -> dict[str, int]:
        return {}
