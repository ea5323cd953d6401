"""The gate-releasing hook never stops a `helm uninstall`.

helm runs a phase's hooks one by one and waits for each Job to complete; a Job that fails
fails the phase, and a failed pre-delete phase ends the uninstall before anything is
deleted (upstream: execHookWithDelayedShutdown, helm pkg/action/hooks.go; Uninstall.Run,
pkg/action/uninstall.go; a Job with condition Failed is not ready, jobConditions in
internal/statusreaders/job_status_reader.go). So the hook's command is a shell script that
always exits 0: the rendered script is run here by the real /bin/sh, around the real
`retry-webhook release-gates` against the HTTP test API (as the hook's ServiceAccount,
behind the chart's admission policy) and around stand-ins that fail, hang or are missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.chart import NAMESPACE, RELEASE, hook_events, one, render
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.gates import gated_pod
from testkit.vap import Policy, gate
from webhook.kube import gates

pytestmark = pytest.mark.tools

NAME = f"{RELEASE}-retry-policy-webhook-release-gates"
HOOK_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
SH = "/bin/sh"


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def hook_job(helm_path: str, values: dict | None = None) -> dict:
    return one(render(helm_path, values or {}), "Job", NAME)


def script_of(job: dict) -> tuple[list[str], str, dict[str, str]]:
    """The container's command, its script and its environment, as rendered."""
    (c,) = job["spec"]["template"]["spec"]["containers"]
    (script,) = c["args"]
    return c["command"], script, {e["name"]: e["value"] for e in c["env"] if "value" in e}


def run_script(script: str, path: list[Path], env: dict[str, str], **extra: str):
    """The script under the real /bin/sh, with ``path`` first on PATH."""
    environment = {
        "PATH": os.pathsep.join([*map(str, path), "/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", "/tmp"),
        **env,
        **extra,
    }
    started = time.monotonic()
    done = subprocess.run(
        [SH, "-c", script], capture_output=True, text=True, env=environment, timeout=120
    )
    return done, time.monotonic() - started


def stand_in(tmp_path: Path, body: str) -> Path:
    """A directory whose ``retry-webhook`` runs ``body`` (sh) and records its arguments."""
    folder = tmp_path / f"bin-{time.monotonic_ns()}"
    folder.mkdir()
    program = folder / "retry-webhook"
    program.write_text(f'#!/bin/sh\necho "$@" > "{folder}/args"\n{body}\n')
    program.chmod(0o755)
    return folder


def test_the_hook_job_is_bounded_and_its_log_shown(helm):
    job = hook_job(helm)
    command, script, env = script_of(job)
    assert command == [SH, "-c"]
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == 120
    assert env["RELEASE_GATES_SECONDS"] == "60"  # half: the rest is for the pod to start
    assert spec["backoffLimit"] == 2  # only pods a node lost: the command never fails it
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook-output-log-policy"].split(",")) == {
        "hook-succeeded",
        "hook-failed",
    }
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
    }
    assert hook_events(job) == {"pre-delete", "post-delete"}
    shorter = hook_job(helm, {"controller": {"releaseGatesJob": {"activeDeadlineSeconds": 10}}})
    assert script_of(shorter)[2]["RELEASE_GATES_SECONDS"] == "5"
    # The script: no `set -e`, every exit is `exit 0`, and it ends with one.
    lines = [line.strip() for line in script.strip().splitlines()]
    assert lines[-1] == "exit 0"
    assert [line for line in lines if line.startswith("exit")] == ["exit 0"]
    assert not any(line.startswith("set ") for line in lines)
    assert lines[0].startswith('timeout -k 5 "$RELEASE_GATES_SECONDS" retry-webhook release-gates')


def test_the_real_command_releases_the_gates_and_the_hook_succeeds(api, helm, tmp_path):
    _, script, env = script_of(hook_job(helm))
    api.admit = gate(Policy(one(render(helm, {}), "ValidatingAdmissionPolicy")), HOOK_USER)
    for name, namespace in (("a", "ml"), ("b", "batch")):
        api.put("pods", gated_pod(name, time.time() + 3600, namespace))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    done, _ = run_script(script, [Path(sys.executable).parent], env, KUBECONFIG=str(kubeconfig))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "2 retry-delay gate(s) released"
    assert done.stderr == "" and api.refused == []
    for uid in ("uid-a", "uid-b"):
        assert gates.GATE not in [g["name"] for g in api.pod(uid)["spec"]["schedulingGates"]]


def test_an_api_that_fails_is_reported_and_the_hook_succeeds(api, helm, tmp_path):
    _, script, env = script_of(hook_job(helm))
    api.put("pods", gated_pod("a", time.time() + 3600))
    api.fail_lists = 1
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    done, _ = run_script(script, [Path(sys.executable).parent], env, KUBECONFIG=str(kubeconfig))
    assert done.returncode == 0
    assert "Error: cannot list pods in all namespaces: HTTP 500" in done.stderr
    assert "retry-webhook release-gates failed (exit status 1)" in done.stderr
    assert "run 'retry-webhook release-gates --all-namespaces'" in done.stderr


@pytest.mark.parametrize(
    ("case", "body", "said"),
    [
        ("succeeds", "echo '0 retry-delay gate(s) released'; exit 0", None),
        ("fails", "exit 1", "failed (exit status 1)"),
        ("has no cluster", "echo 'Error: no Kubernetes API' >&2; exit 2", "failed (exit status 2)"),
        ("dies", "kill -9 $$", "failed (exit status 137)"),
        ("hangs", "exec sleep 600", "did not finish within 1s"),
        (
            "ignores SIGTERM",
            "trap '' TERM; sleep 600 & wait; sleep 600",
            "failed (exit status 137)",
        ),
    ],
)
def test_whatever_the_command_does_the_hook_succeeds(helm, tmp_path, case, body, said):
    _, script, env = script_of(hook_job(helm))
    folder = stand_in(tmp_path, body)
    done, took = run_script(script, [folder], {**env, "RELEASE_GATES_SECONDS": "1"})
    assert done.returncode == 0, (case, done.stderr)
    assert (folder / "args").read_text().split() == ["release-gates", "--all-namespaces"]
    if said is None:
        assert done.stderr == "" and "released" in done.stdout
    else:
        assert f"retry-webhook release-gates {said}" in done.stderr
    assert took < 60  # bounded by the script's own timeout (1 s, then SIGKILL 5 s later)


def test_a_missing_command_is_reported_and_the_hook_succeeds(helm, tmp_path):
    _, script, env = script_of(hook_job(helm))
    empty = tmp_path / "empty"
    empty.mkdir()
    done, _ = run_script(script, [empty], env)
    assert done.returncode == 0
    assert "retry-webhook release-gates failed (exit status 127)" in done.stderr
