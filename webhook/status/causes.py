"""Budgets per cause, as the webhook's controller counts them (``webhook.plan.causes``):
disruptions against ``max-disruptions``, PeerDisrupted marks, restarts in place."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.cluster.conditions import condition as pod_condition
from webhook.cluster.conditions import label_value
from webhook.cluster.deletions import REASON as DELETION_BY_DISRUPTOR
from webhook.cluster.record import Record
from webhook.kinds.story import Budget, DisruptionBudget
from webhook.kube import failurepolicy, podspec
from webhook.kube.jobcontroller import pod_from_template
from webhook.kube.objects import items, mapping
from webhook.kube.restartrules import restarts
from webhook.plan import causes as per_cause
from webhook.plan.causes import (
    MAX_DISRUPTIONS_LABEL,
    MAX_RESTARTS_LABEL,
    PEERS_LABEL,
    disruption_scope,
)
from webhook.policy.grammar import parse_count, parse_restart_budget
from webhook.policy.model import PREFIX
from webhook.status.explained import applied_record, job_specs
from webhook.status.model import Attempt, DisruptionCount, InPlace, PeerMark

#: What the webhook and its controller write in their conditions' messages (read back here;
#: the tests make them with the writers): ``DeletionMarker.mark``
#: (webhook/cluster/deletions.py), ``Disruptions.count`` and ``Disruptions.mark_peers``
#: (webhook/controller/disruptions.py).
_DISRUPTOR = re.compile(r"(?:forced )?deletion by (?P<user>.+?), a disruptor \(retry-policy")
_OVER = re.compile(r"disruption (?P<number>\d+)(?: of index \S+)?, over max-disruptions")
_PEER = re.compile(
    r"peer pod (?P<pod>\S+) was disrupted \((?P<cause>[^)]*)\); peer-disruptions (?P<how>\w+)"
)


@dataclass
class Causes:
    """What the controller counts a workload's disruptions against
    (``webhook.controller.disruptions``): the workload's record (a Job's own; a JobSet's
    for all its Jobs' pods) and ``max-disruptions``, per index or not."""

    subject: str
    record: Record
    max_disruptions: int | None
    per_index: bool


def causes_of(obj: Mapping[str, Any], subject: str) -> Causes:
    """``obj``'s budget as its pods carry it: the template label the controller reads
    (``max-disruptions``), else the applied record's; per index as the controller scopes
    the pods the Job creates (``disruption_scope``: an Indexed Job's with
    ``backoffLimitPerIndex`` carry ``job-index-failure-count``)."""
    limit = None
    for spec in job_specs(obj):
        template = mapping(spec.get("template"))
        limit = label_value(template, MAX_DISRUPTIONS_LABEL, parse_count)
        if limit is not None:
            break
    recorded = applied_record(obj).get("maxDisruptions")
    if limit is None and isinstance(recorded, int) and not isinstance(recorded, bool):
        limit = recorded
    per_index = False
    if obj.get("kind") == "Job":
        indexed = mapping(obj.get("spec")).get("completionMode") == "Indexed"
        per_index = disruption_scope(pod_from_template(obj, 0 if indexed else None)) is not None
    return Causes(subject, Record.of(obj) or Record(), limit, per_index)


def disruption_budgets(causes: Causes, running: bool) -> list[Budget]:
    """Disruptions counted against ``max-disruptions``, as the controller counts them: the
    workload's (``Record.disruptions_of``), or each index's."""
    limit = causes.max_disruptions
    if limit is None:
        return []
    if not causes.per_index:
        return [_disruption_budget(causes, limit, causes.record.disruptions_of(), None, running)]
    counts = sorted(
        (int(key), used) for key, used in causes.record.disruptions.items() if key.isdigit()
    )
    if counts:
        return [_disruption_budget(causes, limit, used, i, running) for i, used in counts]
    text = f"max-disruptions {limit} per index: no disruption counted yet"
    return [
        Budget(
            causes.subject,
            PREFIX + "max-disruptions",
            limit,
            0,
            text,
            DisruptionBudget(0, 0, None, per_cause.disruption(1, limit) if running else None),
        )
    ]


def _disruption_budget(
    causes: Causes, limit: int, used: int, index: int | None, running: bool
) -> Budget:
    free, counted = min(used, limit), max(0, used - limit)
    where = f", index {index}" if index is not None else ""
    text = f"max-disruptions {limit}{where}: {used} disruption{'' if used == 1 else 's'}"
    text += f" counted: {free} free, {counted} counted against the retry budget"
    if used < limit:
        text += f" ({limit - used} free left)"
    after = per_cause.disruption(used + 1, limit) if running else None
    return Budget(
        causes.subject,
        PREFIX + "max-disruptions",
        limit,
        used,
        text,
        DisruptionBudget(free, counted, index, after),
    )


