"""``retry-webhook``: serve the webhook, dry-run manifests offline, manage certificates.

The dry-run runs the same engine as the server, on the object the server would see:
API defaults applied first, and the manifest recorded as the user's intent the way
``kubectl apply`` records it (so a written ``backoffLimit: 6`` is told apart from a
defaulted one). Exit codes are for pipelines: 0 all allowed, 1 any denied, 2 the input
or config could not be read.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import yaml

from webhook.admission import engine
from webhook.cluster.runtimes import GivenRuntimes, is_runtime
from webhook.cluster.version import GivenVersion
from webhook.kube import defaulting
from webhook.kube.intent import LAST_APPLIED
from webhook.kube.objects import mapping
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config, ConfigError, load_config
from webhook.policy.model import KEYS
from webhook.tls import certs

EXIT_OK, EXIT_DENIED, EXIT_INPUT = 0, 1, 2
EXIT_FAILED = 1  # a command that could not finish (e.g. the API failed): run it again
#: The reader of the output went away (``retry-webhook dry-run ... | head``): 128 + SIGPIPE,
#: what a shell reports for a command the closed pipe stopped.
EXIT_PIPE = 141
#: What the offline commands assume without ``--kubernetes-version`` or a config pin: the
#: newest release whose gated fields the policy knows.
ASSUMED_VERSION = KubeVersion(1, 36)
IN_PLACE_KEY = KEYS["in-place-exit-codes"].annotation


class InputError(Exception):
    pass


def read_documents(path: str, stdin: TextIO | None = None) -> list[dict[str, Any]]:
    """Objects from a YAML (multi-document) or JSON file; ``List`` kinds are flattened."""
    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read {path}: {err}") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise InputError(f"{path} is not valid YAML or JSON: {err}") from None
    objects: list[dict[str, Any]] = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue
        for obj in _flatten(doc):
            if not isinstance(obj, dict) or not obj.get("kind") or not obj.get("apiVersion"):
                raise InputError(
                    f"{path}: document {index + 1} is not a Kubernetes object "
                    "(needs apiVersion and kind)"
                )
            objects.append(obj)
    return objects


def _flatten(doc: Any) -> Iterator[Any]:
    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
        for item in doc.get("items") or []:
            yield from _flatten(item)
    else:
        yield doc


def prepare(obj: dict[str, Any], namespace: str | None) -> tuple[dict[str, Any], bool]:
    """The object as the API server would hand it to a webhook on ``kubectl apply``.

    Returns it and whether a last-applied record was added (to strip from the output).
    """
    manifest = copy.deepcopy(obj)
    prepared = copy.deepcopy(obj)
    metadata = prepared.get("metadata")
    if not isinstance(metadata, dict):
        metadata = prepared["metadata"] = {}
    metadata["namespace"] = namespace or metadata.get("namespace") or "default"
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
    synthetic = LAST_APPLIED not in annotations
    if synthetic:
        annotations[LAST_APPLIED] = json.dumps(manifest, separators=(",", ":"))
    defaulting.apply_defaults(prepared)
    return prepared, synthetic


def _strip(obj: dict[str, Any], synthetic: bool) -> dict[str, Any]:
    if synthetic:
        annotations = obj.get("metadata", {}).get("annotations", {})
        annotations.pop(LAST_APPLIED, None)
        if not annotations:
            obj["metadata"].pop("annotations", None)
    return obj


def _label(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    name = metadata.get("name") or metadata.get("generateName") or "<unnamed>"
    return f"{obj.get('kind')}/{name}"


def cluster_version(
    args: argparse.Namespace, config: Config, objects: list[dict[str, Any]], stderr: TextIO
) -> GivenVersion:
    """The version the offline commands judge against: ``--kubernetes-version``, else the
    config's pin, else ``ASSUMED_VERSION``, said when a policy depends on it."""
    if args.kubernetes_version is not None:
        return GivenVersion(args.kubernetes_version)
    if config.kubernetes_version is not None:
        return GivenVersion(config.kubernetes_version)
    annotated = any(
        IN_PLACE_KEY in mapping(mapping(o.get("metadata")).get("annotations")) for o in objects
    )
    if annotated or config.has_default("in-place-exit-codes"):
        print(
            f"Note: in-place restarts judged for Kubernetes {ASSUMED_VERSION}; pass "
            "--kubernetes-version X.Y for your cluster's",
            file=stderr,
        )
    return GivenVersion(ASSUMED_VERSION)


