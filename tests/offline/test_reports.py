"""A repository of manifests through ``dry-run`` and ``explain``: files, directories and
``-R``, stdin, every object reported with its file and document, stable exit codes,
``--fail-on-warn``, and the JUnit XML and SARIF reports validated against the schemas CI
systems read (vendored in tests/data/reports, see its README).

Everything runs the installed ``retry-webhook`` on real directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import pytest
import xmlschema
import yaml

from testkit.cli import JOB, NO_EFFECT, WARNED
from testkit.tools import ROOT
from webhook.offline import inputs, reports

BIN = Path(sys.executable).parent / "retry-webhook"
DATA = ROOT / "tests" / "data" / "reports"
JUNIT = xmlschema.XMLSchema10(DATA / "jenkins-junit.xsd")
SARIF = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())


def cli(*argv, cwd=None, stdin=""):
    result = subprocess.run(
        [str(BIN), *argv], capture_output=True, text=True, cwd=cwd, input=stdin, check=False
    )
    return result.returncode, result.stdout, result.stderr


@pytest.fixture
def repo(tmp_path):
    """A repository: nested directories, YAML and JSON, a multi-document file with a
    denial and a List, a file that is not Kubernetes YAML, one whose bytes are not text,
    a link to nowhere, and files that are not manifests at all."""
    root = tmp_path / "repo"
    (root / "apps" / "train").mkdir(parents=True)
    (root / "apps" / "train" / "job.yaml").write_text(JOB.format(name="good", limit=2))
    (root / "apps" / "multi.yml").write_text(
        "# comments first\n---\n"
        + JOB.format(name="one", limit=1)
        + "---\n"
        + JOB.format(name="denied", limit="x")
        + "---\n"
        + yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(WARNED)]})
    )
    (root / "apps" / "train" / "ray.json").write_text(
        json.dumps(yaml.safe_load((ROOT / "examples" / "rayjob.yaml").read_text()))
    )
    (root / "values.yaml").write_text("replicas: 3\nimage: trainer\n")
    (root / "apps" / "broken.yaml").write_bytes(b"kind: Job\nname: \xff\xfe\n")
    os.symlink(root / "gone.yaml", root / "apps" / "dangling.yaml")
    (root / "README.md").write_text("# not a manifest\n")
    (root / "apps" / "train" / "notes.txt").write_text("kind: Job\n")
    return root


def test_files_walks_directories_as_kubectl_does(repo):
    top = list(inputs.files([str(repo)]))
    assert top == [str(repo / "values.yaml")]
    deep = [os.path.relpath(p, repo) for p in inputs.files([str(repo)], recursive=True)]
    assert deep == [
        "apps/broken.yaml",
        "apps/dangling.yaml",
        "apps/multi.yml",
        "apps/train/job.yaml",
        "apps/train/ray.json",
        "values.yaml",
    ]
    # A file named on the command line is read whatever its name.
    assert list(inputs.files([str(repo / "README.md")])) == [str(repo / "README.md")]
    with pytest.raises(inputs.UsageError):
        list(inputs.files(["-", "-"]))


def test_documents_carry_their_file_document_item_and_line(repo):
    docs = inputs.read(str(repo / "apps" / "multi.yml"))
    assert [(d.source.document, d.source.item, d.source.line) for d in docs] == [
        (1, None, 4),
        (2, None, 17),
        (3, 1, 31),  # the item's own line, inside the List that starts on 29
    ]
    assert [inputs.label(d.obj) for d in docs] == ["Job/one", "Job/denied", "Job/warned"]
    (bad,) = inputs.read(str(repo / "values.yaml"))
    assert bad.obj is None and "document 1 is not a Kubernetes object" in bad.error
    (unreadable,) = inputs.read(str(repo / "apps" / "broken.yaml"))
    assert unreadable.error.startswith(f"cannot read {repo / 'apps' / 'broken.yaml'}: ")


def test_a_repository_in_one_command_with_every_object_and_problem_reported(repo):
    code, out, err = cli("dry-run", "-R", "-f", "repo", "-o", "json", cwd=repo.parent)
    assert code == 2  # unreadable input outranks a denial
    names = [o["metadata"]["name"] for o in json.loads(out)["items"]]
    assert names == ["one", "warned", "good", "tune-xgboost"]  # in the order walked
    lines = err.splitlines()
    assert "Error: repo/apps/multi.yml: document 2: Job/denied denied: retry-policy: " in err
    assert f"Warning: repo/apps/multi.yml: document 3, item 1: Job/warned: {NO_EFFECT}" in lines
    assert any(line.startswith("Error: cannot read repo/apps/broken.yaml: ") for line in lines)
    assert any(line.startswith("Error: cannot read repo/apps/dangling.yaml: ") for line in lines)
    assert (
        "Error: repo/values.yaml: document 1 is not a Kubernetes object (needs apiVersion "
        "and kind)" in lines
    )
    assert lines[-1] == (
        "Checked 5 object(s) in 6 file(s): 4 admitted, 1 denied, 1 with warnings, 3 input errors"
    )


def test_exit_codes_0_1_2_and_fail_on_warn(repo, tmp_path):
    good = str(repo / "apps" / "train" / "job.yaml")
    warned = tmp_path / "warned.yaml"
    warned.write_text(WARNED)
    denied = tmp_path / "denied.yaml"
    denied.write_text(JOB.format(name="d", limit="x"))
    for command in ("dry-run", "explain"):
        assert cli(command, "-f", good)[0] == 0
        assert cli(command, "-f", good, "-f", str(warned))[0] == 0
        code, _, err = cli(command, "-f", good, "-f", str(warned), "--fail-on-warn")
        assert code == 1 and NO_EFFECT in err
        # The changes the webhook makes are not warnings.
        assert cli(command, "-f", good, "--fail-on-warn")[0] == 0
        assert cli(command, "-f", good, "-f", str(denied))[0] == 1
        assert cli(command, "-f", good, "-f", str(repo / "values.yaml"))[0] == 2
        assert cli(command, "-f", "-", "-f", "-")[0] == 2
        assert cli(command)[0] == 2  # argparse: -f is required


def test_one_file_reads_as_it_always_has_and_stdin_mixes_with_files(repo):
    code, out, err = cli("dry-run", "-f", "-", stdin=JOB.format(name="a", limit=1))
    assert code == 0 and yaml.safe_load(out)["spec"]["backoffLimit"] == 1
    assert err.startswith("Change: retry-policy: spec.backoffLimit 6 -> 1")
    assert "Checked" not in err
    code, out, err = cli(
        "dry-run",
        "-f",
        "-",
        "-f",
        str(repo / "apps" / "train"),
        stdin=JOB.format(name="a", limit=1),
    )
    assert code == 0
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == ["a", "good", "tune-xgboost"]
    assert "Change: -: document 1: Job/a: retry-policy: spec.backoffLimit 6 -> 1" in err


def test_explain_names_each_objects_file_in_text_and_json(repo):
    train = str(repo / "apps" / "train")
    code, out, _ = cli("explain", "-f", train)
    assert code == 0
    assert f"From {train}/job.yaml: document 1:\n\nJob default/good\n" in out
    assert f"\n\nFrom {train}/ray.json: document 1:\n\nRayJob " in out
    code, out, _ = cli("explain", "-f", train, "-o", "json", "--simulate", "1")
    sources = [(i["kind"], i["source"]) for i in json.loads(out)["items"]]
    assert sources == [
        ("Job", {"file": f"{train}/job.yaml", "document": 1}),
        ("RayJob", {"file": f"{train}/ray.json", "document": 1}),
    ]


def junit_of(text):
    JUNIT.validate(text)  # raises with the first violation
    return ET.fromstring(text)  # noqa: S314  (our own output, just validated)


def test_junit_report_is_valid_for_ci_and_says_what_failed_where(repo):
    code, out, _ = cli("dry-run", "-R", "-f", "repo", "-o", "junit", cwd=repo.parent)
    assert code == 2
    root = junit_of(out)
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("8", "1", "3")
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert list(suites) == [
        "repo/apps/broken.yaml",
        "repo/apps/dangling.yaml",
        "repo/apps/multi.yml",
        "repo/apps/train/job.yaml",
        "repo/apps/train/ray.json",
        "repo/values.yaml",
    ]
    cases = {c.get("name"): c for c in suites["repo/apps/multi.yml"].iter("testcase")}
    assert list(cases) == [
        "Job/one (document 1)",
        "Job/denied (document 2)",
        "Job/warned (document 3, item 1)",
    ]
    assert {c.get("classname") for c in cases.values()} == {"repo/apps/multi.yml"}
    (failure,) = cases["Job/denied (document 2)"]
    assert failure.tag == "failure" and failure.get("type") == "denied"
    assert "retry-policy.dev/backoff-limit" in failure.get("message")
    warned = cases["Job/warned (document 3, item 1)"]
    assert [e.tag for e in warned] == ["system-out"] and NO_EFFECT in warned[0].text
    (error,) = suites["repo/values.yaml"].iter("error")
    assert error.get("type") == "input" and "not a Kubernetes object" in error.get("message")
    # With --fail-on-warn the warning is a failure too.
    _, out, _ = cli(
        "dry-run", "-f", "repo/apps/multi.yml", "-o", "junit", "--fail-on-warn", cwd=repo.parent
    )
    warned = [c for c in junit_of(out).iter("testcase") if c.get("name").startswith("Job/warned")]
    assert [(e.tag, e.get("type")) for e in warned[0]] == [
        ("failure", "warning"),
        ("system-out", None),
    ]


def line_of(path: Path, text: str) -> int:
    """The 1-based line of ``path`` that holds ``text`` (once)."""
    (number,) = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return number


def kind_and_level_agree(result: dict) -> bool:
    """SARIF 2.1.0 §3.27.9 and §3.27.10: ``kind: fail`` has a level other than ``none``;
    any other kind has ``none`` (absent, a level defaults to ``warning``, and a kind to
    ``fail``)."""
    kind, level = result.get("kind", "fail"), result.get("level", "warning")
    return (level != "none") if kind == "fail" else (level == "none")


def test_sarif_report_is_valid_sarif_2_1_0_with_each_finding_at_its_line(repo):
    _, out, _ = cli("dry-run", "-R", "-f", "repo", "-o", "sarif", cwd=repo.parent)
    log = json.loads(out)
    jsonschema.Draft4Validator(SARIF).validate(log)
    (run,) = log["runs"]
    results = run["results"]
    assert len(results) == 8
    assert [r for r in results if not kind_and_level_agree(r)] == []
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert all(rules[r["ruleIndex"]] == r["ruleId"] for r in results)
    by_name = {r["locations"][0]["logicalLocations"][0]["name"]: r for r in results}
    multi = repo / "apps" / "multi.yml"
    denied = by_name["Job/denied (document 2)"]
    assert (denied["level"], denied["kind"], denied["ruleId"]) == ("error", "fail", "denied")
    place = denied["locations"][0]["physicalLocation"]
    # At the annotation the problem is about, not where its document starts (17).
    assert place == {
        "artifactLocation": {"uri": "repo/apps/multi.yml"},
        "region": {"startLine": line_of(multi, 'backoff-limit: "x"')},
    }
    assert "retry-policy.dev/backoff-limit" in denied["message"]["text"]
    warned = by_name["Job/warned (document 3, item 1)"]
    # A warning that does not fail the run is still a finding: kind fail, level warning.
    assert (warned["level"], warned["kind"], warned["ruleId"]) == ("warning", "fail", "warning")
    assert warned["message"]["text"] == NO_EFFECT
    region = warned["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": line_of(multi, "on-non-retriable: fail-index")}
    good = by_name["Job/good (document 1)"]
    assert (good["level"], good["kind"]) == ("none", "pass")
    assert run["invocations"] == [{"executionSuccessful": False, "exitCode": 2}]


def test_sarif_gives_each_problem_of_an_object_its_own_result_at_its_line(tmp_path):
    """Every problem at once (a bad value, and what another key needs), each where a
    reviewer would fix it: a code-scanning alert per line."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        JOB.format(name="two", limit="x").replace(
            "    retry-policy.dev/backoff-limit",
            "    retry-policy.dev/oom-memory-factor: '1.5'\n    retry-policy.dev/backoff-limit",
        )
    )
    code, out, _ = cli("dry-run", "-f", str(manifest), "-o", "sarif")
    assert code == 1
    log = json.loads(out)
    jsonschema.Draft4Validator(SARIF).validate(log)
    results = log["runs"][0]["results"]
    found = [
        (r["locations"][0]["physicalLocation"]["region"]["startLine"], r["message"]["text"])
        for r in results
    ]
    assert [line for line, _ in found] == [
        line_of(manifest, "backoff-limit"),
        line_of(manifest, "oom-memory-factor"),
    ]
    assert "retry-policy.dev/backoff-limit: 'x' is not valid" in found[0][1]
    assert "oom-memory-factor: needs retry-policy.dev/oom-memory-limit" in found[1][1]
    assert all(kind_and_level_agree(r) and r["kind"] == "fail" for r in results)


