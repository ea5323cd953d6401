"""``retry-webhook explain --simulate`` held to the real components: for a manifest and a
sequence of attempts' endings, what the simulation says (how many pods, the ending and its
reason, the counted failures) is what the real Job controller, JobSet controller and
kubelet make of the same endings (each pod of the Job ends as the played kubelet is told:
``kubelet.retry-policy.dev/exit-code``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.controlplane.harness import Kube, Served, eventually, job_manifest

BIN = Path(sys.executable).parent
EXIT = "kubelet.retry-policy.dev/exit-code"
POLICY = {
    "retry-policy.dev/backoff-limit": "2",
    "retry-policy.dev/fail-non-retriable": "true",
    "retry-policy.dev/retriable-exit-codes": "137,143",
}


def simulate(manifest: dict, events: str, tmp_path: Path) -> dict:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest))
    done = subprocess.run(
        [
            str(BIN / "retry-webhook"),
            "explain",
            "-f",
            str(path),
            "--simulate",
            events,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)["items"][-1]["simulation"]


@pytest.mark.parametrize(
    "events", ["143,143,1", "143,143,143", "143,0", "137,0", "1"], ids=lambda e: e.replace(",", "-")
)
def test_a_job_ends_as_the_simulation_says(
    kube: Kube, webhook: Served, ns: str, events: str, tmp_path: Path
):
    manifest = job_manifest("sim", ns, POLICY, {EXIT: events})
    # The simulation walks through failures; an exit 0 is the attempt that succeeds.
    failures = events.removesuffix(",0")
    simulation = simulate(manifest, failures, tmp_path)
    kube.apply(manifest)
    job = kube.finished(ns, "sim", 90)
    outcome = simulation["outcome"]
    pods = kube.pods_of(ns, "sim")
    if failures != events:  # the simulation's next attempt is the one that succeeded
        assert outcome["state"] == "Running" and simulation["next"]["attempt"] == len(pods)
        assert kube.job_condition(ns, "sim", "Complete")
    else:
        assert len(pods) == len(simulation["steps"])
        assert kube.job_condition(ns, "sim", "Failed")["reason"] == outcome["reason"]
    counted = sum(1 for step in simulation["steps"] if step["counted"])
    assert job["status"].get("failed", 0) == counted


def test_a_jobset_ends_as_the_simulation_says(kube: Kube, webhook: Served, ns: str, tmp_path):
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "simset", "namespace": ns, "annotations": POLICY},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "template": {
                                "metadata": {"annotations": {EXIT: "143"}},
                                "spec": {
                                    "containers": [
                                        {"name": "main", "image": "registry.example/t:1"}
                                    ]
                                },
                            }
                        }
                    },
                }
            ]
        },
    }
    simulation = simulate(jobset, "143,143,143", tmp_path)
    kube.apply(jobset)

    def ended() -> dict | None:
        found = kube.get("jobset", "simset", ns) or {}
        return found if (found.get("status") or {}).get("terminalState") else None

    done = eventually(ended, 180, "the JobSet ended")
    outcome = simulation["outcome"]
    assert done["status"]["terminalState"] == outcome["state"]
    failed = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == outcome["reason"]
    runs = {step.get("run") for step in simulation["steps"]}
    assert done["status"]["restarts"] == len(runs) - 1
