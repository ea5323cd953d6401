"""``retry-webhook``: serve the webhook, dry-run, explain and test manifests offline, tell a
live workload's story (``status``), manage certificates. Installed as the kubectl plugin
``kubectl retry-policy`` too (``plugin_main``).

The offline commands run the same engine as the server, on the object the server would
see (``webhook.offline.review``), for every object of every file, directory and stdin
they are given (``webhook.offline.inputs``). Exit codes are for pipelines and stable:
0 all admitted (``test``: every case passed), 1 any denied, or warned with
``--fail-on-warn`` (``test``: a case failed), 2 usage, or input or config that could not
be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from webhook.cluster.limits import GivenLimits
from webhook.cluster.runtimes import GivenRuntimes, is_runtime
from webhook.cluster.version import ASSUMED_VERSION, IN_PLACE_KEY, GivenVersion, version_for
from webhook.kube import apiclient
from webhook.kube.versions import KubeVersion
from webhook.offline import inputs, outcomes, reports
from webhook.offline.inputs import Document, label
from webhook.offline.review import admission_review, check, prepare
from webhook.policy.config import Config, ConfigError, load_config, parse_config_or_configmap
from webhook.tls import certs

__all__ = ["ASSUMED_VERSION", "IN_PLACE_KEY", "main", "prepare"]

EXIT_OK, EXIT_DENIED, EXIT_INPUT = 0, 1, 2
EXIT_FAILED = 1  # a command that could not finish (e.g. the API failed): run it again
#: The reader of the output went away (``retry-webhook dry-run ... | head``): 128 + SIGPIPE,
#: what a shell reports for a command the closed pipe stopped.
EXIT_PIPE = 141


class InputError(Exception):
    pass


def read_documents(path: str, stdin: TextIO | None = None) -> list[dict[str, Any]]:
    """The objects of one file (``-``: stdin); ``InputError`` for the first document
    that cannot be used."""
    objects = []
    for doc in inputs.read(path, stdin):
        if doc.error:
            raise InputError(doc.error)
        assert doc.obj is not None
        objects.append(doc.obj)
    return objects


def _read(args: argparse.Namespace, stderr: TextIO) -> tuple[list[Document], bool] | None:
    """Every document the ``-f`` arguments name, and whether the output names each
    object's file (more than one file, or a directory); ``None`` after a usage error."""
    paths = [*(args.filename or []), *args.paths]
    try:
        if not paths:
            raise inputs.UsageError("no input: give files or directories, or - for stdin")
        docs = inputs.read_all(paths, args.recursive)
    except inputs.UsageError as err:
        print(f"Error: {err}", file=stderr)
        return None
    return docs, not inputs.single(paths)


def cluster_version(
    args: argparse.Namespace, config: Config, objects: list[dict[str, Any]], stderr: TextIO
) -> GivenVersion:
    """The version the offline commands judge against: ``--kubernetes-version``, else the
    config's pin, else ``ASSUMED_VERSION``, said when a policy depends on it."""
    version, assumed = version_for(args.kubernetes_version, config, objects)
    if assumed:
        print(
            f"Note: in-place restarts judged for Kubernetes {ASSUMED_VERSION}; pass "
            "--kubernetes-version X.Y for your cluster's",
            file=stderr,
        )
    return version


def _where(doc: Document, labelled: bool) -> str:
    """What stderr lines start with: nothing for one file (as it always read), else the
    file and document, then the object."""
    obj = doc.obj or {}
    return f"{doc.source}: {label(obj)}: " if labelled else ""


