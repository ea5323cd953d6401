"""How ``status`` tells a RayJob's story: retried whole by KubeRay, on a new RayCluster,
each attempt by the submitter Job it makes (same name, controlled by the RayJob:
``createNewK8sJob`` in ray-operator/controllers/ray/rayjob_controller.go)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kinds.rayjob.mutate import KIND
from webhook.kinds.story import (
    Budget,
    Decision,
    Made,
    StoryFacts,
    as_int,
    retries_left,
    subject,
)
from webhook.kube.objects import mapping

#: A RayJob's ``status.jobDeploymentStatus`` (KubeRay, ray-operator/apis/ray/v1/
#: rayjob_types.go), as a state: terminal ones end it; every other is a run or a retry.
_STATES = {"Failed": "Failed", "Suspended": "Suspended", "Suspending": "Suspended"}


def rayjob_state(rayjob: Mapping[str, Any]) -> str:
    """Succeeded (Complete, its Ray job SUCCEEDED), Failed, Suspended, Running or
    Pending (not deployed yet), from the status KubeRay writes."""
    status = mapping(rayjob.get("status"))
    deployment = str(status.get("jobDeploymentStatus") or "")
    if deployment == "Complete":
        return "Succeeded" if status.get("jobStatus") == "SUCCEEDED" else "Failed"
    return _STATES.get(deployment, "Running" if deployment else "Pending")


def rayjob_budgets(rayjob: Mapping[str, Any]) -> list[Budget]:
    """``spec.backoffLimit`` against ``status.failed``: KubeRay retries a failed attempt
    while ``failed < backoffLimit + 1`` (``checkBackoffLimitAndUpdateStatusIfNeeded``)."""
    spec = mapping(rayjob.get("spec"))
    limit = as_int(spec.get("backoffLimit"))
    failed = as_int(mapping(rayjob.get("status")).get("failed"))
    text = f"backoffLimit {limit}: " + retries_left(failed, limit).replace("counted ", "", 1)
    return [Budget(subject(KIND, rayjob), "spec.backoffLimit", limit, failed, text)]


def rayjob_decision(rayjob: Mapping[str, Any]) -> Decision | None:
    """Why a RayJob ended: its deployment status, reason (AppFailed, DeadlineExceeded,
    SubmissionFailed, ...) and message, as KubeRay writes them."""
    status = mapping(rayjob.get("status"))
    deployment = status.get("jobDeploymentStatus")
    if deployment not in ("Complete", "Failed"):
        return None
    return Decision(
        subject(KIND, rayjob),
        str(deployment),
        str(status.get("reason") or status.get("jobStatus") or ""),
        str(status.get("message") or ""),
        status.get("endTime"),
    )


STORY = StoryFacts(
    Made("batch", "v1", "Job"),
    state=rayjob_state,
    budgets=rayjob_budgets,
    decision=rayjob_decision,
    missing=(
        "no submitter Job of this RayJob exists now (KubeRay makes one per attempt in K8sJobMode)"
    ),
)
