"""What ``status`` tells, as values: a workload's story, its Jobs, their attempts and
the next attempt (``render`` prints them); the budgets and decisions, which each kind's
story facts build too, are ``kinds.story``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhook import explain
from webhook.cluster.limits import LimitLookup
from webhook.cluster.nodes import NodeAnswer
from webhook.kinds.story import Budget, Decision
from webhook.kube.scheduling import Placement
from webhook.status import audit as audit_

# --- the model -------------------------------------------------------------------------


@dataclass
class DisruptionCount:
    """How the controller counted a disrupted pod against ``max-disruptions``."""

    #: "free", "counted" (over the budget), or ``None``: not in the workload's record
    #: (the controller has not counted it, or not yet written the count).
    result: str | None
    limit: int
    #: Its number (from its ``DisruptionBudgetExhausted`` condition); ``None`` for a free one.
    number: int | None = None
    #: Whether it carries ``retry-policy.dev/DisruptionBudgetExhausted``.
    marked: bool = False
    #: Over the budget but ``Failed`` before it could be marked (the record's late marks):
    #: "lowered" (the controller lowered the Job's backoffLimit for it), "other" (its
    #: rules counted it, or nothing could be lowered), ``None``: neither.
    late: str | None = None


@dataclass
class PeerMark:
    """A pod marked ``retry-policy.dev/PeerDisrupted``: whose disruption, and the setting."""

    peer: str | None
    cause: str | None
    #: ``peer-disruptions`` as the pod's label says: "ignore" or "count".
    setting: str | None
    #: Whether the rule on PeerDisrupted decided the failed pod (not an earlier rule).
    by_rule: bool = False


@dataclass
class InPlace:
    """A pod's restarts in place (as ``max-in-place-restarts`` counts them)."""

    restarts: int
    limit: int | None
    #: Marked ``retry-policy.dev/InPlaceBudgetExhausted``: replaced for using its budget.
    replaced: bool = False


@dataclass
class Attempt:
    """One pod of a Job: a failed attempt (``counted`` says whether the Job controller
    counts it), or the attempt running now."""

    pod: str
    job: str
    phase: str
    node: str | None
    created: str
    index: int | None = None
    #: ``failure_cause``'s grammar: ``oom-killed:<c>``, ``exit-code:<n>:<c>``,
    #: ``disruption``; "" when it cannot be told.
    cause: str = ""
    container: str | None = None
    exit_code: int | None = None
    disruption: str | None = None
    finished: str | None = None
    counted: bool | None = None
    #: The podFailurePolicy rule that matched (0-based index into the Job's rules).
    rule: int | None = None
    action: str | None = None
    #: Whether ``avoid-failed-nodes`` counts its node as one where it failed.
    node_failed: bool = False
    #: What the webhook recorded on the pod at its admission.
    applied: dict[str, Any] = field(default_factory=dict)
    #: A JobSet's pod: the run (``restart-attempt``) it belongs to.
    run: int | None = None
    #: The disruptor whose deletion of it the webhook marked a disruption.
    deleted_by: str | None = None
    disruption_count: DisruptionCount | None = None
    peer: PeerMark | None = None
    in_place: InPlace | None = None
    #: Its failure category (``webhook.policy.categories``), the signal that decided it and
    #: the hint: as the controller wrote it on the pod (``by`` "controller"), else as
    #: ``status`` classifies the pod itself with the built-in categories ("status").
    category: Category | None = None


@dataclass(frozen=True)
class Category:
    name: str
    signal: str
    hint: str
    by: str


@dataclass
class MemoryChange:
    container: str
    kind: str  # "request" or "limit"
    before: str | None
    after: str | None


@dataclass
class Delay:
    pod: str | None
    not_before: str
    seconds_left: int


@dataclass
class NextAttempt:
    """What a pod the Job creates now gets from the webhook."""

    job: str
    attempt: int | None
    attempts: int | None
    non_spot: bool | None
    memory: list[MemoryChange] = field(default_factory=list)
    avoided_nodes: list[str] = field(default_factory=list)
    avoided_by: str | None = None
    delay: Delay | None = None
    #: The warnings the pod's planner gives (what kubectl would show at its admission).
    changes: list[str] = field(default_factory=list)
    #: What ``attempt`` counts: a Job's attempts, or (a JobSet's pod) the set's runs.
    unit: str = "attempt"


@dataclass
class JobStory:
    name: str
    uid: str
    state: str
    counted: int
    ignored: int
    budgets: list[Budget] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    next: NextAttempt | None = None
    decision: Decision | None = None
    #: JobSet: which replicated Job it is; CronJob: when it was scheduled.
    role: str = ""
    notes: list[str] = field(default_factory=list)
    #: What the next disruption does, in words (``max-disruptions``, while it runs).
    next_disruption: list[str] = field(default_factory=list)


@dataclass
class EventLine:
    time: str
    type: str
    reason: str
    note: str
    count: int
    regarding: str


@dataclass
class Story:
    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str
    state: str
    explained: list[explain.Explanation | explain.Denial]
    explained_by: str
    budgets: list[Budget] = field(default_factory=list)
    jobs: list[JobStory] = field(default_factory=list)
    decision: Decision | None = None
    events: list[EventLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What could not be read (the story is shown without it).
    unread: list[str] = field(default_factory=list)
    #: A CronJob's Jobs not shown (older than the latest few).
    older_jobs: list[str] = field(default_factory=list)
    #: A JobSet's: what its next disruption does (its budget is the set's).
    next_disruption: list[str] = field(default_factory=list)
    #: What audited defaults would have done to each ended Job (``webhook.status.audit``).
    audit: list[audit_.AuditLine] = field(default_factory=list)


class Lookups:
    """What the next attempt's planner asks besides the Job and its pods; this one
    answers as the offline CLI does (no LimitRanges, Nodes unknown)."""

    core_api: Any = None
    #: What the story should say about these answers (a list the user may not read).
    notes: list[str]

    def __init__(self) -> None:
        self.notes = []

    def limit_ranges(self, namespace: str) -> LimitLookup:
        return LimitLookup(True)

    def placement(self, question: Placement) -> NodeAnswer:
        return NodeAnswer(False, reason="no Nodes are read here")
