"""``retry-webhook serve``: the Flask app on granian workers (Rust HTTP/1.1 and TLS), run
by a supervisor of our own.

Why granian, and why this shape (docs/OPERATIONS.md, "Why granian", has the measurements): TLS and
HTTP run in Rust on an event loop, so an idle or slow connection costs memory, not a
thread, and a request costs about half the CPU it cost under gunicorn. Each worker is a
process with one event loop; the app runs on it (``webhook/serving/rsgi.py``).

The supervisor (this process) does what granian's own process manager cannot do
without failing requests:

- **Certificates.** granian's TLS layer reads its files once, when a worker starts. The
  supervisor watches ``tls.crt``/``tls.key`` (and the ``--client-ca`` bundle) through
  their symlinks once a second, as the kubelet swaps a mounted Secret's ``..data``
  symlink and deletes the old directory. A new version is used only once it reads as
  one consistent, whole, valid pair (``read_serving_pair``); the workers then get those
  exact bytes in files of their own (``StagedPair``: anonymous memory, never a path the
  kubelet can swap or delete). A new certificate is served by a new *generation* of
  workers: started beside the old ones on the same listening sockets, and once they
  all serve, the old ones drain (each kept-alive connection is closed right after its
  next response, ``webhook/serving/rsgi.py``) and then stop gracefully. Requests on kept-alive
  connections never fail, and new connections get the new certificate within seconds.
- **Listening sockets.** One per worker slot (SO_REUSEPORT: the kernel spreads
  connections over the workers), created here and kept here, so a worker replacing one
  that crashed accepts from the very socket, and its queue of waiting connections: none
  is reset. Two such sets (``Listeners``): a new generation takes the other set, and a
  socket filter steers new connections to it alone, so the old workers have none left
  half-way through a handshake when they stop.
- **Crashed workers** are replaced (with a back-off when one keeps crashing), and their
  live metrics dropped. **SIGTERM** stops every worker gracefully: they stop accepting,
  finish the requests they have, and exit; after ``graceful_timeout`` they are killed.
  **SIGHUP** starts a new generation of workers the same way as a new certificate.

Config reloads need no new workers: each worker checks the file once a second
(``webhook/serving/reload.py``). Metrics are served by a separate process
(``webhook/serving/metrics.py``).
The supervisor never starts a thread: it forks its workers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import json
import logging
import mmap
import os
import resource
import shutil
import signal
import socket
import struct
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from webhook.admission import engine
from webhook.cluster.attempts import AttemptLookup, JobCache, NoCluster, connect
from webhook.cluster.deletions import DeletionMarker
from webhook.cluster.events import instance_name, recorder_for
from webhook.cluster.history import HistoryKey, HistoryLookup
from webhook.cluster.leadership import LeaderNote, LeaderState, NoLeader
from webhook.cluster.limits import LimitLookup, LimitRangeCache
from webhook.cluster.limits import ask as limit_lookup
from webhook.cluster.nodes import NodeAnswer, NodeCache
from webhook.cluster.nodes import ask as node_lookup
from webhook.cluster.runtimes import RuntimeCache, RuntimeLookup
from webhook.cluster.version import ServerVersion
from webhook.controller.fence import Fence, fenced_client
from webhook.controller.manager import ControllerOptions, Manager, install_signal_handlers
from webhook.kube.scheduling import Placement
from webhook.policy.config import Config, load_config
from webhook.serving import lifeline, logs, metrics
from webhook.serving.app import MAX_BODY_BYTES, State, create_app
from webhook.serving.controlproc import DISABLED, ControllerProcess
from webhook.serving.reload import ConfigReloader, files_stamp
from webhook.serving.rsgi import NeedsThread, WsgiOverRsgi
from webhook.tls import certs

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    config_path: str | None = None
    cert_dir: str = "certs"
    host: str = "0.0.0.0"  # noqa: S104 - a webhook must listen on the pod IP
    port: int = 8443
    workers: int = 2
    #: Threads per worker for requests that wait on the Kubernetes API (an attempt-cache
    #: miss); every other request is answered on the worker's event loop.
    threads: int = 8
    kube: str = "auto"
    service: str = certs.DEFAULT_SERVICE
    namespace: str = certs.DEFAULT_NAMESPACE
    lookup_timeout: float = 0.5
    log_level: str = "info"
    #: Seconds the workers get to finish their requests after SIGTERM.
    graceful_timeout: float = 20.0
    metrics_port: int = 9090
    #: Readiness waits at most this long for the attempt cache (fail open after).
    cache_sync_timeout: float = 10.0
    #: Seconds between checks of the certificate files (supervisor) and the config
    #: file (each worker).
    check_interval: float = 1.0
    #: CA bundle that client certificates must chain to (off when ``None``): lets only
    #: the API server, configured with a client certificate, call the webhook.
    client_ca: str | None = None
    #: Seconds a request's headers may take to arrive, counted from when the connection
    #: is ready for them (after the TLS handshake, or after the previous response: an
    #: idle kept-alive connection is closed after this long too).
    header_timeout: float = 10.0
    #: Seconds a request's body may take to arrive after its headers.
    body_timeout: float = 10.0
    #: Connections each worker holds at once (TLS handshakes in progress not counted).
    max_connections: int = 1024
    #: Seconds an old generation of workers keeps answering (closing each kept-alive
    #: connection after its next response) before it stops.
    drain_seconds: float = 2.0
    #: Verdicts each worker remembers per object template (``webhook.admission.memo``); 0: none.
    memo_entries: int = 256
    #: Each worker listens on a socket of its own (SO_REUSEPORT): see ``reuse_port``.
    reuse_port: bool = True
    #: Run the controller (``webhook.controller``) beside the workers when there is a
    #: cluster connection; its Lease (namespace: the pod's, else ``namespace``).
    controller: bool = True
    lease_name: str = "retry-policy-webhook-controller"
    lease_namespace: str | None = None
    lease_seconds: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def controller_options(self) -> ControllerOptions:
        namespace = self.lease_namespace or os.environ.get("POD_NAMESPACE") or self.namespace
        return ControllerOptions(
            namespace,
            self.lease_name,
            lease_seconds=self.lease_seconds,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
        )


#: The TLS handshake's time limit: granian's TLS listener's, fixed at 10 s.
HANDSHAKE_TIMEOUT = 10.0
#: The most a request's headers (and a read of its body) may buffer, per connection.
HTTP1_BUFFER = 64 * 1024
#: Waiting connections each listening socket queues while its worker is busy or full.
BACKLOG = 1024
#: Seconds a worker may take to start serving (loading, the attempt cache's client).
STARTUP_TIMEOUT = 120.0


# --- the certificate ---------------------------------------------------------------------


class _Changing(Exception):
    """The files changed while they were read."""


@dataclass(frozen=True)
class ServingPair:
    """One consistent version of the serving files, checked: the bytes the workers get."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    not_after: dt.datetime
    stamp: Any


