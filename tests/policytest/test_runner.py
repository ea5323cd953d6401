"""``retry-webhook test``: the shipped suites of examples/tests pass (this is how CI runs
them), a case that does not hold says what was expected and what happened, a suite that
cannot run says every problem, and the JUnit report is valid for CI.

Everything runs the installed CLI on real files; the cases' expectations are pinned
against the simulations tested in test_explain*.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import xmlschema
import yaml

from testkit.cli import NO_EFFECT, WARNED
from testkit.tools import ROOT
from webhook.policytest import FACTS, facts, suite
from webhook.policytest.runner import run_case

BIN = Path(sys.executable).parent / "retry-webhook"
EXAMPLES = ROOT / "examples"
TESTS = EXAMPLES / "tests"
JUNIT = xmlschema.XMLSchema10(ROOT / "tests" / "data" / "reports" / "jenkins-junit.xsd")
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$")


def run(*argv, cwd=ROOT):
    result = subprocess.run(
        [str(BIN), "test", *argv], capture_output=True, text=True, cwd=cwd, check=False
    )
    return result.returncode, result.stdout, result.stderr


def write_suite(path, cases, **top):
    body = {"apiVersion": suite.API_VERSION, "kind": suite.KIND, **top, "cases": cases}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def shipped_cases():
    found = []
    for path in sorted(TESTS.rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if suite.is_suite(data):
            found += [(path, case) for case in data["cases"]]
    return found


def test_the_shipped_suites_pass_with_a_junit_report_ci_reads():
    code, out, err = run("examples/tests", "-o", "junit")
    lines = err.splitlines()
    assert code == 0, err
    cases = shipped_cases()
    assert SUMMARY.match(lines[-1]).groups() == (str(len(cases)), "0")
    assert len([line for line in lines if line.startswith("PASS ")]) == len(cases)
    JUNIT.validate(out)
    root = ET.fromstring(out)  # noqa: S314  (our own output, just validated)
    assert root.get("tests") == str(len(cases)) and root.get("failures") == "0"
    assert [c.get("name") for c in root.iter("testcase")] == [
        c["name"] for _, c in sorted(cases, key=lambda pc: str(pc[0].relative_to(ROOT)))
    ]


def test_every_shipped_example_is_tested_by_a_suite():
    named = {(path.parent / case["manifest"]).resolve() for path, case in shipped_cases()}
    assert {p.resolve() for p in EXAMPLES.glob("*.yaml")} <= named
    # A suite's manifests beside it are not read as suites.
    assert (TESTS / "manifests" / "finetune-oom.yaml").resolve() in named


def test_a_case_that_does_not_hold_says_expected_against_actual(tmp_path):
    path = write_suite(
        tmp_path / "wrong.yaml",
        [
            {
                "name": "wrong outcome and facts",
                "manifest": str(EXAMPLES / "job.yaml"),
                "simulate": "143,143,143,143",
                "expect": {
                    "outcome": {"state": "Succeeded", "attempt": 3},
                    "attempts": [{"attempt": 4, "nonSpot": False}, {"attempt": 9, "nonSpot": True}],
                },
            },
            {
                "name": "wrong verdict",
                "manifest": str(EXAMPLES / "job.yaml"),
                "expect": {"denied": "backoff-limit"},
            },
            {
                "name": "wrong warnings",
                "manifest": str(EXAMPLES / "job.yaml"),
                "expect": {"warnings": ["no such warning"], "noWarnings": ["non-spot"]},
            },
            {"name": "right", "manifest": str(EXAMPLES / "job.yaml")},
        ],
    )
    code, out, err = run(str(path))
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"FAIL {path}: wrong outcome and facts"
    assert lines[1:7] == [
        "  - outcome.state: expected Succeeded, actual Failed",
        "  - outcome.attempt: expected 3, actual 4",
        "  - outcome: actual Failed (BackoffLimitExceeded) at attempt 4 (pod 4): 4 counted "
        "failures, more than backoffLimit 3",
        "  - attempts[0].nonSpot: expected false, actual true (pod 4, attempt 4)",
        "  - attempts[1]: expected a pod of attempt 9, actual pods: pod 1, attempt 1; pod 2, "
        "attempt 2; pod 3, attempt 3; pod 4, attempt 4",
        f"FAIL {path}: wrong verdict",
    ]
    assert lines[7] == "  - denied: expected denied saying 'backoff-limit', actual admitted"
    assert lines[8] == f"FAIL {path}: wrong warnings"
    assert lines[9].startswith("  - warnings: expected one saying 'no such warning', actual: ")
    assert lines[10] == (
        "  - noWarnings: expected none saying 'non-spot', actual: retry-policy: the last 1 of 4 "
        "attempts will run on non-spot nodes"
    )
    assert lines[11:] == [f"PASS {path}: right", "1 passed, 3 failed"]


def test_the_junit_report_of_failures_and_errors_is_valid(tmp_path):
    path = write_suite(
        tmp_path / "s.yaml",
        [
            {
                "name": "fails",
                "manifest": str(EXAMPLES / "job.yaml"),
                "expect": {"admitted": False},
            },
            {"name": "cannot run", "manifest": "missing.yaml"},
        ],
    )
    code, out, err = run(str(path), "-o", "junit")
    assert code == 2 and err.splitlines()[-1] == "0 passed, 2 failed"
    JUNIT.validate(out)
    root = ET.fromstring(out)  # noqa: S314  (our own output, just validated)
    fails, broken = root.iter("testcase")
    assert [(e.tag, e.get("type")) for e in fails] == [("failure", "assertion")]
    assert fails[0].get("message").startswith("denied: expected denied, actual admitted")
    assert [(e.tag, e.get("type")) for e in broken] == [("error", "suite")]
    assert f"cannot read {tmp_path / 'missing.yaml'}" in broken[0].get("message")


def test_unknown_keys_anywhere_name_the_closest_valid_key(tmp_path):
    path = tmp_path / "typos.yaml"
    path.write_text(
        f"apiVersion: {suite.API_VERSION}\nkind: {suite.KIND}\n"
        "cases:\n"
        "  - nme: x\n"
        f"    manifest: {EXAMPLES / 'job.yaml'}\n"
        "    simulat: 143\n"
        "    expect:\n"
        "      admited: true\n"
        "      outcome: {stat: Failed, reason: PodFailurePolicy}\n"
        "      attempts:\n"
        "        - {atempt: 1, nonspot: true, memroy: {trainer: 1Gi}, zzz: 1}\n"
    )
    code, out, _ = run(str(path))
    assert code == 2
    assert out.splitlines()[1:] == [
        "  - cases[0].nme: unknown key; did you mean name?",
        "  - cases[0].simulat: unknown key; did you mean simulate?",
        "  - cases[0].expect.admited: unknown key; did you mean admitted?",
        "  - cases[0].expect.outcome.stat: unknown key; did you mean state?",
        "  - cases[0].expect.attempts[0].atempt: unknown key; did you mean attempt?",
        "  - cases[0].expect.attempts[0].nonspot: unknown key; did you mean nonSpot?",
        "  - cases[0].expect.attempts[0].memroy: unknown key; did you mean memory?",
        "  - cases[0].expect.attempts[0].zzz: unknown key; accepted: attempt, pod, run, "
        + ", ".join(FACTS),
        "  - cases[0].expect.attempts[0]: pick the pod with attempt, pod or run",
        "0 passed, 1 failed",
    ]
    top = write_suite(tmp_path / "top.yaml", [{"manifest": "x"}], nmae="x")
    code, out, _ = run(str(top))
    assert code == 2 and "  - nmae: unknown key; did you mean name?" in out.splitlines()


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ({"manifest": "nowhere.yaml"}, "cases[0].manifest: cannot read "),
        (
            {"manifest": str(EXAMPLES / "trainjob.yaml"), "object": "Job/x"},
            "cases[0].object: 'Job/x' is not one object of ",
        ),
        (
            {"manifest": "two.yaml"},
            "cases[0].object: two.yaml holds Job/a, Job/b; pick one with object: Kind/name",
        ),
        (
            {"manifest": str(EXAMPLES / "job.yaml"), "simulate": "143,7000"},
            "cases[0].simulate: --simulate: event 2 '7000' is not an event; accepted: ",
        ),
        (
            {"manifest": str(EXAMPLES / "job.yaml"), "kubernetesVersion": 1.30},
            'cases[0].kubernetesVersion: 1.3 is not a string; quote it: "1.35"',
        ),
        (
            {"manifest": str(EXAMPLES / "job.yaml"), "config": {"defaults": {"backoff-limt": 1}}},
            "cases[0].config: defaults.backoff-limt: unknown default; did you mean backoff-limit?",
        ),
        (
            {
                "manifest": str(EXAMPLES / "job.yaml"),
                "expect": {"denied": "x", "outcome": {"state": "Failed"}},
            },
            "cases[0].expect: a denied object is not simulated; drop outcome and attempts",
        ),
        (
            {"manifest": str(EXAMPLES / "job.yaml"), "expect": {"outcome": {"state": "Done"}}},
            "cases[0].expect.outcome.state: 'Done'; accepted: Succeeded, Failed",
        ),
        (
            {
                "manifest": str(EXAMPLES / "job.yaml"),
                "expect": {"attempts": [{"attempt": 0, "memory": {"trainer": "lots"}}]},
            },
            "cases[0].expect.attempts[0].attempt: 0 is not a whole number >= 1",
        ),
        (
            {
                "manifest": str(EXAMPLES / "job.yaml"),
                "expect": {"attempts": [{"attempt": 1, "memory": {"trainer": "lots"}}]},
            },
            "cases[0].expect.attempts[0].memory: trainer: 'lots' is not a memory quantity",
        ),
        (
            {"manifest": str(EXAMPLES / "job.yaml"), "simulate": "sidecar:1"},
            "simulate: --simulate: event 1 'sidecar:1' names container 'sidecar'",
        ),
    ],
)
def test_a_case_that_cannot_run_is_an_error_that_says_why(tmp_path, case, problem):
    (tmp_path / "two.yaml").write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: a}\n---\n"
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: b}\n"
    )
    path = write_suite(tmp_path / "s.yaml", [case])
    code, out, _ = run(str(path))
    assert code == 2
    lines = out.splitlines()
    assert lines[0] == f"ERROR {path}: case 1"
    assert any(line.startswith(f"  - {problem}") for line in lines[1:]), lines


def test_directories_are_searched_for_suites_only(tmp_path):
    (tmp_path / "nested" / "deeper").mkdir(parents=True)
    (tmp_path / "nested" / "job.yaml").write_text((EXAMPLES / "job.yaml").read_text())
    (tmp_path / "nested" / "broken.yaml").write_bytes(b"\xff")
    write_suite(
        tmp_path / "nested" / "deeper" / "s.yaml", [{"name": "job", "manifest": "../job.yaml"}]
    )
    code, out, _ = run(str(tmp_path))
    assert code == 0 and out.splitlines() == [
        f"PASS {tmp_path}/nested/deeper/s.yaml: job",
        "1 passed, 0 failed",
    ]
    (tmp_path / "empty").mkdir()
    code, out, err = run(str(tmp_path / "empty"))
    assert code == 2 and "no test suite found" in err and out == "0 passed, 0 failed\n"
    assert run(str(tmp_path / "nested" / "job.yaml"))[0] == 2  # named: must be a suite


def test_suite_settings_apply_to_every_case_and_a_case_overrides_them(tmp_path):
    path = write_suite(
        tmp_path / "s.yaml",
        [
            {
                "name": "denied by the suite's rail",
                "manifest": str(EXAMPLES / "job.yaml"),
                "expect": {"denied": "guardRails.maxBackoffLimit"},
            },
            {
                "name": "a case's own config",
                "manifest": str(EXAMPLES / "job.yaml"),
                "config": {"guardRails": {"maxBackoffLimit": 5}},
            },
        ],
        config={"guardRails": {"maxBackoffLimit": 1}},
    )
    code, out, _ = run(str(path))
    assert code == 0, out


def test_a_jobset_needs_its_part_named():
    case = suite._case(
        "s.yaml",
        str(EXAMPLES),
        1,
        {"manifest": "jobset.yaml", "simulate": "1", "expect": {"outcome": {"state": "Failed"}}},
        {},
    )
    result = run_case(case)
    assert result.status == "FAIL"
    assert result.lines == [
        "part: 2 parts are simulated (replicatedJob leader, replicatedJob workers); "
        "pick one with part"
    ]


def test_the_docs_list_every_fact_and_every_key():
    """docs/POLICY-TESTS.md's tables follow the code: a new fact is documented or this fails."""
    text = (ROOT / "docs" / "POLICY-TESTS.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z]+)` \|", text, re.M))
    keys = {*FACTS, *facts.SELECTORS, *suite.CASE_KEYS, *suite.EXPECT_KEYS, *facts.OUTCOME_KEYS}
    keys |= set(suite.SUITE_KEYS)
    assert keys - documented == set()


