"""Client-side rate limits of the controller's requests, as Go controllers have them
(client-go's ``flowcontrol.NewTokenBucketRateLimiter``: a token bucket, ``QPS`` tokens a
second up to ``Burst``, each request waiting for one).

Two buckets, so that bulk work never delays what is critical:

- ``critical``: the requests about one pod (``/api/v1/namespaces/NS/pods/NAME`` and its
  ``/status``): the conditions that must land before the Job controller judges the pod,
  the gate releases, the deadlines, and the reads a conflict needs; and a Job's
  ``/status`` (``peer-disruptions`` on a JobSet: the one write that stands for a
  disrupted pod's peers, ``webhook.kinds.jobset.peers``), with the read of the Job
  it is computed from (any request sent inside ``critical()``);
- ``bulk``: everything else: Events, the workloads' records (histories, audits), lists and
  watches. Within it, an Event yields to every other request: it takes a token only
  while nothing else waits (``yields``), so that after a zone is lost the records that
  count its pods (and lower ``backoffLimit``) are not queued behind the Events telling of
  them; a backlog of Events fills the recorder's bounded queue, whose overflow is dropped
  and counted, as client-go's event broadcaster drops what its full queue cannot take.

Each has ``--kube-api-qps`` and ``--kube-api-burst`` of its own (chart values
``controller.kubeAPIQPS``, 50, and ``controller.kubeAPIBurst``, 100), so the controller
sends at most twice that. client-go's own default (5 QPS, burst 10) throttles a controller
that marks pods by the hundred; JobSet runs at 500/500 and Kueue at 300/500. How long
requests waited is the histogram ``retry_webhook_controller_ratelimit_wait_seconds``.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator

CRITICAL = "critical"
BULK = "bulk"
LIMITERS = (CRITICAL, BULK)
#: The per-pod paths: a pod, or one of its subresources (status).
_POD = re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/?]+(/status)?(\?|$)")
#: An Event (``events.k8s.io/v1``, or core ``v1``).
_EVENT = re.compile(r"^(/apis/events\.k8s\.io/v1|/api/v1)/namespaces/[^/]+/events(/|\?|$)")
#: A Job's status.
_JOB_STATUS = re.compile(r"^/apis/batch/v1/namespaces/[^/]+/jobs/[^/?]+/status(\?|$)")


#: Whether this thread is inside ``critical()``, and its ``unless`` check.
_urgent = threading.local()


class Moot(Exception):
    """A request not sent: while it waited for its token, what it was for ended (its pod
    failed or went, as the watch showed). Its token is given back."""


def critical() -> contextlib.AbstractContextManager[None]:
    """Every request this thread sends meanwhile waits on the critical bucket: a read
    that a critical write is computed from, whose path alone says bulk (a Job's, read
    before its ``/status`` is patched)."""
    return _meanwhile("on", True)


def unless(moot: Callable[[], bool]) -> contextlib.AbstractContextManager[None]:
    """A request this thread sends meanwhile that had to wait for its token is not sent
    if ``moot()`` is then true (``Moot`` is raised): a pod condition computed before a
    wait of seconds, when a thousand pods are disrupted at once, is often for a pod the
    Job controller has judged and deleted meanwhile, and would be answered 404 for a
    token that a pod still running could have had."""
    return _meanwhile("moot", moot)


@contextlib.contextmanager
def _meanwhile(name: str, value: object) -> Iterator[None]:
    """This thread's ``name`` is ``value`` while the block runs."""
    before = getattr(_urgent, name, None)
    setattr(_urgent, name, value)
    try:
        yield
    finally:
        setattr(_urgent, name, before)


def limiter_for(method: str, url: str) -> str:
    """Which bucket a request waits on, by what it is about (``url``: the path with or
    without the server's address and query), or because it is sent inside
    ``critical()``."""
    if getattr(_urgent, "on", False):
        return CRITICAL
    path = _path(url)
    return CRITICAL if _POD.match(path) or _JOB_STATUS.match(path) else BULK


def yields(method: str, url: str) -> bool:
    """Whether a request waits until no other request of its bucket waits: an Event."""
    return bool(_EVENT.match(_path(url)))


def _path(url: str) -> str:
    """``url`` without the server's address."""
    return re.sub(r"^https?://[^/]+", "", url)


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` saved; ``take`` waits for one."""

    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs qps > 0 and burst >= 1 (got {qps}, {burst})")
        self.qps = float(qps)
        self.burst = int(burst)
        self.clock = clock
        self.sleep = sleep
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token now or in the future; how long to wait for it (0: at once). A
        reservation is a promise: tokens go negative, so waiters are served in order."""
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def give_back(self) -> None:
        """A token taken for a request that was not sent (``Moot``)."""
        with self._lock:
            self._refill()
            self._tokens = min(self.burst, self._tokens + 1.0)

    def _refill(self) -> None:
        """The tokens earned since the last look, up to ``burst`` (``_lock`` held)."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now

    def take(self, yielding: bool = False) -> float:
        """Wait for a token; how long it waited. ``yielding``: wait for a token nobody
        reserved (while others keep coming, it keeps waiting)."""
        if yielding:
            return self._take_spare()
        wait = self.reserve()
        if wait > 0:
            self.sleep(wait)
        return wait

    def _take_spare(self) -> float:
        """A whole token saved means every reservation is paid (reservations take tokens
        below zero): one is spare."""
        waited = 0.0
        while True:
            with self._lock:
                self._refill()
                if self._tokens >= 1 - 1e-9:  # (a clock's rounding is no reservation)
                    self._tokens -= 1.0
                    return waited
                pause = (1.0 - self._tokens) / self.qps
            self.sleep(pause)
            waited += pause


class Limits:
    """The controller's two buckets, and what each request waited (``observe``)."""

    def __init__(
        self,
        qps: float,
        burst: int,
        observe: Callable[[str, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.buckets = {name: TokenBucket(qps, burst, clock, sleep) for name in LIMITERS}
        self.observe = observe

    def take(self, method: str, url: str) -> float:
        limiter = limiter_for(method, url)
        bucket = self.buckets[limiter]
        waited = bucket.take(limiter == BULK and yields(method, url))
        if self.observe is not None:
            self.observe(limiter, waited)
        moot = getattr(_urgent, "moot", None)
        if waited > 0 and moot is not None and moot():
            bucket.give_back()
            raise Moot(f"{method} {_path(url)}: moot after {waited:.2f} s waiting for a token")
        return waited