def read_serving_pair(cert: Path, key: Path, client_ca: Path | None = None) -> ServingPair:
    """Read the files once, as one version, and check that they can be served.

    The files are stat'ed through their symlinks before and after reading (a kubelet
    ``..data`` swap is a change); when the stamps differ, or a file vanished meanwhile
    (the old directory removed after a swap), ``_Changing`` is raised and the caller
    reads again later. The pair must parse, match and be within its validity
    (``certs.check_pem``), and its key must be one the TLS layer can sign with.
    """
    paths = [cert, key] + ([client_ca] if client_ca else [])
    before = _stamp(paths)
    try:
        data = [path.read_bytes() for path in paths]
        parsed = certs.check_pem(data[0], data[1], str(cert), str(key))
        _check_signable(data[1], str(key))
        if client_ca is not None:
            _check_bundle(data[2], str(client_ca))
    except (OSError, certs.CertError):
        if _stamp(paths) != before:
            raise _Changing from None
        raise
    if _stamp(paths) != before:
        raise _Changing
    return ServingPair(
        data[0], data[1], data[2] if client_ca else None, parsed.not_valid_after_utc, before
    )


def _stamp(paths: list[Path]) -> Any:
    try:
        return files_stamp(*paths)
    except OSError as err:
        return ("missing", err.errno)