def next_disruption(causes: Causes, budgets: Sequence[Budget]) -> list[str]:
    """What the next disruption does, as ``Disruptions.count`` decides it: free while the
    count is under ``max-disruptions``; from N + 1 on, its pod is marked and counted."""
    lines = []
    for budget in budgets:
        facts = budget.disruptions
        if facts is None or facts.next is None or budget.limit is None:
            continue
        number = budget.used + 1
        where = f"of index {facts.index}: " if facts.index is not None else ""
        if facts.index is None and causes.per_index:
            where = "of any index: "
        if facts.next == "free":
            lines.append(
                f"{where}free: disruption {number} of the {budget.limit} max-disruptions "
                "allows (the Ignore rule on DisruptionTarget takes its pod)"
            )
        else:
            lines.append(
                f"{where}counted: disruption {number}, over max-disruptions {budget.limit}: "
                f"the controller marks its pod {failurepolicy.DISRUPTION_BUDGET_EXHAUSTED} "
                "and it counts against the retry budget"
            )
    limit = causes.max_disruptions
    listed = [b for b in budgets if b.disruptions is not None and b.disruptions.index is not None]
    if lines and limit and listed:
        lines.append(f"of an index not listed: free (each index's first {limit} are)")
    return lines


def in_place_budgets(attempts: Sequence[Attempt], job: str) -> list[Budget]:
    """Each pod still running against ``max-in-place-restarts`` (its own budget)."""
    budgets = []
    for a in attempts:
        facts = a.in_place
        if facts is None or facts.limit is None or a.phase not in ("Running", "Pending"):
            continue  # (a pod ended, or being deleted, restarts in place no more)
        if facts.replaced:
            continue  # (nor one replaced: its deadline ends it)
        text = f"max-in-place-restarts {facts.limit}, pod {a.pod}: {_in_place_used(facts)}"
        field_ = PREFIX + "max-in-place-restarts"
        budgets.append(Budget(f"Pod {a.pod}", field_, facts.limit, facts.restarts, text))
    return budgets


def _late(lowered: bool | None) -> str | None:
    return None if lowered is None else "lowered" if lowered else "other"


def _in_place_used(facts: InPlace) -> str:
    used = f"{facts.restarts} restart{'' if facts.restarts == 1 else 's'} in place"
    if facts.limit is None:
        return used
    if facts.replaced or per_cause.replaced(facts.restarts, facts.limit):
        return f"{used}: the budget is used, the controller replaces the pod"
    left = facts.limit - facts.restarts
    return f"{used}, {left} left before the controller replaces the pod"


def budget_facts(
    attempt: Attempt, pod: Mapping[str, Any], rules: Sequence[Any], causes: Causes
) -> None:
    """What the budgets per cause say of one pod: a disruptor's deletion the webhook
    marked, how the controller counted its disruption, its PeerDisrupted mark, and its
    restarts in place; each from the conditions, labels and record the webhook and its
    controller write."""
    meta = mapping(pod.get("metadata"))
    target = pod_condition(pod, failurepolicy.DISRUPTION_TARGET)
    if target is not None and target.get("reason") == DELETION_BY_DISRUPTOR:
        found = _DISRUPTOR.match(str(target.get("message") or ""))
        attempt.deleted_by = found.group("user") if found else "a disruptor"
    limit = label_value(pod, MAX_DISRUPTIONS_LABEL, parse_count)
    if target is not None and limit is not None:
        uid = meta.get("uid")
        seen = causes.record.disrupted(uid) if isinstance(uid, str) and uid else None
        exhausted = pod_condition(pod, failurepolicy.DISRUPTION_BUDGET_EXHAUSTED)
        over = _OVER.match(str(mapping(exhausted).get("message") or ""))
        attempt.disruption_count = DisruptionCount(
            {"free": "free", "over": "counted"}.get(seen or ""),
            limit,
            int(over.group("number")) if over else None,
            exhausted is not None,
            _late(causes.record.late_lowered(str(uid or ""))),
        )
    peer = pod_condition(pod, failurepolicy.PEER_DISRUPTED)
    if peer is not None:
        said = _PEER.match(str(peer.get("message") or ""))
        rule = mapping(rules[attempt.rule]) if attempt.rule is not None else {}
        on = {mapping(c).get("type") for c in items(rule.get("onPodConditions"))}
        attempt.peer = PeerMark(
            said.group("pod") if said else None,
            said.group("cause") if said else None,
            label_value(pod, PEERS_LABEL, str),
            failurepolicy.PEER_DISRUPTED in on,
        )
    budget = label_value(pod, MAX_RESTARTS_LABEL, parse_restart_budget)
    used = restarts(pod)
    replaced = pod_condition(pod, failurepolicy.IN_PLACE_BUDGET_EXHAUSTED) is not None
    spec = mapping(pod.get("spec"))
    in_place = any(items(c.get("restartPolicyRules")) for c in podspec.containers(spec))
    if budget is not None or replaced or (used and in_place):
        attempt.in_place = InPlace(used, budget, replaced)
