"""What the replay of an audited workload needs of each of its failed attempts, kept in its
record (``webhook.cluster.record``, ``"tries"``) while the pods themselves come and go.

An audited workload (``retry-policy.dev/audit``: ``webhook.plan.audit``) ran without the
settings its defaults would have applied. When it ends, the controller judges its failed
attempts again, in order, as the Job controller would have under the audited rules
(``webhook.plan.replay``). The pods are long gone by then (a finished Job's TTL, PodGC, a
JobSet's restart), so the recorder keeps, per failed pod, what that judgement and the
savings read:

- what the Job controller matches rules on (``PodFailure``: each terminated container's
  exit code, init containers marked; every condition of the pod, in its order and with its
  status, the kubelet's own (Ready, Initialized, ...) included: ``matchOnPodConditions``
  matches a rule's type and status against each, whatever they are);
- when it finished, how long it ran and what it held meanwhile (``webhook.cluster.waste``:
  resource-seconds, memory in GiB-seconds);
- what tells which of our controller's conditions it would have carried under the audited
  plan (``webhook.plan.marks``): when it was made (``creationTimestamp``), when and why it
  was disrupted (``DisruptionTarget``'s ``lastTransitionTime`` and reason), and why the
  kubelet failed it (``status.reason``: ``DeadlineExceeded``, ``Evicted``); and its name,
  which the Job controller's FailJob message names and a JobSet's rules may match.

One entry is a short JSON list: ``[lineage, finished, seconds, exits, conditions, held,
run, facts]``, e.g. ``["",1795687200,60,[["main",42]],["Initialized","Ready=False",
"DisruptionTarget"],{"cpu":120},null,{"c":1795687140,"d":[1795687190,
"PreemptionByScheduler"],"n":"train-x7k2p"}]``: an init container's exit is ``[name,
code, 1]``, a condition ``Type`` when ``True`` and ``Type=Status`` otherwise (a condition
type is a qualified name: no ``=``); ``run`` is a JobSet's pod's run, the
``restart-attempt`` label its child Job was made with (``labelAndAnnotateObject`` in
jobset pkg/controllers/jobset_controller.go: the JobSet's replay judges each run's child
Jobs apart, ``webhook.kinds.jobset.replay``), else ``null``. An entry of six items (seven
with a run) was written before conditions were kept whole: it holds only the ``True`` ones
that are not the kubelet's (``complete`` is false), and none of the facts. At most
``MAX_TRIES`` are kept, the first ones: where an audited plan ends a workload early is
among its first failures; the record's counts say how many more there were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster import waste
from webhook.cluster.history import failure_cause, jobset_place, jobset_run, parse_time
from webhook.kube.failurepolicy import DISRUPTION_TARGET, ContainerExit, PodFailure
from webhook.kube.objects import items, mapping

MAX_TRIES = 24
#: The kubelet's pod lifecycle conditions (``generateAPIPodStatus``): an entry written
#: before conditions were kept whole has none of them.
LIFECYCLE = frozenset(
    {"PodScheduled", "Initialized", "Ready", "ContainersReady", "PodReadyToStartContainers"}
)


@dataclass(frozen=True)
class Try:
    """One failed attempt, as the replay reads it."""

    lineage: str
    finished: float | None
    seconds: float
    failure: PodFailure
    held: Mapping[str, float] = field(default_factory=dict)
    #: A JobSet's pod: the run its child Job belongs to; ``None`` for any other pod.
    run: int | None = None
    #: Whether ``failure`` holds every condition the pod had (see the module's doc).
    complete: bool = True
    #: When the pod was made, when ``DisruptionTarget=True`` came and its reason, the
    #: pod's ``status.reason`` and its name ("" when none).
    created: float | None = None
    disrupted_at: float | None = None
    disruption: str = ""
    reason: str = ""
    name: str = ""

    @property
    def started(self) -> float | None:
        return None if self.finished is None else self.finished - self.seconds

    @property
    def disrupted(self) -> bool:
        """``DisruptionTarget=True`` (one reset to ``False`` by the disruption controller,
        a disruption that never happened, is not)."""
        return (DISRUPTION_TARGET, "True") in self.failure.conditions

    @classmethod
    def of(cls, pod: Mapping[str, Any], lineage: str) -> Try:
        _, finished = failure_cause(pod)
        held = {k: round(v, 3) for k, v in waste.wasted(pod).items()}
        meta = mapping(pod.get("metadata"))
        status = mapping(pod.get("status"))
        run = jobset_run(meta) if jobset_place(meta) else None
        seconds = round(waste.run_seconds(pod), 3)
        target = next(
            (
                c
                for c in map(mapping, items(status.get("conditions")))
                if c.get("type") == DISRUPTION_TARGET and c.get("status") == "True"
            ),
            {},
        )
        return cls(
            lineage,
            finished,
            seconds,
            PodFailure.from_pod(pod),
            held,
            run,
            True,
            _seconds(parse_time(meta.get("creationTimestamp"))),
            _seconds(parse_time(target.get("lastTransitionTime"))),
            str(target.get("reason") or ""),
            str(status.get("reason") or ""),
            str(meta.get("name") or ""),
        )

    def to_json(self) -> list[Any]:
        exits = [
            [e.name, e.exit_code, 1] if e.init else [e.name, e.exit_code]
            for e in self.failure.exits
        ]
        finished = int(self.finished) if self.finished is not None else None
        conditions = [
            kind if status == "True" else f"{kind}={status}"
            for kind, status in self.failure.conditions
        ]
        facts: dict[str, Any] = {}
        if self.created is not None:
            facts["c"] = int(self.created)
        if self.disrupted_at is not None:
            facts["d"] = [int(self.disrupted_at), self.disruption]
        if self.reason:
            facts["r"] = self.reason
        if self.name:
            facts["n"] = self.name
        out = [self.lineage, finished, self.seconds, exits, conditions, dict(self.held)]
        return [*out, self.run, facts]

    @classmethod
    def from_json(cls, data: Any) -> Try | None:
        """The entry, or ``None`` when it cannot be read (then it is not replayed)."""
        if not isinstance(data, list) or len(data) not in (6, 7, 8):
            return None
        lineage, finished, seconds, exits, conditions, held, *rest = data
        run = rest[0] if rest else None
        if run is not None and not (_int(run) and run >= 0):
            return None
        if not isinstance(lineage, str) or not _number(seconds) or not isinstance(held, dict):
            return None
        if not (finished is None or _number(finished)):
            return None
        if not isinstance(exits, list) or not isinstance(conditions, list):
            return None
        read = []
        for item in exits:
            if not isinstance(item, list) or len(item) not in (2, 3):
                return None
            name, code, *init = item
            if not isinstance(name, str) or not _int(code):
                return None
            read.append(ContainerExit(name, code, bool(init and init[0])))
        complete = len(data) == 8
        kinds = tuple(_condition(c) if complete else (c, "True") for c in conditions if _str(c))
        facts = mapping(rest[1]) if complete else {}
        disrupted = facts.get("d")
        at, why = disrupted if isinstance(disrupted, list) and len(disrupted) == 2 else (None, "")
        return cls(
            lineage,
            float(finished) if finished is not None else None,
            float(seconds),
            PodFailure(tuple(read), kinds),
            {str(k): float(v) for k, v in held.items() if _number(v)},
            run,
            complete,
            float(facts["c"]) if _number(facts.get("c")) else None,
            float(at) if _number(at) else None,
            why if isinstance(why, str) else "",
            facts["r"] if isinstance(facts.get("r"), str) else "",
            facts["n"] if isinstance(facts.get("n"), str) else "",
        )


def _condition(text: str) -> tuple[str, str]:
    kind, equals, status = text.rpartition("=")
    return (kind, status) if equals else (text, "True")


def _seconds(when: float | None) -> float | None:
    return float(int(when)) if when is not None else None


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
