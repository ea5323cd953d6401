"""``test``: run policy test suites (``webhook.policytest``)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from webhook.cli.common import EXIT_DENIED, EXIT_INPUT, EXIT_OK
from webhook.offline import reports


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


def add_parser(sub: Any) -> None:
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