def _check_signable(key_pem: bytes, name: str) -> None:
    """Keys rustls (granian's TLS layer) signs with: RSA of 2048 bits or more, ECDSA on
    P-256 or P-384, Ed25519. Checked here so that a key it cannot use is refused like
    a mismatched one, instead of failing every handshake."""
    key = load_pem_private_key(key_pem, None)
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size >= 2048:
        return
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in (
        "secp256r1",
        "secp384r1",
    ):
        return
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return
    raise certs.CertError(
        f"private key {name} is not one the TLS layer can use (RSA of 2048 bits or more, "
        "ECDSA P-256 or P-384, or Ed25519)"
    )


def _check_bundle(pem: bytes, name: str) -> None:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise certs.CertError(f"client CA bundle {name} holds no certificate: {err}") from None
    if not found:
        raise certs.CertError(f"client CA bundle {name} holds no certificate")


class CertificateWatch:
    """The supervisor's view of the serving files: the pair being served, and a newer
    valid one when the files change (``changed``)."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        client_ca: Path | None = None,
        recorder: metrics.SupervisorMetrics | None = None,
    ):
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.recorder = recorder
        self.last_error: str | None = None
        self._failed: Any = None
        for _ in range(5):  # at start the files may be mid-rotation: a few tries
            try:
                self.serving = read_serving_pair(cert, key, client_ca)
                break
            except _Changing:
                time.sleep(0.05)
        else:
            raise certs.CertError(f"{cert} and {key} keep changing; cannot load them")
        #: The version last judged (served, being rolled out, or refused).
        self._seen = self.serving.stamp

    def changed(self) -> ServingPair | None:
        """A new valid version of the files, once; ``None`` when there is none. A version
        that cannot be served is logged and counted once, and the one being served stays
        (it is tried again on every check: a certificate may become valid)."""
        paths = [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])
        stamp = _stamp(paths)
        if stamp == self._seen:
            return None
        try:
            pair = read_serving_pair(self.cert, self.key, self.client_ca)
        except _Changing:
            return None  # caught mid-write: the next check reads the final files
        except (OSError, certs.CertError, ValueError) as err:
            self.refused(stamp, str(err))
            return None
        self._seen = pair.stamp
        return pair

    def refused(self, stamp: Any, error: str) -> None:
        self.last_error = error
        if stamp == self._failed:
            return
        self._failed = stamp
        if self.recorder is not None:
            self.recorder.certificate_reloaded(False)
        log.warning(
            "certificate reload deferred; the previous certificate is still served",
            extra={"error": error},
        )

    def served(self, pair: ServingPair) -> None:
        """``pair`` is now what every worker serves."""
        self.serving = pair
        self.last_error = None
        if self.recorder is not None:
            self.recorder.certificate_reloaded(True)
        log.info(
            "serving certificate reloaded",
            extra={"cert": str(self.cert), "not_after": pair.not_after.isoformat()},
        )

    def forget(self, pair: ServingPair, error: str) -> None:
        """``pair`` could not be rolled out (its workers failed to start)."""
        self.refused(pair.stamp, error)


class StagedPair:
    """One generation's certificate, key and client CA as files its workers' TLS layer
    reads, at paths that never change: anonymous memory files (``memfd``), opened by the
    workers through ``/proc/self/fd``. The key never touches a disk, and nothing the
    kubelet does to the mounted Secret can change or remove what a worker is about to
    read. (Where memory files do not exist, a private temporary directory.)"""

    NAMES = ("tls.crt", "tls.key", "client-ca.crt")

    def __init__(self, pair: ServingPair):
        self.pair = pair
        self._fds: dict[str, int] = {}
        self._dir: Path | None = None
        contents = dict(zip(self.NAMES, (pair.cert, pair.key, pair.client_ca), strict=True))
        for name, data in contents.items():
            if data is None:
                continue
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
                with os.fdopen(os.dup(fd), "wb") as handle:
                    handle.write(data)
                self._fds[name] = fd
            else:
                if self._dir is None:
                    self._dir = Path(tempfile.mkdtemp(prefix="retry-webhook-tls-"))
                certs.write_private(self._dir / name, data)

    def path(self, name: str) -> str | None:
        if name in self._fds:
            return f"/proc/self/fd/{self._fds[name]}"
        if self._dir is not None and (self._dir / name).exists():
            return str(self._dir / name)
        return None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class SharedNote:
    """A few bytes of JSON the supervisor writes and every worker reads (memory shared
    across fork): the latest certificate problem, for ``/readyz``."""

    SIZE = 4096

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self.SIZE)

    def write(self, value: Any) -> None:
        data = json.dumps(value).encode()[: self.SIZE - 4]
        self._map[4 : 4 + len(data)] = data
        self._map[0:4] = struct.pack("I", len(data))

    def read(self) -> Any:
        (size,) = struct.unpack("I", self._map[0:4])
        try:
            return json.loads(self._map[4 : 4 + min(size, self.SIZE - 4)])
        except ValueError:  # read mid-write: nothing to say this time
            return None


# --- a worker ----------------------------------------------------------------------------


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
        return limit_lookup(self.limits, namespace)

    def placement(self, question: Placement) -> NodeAnswer:
        """From the Node cache; its first questions may wait for its first list: on a
        thread (``webhook.cluster.nodes``)."""
        if self.nodes is None:
            return node_lookup(None, question)
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


@dataclass
class CertificateStatus:
    """What a worker knows of the certificate it serves, for readiness."""

    not_after: dt.datetime
    note: SharedNote | None = None

    def status(self) -> tuple[bool, dict[str, Any]]:
        expired = self.not_after <= certs._now()
        shared = self.note.read() if self.note is not None else None
        return not expired, {
            "notAfter": self.not_after.isoformat(),
            "expired": expired,
            "reloadError": (shared or {}).get("reloadError"),
        }


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
            cache = JobCache(*clients, lookup_timeout=options.lookup_timeout).start()
            self.loop_attempts = LoopAttempts(
                cache,
                LimitRangeCache(clients[1]).start(),
                # Started by the first pod that keeps off failed nodes (cluster/nodes.py).
                NodeCache(clients[1], options.lookup_timeout),
            )
            self.state.attempts = self.loop_attempts
        else:
            self.state.attempts = NoCluster()
        # Started by the first TrainJob it is asked about (webhook/cluster/runtimes.py).
        self.loop_runtimes: LoopRuntimes | None = None
        if clients is not None:
            self.loop_runtimes = LoopRuntimes(RuntimeCache.of(clients, options.lookup_timeout))
            self.state.runtimes = self.loop_runtimes
        # Decisions that shape new pods, as Events: queued by requests, written by the
        # recorder's own thread (started by the first one).
        if clients is not None:
            self.state.events = recorder_for(clients[0].api_client, instance_name())[0]
            # Marks the pods disruptors delete, off the admission path (cluster/deletions.py),
            # telling it with the worker's Events.
            self.state.deletions = DeletionMarker(clients[1], self.state.events)
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


def _worker_process(
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


# --- the supervisor ------------------------------------------------------------------------


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
            _worker_process(self.options, spec, self.app_factory, self.fallback_config)
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
        if self.pending is not None or not self.listeners.free_for(self.generation + 1, self):
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


def run_controller(options: ServeOptions, note: LeaderNote) -> int:
    """The controller process's body (``webhook.serving.controlproc``): leader election and,
    while leading, the reconcilers; exits ``DISABLED`` without a cluster connection."""
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
    acting = fenced_client(api_client.configuration, fence)
    events, resolver = recorder_for(acting, instance_name())
    recorder = metrics.ControllerMetrics(events.stats) if options.metrics_port else None
    manager = Manager(
        client.CoordinationV1Api(api_client),
        options.controller_options(),
        reconcilers.build(acting, options.controller_options(), events, resolver, recorder),
        note,
        recorder,
        fence,
    )
    install_signal_handlers(manager.stop)  # SIGTERM, the supervisor's death too (lifeline)
    code = manager.run()
    if code == 0:  # a clean stop; after a loss the fence refuses them anyway
        events.flush(2.0)  # the Events still queued, briefly
    if recorder is not None:
        recorder.flush()
    return code


def default_app(runtime: WorkerRuntime) -> Any:
    return create_app(runtime.state)


def reuse_port(options: ServeOptions) -> bool:
    """Whether each worker listens on a socket of its own, bound with SO_REUSEPORT.

    With one shared listening socket, the workers race to accept, and a batch of new
    connections tends to go to whichever worker wakes first (the API server keeps its
    connections, so such a split lasts). With a socket per worker the kernel spreads
    connections over the workers by their addresses.
    """
    return options.reuse_port and hasattr(socket, "SO_REUSEPORT")


class Listeners:
    """The listening sockets, and which of them get new connections.

    Two *bands* of sockets, all bound to the port with SO_REUSEPORT and kept open here for
    the server's whole life: one per worker slot in each band (or one per band, shared by
    the slots, with ``--no-reuse-port``). The workers of a generation accept from one
    band, and a small classic BPF program on the sockets (``SO_ATTACH_REUSEPORT_CBPF``)
    makes the kernel hand new connections only to that band's sockets, spread at random
    over its slots. When a new generation is ready, the program is switched to the other
    band: from then on the old workers get no new connection, so by the time they stop
    none of them is half-way through a TLS handshake, and their queues are empty.

    Where the program cannot be attached (not Linux), there is one band, shared by the
    generations; a connection the old worker had just accepted when it stopped (at most
    its handshakes in progress at that moment) then fails.
    """

    def __init__(self, options: ServeOptions):
        self.options = options
        self.per_slot = reuse_port(options)
        width = options.workers if self.per_slot else 1
        self.bands: list[list[socket.socket]] = [self._band(width)]
        self.steered = False
        if hasattr(socket, "SO_REUSEPORT"):
            self.bands.append(self._band(width))
            try:
                _steer(self.bands[0][0], 0, width)
                self.steered = True
            except OSError as err:
                log.info(
                    "connections cannot be steered to one generation of workers; a "
                    "new generation shares the old one's sockets",
                    extra={"error": str(err)},
                )
                for sock in self.bands.pop():
                    sock.close()

    def _band(self, width: int) -> list[socket.socket]:
        options = self.options
        family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
        band = []
        for _ in range(width):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.bind((options.host, options.port))
            except OSError as err:
                sock.close()
                raise OSError(
                    f"cannot listen on {options.host}:{options.port}: {err.strerror}"
                ) from None
            sock.listen(BACKLOG)  # (listening order is the kernel's index of the socket)
            band.append(sock)
        return band

    def _band_of(self, generation: int) -> list[socket.socket]:
        return self.bands[(generation - 1) % len(self.bands)]

    def socket_for(self, generation: int, slot: int) -> socket.socket:
        band = self._band_of(generation)
        return band[slot] if self.per_slot else band[0]

    def free_for(self, generation: int, supervisor: Supervisor) -> bool:
        """Whether ``generation`` may start: no worker of an older generation is still on
        the sockets it would use (two generations back, and still stopping)."""
        if not self.steered:
            return True  # one band: generations share it (see the class docstring)
        band = self._band_of(generation)
        return not any(
            self._band_of(w.generation) is band and w.generation < generation
            for w in supervisor.workers.values()
        )

    def route_to(self, generation: int) -> None:
        """New connections go to ``generation``'s sockets from now on."""
        if self.steered:
            band = (generation - 1) % len(self.bands)
            width = len(self.bands[0])
            _steer(self.bands[0][0], band * width, width)

    def close(self) -> None:
        for band in self.bands:
            for sock in band:
                sock.close()


