"""What a test case can assert about a simulation: its outcome, and the facts of each pod.

A simulation (``explain --simulate``) is read here as pods: each pod the events went
through, with the attempt (and a JobSet's run) it belonged to, what it was admitted with
(``PodFacts``), and the events it went through; then the pod that runs next, when the
workload is still running. An ``attempts`` entry of a case picks a pod by ``attempt``,
``pod`` or ``run`` (the first pod that has every one given: an attempt's first pod) and
asserts facts of it.

Every fact is one row of ``FACTS``: its key, what it means, how it is read from a pod and
how the expected value is written. A new fact (say, a retry delay the simulation learns
to tell) is a field of ``PodFacts`` or ``Step`` and one row here; the suite grammar, the
unknown-key hints and the docs' table follow from the row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.kube import quantity
from webhook.plan.simulation import PodFacts, Simulation, Step


class BadExpectation(ValueError):
    """An expected value written in a way the fact does not accept (the text says what it
    accepts)."""


@dataclass(frozen=True)
class Pod:
    """One pod of a simulation: the ``pod``-th made (1-based), of ``attempt`` (and
    ``run``), admitted with ``facts``, going through ``steps`` (none for the pod that
    runs next)."""

    pod: int
    attempt: int
    run: int | None
    facts: PodFacts | None
    steps: tuple[Step, ...] = ()

    @property
    def failure(self) -> Step | None:
        """The event the pod failed with (``None``: it did not fail)."""
        last = self.steps[-1] if self.steps else None
        return last if last is not None and (last.replaced or not last.in_place) else None

    def position(self) -> str:
        run = f", run {self.run}" if self.run is not None else ""
        return f"pod {self.pod}, attempt {self.attempt}{run}"


def pods(sim: Simulation) -> list[Pod]:
    """The pods of a simulation, in the order they ran, the one that runs next last."""
    found: list[Pod] = []
    for step in sim.steps:
        if found and found[-1].pod == step.pod and found[-1].failure is None:
            last = found[-1]
            found[-1] = Pod(last.pod, last.attempt, last.run, last.facts, (*last.steps, step))
        else:
            found.append(Pod(step.pod, step.attempt, step.run, step.facts, (step,)))
    if sim.next is not None:
        following = sim.next
        found.append(Pod(following.pod, following.attempt, following.run, following.facts))
    return found


# --- the facts of a pod -------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """One assertable fact of a pod: ``read`` gives the actual value (``None``: the
    simulation does not know it for this pod), ``parse`` the expected value as written,
    ``same`` compares them, ``show`` writes a value as a case would."""

    key: str
    about: str
    read: Callable[[Pod], Any]
    parse: Callable[[Any], Any]
    same: Callable[[Any, Any], bool] = lambda expected, actual: expected == actual
    show: Callable[[Any], str] = lambda value: (
        str(value).lower() if isinstance(value, bool) else str(value)
    )


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadExpectation(f"{value!r} is not true or false")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadExpectation(f"{value!r} is not a whole number >= 0")
    return value


def _action(value: Any) -> str:
    accepted = ("FailJob", "FailIndex", "Ignore", "Count", "none")
    if value not in accepted:
        raise BadExpectation(f"{value!r} is not one of " + ", ".join(accepted))
    return str(value)


def _of_facts(name: str) -> Callable[[Pod], Any]:
    return lambda pod: getattr(pod.facts, name) if pod.facts is not None else None


# Memory: {container: "REQUEST/LIMIT"}, each a quantity or "-" (not set); one quantity
# stands for both. Compared by value, so 2048Mi is 2Gi.
MemoryPair = tuple[quantity.Quantity | None, quantity.Quantity | None]


def _quantity(text: str) -> quantity.Quantity | None:
    if text.strip() == "-":
        return None
    try:
        return quantity.parse(text.strip())
    except quantity.QuantityError:
        raise BadExpectation(
            f"{text!r} is not a memory quantity (e.g. 2Gi) or - (not set)"
        ) from None


def _memory(value: Any) -> dict[str, MemoryPair]:
    if not isinstance(value, dict) or not value:
        raise BadExpectation(
            f"{value!r} is not a mapping of container name to REQUEST/LIMIT (e.g. "
            "trainer: 2Gi/4Gi, or trainer: 4Gi for both)"
        )
    parsed = {}
    for container, text in value.items():
        if not isinstance(text, (str, int)) or isinstance(text, bool):
            raise BadExpectation(f"{container}: {text!r} is not REQUEST/LIMIT (e.g. 2Gi/4Gi)")
        request, _, limit = str(text).partition("/")
        try:
            parsed[str(container)] = (_quantity(request), _quantity(limit or request))
        except BadExpectation as err:
            raise BadExpectation(f"{container}: {err}") from None
    return parsed


def _read_memory(pod: Pod) -> dict[str, MemoryPair] | None:
    if pod.facts is None:
        return None
    return {m.container: (_quantity(m.request), _quantity(m.limit)) for m in pod.facts.memory}


def _same_memory(expected: dict[str, MemoryPair], actual: dict[str, MemoryPair]) -> bool:
    def value(q: quantity.Quantity | None) -> Any:
        return q.value if q is not None else None

    return all(
        name in actual and tuple(map(value, pair)) == tuple(map(value, actual[name]))
        for name, pair in expected.items()
    )


def _show_memory(value: dict[str, MemoryPair]) -> str:
    def text(q: quantity.Quantity | None) -> str:
        return str(q) if q is not None else "-"

    shown = ", ".join(f"{name} {text(r)}/{text(lim)}" for name, (r, lim) in value.items())
    return shown or "no container sets memory"


FACTS: dict[str, Fact] = {
    fact.key: fact
    for fact in (
        Fact(
            "nonSpot",
            "the pod runs on non-spot nodes only (non-spot-attempts)",
            _of_facts("non_spot"),
            _bool,
        ),
        Fact(
            "memory",
            "memory request/limit of the containers named (oom-memory-factor raises it after "
            "OOM kills); e.g. {trainer: 2Gi/4Gi}, one quantity for both, - for not set",
            _read_memory,
            _memory,
            _same_memory,
            _show_memory,
        ),
        Fact(
            "avoidedNodes",
            "nodes where earlier pods failed that the pod keeps off (avoid-failed-nodes; "
            "each failure taken to be on another node)",
            _of_facts("avoided_nodes"),
            _count,
        ),
        Fact(
            "delaySeconds",
            "seconds the pod is held back after the failure before it (retry-delay; the "
            "Job controller's own back-off counts from the same failure)",
            _of_facts("delay_seconds"),
            _count,
        ),
        Fact(
            "restartsInPlace",
            "restarts in place of the pod's containers (in-place-exit-codes)",
            lambda pod: sum(len(step.in_place) for step in pod.steps),
            _count,
        ),
        Fact(
            "inPlaceDelaySeconds",
            "seconds of the kubelet's back-off before those restarts, in all",
            lambda pod: sum(r.delay_seconds for step in pod.steps for r in step.in_place),
            _count,
        ),
        Fact(
            "replaced",
            "the controller replaced the pod once its restarts in place reached "
            "max-in-place-restarts (its failure is then judged like any other)",
            lambda pod: bool(pod.steps and pod.steps[-1].replaced),
            _bool,
        ),
        Fact(
            "counted",
            "the pod's failure counted against the budget",
            lambda pod: pod.failure.counted if pod.failure is not None else None,
            _bool,
        ),
        Fact(
            "action",
            "the action of the rule the pod's failure matched (FailJob, FailIndex, Ignore, "
            "Count), or none",
            lambda pod: (pod.failure.action or "none") if pod.failure is not None else None,
            _action,
        ),
    )
}
#: How an ``attempts`` entry picks its pod.
SELECTORS = ("attempt", "pod", "run")


def select(found: Sequence[Pod], wanted: Mapping[str, int]) -> Pod | None:
    """The first pod that has every selector given."""
    for pod in found:
        if all(getattr(pod, key) == value for key, value in wanted.items()):
            return pod
    return None


# --- the outcome --------------------------------------------------------------------------

SUCCEEDED, FAILED = "Succeeded", "Failed"


@dataclass(frozen=True)
class Outcome:
    """How a simulation ends, as a test states it: ``Failed`` with the reason the
    workload's controller sets, or ``Succeeded`` when the failures run out first (the pod
    after them succeeds); at which pod, attempt and run."""

    state: str
    reason: str | None
    message: str
    pod: int
    attempt: int
    run: int | None

    def __str__(self) -> str:
        reason = f" ({self.reason})" if self.reason else ""
        run = f", run {self.run}" if self.run is not None else ""
        return (
            f"{self.state}{reason} at attempt {self.attempt} (pod {self.pod}{run}): {self.message}"
        )


def outcome(sim: Simulation) -> Outcome:
    """Running after the last event means the next pod (or the one going on) succeeds;
    an index that failed (IndexFailed) fails the Job with FailedIndexes once the other
    indexes are done."""
    found = pods(sim)
    end = sim.ending
    if end.state == "Running":
        last = found[-1] if found else Pod(1, 1, None, None)
        return Outcome(SUCCEEDED, None, end.message, last.pod, last.attempt, last.run)
    last = found[-1]
    return Outcome(FAILED, end.reason, end.message, last.pod, last.attempt, last.run)


OUTCOME_KEYS = ("state", "reason", "attempt", "pod", "run", "message")