def dry_run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    read = _read(args, stderr)
    if read is None:
        return EXIT_INPUT
    docs, labelled = read
    objects = [d.obj for d in docs if d.obj is not None]
    results: list[dict[str, Any]] = []
    patches: list[dict[str, Any]] = []
    found: list[reports.Result] = []
    reviews: list[dict[str, Any]] = []
    code = EXIT_OK
    runtimes = GivenRuntimes(objects, args.namespace)
    limits = GivenLimits(objects, args.namespace)
    version = cluster_version(args, config, objects, stderr)
    for doc in docs:
        if doc.obj is None:
            print(f"Error: {doc.error}", file=stderr)
            found.append(outcomes.input_result(doc))
            code = EXIT_INPUT
            continue
        obj = doc.obj
        reviews.append(admission_review(obj, args.namespace))
        where = _where(doc, labelled)
        checked = check(obj, config, args.namespace, runtimes, version, limits)
        verdict = checked.verdict
        for warning in verdict.warnings:
            print(f"Warning: {where}{warning}", file=stderr)
        result = outcomes.dry_run_result(doc, checked, args.fail_on_warn)
        found.append(result)
        if result.status == reports.FAILED:
            code = max(code, EXIT_DENIED)
        if not verdict.allowed:
            at = f"{doc.source}: " if labelled else ""
            print(f"Error: {at}{label(obj)} denied: {verdict.message}", file=stderr)
            continue
        results.append(checked.result)
        patches.append(
            {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "namespace": checked.prepared["metadata"]["namespace"],
                "name": checked.prepared["metadata"].get("name"),
                "patch": verdict.patch,
            }
        )
    if labelled:
        print(outcomes.summary(docs, found), file=stderr)
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": results}, stdout, indent=2)
        stdout.write("\n")
    elif args.output == "patch":
        json.dump(patches, stdout, indent=2)
        stdout.write("\n")
    elif args.output == "name":
        for obj in results:
            stdout.write(outcomes.kubectl_name(obj) + "\n")
    elif args.output == "junit":
        stdout.write(reports.junit(found, "retry-webhook dry-run"))
    elif args.output == "sarif":
        json.dump(reports.sarif(found, outcomes.RULES, code), stdout, indent=2)
        stdout.write("\n")
    elif args.output == "review":
        for review in reviews:  # the request, whatever the verdict: post it to see that
            json.dump(review, stdout, indent=2)
            stdout.write("\n")
    else:
        yaml.safe_dump_all(results, stdout, sort_keys=False, default_flow_style=False)
    return code


