"""What an explanation is made of, as plain values (rendered as text or JSON by
``webhook.explain``): the settings, rules, attempt table and in-place table of one part of
a workload (``Explanation``), and what each kind's explainer is given (``Subject``).
Each kind's explainer (``kinds/<kind>/explain.py``) builds them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from webhook.kube.objects import mapping
from webhook.plan.failureaware import MemoryPlan
from webhook.plan.outcome import Context, Outcome, PlannedPart
from webhook.plan.simulation import Simulation, Simulator
from webhook.policy.model import Policy, format_value

#: Plans longer than this show their first and last rows and the non-spot boundary.
MAX_ATTEMPT_ROWS = 12
#: Rows per container at most in a memory table (a small factor takes many steps to
#: reach the limit).
MEMORY_ROWS = 8


WORKLOAD_KEYS = (
    "backoff-limit",
    "fail-non-retriable",
    "retriable-exit-codes",
    "ignore-disruptions",
    "non-spot-attempts",
    "error-propagation",
)
#: Shown when one is set (budgets per cause, ``webhook.plan.causes``).
BUDGET_KEYS = ("max-disruptions", "peer-disruptions", "max-in-place-restarts")
#: Shown when one is set (failure categories, ``webhook.plan.verdicts``).
VERDICT_KEYS = ("free-categories", "max-free-failures", "fail-categories", "start-deadline")
POD_KEYS = ("backoff-limit", "non-spot-attempts", "error-propagation", "attempt")
#: Shown when either is set (``webhook.plan.delays``).
BETWEEN_KEYS = ("attempt-env", "retry-delay", "retry-delay-factor", "retry-delay-max")
#: Shown when any of them is set (failure-aware retries, ``webhook.plan.failureaware``).
FAILURE_AWARE_KEYS = ("oom-memory-factor", "oom-memory-limit", "avoid-failed-nodes")
#: Shown when in-place restarts are asked for (``webhook.plan.inplace``).
IN_PLACE_KEYS = ("in-place-exit-codes", "in-place-scope")


# --- the explanation model (plain values: rendered as text or JSON) ----------------


@dataclass(frozen=True)
class SettingLine:
    name: str
    value: str
    source: str
    detail: str
    text: str


@dataclass(frozen=True)
class RuleLine:
    number: int
    action: str
    when: str
    then: str
    origin: str
    counts: bool | None


@dataclass(frozen=True)
class AttemptRow:
    attempt: int
    failures_before: int
    nodes: str
    if_fails: str
    retries_left: int | None
    #: What the attempt's pod waits after the failure before it (``retry-delay``): a
    #: duration, "-" for none; "" when the table has no delays.
    waits: str = ""


@dataclass(frozen=True)
class AttemptGap:
    """Attempts left out of a long table; all like the row before them."""

    first: int
    last: int


@dataclass
class AttemptTable:
    """What each attempt runs on and what its failure does, from the first to the one
    past the budget (shown as "Attempt plan"; JSON ``plan``)."""

    limit_field: str
    limit: int
    non_spot_attempts: int
    rows: list[AttemptRow | AttemptGap]
    #: What one row is: an "attempt" (a pod), or a "run" of a JobSet (every Job recreated).
    unit: str = "attempt"
    #: Whether the rows say what each attempt waits (``retry-delay``).
    delays: bool = False


@dataclass(frozen=True)
class MemoryRow:
    """A container's memory in an attempt after ``kills`` OOM kills of it (``last``: and
    in every attempt after more, the value being at the limit)."""

    container: str
    kills: int
    request: str
    limit: str
    last: bool = False


@dataclass
class MemoryTable:
    factor: str
    limit: str
    rows: list[MemoryRow]


def memory_table(plan: MemoryPlan) -> MemoryTable:
    """What each container's memory becomes after its OOM kills, one attempt after another,
    until it reaches the limit (at most ``MEMORY_ROWS`` rows a container)."""
    rows = []
    for name in plan.containers:
        for kills in range(MEMORY_ROWS + 1):
            request, limit = plan.at(name, kills)
            final = kills > 0 and (request, limit) == plan.at(name, kills + 1)
            rows.append(MemoryRow(name, kills, request, limit, final))
            if final:
                break
    factor = format_value("oom-memory-factor", plan.factor)
    return MemoryTable(factor, str(plan.cap), rows)


def memory_words(plan: MemoryPlan, name: str, kills: int) -> str:
    """A container's memory after ``kills`` OOM kills, in words."""
    request, limit = plan.at(name, kills)
    return f"{name}'s memory {request}" + (f"/{limit}" if limit != "-" else "")


