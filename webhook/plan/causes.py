"""Budgets per cause: ``max-disruptions``, ``max-in-place-restarts``, ``peer-disruptions``:
the rules admission writes, the controller enforces (``webhook.controller.disruptions``,
``webhook.controller.restarts``), ``explain``'s simulation predicts and ``status`` reports,
each stated once here (``disruption``, ``replaced``, ``disruption_scope``).

``ignore-disruptions`` and ``in-place-exit-codes`` take failures out of a Job's retry
budget with no limit (an ``Ignore`` rule has none, and a restart in place is no pod
failure at all), and a disrupted pod's peers fail a workload through their own exit
codes. Each of these keys puts a limit, or a rule, back by a pod condition the webhook's
controller adds (``webhook.controller.disruptions``, ``webhook.controller.restarts``) and
a podFailurePolicy rule on it, placed before every other rule (``failurepolicy.merge``):
no pod has such a condition unless its workload asked for it, and a rule of the user's
placed first would decide the pod the condition was added to.

- ``max-disruptions: N`` (with ``ignore-disruptions``): ``Count`` on
  ``retry-policy.dev/DisruptionBudgetExhausted``, which the controller adds to a disrupted
  pod (``DisruptionTarget=True``) of a workload that has used its N; the Ignore rule on
  DisruptionTarget takes the first N. Per index for an Indexed Job with
  ``backoffLimitPerIndex``, per JobSet for a JobSet's pods.
- ``max-in-place-restarts: N`` (with ``in-place-exit-codes``): ``Count`` on
  ``retry-policy.dev/InPlaceBudgetExhausted``, which the controller adds to a pod whose
  containers restarted in place N times in all, before ending it by its own
  ``activeDeadlineSeconds``: the pod fails, is replaced and counted, so restarts in place
  are bounded by N x (retries + 1) without a deadline of the user's.
- ``peer-disruptions: ignore|count``: ``Ignore`` (or ``Count``) on
  ``retry-policy.dev/PeerDisrupted``, which the controller adds to the running peers of a
  disrupted pod (the same Job; a JobSet's same run) while that pod terminates.

The controller finds the pods to act on by labels on the pod template (``labels``: a pod
carries its template's), named as the keys, valued in their grammar: it watches by label
selector, and the chart sends the webhook the DELETE of a pod only when its workload
ignores disruptions (a matchCondition on the pod's label
``retry-policy.dev/ignore-disruptions``: ``rpw.cel.ignoresDisruptions`` in the chart's
_helpers.tpl; a DELETE carries the pod as ``oldObject``).
Labels, not annotations: annotations of ours would send every pod's CREATE to the pod
webhook, and these pods need nothing there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook.cluster.record import lineage_key
from webhook.kube import failurepolicy as fp
from webhook.kube import podspec
from webhook.kube.objects import mapping
from webhook.kube.wellknown import COMPLETION_INDEX, INDEX_FAILURE_COUNT, JOBSET_UID
from webhook.plan import verdicts
from webhook.plan.outcome import Outcome
from webhook.policy.grammar import (
    BadValue,
    parse_count,
    parse_peer_disruptions,
    parse_restart_budget,
    parse_start_deadline,
)
from webhook.policy.model import PREFIX, Policy, format_value

#: The template labels, by key: what the controller and the chart select pods by.
LABEL_KEYS = (
    "ignore-disruptions",
    "max-disruptions",
    "max-in-place-restarts",
    "peer-disruptions",
    "categories",
    "max-free-failures",
    "start-deadline",
)
IGNORE_LABEL = PREFIX + "ignore-disruptions"
MAX_DISRUPTIONS_LABEL = PREFIX + "max-disruptions"
MAX_RESTARTS_LABEL = PREFIX + "max-in-place-restarts"
PEERS_LABEL = PREFIX + "peer-disruptions"


@dataclass(frozen=True)
class CauseBudgets:
    """The budgets per cause the pods of one template carry (its labels, as the controller
    reads them; ``None``: none)."""

    max_disruptions: int | None = None
    max_in_place_restarts: int | None = None
    peer_disruptions: str | None = None
    #: ``max-free-failures`` and ``start-deadline`` (seconds): ``webhook.plan.verdicts``.
    max_free_failures: int | None = None
    start_deadline: int | None = None

    @classmethod
    def of(cls, template: Mapping[str, Any]) -> CauseBudgets:
        """What a pod template's labels say (a label that does not parse says nothing)."""
        labels = mapping(mapping(template.get("metadata")).get("labels"))

        def read(key: str, parse: Callable[[str], Any]) -> Any:
            raw = labels.get(PREFIX + key)
            try:
                return parse(raw) if isinstance(raw, str) else None
            except BadValue:
                return None

        return cls(
            read("max-disruptions", parse_count),
            read("max-in-place-restarts", parse_restart_budget),
            read("peer-disruptions", parse_peer_disruptions),
            read("max-free-failures", parse_count),
            read("start-deadline", parse_start_deadline),
        )


