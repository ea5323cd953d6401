"""The supervisor: the process that forks the workers and the controller's process, and
does what granian's own process manager cannot do without failing requests:

- **Certificates.** A new certificate (``webhook.serving.certwatch``) is served by a new
  *generation* of workers: started beside the old ones on the same listening sockets,
  and once they all serve, the old ones drain (each kept-alive connection is closed
  right after its next response, ``webhook/serving/rsgi.py``) and then stop gracefully.
  Requests on kept-alive connections never fail, and new connections get the new
  certificate within seconds.
- **Listening sockets.** One per worker slot (SO_REUSEPORT: the kernel spreads
  connections over the workers), created and kept here, so a worker replacing one
  that crashed accepts from the very socket, and its queue of waiting connections: none
  is reset. Two such sets (``webhook.serving.listeners.Listeners``): a new generation
  takes the other set, and a socket filter steers new connections to it alone, so the
  old workers have none left half-way through a handshake when they stop.
- **Crashed workers** are replaced (with a back-off when one keeps crashing), and their
  live metrics dropped. **SIGTERM** stops every worker gracefully: they stop accepting,
  finish the requests they have, and exit; after ``graceful_timeout`` they are killed.
  **SIGHUP** starts a new generation of workers the same way as a new certificate.

The supervisor never starts a thread: it forks its workers.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.leadership import LeaderNote
from webhook.policy.config import Config
from webhook.serving import lifeline, logs, metrics
from webhook.serving.certwatch import CertificateWatch, ServingPair, SharedNote, StagedPair
from webhook.serving.controlproc import ControllerProcess, run_controller
from webhook.serving.listeners import Listeners
from webhook.serving.options import STARTUP_TIMEOUT, ServeOptions
from webhook.serving.worker import WorkerSpec, default_app, worker_process

log = logging.getLogger(logs.SERVER_LOGGER)


@dataclass
class Worker:
    pid: int
    slot: int
    generation: int
    started: float
    ready: bool = False
    #: When it was told to drain, and when it was told to stop (monotonic seconds).
    draining: float | None = None
    stopping: float | None = None


@dataclass
class _Slot:
    failures: int = 0
    respawn_at: float | None = None


@dataclass
class Supervisor:
    options: ServeOptions
    watch: CertificateWatch
    fallback_config: Config
    app_factory: Any = None
    workers: dict[int, Worker] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.app_factory = self.app_factory or default_app
        self.note = SharedNote()
        self.leader_note: LeaderNote | None = None
        self.controller: ControllerProcess | None = None
        if self.options.controller and self.options.kube != "off":
            self.leader_note = LeaderNote()
            note = self.leader_note
            self.controller = ControllerProcess(lambda: run_controller(self.options, note), note)
        self.listeners = Listeners(self.options)
        self.slots = [_Slot() for _ in range(self.options.workers)]
        self.ready_r, self.ready_w = os.pipe()
        os.set_blocking(self.ready_r, False)
        self.generation = 1
        self.staged: dict[int, StagedPair] = {1: StagedPair(self.watch.serving)}
        #: The newest generation every slot serves, and a newer one starting, if any.
        self.current = 1
        self.pending: tuple[int, ServingPair] | None = None
        self.stop_requested = False
        self.restart_requested = False
        self._next_check = 0.0

    # --- lifecycle -------------------------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_restart)
        try:
            self.listeners.route_to(1)
            if self.controller is not None:
                self.controller.spawn(time.monotonic())
            for slot in range(len(self.slots)):
                self.spawn(slot, 1)
            self._await_first_generation()
            while not self.stop_requested:
                self.tick()
                time.sleep(0.05)
            self.shutdown()
        finally:
            self.listeners.close()
            for staged in self.staged.values():
                staged.close()

    def _on_stop(self, signum: int, _frame: Any) -> None:
        self.stop_requested = True

    def _on_restart(self, signum: int, _frame: Any) -> None:
        self.restart_requested = True

    def _await_first_generation(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not all(w.ready for w in self.workers.values()):
            self._read_ready()
            for pid, status in self._reap():
                self._stop_all(signal.SIGKILL)
                raise RuntimeError(
                    f"worker {pid} failed to start ({_describe(status)}); see the log above"
                )
            if self.stop_requested:
                return  # stopped while starting: stopped gracefully like any other time
            if time.monotonic() > deadline:
                self._stop_all(signal.SIGKILL)
                raise RuntimeError(f"workers did not start within {STARTUP_TIMEOUT:g} s")
            time.sleep(0.02)
        log.info(
            "serving",
            extra={
                "bind": f"{self.options.host}:{self.options.port}",
                "workers": [w.pid for w in self.workers.values()],
            },
        )

    def spawn(self, slot: int, generation: int) -> Worker:
        spec = WorkerSpec(
            slot,
            generation,
            self.listeners.socket_for(generation, slot).fileno(),
            self.staged[generation],
            self.ready_w,
            self.note,
            self.leader_note,
        )
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            lifeline.forked_from(supervisor)
            worker_process(self.options, spec, self.app_factory, self.fallback_config)
        worker = Worker(pid, slot, generation, time.monotonic())
        self.workers[pid] = worker
        return worker

    # --- one turn of the loop ----------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        self._read_ready()
        for pid, status in self._reap():
            self._exited(pid, status)
        if self.controller is not None:
            self.controller.tick(now)
        for index, slot in enumerate(self.slots):
            if slot.respawn_at is not None and now >= slot.respawn_at:
                slot.respawn_at = None
                self.spawn(index, self.current)
        if now >= self._next_check:
            self._next_check = now + self.options.check_interval
            self._check_certificate()
        self._advance_generation(now)
        for worker in list(self.workers.values()):
            if worker.draining is not None and worker.stopping is None:
                if now - worker.draining >= self.options.drain_seconds:
                    self._signal(worker, signal.SIGTERM)
                    worker.stopping = now
            elif worker.stopping is not None and now - worker.stopping > (
                self.options.graceful_timeout
            ):
                self._signal(worker, signal.SIGKILL)
        self._release_staged()

    def _check_certificate(self) -> None:
        running = (w.generation for w in self.workers.values())
        if self.pending is not None or not self.listeners.free_for(self.generation + 1, running):
            return  # one rollout at a time, each on sockets no older worker still holds
        pair = self.watch.changed()
        if pair is None and self.restart_requested:
            pair = self.watch.serving
            log.info("SIGHUP: starting a new generation of workers")
        self.restart_requested = False
        self.note.write({"reloadError": self.watch.last_error})
        if pair is None:
            return
        self.generation += 1
        self.staged[self.generation] = StagedPair(pair)
        self.pending = (self.generation, pair)
        for slot in range(len(self.slots)):
            self.spawn(slot, self.generation)

    def _advance_generation(self, now: float) -> None:
        """Once every slot has a ready worker of the pending generation, the older
        workers drain."""
        if self.pending is None:
            return
        generation, pair = self.pending
        mine = [w for w in self.workers.values() if w.generation == generation]
        if len(mine) < len(self.slots) or not all(w.ready for w in mine):
            if mine and now - min(w.started for w in mine) > STARTUP_TIMEOUT:
                self._abandon_pending(f"new workers not serving after {STARTUP_TIMEOUT:g} s")
            return
        self.pending = None
        self.current = generation
        self.listeners.route_to(generation)
        for worker in self.workers.values():
            if worker.generation < generation and worker.draining is None:
                worker.draining = now
                self._signal(worker, signal.SIGUSR1)
        if pair is not self.watch.serving:
            self.watch.served(pair)

    def _read_ready(self) -> None:
        while True:
            try:
                data = os.read(self.ready_r, 4 * 64)
            except BlockingIOError:
                return
            for (pid,) in struct.iter_unpack("i", data):
                if pid in self.workers:
                    self.workers[pid].ready = True

    def _reap(self) -> list[tuple[int, int]]:
        """Workers that exited (the metrics process, also a child, is left to its own)."""
        done = []
        for pid in list(self.workers):
            try:
                found, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                found, status = pid, 0
            if found:
                done.append((pid, status))
        return done

    def _exited(self, pid: int, status: int) -> None:
        worker = self.workers.pop(pid)
        metrics.worker_exited(pid)
        if worker.stopping is not None or worker.draining is not None:
            log.info("worker stopped", extra={"worker_pid": pid, "slot": worker.slot})
            return
        log.error(
            "worker exited unexpectedly; replacing it",
            extra={"worker_pid": pid, "slot": worker.slot, "status": _describe(status)},
        )
        if self.pending is not None and worker.generation == self.pending[0]:
            self._abandon_pending(f"a new worker failed to start ({_describe(status)})")
            return
        if worker.generation != self.current:
            return  # an older generation: the current one serves its slot
        slot = self.slots[worker.slot]
        lived = time.monotonic() - worker.started
        slot.failures = slot.failures + 1 if lived < 10 else 0
        delay = 0.0 if slot.failures <= 1 else min(30.0, 0.5 * 2 ** (slot.failures - 1))
        slot.respawn_at = time.monotonic() + delay

    def _abandon_pending(self, reason: str) -> None:
        assert self.pending is not None
        generation, pair = self.pending
        self.pending = None
        for worker in list(self.workers.values()):
            if worker.generation == generation:
                worker.stopping = time.monotonic()
                self._signal(worker, signal.SIGKILL)
        self.watch.forget(pair, reason)

    def _release_staged(self) -> None:
        live = {w.generation for w in self.workers.values()} | {self.current}
        if self.pending is not None:
            live.add(self.pending[0])
        for generation in [g for g in self.staged if g not in live]:
            self.staged.pop(generation).close()

    def _signal(self, worker: Worker, signum: int) -> None:
        try:
            os.kill(worker.pid, signum)
        except ProcessLookupError:
            pass

    # --- stopping --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """SIGTERM: every worker stops accepting, finishes its requests and exits; after
        ``graceful_timeout`` seconds the rest are killed."""
        log.info("stopping: finishing the requests in progress")
        self.listeners.close()  # the workers hold their own copies until they stop
        self._stop_all(signal.SIGTERM)
        if self.controller is not None:
            self.controller.stop(self.options.graceful_timeout)  # releases its Lease
        deadline = time.monotonic() + self.options.graceful_timeout
        while self.workers and time.monotonic() < deadline:
            for pid, _status in self._reap():
                self.workers.pop(pid, None)
                metrics.worker_exited(pid)
            time.sleep(0.05)
        if self.workers:
            log.warning("workers still busy after the graceful timeout: killed")
            self._stop_all(signal.SIGKILL)
            for pid in list(self.workers):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                self.workers.pop(pid, None)

    def _stop_all(self, signum: int) -> None:
        for worker in self.workers.values():
            worker.stopping = worker.stopping or time.monotonic()
            self._signal(worker, signum)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
