"""What the replay of an audited workload needs of each of its failed attempts, kept in its
record (``webhook.cluster.record``, ``"tries"``) while the pods themselves come and go.

An audited workload (``retry-policy.dev/audit``: ``webhook.plan.audit``) ran without the
settings its defaults would have applied. When it ends, the controller judges its failed
attempts again, in order, as the Job controller would have under the audited rules
(``webhook.plan.replay``). The pods are long gone by then (a finished Job's TTL, PodGC, a
JobSet's restart), so the recorder keeps, per failed pod, what that judgement and the
savings read:

- what the Job controller matches rules on (``PodFailure``: each terminated container's
  exit code, init containers marked; the pod's conditions that are ``True``, apart from
  the kubelet's own lifecycle conditions, which every failed pod has: a rule on one of
  those is a rule on every pod, or on none, and is judged as such);
- when it finished, how long it ran and what it held meanwhile (``webhook.cluster.waste``:
  resource-seconds, memory in GiB-seconds).

One entry is a short JSON list: ``[lineage, finished, seconds, exits, conditions, held]``,
e.g. ``["",1795687200,60,[["main",42]],["DisruptionTarget"],{"cpu":120}]`` (an init
container's exit is ``[name, code, 1]``); a JobSet's pod adds its run, the
``restart-attempt`` label its child Job was made with (``labelAndAnnotateObject`` in
jobset pkg/controllers/jobset_controller.go): the JobSet's replay judges each run's child
Jobs apart (``webhook.plan.jobsetreplay``). At most ``MAX_TRIES`` are kept, the first ones:
where an audited plan ends a workload early is among its first failures; the record's
counts say how many more there were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster import waste
from webhook.cluster.history import failure_cause, jobset_place, jobset_run
from webhook.kube.failurepolicy import ContainerExit, PodFailure

MAX_TRIES = 24
#: The kubelet's pod lifecycle conditions (``generateAPIPodStatus``): left out (see above).
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

    @property
    def started(self) -> float | None:
        return None if self.finished is None else self.finished - self.seconds

    @classmethod
    def of(cls, pod: Mapping[str, Any], lineage: str) -> Try:
        found = PodFailure.from_pod(pod)
        kept = tuple(
            (kind, status)
            for kind, status in found.conditions
            if status == "True" and kind not in LIFECYCLE
        )
        _, finished = failure_cause(pod)
        held = {k: round(v, 3) for k, v in waste.wasted(pod).items()}
        meta = pod.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        run = jobset_run(meta) if jobset_place(meta) else None
        seconds = round(waste.run_seconds(pod), 3)
        return cls(lineage, finished, seconds, PodFailure(found.exits, kept), held, run)

    def to_json(self) -> list[Any]:
        exits = [
            [e.name, e.exit_code, 1] if e.init else [e.name, e.exit_code]
            for e in self.failure.exits
        ]
        finished = int(self.finished) if self.finished is not None else None
        conditions = [kind for kind, _ in self.failure.conditions]
        out = [self.lineage, finished, self.seconds, exits, conditions, dict(self.held)]
        return out if self.run is None else [*out, self.run]

    @classmethod
    def from_json(cls, data: Any) -> Try | None:
        """The entry, or ``None`` when it cannot be read (then it is not replayed)."""
        if not isinstance(data, list) or len(data) not in (6, 7):
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
        kinds = tuple((str(c), "True") for c in conditions if isinstance(c, str))
        return cls(
            lineage,
            float(finished) if finished is not None else None,
            float(seconds),
            PodFailure(tuple(read), kinds),
            {str(k): float(v) for k, v in held.items() if _number(v)},
            run,
        )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
