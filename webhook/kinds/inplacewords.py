"""Restarts in place, in words: what each regular container does with each exit code,
read from the final object as the kubelet reads it (``webhook.kube.restartrules``), what
ends those restarts, and the kubelet's back-off before each one (``in-place-exit-codes``,
``webhook.plan.inplace``).

Everything here is read from the rules the object carries (the user's own rules come
first and win), never from the annotations. A restart in place is not a pod failure: the
Job controller judges a pod only once it is terminal, and counts container restarts
against backoffLimit only under restartPolicy OnFailure (``pastBackoffLimitOnFailure``).
Only activeDeadlineSeconds ends them, or ``max-in-place-restarts``. A disrupted pod never
restarts in place: it is being deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from webhook.kube.restartrules import (
    ALL_CODES,
    BACKOFF_MAX_SECONDS,
    BACKOFF_START_SECONDS,
    EXIT_CODES,
    YOUR_RULE,
    ContainerRules,
    Decision,
    PodRestarts,
    restart_delay,
)
from webhook.plan.explained import CodeGroup, ContainerCodes, InPlaceTable
from webhook.plan.inplace import Deadline, InPlaceEnds
from webhook.plan.simulation import Event, InPlaceRestart, InPlaceSummary
from webhook.plan.words import count_of, join_words, ranges

SUCCESS = (
    "exit code 0 is success: the container never completes, nor does its pod; only "
    "activeDeadlineSeconds ends it"
)
BACKOFF_TEXT = (
    f"the kubelet's back-off before each restart in place: none before a container's "
    f"first, then {BACKOFF_START_SECONDS} s, doubling, at most "
    f"{BACKOFF_MAX_SECONDS} s (a node's kubelet may set a lower cap); it starts "
    "over in a new pod, and after 10 minutes of running. A disrupted pod (preemption, "
    "eviction, drain) never restarts in place: it is being deleted"
)


# --- the rules, in words ------------------------------------------------------------------


def _why(decision: Decision) -> str:
    return rule_words(decision.rule, decision.origin)


def rule_words(rule: int | None, origin: str) -> str:
    """Which of a container's restart rules restarted it: "your restart rule 1",
    "restart rule 2, added by retry-policy", or "its restartPolicy Always"."""
    if rule is None:
        return origin
    if origin == YOUR_RULE:
        return f"your restart rule {rule}"
    return f"restart rule {rule}, {origin}"


# --- what ends them ---------------------------------------------------------------------


def ends_text(bound: InPlaceEnds) -> str:
    """What ends restarts in place, in words."""
    if bound.ends_nothing:
        allowed = " (guardRails.allowUnboundedInPlace allows it)"
        return (
            f"What ends restarts in place: nothing: {bound.ends_nothing}"
            f"{allowed if bound.unbounded_allowed else ''}. No retry budget does: a "
            "restart in place is not a pod failure"
        )
    ends = [bound.budget] if bound.budget else []
    if bound.whole is not None:
        ends.append(
            f"{bound.whole}: the {bound.owner} fails (DeadlineExceeded) once it "
            f"has run that long, however many restarts there were{bound.then}"
        )
    if bound.pod is not None:
        ends.append(
            f"{bound.pod}: each pod fails (DeadlineExceeded) once it has run "
            "that long, and that failure is judged like any other"
        )
    if bound.outer:
        ends.append(bound.outer)
    if not ends:
        ends.append(
            "nothing: no activeDeadlineSeconds is set"
            + (
                " (guardRails.allowUnboundedInPlace allows it)"
                if bound.unbounded_allowed
                else f"; set {bound.missing}"
            )
        )
    tail = "" if bound.budget else ". No retry budget does: a restart in place is not a pod failure"
    return "What ends restarts in place: " + "; ".join(ends) + tail


def ends_short(bound: InPlaceEnds) -> str:
    """What ends restarts in place, briefly."""
    if bound.budget:
        return "max-in-place-restarts ends them, a pod at a time"
    if bound.ends_nothing:
        return "nothing ends them (a JobSet rule restarts without counting)"
    names = [f"{d.field} ({d.seconds} s)" for d in (bound.whole, bound.pod) if d is not None]
    if bound.outer:
        names.append("the TrainJob's activeDeadlineSeconds")
    if not names:
        return "nothing ends them (no activeDeadlineSeconds)"
    return "only " + join_words(names) + " ends them"


# --- each container's exit codes --------------------------------------------------------

#: What a pod that failed with one container's exit code does: (outcome, words), e.g.
#: ("FailJob", "the Job fails at once (FailJob, rule 1)").
Judge = Callable[[str, int], tuple[str, str]]


def table(restarts: PodRestarts, judge: Judge, bound: InPlaceEnds) -> InPlaceTable:
    """Every regular container's exit codes 1-255 (and 0 when a rule restarts on it),
    grouped by what they do; then each native sidecar's that has rules of its own."""
    return InPlaceTable(
        [
            ContainerCodes(c.name, _groups(c, judge), c.sidecar)
            for c in (*restarts.containers, *restarts.sidecar_rules)
        ],
        ends_text(bound),
        bound.bounded,
        BACKOFF_TEXT,
    )