# --- the rules the controller enforces ---------------------------------------------------


def disruption(number: int, limit: int) -> Literal["free", "counted"]:
    """What disruption ``number`` (1-based, in its scope: ``disruption_scope``) of a
    workload with ``max-disruptions: limit`` is: the first ``limit`` are free (the Ignore
    rule on DisruptionTarget takes their pods), each one after is counted (the
    controller marks its pod ``DisruptionBudgetExhausted``, which a Count rule takes)."""
    return "free" if number <= limit else "counted"


def replaced(restarts: int, limit: int | None) -> bool:
    """Whether a pod that restarted in place ``restarts`` times in all has used its
    ``max-in-place-restarts: limit`` (``None``: no such budget): the controller then
    marks it ``InPlaceBudgetExhausted`` and ends it by its deadline, and its replacement
    is counted."""
    return limit is not None and restarts >= limit


def disruption_scope(pod: Mapping[str, Any]) -> str | None:
    """The lineage a disruption counts against: the index, for an Indexed Job's pod with a
    budget per index (only then does it carry ``job-index-failure-count``); ``None``: the
    whole workload (a Job, a JobSet)."""
    meta = mapping(pod.get("metadata"))
    annotations = mapping(meta.get("annotations"))
    labels = mapping(meta.get("labels"))
    if labels.get(JOBSET_UID):
        return None
    if INDEX_FAILURE_COUNT in annotations and COMPLETION_INDEX in annotations:
        return lineage_key(meta)
    return None


# --- what admission writes for them ------------------------------------------------------


def rules(policy: Policy) -> list[tuple[dict[str, Any], str]]:
    """The rules on our conditions ``policy`` adds, each with the setting that adds it, in
    their order: the replaced pod first (neither fail-non-retriable nor
    ignore-disruptions may decide it), then the disrupted pod over its budget, then peers."""
    ours: list[tuple[dict[str, Any], str]] = []
    if policy.max_in_place_restarts is not None and policy.in_place_exit_codes:
        ours.append((fp.condition_rule(fp.IN_PLACE_BUDGET_EXHAUSTED), "max-in-place-restarts"))
    if policy.max_disruptions is not None and policy.ignore_disruptions:
        ours.append((fp.condition_rule(fp.DISRUPTION_BUDGET_EXHAUSTED), "max-disruptions"))
    peers = policy.peer_disruptions
    if peers is not None:
        action = "Ignore" if peers == "ignore" else "Count"
        ours.append((fp.condition_rule(fp.PEER_DISRUPTED, action), "peer-disruptions"))
    return ours + verdicts.rules(policy)


#: (the key, the one it needs, why): a budget over what another key takes out.
NEEDS = (
    ("max-disruptions", "ignore-disruptions", "every disruption counts without it"),
    ("max-in-place-restarts", "in-place-exit-codes", "nothing restarts in place without it"),
    ("max-free-failures", "free-categories", "no failure is free without it"),
)


def check(policy: Policy, out: Outcome) -> Policy:
    """A budget needs the key whose failures it counts: denied without it when annotated,
    skipped with a warning when an admin's default (``Outcome.conflict``). Called again
    after the checks that may turn that key off here."""
    settings = policy.settings
    if all(settings[name].value is None for name, _, _ in NEEDS):
        return policy  # (no budget asked for: the usual case)
    for name, needed, why in NEEDS:
        if policy.asks(name) and not policy.asks(needed):
            off = "not set" if not policy.explicit(needed) else "not applied here"
            policy = out.refuse(policy, name, f"needs {needed}, {off}: {why}", f"needs-{needed}")
    return policy


def labels(policy: Policy) -> dict[str, str]:
    """The template labels ``policy`` asks for (``LABEL_KEYS``), in annotation grammar."""
    wanted: dict[str, str] = {}
    if policy.ignore_disruptions:
        wanted["ignore-disruptions"] = "true"
        if policy.max_disruptions is not None:
            wanted["max-disruptions"] = str(policy.max_disruptions)
    if policy.max_in_place_restarts is not None and policy.in_place_exit_codes:
        wanted["max-in-place-restarts"] = str(policy.max_in_place_restarts)
    if policy.peer_disruptions is not None:
        wanted["peer-disruptions"] = format_value("peer-disruptions", policy.peer_disruptions)
    wanted.update(verdicts.labels(policy))
    return wanted


def apply_labels(template: dict[str, Any], policy: Policy) -> bool:
    """Label a pod template for the controller and the chart (bookkeeping: said by the
    rules it goes with, not in a warning of its own); whether it changed."""
    wanted = labels(policy)
    if not wanted:
        return False
    meta = template.get("metadata")
    if not isinstance(meta, dict):
        meta = template["metadata"] = {}
    changed = [podspec.set_label(meta, PREFIX + k, v) for k, v in wanted.items()]
    return any(changed)
