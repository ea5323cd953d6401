"""Reports CI systems read: JUnit XML (Jenkins, GitLab, GitHub test reporters) and SARIF
2.1.0 (GitHub code scanning, and other SARIF viewers).

Both are written from the same ``Result`` values, one per checked object or test case.
The JUnit XML keeps to the schema Jenkins' JUnit support publishes (the "Jenkins JUnit"
XSD that CI tools validate against, vendored in tests/data/): ``testsuites``, one
``testsuite`` per file, one ``testcase`` per result, a failure as ``<failure>`` and input
that could not be used as ``<error>``. That schema has no file or line attribute on a test
case, so the file is the suite's name and the test case's ``classname``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree as ET  # writes XML only; never parses any

PASSED, FAILED, ERROR = "passed", "failed", "error"
SARIF_SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
TOOL = "retry-webhook"
#: Characters XML 1.0 cannot carry, even escaped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class Finding:
    """One thing found about a result's object, at the line of its file it is about (the
    annotation a problem names): SARIF gives each its own result there."""

    message: str
    line: int


@dataclass(frozen=True)
class Result:
    """One checked object or test case, as every report shows it.

    ``file`` is where it came from (the suite, and the location in SARIF), ``name`` what
    it is; ``status`` passed, failed or error (could not be checked); ``rule`` a short id
    of why (``denied``, ``warning``, ``input``, ...); ``message`` the one line a CI
    system shows, ``details`` the rest; ``output`` lines worth keeping (warnings,
    changes); ``level`` the SARIF level (error, warning, note, none); ``findings``,
    each problem or warning at its own line (SARIF only; JUnit has one case per result)."""

    file: str
    name: str
    status: str
    rule: str
    message: str
    details: str = ""
    output: tuple[str, ...] = ()
    line: int = 1
    level: str = "none"
    properties: Mapping[str, Any] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


def _text(value: str) -> str:
    return _NOT_XML.sub("\ufffd", value)


def junit(results: Sequence[Result], name: str) -> str:
    """JUnit XML: a ``testsuite`` per file, in the order files first appear."""
    suites: dict[str, list[Result]] = {}
    for result in results:
        suites.setdefault(result.file, []).append(result)
    root = ET.Element("testsuites", name=_text(name))
    _counts(root, results)
    for file, members in suites.items():
        suite = ET.SubElement(root, "testsuite", name=_text(file))
        _counts(suite, members)
        suite.set("skipped", "0")
        for result in members:
            case = ET.SubElement(suite, "testcase", name=_text(result.name), classname=_text(file))
            if result.status in (FAILED, ERROR):
                tag = "failure" if result.status == FAILED else "error"
                problem = ET.SubElement(
                    case, tag, type=_text(result.rule), message=_text(result.message)
                )
                problem.text = _text(result.details or result.message)
            if result.output:
                out = ET.SubElement(case, "system-out")
                out.text = _text("\n".join(result.output))
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n"


def _counts(element: ET.Element, results: Sequence[Result]) -> None:
    element.set("tests", str(len(results)))
    element.set("failures", str(sum(r.status == FAILED for r in results)))
    element.set("errors", str(sum(r.status == ERROR for r in results)))


def sarif(
    results: Sequence[Result], rules: Mapping[str, str], exit_code: int | None = None
) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run: every result, located in its file (``-`` for
    stdin) at the line its object starts, or one per finding at the finding's line.
    ``rules`` describes each rule id used."""
    ids = list(rules)
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": TOOL,
                "version": version(),
                "rules": [
                    {"id": rule, "shortDescription": {"text": text}} for rule, text in rules.items()
                ],
            }
        },
        "results": [
            _sarif_result(r, ids, finding)
            for r in results
            for finding in r.findings or (Finding(_text_of(r), r.line),)
        ],
        "columnKind": "unicodeCodePoints",
    }
    if exit_code is not None:
        run["invocations"] = [{"executionSuccessful": exit_code in (0, 1), "exitCode": exit_code}]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def version() -> str:
    """The installed package's version (its metadata), as ``--version`` and reports say it."""
    from importlib import metadata

    try:
        return metadata.version("retry-policy-webhook")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "0+unknown"


def _text_of(result: Result) -> str:
    return result.message + (f"\n{result.details}" if result.details else "")


def kind_and_level(result: Result) -> tuple[str, str]:
    """SARIF 2.1.0 ``kind`` and ``level``, which must agree (§3.27.9, §3.27.10): a result
    with a level other than ``none`` is a ``fail`` (a warning that does not fail the run
    too), and a ``fail`` has a level (``error`` unless given); a pass has ``none``."""
    if result.level != "none":
        return "fail", result.level
    if result.status == PASSED:
        return "pass", "none"
    return "fail", "error"


def _sarif_result(result: Result, ids: list[str], finding: Finding) -> dict[str, Any]:
    location: dict[str, Any] = {
        "physicalLocation": {
            "artifactLocation": {"uri": _uri(result.file)},
            "region": {"startLine": max(finding.line, 1)},
        },
        "logicalLocations": [{"name": result.name, "kind": "resource"}],
    }
    kind, level = kind_and_level(result)
    out: dict[str, Any] = {
        "ruleId": result.rule,
        "level": level,
        "kind": kind,
        "message": {"text": finding.message},
        "locations": [location],
    }
    if result.rule in ids:
        out["ruleIndex"] = ids.index(result.rule)
    if result.properties:
        out["properties"] = dict(result.properties)
    return out


def _uri(path: str) -> str:
    """A relative URI reference for a path (forward slashes; spaces and the like
    percent-encoded)."""
    from urllib.parse import quote

    return quote(path.replace("\\", "/"), safe="/-._~:")
