"""Which of our controller's conditions each failed attempt of an audited workload would have
carried under the audited plan, worked out from what its record keeps
(``webhook.cluster.tries``), for the replay (``webhook.plan.replay``,
``webhook.kinds.jobset.replay``).

An audited workload ran without the labels that set our controller to work on its pods
(``webhook.plan.causes``): its pods never got ``DisruptionBudgetExhausted``,
``PeerDisrupted`` or ``InPlaceBudgetExhausted``, and its containers never restarted in place
on the audited ``in-place-exit-codes``. The audited rules on those conditions come before
every other rule (``failurepolicy.merge``), so a replay without them would judge the
attempts as no enforced plan would. Here each attempt is given what the controller, and the
kubelet, would have done, as they do it:

- **in place** (``in-place-exit-codes``; the kubelet's container restart rules,
  ``webhook.kube.restartrules``): an attempt that failed because a regular container
  exited with a code its audited rules restart would have been a restart in place, not a
  failure (not disrupted, nor failed by the kubelet past its deadline:
  ``DeadlineExceeded``). Restarts are counted per pod, in all (``restarts``: one for a
  ``RestartAllContainers`` restart, one per container else); the failed attempts of one
  lineage in the order they finished stand for one pod, restarted, until one is a real
  failure. With ``max-in-place-restarts N`` (``webhook.controller.restarts``) the restart
  that makes N is the pod's end: a failure marked ``InPlaceBudgetExhausted``, and the
  next attempt a new pod. Attempts of a lineage that ran side by side (a Job's pods in
  parallel) cannot be told apart into pods: with such a budget that is not known.
- **disruptions** (``max-disruptions N``, ``webhook.controller.disruptions``): the
  disrupted attempts (``DisruptionTarget=True``), in the order they were disrupted, per
  scope (an index with a per-index budget, else the Job; the whole JobSet): the first N
  are free, each later one is marked ``DisruptionBudgetExhausted``; one the kubelet or
  PodGC failed in the same update (``TerminationByKubelet``, ``DeletionByPodGC``) gets no
  condition but lowers the Job's backoffLimit by one, the same count (nothing, for a
  JobSet's pod, a per-index budget or a backoffLimit of 0). Two disruptions in the same
  second across the budget's edge: which one was over it is not known.
- **peers** (``peer-disruptions``): an attempt of the same Job (a JobSet's same run)
  that was made before another was disrupted and failed after it is marked
  ``PeerDisrupted``; one made or failed within ``PEER_MARGIN`` seconds of the disruption
  may or may not have been (the mark is written within a moment; a pod failed just before
  may be judged first): its judgement is not known where that decides it.

Where the audited plan asks the controller for what the real one asked too (the same
label), the conditions the real controller wrote are the record's, kept as they are.
What the record cannot tell is said, never guessed: ``maybe`` conditions, which the
replay weighs (``Judged``), and reasons the marks cannot be worked out at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.tries import Try
from webhook.kube import failurepolicy as fp
from webhook.kube.failurepolicy import (
    DISRUPTION_BUDGET_EXHAUSTED,
    IN_PLACE_BUDGET_EXHAUSTED,
    PEER_DISRUPTED,
    PodFailure,
)
from webhook.kube.objects import items, mapping
from webhook.kube.restartrules import PodRestarts, pod_restarts
from webhook.plan.audit import AuditedPart
from webhook.plan.causes import CauseBudgets

#: Seconds around a disruption within which a peer's mark may or may not have landed.
PEER_MARGIN = 2.0
#: ``DisruptionTarget`` reasons sent with the terminal phase, in the same update: the
#: controller cannot mark such a pod, and counts it another way (``settle_late``).
LATE = ("TerminationByKubelet", "DeletionByPodGC")
#: The settings whose marks an audit record of revision 1 did not keep the labels for.
MARKED_SETTINGS = ("max-disruptions", "peer-disruptions", "max-in-place-restarts")
IN_PLACE_SETTINGS = ("in-place-exit-codes",)


@dataclass(frozen=True)
class Causes:
    """What sets our controller (and the kubelet's in-place restarts) to work on the pods
    of one pod template: its labels' budgets and its containers' restart rules."""

    budgets: CauseBudgets = field(default_factory=CauseBudgets)
    restarts: PodRestarts | None = None
    #: The regular containers' restartPolicy and rules, to compare two templates by.
    rules_key: tuple[Any, ...] = ()

    @classmethod
    def of(cls, template: Mapping[str, Any]) -> Causes:
        pod_spec = mapping(template.get("spec"))
        key = tuple(
            (c.get("name"), c.get("restartPolicy"), repr(items(c.get("restartPolicyRules"))))
            for c in map(mapping, items(pod_spec.get("containers")))
        )
        return cls(CauseBudgets.of(template), pod_restarts(pod_spec, {}, None), key)


@dataclass(frozen=True)
class Place:
    """Where one attempt stands for the controller: its part's causes under the audited
    plan and the real one, its peers (``peers``: a key), the scope its disruptions count
    in, the pod it may have restarted as (``chain``), and whether a disruption over the
    budget that failed unmarked lowers its Job's backoffLimit (``limit``: the audited
    one; ``None``: nothing is lowered)."""

    audited: Causes
    real: Causes
    peers: Any = ()
    scope: str = ""
    chain: Any = ()
    limit: int | None = None


@dataclass(frozen=True)
class Judged:
    """One attempt under the audited plan: its failure as the Job controller would have
    judged it (``None``: a restart in place, no failure), and the conditions of ours the
    record cannot tell it would have carried."""

    attempt: Try
    failure: PodFailure | None
    maybe: tuple[str, ...] = ()

    def failures(self) -> list[PodFailure]:
        """Every failure it may have been: with each subset of ``maybe``."""
        if self.failure is None:
            return []
        out = [self.failure]
        for kind in self.maybe:
            out += [PodFailure(f.exits, (*f.conditions, (kind, "True"))) for f in out]
        return out


def part_causes(
    part: AuditedPart | None, real_template: Mapping[str, Any], settings: Mapping[str, str]
) -> tuple[Causes, Causes] | str:
    """The causes of a part's pods under the audited plan and the real one (the stored
    template's), or why the audit record does not say (revision 1, without the template,
    for settings that need it)."""
    real = Causes.of(real_template)
    if part is None:
        return real, real
    if part.template is None:
        if any(name in settings for name in (*MARKED_SETTINGS, *IN_PLACE_SETTINGS)):
            return (
                "the audit record, of an earlier version, does not keep what the defaults "
                "would have set our controller and the kubelet to do to its pods"
            )
        return real, real
    return Causes.of(part.template), real


def unchanged(tries: Sequence[Try]) -> list[Judged]:
    """The attempts as they ran: each judged by its own failure."""
    return [Judged(t, t.failure) for t in tries]


def mark(tries: Sequence[Try], places: Sequence[Place]) -> tuple[list[Judged], str]:
    """Each attempt of ``tries`` (in the order they finished) under the audited plan, with
    its place; and why that cannot be worked out ("" when it can)."""
    same = {
        IN_PLACE_BUDGET_EXHAUSTED: [
            p.audited.budgets.max_in_place_restarts == p.real.budgets.max_in_place_restarts
            and p.audited.rules_key == p.real.rules_key
            for p in places
        ],
        DISRUPTION_BUDGET_EXHAUSTED: [
            p.audited.budgets.max_disruptions == p.real.budgets.max_disruptions for p in places
        ],
        PEER_DISRUPTED: [
            p.audited.budgets.peer_disruptions == p.real.budgets.peer_disruptions for p in places
        ],
    }
    # The conditions the real controller wrote where it was asked as the audited plan asks.
    kept = [
        tuple(c for c in t.failure.conditions if c[0] not in same or same[c[0]][n])
        for n, t in enumerate(tries)
    ]
    failing, why = _in_place(tries, places, [not s for s in same[IN_PLACE_BUDGET_EXHAUSTED]])
    if why:
        return [], why
    added: list[list[str]] = [[] for _ in tries]
    maybe: list[list[str]] = [[] for _ in tries]
    for n, replaced in enumerate(failing):
        if replaced == "replaced":
            added[n].append(IN_PLACE_BUDGET_EXHAUSTED)
    why = _disruptions(tries, places, same[DISRUPTION_BUDGET_EXHAUSTED], added, maybe)
    if why:
        return [], why
    why = _peers(tries, places, failing, same[PEER_DISRUPTED], added, maybe)
    if why:
        return [], why
    judged = []
    for n, attempt in enumerate(tries):
        if failing[n] == "restart":
            judged.append(Judged(attempt, None))
            continue
        conditions = (*kept[n], *((kind, "True") for kind in added[n]))
        failure = PodFailure(attempt.failure.exits, conditions)
        judged.append(Judged(attempt, failure, tuple(maybe[n])))
    return judged, ""


def _in_place(
    tries: Sequence[Try], places: Sequence[Place], changed: Sequence[bool]
) -> tuple[list[str], str]:
    """Per attempt: "failed", "restart" (in place, no failure) or "replaced" (the restart
    that used the pod's max-in-place-restarts: a failure, marked); and why that is not
    known."""
    out = ["failed"] * len(tries)
    pods: dict[Any, tuple[int, float | None]] = {}  # chain -> (restarts, last finished)
    for n, (attempt, place) in enumerate(zip(tries, places, strict=True)):
        if not changed[n]:
            continue
        audited, limit = place.audited.restarts, place.audited.budgets.max_in_place_restarts
        if limit is not None and place.real.restarts is not None:
            return out, (
                "its pods restarted in place by their own rules, which the record does not "
                f"count: when max-in-place-restarts {limit} would have replaced them is not "
                "known"
            )
        inc = _restarts(attempt, audited)
        before, last = pods.get(place.chain, (0, None))
        started = attempt.started
        beside = last is not None and (started is None or started < last)
        if limit is not None and beside and (inc or before):
            where = f"index {attempt.lineage}" if attempt.lineage else "the Job"
            return out, (
                f"attempts of {where} ran side by side, so which pod would have restarted in "
                f"place, and when max-in-place-restarts {limit} would have replaced it, is "
                "not known"
            )
        count = before + inc if inc else 0
        if inc and limit is not None and count >= limit:
            out[n], count = "replaced", 0
        elif inc:
            out[n] = "restart"
        pods[place.chain] = (count, attempt.finished)
    return out, ""


def _restarts(attempt: Try, rules: PodRestarts | None) -> int:
    """The restarts in place the attempt's end would have been under ``rules`` (0: a
    failure): each regular container whose exit they restart, or one for the pod."""
    if rules is None or attempt.disrupted or attempt.reason == "DeadlineExceeded":
        return 0
    decisions = [rules.decide(e.name, e.exit_code) for e in attempt.failure.exits if not e.init]
    restarting = [d for d in decisions if d is not None]
    if any(d.whole_pod for d in restarting):
        return 1
    return len(restarting)


def _disruptions(
    tries: Sequence[Try],
    places: Sequence[Place],
    same: Sequence[bool],
    added: list[list[str]],
    maybe: list[list[str]],
) -> str:
    """``max-disruptions``: the disruptions over each scope's budget marked (``added``,
    ``maybe``); why that is not known."""
    scopes: dict[str, list[int]] = {}
    for n, (attempt, place) in enumerate(zip(tries, places, strict=True)):
        if same[n] or place.audited.budgets.max_disruptions is None or not attempt.disrupted:
            continue
        if attempt.disrupted_at is None:
            return f"when failed attempt {n + 1} was disrupted is not in the record"
        scopes.setdefault(place.scope, []).append(n)
    lowered = 0  # (a Job's: only a Job's pods lower its backoffLimit)
    for members in scopes.values():
        members.sort(key=lambda n: (tries[n].disrupted_at, n))
        for number, n in enumerate(members, 1):
            place, attempt = places[n], tries[n]
            budget = place.audited.budgets.max_disruptions or 0
            at = attempt.disrupted_at
            tied = [k for k, m in enumerate(members, 1) if tries[m].disrupted_at == at]
            edge = min(tied) <= budget < max(tied)
            if number <= budget and not edge:
                continue
            if attempt.disruption in LATE:
                if place.limit is None or place.limit - lowered <= 0:
                    continue
                lowered += 1
            (maybe if edge else added)[n].append(DISRUPTION_BUDGET_EXHAUSTED)
    return ""


def _peers(
    tries: Sequence[Try],
    places: Sequence[Place],
    failing: Sequence[str],
    same: Sequence[bool],
    added: list[list[str]],
    maybe: list[list[str]],
) -> str:
    """``peer-disruptions``: the attempts that ran beside a disrupted one of their group
    marked (``added``, ``maybe``); why that is not known."""
    disrupted = [
        n
        for n, (t, p) in enumerate(zip(tries, places, strict=True))
        if t.disrupted and p.audited.budgets.peer_disruptions is not None
    ]
    for n, (attempt, place) in enumerate(zip(tries, places, strict=True)):
        if same[n] or place.audited.budgets.peer_disruptions is None:
            continue
        if attempt.disrupted or failing[n] == "restart":
            continue
        seen = {"yes": False, "maybe": False}
        for d in disrupted:
            if d == n or places[d].peers != place.peers:
                continue
            at = tries[d].disrupted_at
            made = attempt.created if attempt.created is not None else attempt.started
            if at is None or made is None or attempt.finished is None:
                return f"whether failed attempt {n + 1} ran beside a disrupted one is not known"
            if attempt.finished <= at - PEER_MARGIN or made >= at + PEER_MARGIN:
                continue
            sure = made <= at - PEER_MARGIN and attempt.finished >= at + PEER_MARGIN
            seen["yes" if sure else "maybe"] = True
        if seen["yes"]:
            added[n].append(PEER_DISRUPTED)
        elif seen["maybe"]:
            maybe[n].append(PEER_DISRUPTED)
    return ""


def settled(rules: Sequence[Any], judged: Judged) -> tuple[fp.Match | None, bool]:
    """The Job controller's match for a judged attempt, and whether it is known: every
    failure it may have been (``Judged.failures``) meets the same action."""
    failures = judged.failures()
    matches = [fp.evaluate(rules, f) for f in failures]
    actions = {m.action if m is not None else None for m in matches}
    return matches[0], len(actions) == 1