def explain_cmd(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """Explain each workload's retry plan (and walk ``--simulate`` events through it).

    Exit codes as dry-run: 0 explained, 1 the webhook would deny an object (its reasons
    are the explanation) or, with ``--fail-on-warn``, warn about one, 2 the input, the
    config or an event could not be used.
    """
    from webhook import explain

    try:
        events = explain.parse_events(args.simulate) if args.simulate is not None else None
        config = load_config(args.config)
    except (explain.ExplainError, ConfigError) as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    read = _read(args, stderr)
    if read is None:
        return EXIT_INPUT
    docs, labelled = read
    objects = [d.obj for d in docs if d.obj is not None]
    groups: list[tuple[Document, list[explain.Explanation | explain.Denial]]] = []
    code = EXIT_OK
    runtimes = GivenRuntimes(objects, args.namespace)
    limits = GivenLimits(objects, args.namespace)
    version = cluster_version(args, config, objects, stderr)
    for doc in docs:
        if doc.obj is None:
            print(f"Error: {doc.error}", file=stderr)
            code = EXIT_INPUT
            continue
        obj = doc.obj
        if is_runtime(obj):
            continue  # read by the TrainJobs that name it
        where = f"{doc.source}: " if labelled else ""
        if args.fail_on_warn:
            warnings = check(obj, config, args.namespace, runtimes, version, limits).warnings
            for warning in warnings:
                print(f"Warning: {_where(doc, labelled)}{warning}", file=stderr)
            code = max(code, EXIT_DENIED if warnings else EXIT_OK)
        prepared, _ = prepare(obj, args.namespace)
        try:
            result = explain.explain(prepared, config, args.namespace, events, runtimes, version)
        except explain.ExplainError as err:
            print(f"Error: {where}{label(obj)}: {err}", file=stderr)
            code = EXIT_INPUT
            continue
        if result is None:
            print(
                f"Note: {where}{label(obj)}: explain does not cover this kind; skipped",
                file=stderr,
            )
        elif isinstance(result, explain.Denial):
            groups.append((doc, [result]))
            code = max(code, EXIT_DENIED)
        else:
            groups.append((doc, list(result)))
    if args.output == "json":
        data: dict[str, Any] = {"items": []}
        for doc, items in groups:
            source = {"file": doc.source.path, "document": doc.source.document}
            if doc.source.item is not None:
                source["item"] = doc.source.item
            data["items"] += [
                {**item, "source": source} for item in explain.to_json(items)["items"]
            ]
        json.dump(data, stdout, indent=2)
        stdout.write("\n")
    elif groups and labelled:
        stdout.write(
            "\n".join(
                f"From {doc.source}:\n\n" + explain.render_text(items) for doc, items in groups
            )
        )
    elif groups:
        stdout.write(explain.render_text([item for _, items in groups for item in items]))
    return code


def status_cmd(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """A live workload's story (webhook/status). Exit 0 told, 1 told but a part could not
    be read (named on stderr too), 2 nothing could be told (no cluster, not found,
    forbidden, a bad reference or config)."""
    from webhook import status

    try:
        config = load_config(args.config) if args.config else None
        story, code = status.status(
            args.workload, args.namespace, args.kubeconfig, args.context, config, args.filename
        )
    except (status.StatusError, ConfigError) as err:
        print(f"Error: {err}", file=stderr)
        return status.EXIT_UNREADABLE
    if args.output == "json":
        json.dump(status.to_json(story), stdout, indent=2)
        stdout.write("\n")
    else:
        stdout.write(status.render_text(story, plan=args.plan))
    for what in story.unread:
        print(f"Warning: could not read {what}", file=stderr)
    return code


def test_cmd(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """Run test suites: a line per case (with what differed), ``N passed, N failed``, and
    with ``-o junit`` the JUnit XML on stdout (the lines then go to stderr). Exit 0 all
    passed, 1 a case failed, 2 a suite or case could not be run (or none was found)."""
    from webhook import policytest

    suites, empty = policytest.find(args.paths)
    lines = stderr if args.output == "junit" else stdout
    for path in empty:
        print(f"Error: {path}: no test suite found (kind: TestSuite)", file=stderr)
    results = [r for suite in suites for r in policytest.run_suite(suite)]
    for result in results:
        print(f"{result.status} {result.suite}: {result.name}", file=lines)
        for line in result.lines:
            print(f"  - {line}", file=lines)
    passed = sum(r.status == policytest.PASSED for r in results)
    print(f"{passed} passed, {len(results) - passed} failed", file=lines)
    if args.output == "junit":
        stdout.write(reports.junit(policytest.report(results), "retry-webhook test"))
    if empty or not results or any(r.status == policytest.ERROR for r in results):
        return EXIT_INPUT
    return EXIT_DENIED if passed < len(results) else EXIT_OK


def check_config(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """A config file, or the chart's rendered ConfigMap (``-``: stdin). Exit 0 valid, 1
    not (every problem said)."""
    source = "stdin" if args.config == "-" else args.config
    try:
        text = sys.stdin.read() if args.config == "-" else _read_text(args.config)
        if args.config == "-" and not text.strip():
            # An empty file means "built-in defaults"; an empty pipe, a command that failed.
            print("Error: stdin is empty: nothing to check", file=stderr)
            return EXIT_DENIED
        config = parse_config_or_configmap(text, source)
    except OSError as err:
        print(f"Error: cannot read {source}: {err.strerror or err}", file=stderr)
        return EXIT_DENIED
    except ConfigError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_DENIED
    print(
        f"{config.source}: OK ({len(config.defaults)} cluster defaults, "
        f"{len(config.namespaces)} namespace overrides, "
        f"{len(config.spot_node_labels)} spot node labels)",
        file=stdout,
    )
    print(f"kueue: {config.kueue.describe()}", file=stdout)
    return EXIT_OK


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as err:
        raise OSError(f"not UTF-8 text ({err.reason})") from None


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


def release_gates(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """Remove every retry-delay gate of ours (webhook/controller/gates.py): for an
    uninstall (the chart's delete hook) or a controller that is off. Exit 2: no scope, no
    API, or credentials that may not list pods; 1: the API failed the list, or some pods
    could not be released (run it again)."""
    from webhook.controller import gates
    from webhook.tls import incluster

    if (args.namespace is None) == (not args.all_namespaces):
        print("Error: give -n NAMESPACE or --all-namespaces (-A)", file=stderr)
        return EXIT_INPUT
    try:
        core, _ = incluster.api_clients(args.kubeconfig)
        done, errors = gates.release_all(core, args.namespace, args.dry_run)
    except incluster.SyncError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    except Exception as err:  # the list itself failed: in status's words
        status, detail = apiclient.describe(err)
        where = f"in namespace {args.namespace}" if args.namespace else "in all namespaces"
        print(f"Error: cannot list pods {where}: {detail}", file=stderr)
        # No API, or credentials that may not list pods: fix the setup (2); anything
        # else the API failed (a 5xx, a 429): run it again (1).
        return EXIT_INPUT if status in (None, 401, 403) else EXIT_FAILED
    for item in done:
        print(item, file=stdout)
    for error in errors:
        print(f"Error: {error}", file=stderr)
    verb = "to release" if args.dry_run else "released"
    count = sum(d.result in ("released", "would be released") for d in done)
    print(f"{count} retry-delay gate(s) {verb}", file=stdout)
    return EXIT_FAILED if errors else EXIT_OK


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


def _input_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="PATH",
        help="a YAML or JSON file, a directory (its .yaml, .yml and .json files), or - for "
        "stdin; repeatable",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="as -f (pre-commit's way)")
    parser.add_argument(
        "-R",
        "--recursive",
        action="store_true",
        help="read the subdirectories of the directories given with -f too",
    )
    parser.add_argument(
        "--fail-on-warn",
        action="store_true",
        help="exit 1 when the webhook would warn about an object (a setting skipped or "
        "without effect); the changes it makes are not warnings",
    )


def _serve_parser(sub: Any) -> None:
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


def _dry_run_parser(sub: Any) -> None:
    dry = sub.add_parser("dry-run", help="show what the webhook does to manifests, offline")
    _input_options(dry)
    dry.add_argument("--config", help="cluster defaults YAML")
    dry.add_argument("-n", "--namespace", help="namespace for objects that name none")
    dry.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "patch", "name", "junit", "sarif", "review"),
        default="yaml",
        help="the admitted objects (yaml, json, or their kind.group/name), their patches, "
        "a report of every object for CI (JUnit XML or SARIF 2.1.0), or the AdmissionReview "
        "the API server would send the webhook for each object (review: JSON, one per "
        "object, to post to a running server's /mutate)",
    )
    _version_option(dry)
    dry.set_defaults(func=dry_run)


def _explain_parser(sub: Any) -> None:
    why = sub.add_parser(
        "explain",
        help="show each workload's retry plan: settings and their sources, failure rules, "
        "attempts, and a simulation of failures",
    )
    _input_options(why)
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


def _status_parser(sub: Any) -> None:
    live = sub.add_parser(
        "status",
        help="a running or finished workload's story: attempts used, failed attempts, what "
        "the next attempt gets, what decided it, Events (reads the cluster as you)",
        epilog="exit status: 0 told; 1 told, but a part could not be read (named); 2 nothing "
        "could be told (no cluster, not found, forbidden, a bad KIND/NAME or file). "
        "docs/STATUS.md",
    )
    live.add_argument(
        "workload",
        metavar="KIND/NAME",
        help="job/NAME, jobset/NAME, trainjob/NAME or cronjob/NAME",
    )
    live.add_argument("-n", "--namespace", help="default: the kubeconfig context's, else default")
    live.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    live.add_argument("--context", help="the kubeconfig context to use")
    live.add_argument("--config", help="the cluster defaults YAML to judge the plan with (admins)")
    live.add_argument(
        "-f",
        "--filename",
        metavar="RECORDED",
        help="read the workload, its Jobs, pods and Events from this file (what kubectl get "
        "-o yaml wrote; - for stdin) instead of a cluster",
    )
    live.add_argument(
        "--plan",
        action="store_true",
        help="end the text with the retry plan (explain's; -o json always has it)",
    )
    live.add_argument("-o", "--output", choices=("text", "json"), default="text")
    live.set_defaults(func=status_cmd)


def _test_parser(sub: Any) -> None:
    test = sub.add_parser(
        "test",
        help="run test suites: how manifests are admitted and how they behave when they fail",
    )
    test.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a suite file, or a directory searched (with its subdirectories) for suites",
    )
    test.add_argument(
        "-o",
        "--output",
        choices=("text", "junit"),
        default="text",
        help="junit: JUnit XML on stdout, the lines on stderr",
    )
    test.set_defaults(func=test_cmd)


def _check_config_parser(sub: Any) -> None:
    check = sub.add_parser(
        "check-config",
        help="validate a cluster defaults file, or the chart's rendered ConfigMap holding one",
    )
    check.add_argument(
        "config",
        metavar="FILE",
        help="the config file; or what `helm template ... --show-only "
        "templates/configmap.yaml` prints; - for stdin",
    )
    check.set_defaults(func=check_config)


def _certs_parser(sub: Any) -> None:
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


def _release_gates_parser(sub: Any) -> None:
    release = sub.add_parser(
        "release-gates",
        help="remove the retry-delay scheduling gates of every pod the webhook holds back",
        epilog="exit status: 0 released; 1 the API failed the list or a pod's patch (run it "
        "again); 2 no scope, no API, or credentials that may not list pods",
    )
    scope = release.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="only the pods of this namespace")
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the pods of every namespace"
    )
    release.add_argument(
        "--dry-run", action="store_true", help="print what would be released, change nothing"
    )
    release.add_argument("--kubeconfig", help="kubeconfig outside a pod (default: in-cluster)")
    release.set_defaults(func=release_gates)


