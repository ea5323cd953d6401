"""The RayJob explainer (ray.io/v1; KubeRay ``checkBackoffLimitAndUpdateStatusIfNeeded``): a
failed attempt is retried on a new RayCluster while ``status.failed < backoffLimit + 1``,
whatever failed, but never one that failed with reason DeadlineExceeded or
JobStatusCheckTimeoutExceeded; the RayJob's own ``status.reason`` (AppFailed when the Ray
job itself failed) stays. Its simulation is the Job controller's counting
(``kinds.job.simulate``), one event an attempt."""

from __future__ import annotations

from webhook.kinds import planner
from webhook.kinds.explaining import as_int, budget_origin, kind_start
from webhook.kinds.job.simulate import JobSimulator
from webhook.kinds.rayjob import mutate as rayjob
from webhook.kinds.workload import get_path
from webhook.kube.objects import items, mapping
from webhook.plan.explained import Explanation, Subject
from webhook.plan.words import attempt_table, count_of

RAYJOB_DEFAULT = "RayJob default"


def explain_rayjob(subject: Subject) -> list[Explanation]:
    spec = subject.spec
    keys = ("backoff-limit", "error-propagation")
    item, policy = kind_start(subject, rayjob.BACKOFF, keys, RAYJOB_DEFAULT)
    limit = as_int(spec.get("backoffLimit")) or 0
    origin = budget_origin(policy, RAYJOB_DEFAULT)
    end = "jobDeploymentStatus Failed, reason AppFailed when the Ray job itself failed"
    if spec.get("clusterSelector"):
        item.budget = (
            f"backoffLimit is {limit} ({origin}), but this RayJob runs on an existing "
            "RayCluster (spec.clusterSelector), which KubeRay cannot recreate: the first "
            f"failed attempt ends it ({end})."
        )
    elif limit == 0:
        item.budget = (
            f"backoffLimit is 0 ({origin}): KubeRay does not retry; the first failed attempt "
            f"ends the RayJob ({end})."
        )
    else:
        item.budget = (
            f"backoffLimit is {limit} ({origin}): when the Ray job fails, KubeRay deletes its "
            "RayCluster and retries the whole RayJob on a new one while status.failed is "
            f"below backoffLimit + 1, so it gets up to {count_of(limit + 1, 'attempt')}; "
            f"failed attempt number {limit + 1} ends it ({end}). An attempt that fails with "
            "reason DeadlineExceeded (it ran past activeDeadlineSeconds, counted from its own "
            "start) or JobStatusCheckTimeoutExceeded ends it too: KubeRay never retries those."
        )
    item.no_match = (
        "a RayJob has no failure rules: KubeRay retries every failed attempt alike, "
        "whatever the exit code, disruptions included"
    )
    item.rules_intro = ""
    runs = 0 if spec.get("clusterSelector") else limit
    item.attempts = attempt_table(
        "spec.backoffLimit", runs, None, 0, "the RayJob fails (AppFailed)"
    )
    cluster = spec.get("rayClusterSpec") if isinstance(spec.get("rayClusterSpec"), dict) else {}
    containers = planner.container_names(
        mapping(get_path(cluster, ("headGroupSpec", "template", "spec")))
    )
    for group in items(cluster.get("workerGroupSpecs")):
        containers += planner.container_names(mapping(get_path(group, ("template", "spec"))))
    item.simulator = JobSimulator(
        [],
        runs,
        None,
        None,
        None,
        0,
        containers,
        owner="RayJob",
        limit_reason="AppFailed",
        unit="attempt",
        retry_where="on a new RayCluster",
        failed_as="jobDeploymentStatus Failed",
    )
    item.notes.append(
        "each event is one failed attempt of the whole RayJob (a bare exit code is the head's "
        "first container); fail-non-retriable, ignore-disruptions and non-spot-attempts "
        "cannot apply to a RayJob: it has no podFailurePolicy and its pods carry no attempt "
        "number"
    )
    return [item]
