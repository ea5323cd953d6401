"""``explain``: each workload's retry plan in words, and ``--simulate``d failures."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from webhook.cli.common import EXIT_DENIED, EXIT_INPUT, EXIT_OK
from webhook.cli.inputs import cluster_version, input_options, prefix, read_inputs, version_option
from webhook.cluster.facts import GivenLimits
from webhook.kinds.trainjob.runtimes import GivenRuntimes, is_runtime
from webhook.offline.inputs import Document, label
from webhook.offline.review import check, prepare
from webhook.policy.categories import names
from webhook.policy.config import ConfigError, load_config


def explain_cmd(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """Explain each workload's retry plan (and walk ``--simulate`` events through it).

    Exit codes as dry-run: 0 explained, 1 the webhook would deny an object (its reasons
    are the explanation) or, with ``--fail-on-warn``, warn about one, 2 the input, the
    config or an event could not be used.
    """
    from webhook import explain

    try:
        config = load_config(args.config)
        known = names(config.categories)
        events = explain.parse_events(args.simulate, known) if args.simulate is not None else None
    except (explain.ExplainError, ConfigError) as err:
        print(f"Error: {err}", file=stderr)
        return EXIT_INPUT
    read = read_inputs(args, stderr)
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
                print(f"Warning: {prefix(doc, labelled)}{warning}", file=stderr)
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


def add_parser(sub: Any) -> None:
    why = sub.add_parser(
        "explain",
        help="show each workload's retry plan: settings and their sources, failure rules, "
        "attempts, and a simulation of failures",
    )
    input_options(why)
    why.add_argument("--config", help="cluster defaults YAML")
    why.add_argument(
        "-n",
        "--namespace",
        help="namespace for objects that name none (one that names another is an error, "
        "as in kubectl)",
    )
    why.add_argument(
        "--simulate",
        metavar="EVENTS",
        help="failures to walk through the plan, e.g. 143,disruption,main:1 (exit codes, "
        "container:code, oom = 137, disruption)",
    )
    why.add_argument("-o", "--output", choices=("text", "json"), default="text")
    version_option(why)
    why.set_defaults(func=explain_cmd)
