"""The leader's right to act, and the one door its writes go through.

A leader may act until its last successful renewal *started* plus ``renew_deadline``,
measured on its own monotonic clock (``Fence``): a standby takes the Lease only once the
record it saw last has not changed for ``lease_seconds`` on *its* clock, counted from when
it saw that renewal, which was after the renewal was sent; ``renew_deadline`` is shorter
than ``lease_seconds`` (the CLI refuses otherwise, as client-go's ``NewLeaderElector``
does), so the two never act at once however slow the API or the standby. client-go runs
each renewal under the same deadline (``renew`` in tools/leaderelection/leaderelection.go:
``wait.PollImmediateUntil`` under a context with a ``RenewDeadline`` timeout).

Every write the reconcilers make goes through ``fenced_client``: a POST, PUT, PATCH or
DELETE past the fence is not sent (``FenceClosed``), one sent before it carries a timeout
that ends at it, and none is sent again by the HTTP library behind the fence's back. The
manager (``webhook.controller.manager``) stops the reconcilers and the process at the
fence, even while an API call hangs.

What it cannot stop: a write the API server received before the fence and applies after
it (its handling is the server's); the margin ``lease_seconds - renew_deadline`` is for
that and for the two clocks' rates differing.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

#: Methods that only read: never fenced.
READS = frozenset({"GET", "HEAD", "OPTIONS"})


class FenceClosed(Exception):
    """A write refused by the fence: this replica may no longer act as leader."""


class Fence:
    """Until when this replica may act (``clock``'s time); closed for good by ``close``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._until = float("-inf")
        self._closed = False

    @property
    def until(self) -> float:
        """The deadline as the last renewal set it (closed or not)."""
        with self._lock:
            return self._until

    def extend(self, until: float) -> None:
        """A renewal went through: acting is right until ``until`` (never shortened)."""
        with self._lock:
            if not self._closed:
                self._until = max(self._until, until)

    def close(self) -> None:
        """Leadership ends (lost, or given up): no write from here on."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def remaining(self) -> float:
        with self._lock:
            until = float("-inf") if self._closed else self._until
        return until - self.clock()

    def holds(self) -> bool:
        return self.remaining() > 0


def _capped(timeout: Any, seconds: float) -> Any:
    """A request timeout (none, a number, or (connect, read)) that ends by ``seconds``."""
    if timeout is None:
        return (seconds, seconds)
    if isinstance(timeout, (int, float)):
        return min(float(timeout), seconds)
    connect, read = timeout
    return (min(connect, seconds), min(read, seconds))


def fenced_client(configuration: Any, fence: Fence, limits: Any = None) -> Any:
    """A ``kubernetes.client.ApiClient`` on a copy of ``configuration`` whose writes the
    fence guards (a class made here: the kubernetes client is imported only where
    needed). Without urllib3's own retries: by default it sends a PUT or DELETE again
    after a read timeout, past the fence's check; a write that fails is tried again by
    its writer, through the fence (``webhook.controller.writes``). With ``limits``
    (``webhook.controller.ratelimit.Limits``), every request waits for its limiter first,
    and then for the fence."""
    from kubernetes import client

    configuration = copy.deepcopy(configuration)
    configuration.retries = 0

    class FencedApiClient(client.ApiClient):  # type: ignore[misc]
        def call_api(
            self,
            method: str,
            url: str,
            header_params: Any = None,
            body: Any = None,
            post_params: Any = None,
            _request_timeout: Any = None,
        ) -> Any:
            if limits is not None:
                limits.take(method, url)
            if method.upper() not in READS:
                remaining = fence.remaining()
                if remaining <= 0:
                    raise FenceClosed(f"{method} {url}: this replica no longer leads")
                _request_timeout = _capped(_request_timeout, remaining)
            return super().call_api(method, url, header_params, body, post_params, _request_timeout)

    return FencedApiClient(configuration)
