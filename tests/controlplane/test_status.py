"""``retry-webhook status`` (and ``kubectl retry-policy``, the same command found by the
real kubectl's plugin discovery) against the real API server: the story of a Job the real
controllers ran, told from what they and our controller wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testkit.controlplane.harness import Kube, Served, eventually, job_manifest

BIN = Path(sys.executable).parent
EXIT = "kubelet.retry-policy.dev/exit-code"


def status(kube: Kube, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    return subprocess.run(
        [str(BIN / "retry-webhook"), "status", "--kubeconfig", str(kube.cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_status_tells_a_failed_job_s_attempts_from_the_real_cluster(
    kube: Kube, webhook: Served, ns: str
):
    policy = {
        "retry-policy.dev/backoff-limit": "2",
        "retry-policy.dev/fail-non-retriable": "true",
        "retry-policy.dev/oom-memory-factor": "2",
        "retry-policy.dev/oom-memory-limit": "1Gi",
    }
    job = job_manifest("story", ns, policy, {EXIT: "137,3"})
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {"memory": "64Mi"}
    kube.apply(job)
    kube.finished(ns, "story", 90)
    # The history recorder writes the failures on the Job (its record) once they ended.
    eventually(
        lambda: (
            "retry-policy.dev/history" in kube.get("job", "story", ns)["metadata"]["annotations"]
        ),
        30,
        "the record",
    )
    eventually(
        lambda: "RetryPolicyFailedJob" in status(kube, "job/story", "-n", ns).stdout,
        30,
        "the controller's Events",
    )
    done = status(kube, "job/story", "-n", ns, "-o", "json")
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout)
    reasons = {event.get("reason") for event in told["events"]}
    assert {"RetryMemoryIncreased", "RetryPolicyFailedJob"} <= reasons
    words = status(kube, "job/story", "-n", ns).stdout
    assert f"Job {ns}/story: Failed" in words
    assert "OOM-killed" in words and "exit code 3" in words
    assert "64Mi -> 128Mi" in words
    assert "Failed (PodFailurePolicy)" in words
