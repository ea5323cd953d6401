"""``retry-webhook serve``: the Flask app behind gunicorn, over TLS 1.2+ only.

gunicorn builds an SSLContext per connection by default, re-reading and re-parsing the
key files on every handshake. ``TlsContexts`` instead keeps one context per worker and
swaps it when the certificate files change (checked at most once a second, on new
connections and by each worker's maintenance thread), so a rotated certificate is
served without a restart. What is loaded is always one consistent, valid pair:

- the files are stat'ed through their symlinks (a kubelet ``..data`` swap is a change);
- the stamp is taken before and after reading, so a pair read while it was being
  replaced is not used (the next check reads it again);
- the pair must parse, match and be within its validity (``certs.check_pem``), and
  OpenSSL checks the match again when loading. Until then the previous context stays:
  a new certificate with the old key (a non-atomic rotation) is never served.

Each worker also runs a small maintenance thread (``WorkerRuntime``): config reloads
(``webhook/reload.py``), certificate checks, and sampling the attempt cache into the
metrics. Metrics are served by a separate process (``webhook/metrics.py``).
"""

from __future__ import annotations

import datetime as dt
import errno
import gc
import logging
import os
import shutil
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from webhook import certs, engine, logs, metrics, runtimes
from webhook.app import State, create_app
from webhook.attempts import JobCache, NoCluster, connect
from webhook.config import Config, load_config
from webhook.reload import ConfigReloader, files_stamp

log = logging.getLogger(__name__)

#: TLS 1.2 suites with forward secrecy and AEAD only (TLS 1.3 suites are always strong).
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


@dataclass
class ServeOptions:
    config_path: str | None = None
    cert_dir: str = "certs"
    host: str = "0.0.0.0"  # noqa: S104 - a webhook must listen on the pod IP
    port: int = 8443
    workers: int = 2
    threads: int = 8
    kube: str = "auto"
    service: str = certs.DEFAULT_SERVICE
    namespace: str = certs.DEFAULT_NAMESPACE
    lookup_timeout: float = 0.5
    log_level: str = "info"
    graceful_timeout: int = 20
    keepalive: int = 75
    metrics_port: int = 9090
    #: Readiness waits at most this long for the attempt cache (fail open after).
    cache_sync_timeout: float = 10.0
    #: Seconds between a worker's checks of its config and certificate files.
    check_interval: float = 1.0
    #: CA bundle that client certificates must chain to (off when ``None``): lets only
    #: the API server, configured with a client certificate, call the webhook.
    client_ca: str | None = None
    #: Seconds a connection may stay silent mid-handshake or mid-request.
    read_timeout: float = 10.0
    #: Verdicts each worker remembers per object template (``webhook.memo``); 0: none.
    memo_entries: int = 256
    #: Each worker listens on a socket of its own (SO_REUSEPORT): see ``reuse_port``.
    reuse_port: bool = True


def bounded_socket_class(read_timeout: float) -> type[ssl.SSLSocket]:
    """An SSLSocket whose blocking mode has a timeout.

    gunicorn's threaded worker makes a connection's socket blocking while a thread reads
    the request, with no timeout: a client that completes the TLS handshake (or starts a
    request) and then goes silent would hold that thread forever, and a handful of such
    clients would starve the worker. With this class, a silence of ``read_timeout``
    seconds during the handshake or the request ends the connection and frees the
    thread; kept-alive idle connections are not affected (they wait in the poller).
    """

    class BoundedSSLSocket(ssl.SSLSocket):
        _stalled = False

        def setblocking(self, flag: bool) -> None:
            if flag:
                self.settimeout(read_timeout)
            else:
                super().setblocking(False)

        def do_handshake(self, block: bool = False) -> None:
            if self.gettimeout() is None:
                self.settimeout(read_timeout)
            try:
                super().do_handshake(block)
            except TimeoutError:
                raise self._dropped() from None

        def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
            try:
                return super().recv(buflen, flags)
            except TimeoutError:
                raise self._dropped() from None

        def _dropped(self) -> ConnectionResetError:
            # Reported as a reset: gunicorn then closes quietly (a stalled client is not
            # a server error worth a traceback in the logs, and could flood them).
            self._stalled = True
            return ConnectionResetError(
                errno.ECONNRESET, f"no data for {read_timeout:g}s: connection dropped"
            )

        def shutdown(self, how: int) -> None:
            # gunicorn closes connections "gracefully" on its main thread: half-close, then
            # linger up to 2 s for the peer to close. A peer that has just been dropped for
            # stalling would make every such close stall the whole worker; refusing the
            # half-close makes gunicorn close at once instead.
            if self._stalled:
                raise OSError("stalled connection: closed without lingering")
            super().shutdown(how)

    return BoundedSSLSocket


