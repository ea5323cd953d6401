"""The shipped examples, through the dry-run CLI: one per kind and all in one stream.

Each result is checked field by field, validated (strict Kubernetes schemas, or the CRD
schema plus the embedded Kubernetes types), its patch applied with Go's json-patch, and
mutated again to show nothing more changes.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import yaml

from testkit.builders import P
from testkit.tools import ROOT
from testkit.workloads import STRATEGY, WORKER_NAME, kubectl_patch, mutate, validate_schema
from webhook import cli
from webhook.kinds.jobset.failurepolicy import peer_rule
from webhook.kinds.jobset.rules import our_rule
from webhook.kinds.trainjob.mutate import MANAGER, jobset_for
from webhook.kube.failurepolicy import (
    PEER_DISRUPTED,
    condition_rule,
    ignore_disruptions_rule,
    non_retriable_rule,
)
from webhook.kube.intent import LAST_APPLIED
from webhook.plan.record import rule_id

EXAMPLES = ROOT / "examples"
NAMES = ["job", "indexed-job", "cronjob", "jobset", "rayjob", "pytorchjob"]
ENV = [WORKER_NAME, STRATEGY]


def dry_run(*argv, stdin=""):
    out, err = io.StringIO(), io.StringIO()
    old, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        args = cli.build_parser().parse_args(["dry-run", *argv])
        code = args.func(args, out, err)
    finally:
        sys.stdin = old
    return code, out.getvalue(), err.getvalue()


def result(name):
    code, out, err = dry_run("-f", str(EXAMPLES / f"{name}.yaml"), "-o", "json")
    assert code == 0, err
    (item,) = json.loads(out)["items"]
    return item, err


def applied(obj):
    return json.loads(obj["metadata"]["annotations"][P + "applied"])


def containers(pod_template_spec):
    return pod_template_spec["spec"]["containers"]


def test_every_example_is_checked():
    # trainjob.yaml holds two documents (the runtime and the TrainJob): its own test below.
    assert sorted(p.stem for p in EXAMPLES.glob("*.yaml")) == sorted(
        [*NAMES, "trainjob", "inplace-job"]
    )


def test_job_example():
    job, _ = result("job")
    spec = job["spec"]
    assert spec["backoffLimit"] == 3
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["podFailurePolicy"]["rules"] == [
        ignore_disruptions_rule(),
        non_retriable_rule([137, 143], "FailJob", "trainer"),
    ]
    assert "env" not in containers(spec["template"])[0]


def test_indexed_job_example():
    job, err = result("indexed-job")
    spec = job["spec"]
    assert spec["backoffLimitPerIndex"] == 2
    assert spec["backoffLimit"] == 2147483647  # the API default, untouched
    assert spec["maxFailedIndexes"] == 10
    assert spec["podFailurePolicy"]["rules"] == [
        ignore_disruptions_rule(),
        non_retriable_rule([143], "FailIndex", "embed"),
    ]
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["template"]["metadata"]["annotations"] == {
        P + "backoff-limit": "2",
        P + "non-spot-attempts": "1",
    }
    assert applied(job)["onNonRetriable"] == "fail-index"
    assert "the last 1 of 3 attempts of each index will run on non-spot nodes" in err


def test_cronjob_example():
    cronjob, _ = result("cronjob")
    assert cronjob["spec"]["schedule"] == "0 3 * * *"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    job_spec = cronjob["spec"]["jobTemplate"]["spec"]
    assert job_spec["backoffLimit"] == 2
    assert job_spec["podFailurePolicy"]["rules"] == [
        ignore_disruptions_rule(),
        non_retriable_rule([143], "FailJob", "eval"),
    ]
    assert "podReplacementPolicy" not in job_spec  # each Job's API defaulting sets Failed
    assert job_spec["template"]["spec"]["restartPolicy"] == "Never"
    assert applied(cronjob) == {
        "backoffLimit": 2,
        "failNonRetriable": [143],
        "ignoreDisruptions": True,
        "origins": {
            "fail-non-retriable": rule_id(non_retriable_rule([143], "FailJob", "eval")),
            "ignore-disruptions": rule_id(ignore_disruptions_rule()),
        },
        "v": 2,
    }


def test_jobset_example():
    jobset, err = result("jobset")
    policy = jobset["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 3
    # peer-disruptions: ignore puts its rule first (its message pattern matches only
    # the FailureTarget the controller writes); fail-non-retriable's after the user's.
    assert policy["rules"] == [
        peer_rule("ignore"),
        {
            "name": "failOnDeadline",
            "action": "FailJobSet",
            "onJobFailureReasons": ["DeadlineExceeded"],
        },
        our_rule(),
    ]
    assert peer_rule("ignore")["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    for rjob in jobset["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        assert spec["backoffLimit"] == 0
        assert spec["podFailurePolicy"]["rules"] == [
            condition_rule(PEER_DISRUPTED, "Ignore"),  # peer-disruptions: ignore
            ignore_disruptions_rule(),
            non_retriable_rule([137, 143], "FailJob", "trainer"),
        ]
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        assert spec["template"]["metadata"]["annotations"] == {
            P + "backoff-limit": "3",
            P + "non-spot-attempts": "1",
        }
    assert [rjob["replicas"] for rjob in jobset["spec"]["replicatedJobs"]] == [1, 4]
    assert "the last 1 of 4 JobSet runs will run on non-spot nodes" in err


def test_rayjob_example():
    rayjob, _ = result("rayjob")
    spec = rayjob["spec"]
    assert spec["backoffLimit"] == 2
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    (group,) = cluster["workerGroupSpecs"]
    assert group["replicas"] == 2
    assert applied(rayjob) == {"backoffLimit": 2, "v": 2}


def test_pytorchjob_example():
    job, err = result("pytorchjob")
    # No backoff limit: under ExitCode the operator would never enforce one (the example
    # says so); the deadline bounds the run.
    assert job["spec"]["runPolicy"] == {"activeDeadlineSeconds": 21600}
    for rtype in ("Master", "Worker"):
        rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
        assert rspec["restartPolicy"] == "ExitCode"
        assert containers(rspec["template"])[0]["env"] == ENV
    assert "ExitCode also retries exit codes 128-255 outside retriable-exit-codes" in err
    assert "needs Flyte's PyTorch plugin with enable-distributed-error-aggregation" in err


@pytest.mark.parametrize("name", NAMES)
def test_example_result_is_valid_patch_applies_and_mutation_is_done(name, tmp_path):
    obj, _ = result(name)
    for version in ("1.33", "1.37") if obj["apiVersion"].startswith("batch/") else ("1.37",):
        validate_schema(obj, version)
    # The -o patch output applies with Go's json-patch to the object the server would see.
    source = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    prepared, _ = cli.prepare(source, None)
    code, out, err = dry_run("-f", str(EXAMPLES / f"{name}.yaml"), "-o", "patch")
    assert code == 0, err
    (entry,) = json.loads(out)
    patched = kubectl_patch(prepared, entry["patch"], tmp_path)
    patched["metadata"]["annotations"].pop(LAST_APPLIED)
    assert patched == obj
    # Reinvoked on its own result, the webhook changes nothing.
    verdict, again = mutate(obj)
    assert verdict.allowed and verdict.patch == [] and again == obj


def test_inplace_example(tmp_path):
    """Its own test: its result depends on the cluster's version (1.35 and newer)."""
    path = str(EXAMPLES / "inplace-job.yaml")
    code, out, err = dry_run("-f", path, "-o", "json", "--kubernetes-version", "1.35")
    assert code == 0, err
    (job,) = json.loads(out)["items"]
    spec = job["spec"]
    (trainer,) = containers(spec["template"])
    assert trainer["restartPolicy"] == "Never"
    assert trainer["restartPolicyRules"] == [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
    ]
    assert non_retriable_rule([42, 143], "FailJob", "trainer") in spec["podFailurePolicy"]["rules"]
    validate_schema(job, "1.37")
    code, out, err = dry_run("-f", path, "-o", "patch", "--kubernetes-version", "1.35")
    (entry,) = json.loads(out)
    prepared, _ = cli.prepare(yaml.safe_load(Path(path).read_text()), None)
    patched = kubectl_patch(prepared, entry["patch"], tmp_path)
    patched["metadata"]["annotations"].pop(LAST_APPLIED)
    assert patched == job
    code, _, err = dry_run("-f", path, "--kubernetes-version", "1.34")
    assert code == 1
    assert "need Kubernetes 1.35 or newer" in err


