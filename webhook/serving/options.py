"""``retry-webhook serve``'s options, and the fixed limits of its workers."""

from __future__ import annotations

import os
from dataclasses import dataclass

from webhook.controller.manager import ControllerOptions
from webhook.tls import certs


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
    #: The controller's client-side rate limits: each of its two limiters
    #: (``webhook.controller.ratelimit``) this many requests a second, this many at once.
    kube_api_qps: float = 50.0
    kube_api_burst: int = 100
    #: The most peers the controller marks for one disruption (peer-disruptions).
    peer_mark_limit: int = 1000
    #: How long repeats of a written Event are held before its series is written.
    event_series_seconds: float = 30.0

    def controller_options(self) -> ControllerOptions:
        namespace = self.lease_namespace or os.environ.get("POD_NAMESPACE") or self.namespace
        return ControllerOptions(
            namespace,
            self.lease_name,
            lease_seconds=self.lease_seconds,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
            peer_mark_limit=self.peer_mark_limit,
        )


#: The TLS handshake's time limit: granian's TLS listener's, fixed at 10 s.
HANDSHAKE_TIMEOUT = 10.0
#: The most a request's headers (and a read of its body) may buffer, per connection.
HTTP1_BUFFER = 64 * 1024
#: Waiting connections each listening socket queues while its worker is busy or full.
BACKLOG = 1024
#: Seconds a worker may take to start serving (loading, the attempt cache's client).
STARTUP_TIMEOUT = 120.0
