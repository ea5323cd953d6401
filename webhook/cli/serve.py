"""``serve``: the HTTPS admission server (``webhook.serving``), its options as flags."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from webhook.cli.common import EXIT_FAILED, EXIT_INPUT, EXIT_OK
from webhook.policy.config import ConfigError
from webhook.tls import certs


def run_server(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from webhook.serving.options import ServeOptions
    from webhook.serving.server import serve

    options = ServeOptions(
        config_path=args.config,
        cert_dir=args.cert_dir,
        host=args.host,
        port=args.port,
        workers=args.workers,
        threads=args.threads,
        kube=args.kube,
        service=args.service,
        namespace=args.namespace,
        lookup_timeout=args.lookup_timeout,
        log_level=args.log_level,
        metrics_port=args.metrics_port,
        cache_sync_timeout=args.cache_sync_timeout,
        client_ca=args.client_ca,
        header_timeout=args.header_timeout or args.read_timeout,
        body_timeout=args.body_timeout or args.read_timeout,
        max_connections=args.max_connections,
        memo_entries=args.memo_entries,
        reuse_port=args.reuse_port,
        controller=args.controller,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        lease_seconds=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        kube_api_qps=args.kube_api_qps,
        kube_api_burst=args.kube_api_burst,
        peer_mark_limit=args.peer_mark_limit,
        event_series_seconds=args.event_series_seconds,
    )
    if not options.renew_deadline < options.lease_seconds:
        print("Error: --renew-deadline must be shorter than --lease-duration", file=stderr)
        return EXIT_INPUT
    if not options.retry_period < options.renew_deadline:
        print("Error: --retry-period must be shorter than --renew-deadline", file=stderr)
        return EXIT_INPUT
    try:
        serve(options)
    except (ConfigError, certs.CertError, OSError) as err:
        # OSError: a port that is taken, a certificate directory that cannot be written.
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    except RuntimeError as err:  # the workers could not start (their log says why)
        print(f"Error: {err}", file=stderr)
        return EXIT_FAILED
    return EXIT_OK


def _seconds(text: str) -> float:
    """A time limit in seconds, > 0, for argparse."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def _positive(text: str) -> int:
    """A whole number >= 1, for argparse."""
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _count(text: str) -> int:
    """A whole number >= 0, for argparse (which turns the error into a usage message)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return value


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the HTTPS admission server")
    _server_options(serve)
    _connection_options(serve)
    _controller_options(serve)
    serve.set_defaults(func=run_server)


def _server_options(serve: argparse.ArgumentParser) -> None:
    """What it serves, from where, and with what of the cluster."""
    serve.add_argument("--config", help="cluster defaults YAML (default: built-in defaults)")
    serve.add_argument("--cert-dir", default="certs", help="tls.crt/tls.key (generated if absent)")
    serve.add_argument("--host", default="0.0.0.0")  # noqa: S104
    serve.add_argument("--port", type=int, default=8443)
    serve.add_argument(
        "--workers",
        type=_positive,
        default=2,
        help="worker processes (one core each at most; each keeps its own attempt cache)",
    )
    serve.add_argument(
        "--threads",
        type=_positive,
        default=8,
        help="threads per worker for requests that wait on the Kubernetes API (an "
        "attempt-cache miss); every other request is answered on the worker's event loop",
    )
    serve.add_argument(
        "--kube",
        choices=("auto", "off", "incluster", "kubeconfig"),
        default="auto",
        help="API access for attempt counts (auto: in-cluster, then kubeconfig, else off)",
    )
    serve.add_argument("--service", default=certs.DEFAULT_SERVICE)
    serve.add_argument("--namespace", default=certs.DEFAULT_NAMESPACE)
    serve.add_argument("--lookup-timeout", type=float, default=0.5)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="plain-HTTP port for Prometheus metrics (/metrics); 0 turns them off",
    )
    serve.add_argument(
        "--cache-sync-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="readiness waits at most this long for the attempt cache, then fails open",
    )


def _connection_options(serve: argparse.ArgumentParser) -> None:
    """Who may connect, how long a request may take, and what each worker holds."""
    serve.add_argument(
        "--client-ca",
        metavar="FILE",
        help="require client certificates signed by this CA (mutual TLS with the API "
        "server; off by default)",
    )
    serve.add_argument(
        "--header-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="a request's headers must arrive within this (from the end of the TLS "
        "handshake or of the previous response; an idle kept-alive connection is closed "
        "after it too), else the connection is closed (default 10)",
    )
    serve.add_argument(
        "--body-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="a request's body must arrive within this after its headers, else 408 and "
        "the connection is closed (default 10)",
    )
    serve.add_argument(
        "--read-timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="both --header-timeout and --body-timeout (where those are not given)",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive,
        default=1024,
        metavar="N",
        help="connections each worker holds at once; more wait in the kernel's queue "
        "until one closes (default 1024)",
    )
    serve.add_argument(
        "--memo-entries",
        type=_count,
        default=256,
        metavar="N",
        help="verdicts each worker remembers per object template, so the pods of one Job "
        "are computed once (0 turns it off)",
    )
    serve.add_argument(
        "--no-reuse-port",
        dest="reuse_port",
        action="store_false",
        help="one listening socket shared by the workers (default: one per worker, "
        "SO_REUSEPORT, so the kernel spreads connections evenly over them)",
    )


def _controller_options(serve: argparse.ArgumentParser) -> None:
    """The controller beside admission, and its leader election."""
    serve.add_argument(
        "--no-controller",
        dest="controller",
        action="store_false",
        help="do not run the controller (retry delays, Events, history) beside admission",
    )
    serve.add_argument(
        "--lease-name",
        default="retry-policy-webhook-controller",
        help="the coordination.k8s.io Lease the replicas' controllers elect a leader on",
    )
    serve.add_argument(
        "--lease-namespace",
        help="the Lease's namespace (default: $POD_NAMESPACE, else --namespace)",
    )
    serve.add_argument(
        "--lease-duration",
        type=_seconds,
        default=15.0,
        help="seconds a standby waits for a silent leader before it takes over",
    )
    serve.add_argument(
        "--renew-deadline",
        type=_seconds,
        default=10.0,
        help="seconds a leader keeps acting without renewing before it stops",
    )
    serve.add_argument(
        "--retry-period", type=_seconds, default=2.0, help="seconds between Lease attempts"
    )
    serve.add_argument(
        "--kube-api-qps",
        type=_seconds,
        default=50.0,
        metavar="QPS",
        help="the controller's requests a second, for each of its two limiters (critical: "
        "pod conditions and gate releases; bulk: Events, records, lists)",
    )
    serve.add_argument(
        "--kube-api-burst",
        type=_positive,
        default=100,
        metavar="N",
        help="the controller's requests at once beyond --kube-api-qps, for each limiter",
    )
    serve.add_argument(
        "--event-series-seconds",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long repeats of an Event already written are held before its series "
        "count is written (one write for all of them)",
    )
    serve.add_argument(
        "--peer-mark-limit",
        type=_positive,
        default=1000,
        metavar="N",
        help="the most peers marked PeerDisrupted for one disruption (peer-disruptions); "
        "past it, a Warning Event and a metric",
    )
