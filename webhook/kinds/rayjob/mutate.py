"""ray.io/v1 RayJob: the budget is ``spec.backoffLimit``.

KubeRay retries a RayJob as a whole: each retry creates a new RayCluster, while
``status.failed < backoffLimit + 1``. The field defaults to 0 in the CRD, must be >= 0,
and KubeRay's validation rejects values above 0 with ``spec.clusterSelector`` (the job
runs on an existing cluster, there is none to recreate) and with ``submissionMode:
InteractiveMode`` (see ray-operator/controllers/ray/utils/validation.go).

KubeRay does not retry a RayJob that failed with reason DeadlineExceeded (its
``activeDeadlineSeconds``, counted from each attempt's start) or
JobStatusCheckTimeoutExceeded, whatever the budget (``checkBackoffLimitAndUpdateStatusIfNeeded``
in ray-operator/controllers/ray/rayjob_controller.go).

A RayJob has no podFailurePolicy and its pods carry no attempt number, so
``fail-non-retriable``, ``ignore-disruptions`` and ``non-spot-attempts`` cannot be
honoured: they are denied when annotated, and skipped with a warning when they come
from an admin default. Nor can ``error-propagation``: Flyte's Ray plugin reads only
``error.pb`` (``job.check_error_propagation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kinds.workload import (
    WRITTEN_SOURCES,
    WorkloadMutator,
    check_error_propagation,
    check_not_applicable,
    enforce_rail,
    get_path,
    resolve_limit,
    write_limit,
)
from webhook.kube.wellknown import RAY_GROUP
from webhook.plan.model import LimitField
from webhook.plan.outcome import Context, Outcome
from webhook.policy.model import Policy, Setting, Source, with_setting
from webhook.problems import Problem

KIND = "RayJob"
BACKOFF = LimitField(("spec", "backoffLimit"), 0, 0)
#: Why each setting cannot apply to a RayJob, as the denial says it.
NOT_APPLICABLE = {
    "fail-non-retriable": "it has no podFailurePolicy; KubeRay retries a failed RayJob on a "
    "new RayCluster whatever the exit code",
    "ignore-disruptions": "it has no podFailurePolicy; KubeRay counts every failed RayJob "
    "attempt against backoffLimit, disruptions included",
    "non-spot-attempts": "each retry runs on a new RayCluster whose pods carry no attempt "
    "number, so the last attempts cannot be recognised",
    "oom-memory-factor": "each retry runs on a new RayCluster whose pods belong to no Job, "
    "so the OOM kills of earlier attempts cannot be found",
    "avoid-failed-nodes": "each retry runs on a new RayCluster whose pods belong to no Job, "
    "so the nodes of earlier attempts cannot be found",
    "attempt-env": "each retry runs on a new RayCluster whose pods carry no attempt number",
    "retry-delay": "each retry runs on a new RayCluster whose pods carry no attempt number, "
    "so the pods of a retry cannot be told from the first",
    "in-place-exit-codes": "KubeRay makes its pods from the RayCluster's templates and "
    "manages their restarts itself; set restart rules in those templates",
    "max-disruptions": "it has no podFailurePolicy; KubeRay counts every failed RayJob "
    "attempt against backoffLimit, disruptions included",
    "max-in-place-restarts": "KubeRay makes its pods from the RayCluster's templates and "
    "manages their restarts itself",
    "peer-disruptions": "it has no podFailurePolicy; KubeRay retries a failed RayJob on a "
    "new RayCluster whatever failed in it",
    "free-categories": "it has no podFailurePolicy; KubeRay counts every failed RayJob "
    "attempt against backoffLimit, whatever failed in it",
    "max-free-failures": "it has no podFailurePolicy: no failure is free (free-categories)",
    "fail-categories": "it has no podFailurePolicy; KubeRay retries a failed RayJob on a "
    "new RayCluster whatever failed in it",
    "start-deadline": "KubeRay makes its pods from the RayCluster's templates and replaces "
    "them itself: a pod ended for its start deadline would be made again",
}


class RayJobMutator(WorkloadMutator):
    group = RAY_GROUP
    kind = KIND

    def budget_field(self, obj: Mapping[str, Any]) -> LimitField | None:
        return BACKOFF

    def apply(self, rayjob: dict[str, Any], policy: Policy, ctx: Context, out: Outcome) -> Policy:
        spec = rayjob.get("spec")
        if not isinstance(spec, dict):
            out.problems.append(Problem("spec", "a RayJob needs a spec"))
            return policy
        policy = check_not_applicable(policy, KIND, NOT_APPLICABLE, out)
        policy = check_error_propagation(policy, KIND, out)
        policy = resolve_limit(rayjob, BACKOFF, policy, out)
        policy = _check_kuberay_limits(spec, policy, out)
        policy = enforce_rail(policy, BACKOFF, ctx, out)
        if out.problems:
            return policy
        write_limit(rayjob, BACKOFF, policy, out)
        out.policies["spec"] = policy
        return policy


def _check_kuberay_limits(spec: Mapping[str, Any], policy: Policy, out: Outcome) -> Policy:
    """KubeRay rejects ``backoffLimit > 0`` in two modes; say so before it does."""
    setting = policy.setting("backoff-limit")
    if not policy.backoff_limit or setting.source not in WRITTEN_SOURCES:
        return policy
    if spec.get("clusterSelector"):
        why = (
            "KubeRay retries a RayJob on a new RayCluster, which it cannot do with "
            "spec.clusterSelector (an existing cluster); accepted here: 0"
        )
    elif spec.get("submissionMode") == "InteractiveMode":
        why = "KubeRay does not retry a RayJob in submissionMode InteractiveMode; accepted here: 0"
    else:
        return policy
    out.conflict(
        policy, "backoff-limit", f"{policy.backoff_limit} is not allowed: {why}", "kuberay"
    )
    current = get_path(spec, ("backoffLimit",))
    return with_setting(
        policy,
        "backoff-limit",
        Setting(current if isinstance(current, int) else 0, Source.KUBERNETES),
    )