@dataclass(frozen=True)
class CodeGroup:
    """Exit codes of one container that do the same thing: ``outcome`` is "restart" (the
    container restarts in place), "restart-pod" (the whole pod does), or what a pod that
    failed with them does ("FailJob", "FailIndex", "Ignore", "Count", "pod-fails")."""

    outcome: str
    codes: list[int]
    text: str


@dataclass(frozen=True)
class ContainerCodes:
    container: str
    groups: list[CodeGroup]
    #: A native sidecar (an init container with restartPolicy Always) with rules of its own.
    sidecar: bool = False


@dataclass(frozen=True)
class InPlaceTable:
    """What each regular container's exit codes do when its restart rules can restart it
    in place, what ends those restarts, and the kubelet's back-off before each."""

    containers: list[ContainerCodes]
    bound: str
    bounded: bool
    backoff: str


@dataclass
class Explanation:
    kind: str
    api_version: str
    namespace: str
    name: str
    #: Which part of the object this explains ("" for the object itself).
    part: str = ""
    changes: list[str] = field(default_factory=list)
    settings: list[SettingLine] = field(default_factory=list)
    budget: str = ""
    rules: list[RuleLine] = field(default_factory=list)
    no_match: str = ""
    examples: list[str] = field(default_factory=list)
    attempts: AttemptTable | None = None
    notes: list[str] = field(default_factory=list)
    simulation: Simulation | None = None
    #: The memory of each container by its OOM kills before (``oom-memory-factor``).
    memory: MemoryTable | None = None
    #: What each container's exit codes do when some restart it in place.
    in_place: InPlaceTable | None = None
    simulator: Simulator | None = field(default=None, repr=False)
    #: The kind a simulated failure ends (a CronJob's Jobs fail, not the CronJob).
    owner: str = ""
    #: The sentence that introduces ``rules``.
    rules_intro: str = (
        "When a pod fails, Kubernetes checks these rules in order; the first match wins:"
    )
    #: Said instead of the generic note when ``--simulate`` is given and there is no simulator.
    simulate_note: str = ""
    #: Under ``rollout: audit``: the defaults' settings held back (``Outcome.audited``).
    audited: list[SettingLine] = field(default_factory=list)


class Admits(Protocol):
    """Admission of an object an explainer makes on the way (the JobSet a TrainJob's
    runtime makes), handed in by explain, which may import admission where kinds may not:
    the object as admission stores it, and its outcome."""

    def __call__(
        self, obj: dict[str, Any], ctx: Context
    ) -> tuple[Mapping[str, Any], Outcome | None]: ...


@dataclass(frozen=True)
class Subject:
    """What an explainer gets: the object before and after the webhook, and its review."""

    original: Mapping[str, Any]
    final: Mapping[str, Any]
    outcome: Outcome | None
    ctx: Context
    changes: list[str]
    #: How to admit an object made on the way (``None``: nothing may be admitted).
    admit: Admits | None = None

    def policy(self, where: str) -> Policy | None:
        return self.outcome.policies.get(where) if self.outcome is not None else None

    def planned(self, where: str) -> PlannedPart | None:
        """What admission recorded for the JobSpec part at ``where`` (``None``: it wrote no
        such part, or this subject was not admitted: ``status`` reads a stored object)."""
        return self.outcome.plans.get(where) if self.outcome is not None else None

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.final.get("spec")
        return spec if isinstance(spec, dict) else {}

    def header(self, part: str = "") -> Explanation:
        metadata = mapping(self.final.get("metadata"))
        return Explanation(
            kind=str(self.final.get("kind")),
            api_version=str(self.final.get("apiVersion")),
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or metadata.get("generateName") or "<unnamed>"),
            part=part,
            changes=list(self.changes),
        )


Explainer = Callable[[Subject], list[Explanation]]
