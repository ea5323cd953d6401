"""What a reconciler does with a write the API refused or failed: the same for every writer
(the history record, the disruption counts, retry-delay gates, in-place budgets, the pod
conditions), so that none retries forever what can never succeed and none drops what a
retry would have written.

By the API's answer (``outcome``):

- **409 Conflict**: the object changed since it was read. The writer reads it again,
  applies what it has pending to what it read and writes again (``rewrite``), for as long
  as it takes: a conflict never drops a write. After ``CONFLICTS`` in a row it yields for
  a moment (the shortest back-off) and goes on.
- **429, 5xx, no answer** (a timeout, a dropped connection): the API may take the same
  write later. Tried again with exponential back-off (``first`` seconds, doubling, at most
  ``cap``; at least what a ``Retry-After`` header asks, which the API server sends with
  429 and 5xx: ``checkWait`` in k8s.io/client-go rest/with_retry.go), for as long as it
  fails.
- **any other 4xx** (400, 403 from RBAC or an admission webhook, 422 Invalid: the 256 KiB
  limit on an object's annotations, ``ValidateAnnotations`` in k8s.io/apimachinery
  pkg/api/validation/objectmeta.go, or a policy that refuses the update): the same write
  would be refused again. Given up at once, counted, and told where users look: a Warning
  Event ``RetryPolicyWriteFailed`` on the workload, saying what was not written and why.
- **404**: the object is gone: nothing to write on.
- **the fence** (``webhook.controller.fence``): this replica no longer leads; the write is
  not sent, and left to the new leader, which finds the same work in its own watches.

Every outcome is counted (``retry_webhook_controller_writes_total{writer,result}``:
``written``, ``conflict``, ``retried``, ``refused``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from webhook.cluster.events import Event, Regarding
from webhook.cluster.informer import short_error
from webhook.controller.fence import FenceClosed

log = logging.getLogger(__name__)

REASON = "RetryPolicyWriteFailed"
#: The writers, and what became of their writes: the metric's only label values.
WRITERS = (
    "history",
    "disruptions",
    "gates",
    "in_place",
    "conditions",
    "audit",
    "verdicts",
    "free_budget",
)
RESULTS = ("written", "conflict", "retried", "refused")
#: Outcomes of one failed write.
CONFLICT, GONE, TRANSIENT, REFUSED, FENCED = "conflict", "gone", "transient", "refused", "fenced"
#: Conflicts in a row one try rewrites through before yielding (then: the next try).
CONFLICTS = 5
#: Keys whose back-off is remembered at most (the oldest go first).
MOST = 10_000

T = TypeVar("T")


class Conflicting(Exception):
    """``CONFLICTS`` conflicts in a row: the write is still pending, tried again soon."""


def status_of(err: BaseException) -> int | None:
    status = getattr(err, "status", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def outcome(err: BaseException) -> str:
    """What a failed write's error means for the write (see the module's doc)."""
    status = status_of(err)
    if isinstance(err, FenceClosed):
        return FENCED
    if status == 404:
        return GONE
    if status == 409 or isinstance(err, Conflicting):
        return CONFLICT
    if status is not None and 400 <= status < 500 and status != 429:
        return REFUSED
    return TRANSIENT


def retry_after(err: BaseException) -> float:
    """Seconds a 429 or 5xx answer asks the client to wait (``Retry-After``), else 0."""
    headers = getattr(err, "headers", None)
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(raw)) if raw is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def reason_of(err: BaseException) -> str:
    """Why the API refused a write, in a few words: its status and the Status message."""
    message = ""
    body = getattr(err, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str) and body:
        try:
            found = json.loads(body)
        except ValueError:
            found = None
        message = str(found.get("message") or "") if isinstance(found, dict) else body
    short = short_error(err)
    return f"{short}: {message[:300]}" if message else short


def rewrite(
    write: Callable[[], T], reread: Callable[[], bool], on_conflict: Any = None
) -> T | None:
    """``write()``; on 409, ``reread()`` (it reads the object again and applies what is
    pending to it; ``False``: the object is gone) and write again. ``None`` when gone;
    ``Conflicting`` after ``CONFLICTS`` conflicts in a row; any other error as raised."""
    for _ in range(CONFLICTS):
        try:
            return write()
        except Exception as err:
            if status_of(err) != 409:
                raise
            if on_conflict is not None:
                on_conflict()
            if not reread():
                return None
    raise Conflicting(f"{CONFLICTS} conflicting writes in a row")


def persist(
    writes: Writes,
    key: Hashable,
    call: Callable[[], T],
    regarding: Regarding | None,
    what: str,
    patience: float,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` (one write that needs no re-read: a strategic merge, a delete) until it
    goes through: after a conflict or a transient error it is made again when its back-off
    ends, as long as that is within ``patience`` seconds (a pod condition is worth writing
    only before the Job controller judges the pod). Raises the last error once given up:
    refused (with its Event), gone, or out of patience."""
    deadline = writes.clock() + patience
    while True:
        try:
            result = call()
        except Exception as err:
            if not writes.failed(key, err, regarding, what) or writes.due(key) > deadline:
                writes.forget(key)
                raise
            sleep(max(0.0, writes.due(key) - writes.clock()))
            continue
        writes.landed(key)
        return result


