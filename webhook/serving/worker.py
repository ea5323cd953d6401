"""A worker: the Flask app on one granian RSGI worker, in a process the supervisor
forked (``webhook.serving.supervisor``), with what it runs beside the app (config
reloads, metrics sampling, readiness) and the caches as its event loop may use them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from webhook.admission import engine
from webhook.cluster.attempts import AttemptLookup, JobCache, connect
from webhook.cluster.deletions import DeletionMarker
from webhook.cluster.events import instance_name, recorder_for
from webhook.cluster.facts import NoCluster
from webhook.cluster.history import HistoryKey, HistoryLookup
from webhook.cluster.leadership import LeaderNote, NoLeader
from webhook.cluster.limits import NO_LIMITS, LimitLookup, LimitRangeCache
from webhook.cluster.nodes import NO_NODES, NodeAnswer, NodeCache
from webhook.cluster.runtimes import RuntimeLookup
from webhook.cluster.version import ServerVersion
from webhook.kinds.registry import WORKLOADS
from webhook.kinds.trainjob.runtimes import RuntimeCache
from webhook.kube.scheduling import Placement
from webhook.policy.config import Config
from webhook.serving import logs, metrics
from webhook.serving.app import MAX_BODY_BYTES, State, create_app
from webhook.serving.certwatch import CertificateStatus, SharedNote, StagedPair
from webhook.serving.options import BACKLOG, HTTP1_BUFFER, ServeOptions
from webhook.serving.reload import ConfigReloader
from webhook.serving.rsgi import NeedsThread, WsgiOverRsgi

log = logging.getLogger(logs.SERVER_LOGGER)


class LoopAttempts:
    """The attempt cache as the event loop's thread may use it: answers that need no
    request to the API come at once; one that needs the bounded GET raises
    ``NeedsThread`` there, so that the request is answered on a thread instead and the
    loop keeps serving others meanwhile. Other threads get ``job_failures`` as is."""

    def __init__(
        self,
        cache: JobCache,
        limits: LimitRangeCache | None = None,
        nodes: NodeCache | None = None,
    ):
        self.cache = cache
        self.limits = limits
        self.nodes = nodes
        self.loop_thread: int | None = None

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        if threading.get_ident() == self.loop_thread:
            answer = self.cache.answer_at_once(uid, namespace)
            if answer is None:
                raise NeedsThread
            return answer
        return self.cache.job_failures(namespace, name, uid)

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        if threading.get_ident() == self.loop_thread:
            answer = self.cache.history_at_once(key)
            if answer is None:
                raise NeedsThread
            return answer
        return self.cache.job_history(key)

    def limit_ranges(self, namespace: str) -> LimitLookup:
        """A dictionary lookup, on any thread (``webhook.cluster.limits``)."""
        return self.limits.limit_ranges(namespace) if self.limits is not None else NO_LIMITS

    def placement(self, question: Placement) -> NodeAnswer:
        """From the Node cache; its first questions may wait for its first list: on a
        thread (``webhook.cluster.nodes``)."""
        if self.nodes is None:
            return NO_NODES
        if threading.get_ident() == self.loop_thread:
            answer = self.nodes.answer_at_once(question)
            if answer is None:
                raise NeedsThread
            return answer
        return self.nodes.placement(question)

    def stats(self) -> dict[str, Any]:
        stats = self.cache.stats()
        if self.nodes is not None:
            stats["nodes"] = self.nodes.stats()
        if self.limits is not None:
            limit_stats = self.limits.stats()
            stats["limit_ranges"] = limit_stats
            stats["synced"] = bool(stats.get("synced")) and bool(limit_stats.get("synced"))
        return stats


class LoopRuntimes:
    """The runtime cache as the event loop's thread may use it (as ``LoopAttempts``): a
    runtime the cache holds comes at once; one that needs the cache's first list or the
    bounded GET raises ``NeedsThread`` there."""

    def __init__(self, cache: RuntimeCache):
        self.cache = cache
        self.loop_thread: int | None = None

    def runtime(self, kind: str, namespace: str | None, name: str) -> RuntimeLookup:
        if threading.get_ident() == self.loop_thread:
            answer = self.cache.answer_at_once(kind, namespace, name)
            if answer is None:
                raise NeedsThread
            return answer
        return self.cache.runtime(kind, namespace, name)

    def stats(self) -> dict[str, Any]:
        return self.cache.stats()


class WorkerRuntime:
    """What each worker runs beside the Flask app: the state handlers read, reloads of
    the config file, metrics sampling, and readiness."""

    def __init__(
        self,
        options: ServeOptions,
        certificate: CertificateStatus,
        recorder: metrics.Metrics,
        fallback_config: Config | None = None,
        leader: LeaderNote | NoLeader | None = None,
    ):
        self.options = options
        self.certificate = certificate
        self.metrics = recorder
        self.started = time.monotonic()
        self.leader = leader or NoLeader("--no-controller" if not options.controller else "off")
        self.state = State(metrics=recorder, readiness=self.readiness, leadership=self.leader)
        engine.MEMO.max_entries = options.memo_entries
        self.reloader: ConfigReloader | None = None
        if options.config_path:
            self.reloader = ConfigReloader(
                options.config_path, self._apply, recorder.config_reloaded
            )
            self.state.config = self.reloader.load(fallback_config)
        recorder.config_loaded()
        self.loop_attempts: LoopAttempts | None = None
        clients = connect(options.kube)
        if clients is not None:
            cache = JobCache(
                *clients,
                lookup_timeout=options.lookup_timeout,
                set_records=WORKLOADS.pod_records,
            ).start()
            self.loop_attempts = LoopAttempts(
                cache,
                LimitRangeCache(clients[1]).start(),
                # Started by the first pod that keeps off failed nodes (cluster/nodes.py).
                NodeCache(clients[1], options.lookup_timeout),
            )
            self.state.attempts = self.loop_attempts
        else:
            self.state.attempts = NoCluster()
        # Started by the first TrainJob it is asked about (webhook/kinds/trainjob/runtimes.py).
        self.loop_runtimes: LoopRuntimes | None = None
        if clients is not None:
            self.loop_runtimes = LoopRuntimes(RuntimeCache.of(clients, options.lookup_timeout))
            self.state.runtimes = self.loop_runtimes
        # Decisions that shape new pods, as Events: queued by requests, written by the
        # recorder's own thread (started by the first one).
        if clients is not None:
            self.state.events = recorder_for(
                clients[0].api_client,
                instance_name(),
                WORKLOADS,
                series_seconds=options.event_series_seconds,
            )[0]
            # Marks the pods disruptors delete, off the admission path (cluster/deletions.py),
            # telling it with the worker's Events.
            self.state.deletions = DeletionMarker(clients[1], self.state.events, WORKLOADS)
        # Asked now, before the worker serves, then every few minutes (``tick``).
        self.version: ServerVersion | None = None
        if clients is not None:
            self.version = ServerVersion(clients[0].api_client, timeout=2.0)
            self.version.poll()
            self.state.version = self.version
        recorder.certificate_served(certificate.not_after.timestamp())
        recorder.sample_cache(self.state.attempts.stats())  # no stale gauges before a tick
        self._thread: threading.Thread | None = None

    def _apply(self, config: Config) -> None:
        self.state.config = config  # one assignment: a request sees the old or the new

    def start(self) -> WorkerRuntime:
        self._thread = threading.Thread(target=self._loop, name="maintenance", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            time.sleep(self.options.check_interval)
            try:
                self.tick()
            except Exception:  # the loop must outlive any one failure
                log.exception("maintenance check failed")

    def tick(self) -> None:
        if self.reloader is not None:
            self.reloader.check()
        if self.version is not None:
            self.version.poll()
        self.metrics.sample_cache(self.state.attempts.stats())
        self.metrics.sample_events(self.state.events.stats())
        if self.state.deletions is not None:
            self.metrics.sample_deletions(self.state.deletions.stats())
        self.metrics.flush()
        logs.flush_decisions()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when config and certificate are loaded and the attempt cache synced,
        but never held back by the cache for longer than ``cache_sync_timeout``: pods
        are admitted without a cache too (one bounded GET, else unchanged with a
        warning), while an unready webhook with failurePolicy Fail blocks the cluster."""
        reasons: list[str] = []
        cert_ok, certificate = self.certificate.status()
        if not cert_ok:
            reasons.append(f"serving certificate expired at {certificate['notAfter']}")
        stats = self.state.attempts.stats()
        cache = "disabled"
        if stats.get("enabled"):
            cache = "synced"
            if not stats.get("synced"):
                waited = time.monotonic() - self.started
                if waited < self.options.cache_sync_timeout:
                    cache = "syncing"
                    reasons.append(
                        "attempt cache not synced yet (ready without it after "
                        f"{self.options.cache_sync_timeout:g}s)"
                    )
                else:
                    cache = "not synced: serving without it (lookups fall back to one GET)"
        return not reasons, {
            "certificate": certificate,
            "configReloadError": self.reloader.last_error if self.reloader else None,
            "cache": cache,
            # Not a condition of readiness: admission works whoever leads.
            "controller": self.leader.read().summary(),
            "reasons": reasons,
        }