#: Every subcommand, in the order ``--help`` lists them.
COMMANDS = {
    "serve": _serve_parser,
    "dry-run": _dry_run_parser,
    "explain": _explain_parser,
    "status": _status_parser,
    "test": _test_parser,
    "check-config": _check_config_parser,
    "certs": _certs_parser,
    "release-gates": _release_gates_parser,
}
#: What ``kubectl retry-policy`` offers: a user's commands about workloads. Serving,
#: certificates and releasing every gate are the operator's (``retry-webhook``).
PLUGIN_COMMANDS = ("status", "explain", "dry-run", "test")
DESCRIPTION = "Kubernetes admission webhook for retry and failure policy."
PLUGIN_DESCRIPTION = (
    "Your workloads' retry and failure policy, as the retry-policy webhook makes it: a "
    "workload's story in the cluster, its retry plan, what admission does to a manifest, "
    "test suites. (Serving and certificates: retry-webhook.)"
)


def build_parser(
    prog: str | None = None, commands: Sequence[str] = tuple(COMMANDS)
) -> argparse.ArgumentParser:
    plugin = set(commands) <= set(PLUGIN_COMMANDS)
    parser = argparse.ArgumentParser(
        prog=prog or "retry-webhook",
        description=PLUGIN_DESCRIPTION if plugin else DESCRIPTION,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {reports.version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in commands:
        COMMANDS[name](sub)
    return parser


def main(
    argv: list[str] | None = None,
    prog: str | None = None,
    commands: Sequence[str] = tuple(COMMANDS),
) -> int:
    args = build_parser(prog, commands).parse_args(argv)
    try:
        code = int(args.func(args, sys.stdout, sys.stderr))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader closed the pipe (``| head``): stop quietly. Output still buffered
        # would raise again at exit, so stdout is pointed at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    return code


def plugin_main() -> int:
    """``kubectl retry-policy ...``: kubectl runs ``kubectl-retry_policy`` from PATH with
    the words after ``retry-policy`` (its plugin mechanism maps ``-`` in a command to ``_``
    in the file name). It offers the user's commands only (``PLUGIN_COMMANDS``)."""
    return main(prog="kubectl retry-policy", commands=PLUGIN_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
