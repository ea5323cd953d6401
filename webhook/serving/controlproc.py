"""The supervisor's side of the controller: one process forked beside the workers.

The supervisor starts no thread (it forks), so the controller, which needs threads for
its watches and its Lease, runs in a process of its own (``webhook.controller.manager``),
started before the first workers and started again when it exits: after it lost the
Lease (it exits then, to come back as a standby), or after a crash (with a back-off).
It shares the ``LeaderNote`` with the workers through the fork. ``run_controller`` is the
process's body.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.attempts import connect
from webhook.cluster.events import instance_name, recorder_for
from webhook.cluster.leadership import LeaderNote, LeaderState
from webhook.controller.fence import Fence, fenced_client
from webhook.controller.manager import Manager, install_signal_handlers
from webhook.controller.ratelimit import Limits
from webhook.kinds.registry import WORKLOADS
from webhook.policy.config import Config
from webhook.serving import lifeline, metrics
from webhook.serving.options import ServeOptions
from webhook.serving.reload import ConfigReloader

log = logging.getLogger(__name__)

#: The controller's exit status when there is nothing to control (no cluster): not restarted.
DISABLED = 4


@dataclass
class ControllerProcess:
    """Starts, watches and stops the controller process (``run`` is its body)."""

    run: Any  # () -> int, called in the child
    note: LeaderNote
    pid: int | None = None
    started: float = 0.0
    failures: int = 0
    respawn_at: float | None = 0.0
    stopping: bool = False
    exits: list[int] = field(default_factory=list)

    def tick(self, now: float) -> None:
        """Reap an exited process and start the next one when it is due."""
        if self.pid is not None:
            try:
                found, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                found, status = self.pid, 0
            if found:
                self._exited(status, now)
        if self.pid is None and not self.stopping and self.respawn_at is not None:
            if now >= self.respawn_at:
                self.spawn(now)

    def spawn(self, now: float) -> None:
        self.respawn_at = None
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the controller
            code = 3
            try:
                lifeline.forked_from(supervisor)  # before its slow start-up, not after
                code = int(self.run() or 0)
            except BaseException:
                log.exception("controller failed")
            finally:
                logging.shutdown()
                os._exit(code)
        self.pid, self.started = pid, now
        log.info("controller started", extra={"controller_pid": pid})

    def _exited(self, status: int, now: float) -> None:
        code = os.waitstatus_to_exitcode(status)
        self.exits.append(code)
        self.pid = None
        if code == DISABLED:
            # Said after the child's own note, which this must not overwrite: /readyz
            # tells why no controller runs, not that one is coming back.
            self.note.write(LeaderState(reason="no cluster connection"))
            log.info("controller off: no cluster connection")
            return
        why = "the server is stopping" if self.stopping else "the controller is restarting"
        self.note.write(LeaderState(reason=why))
        if self.stopping:
            return
        lived = now - self.started
        # Exit 1: it lost the Lease and comes back as a standby at once; anything else
        # is a crash, restarted with a growing delay when it keeps crashing early.
        self.failures = 0 if code == 1 or lived >= 30 else self.failures + 1
        delay = 0.0 if self.failures <= 1 else min(30.0, 0.5 * 2 ** (self.failures - 1))
        self.respawn_at = now + delay
        log.warning(
            "controller exited; starting another",
            extra={"exit_code": code, "restart_in_seconds": delay},
        )

    def stop(self, timeout: float) -> None:
        """SIGTERM (the leader releases its Lease), then SIGKILL after ``timeout``."""
        self.stopping = True
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                found, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                found = self.pid
            if found:
                self.pid = None
                return
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.pid = None


class LiveConfig:
    """The cluster config for the controller (its failure categories), read again when
    the file changes (``ConfigReloader``: a bad version is refused, the last good one
    stays), looked at once every ``every`` seconds at most."""

    def __init__(self, path: str | None, every: float = 5.0) -> None:
        self.config = Config()
        self.every = every
        self._checked = time.monotonic()
        self._reloader: ConfigReloader | None = None
        if path:
            self._reloader = ConfigReloader(path, self._apply)
            self.config = self._reloader.load(Config())

    def _apply(self, config: Config) -> None:
        self.config = config

    def current(self) -> Config:
        if self._reloader is not None and time.monotonic() - self._checked >= self.every:
            self._checked = time.monotonic()
            self._reloader.check()
        return self.config


def run_controller(options: ServeOptions, note: LeaderNote) -> int:
    """The controller process's body (``ControllerProcess.run``, as the supervisor builds
    it): leader election and, while leading, the reconcilers; exits ``DISABLED`` without a
    cluster connection."""
    metrics.reset_after_fork()
    clients = connect(options.kube)
    if clients is None:
        note.write(LeaderState(reason="no cluster connection"))
        return DISABLED
    from kubernetes import client

    from webhook.controller import reconcilers

    api_client = clients[0].api_client
    # The Lease is written through its own client; everything the reconcilers (and their
    # Events) write goes through one the fence guards (``webhook.controller.fence``).
    fence = Fence()
    recorder = metrics.ControllerMetrics() if options.metrics_port else None
    limits = Limits(
        options.kube_api_qps,
        options.kube_api_burst,
        recorder.ratelimit_wait if recorder is not None else None,
    )
    acting = fenced_client(api_client.configuration, fence, limits)
    events, resolver = recorder_for(
        acting, instance_name(), WORKLOADS, series_seconds=options.event_series_seconds
    )
    if recorder is not None:
        recorder.events_stats(events.stats)
    config = LiveConfig(options.config_path)
    manager = Manager(
        client.CoordinationV1Api(api_client),
        options.controller_options(),
        reconcilers.build(
            acting, options.controller_options(), events, resolver, recorder, config.current
        ),
        note,
        recorder,
        fence,
        drain=lambda: events.flush(2.0),  # the Events queued and held, while it may
    )
    install_signal_handlers(manager.stop)  # SIGTERM, the supervisor's death too (lifeline)
    code = manager.run()
    if recorder is not None:
        recorder.flush()
    return code
