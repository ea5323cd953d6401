"""``retry-webhook serve``: the Flask app on granian workers (Rust HTTP/1.1 and TLS), run
by a supervisor of our own.

Why granian, and why this shape (docs/OPERATIONS.md, "Why granian", has the measurements): TLS and
HTTP run in Rust on an event loop, so an idle or slow connection costs memory, not a
thread, and a request costs about half the CPU it cost under gunicorn. Each worker is a
process with one event loop; the app runs on it (``webhook/serving/rsgi.py``).

The parts: ``options`` (``ServeOptions``), ``supervisor`` (the workers' generations,
signals, crashes), ``worker`` (one granian worker and what it runs beside the app),
``listeners`` (the listening sockets), ``certwatch`` (the serving certificate, watched
and reloaded) and ``controlproc`` (the controller's process). Config reloads need no new
workers: each worker checks the file once a second (``webhook/serving/reload.py``).
Metrics are served by a separate process (``webhook/serving/metrics.py``).
"""

from __future__ import annotations

import logging
import resource
import socket
from pathlib import Path
from typing import Any

from webhook.policy.config import load_config
from webhook.serving import logs, metrics, metricsdir
from webhook.serving.certwatch import CertificateWatch
from webhook.serving.listeners import check_port_free
from webhook.serving.options import ServeOptions
from webhook.serving.supervisor import Supervisor
from webhook.tls import certs

log = logging.getLogger(logs.SERVER_LOGGER)


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
        directory, created = metricsdir.prepare_multiprocess_dir()
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
            metricsdir.release_multiprocess_dir(directory)
