"""The operator's commands beside ``serve``: ``check-config``, ``certs`` and
``release-gates``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from webhook.cli.common import EXIT_DENIED, EXIT_FAILED, EXIT_INPUT, EXIT_OK
from webhook.kube import apiclient
from webhook.policy.config import ALWAYS, Config, ConfigError, parse_config_or_configmap
from webhook.tls import certs


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
    print(f"failure categories: {categories_line(config)}", file=stdout)
    for line in rollout_lines(config):
        print(line, file=stdout)
    return EXIT_OK


def categories_line(config: Config) -> str:
    """The admins' categories, and which failed pods carry theirs as a condition."""
    own = ", ".join(c.name for c in config.categories) or "none"
    where = (
        "on every failed pod of a workload with a plan (Always)"
        if config.category_conditions == ALWAYS
        else "where a podFailurePolicy rule reads it (WhenRead)"
    )
    return f"the admins' own: {own}; the condition is written {where}"


def rollout_lines(config: Config) -> list[str]:
    """The effective ``rollout`` of the defaults: each namespace the config names, then
    every other namespace (the cluster's)."""
    lines = [f"rollout in namespace {ns}: {config.rollout_of(ns)}" for ns in config.namespaces]
    other = "every other namespace" if lines else "every namespace"
    return [*lines, f"rollout in {other}: {config.rollout}"]


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


def add_check_config(sub: Any) -> None:
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


def add_certs(sub: Any) -> None:
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


def add_release_gates(sub: Any) -> None:
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
