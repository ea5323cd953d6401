"""``retry-webhook serve``: the Flask app behind gunicorn, over TLS 1.2+ only.

gunicorn builds an SSLContext per connection by default, re-reading and re-parsing the
key files on every handshake. ``TlsContexts`` instead keeps one context per worker and
swaps it when the certificate files change (checked at most once a second), so a
rotated certificate is served without a restart, and a half-written pair (new
certificate, old key) is never served: the old context stays until both match.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from webhook import certs
from webhook.app import State, create_app
from webhook.attempts import JobCache, NoCluster, connect
from webhook.config import Config, load_config

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


class TlsContexts:
    """One server SSLContext, reloaded when the certificate or key file changes."""

    def __init__(self, cert: Path, key: Path, check_interval: float = 1.0):
        self.cert = cert
        self.key = key
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._stamp = self._files_stamp()
        self._context = self._build()
        self._checked = time.monotonic()
        self.reloads = 0
        self.reload_failures = 0

    def _files_stamp(self) -> tuple:
        stats = [os.stat(p) for p in (self.cert, self.key)]
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(CIPHERS)
        context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
        context.load_cert_chain(str(self.cert), str(self.key))
        return context

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return self._context
        with self._lock:
            if now - self._checked < self.check_interval:
                return self._context
            self._checked = now
            try:
                stamp = self._files_stamp()
                if stamp != self._stamp:
                    certs.check(self.cert, self.key)
                    self._context = self._build()
                    self._stamp = stamp
                    self.reloads += 1
                    log.info("serving certificate reloaded", extra={"cert": str(self.cert)})
            except (OSError, ssl.SSLError, certs.CertError) as err:
                # Mid-rotation (certificate and key not yet a pair) or a bad file: keep
                # serving the previous context and try again on the next check.
                self.reload_failures += 1
                log.warning("certificate reload deferred: %s", err)
        return self._context


class WebhookApplication(BaseApplication):
    def __init__(self, options: ServeOptions, tls: TlsContexts):
        self.options = options
        self.tls = tls
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
            "proc_name": "retry-webhook",
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        """Runs in each worker after fork: threads (the attempt cache) start here."""
        return create_app(build_state(self.options))


def build_state(options: ServeOptions) -> State:
    config = load_config(options.config_path)
    state = State(config=config)
    clients = connect(options.kube)
    if clients is not None:
        cache = JobCache(*clients, lookup_timeout=options.lookup_timeout).start()
        state.attempts = cache
    else:
        state.attempts = NoCluster()
    return state


def serve(options: ServeOptions) -> None:
    from webhook import logs

    logs.setup(options.log_level)
    load_config(options.config_path)  # refuse to start on a bad config, before forking
    paths, generated = certs.ensure(options.cert_dir, options.service, options.namespace)
    if generated:
        log.info(
            "generated development certificates",
            extra={"cert_dir": str(paths.directory), "ca": str(paths.ca_cert)},
        )
    certs.check(paths.cert, paths.key)
    tls = TlsContexts(paths.cert, paths.key)
    log.info(
        "serving",
        extra={"bind": f"{options.host}:{options.port}", "config": options.config_path},
    )
    WebhookApplication(options, tls).run()


__all__ = ["Config", "ServeOptions", "TlsContexts", "serve"]
