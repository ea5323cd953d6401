"""``retry-webhook``: serve the webhook, dry-run, explain and test manifests offline, tell a
live workload's story (``status``), manage certificates. Installed as the kubectl plugin
``kubectl retry-policy`` too (``plugin_main``).

The offline commands run the same engine as the server, on the object the server would
see (``webhook.offline.review``), for every object of every file, directory and stdin
they are given (``webhook.offline.inputs``). Exit codes are for pipelines and stable:
0 all admitted (``test``: every case passed), 1 any denied, or warned with
``--fail-on-warn`` (``test``: a case failed), 2 usage, or input or config that could not
be read.

One module per command (``serve``, ``dryrun``, ``explain``, ``status``, ``test``, and
``admin`` for check-config, certs and release-gates), each adding its own subparser.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from webhook.cli import admin, dryrun, explain, serve, status, test
from webhook.cli.common import EXIT_DENIED, EXIT_FAILED, EXIT_INPUT, EXIT_OK, EXIT_PIPE
from webhook.cluster.version import ASSUMED_VERSION, IN_PLACE_KEY
from webhook.offline import reports
from webhook.offline.review import prepare

__all__ = [
    "ASSUMED_VERSION",
    "EXIT_DENIED",
    "EXIT_FAILED",
    "EXIT_INPUT",
    "EXIT_OK",
    "EXIT_PIPE",
    "IN_PLACE_KEY",
    "build_parser",
    "main",
    "plugin_main",
    "prepare",
]

#: Every subcommand, in the order ``--help`` lists them.
COMMANDS = {
    "serve": serve.add_parser,
    "dry-run": dryrun.add_parser,
    "explain": explain.add_parser,
    "status": status.add_parser,
    "test": test.add_parser,
    "check-config": admin.add_check_config,
    "certs": admin.add_certs,
    "release-gates": admin.add_release_gates,
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
