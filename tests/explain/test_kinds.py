"""``retry-webhook explain`` for CronJob, JobSet, RayJob and PyTorchJob alike: JSON that agrees
with the text, 80 columns, and the installed CLI on every shipped example."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from testkit.builders import FULL, P
from testkit.cli import run
from testkit.explain import assert_text_and_json_agree, doc_block
from testkit.explainkinds import (
    BIN,
    EXAMPLES,
    example,
    items,
    jobset,
    pytorchjob,
    rayjob,
    replicated,
)
from testkit.servers import scaled
from webhook import explain

KINDS = ["cronjob", "jobset", "rayjob", "pytorchjob"]


EVENTS = "143,disruption,137,1"


def long_jobset():
    name = "a-very-long-replicated-job-name-for-the-distributed-trainer"
    rules = [
        {
            "name": "restartOnAVeryLongListOfReasonsThatKeepsGoing",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes"],
            "onJobFailureMessagePatterns": ["a-rather-long-pattern-that-does-not-wrap-by-itself.*"],
            "targetReplicatedJobs": [name],
        }
    ]
    return jobset(
        FULL | {P + "backoff-limit": "40", P + "non-spot-attempts": "7"},
        jobs=[replicated(name, 12, containers=("a-very-long-container-name-for-the-trainer",))],
        failure_policy={"rules": rules},
        name="an-equally-long-jobset-name-that-keeps-going-and-going-on",
    )


CASES = {
    **{f"{kind}-example": (example(kind), EVENTS) for kind in KINDS},
    **{f"{kind}-plain": None for kind in KINDS},
    "jobset-long": (long_jobset(), EVENTS),
    "pytorchjob-never": (pytorchjob(restart_policy="Never", runPolicy={"backoffLimit": 1}), "1"),
    "rayjob-selector": None,
}


def case(name):
    if CASES[name] is not None:
        return CASES[name]
    if name == "rayjob-selector":
        obj = rayjob(clusterSelector={"ray.io/cluster": "shared"})
        del obj["spec"]["rayClusterSpec"]
        return obj, "1"
    obj = example(name.removesuffix("-plain"))
    del obj["metadata"]["annotations"]
    obj["spec"].pop("failurePolicy", None)
    return obj, EVENTS


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kind_json_agrees_with_the_text(name):
    obj, events = case(name)
    for item in items(obj, events=events):
        assert_text_and_json_agree(item)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kind_fits_80_columns(name):
    obj, events = case(name)
    for simulate in (None, events):
        text = explain.render_text(items(obj, events=simulate))
        assert len(text.splitlines()) > 15
        assert [line for line in text.splitlines() if len(line) > 80] == []


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_through_the_installed_cli(path):
    for extra in ([], ["--simulate", EVENTS], ["-o", "json", "--simulate", EVENTS]):
        result = subprocess.run(
            [str(BIN), "explain", "-f", str(path), "--kubernetes-version", "1.36", *extra],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        if "json" in extra:
            data = json.loads(result.stdout)
            assert data["items"] and all(i["allowed"] for i in data["items"])
            assert any(i["simulation"] for i in data["items"])
        else:
            # A runtime beside a TrainJob is read by it, not explained.
            docs = list(yaml.safe_load_all(path.read_text()))
            kind = next(d["kind"] for d in docs if not d["kind"].endswith("TrainingRuntime"))
            assert result.stdout.startswith(f"{kind} ml/")


def test_all_examples_in_one_stream():
    stream = "---\n".join(path.read_text() for path in sorted(EXAMPLES.glob("*.yaml")))
    argv = ["explain", "-f", "-", "-o", "json", "--kubernetes-version", "1.36"]
    code, out, err = run(argv, stdin=stream)
    assert (code, err) == (0, "")
    kinds = [item["kind"] for item in json.loads(out)["items"]]
    assert sorted(set(kinds)) == ["CronJob", "Job", "JobSet", "PyTorchJob", "RayJob", "TrainJob"]


def test_explain_page_jobset_example_is_what_the_command_prints():
    code, out, _ = run(
        ["explain", "-f", str(EXAMPLES / "jobset.yaml"), "--simulate", "143,disruption,137,1"]
    )
    assert code == 0
    workers = out.index("JobSet ml/llm-pretrain (replicatedJob workers)")
    start = out.index("Attempt plan", workers)
    end = out.index("\nNotes:", start)
    assert doc_block("<!-- explain-jobset-output -->") == out[start:end]