#: ``SO_ATTACH_REUSEPORT_CBPF`` (Linux 4.5+), and the classic BPF opcodes used below.
_SO_ATTACH_REUSEPORT_CBPF = 51
_LD_W_ABS, _ALU_MOD_K, _ALU_ADD_K, _RET_A = 0x20, 0x94, 0x04, 0x16
_SKF_AD_RANDOM = 0xFFFFF000 + 56  # the ancillary "random" word


def _steer(sock: socket.socket, first: int, count: int) -> None:
    """Make the kernel hand each new connection of ``sock``'s reuseport group to the
    socket at index ``first + random % count`` (indices in listening order)."""
    import ctypes

    class Instruction(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_uint16),
            ("jt", ctypes.c_uint8),
            ("jf", ctypes.c_uint8),
            ("k", ctypes.c_uint32),
        ]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    code = (Instruction * 4)(
        Instruction(_LD_W_ABS, 0, 0, _SKF_AD_RANDOM),
        Instruction(_ALU_MOD_K, 0, 0, count),
        Instruction(_ALU_ADD_K, 0, 0, first),
        Instruction(_RET_A, 0, 0, 0),
    )
    program = Program(len(code), code)
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, bytes(program))


def check_port_free(host: str, port: int) -> None:
    """Fail the start clearly when the port is taken. Workers' sockets are bound with
    SO_REUSEPORT, which would share a port another such server holds: bind once without
    it first, so a second server on the same port refuses to start instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(f"cannot listen on {host}:{port}: {err.strerror}") from None


def raise_file_limit(wanted: int) -> int:
    """Every connection is a file descriptor: raise the soft limit towards the hard one
    (a shell's default of 1024 would cap the connections long before the bound does)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("cannot raise the open-file limit", extra={"error": str(err)})
    return soft


def serve(options: ServeOptions, app_factory: Any = None) -> None:
    logs.setup(options.log_level)
    config = load_config(options.config_path)  # refuse to start on a bad config
    paths, generated = certs.ensure(options.cert_dir, options.service, options.namespace)
    if generated:
        log.info(
            "generated development certificates",
            extra={"cert_dir": str(paths.directory), "ca": str(paths.ca_cert)},
        )
    client_ca = Path(options.client_ca) if options.client_ca else None
    if client_ca is not None and not client_ca.is_file():
        raise certs.CertError(f"client CA bundle {client_ca} does not exist")
    try:
        watch = CertificateWatch(paths.cert, paths.key, client_ca)
    except OSError as err:
        raise certs.CertError(f"cannot load TLS files: {err}") from None
    if hasattr(socket, "SO_REUSEPORT"):
        check_port_free(options.host, options.port)
    # Connections in their TLS handshake hold no slot but a descriptor each: room for
    # far more than the slots.
    limit = raise_file_limit(max(65536, 4 * options.workers * options.max_connections))
    exposition, directory, created = None, None, False
    if options.metrics_port:
        directory, created = metrics.prepare_multiprocess_dir()
        sock = metrics.bind(options.host, options.metrics_port)
        exposition = metrics.start_exposition(sock)
        sock.close()  # the exposition process has its own copy
        log.info(
            "metrics",
            extra={"bind": f"{options.host}:{options.metrics_port}", "dir": str(directory)},
        )
    log.info(
        "starting",
        extra={
            "bind": f"{options.host}:{options.port}",
            "config": options.config_path,
            "certificate_not_after": watch.serving.not_after.isoformat(),
            "open_file_limit": limit,
        },
    )
    watch.recorder = metrics.SupervisorMetrics() if options.metrics_port else None
    try:
        Supervisor(options, watch, config, app_factory).run()
    finally:
        metrics.stop_exposition(exposition)
        if created and directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


__all__ = [
    "CertificateWatch",
    "Config",
    "ServeOptions",
    "ServingPair",
    "Supervisor",
    "WorkerRuntime",
    "read_serving_pair",
    "serve",
]
