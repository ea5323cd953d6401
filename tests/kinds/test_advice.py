"""Every warning that asks for something asks for what admission accepts on that kind
(issue 48): doing what it says is admitted, and the warning is gone.

A warning is the webhook saying a workload is at risk; a user of ``dry-run
--fail-on-warn`` must be able to act on it. Each case is a workload of one kind with one
such warning, the words that ask, and that doing, written here as a change to the
manifest. The peers warning asks ``peer-disruptions`` where a podFailurePolicy decides,
and a retriable exit code where none does (a PyTorchJob: the training operator's
``ExitCode``; a JobSet under ``InPlaceRestart``: every failure restarts the set).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from testkit.builders import P, job
from testkit.kinds import cronjob, jobset, pytorchjob
from testkit.trainer import mutate as mutate_trainjob
from testkit.trainer import runtime, trainjob
from testkit.workloads import mutate
from webhook.kinds.trainjob.runtimes import GivenRuntimes

NON_RETRIABLE = {P + "fail-non-retriable": "true", P + "retriable-exit-codes": "137,143"}
GANG = {"completionMode": "Indexed", "parallelism": 4, "completions": 4}


def annotate(**values: str) -> Callable[[dict[str, Any]], None]:
    def fix(obj: dict[str, Any]) -> None:
        annotations = obj["metadata"].setdefault("annotations", {})
        annotations.update({P + k.replace("_", "-"): v for k, v in values.items()})

    return fix


def deadline(*path: str) -> Callable[[dict[str, Any]], None]:
    def fix(obj: dict[str, Any]) -> None:
        node = obj
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = 3600

    return fix


def gang_cronjob() -> dict[str, Any]:
    obj = cronjob(NON_RETRIABLE)
    obj["spec"]["jobTemplate"]["spec"].update(GANG)
    return obj


def admit_trainjob(obj: dict[str, Any]):
    return mutate_trainjob(obj, GivenRuntimes([runtime()]))


def admit(obj: dict[str, Any]):
    return mutate(obj)


PEERS = "pods run as one"
IGNORE_PEERS = "set peer-disruptions: ignore"
OWN_CODE = "list the code they exit with then"

CASES = {
    "job-peers": (lambda: job(NON_RETRIABLE, spec=GANG), admit, PEERS, IGNORE_PEERS,
                  annotate(peer_disruptions="ignore")),
    "cronjob-peers": (gang_cronjob, admit, PEERS, IGNORE_PEERS,
                      annotate(peer_disruptions="ignore")),
    "jobset-peers": (lambda: jobset(NON_RETRIABLE), admit, PEERS, IGNORE_PEERS,
                     annotate(peer_disruptions="ignore")),
    # Under InPlaceRestart peer-disruptions is denied (``NOT_APPLICABLE`` of the JobSet).
    "jobset-in-place-peers": (
        lambda: jobset(NON_RETRIABLE, failure_policy={"restartStrategy": "InPlaceRestart"}),
        admit, PEERS, OWN_CODE, annotate(retriable_exit_codes="75,137,143"),
    ),
    "trainjob-peers": (lambda: trainjob(NON_RETRIABLE), admit_trainjob, PEERS, IGNORE_PEERS,
                       annotate(peer_disruptions="ignore")),
    # peer-disruptions is denied on a PyTorchJob; ExitCode retries 128-255.
    "pytorchjob-peers": (lambda: pytorchjob(NON_RETRIABLE), admit, PEERS, "(128-255",
                         annotate(retriable_exit_codes="137,143,200")),
    # Ignored disruptions have no cap: a deadline ends them.
    "job-unbounded": (lambda: job({P + "ignore-disruptions": "true"}), admit,
                      "ignored disruptions retry with no cap", "set spec.activeDeadlineSeconds",
                      deadline("spec", "activeDeadlineSeconds")),
    # Under ExitCode nothing else ends retries of a PyTorchJob.
    "pytorchjob-unbounded": (lambda: pytorchjob(NON_RETRIABLE, runPolicy={}), admit,
                             "runPolicy.backoffLimit is not set",
                             "bound the run with runPolicy.activeDeadlineSeconds",
                             deadline("spec", "runPolicy", "activeDeadlineSeconds")),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_advice_of_a_warning_is_admitted_and_ends_it(name):
    build, admit_, warning, asks, fix = CASES[name]
    obj = build()
    verdict, _ = admit_(obj)
    assert verdict.allowed, verdict.message
    said = [w for w in verdict.warnings[verdict.changed :] if warning in w]
    assert len(said) == 1, verdict.warnings
    assert asks in said[0]
    done = copy.deepcopy(obj)
    fix(done)
    verdict, _ = admit_(done)
    assert verdict.allowed, verdict.message
    assert not [w for w in verdict.warnings if warning in w], verdict.warnings
