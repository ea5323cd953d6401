"""``retry-webhook explain`` for a PyTorchJob (``webhook.kinds.pytorchjob.explain``): the
restartPolicy as rules, provenance, and the training operator's counting simulated."""

from __future__ import annotations

import pytest

from testkit.builders import P
from testkit.explain import assert_text_and_json_agree, setting
from testkit.explainkinds import POLICY, items, pytorchjob, reviewed


def test_pytorchjob_provenance_and_rules():
    (item,) = items(pytorchjob(POLICY))
    assert [s.name for s in item.settings] == [
        "backoff-limit",
        "fail-non-retriable",
        "retriable-exit-codes",
        "error-propagation",
    ]
    assert setting(item, "fail-non-retriable").text == "your annotation"
    assert reviewed(pytorchjob(POLICY)).outcome.policies["spec"].backoff_limit is None
    (rule,) = item.rules
    assert (rule.action, rule.when, rule.then, rule.origin) == (
        "ExitCode",
        "exit codes 1-127 in container pytorch (an error of the program, not a signal)",
        "the PyTorchJob fails at once",
        "set by retry-policy for fail-non-retriable",
    )
    assert item.no_match.startswith("anything else (exit codes 128-255, or a pod that failed")
    assert "retries failed pods without limit" in item.budget
    assert item.attempts is None
    (yours,) = items(pytorchjob(restart_policy="ExitCode", runPolicy={"backoffLimit": 1}))
    assert yours.rules[0].origin == "your restartPolicy"
    assert setting(yours, "backoff-limit").text == "your own spec.runPolicy.backoffLimit"
    (plain,) = items(pytorchjob())
    assert (setting(plain, "backoff-limit").value, setting(plain, "backoff-limit").text) == (
        "-",
        "PyTorchJob default",
    )
    assert plain.rules == [] and plain.attempts is None
    assert "(the training operator's default)" in plain.budget
    assert "retries failed pods without limit" in plain.budget


@pytest.mark.parametrize(
    ("obj", "events", "state", "message"),
    [
        (pytorchjob(POLICY), "1", "Failed", "pod 1 matched ExitCode rule 1"),
        (
            pytorchjob(POLICY | {P + "backoff-limit": "0"}),
            "143",
            "Failed",
            "1 counted failure, more than backoffLimit 0",
        ),
        (pytorchjob(POLICY), "143,oom,disruption", "Running", None),
        # upstream: PastBackoffLimit sums restartCount of running pods only; a pod that fails
        # as a whole is recreated (ReconcilePods) and counted only by the NumRequeues check,
        # which holds for a limit of 0 alone.
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 2}),
            "1,disruption,1,disruption,1",
            "Running",
            None,
        ),
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 0}),
            "disruption",
            "Failed",
            "1 failed pod, more than backoffLimit 0",
        ),
        (
            pytorchjob(restart_policy="Never", runPolicy={"backoffLimit": 3}),
            "143",
            "Failed",
            "pod 1 matched Never rule 1",
        ),
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 2}),
            "1,1",
            "Failed",
            "2 restarts reach backoffLimit 2",
        ),
        (
            pytorchjob(restart_policy="OnFailure", runPolicy={"backoffLimit": 2}),
            "1",
            "Running",
            None,
        ),
    ],
)
def test_pytorchjob_simulate(obj, events, state, message):
    (item,) = items(obj, events=events)
    sim = item.simulation
    assert sim.ending.state == state
    if state == "Failed":
        assert (sim.ending.reason, sim.ending.message) == ("PyTorchJobFailed", message)
    assert_text_and_json_agree(item)


def test_pytorchjob_exit_code_reads_only_the_pytorch_container():
    obj = pytorchjob(POLICY, containers=("sidecar", "pytorch"))
    (item,) = items(obj, events="sidecar:1,1")
    first, second = item.simulation.steps
    assert (first.what, first.counted, first.rule) == (
        "exit code 1 (application error) in container sidecar",
        True,
        None,
    )
    assert second.what == "exit code 1 (application error) in container pytorch"
    assert item.simulation.ending.reason == "PyTorchJobFailed"


def test_pytorchjob_without_a_limit_and_with_mixed_restart_policies():
    obj = pytorchjob(restart_policy="ExitCode")
    (item,) = items(obj, events=",".join(["143"] * 20))
    assert item.simulation.ending.state == "Running"
    assert item.simulation.ending.message.endswith("there is no limit")
    assert "counted (20 failures so far, no limit)" in item.simulation.steps[-1].result
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "OnFailure"
    (mixed,) = items(obj)
    assert any("Master ExitCode, Worker OnFailure" in note for note in mixed.notes)