def _groups(rules: ContainerRules, judge: Judge) -> list[CodeGroup]:
    found: dict[tuple[str, str], list[int]] = {}
    for code in ALL_CODES:
        decision = rules.decide(code)
        if decision is None and not code:
            continue  # a success, as usual
        if decision is None:
            key = judge(rules.name, code)
        elif decision.whole_pod:
            key = ("restart-pod", f"the whole pod restarts in place ({_why(decision)})")
        else:
            key = ("restart", f"restarts in place ({_why(decision)})")
        found.setdefault(key, []).append(code)
    restarting = [k for k in found if k[0].startswith("restart")]
    others = sorted((k for k in found if k not in restarting), key=lambda k: len(found[k]))
    # The last group is "any other exit code": the largest, when all of them restart.
    ordered = restarting + others if others else sorted(restarting, key=lambda k: len(found[k]))
    groups = []
    for key in ordered:
        text = f"{_codes(found[key], key is ordered[-1], len(ordered))}: {key[1]}"
        if found[key][0] == 0 and not rules.sidecar:
            text += f"; {SUCCESS}"
        groups.append(CodeGroup(key[0], found[key], text))
    return groups


def _codes(codes: list[int], last: bool, groups: int) -> str:
    """The codes of one group; the last, which holds every code the others do not, is
    "any other exit code"."""
    if groups == 1:
        return "any exit code"
    if last:
        return "any other exit code"
    shown = ranges(codes)
    plural = len(codes) > 1
    return ("exit codes " if plural else "exit code ") + join_words(shown, "and")


# --- --simulate: restarts in place --------------------------------------------------------


@dataclass
class Backoff:
    """The kubelet's back-off through a simulation: restarts per container of the running
    pod, and what all restarts in place added up to."""

    restarts: dict[str, int] = field(default_factory=dict)
    #: Events that were restarts in place, restarts, and seconds of back-off, in all.
    events: int = 0
    total: int = 0
    waited: int = 0
    #: Seconds of back-off in the running pod, and the most in any one pod.
    pod_waited: int = 0
    most_in_a_pod: int = 0
    #: Restarts in place of the running pod in all (a whole pod's restart is one), as
    #: max-in-place-restarts counts them (``webhook.kube.restartrules.restarts``).
    pod_restarts: int = 0

    def restart(self, container: str, code: int, decision: Decision) -> InPlaceRestart:
        number = self.restarts.get(container, 0) + 1
        self.restarts[container] = number
        delay = restart_delay(number)
        self.total += 1
        self.pod_restarts += 1
        self.waited += delay
        self.pod_waited += delay
        self.most_in_a_pod = max(self.most_in_a_pod, self.pod_waited)
        return InPlaceRestart(
            container, code, decision.whole_pod, decision.rule, decision.origin, number, delay
        )

    def new_pod(self) -> None:
        """A pod failed: the next one starts with no back-off (a new pod UID)."""
        self.restarts = {}
        self.pod_waited = 0
        self.pod_restarts = 0


#: (the restarts in place an event is, or why it cannot be simulated).
Restarted = tuple[tuple[InPlaceRestart, ...], str]


def restarted(restarts: PodRestarts | None, backoff: Backoff, event: Event, main: str) -> Restarted:
    """The restarts in place ``event`` is (none: the pod fails with it), counted in
    ``backoff``; or, as the second value, why the event cannot be: a container that
    stops for good while another restarts in place does not fail the pod yet, and a
    success no rule restarts is no failure.

    A disruption is never a restart in place (the pod is being deleted), nor is a pod
    whose init container failed. The exits of native sidecars beside others are their
    shutdown with the pod, not the application's; a sidecar's exit alone restarts the
    sidecar, or the pod by a RestartAllContainers rule of its own, and never fails it."""
    if restarts is None or event.disruption:
        return (), ""
    exits = [(n, c) for n, c in event.exits(main) if n not in restarts.sidecars]
    if not exits:
        decided = [(n, c, restarts.decide_sidecar(n, c)) for n, c in event.exits(main)]
        return _restart(backoff, decided), ""
    if any(name in restarts.init for name, _ in exits):
        return (), ""
    decided = [(name, code, restarts.decide(name, code)) for name, code in exits]
    # A container that exited 0 and does not restart has completed: no failure of its.
    decided = [d for d in decided if d[1] or d[2] is not None]
    if not decided:
        return (), _success(event)
    whole = [d for d in decided if d[2] is not None and d[2].whole_pod]
    chosen = whole[:1] or [d for d in decided if d[2] is not None]
    if not chosen:
        return (), ""
    if not whole and len(chosen) < len(decided):
        return (), _mixed(event, decided)
    return _restart(backoff, chosen), ""