def test_kind_and_level_agree_for_every_status_and_level():
    for status in (reports.PASSED, reports.FAILED, reports.ERROR):
        for level in ("none", "note", "warning", "error"):
            log = reports.sarif(
                [reports.Result("f.yaml", "Job/x", status, "r", "m", level=level)], {}
            )
            jsonschema.Draft4Validator(SARIF).validate(log)
            (result,) = log["runs"][0]["results"]
            assert kind_and_level_agree(result), (status, level, result)


def test_report_text_xml_cannot_carry_is_replaced_not_lost():
    text = reports.junit(
        [reports.Result("a\x00.yaml", "Job/x\x1b", reports.FAILED, "denied", "bad \x07 value")],
        "t",
    )
    root = junit_of(text)
    (case,) = root.iter("testcase")
    assert case.get("name") == "Job/x\ufffd" and case[0].get("message") == "bad \ufffd value"


def test_the_schemas_catch_a_broken_report():
    """The validation above is not vacuous: what CI tools would reject, the schemas do."""
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        JUNIT.validate('<testsuites><testsuite name="x"><testcase/></testsuite></testsuites>')
    with pytest.raises(xmlschema.XMLSchemaValidationError):  # file is not a JUnit attribute
        JUNIT.validate(
            '<testsuites><testsuite name="x" tests="1"><testcase name="a" file="f"/>'
            "</testsuite></testsuites>"
        )
    log = reports.sarif([reports.Result("f.yaml", "Job/x", reports.PASSED, "admitted", "ok")], {})
    jsonschema.Draft4Validator(SARIF).validate(log)
    log["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(SARIF).validate(log)