def test_all_examples_in_one_stream():
    stream = "\n---\n".join((EXAMPLES / f"{name}.yaml").read_text() for name in NAMES)
    code, out, err = dry_run("-f", "-", "-o", "json", stdin=stream)
    assert code == 0, err
    items = json.loads(out)["items"]
    assert [item["kind"] for item in items] == [
        "Job",
        "Job",
        "CronJob",
        "JobSet",
        "RayJob",
        "PyTorchJob",
    ]
    assert items == [result(name)[0] for name in NAMES]


def test_a_denied_document_does_not_stop_the_others():
    denied = (
        (EXAMPLES / "rayjob.yaml")
        .read_text()
        .replace("retry-policy.dev/backoff-limit", "retry-policy.dev/fail-non-retriable")
    )
    denied = denied.replace('fail-non-retriable: "2"', 'fail-non-retriable: "true"')
    stream = denied + "\n---\n" + (EXAMPLES / "pytorchjob.yaml").read_text()
    code, out, err = dry_run("-f", "-", "-o", "json", stdin=stream)
    assert code == 1
    assert "Error: RayJob/tune-xgboost denied: retry-policy: annotation" in err
    assert "cannot apply to a RayJob" in err
    assert [item["kind"] for item in json.loads(out)["items"]] == ["PyTorchJob"]


