"""``dry-run``: what the webhook does to manifests, offline."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

import yaml

from webhook.cli.common import EXIT_DENIED, EXIT_INPUT, EXIT_OK
from webhook.cli.inputs import cluster_version, input_options, prefix, read_inputs, version_option
from webhook.cluster.facts import GivenLimits
from webhook.kinds.trainjob.runtimes import GivenRuntimes
from webhook.offline import outcomes, reports
from webhook.offline.inputs import label
from webhook.offline.review import admission_review, check
from webhook.policy.config import ConfigError, load_config


def dry_run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    read = read_inputs(args, stderr)
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
        where = prefix(doc, labelled)
        checked = check(obj, config, args.namespace, runtimes, version, limits)
        verdict = checked.verdict
        # Told apart: a Warning fails --fail-on-warn, a Change never does (kubectl shows
        # the changes as one line: ``engine.change_summary``).
        for change in checked.changes:
            print(f"Change: {where}{change}", file=stderr)
        for warning in checked.warnings:
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


def add_parser(sub: Any) -> None:
    dry = sub.add_parser("dry-run", help="show what the webhook does to manifests, offline")
    input_options(dry)
    dry.add_argument("--config", help="cluster defaults YAML")
    dry.add_argument(
        "-n",
        "--namespace",
        help="namespace for objects that name none (one that names another is an error, "
        "as in kubectl)",
    )
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
    version_option(dry)
    dry.set_defaults(func=dry_run)