class Metrics:
    """What the writers report (``webhook.serving.metrics.ControllerMetrics.write``)."""

    def write(self, writer: str, result: str) -> None:
        pass


@dataclass
class _Backoff:
    failures: int
    due: float


class Writes:
    """One writer's failed writes, by key (a workload, a pod): when each may be tried again,
    and what was given up. Thread-safe."""

    def __init__(
        self,
        writer: str,
        events: Any = None,
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
        first: float = 0.5,
        cap: float = 30.0,
    ):
        self.writer = writer
        self.events = events
        self.metrics = metrics if metrics is not None and hasattr(metrics, "write") else Metrics()
        self.clock = clock
        self.first = first
        self.cap = cap
        self._lock = threading.Lock()
        self._backoff: OrderedDict[Hashable, _Backoff] = OrderedDict()
        self.counters = {result: 0 for result in RESULTS}

    def ready(self, key: Hashable) -> bool:
        """Whether a write for ``key`` may be tried now (no back-off running)."""
        with self._lock:
            backoff = self._backoff.get(key)
        return backoff is None or self.clock() >= backoff.due

    def due(self, key: Hashable) -> float:
        """When ``key`` may be tried again (``clock``'s time; now when nothing failed)."""
        with self._lock:
            backoff = self._backoff.get(key)
        return backoff.due if backoff is not None else self.clock()

    def landed(self, key: Hashable) -> None:
        """A write for ``key`` went through: its back-off ends."""
        with self._lock:
            self._backoff.pop(key, None)
        self._count("written")

    def conflict(self) -> None:
        """One 409, rewritten at once (``rewrite``'s ``on_conflict``)."""
        self._count("conflict")

    def failed(
        self, key: Hashable, err: BaseException, regarding: Regarding | None, what: str
    ) -> bool:
        """A write for ``key`` failed with ``err``: ``True`` when it is to be tried again
        (after ``due(key)``), ``False`` when it is given up (refused, or the object gone).
        ``what`` says what was not written, for the log and the Event."""
        kind = outcome(err)
        if kind in (GONE, FENCED):
            self.forget(key)
            return False
        if kind == REFUSED:
            self.forget(key)
            self._count("refused")
            why = reason_of(err)
            log.warning("%s not written, not retried: %s", what, why)
            if regarding is not None and self.events is not None:
                note = f"{what} not written: the API refused it ({why}); not retried"
                self.events.emit(Event(regarding, "Warning", REASON, note, action="Write"))
            return False
        with self._lock:
            before = self._backoff.pop(key, None)
            failures = 1 if kind == CONFLICT else (before.failures + 1 if before else 1)
            delay = min(self.cap, self.first * 2 ** (failures - 1))
            delay = max(delay, min(retry_after(err), self.cap))
            self._backoff[key] = _Backoff(failures, self.clock() + delay)
            while len(self._backoff) > MOST:
                self._backoff.popitem(last=False)
        if kind == CONFLICT:
            if not isinstance(err, Conflicting):  # (``rewrite`` counted each of those)
                self._count("conflict")
        else:
            self._count("retried")
            log.info("%s not written (%s): again in %.1fs", what, short_error(err), delay)
        return True

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._backoff.pop(key, None)

    def _count(self, result: str) -> None:
        with self._lock:
            self.counters[result] += 1
        self.metrics.write(self.writer, result)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "backing_off": len(self._backoff)}
