"""The retry plan as typed values: what a workload's retries will be, as the planner makes
it (not stored whole: admission records where it wrote and with which policy, and the
planner works the rest out again from the object).

- ``BudgetPlan``: where a JobSpec keeps its retry budget, how its pods count attempts
  against it, and the one non-spot boundary rule (``non_spot``);
- ``PartPlan``: one JobSpec part of a workload (a Job's spec, a CronJob's job template, a
  JobSet's replicated Job): its policy, budget, rules, memory, restarts in place and what
  ends them, delays and per-cause budgets.

Admission records each JobSpec part it writes (``outcome.PlannedPart``: where, with which
policy); the planner (``kinds.planner.part_plan``) makes its ``PartPlan`` from that over
the object as stored, for ``explain`` and for a stored object read without admission.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from webhook.kube import intent
from webhook.kube.defaulting import DEFAULT_BACKOFF_LIMIT
from webhook.kube.restartrules import PodRestarts
from webhook.plan.causes import CauseBudgets
from webhook.plan.failureaware import ContainerMemory, MemoryPlan
from webhook.plan.inplace import InPlaceEnds
from webhook.policy.model import Delays, Policy

# --- the retry budget --------------------------------------------------------------------


@dataclass(frozen=True)
class LimitField:
    """Where a kind keeps the budget ``backoff-limit`` maps onto.

    ``api_default`` is what the API server fills in when the field is unset (so a value
    equal to it may not have been written); ``absent`` is what the controller uses when
    the field is missing (``None``: no limit).
    """

    path: tuple[str | int, ...]
    api_default: int | None
    absent: int | None

    @property
    def name(self) -> str:
        return intent.dotted(self.path)


def job_limit_field(
    path: Sequence[str | int], spec: Mapping[str, Any], defaulted: bool = True
) -> LimitField:
    """A JobSpec's budget: ``backoffLimitPerIndex`` when set (each index has its own
    budget, and the Job-wide ``backoffLimit``, defaulted to 2147483647, stays as it is),
    else ``backoffLimit`` (6 when unset; the API server fills that in only in a Job's own
    spec, so in a template (``defaulted=False``) any value present was written)."""
    if spec.get("backoffLimitPerIndex") is not None:
        return LimitField((*path, "backoffLimitPerIndex"), None, None)
    api_default = DEFAULT_BACKOFF_LIMIT if defaulted else None
    return LimitField((*path, "backoffLimit"), api_default, DEFAULT_BACKOFF_LIMIT)


def first_non_spot(limit: int, n: int) -> int:
    """The first attempt, counted by the failures before it, that ``non-spot-attempts: n``
    places on non-spot nodes, of the ``limit + 1`` attempts a budget of ``limit`` allows:
    the last ``n`` of them."""
    return limit + 1 - n


def non_spot(failures: int, limit: int | None, n: int) -> bool:
    """The non-spot boundary, the one rule the pod webhook places a pod by and ``explain``
    and ``status`` say: the attempt after ``failures`` failures runs on non-spot nodes when
    it is one of the last ``n`` its budget ``limit`` allows (``failures >= limit + 1 - n``);
    never when the budget is unknown or ``n`` is 0."""
    return limit is not None and n > 0 and failures >= first_non_spot(limit, n)


Unit = Literal["attempt", "index", "run"]


@dataclass(frozen=True)
class BudgetPlan:
    """How the pods of one JobSpec count attempts against its retry budget.

    A pod's attempt number counts *steps*. For a Job a step is one pod attempt: ``limit``
    is its ``backoffLimit`` (``unit`` "attempt"), or each index's ``backoffLimitPerIndex``
    ("index"), and ``per_step`` is 1. For a JobSet's replicated Job a step is one run of the
    whole set: ``limit`` is the set's ``maxRestarts`` ("run"), and each run holds
    ``per_step`` = the child Job's backoffLimit + 1 pod attempts that a pod cannot tell
    apart: the last ``ceil(N / per_step)`` runs go to non-spot nodes, which covers at least
    the last N attempts (exactly N when the child backoffLimit is 0). ``field`` is the
    JobSpec's own budget field (in a JobSet, the child Job's).
    """

    field: LimitField
    limit: int
    unit: Unit = "attempt"
    per_step: int = 1

    @classmethod
    def of(cls, policy: Policy, field: LimitField, restarts: int | None) -> BudgetPlan:
        """The budget of a JobSpec whose policy resolved ``backoff-limit`` against
        ``field``; ``restarts``: a parent's restarts of the whole set (a JobSet's
        ``maxRestarts``), when there is such a parent."""
        limit = policy.backoff_limit or 0
        if restarts is not None:
            return cls(field, restarts, "run", limit + 1)
        unit: Unit = "index" if field.path[-1] == "backoffLimitPerIndex" else "attempt"
        return cls(field, limit, unit)

    @property
    def steps(self) -> int:
        return self.limit + 1

    @property
    def total(self) -> int:
        """Pod attempts in all."""
        return self.steps * self.per_step

    @property
    def runs(self) -> bool:
        return self.unit == "run"

    def pod_steps(self, n: int) -> int:
        """The steps that hold the last ``n`` pod attempts."""
        return -(-n // self.per_step)

    def non_spot(self, failures: int, n: int) -> bool:
        """Whether the step after ``failures`` failed steps runs on non-spot nodes, with
        ``non-spot-attempts: n`` (``non_spot``, in this budget's steps)."""
        return non_spot(failures, self.steps - 1, self.pod_steps(n))

    @property
    def scope(self) -> str:
        """Whose attempts these are, for messages: "this Job has", "each index of this Job
        has", "this JobSet has"."""
        return {"attempt": "this Job has", "index": "each index of this Job has"}.get(
            self.unit, "this JobSet has"
        )

    @property
    def text(self) -> str:
        """The attempts' sum, for messages: "backoffLimit 3 + 1", "(maxRestarts 2 + 1) x
        (backoffLimit 0 + 1)"."""
        name = str(self.field.path[-1])
        if not self.runs:
            return f"{name} {self.limit} + 1"
        return f"(maxRestarts {self.limit} + 1) x ({name} {self.per_step - 1} + 1)"


# --- one JobSpec part --------------------------------------------------------------------


@dataclass
class PartPlan:
    """The retry facts of one batch/v1 JobSpec part, as the Job controller will read them
    (what ``explain`` called ``JobSpecView``)."""

    #: The JobSpec's field path ("spec", "spec.jobTemplate.spec",
    #: "spec.replicatedJobs[0].template.spec").
    path: str
    policy: Policy
    #: The template's pod policy (what its pods learn from their annotations).
    pods: Policy
    containers: list[str]
    limit: int
    per_index: int | None
    max_failed: int | None
    #: The final rules, and those the user wrote (the rest are the webhook's).
    rules: list[Any]
    user_rules: list[Any]
    on_failure: bool
    #: Which annotation wrote which of the webhook's rules, by rule id, as the applied
    #: record says (``plan.record``); ``None``: a version-1 record, or none.
    origins: Mapping[str, str] | None = None
    parallelism: Any = None
    completions: Any = None
    init: list[str] = field(default_factory=list)
    sidecars: list[str] = field(default_factory=list)
    #: Whether its pods take their attempt number from the Job's count of failures (a
    #: Job's, a CronJob's Jobs'), and then the budget from the Job's backoffLimit too.
    placed_by_job: bool = True
    #: What its pods' memory becomes after OOM kills (``oom-memory-factor``).
    memory: MemoryPlan | None = None
    #: Its containers' restart rules, when some restart in place, and what ends them.
    restarts: PodRestarts | None = None
    bound: InPlaceEnds = field(default_factory=InPlaceEnds)
    #: Said when the cluster drops the restart rules the template has.
    dropped: list[str] = field(default_factory=list)
    #: Its containers' memory as written, and how many failed nodes its pods keep off
    #: (``None``: avoid-failed-nodes is off).
    template_memory: tuple[ContainerMemory, ...] = ()
    avoided_nodes: int | None = None
    #: What its pods wait after a failure (``retry-delay``; ``None``: no delay).
    delays: Delays | None = None
    #: The budgets per cause its pods carry (their template's labels, as the controller
    #: reads them: ``webhook.plan.causes``).
    causes: CauseBudgets = field(default_factory=CauseBudgets)

    @property
    def placement_limit(self) -> int | None:
        """The budget pods place themselves by (the pod webhook): a Job's pods read the
        Job's backoffLimit when they are created; an index's pods (per-index budget) and
        a JobSet's (runs) go by their template's backoff-limit."""
        if self.pods.backoff_limit is None:
            return None
        if self.placed_by_job and self.per_index is None:
            return self.limit
        return self.pods.backoff_limit

    def non_spot(self, failures: int) -> bool:
        """Whether the pod after ``failures`` failures runs on non-spot nodes."""
        return non_spot(failures, self.placement_limit, self.pods.non_spot_attempts)

    @property
    def limit_name(self) -> str:
        """The field a counted failure counts against."""
        return "backoffLimitPerIndex" if self.per_index is not None else "backoffLimit"

    @property
    def budget(self) -> int:
        return self.per_index if self.per_index is not None else self.limit