def _restart(
    backoff: Backoff, chosen: Sequence[tuple[str, int, Decision | None]]
) -> tuple[InPlaceRestart, ...]:
    """The restarts in place of one event: the whole pod's (by the first container whose
    rule says so), or each container's."""
    whole = [d for d in chosen if d[2] is not None and d[2].whole_pod]
    backoff.events += 1
    return tuple(backoff.restart(n, c, d) for n, c, d in whole[:1] or chosen if d is not None)


def _success(event: Event) -> str:
    return (
        f"--simulate: event {event.token!r}: exit code 0 is success and no restart rule "
        "restarts on it: the pod does not fail; give failures (exit codes 1-255), or 0 "
        "for a container whose restart rule matches it"
    )


def _mixed(event: Event, decided: Sequence[tuple[str, int, Decision | None]]) -> str:
    again = [f"{n}:{c}" for n, c, d in decided if d is not None]
    stop = [f"{n}:{c}" for n, c, d in decided if d is None]
    return (
        f"--simulate: event {event.token!r}: {join_words(again, 'and')} restart in place, "
        f"so the pod does not fail with {join_words(stop, 'and')} yet (it fails when every "
        "container has stopped); give them as separate events, e.g. "
        f"{','.join(again)},{'+'.join(stop)}"
    )


def restart_text(done: Sequence[InPlaceRestart], going_on: bool = True) -> str:
    """What the kubelet does, for the simulation's step."""
    text = "; ".join(_one(r) for r in done)
    return text + (": not a pod failure, not counted; the same pod goes on" if going_on else "")


def _one(r: InPlaceRestart) -> str:
    when = f"after {r.delay_seconds} s back-off" if r.delay_seconds else "at once"
    why = rule_words(r.rule, r.origin)
    if r.whole_pod:
        return (
            f"the whole pod restarts in place {when}, init containers first (restart "
            f"number {r.restart} by container {r.container} in this pod; by {why})"
        )
    return (
        f"container {r.container} restarts in place {when} (its restart number "
        f"{r.restart} in this pod; by {why})"
    )


def example_text(done: Sequence[InPlaceRestart]) -> str:
    """What one such exit does, for the examples."""
    first = done[0]
    why = rule_words(first.rule, first.origin)
    who = "the whole pod restarts in place" if first.whole_pod else "restarts in place"
    return f"{who} ({why}): not a pod failure, not counted"


def summary(backoff: Backoff, bound: InPlaceEnds, owner: str) -> InPlaceSummary | None:
    """What the restarts in place added up to, for the simulation's ending."""
    if not backoff.total:
        return None
    text = (
        f"In place: {count_of(backoff.total, 'restart')}, {backoff.waited} s of back-off "
        "in all; they used none of the retry budget (they are not pod failures), and "
        f"{ends_short(bound)}."
    )
    if bound.budget:
        text = (
            f"In place: {count_of(backoff.total, 'restart')}, {backoff.waited} s of back-off "
            "in all; they are not pod failures, but a pod replaced at max-in-place-restarts "
            "is, and counts."
        )
    late = _past(bound.whole, backoff.waited, f"the {owner}") or _past(
        bound.pod, backoff.most_in_a_pod, "its pod"
    )
    return InPlaceSummary(backoff.total, backoff.waited, text + late)


def _past(deadline: Deadline | None, waited: int, what: str) -> str:
    if deadline is None or waited < deadline.seconds:
        return ""
    return (
        f" The back-off alone ({waited} s) reaches {deadline.field} ({deadline.seconds} s): "
        f"the deadline ends {what} before the last of them."
    )


def first_codes(restarts: PodRestarts, containers: Iterable[str]) -> list[tuple[str, int]]:
    """For the examples: the first exit code that restarts each container in place."""
    found = []
    for name in containers:
        rules = restarts.of(name)
        code = next((c for c in EXIT_CODES if rules and rules.decide(c)), None)
        if code is not None:
            found.append((name, code))
    return found
