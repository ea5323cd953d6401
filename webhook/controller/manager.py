"""The controller process: leader election, then the reconcilers while it leads.

``retry-webhook serve`` forks this process beside its admission workers whenever it has
a cluster connection (``--no-controller`` turns it off). Every replica runs one; the one
that holds the Lease starts the reconcilers (``Reconciler``), the others only watch the
Lease. A replica that loses the Lease exits this process, and the supervisor starts a
fresh one, a standby: as controller-runtime's manager exits on lost leadership, so that
no reconciler of a former leader can act beside the new one. It loses it at its fence
(``webhook.controller.fence``: its last renewal's start plus ``renew_deadline``), watched
here, not by the elector's thread, which may be blocked in a call the API never answers:
the reconcilers' writes stop at the fence (their API client refuses them), and ``run``
returns then without waiting for any thread.

Nothing here runs on the admission path: the workers only read what this process
publishes (``webhook.cluster.leadership``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from webhook.cluster.leadership import LeaderNote, LeaderState
from webhook.controller.fence import Fence
from webhook.controller.lease import LeaderElector, LeaseConfig

log = logging.getLogger(__name__)


class Reconciler(Protocol):
    """What runs while this replica leads: ``run`` until ``stop`` is set. ``run`` sets
    ``watches``, its informers (``webhook.cluster.informer.Informer``), as it starts them:
    whether they have listed is whether it has seen the cluster yet."""

    name: str

    def run(self, stop: threading.Event) -> None: ...


class Recorder(Protocol):
    """The controller's metrics (``webhook.serving.metrics.ControllerMetrics``)."""

    def leader(self, leading: bool) -> None: ...

    def flush(self) -> None: ...


class _NoMetrics:
    def leader(self, leading: bool) -> None:
        pass

    def flush(self) -> None:
        pass


@dataclass(frozen=True)
class ControllerOptions:
    namespace: str
    lease_name: str
    identity: str = ""
    lease_seconds: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: The most peers marked for one disruption (peer-disruptions).
    peer_mark_limit: int = 1000

    def lease(self) -> LeaseConfig:
        return LeaseConfig(
            self.namespace,
            self.lease_name,
            self.identity or default_identity(),
            self.lease_seconds,
            self.renew_deadline,
            self.retry_period,
        )


def default_identity() -> str:
    """The pod's name (the chart passes ``POD_NAME``), else the host's, with a suffix of
    this process's own: a restarted controller process is a new candidate."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


class Manager:
    """Leader election and, while leading, the reconcilers, each on a thread."""

    def __init__(
        self,
        coordination_api: Any,
        options: ControllerOptions,
        reconcilers: Sequence[Reconciler],
        note: LeaderNote | None = None,
        recorder: Recorder | None = None,
        fence: Fence | None = None,
        drain: Callable[[], object] | None = None,
    ):
        self.options = options
        #: What is written on a clean stop, before the fence closes (the Events queued,
        #: and the repeats held for their series: ``EventRecorder.flush``).
        self.drain = drain
        self.note = note
        self.recorder = recorder or _NoMetrics()
        self.reconcilers = list(reconcilers)
        self.elector = LeaderElector(
            coordination_api, options.lease(), self._publish, health=self._health, fence=fence
        )
        #: What the reconcilers' writes are fenced by (``webhook.controller.fence``).
        self.fence = self.elector.fence
        self.stop = threading.Event()
        self.lost = threading.Event()
        self._leading_stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _publish(self, state: LeaderState) -> None:
        if self.note is not None:
            self.note.write(state)
        self.recorder.leader(state.leader)

    def _health(self) -> str:
        """What the reconcilers that report it say is wrong ("" : nothing): the gate
        releaser's, which admission gates by (``webhook.controller.gates``)."""
        problems = [check() for r in self.reconcilers if (check := getattr(r, "health", None))]
        return "; ".join(p for p in problems if p)

    def run(self) -> int:
        """Until ``stop`` (SIGTERM) or the Lease is lost; 0 on a clean stop, 1 after a loss
        (the supervisor starts a new standby either way when it still serves)."""
        # The Lease is renewed until what it guards is done: released only once the
        # reconcilers stopped and what they queued was written (``drain``).
        release = threading.Event()
        elector = threading.Thread(
            target=self.elector.run, args=(release, self._on_lost), name="lease", daemon=True
        )
        elector.start()
        while not self.stop.is_set() and not self.lost.is_set():
            if self._threads:
                if not self.fence.holds():  # whatever the elector's thread is blocked in
                    self.elector.lose(self._on_lost)
                    break
                # Leading: ``leading`` stays set, so waiting on it would spin.
                self.stop.wait(min(0.2, self.fence.remaining()))
            elif self.elector.leading.wait(0.2) and self.fence.holds():
                self._start_reconcilers()
            self.recorder.flush()
        if self.lost.is_set():
            # Fenced: no write of theirs goes out; the process ends without waiting for a
            # thread a hung call holds (the supervisor starts a standby).
            self._leading_stop.set()
            self.stop.set()
            release.set()
            self.recorder.flush()
            return 1
        self._stop_reconcilers()
        if self.drain is not None and self.fence.holds():
            self.drain()
        self.fence.close()  # before the Lease is released: nothing acts after
        self.stop.set()
        release.set()
        elector.join(timeout=self.options.renew_deadline + 5)
        self.recorder.flush()
        return 0

    def _on_lost(self) -> None:
        self.fence.close()
        self._leading_stop.set()
        self.lost.set()

    def _start_reconcilers(self) -> None:
        for reconciler in self.reconcilers:
            thread = threading.Thread(
                target=_guarded(reconciler, self._leading_stop),
                name=f"reconcile-{reconciler.name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        log.info("reconcilers started", extra={"reconcilers": [r.name for r in self.reconcilers]})

    def _stop_reconcilers(self, timeout: float = 5.0) -> None:
        """Stop the reconcilers, waiting ``timeout`` seconds for them all (a write still
        running when the fence closes is refused, not waited for)."""
        self._leading_stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _guarded(reconciler: Reconciler, stop: threading.Event) -> Callable[[], None]:
    """A reconciler's loop, restarted after a failure (it must outlive any one error)."""

    def loop() -> None:
        while not stop.is_set():
            try:
                reconciler.run(stop)
            except Exception:
                log.exception("reconciler %s failed; restarting it", reconciler.name)
                stop.wait(1.0)
            else:
                return

    return loop


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT stop the controller (releasing the Lease); the supervisor's
    own handlers are not inherited in meaning."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
