"""fail-non-retriable on a workload of several pods that run together: one shared warning
(``note_peers`` in webhook/kinds/workload.py) that a preempted pod's peers fail it.

upstream: ``matchPodFailurePolicy`` (pkg/controller/job/pod_failure_policy.go) judges each
failed pod on its own conditions and exit codes. Only the pod the scheduler preempted (or
the eviction API, or a drain, evicted) carries ``DisruptionTarget``
(``PreemptionByScheduler``, ``EvictionByEvictionAPI``); its peers, which lose it (a
distributed training's other ranks), exit with codes of their own, and the FailJob rule on
non-retriable codes matches them: the Job (and the JobSet, by its
``retryPolicyFailNonRetriable`` rule) fails at once.

Objects are built as a CREATE review carries them: no uid, no creationTimestamp.
"""

from __future__ import annotations

import copy

import pytest

from testkit.builders import FULL, P, job
from testkit.trainer import mutate as mutate_trainjob
from testkit.trainer import runtime, trainjob
from testkit.workloads import admitted, mutate, pod_template
from webhook.cluster.runtimes import GivenRuntimes
from webhook.kinds.workload import concurrent_pods, peers_note

NON_RETRIABLE = {P + "fail-non-retriable": "true", P + "retriable-exit-codes": "137,143"}


def created(obj: dict) -> dict:
    """``obj`` without what the API server assigns only after admission."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("uid", None)
    obj["metadata"].pop("creationTimestamp", None)
    return obj


def peers(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "a preempted pod's peers" in w]


@pytest.mark.parametrize(
    ("spec", "pods"),
    [
        ({"parallelism": 4, "completions": 4}, 4),
        ({"parallelism": 4, "completions": 8, "completionMode": "Indexed"}, 4),
        ({"parallelism": 3}, 3),  # a work queue: completions unset
        ({"parallelism": 4, "completions": 1}, 1),  # one pod runs at a time
        ({}, 1),
    ],
    ids=["4x4", "indexed", "work-queue", "one-completion", "single"],
)
def test_a_job_whose_pods_run_together_is_warned(spec, pods):
    """``SetDefaults_Job`` (pkg/apis/batch/v1/defaults.go) leaves completions unset when
    parallelism is set alone (a work queue): then parallelism pods run at once; with
    completions, at most that many."""
    obj = created(job(NON_RETRIABLE, spec=spec))
    assert concurrent_pods(obj["spec"]) == pods
    verdict, _ = mutate(obj)
    assert verdict.allowed, verdict.message
    assert peers(verdict.warnings) == ([peers_note(pods)] if pods > 1 else [])


def test_the_warning_is_short_actionable_and_said_once():
    note = peers_note(16)
    assert len(note) <= 120
    assert note.endswith("set peer-disruptions")  # what to do: have the peers marked
    verdict, _ = mutate(created(job(FULL, spec={"parallelism": 16, "completions": 16})))
    assert peers(verdict.warnings) == [note]
    marked = {**FULL, P + "peer-disruptions": "ignore"}
    verdict, _ = mutate(created(job(marked, spec={"parallelism": 16, "completions": 16})))
    assert verdict.allowed and peers(verdict.warnings) == []  # said until it is set


def test_no_warning_without_fail_non_retriable():
    """Without it nothing fails on an exit code: the peers' failures are retried."""
    annotations = {P + "backoff-limit": "3", P + "ignore-disruptions": "true"}
    verdict, _ = mutate(created(job(annotations, spec={"parallelism": 4, "completions": 4})))
    assert verdict.allowed and peers(verdict.warnings) == []


def test_a_cronjob_is_warned_for_its_jobs():
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": dict(NON_RETRIABLE)},
        "spec": {
            "schedule": "0 2 * * *",
            "jobTemplate": {
                "spec": {
                    "parallelism": 2,
                    "completions": 2,
                    "template": pod_template("main", restart_policy="Never"),
                }
            },
        },
    }
    verdict, _ = mutate(created(admitted(manifest)))
    assert verdict.allowed, verdict.message
    assert peers(verdict.warnings) == [peers_note(2)]


def _jobset(*jobs: tuple[str, int, int]) -> dict:
    replicated = [
        {
            "name": name,
            "replicas": replicas,
            "template": {
                "spec": {
                    "parallelism": pods,
                    "completions": pods,
                    "template": pod_template("trainer", restart_policy="Never"),
                }
            },
        }
        for name, replicas, pods in jobs
    ]
    manifest = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "pretrain", "annotations": dict(NON_RETRIABLE)},
        "spec": {"replicatedJobs": replicated},
    }
    return created(admitted(manifest))


@pytest.mark.parametrize(
    ("jobs", "pods"),
    [
        ((("leader", 1, 1), ("workers", 1, 1)), 2),  # one pod per Job, two Jobs
        ((("workers", 2, 3),), 6),  # replicas x parallelism
        ((("solo", 1, 1),), 1),
    ],
    ids=["two-jobs", "replicas", "single"],
)
def test_a_jobset_counts_the_pods_of_all_its_jobs(jobs, pods):
    """A JobSet's peers may sit in other replicated Jobs (a leader and its workers): every
    replica of every Job the policy applies to counts."""
    verdict, _ = mutate(_jobset(*jobs))
    assert verdict.allowed, verdict.message
    assert peers(verdict.warnings) == ([peers_note(pods)] if pods > 1 else [])


def test_a_multi_node_trainjob_is_warned_runtime_known_or_not():
    """numNodes 4: the trainer runs 4 pods of its node Job (parallelism = numNodes:
    ``JobSet.Build``), judged as the JobSet; without the runtime, from numNodes."""
    tj = created(trainjob(NON_RETRIABLE))
    for runtimes in (GivenRuntimes([runtime()]), None):
        verdict, _ = mutate_trainjob(tj, runtimes)
        assert verdict.allowed, verdict.message
        assert peers(verdict.warnings) == [peers_note(4)]
    single = copy.deepcopy(tj)
    single["spec"]["trainer"]["numNodes"] = 1
    verdict, _ = mutate_trainjob(single, GivenRuntimes([runtime()]))
    assert peers(verdict.warnings) == []
