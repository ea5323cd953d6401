"""Running a case: the object through admission (``offline.review``) and, when the case
asserts how it fails, through ``explain``'s simulation; then what was expected against
what happened, every difference said."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhook import explain
from webhook.cluster.version import ASSUMED_VERSION, GivenVersion
from webhook.kinds.trainjob.runtimes import GivenRuntimes
from webhook.offline import reports
from webhook.offline.review import check, prepare
from webhook.policytest import facts
from webhook.policytest.suite import Case, Suite

PASSED, FAILED, ERROR = "PASS", "FAIL", "ERROR"


@dataclass
class CaseResult:
    suite: str
    name: str
    status: str
    #: Each difference: "outcome.reason: expected X, actual Y"; or why it could not run.
    lines: list[str] = field(default_factory=list)


def run_suite(suite: Suite) -> list[CaseResult]:
    if suite.problems:
        return [CaseResult(suite.path, "the suite", ERROR, list(suite.problems))]
    return [run_case(case) for case in suite.cases]


def run_case(case: Case) -> CaseResult:
    if case.problems or case.obj is None:
        return CaseResult(case.suite, case.name, ERROR, list(case.problems))
    try:
        differences = _differences(case)
    except explain.ExplainError as err:  # e.g. an event naming a container it lacks
        return CaseResult(case.suite, case.name, ERROR, [f"simulate: {err}"])
    return CaseResult(case.suite, case.name, FAILED if differences else PASSED, differences)


def _differences(case: Case) -> list[str]:
    assert case.obj is not None
    config = case.config
    version = GivenVersion(case.version or config.kubernetes_version or ASSUMED_VERSION)
    runtimes = GivenRuntimes(case.objects, case.namespace)
    checked = check(case.obj, config, case.namespace, runtimes, version)
    verdict = checked.verdict
    expect = case.expect
    out: list[str] = []
    if expect.admitted and not verdict.allowed:
        return [f"admitted: expected admitted, actual denied: {verdict.message}"]
    if not expect.admitted:
        if verdict.allowed:
            return [f"denied: expected denied{_saying(expect.denied)}, actual admitted"]
        if expect.denied and expect.denied not in verdict.message:
            out.append(
                f"denied: expected a denial saying {expect.denied!r}, actual: {verdict.message}"
            )
    shown = verdict.warnings
    for text in expect.warnings:
        if not any(text in w for w in shown):
            out.append(f"warnings: expected one saying {text!r}, actual: {_listed(shown)}")
    for text in expect.no_warnings:
        hits = [w for w in shown if text in w]
        if hits:
            out.append(f"noWarnings: expected none saying {text!r}, actual: {_listed(hits)}")
    if expect.admitted and case.events is not None:
        out.extend(_simulation(case, config, runtimes, version))
    return out


def _saying(text: str | None) -> str:
    return f" saying {text!r}" if text else ""


def _listed(warnings: list[str]) -> str:
    return "; ".join(warnings) if warnings else "no warnings"


def _simulation(case: Case, config: Any, runtimes: Any, version: Any) -> list[str]:
    assert case.obj is not None
    prepared, _ = prepare(case.obj, case.namespace)
    result = explain.explain(prepared, config, case.namespace, case.events, runtimes, version)
    if not isinstance(result, list):
        return [f"simulate: explain does not simulate a {case.obj.get('kind')}"]
    simulated = [item for item in result if item.simulation is not None]
    if case.part is not None:
        simulated = [i for i in simulated if case.part in (i.part, i.part.split(" ")[-1])]
    if len(simulated) != 1:
        parts = [i.part for i in result if i.simulation is not None]
        if case.part is not None or not parts:
            return [
                f"part: expected one part to simulate{_saying(case.part)}, actual parts: {parts}"
            ]
        return [f"part: {len(parts)} parts are simulated ({', '.join(parts)}); pick one with part"]
    sim = simulated[0].simulation
    assert sim is not None
    found = facts.pods(sim)
    ending = facts.outcome(sim)
    out = []
    for key, wanted in case.expect.outcome.items():
        actual = getattr(ending, key)
        same = wanted in actual if key == "message" else wanted == actual
        if not same:
            out.append(f"outcome.{key}: expected {wanted}, actual {actual}")
    if out:
        out.append(f"outcome: actual {ending}")
    for index, (wanted_pod, wanted_facts) in enumerate(case.expect.attempts):
        where = f"attempts[{index}]"
        pod = facts.select(found, wanted_pod)
        picked = ", ".join(f"{k} {v}" for k, v in wanted_pod.items())
        if pod is None:
            ran = "; ".join(p.position() for p in found) or "none"
            out.append(f"{where}: expected a pod of {picked}, actual pods: {ran}")
            continue
        for key, wanted in wanted_facts.items():
            fact = facts.FACTS[key]
            actual = fact.read(pod)
            if actual is None:
                out.append(f"{where}.{key}: the simulation does not know it ({pod.position()})")
            elif not fact.same(wanted, actual):
                out.append(
                    f"{where}.{key}: expected {fact.show(wanted)}, actual {fact.show(actual)} "
                    f"({pod.position()})"
                )
    return out


# --- reports -------------------------------------------------------------------------------


def report(results: list[CaseResult]) -> list[reports.Result]:
    """One JUnit test case per case: a difference is a failure, a case that could not run
    an error."""
    out = []
    for r in results:
        if r.status == PASSED:
            out.append(reports.Result(r.suite, r.name, reports.PASSED, "case", "passed"))
            continue
        status = reports.FAILED if r.status == FAILED else reports.ERROR
        rule = "assertion" if r.status == FAILED else "suite"
        message = r.lines[0] if r.lines else r.status
        out.append(reports.Result(r.suite, r.name, status, rule, message, "\n".join(r.lines)))
    return out