@dataclass
class WorkerSpec:
    """What a forked worker needs from the supervisor."""

    slot: int
    generation: int
    listener: int  # file descriptor of the slot's listening socket
    staged: StagedPair
    ready_fd: int
    note: SharedNote
    leader: LeaderNote | NoLeader | None = None


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # a faster loop, when installed (it is with the package, on Linux)

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop


def run_worker(
    options: ServeOptions,
    spec: WorkerSpec,
    app_factory: Any,
    fallback_config: Config | None,
) -> None:
    """A worker, in a process the supervisor forked: the app on one granian RSGI worker.

    ``app_factory(runtime) -> WSGI app``. granian's worker classes are called the way
    granian's own process manager calls them (``granian/server/mp.py``), so this is the
    one place that depends on granian beyond its documented options; the package pins
    granian's minor version for it, and every server test exercises it.
    """
    from granian._futures import _future_watcher_wrapper, _new_cbscheduler
    from granian._granian import RSGIWorker, SocketHolder, WorkerSignal
    from granian.http import HTTP1Settings, HTTP2Settings

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)  # the supervisor's handlers are not ours
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a drain before we serve: nothing to do
    metrics.reset_after_fork()
    staged = spec.staged
    certificate = CertificateStatus(staged.pair.not_after, spec.note)
    runtime = WorkerRuntime(options, certificate, metrics.get(), fallback_config, spec.leader)
    pool = ThreadPoolExecutor(max(1, options.threads), thread_name_prefix="api-wait")
    adapter = WsgiOverRsgi(app_factory(runtime), MAX_BODY_BYTES, options.body_timeout, pool)
    runtime.start()
    loop = _new_loop()
    if runtime.loop_attempts is not None:
        runtime.loop_attempts.loop_thread = threading.get_ident()
    if runtime.loop_runtimes is not None:
        runtime.loop_runtimes.loop_thread = threading.get_ident()
    stop = WorkerSignal()
    stopped = asyncio.Event()
    stop.add_cb(lambda: loop.call_soon_threadsafe(stopped.set))
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def drain() -> None:
        adapter.draining = True
        log.info("draining: closing each connection after its next response")

    loop.add_signal_handler(signal.SIGUSR1, drain)
    client_ca = staged.path("client-ca.crt")
    worker = RSGIWorker(
        spec.slot + 1,
        (None, SocketHolder(os.dup(spec.listener), False, BACKLOG)),
        None,  # no IPC: granian's metrics are off
        1,  # runtime threads: one event loop thread for the network
        8,  # runtime threads for blocking I/O (files: none here)
        1,  # Python threads: unused by RSGI
        30,
        max(1, options.max_connections),
        "1",  # HTTP/1.1 only (docs/OPERATIONS.md, "HTTP/2: not offered")
        HTTP1Settings(
            header_read_timeout=max(1, round(options.header_timeout * 1000)),
            keep_alive=True,
            max_buffer_size=HTTP1_BUFFER,
            pipeline_flush=False,
        ),
        HTTP2Settings(),
        False,  # websockets
        None,  # static files
        True,
        staged.path("tls.crt"),
        staged.path("tls.key"),
        None,
        "tls1.2",
        client_ca,
        [],
        client_ca is not None,
        (None, None),
    )
    scheduler = _new_cbscheduler(loop, _future_watcher_wrapper(adapter.__rsgi__), impl_asyncio=True)
    settle_heap()
    worker.serve_str(scheduler, loop, stop)
    log.info(
        "worker started",
        extra={
            "slot": spec.slot,
            "generation": spec.generation,
            "certificate_not_after": staged.pair.not_after.isoformat(),
        },
    )
    os.write(spec.ready_fd, struct.pack("i", os.getpid()))
    loop.run_until_complete(stopped.wait())
    pool.shutdown(wait=False)
    runtime.state.events.flush(1.0)  # the Events still queued, briefly
    runtime.metrics.sample_events(runtime.state.events.stats())
    metrics.flush()
    logs.flush_decisions()


def settle_heap() -> None:
    """Once a worker has loaded everything, move what it holds (modules, the kubernetes
    client, config) out of the garbage collector's reach: a full collection walked all
    of it (14 ms here), stalling every request of the worker; now it walks only what
    requests left behind."""
    gc.collect()
    gc.freeze()


def worker_process(
    options: ServeOptions, spec: WorkerSpec, app_factory: Any, fallback: Config | None
) -> None:
    """The child side of a fork: run the worker, never return into the supervisor's code."""
    code = 0
    try:
        run_worker(options, spec, app_factory, fallback)
    except BaseException:
        log.exception("worker failed", extra={"slot": spec.slot, "generation": spec.generation})
        code = 3
    finally:
        logging.shutdown()
        os._exit(code)


def default_app(runtime: WorkerRuntime) -> Any:
    return create_app(runtime.state)
