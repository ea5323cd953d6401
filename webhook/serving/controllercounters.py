"""The controller's counters (``ControllerMetrics`` in ``webhook.serving.metrics``): the
budgets per cause, the failure verdicts, waste and the audit, and the label values each
may take (bounded: a metric's series are fixed sets, namespaces, and the categories the
cluster config names)."""

from __future__ import annotations

from typing import Any

PREFIX = "retry_webhook_"


#: The conditions the controller adds (``webhook.kube.failurepolicy.OUR_CONDITIONS``), and
#: what became of each.
CONDITIONS = (
    "retry-policy.dev/DisruptionBudgetExhausted",
    "retry-policy.dev/InPlaceBudgetExhausted",
    "retry-policy.dev/PeerDisrupted",
    "retry-policy.dev/FreeBudgetExhausted",
)
#: added, late, missed: a condition's writes; unmarked: a peer's mark set back to False (it
#: was disrupted itself); taken_back: an in-place mark set back to False (its deadline was
#: refused): ``webhook.controller.peers``, ``webhook.controller.restarts``.
CONDITION_RESULTS = ("added", "late", "missed", "unmarked", "taken_back")
#: The conditions metric's one label for every failure category's condition
#: (``webhook.controller.verdicts.CATEGORY``): their names are the config's to choose.
CATEGORY = "category"
#: What a failure's rules made of it (``webhook.controller.verdicts.VERDICTS``).
VERDICTS = ("counted", "free", "failed")
#: Why a disruption over max-disruptions whose pod failed unmarked is not counted
#: (``webhook.controller.budgetstate.UNCOVERED``).
UNCOVERED_REASONS = ("jobset", "per_index", "backoff_limit_zero", "multikueue")


def wasted_counter(registry: Any) -> Any:
    from prometheus_client import Counter

    return Counter(
        PREFIX + "wasted_resource_seconds",
        "What failed attempts of workloads with a retry plan held, for as long as they ran "
        "(the pod's effective requests times startTime to its containers' last finishedAt), "
        "by the workload's namespace, cause (the failure's category: OOMKilled, DeviceFault, "
        "NodeFailure, Preempted, ImagePull, ConfigError, Unschedulable, StartTimeout, "
        "AppError, or one of the config's) and resource: cpu in core-seconds, memory in "
        "GiB-seconds, extended resources (nvidia.com/gpu) in device-seconds. Each failed pod "
        "counted once.",
        ["namespace", "cause", "resource"],
        registry=registry,
    )


#: ``retry_webhook_audited_workloads_total``'s ``differed``.
AUDIT_DIFFERED = ("true", "false", "unknown")


def audit_counters(registry: Any) -> tuple[Any, Any]:
    from prometheus_client import Counter

    ended = Counter(
        PREFIX + "audited_workloads",
        "Workloads admitted with audited defaults (rollout: audit) that ended, each counted "
        "once, by namespace and whether the defaults would have differed: true (ended it "
        "earlier, or retried longer), false, unknown (not replayable: restartPolicy "
        "OnFailure, or failures never recorded).",
        ["namespace", "differed"],
        registry=registry,
    )
    saved = Counter(
        PREFIX + "audit_saved_resource_seconds",
        "What the audited defaults would have saved, had they been enforced: the "
        "requests times run time of the failed attempts they would not have run, by "
        "namespace and resource (cpu in core-seconds, memory in GiB-seconds, extended "
        "resources in device-seconds).",
        ["namespace", "resource"],
        registry=registry,
    )
    return ended, saved


def budget_counters(registry: Any) -> tuple[Any, Any, Any, Any]:
    from prometheus_client import Counter

    conditions = Counter(
        PREFIX + "controller_conditions_total",
        "Pod conditions the controller added for budgets per cause and failure categories, "
        "by condition (DisruptionBudgetExhausted, InPlaceBudgetExhausted, PeerDisrupted, "
        "FreeBudgetExhausted; category for every category's) and result: "
        "added (before the pod failed), late (on a pod already Failed: the Job controller "
        "may have judged it without), missed (the Job controller had judged it: not added), "
        "unmarked (a marked peer disrupted itself: its mark set back to False), taken_back "
        "(an in-place mark set back to False: the pod's deadline was refused).",
        ["condition", "result"],
        registry=registry,
    )
    disruptions = Counter(
        PREFIX + "controller_disruptions_total",
        "Disruptions counted against max-disruptions: result=free (within the budget), "
        "over (past it: the pod counts against the retry budget).",
        ["result"],
        registry=registry,
    )
    lowered = Counter(
        PREFIX + "controller_backoff_limit_lowered_total",
        "Disruptions over max-disruptions whose pod had failed before it could be marked, "
        "counted by lowering the Job's spec.backoffLimit by one.",
        registry=registry,
    )
    uncovered = Counter(
        PREFIX + "controller_disruptions_uncovered_total",
        "Disruptions over max-disruptions whose pod had failed before it could be marked "
        "and that could not be counted, by reason: jobset (a JobSet's pod), per_index "
        "(backoffLimitPerIndex), backoff_limit_zero (nothing left to lower), multikueue (a "
        "MultiKueue worker's copy: its spec is the manager's).",
        ["reason"],
        registry=registry,
    )
    return conditions, disruptions, lowered, uncovered


def failures_counter(registry: Any) -> Any:
    from prometheus_client import Counter

    return Counter(
        PREFIX + "failures",
        "Failed pods of workloads with a retry plan, classified by the controller, each "
        "counted once: by namespace, category (OOMKilled, DeviceFault, NodeFailure, "
        "Preempted, ImagePull, ConfigError, Unschedulable, StartTimeout, AppError, or one of "
        "the config's categories) and verdict, what the Job's rules made of the pod with "
        "its category: counted (against the retry budget), free (an Ignore rule: "
        "free-categories) or failed (FailJob, FailIndex: fail-categories).",
        ["namespace", "category", "verdict"],
        registry=registry,
    )
