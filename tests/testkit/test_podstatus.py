"""The played kubelet's decisions (testkit/controlplane/podstatus.py), each as the upstream
function it follows decides: what the cluster tier's pods do rests on them."""

from __future__ import annotations

import pytest

from testkit.controlplane import podstatus as ps


def pod(annotations: dict | None = None, **spec) -> dict:
    return {"metadata": {"annotations": annotations or {}}, "spec": spec}


@pytest.mark.parametrize(
    ("container", "policy", "code", "want"),
    [
        ({}, "Never", 1, ""),
        ({}, "OnFailure", 1, "Restart"),
        ({}, "OnFailure", 0, ""),
        ({}, "Always", 0, "Restart"),
        # A matching rule decides (FindMatchingContainerRestartRule: the first that matches).
        (
            {
                "restartPolicy": "Never",
                "restartPolicyRules": [
                    {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
                ],
            },
            "Never",
            42,
            "Restart",
        ),
        # No rule matches: the container's own restartPolicy, not the pod's.
        (
            {
                "restartPolicy": "Never",
                "restartPolicyRules": [
                    {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
                ],
            },
            "OnFailure",
            1,
            "",
        ),
        # NotIn matches 0 too: a container that succeeded restarts (ContainerShouldRestart).
        (
            {
                "restartPolicy": "Never",
                "restartPolicyRules": [
                    {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [1]}}
                ],
            },
            "Never",
            0,
            "Restart",
        ),
        (
            {
                "restartPolicy": "Never",
                "restartPolicyRules": [
                    {
                        "action": "RestartAllContainers",
                        "exitCodes": {"operator": "In", "values": [75]},
                    }
                ],
            },
            "Never",
            75,
            "RestartAllContainers",
        ),
    ],
)
def test_should_restart_follows_container_should_restart(container, policy, code, want):
    assert ps.should_restart({"name": "c", **container}, {"restartPolicy": policy}, code) == want


def test_a_terminal_pod_s_phase_follows_get_phase():
    def stopped(code: int) -> dict:
        return {"state": {"terminated": {"exitCode": code}}}

    assert ps.terminal_phase([stopped(0), stopped(0)]) == "Succeeded"
    assert ps.terminal_phase([stopped(0), stopped(143)]) == "Failed"


def test_the_n_th_pod_takes_the_n_th_entry_and_the_last_repeats():
    entries = ps.exit_entries(pod({ps.EXIT_CODE: "137, 0"}))
    assert [ps.entry(entries, n) for n in range(4)] == ["137", "0", "0", "0"]
    assert ps.exit_entries(pod()) == ["0"]
    assert ps.exit_entries(pod({ps.EXIT_CODE: "run"})) == ["run"]
    with pytest.raises(ValueError, match="'256'"):
        ps.exit_entries(pod({ps.EXIT_CODE: "1,256"}))


def test_137_ends_as_an_oom_kill():
    assert ps.exit_reason(137) == "OOMKilled"
    assert ps.exit_reason(0) == "Completed"
    assert ps.exit_reason(143) == "Error"


def test_stop_seconds_stay_within_the_grace_period():
    assert ps.stop_seconds(pod({ps.STOP_SECONDS: "90"}, terminationGracePeriodSeconds=5)) == 5
    assert ps.stop_seconds(pod()) == 1


@pytest.mark.parametrize(
    ("raw", "n", "want"),
    [
        (None, 0, "start"),
        ("ImagePullBackOff", 0, "ImagePullBackOff"),
        ("ImagePullBackOff,start", 1, "start"),
        ("ErrImagePull,ImagePullBackOff", 5, "ImagePullBackOff"),
    ],
)
def test_the_nth_pod_takes_the_nth_waiting_reason_and_the_last_repeats(raw, n, want):
    annotations = {} if raw is None else {ps.WAITING_REASON: raw}
    assert ps.entry(ps.waiting_entries(pod(annotations)), n) == want


@pytest.mark.parametrize("raw", ["Image Pull", "42", "ImagePull-BackOff"])
def test_a_malformed_waiting_reason_is_an_error_naming_it(raw):
    with pytest.raises(ValueError, match=ps.WAITING_REASON):
        ps.waiting_entries(pod({ps.WAITING_REASON: raw}))


def test_a_waiting_container_says_what_the_image_puller_says():
    """``ErrImagePullBackOff`` (pkg/kubelet/images/types.go) with the puller's back-off
    message; the pod's sandbox runs, its containers are not ready."""
    state = ps.waiting_state("ImagePullBackOff", "registry.example/x:1")
    assert state == {
        "waiting": {
            "reason": "ImagePullBackOff",
            "message": 'Back-off pulling image "registry.example/x:1"',
        }
    }
    kinds = {c["type"]: c for c in ps.waiting_conditions(ps.now())}
    assert kinds["PodReadyToStartContainers"]["status"] == "True"
    assert kinds["Ready"]["reason"] == "ContainersNotReady"
