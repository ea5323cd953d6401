"""fail-non-retriable on a workload of several pods that run together: one shared warning
(``note_peers`` in webhook/kinds/workload.py) that a preempted pod's peers may fail it,
said only where the pods work as one and with advice admission accepts on that kind.

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
from webhook.kinds.trainjob.runtimes import GivenRuntimes
from webhook.kinds.workload import peers_note, run_together

NON_RETRIABLE = {P + "fail-non-retriable": "true", P + "retriable-exit-codes": "137,143"}


def created(obj: dict) -> dict:
    """``obj`` without what the API server assigns only after admission."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("uid", None)
    obj["metadata"].pop("creationTimestamp", None)
    return obj


def peers(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "pods run as one" in w]


INDEXED = {"completionMode": "Indexed"}


@pytest.mark.parametrize(
    ("spec", "pods"),
    [
        ({**INDEXED, "parallelism": 4, "completions": 4}, 4),  # a rank per index
        ({**INDEXED, "parallelism": 8, "completions": 4}, 4),  # parallelism capped
        # Pods that find each other by name (a headless Service's subdomain).
        ({**INDEXED, "parallelism": 4, "completions": 8, "template": {"subdomain": "t"}}, 4),
        ({**INDEXED, "parallelism": 4, "completions": 8}, 1),  # shards, a few at a time
        ({"parallelism": 4, "completions": 4}, 4),  # all at once, as one
        ({"parallelism": 2, "completions": 6}, 1),  # pieces, a few at a time
        ({"parallelism": 3}, 1),  # a work queue: completions unset
        ({}, 1),
    ],
    ids=["indexed", "capped", "subdomain", "shards", "4x4", "pieces", "queue", "single"],
)
def test_a_job_is_warned_only_when_its_pods_work_as_one(spec, pods):
    """Peers fail a Job only where they need each other: all its completions running at
    once, or an Indexed Job's pods addressed by name. Shards run a few at a time and a
    work queue's pods do not notice a preempted neighbour. ``SetDefaults_Job``
    (pkg/apis/batch/v1/defaults.go) leaves completions unset for a work queue."""
    spec = copy.deepcopy(spec)
    subdomain = spec.pop("template", {}).get("subdomain")
    obj = created(job(NON_RETRIABLE, spec=spec))
    if subdomain:
        obj["spec"]["template"]["spec"]["subdomain"] = subdomain
    assert run_together(obj["spec"]) == pods
    verdict, _ = mutate(obj)
    assert verdict.allowed, verdict.message
    assert peers(verdict.warnings) == ([peers_note(pods)] if pods > 1 else [])


GANG = {**INDEXED, "parallelism": 16, "completions": 16}


def test_the_warning_says_the_risk_and_what_admission_accepts():
    note = peers_note(16)
    assert len(note) < 120  # one line of kubectl's
    assert "a preempted pod's peers may exit and fail the workload" in note
    verdict, _ = mutate(created(job(FULL, spec=GANG)))
    assert peers(verdict.warnings) == [note]
    for fix in ({P + "peer-disruptions": "ignore"}, {P + "retriable-exit-codes": "75,137,143"}):
        verdict, _ = mutate(created(job({**FULL, **fix}, spec=GANG)))
        assert verdict.allowed, verdict.message
        assert peers(verdict.warnings) == []  # said until one of the two is done


def test_no_warning_with_fail_index():
    """With ``on-non-retriable: fail-index`` a peer's exit fails its own index only."""
    annotations = {**NON_RETRIABLE, P + "on-non-retriable": "fail-index"}
    verdict, _ = mutate(created(job(annotations, spec={**GANG, "backoffLimitPerIndex": 1})))
    assert verdict.allowed, verdict.message
    assert peers(verdict.warnings) == []


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
                    "completionMode": "Indexed",
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
