"""``status``: a live workload's story, read from the cluster as the user."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from webhook.offline import inputs
from webhook.policy.config import Config, ConfigError, load_config


def status_cmd(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """A live workload's story (webhook/status). Exit 0 told, 1 told but a part could not
    be read (named on stderr too), 2 nothing could be told (no cluster, not found,
    forbidden, a bad reference or config)."""
    from webhook import status

    try:
        config = load_config(args.config) if args.config else None
        story, code = status.status(
            args.workload,
            args.namespace,
            args.kubeconfig,
            args.context,
            config,
            args.filename,
            documents=inputs.read,
            readmit=readmit,
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


def readmit(obj: dict[str, Any], config: Config, namespace: str) -> dict[str, Any] | None:
    """``obj`` admitted again as the webhook would store it (``None``: denied): how status
    finds the plan of a workload whose applied record keeps no rules' origins (version 1,
    written before they were recorded). Status itself admits nothing."""
    from webhook.admission import engine

    again = engine.review(obj, config, namespace)
    return again.result if again.verdict.allowed else None


def add_parser(sub: Any) -> None:
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
        help="job/NAME, cronjob/NAME, jobset/NAME, trainjob/NAME or rayjob/NAME",
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
