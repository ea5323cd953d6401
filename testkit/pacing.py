"""A slower, busier API server for the test API (``testkit.fakeapi.FakeAPI.pace``): the
scale benchmarks (``benchmarks/envelope.py``, docs/SCALE.md) run the controller against
an API that answers at a given latency and serves at most a given rate, as a loaded API
server does for one client's priority level.

``Paced(latency, rate)``: every request but a watch's stream is started at most ``rate``
a second, in the order they came (a server-side token bucket of burst 1 that queues, as
API Priority and Fairness queues a priority level's requests, without its 429 when a
queue is full: here no queue overflows), and answered ``latency`` seconds after it is
started at the earliest. ``waited`` is the time requests spent queued for the rate, in
all, to tell a run the rate bounded from one it did not.
"""

from __future__ import annotations

import threading
import time


class Paced:
    """Called at the start of each request the test API handles (``FakeAPI.pace``)."""

    def __init__(self, latency: float = 0.0, rate: float = 0.0) -> None:
        if latency < 0 or rate < 0:
            raise ValueError(f"latency and rate are >= 0 (got {latency}, {rate})")
        self.latency = latency
        self.rate = rate
        self.requests = 0
        self.waited = 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        now = time.monotonic()
        queued = 0.0
        with self._lock:
            self.requests += 1
            if self.rate > 0:
                start = max(now, self._next)
                self._next = start + 1.0 / self.rate
                queued = start - now
                self.waited += queued
        if queued + self.latency > 0:
            time.sleep(queued + self.latency)

    def settings(self) -> dict[str, float]:
        return {"latency_s": self.latency, "rate_per_s": self.rate}