def dry_run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    try:
        objects = read_documents(args.filename)
    except InputError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    results: list[dict[str, Any]] = []
    patches: list[dict[str, Any]] = []
    denied = 0
    runtimes = GivenRuntimes(objects, args.namespace)
    version = cluster_version(args, config, objects, stderr)
    for obj in objects:
        prepared, synthetic = prepare(obj, args.namespace)
        verdict, result = engine.review_object(
            prepared, config, args.namespace, runtimes=runtimes, version=version
        )
        for warning in verdict.warnings:
            print(f"Warning: {warning}", file=stderr)
        if not verdict.allowed:
            denied += 1
            print(f"Error: {_label(obj)} denied: {verdict.message}", file=stderr)
            continue
        results.append(_strip(result, synthetic))
        patches.append(
            {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "namespace": prepared["metadata"]["namespace"],
                "name": prepared["metadata"].get("name"),
                "patch": verdict.patch,
            }
        )
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": results}, stdout, indent=2)
        stdout.write("\n")
    elif args.output == "patch":
        json.dump(patches, stdout, indent=2)
        stdout.write("\n")
    else:
        yaml.safe_dump_all(results, stdout, sort_keys=False, default_flow_style=False)
    return EXIT_DENIED if denied else EXIT_OK


def explain_cmd(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """Explain each workload's retry plan (and walk ``--simulate`` events through it).

    Exit codes as dry-run: 0 explained, 1 the webhook would deny an object (its reasons
    are the explanation), 2 the input, the config or an event could not be used.
    """
    from webhook import explain

    try:
        events = explain.parse_events(args.simulate) if args.simulate is not None else None
        config = load_config(args.config)
        objects = read_documents(args.filename)
    except (explain.ExplainError, ConfigError, InputError) as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    items: list[explain.Explanation | explain.Denial] = []
    code = EXIT_OK
    runtimes = GivenRuntimes(objects, args.namespace)
    version = cluster_version(args, config, objects, stderr)
    for obj in objects:
        if is_runtime(obj):
            continue  # read by the TrainJobs that name it
        prepared, _ = prepare(obj, args.namespace)
        try:
            result = explain.explain(prepared, config, args.namespace, events, runtimes, version)
        except explain.ExplainError as err:
            print(f"Error: {_label(obj)}: {err}", file=stderr)
            code = EXIT_INPUT
            continue
        if result is None:
            print(f"Note: {_label(obj)}: explain does not cover this kind; skipped", file=stderr)
        elif isinstance(result, explain.Denial):
            items.append(result)
            code = max(code, EXIT_DENIED)
        else:
            items.extend(result)
    if args.output == "json":
        json.dump(explain.to_json(items), stdout, indent=2)
        stdout.write("\n")
    elif items:
        stdout.write(explain.render_text(items))
    return code


def check_config(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_DENIED
    print(
        f"{config.source}: OK ({len(config.defaults)} cluster defaults, "
        f"{len(config.namespaces)} namespace overrides, "
        f"{len(config.spot_node_labels)} spot node labels)",
        file=stdout,
    )
    return EXIT_OK


def make_certs(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.in_cluster:
        return sync_certs(args, stdout, stderr)
    paths = certs.generate(args.cert_dir, args.service, args.namespace, days=args.days)
    print(f"wrote {paths.ca_cert}, {paths.cert}, {paths.key}", file=stdout)
    return EXIT_OK


def sync_certs(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """The in-cluster lifecycle (webhook/tls/incluster.py). Exit 2: a setup it cannot work
    with (fix the arguments, RBAC or the Secret); 1: the API failed (the Job retries)."""
    from webhook.tls import incluster

    if not args.secret:
        print("Error: --in-cluster needs --secret NAME", file=stderr)
        return EXIT_INPUT
    refs = [incluster.WebhookConfigRef(n) for n in args.webhook_config]
    refs += [incluster.WebhookConfigRef(n, incluster.MUTATING) for n in args.mutating_config]
    refs += [incluster.WebhookConfigRef(n, incluster.VALIDATING) for n in args.validating_config]
    options = incluster.Options(
        secret=args.secret,
        namespace=args.namespace,
        service=args.service,
        webhook_configs=refs,
        days=args.days,
        renew_before_days=args.renew_before,
    )
    try:
        core, admission = incluster.api_clients(args.kubeconfig)
        actions = incluster.CertSync(core, admission, options).run()
    except incluster.ApiFailure as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_FAILED
    except incluster.SyncError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    for line in actions:
        print(line, file=stdout)
    return EXIT_OK


def run_server(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from webhook.serving.server import ServeOptions, serve

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


def _version(text: str) -> KubeVersion:
    try:
        return KubeVersion.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None


def _version_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubernetes-version",
        type=_version,
        metavar="X.Y",
        help="the cluster's Kubernetes version, for fields behind feature gates (default: "
        f"the config's kubernetesVersion, else {ASSUMED_VERSION})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retry-webhook",
        description="Kubernetes admission webhook for retry and failure policy.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTPS admission server")
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
    serve.set_defaults(func=run_server)

    dry = sub.add_parser("dry-run", help="show what the webhook does to manifests, offline")
    dry.add_argument("-f", "--filename", required=True, help="YAML or JSON file, - for stdin")
    dry.add_argument("--config", help="cluster defaults YAML")
    dry.add_argument("-n", "--namespace", help="namespace for objects that name none")
    dry.add_argument("-o", "--output", choices=("yaml", "json", "patch"), default="yaml")
    _version_option(dry)
    dry.set_defaults(func=dry_run)

    why = sub.add_parser(
        "explain",
        help="show each workload's retry plan: settings and their sources, failure rules, "
        "attempts, and a simulation of failures",
    )
    why.add_argument("-f", "--filename", required=True, help="YAML or JSON file, - for stdin")
    why.add_argument("--config", help="cluster defaults YAML")
    why.add_argument("-n", "--namespace", help="namespace for objects that name none")
    why.add_argument(
        "--simulate",
        metavar="EVENTS",
        help="failures to walk through the plan, e.g. 143,disruption,main:1 (exit codes, "
        "container:code, oom = 137, disruption)",
    )
    why.add_argument("-o", "--output", choices=("text", "json"), default="text")
    _version_option(why)
    why.set_defaults(func=explain_cmd)

    check = sub.add_parser("check-config", help="validate a cluster defaults file")
    check.add_argument("config")
    check.set_defaults(func=check_config)

    cert = sub.add_parser(
        "certs",
        help="generate a CA and serving certificate (files, or a Secret with --in-cluster)",
    )
    cert.add_argument("--cert-dir", default="certs", help="output directory (file mode)")
    cert.add_argument("--service", default=certs.DEFAULT_SERVICE)
    cert.add_argument("--namespace", default=certs.DEFAULT_NAMESPACE)
    cert.add_argument("--days", type=float, default=365, help="serving certificate lifetime")
    cert.add_argument(
        "--in-cluster",
        action="store_true",
        help="keep the certificates in a Secret and the caBundle of webhook configurations",
    )
    cert.add_argument("--secret", help="TLS Secret name (with --in-cluster)")
    cert.add_argument(
        "--webhook-config",
        action="append",
        default=[],
        metavar="NAME",
        help="webhook configuration (mutating or validating) whose caBundle to keep; repeatable",
    )
    cert.add_argument(
        "--mutating-webhook-config",
        dest="mutating_config",
        action="append",
        default=[],
        metavar="NAME",
    )
    cert.add_argument(
        "--validating-webhook-config",
        dest="validating_config",
        action="append",
        default=[],
        metavar="NAME",
    )
    cert.add_argument(
        "--renew-before",
        "--renew-before-days",
        dest="renew_before",
        type=float,
        metavar="DAYS",
        help="renew when the serving certificate expires within DAYS "
        "(default: at 2/3 of its lifetime, at the latest 30 days before)",
    )
    cert.add_argument("--kubeconfig", help="kubeconfig outside a pod (default: in-cluster)")
    cert.set_defaults(func=make_certs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args, sys.stdout, sys.stderr))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader closed the pipe (``| head``): stop quietly. Output still buffered
        # would raise again at exit, so stdout is pointed at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
