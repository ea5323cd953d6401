"""The state of one workload's disruption budget as the leader keeps it between writes
(``webhook.controller.disruptions``): its record as last read or written, the
disruptions counted since, the pods over the budget that failed unmarked (``Late``), and
what its Job's spec says of them; and what the reconcilers report (``Metrics``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.conditions import pod_name
from webhook.cluster.events import Regarding
from webhook.cluster.record import Record
from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import MULTIKUEUE_ORIGIN


class Metrics:
    """What the reconcilers report (``webhook.serving.metrics.ControllerMetrics``)."""

    def condition(self, kind: str, result: str) -> None:
        pass

    def disruption(self, result: str) -> None:
        pass

    def lowered(self) -> None:
        pass

    def uncovered(self, reason: str) -> None:
        pass

    def peers_unmarked(self, count: int) -> None:
        pass


@dataclass
class BudgetState:
    """A workload's record as this controller last read or wrote it, and the disruptions
    it counted since (``pending``, until written)."""

    kind: str  # "job" or "jobset"
    regarding: Regarding
    version: str
    record: Record
    pending: list[tuple[Mapping[str, Any], bool]] = field(default_factory=list)
    #: Pods over the budget that failed unmarked, to write (``Late``).
    late: list[Late] = field(default_factory=list)
    #: What a Job's spec says of them (a JobSet's state has none): its rules,
    #: ``backoffLimit`` and whether it has ``backoffLimitPerIndex``.
    rules: list[Any] = field(default_factory=list)
    limit: int | None = None
    per_index: bool = False
    #: A MultiKueue worker's copy of a manager's Job: its spec is the manager's to decide.
    copy: bool = False

    @classmethod
    def read(
        cls, kind: str, regarding: Regarding, version: str, record: Record, obj: Mapping[str, Any]
    ) -> BudgetState:
        """The state of a workload as read (``WorkloadStates``): a Job's spec taken too."""
        state = cls(kind, regarding, version, record)
        if kind == "job":
            state.facts(obj)
        return state

    def facts(self, obj: Mapping[str, Any]) -> None:
        """Take the Job's spec as read or written."""
        labels = mapping(mapping(obj.get("metadata")).get("labels"))
        self.copy = MULTIKUEUE_ORIGIN in labels
        spec = mapping(obj.get("spec"))
        self.rules = items(mapping(spec.get("podFailurePolicy")).get("rules"))
        limit = spec.get("backoffLimit")
        self.limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
        self.per_index = spec.get("backoffLimitPerIndex") is not None


@dataclass(frozen=True)
class Late:
    """A pod over the budget that failed unmarked, and how it counts: ``lower`` (the Job's
    backoffLimit, by one), else not by us: ``counted`` (the Job's rules count it),
    ``succeeded`` (no failure), or uncovered (``UNCOVERED``)."""

    uid: str
    name: str
    how: str


#: Why a pod over the budget that failed unmarked is not counted (the metric's reasons).
UNCOVERED = {
    "jobset": "a JobSet's retry budget cannot be lowered",
    "per_index": "a per-index budget (backoffLimitPerIndex) cannot be lowered",
    "backoff_limit_zero": "the Job's backoffLimit is 0 already",
    # a worker's copy rewritten strands the manager's Job (kueue issue #13046)
    "multikueue": "a MultiKueue worker's copy of a Job keeps the manager's spec",
}


def budget_key(regarding: Regarding) -> tuple[str, str]:
    return (regarding.namespace, regarding.uid)


def unwritten(state: BudgetState) -> str:
    """What a record write that failed would have written, for the log and the Event."""
    ref = state.regarding
    pods = ", ".join(pod_name(pod) for pod, _ in state.pending[:5])
    more = f" and {len(state.pending) - 5} more" if len(state.pending) > 5 else ""
    return (
        f"the disruption count on {ref.kind} {ref.namespace}/{ref.name} "
        f"({len(state.pending)} disruptions: pods {pods}{more})"
    )