class _Changing(Exception):
    """The files changed while they were read."""


class TlsContexts:
    """One server SSLContext, reloaded when the certificate or key file changes."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        check_interval: float = 1.0,
        client_ca: Path | None = None,
        read_timeout: float = ServeOptions.read_timeout,
    ):
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.socket_class = bounded_socket_class(read_timeout)
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self.metrics: metrics.Metrics | None = None
        self.reloads = 0
        self.reload_failures = 0
        self.last_error: str | None = None
        self._failed_stamp: Any = None
        self._stamp, self._context, self.not_after = self._load_consistent()
        self._checked = time.monotonic()

    def _load_consistent(self) -> tuple[Any, ssl.SSLContext, dt.datetime]:
        """At start: the files may be mid-rotation; a few tries, then the real error."""
        for _ in range(5):
            try:
                return self._load()
            except _Changing:
                time.sleep(0.05)
        raise certs.CertError(f"{self.cert} and {self.key} keep changing; cannot load them")

    def _load(self) -> tuple[Any, ssl.SSLContext, dt.datetime]:
        before = files_stamp(self.cert, self.key)
        try:
            parsed = certs.check(self.cert, self.key)
            context = self._build()
        except (OSError, ssl.SSLError, certs.CertError):
            if self._stamp_now() != before:
                raise _Changing from None  # e.g. the old directory removed after a swap
            raise
        if self._stamp_now() != before:
            raise _Changing
        return before, context, parsed.not_valid_after_utc

    def _stamp_now(self) -> Any:
        try:
            return files_stamp(self.cert, self.key)
        except OSError:
            return None

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(CIPHERS)
        context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
        context.load_cert_chain(str(self.cert), str(self.key))
        context.sslsocket_class = self.socket_class
        if self.client_ca is not None:
            # Every handshake must present a certificate signed by this CA (mutual TLS).
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(self.client_ca))
        return context

    def attach(self, recorder: metrics.Metrics) -> None:
        """Record into this worker's metrics (called after fork: never the master's)."""
        self.metrics = recorder
        recorder.certificate_served(self.not_after.timestamp())

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return self._context
        with self._lock:
            if now - self._checked < self.check_interval:
                return self._context
            self._checked = now
            stamp = None
            try:
                stamp = files_stamp(self.cert, self.key)
                if stamp != self._stamp:
                    self._stamp, self._context, self.not_after = self._load()
                    self.reloads += 1
                    self.last_error = None
                    if self.metrics is not None:
                        self.metrics.certificate_reloaded(True)
                        self.metrics.certificate_served(self.not_after.timestamp())
                    log.info(
                        "serving certificate reloaded",
                        extra={"cert": str(self.cert), "not_after": self.not_after.isoformat()},
                    )
            except _Changing:
                pass  # caught mid-write: the next check reads the final files
            except (OSError, ssl.SSLError, certs.CertError) as err:
                # Mid-rotation (certificate and key not yet a pair) or a bad file: keep
                # serving the previous context. The stamp is not advanced, so the files
                # are tried again on every check (a certificate may become valid), but
                # each version of the files is counted and logged once.
                self.last_error = str(err)
                if stamp != self._failed_stamp:
                    self._failed_stamp = stamp
                    self.reload_failures += 1
                    if self.metrics is not None:
                        self.metrics.certificate_reloaded(False)
                    log.warning(
                        "certificate reload deferred; the previous certificate is still served",
                        extra={"error": str(err)},
                    )
        return self._context

    def status(self) -> tuple[bool, dict[str, Any]]:
        """Whether the certificate being served is still valid, and what it is."""
        expired = self.not_after <= certs._now()
        return not expired, {
            "notAfter": self.not_after.isoformat(),
            "expired": expired,
            "reloadError": self.last_error,
        }


class WorkerRuntime:
    """What each gunicorn worker runs beside the Flask app: the state handlers read,
    reloads of the config and certificate files, metrics sampling, and readiness."""

    def __init__(
        self,
        options: ServeOptions,
        tls: TlsContexts,
        recorder: metrics.Metrics,
        fallback_config: Config | None = None,
    ):
        self.options = options
        self.tls = tls
        self.metrics = recorder
        self.started = time.monotonic()
        self.state = State(metrics=recorder, readiness=self.readiness)
        engine.MEMO.max_entries = options.memo_entries
        self.reloader: ConfigReloader | None = None
        if options.config_path:
            self.reloader = ConfigReloader(
                options.config_path, self._apply, recorder.config_reloaded
            )
            self.state.config = self.reloader.load(fallback_config)
        recorder.config_loaded()
        clients = connect(options.kube)
        if clients is not None:
            self.state.attempts = JobCache(*clients, lookup_timeout=options.lookup_timeout).start()
        else:
            self.state.attempts = NoCluster()
        # Started by the first TrainJob it is asked about (webhook/runtimes.py).
        self.state.runtimes = runtimes.source_for(clients, options.lookup_timeout)
        tls.attach(recorder)
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
        self.tls.current()
        if self.reloader is not None:
            self.reloader.check()
        self.metrics.sample_cache(self.state.attempts.stats())
        self.metrics.flush()
        logs.flush_decisions()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when config and certificate are loaded and the attempt cache synced,
        but never held back by the cache for longer than ``cache_sync_timeout``: pods
        are admitted without a cache too (one bounded GET, else unchanged with a
        warning), while an unready webhook with failurePolicy Fail blocks the cluster."""
        reasons: list[str] = []
        cert_ok, certificate = self.tls.status()
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
            "reasons": reasons,
        }


