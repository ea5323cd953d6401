"""batch/v1 Job (Indexed Jobs included): its own JobSpec (``kinds.jobspec``), and what an
UPDATE of its budget must keep."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.cluster.record import Record
from webhook.kinds.base import JobSpecs, UpdateCheck
from webhook.kinds.jobspec import JOB_OWNED, JOB_OWNED_WITHOUT_RESTARTS, apply_job_spec
from webhook.kinds.workload import (
    WorkloadMutator,
    check_error_propagation,
    get_path,
    note_peers,
    run_together,
)
from webhook.kube.objects import controller_of, mapping
from webhook.kube.owned import Owned
from webhook.plan.model import LimitField, job_limit_field
from webhook.plan.outcome import Context, Outcome
from webhook.plan.policies import has_policy_annotations
from webhook.policy.config import Config
from webhook.policy.model import (
    PREFIX,
    Policy,
    Scope,
    parse_annotations,
)
from webhook.problems import Problem


class JobMutator(WorkloadMutator):
    group = "batch"
    kind = "Job"
    owns = JOB_OWNED
    multikueue = True

    def applies(self, job: Mapping[str, Any], ctx: Context) -> bool:
        if made_from_template(job.get("metadata")):
            return False
        # Our keys on the pod template alone are checked too: some belong on the Job.
        template = get_path(job, ("spec", "template", "metadata"))
        return super().applies(job, ctx) or has_policy_annotations(template)

    def owned(self, job: Mapping[str, Any], config: Config) -> Owned:
        """What ``mutate`` may write in ``job`` under ``config``: ``owns``, but the pod
        template's spec when nothing can ask for restarts in place (no annotation of the
        Job's, no admin default, no defaults carried from its creator): the copy then
        shares it, and the diff does not walk its containers."""
        metadata = job.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
        asked = isinstance(annotations, dict) and (
            IN_PLACE in annotations or CARRIED in annotations
        )
        if asked or config.has_default("in-place-exit-codes"):
            return JOB_OWNED
        return JOB_OWNED_WITHOUT_RESTARTS

    def apply(self, job: dict[str, Any], policy: Policy, ctx: Context, out: Outcome) -> Policy:
        spec = job.get("spec")
        if not isinstance(spec, dict):
            out.problems.append(Problem("spec", "a Job needs a spec"))
            return policy
        policy = check_error_propagation(policy, self.kind, out)
        policy = apply_job_spec(job, ("spec",), spec, policy, ctx, out)
        note_peers(policy, run_together(spec), out)
        return policy

    def job_specs(self, job: Mapping[str, Any]) -> JobSpecs:
        return [("spec", ("spec",))]

    def budget_field(self, job: Mapping[str, Any]) -> LimitField | None:
        """``spec.backoffLimit``, the one budget field the API lets change
        (``ValidateJobSpecUpdate``: backoffLimitPerIndex and podFailurePolicy are
        immutable); a per-index Job's annotation is its immutable per-index budget, and the
        Jobs of a CronJob or JobSet follow their parent's policy."""
        spec = job.get("spec")
        if made_from_template(job.get("metadata")) or not isinstance(spec, dict):
            return None
        if spec.get("backoffLimitPerIndex") is not None:
            return None
        return job_limit_field(("spec",), spec)

    def check_update(self, job: Mapping[str, Any], old: Mapping[str, Any]) -> UpdateCheck:
        if lowered_by_controller(job, old):
            return [], [], {"history"}
        problems, warnings, current = super().check_update(job, old)
        field = self.budget_field(job)
        if field is not None and get_path(job, field.path) != get_path(old, field.path):
            problems.extend(_non_spot_update(job, old, field, warnings))
        return problems, warnings, current


def lowered_by_controller(job: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether an update is the controller's count of disruptions past max-disruptions
    whose pods failed unmarked (``webhook.controller.disruptions``): ``backoffLimit``
    lowered by exactly what the record, written in the same patch, says it lowered more.
    The annotation keeps the budget asked for; the record says what was spent from it."""
    new_limit, old_limit = (
        get_path(job, ("spec", "backoffLimit")),
        get_path(old, ("spec", "backoffLimit")),
    )
    if not isinstance(new_limit, int) or not isinstance(old_limit, int) or new_limit >= old_limit:
        return False
    new_record, old_record = Record.of(job), Record.of(old)
    if new_record is None:
        return False
    before = old_record.lowered if old_record is not None else 0
    return new_record.lowered - before == old_limit - new_limit


#: The annotations that can ask a Job for restarts in place: its own, and the admin
#: defaults its creator carried to it (``plan.policies.carried_layers``).
IN_PLACE, CARRIED = PREFIX + "in-place-exit-codes", PREFIX + "defaults"

#: Kinds whose Jobs are made from a template this webhook already applied the policy to,
#: as (group, kind): each such kind's folder declares it (``makes_jobs_from_template``).
TEMPLATE_OWNERS: set[tuple[str, str]] = set()


def makes_jobs_from_template(group: str, kind: str) -> None:
    """Declare that ``kind`` makes its Jobs from a template its own admission applied the
    policy to (that kind's folder declares it, as it is loaded with the kinds' list)."""
    TEMPLATE_OWNERS.add((group, kind))


def made_from_template(metadata: Any) -> bool:
    """Whether a Job was made by a kind declared in ``TEMPLATE_OWNERS`` (a CronJob, a
    JobSet), whose admission already applied the policy to the template the Job was made
    from. Its own admission leaves it alone: the policy is already in its spec, applying it
    again (or an admin default that has changed since) could only disagree with what was
    validated, and in a JobSet ``backoff-limit`` means restarts of the set, not retries of
    the child Job."""
    if not isinstance(metadata, dict):
        return False
    ref = controller_of(metadata)
    if ref is None:
        return False
    group = str(ref.get("apiVersion") or "").rpartition("/")[0]
    return (group, str(ref.get("kind"))) in TEMPLATE_OWNERS


def _non_spot_update(
    job: Mapping[str, Any], old: Mapping[str, Any], field: LimitField, warnings: list[str]
) -> list[Problem]:
    """A Job whose pods are placed by ``non-spot-attempts``: its pods read the Job's
    backoffLimit when they are created (``kinds.pod``), so placement follows the
    change; only more non-spot attempts than the new budget has is refused, as at
    creation (when annotated; with a value from a default every attempt goes to
    non-spot nodes, with a warning)."""
    template = get_path(job, ("spec", "template", "metadata", "annotations"))
    pod_values, _ = parse_annotations(template if isinstance(template, dict) else None, Scope.POD)
    n = pod_values.get("non-spot-attempts")
    new = get_path(job, field.path)
    if not n or not isinstance(new, int):
        return []
    change = f"{field.name} {get_path(old, field.path)} -> {new}"
    attempts = new + 1
    if n <= attempts:
        warnings.append(
            f"retry-policy: {change}: the Job's next pods place the last {n} of "
            f"{attempts} attempts on non-spot nodes"
        )
        return []
    annotated, _ = parse_annotations(
        mapping(job.get("metadata")).get("annotations"), Scope.WORKLOAD
    )
    message = (
        f"{n} is more than the {attempts} attempts {field.name} {new} + 1 allows "
        f"(changed from {get_path(old, field.path)}); accepted: 0 to {attempts}"
    )
    if "non-spot-attempts" in annotated:
        return [Problem(f"annotation {PREFIX}non-spot-attempts", message, "too-many-non-spot")]
    warnings.append(f"retry-policy: {change}: every attempt will run on non-spot nodes")
    return []