def test_trainjob_example(tmp_path):
    """The TrainJob gets the webhook's runtime patch with the Job example's annotations;
    the runtime beside it passes through; the JobSet the trainer makes from both gets the
    policy at its admission; explain shows that JobSet."""
    path = str(EXAMPLES / "trainjob.yaml")
    code, out, err = dry_run("-f", path, "-o", "json")
    assert code == 0, err
    runtime, trainjob = json.loads(out)["items"]
    source = list(yaml.safe_load_all((EXAMPLES / "trainjob.yaml").read_text()))
    assert runtime == source[0]
    annotations = {k: v for k, v in trainjob["metadata"]["annotations"].items()}
    (entry,) = trainjob["spec"]["runtimePatches"]
    assert entry == {
        "manager": MANAGER,
        "trainingRuntimeSpec": {"template": {"metadata": {"annotations": annotations}}},
    }
    for obj in (runtime, trainjob):
        validate_schema(obj)
    prepared, _ = cli.prepare(source[1], None)
    code, out, err = dry_run("-f", path, "-o", "patch")
    assert code == 0, err
    patches = {item["kind"]: item["patch"] for item in json.loads(out)}
    assert patches["TrainingRuntime"] == []
    patched = kubectl_patch(prepared, patches["TrainJob"], tmp_path)
    patched["metadata"]["annotations"].pop(LAST_APPLIED)
    assert patched == trainjob
    # The JobSet the trainer makes from the two.
    jobset = jobset_for({**trainjob, "metadata": {**trainjob["metadata"], "uid": "u"}}, runtime)
    verdict, stored = mutate(jobset)
    assert verdict.allowed, verdict.message
    validate_schema(stored)
    rules = [peer_rule("ignore"), our_rule()]  # peer-disruptions' first
    assert stored["spec"]["failurePolicy"] == {"maxRestarts": 3, "rules": rules}
    (rjob,) = stored["spec"]["replicatedJobs"]
    assert rjob["template"]["spec"]["podFailurePolicy"]["rules"] == [
        condition_rule(PEER_DISRUPTED, "Ignore"),  # peer-disruptions: ignore
        ignore_disruptions_rule(),
        non_retriable_rule([137, 143], "FailJob", "node"),
    ]
    assert "the last 1 of 4 JobSet runs will run on non-spot nodes" in " ".join(verdict.warnings)
    # explain: the TrainJob, then its JobSet, from the same file.
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["explain", "-f", path, "--simulate", "1"])
    assert args.func(args, out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert "TrainJob ml/llm-finetune\n" in text
    assert "JobSet ml/llm-finetune (made by the trainer from TrainingRuntime ml/torch-spot)" in text
    assert "maxRestarts is 3 (from your annotation retry-policy.dev/backoff-limit)" in text
    assert "retryPolicyFailNonRetriable (FailJobSet): the JobSet fails at once" in text
    assert "kubeflow/trainer#3779" in text
    assert "TrainingRuntime" not in err.getvalue()  # the runtime is read, not explained


def test_every_shipped_example_passes_the_ci_recipe():
    """The README's CI recipe, ``dry-run -R -f <dir> --fail-on-warn``, on the shipped
    manifests (examples/*.yaml, the recorded objects of examples/status/ and the policy
    suites' manifests): each sets what a warning would ask, so none warns, and stderr
    tells changes (``Change:``) from warnings (``Warning:``, the lines that fail it)."""
    from testkit.cli import run as run_cli

    paths = [str(p) for p in sorted(EXAMPLES.glob("*.yaml"))]
    code, _, err = run_cli(
        [
            "dry-run",
            "-R",
            "-f",
            *paths,
            "-f",
            str(EXAMPLES / "status"),
            "-f",
            str(EXAMPLES / "tests" / "manifests"),
            "--fail-on-warn",
            "-o",
            "name",
        ]
    )
    assert code == 0, err
    assert "Warning:" not in err
    assert err.count("Change: ") > 30