class WebhookApplication(BaseApplication):
    def __init__(self, options: ServeOptions, tls: TlsContexts, config: Config):
        self.options = options
        self.tls = tls
        self.config = config  # as validated at start: a worker's fallback
        super().__init__()

    def load_config(self) -> None:
        opts = self.options
        settings: dict[str, Any] = {
            "bind": [f"{opts.host}:{opts.port}"],
            "workers": opts.workers,
            "worker_class": "gthread",
            "threads": opts.threads,
            "certfile": str(self.tls.cert),
            "keyfile": str(self.tls.key),
            "ssl_context": lambda _conf, _factory: self.tls.current(),
            "keepalive": opts.keepalive,
            "graceful_timeout": opts.graceful_timeout,
            "timeout": 30,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": opts.log_level,
            "logger_class": logs.GunicornLogger,
            "proc_name": "retry-webhook",
            "child_exit": _child_exit,
            "post_worker_init": _settle_heap,
            "reuse_port": reuse_port(opts),
        }
        # gunicorn >= 25.1 opens a control socket served by a thread in the master; a
        # threaded master forks unsafely, and nothing here needs it.
        if "control_socket_disable" in self.cfg.settings:
            settings["control_socket_disable"] = True
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        """Runs in each worker after fork: threads (cache, maintenance) start here."""
        runtime = WorkerRuntime(self.options, self.tls, metrics.get(), self.config)
        app = create_app(runtime.state)
        runtime.start()
        return app


def reuse_port(options: ServeOptions) -> bool:
    """Whether each worker listens on a socket of its own, bound with SO_REUSEPORT.

    With one shared listening socket, the workers race to accept, and a batch of new
    connections tends to go to whichever worker wakes first: measured here, 13 or more
    of a load generator's 16 kept-alive connections landed on one of two workers in
    about half the rounds, all 16 in some, leaving the other worker's core mostly idle
    (the API server keeps its connections too, so such a split lasts). With a socket per
    worker the kernel spreads connections over the workers by their addresses.
    """
    return options.reuse_port and hasattr(socket, "SO_REUSEPORT")


def check_port_free(host: str, port: int) -> None:
    """Fail the start clearly when the port is taken. Workers bind their own sockets with
    SO_REUSEPORT, which would share a port another such server holds: bind once without
    it first, so a second server on the same port refuses to start instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(f"cannot listen on {host}:{port}: {err.strerror}") from None


def _settle_heap(_worker: Any) -> None:
    """Once a worker has loaded everything, move what it holds (modules, the kubernetes
    client, config) out of the garbage collector's reach: a full collection walked all
    of it (14 ms here), stalling every request of the worker; now it walks only what
    requests left behind."""
    gc.collect()
    gc.freeze()


def _child_exit(_server: Any, worker: Any) -> None:
    metrics.worker_exited(worker.pid)


def serve(options: ServeOptions) -> None:
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
        tls = TlsContexts(
            paths.cert, paths.key, options.check_interval, client_ca, options.read_timeout
        )
    except ssl.SSLError as err:
        raise certs.CertError(f"cannot load TLS files: {err}") from None
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
        "serving",
        extra={
            "bind": f"{options.host}:{options.port}",
            "config": options.config_path,
            "certificate_not_after": tls.not_after.isoformat(),
        },
    )
    if reuse_port(options):
        check_port_free(options.host, options.port)
    master = os.getpid()
    try:
        WebhookApplication(options, tls, config).run()
    finally:
        # Workers leave run() through here too (gunicorn ends them with SystemExit):
        # only the master owns the exposition process and the metrics directory.
        if os.getpid() == master:
            metrics.stop_exposition(exposition)
            if created and directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
        else:  # a worker: what it has not written yet
            metrics.flush()
            logs.flush_decisions()


__all__ = ["Config", "ServeOptions", "TlsContexts", "WorkerRuntime", "serve"]