def test_the_pre_commit_hooks_run_as_pre_commit_runs_them(tmp_path):
    """pre-commit runs ``entry`` + ``args`` + the changed files (``pass_filenames``)."""
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"retry-policy-dry-run", "retry-policy-test"}
    for hook in hooks.values():
        assert {"id", "name", "entry", "language"} <= set(hook) and hook["language"] == "python"

    def hook_run(hook, files=(), args=()):
        argv = [*hook["entry"].split(), *hook.get("args", []), *args]
        if hook.get("pass_filenames", True):
            argv += [str(f) for f in files]
        argv[0] = str(BIN)  # the hook's environment installs this package's script
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
        return done.returncode, done.stdout, done.stderr

    dry = hooks["retry-policy-dry-run"]
    # (examples whose dry run warns of nothing off; jobset.yaml's peers warning would fail)
    code, out, _ = hook_run(dry, [EXAMPLES / "job.yaml", EXAMPLES / "cronjob.yaml"])
    assert code == 0 and out.splitlines() == [
        "job.batch/train-resnet",
        "cronjob.batch/nightly-eval",
    ]
    warned = tmp_path / "warned.yaml"
    warned.write_text(WARNED)
    code, _, err = hook_run(dry, [EXAMPLES / "job.yaml", warned])
    assert code == 1 and NO_EFFECT in err
    code, out, _ = hook_run(hooks["retry-policy-test"], args=["examples/tests"])
    assert code == 0 and SUMMARY.match(out.splitlines()[-1])
