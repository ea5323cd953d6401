"""``retry-webhook explain --simulate``, as installed, tells what the operators do (issue 22,
part B): the training operator's PyTorchJob limits, Flyte's error files, JobSet's message
patterns and in-place restarts, KubeRay's retries. Each case names the upstream function
whose behaviour the text and the simulation follow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.builders import P
from testkit.servers import scaled

BIN = Path(sys.executable).parent / "retry-webhook"


def explain(tmp_path, manifest, *extra):
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = subprocess.run(
        [str(BIN), "explain", "-f", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    return result.returncode, " ".join(result.stdout.split()), result.stderr


def pytorchjob(annotations=None, restart_policy=None, run_policy=None):
    replicas = {}
    for rtype, count in (("Master", 1), ("Worker", 2)):
        replicas[rtype] = {
            "replicas": count,
            "template": {"spec": {"containers": [{"name": "pytorch", "image": "x:1"}]}},
        }
        if restart_policy:
            replicas[rtype]["restartPolicy"] = restart_policy
    spec = {"pytorchReplicaSpecs": replicas}
    if run_policy:
        spec["runPolicy"] = run_policy
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "finetune", "namespace": "ml", "annotations": annotations or {}},
        "spec": spec,
    }


def jobset(annotations=None, failure_policy=None, pod_rules=None):
    job_spec = {
        "completions": 2,
        "parallelism": 2,
        "template": {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "trainer", "image": "x"}]}
        },
    }
    if pod_rules:
        job_spec["podFailurePolicy"] = {"rules": pod_rules}
    spec = {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job_spec}}]}
    if failure_policy is not None:
        spec["failurePolicy"] = failure_policy
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "pretrain", "namespace": "ml", "annotations": annotations or {}},
        "spec": spec,
    }


# --- PyTorchJob: ReconcileJobs / PastBackoffLimit (training-operator release-1.9) ----------


def test_fail_non_retriable_with_a_limit_is_denied_with_the_reason(tmp_path):
    annotations = {P + "fail-non-retriable": "true", P + "backoff-limit": "3"}
    code, out, _ = explain(tmp_path, pytorchjob(annotations), "--simulate", "143")
    assert code == 1
    assert "retry-policy would deny it" in out
    assert "never enforces runPolicy.backoffLimit 3" in out
    assert "(kubeflow/trainer#2045)" in out


def test_a_written_exit_code_limit_is_shown_unenforced(tmp_path):
    # upstream: NumRequeues of the PyTorchJob controller's FakeWorkQueue is 0, and
    # PastBackoffLimit sums restart counts that stay 0 under ExitCode: 3 never stops it.
    obj = pytorchjob(restart_policy="ExitCode", run_policy={"backoffLimit": 3})
    code, out, _ = explain(tmp_path, obj, "--simulate", ",".join(["143"] * 10))
    assert code == 0
    assert "runPolicy.backoffLimit is 3 (from your own spec.runPolicy.backoffLimit), but" in out
    assert "never enforces it (kubeflow/trainer#2045" in out
    assert "counted (10 failures so far, no limit)" in out
    assert "Outcome: the PyTorchJob is still running" in out
    assert "there is no limit" in out
    # 0 is enforced: the first failed pod ends it, whatever its exit code.
    obj = pytorchjob(restart_policy="ExitCode", run_policy={"backoffLimit": 0})
    code, out, _ = explain(tmp_path, obj, "--simulate", "143")
    assert "the first failed pod fails the PyTorchJob" in out
    assert "reason PyTorchJobFailed" in out


def test_exit_code_without_a_limit_never_says_a_failure_counts_against_it(tmp_path):
    # upstream: ReconcileJobs (training-operator pkg/controller.v1/common/job.go) has no
    # limit to compare failures with while runPolicy.backoffLimit is unset.
    obj = pytorchjob({P + "fail-non-retriable": "true"})
    code, out, _ = explain(tmp_path, obj, "--simulate", "143,1")
    assert code == 0
    assert "retries failed pods without limit" in out
    assert "counts against runPolicy.backoffLimit" not in out
    assert "retried, counts (no limit)" in " ".join(out.split())


def test_on_failure_counts_restarts_of_running_pods_only(tmp_path):
    # upstream: PastBackoffLimit skips pods that are not Running; ReconcilePods replaces a
    # failed pod under OnFailure without counting it.
    obj = pytorchjob(restart_policy="OnFailure", run_policy={"backoffLimit": 2})
    code, out, _ = explain(tmp_path, obj, "--simulate", "1,disruption,1")
    assert code == 0
    assert "pod fails; not counted, its restarts are forgotten; next: a new pod" in out
    assert "Outcome: the PyTorchJob is still running" in out
    assert "is replaced without counting, and its restarts are forgotten" in out


# --- Flyte: _build_error_file_name (flytekit), the earliest-file error reader --------------


def test_error_propagation_is_explained_as_flyte_reads_it(tmp_path):
    obj = pytorchjob({P + "error-propagation": "earliest"})
    code, out, _ = explain(tmp_path, obj)
    assert code == 0
    assert "error-propagation needs Flyte's PyTorch plugin with " in out
    assert "enable-distributed-error-aggregation: true" in out
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "annotations": {P + "error-propagation": "earliest"},
        },
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}
            }
        },
    }
    code, out, _ = explain(tmp_path, job)
    assert code == 1
    assert "error-<uuid>.pb instead of error.pb" in out


# --- JobSet: ruleIsApplicable, matchPodFailurePolicy's message --------------------------------


@pytest.mark.parametrize(
    ("pattern", "action"),
    [
        # The failed pod is <namespace>/<jobset>-<replicatedJob>-<job>-<index>-<random>.
        ("for pod ml/pretrain-workers-", "JobSet rule 1 stopOnMine (FailJobSet)"),
        ("for pod ml/elsewhere-", "no JobSet rule matches (RestartJobSet)"),
        ("exit code 42 matching FailJob rule at index 0$", "JobSet rule 1 stopOnMine (FailJobSet)"),
        ("exit code 4 ", "no JobSet rule matches (RestartJobSet)"),
    ],
)
def test_jobset_message_patterns_see_the_real_message(tmp_path, pattern, action):
    rule = {
        "name": "stopOnMine",
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [pattern],
    }
    pod_rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
    obj = jobset(failure_policy={"maxRestarts": 1, "rules": [rule]}, pod_rules=pod_rules)
    code, out, _ = explain(tmp_path, obj, "--simulate", "42", "-o", "json")
    assert code == 0
    (workers,) = [i for i in json.loads(out)["items"] if i.get("simulation")]
    (step,) = workers["simulation"]["steps"]
    assert action in step["result"]


def test_a_pattern_go_reads_otherwise_is_taken_to_match_and_said_so(tmp_path):
    rule = {
        "name": "stop",
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": ["exit code (?=42)"],
    }
    pod_rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
    obj = jobset(failure_policy={"rules": [rule]}, pod_rules=pod_rules)
    code, out, _ = explain(tmp_path, obj, "--simulate", "42")
    assert code == 0
    assert "cannot be read as JobSet's Go regexp reads it" in out
    assert "JobSet rule 1 stop (FailJobSet)" in out


def test_a_restart_rule_matching_our_message_is_denied(tmp_path):
    rule = {
        "name": "restartAll",
        "action": "RestartJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [".*"],
    }
    obj = jobset({P + "fail-non-retriable": "true"}, failure_policy={"rules": [rule]})
    code, out, _ = explain(tmp_path, obj, "--simulate", "1")
    assert code == 1
    assert "(its pattern /.*/ matches the Job's message" in out


# --- JobSet InPlaceRestart: exceededMaxRestarts, the webhook's backoffLimit check ------------


def test_in_place_restart_counts_every_pod_failure_against_max_restarts(tmp_path):
    obj = jobset({P + "backoff-limit": "2"}, failure_policy={"restartStrategy": "InPlaceRestart"})
    code, out, _ = explain(tmp_path, obj, "--simulate", "143,disruption,143")
    assert code == 0
    assert "spec.replicatedJobs[0].template.spec.backoffLimit -> 2147483647" in out
    assert "backoffLimit is 2147483647, as JobSet's restartStrategy InPlaceRestart requires" in out
    assert "the whole set restarts in place (2 of 2 restarts used)" in out
    assert "Outcome: the JobSet fails; condition Failed, reason ReachedMaxRestarts" in out


def test_uncounted_restarts_leave_backoff_limit_nothing_to_bound(tmp_path):
    rule = {
        "name": "forever",
        "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": ["BackoffLimitExceeded"],
    }
    obj = jobset({P + "backoff-limit": "3"}, failure_policy={"rules": [rule]})
    code, out, _ = explain(tmp_path, obj)
    assert code == 1
    assert "3 (maxRestarts) would bound nothing" in out


# --- RayJob: checkBackoffLimitAndUpdateStatusIfNeeded (KubeRay) -----------------------------


def test_rayjob_deadline_failures_are_not_retried(tmp_path):
    obj = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "tune", "namespace": "ml", "annotations": {P + "backoff-limit": "2"}},
        "spec": {
            "entrypoint": "python tune.py",
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "r"}]}},
                }
            },
        },
    }
    code, out, _ = explain(tmp_path, obj)
    assert code == 0
    assert "DeadlineExceeded (it ran past activeDeadlineSeconds, counted from its own start)" in out
    assert "or JobStatusCheckTimeoutExceeded ends it too: KubeRay never retries those" in out
