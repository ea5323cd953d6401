"""The workload's own state, budget and decision, read from what its controller wrote:
a Job's, a RayJob's (retried whole by KubeRay), a JobSet's (restarted as a set)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.kube.jobcontroller import exceeds_backoff_limit
from webhook.kube.objects import items, mapping
from webhook.status.model import Budget, Decision
from webhook.status.reader import Tree

#: A Job's conditions that end it, then those that say it is ending (pods terminating).
FINAL = {"Failed": "Failed", "Complete": "Succeeded"}
ENDING = {"FailureTarget": "Failing", "SuccessCriteriaMet": "Succeeding"}


def state_of(tree: Tree) -> str:
    kind = tree.kind.kind
    obj = tree.jobset if tree.jobset is not None else tree.workload
    if kind == "Job":
        return job_state(tree.workload)
    if kind == "RayJob":
        return rayjob_state(tree.workload)
    if kind == "CronJob":
        spec = mapping(tree.workload.get("spec"))
        active = items(mapping(tree.workload.get("status")).get("active"))
        if spec.get("suspend") is True:
            return "Suspended"
        return f"Active ({len(active)} Job(s) running)" if active else "Waiting for its schedule"
    for condition in items(mapping(obj.get("status")).get("conditions")):
        if mapping(condition).get("status") != "True":
            continue
        kind_of = mapping(condition).get("type")
        if kind_of in ("Completed", "Complete"):
            return "Succeeded"
        if kind_of == "Failed":
            return "Failed"
        if kind_of == "Suspended":
            return "Suspended"
    return "Running" if tree.jobs else "Pending"


#: A RayJob's ``status.jobDeploymentStatus`` (KubeRay, ray-operator/apis/ray/v1/
#: rayjob_types.go), as a state: terminal ones end it; every other is a run or a retry.
_RAYJOB_STATES = {"Failed": "Failed", "Suspended": "Suspended", "Suspending": "Suspended"}


def rayjob_state(rayjob: Mapping[str, Any]) -> str:
    """Succeeded (Complete, its Ray job SUCCEEDED), Failed, Suspended, Running or
    Pending (not deployed yet), from the status KubeRay writes."""
    status = mapping(rayjob.get("status"))
    deployment = str(status.get("jobDeploymentStatus") or "")
    if deployment == "Complete":
        return "Succeeded" if status.get("jobStatus") == "SUCCEEDED" else "Failed"
    return _RAYJOB_STATES.get(deployment, "Running" if deployment else "Pending")


def job_state(job: Mapping[str, Any]) -> str:
    """Succeeded, Failed, Succeeding or Failing (ending, pods terminating), Suspended,
    Running or Pending, from the conditions and counts the Job controller writes."""
    status = mapping(job.get("status"))
    conditions = [mapping(c) for c in items(status.get("conditions"))]
    for names in (FINAL, ENDING):
        for condition in conditions:
            if condition.get("status") == "True" and condition.get("type") in names:
                return names[str(condition["type"])]
    if mapping(job.get("spec")).get("suspend") is True:
        return "Suspended"
    return "Running" if (status.get("active") or 0) > 0 else "Pending"


# --- a RayJob: retried whole, on a new RayCluster ----------------------------------------


def rayjob_budgets(rayjob: Mapping[str, Any]) -> list[Budget]:
    """``spec.backoffLimit`` against ``status.failed``: KubeRay retries a failed attempt
    while ``failed < backoffLimit + 1`` (``checkBackoffLimitAndUpdateStatusIfNeeded``)."""
    spec = mapping(rayjob.get("spec"))
    limit = as_int(spec.get("backoffLimit"))
    failed = as_int(mapping(rayjob.get("status")).get("failed"))
    name = f"RayJob {mapping(rayjob.get('metadata')).get('name')}"
    text = f"backoffLimit {limit}: " + retries_left(failed, limit).replace("counted ", "", 1)
    return [Budget(name, "spec.backoffLimit", limit, failed, text)]


def rayjob_decision(rayjob: Mapping[str, Any]) -> Decision | None:
    """Why a RayJob ended: its deployment status, reason (AppFailed, DeadlineExceeded,
    SubmissionFailed, ...) and message, as KubeRay writes them."""
    status = mapping(rayjob.get("status"))
    deployment = status.get("jobDeploymentStatus")
    if deployment not in ("Complete", "Failed"):
        return None
    return Decision(
        f"RayJob {mapping(rayjob.get('metadata')).get('name')}",
        str(deployment),
        str(status.get("reason") or status.get("jobStatus") or ""),
        str(status.get("message") or ""),
        status.get("endTime"),
    )


# --- budgets of a JobSet ----------------------------------------------------------------


def jobset_budgets(jobset: Mapping[str, Any]) -> list[Budget]:
    spec = mapping(jobset.get("spec"))
    status = mapping(jobset.get("status"))
    policy = spec.get("failurePolicy")
    restarts = as_int(status.get("restarts"))
    counted = status.get("restartsCountTowardsMax")
    counted = as_int(counted) if counted is not None else restarts
    name = f"JobSet {mapping(jobset.get('metadata')).get('name')}"
    if not isinstance(policy, dict):
        return [
            Budget(
                name,
                "spec.failurePolicy",
                0,
                restarts,
                "no failurePolicy: the first Job that fails fails the JobSet",
            )
        ]
    limit = as_int(policy.get("maxRestarts"))
    text = f"maxRestarts {limit}: {used_text(counted, limit, 'restart')}"
    if restarts != counted:
        text += f" ({restarts} in all; {restarts - counted} by rules that do not count)"
    return [Budget(name, "spec.failurePolicy.maxRestarts", limit, counted, text)]


def used_text(used: int, limit: int, noun: str) -> str:
    left = max(0, limit - used)
    return f"{used} {noun}{'' if used == 1 else 's'} used, {left} left"


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def jobset_decision(jobset: Mapping[str, Any]) -> Decision | None:
    name = f"JobSet {mapping(jobset.get('metadata')).get('name')}"
    return final_condition(jobset, name, ("Completed",))


def final_condition(obj: Mapping[str, Any], subject: str, done: Sequence[str]) -> Decision | None:
    for condition in items(mapping(obj.get("status")).get("conditions")):
        condition = mapping(condition)
        if condition.get("status") == "True" and condition.get("type") in ("Failed", *done):
            return Decision(
                subject,
                str(condition.get("type")),
                str(condition.get("reason") or ""),
                str(condition.get("message") or ""),
                condition.get("lastTransitionTime"),
            )
    return None


def retries_left(used: int, limit: int) -> str:
    """``used`` counted failures against ``limit``, in words: over the budget once they
    exceed it (the Job controller's ``exceedsBackoffLimit``, and KubeRay's, which retries
    while ``failed < backoffLimit + 1``)."""
    failures_text = f"{used} counted failure{'' if used == 1 else 's'}"
    if exceeds_backoff_limit(used, limit):
        return f"{failures_text}: over the budget"
    left = limit - used
    return f"{failures_text}, {left} retr{'y' if left == 1 else 'ies'} left"
