"""A ``--simulate`` run as values: the events it walks (their grammar, ``parse_events``),
and what each simulator returns (``Step``, ``Ending``, ``Simulation``); each kind's
simulator (``kinds/<kind>/simulate.py``) builds them, explain renders them, and
``retry-webhook test`` asserts them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from webhook.kube import failurepolicy
from webhook.kube.failurepolicy import ContainerExit, PodFailure
from webhook.plan.failureaware import ContainerMemory
from webhook.policy import categories as cats
from webhook.policy.categories import condition_type

MAX_EVENTS = 1000

SIGTERM, SIGKILL = 143, 137


class ExplainError(ValueError):
    """Input explain cannot use (a bad ``--simulate`` event, a manifest whose metadata or
    spec is not a mapping); the text says what is accepted."""


# --- --simulate: the event grammar -------------------------------------------------

_CONTAINER = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_PART = re.compile(
    rf"(?:(?P<container>{_CONTAINER}):)?(?P<what>[0-9]{{1,3}}|oom)|(?P<flag>disruption|peer)"
    rf"|oom:(?P<oomed>{_CONTAINER})|(?P<category>[A-Z][-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9]?)"
)
ACCEPTED_EVENTS = (
    "accepted: an exit code 0-255 (e.g. 143; 0 where a restart rule restarts on it), "
    "container:code (e.g. main:1), "
    "oom (an OOM kill, exit code 137), container:oom or oom:container, "
    "disruption (preemption, eviction, drain), "
    "peer (a pod that fails because a peer was disrupted: exit code 1 unless given), "
    "a failure category the controller writes on the pod (e.g. DeviceFault, ImagePull: "
    "exit code 143 for Preempted, NodeFailure, DeviceFault, 137 for OOMKilled, none for a "
    "pod that never started, else 1, unless given), "
    "several in one pod joined by + (e.g. 143+proxy:137, disruption+main:137, "
    "disruption+NodeFailure), events separated by commas"
)
#: What a category alone stops the main container with: none for a pod that never
#: started (``webhook.controller.startdeadline``), SIGTERM for one evicted or lost with its
#: node or device, SIGKILL for an OOM kill, else an application's error.
CATEGORY_EXITS: dict[str, int | None] = {
    "ImagePull": None,
    "ConfigError": None,
    "Unschedulable": None,
    "StartTimeout": None,
    "Preempted": SIGTERM,
    "NodeFailure": SIGTERM,
    "DeviceFault": SIGTERM,
    "OOMKilled": SIGKILL,
}
#: What a pod our controller marked carries (``webhook.kube.failurepolicy.OUR_CONDITIONS``).
PEER_EXIT = 1


@dataclass(frozen=True)
class Event:
    """One pod failure to simulate: a container's exit code, or a disruption, and the
    exit codes of other containers of the same pod (``143+proxy:137``).

    A disruption is what preemption, eviction and drains do to a pod: the condition
    ``DisruptionTarget=True``, and the main container stopped by SIGTERM (exit code 143)
    unless the event says how it stopped (``disruption+main:137``: SIGKILL after the
    grace period).
    """

    token: str
    exit_code: int
    container: str | None = None
    disruption: bool = False
    #: The other containers of the pod that exited non-zero: (name, code).
    others: tuple[tuple[str, int], ...] = ()
    #: The first exit is only implied by a disruption (the main container's SIGTERM).
    implied: bool = False
    #: The containers the OOM killer stopped ("" for the main one): ``oom`` events.
    ooms: tuple[str, ...] = ()
    #: A running peer of a disrupted pod (``peer-disruptions`` marks it PeerDisrupted).
    peer: bool = False
    #: Replaced by the controller after its restarts in place (``max-in-place-restarts``).
    replaced: bool = False
    #: The failure category the controller writes on the pod (``webhook.plan.verdicts``).
    category: str | None = None

    def oom_killed(self, main: str) -> list[str]:
        return [name or main for name in self.ooms]

    def named(self) -> list[str]:
        """The containers the event names (unnamed, an exit is the main container's)."""
        first = [self.container] if self.container is not None else []
        return first + [name for name, _ in self.others]

    def exits(self, main: str) -> list[tuple[str, int]]:
        """(container, exit code) of every container the event stops (none, for a pod
        that never started: a start deadline's category alone)."""
        if self.implied and any(name == main for name, _ in self.others):
            return list(self.others)
        if self.exit_code < 0:
            return list(self.others)
        return [(self.container or main, self.exit_code), *self.others]

    def failure(self, main: str, init: Iterable[str] = (), extra: Iterable[str] = ()) -> PodFailure:
        """The failed pod as the Job controller sees it; ``init`` names the pod's init
        containers (their statuses are read after the regular containers'); ``extra``, the
        conditions our controller added (``max-disruptions``: past the budget)."""
        init = set(init)
        exits = tuple(ContainerExit(n, code, n in init) for n, code in self.exits(main))
        kinds = [failurepolicy.DISRUPTION_TARGET] if self.disruption else []
        if self.peer:
            kinds.append(failurepolicy.PEER_DISRUPTED)
        if self.replaced:
            kinds.append(failurepolicy.IN_PLACE_BUDGET_EXHAUSTED)
        if self.category is not None:
            kinds.append(condition_type(self.category))
        kinds.extend(extra)
        return PodFailure(exits, tuple((kind, "True") for kind in kinds))

    def succeeded(self, main: str) -> bool:
        """Every container the event stops exited 0: no failure, unless a restart rule
        restarts on success (``kinds.inplacewords.restarted``)."""
        if self.category is not None:
            return False
        return not self.disruption and all(code == 0 for _, code in self.exits(main))

    def describe(self, main: str) -> str:
        if self.category is not None:
            stopped = ", ".join(f"{n} exits {code}" for n, code in self.exits(main))
            disrupted = "disrupted, " if self.disruption else ""
            return f"pod fails: {self.category} ({disrupted}{stopped or 'never started'})"
        if self.disruption:
            stopped = ", ".join(f"{n} exits {code}" for n, code in self.exits(main))
            return f"pod disrupted (preemption, eviction, drain; {stopped})"
        if self.peer:
            stopped = ", ".join(f"{n} exits {code}" for n, code in self.exits(main))
            return f"a peer of a disrupted pod fails ({stopped})"
        return ", ".join(f"{_code_name(code)} in container {n}" for n, code in self.exits(main))


def _code_name(code: int) -> str:
    known = {
        0: "success",
        1: "application error",
        SIGKILL: "OOM kill or SIGKILL",
        SIGTERM: "SIGTERM",
    }
    return f"exit code {code}" + (f" ({known[code]})" if code in known else "")


def parse_events(text: str, categories: Iterable[str] | None = None) -> list[Event]:
    """Parse ``143,disruption,main:1,143+proxy:137``; a bad token is named with its position.
    ``categories``: the failure categories there are (the built-in ones and the config's;
    ``None``: the built-in ones), of which a category event must name one."""
    known = tuple(categories) if categories is not None else cats.BUILTIN
    events = _parse_events(text)
    for n, event in enumerate(events, 1):
        if event.category is not None and event.category not in known:
            raise ExplainError(
                f"--simulate: event {n} {event.token!r} names no category; the categories "
                f"are {', '.join(known)}; {ACCEPTED_EVENTS}"
            )
    return events


def _parse_events(text: str) -> list[Event]:
    tokens = [token.strip() for token in text.split(",")]
    if not text.strip():
        raise ExplainError(f"--simulate: no events given; {ACCEPTED_EVENTS}")
    if len(tokens) > MAX_EVENTS:
        raise ExplainError(f"--simulate: {len(tokens)} events; at most {MAX_EVENTS}")
    return [
        _parse_event(token, f"--simulate: event {n} {token!r}") for n, token in enumerate(tokens, 1)
    ]


def _parse_event(token: str, where: str) -> Event:
    disruption = peer = False
    exits: list[tuple[str | None, int]] = []
    ooms: list[str] = []
    category: str | None = None
    for part in token.split("+"):
        match = _PART.fullmatch(part)
        if match is None:
            raise ExplainError(f"{where} is not an event; {ACCEPTED_EVENTS}")
        if match.group("category") is not None:
            if category is not None:
                raise ExplainError(f"{where}: a pod has one category; {ACCEPTED_EVENTS}")
            category = part
            continue
        flag = match.group("flag")
        if flag is not None:  # disruption, peer
            if (disruption, peer)[flag == "peer"]:
                raise ExplainError(f"{where} names {flag} twice; {ACCEPTED_EVENTS}")
            if disruption or peer:
                raise ExplainError(
                    f"{where}: a pod is disrupted or a peer of a disrupted one, not both; "
                    f"{ACCEPTED_EVENTS}"
                )
            disruption, peer = disruption or flag == "disruption", peer or flag == "peer"
            continue
        what = match.group("what")
        if match.group("oomed") is not None:  # oom:container, as container:oom
            what, container = "oom", match.group("oomed")
        else:
            container = match.group("container")
        code = SIGKILL if what == "oom" else int(what)
        if code > 255:
            raise ExplainError(f"{where}: exit codes go from 0 to 255; {ACCEPTED_EVENTS}")
        if what == "oom":
            ooms.append(container or "")
        if any(name == container for name, _ in exits):
            who = f"container {container}" if container else "the main container"
            raise ExplainError(f"{where} gives {who} two exit codes; {ACCEPTED_EVENTS}")
        exits.append((container, code))
    unnamed = [code for name, code in exits if name is None]
    named = tuple((name, code) for name, code in exits if name is not None)
    oomed = tuple(ooms)
    if category is not None:
        return _categorized(token, category, unnamed, named, oomed, disruption, where)
    if unnamed:
        return Event(token, unnamed[0], None, disruption, named, ooms=oomed, peer=peer)
    if disruption or peer:
        code = SIGTERM if disruption else PEER_EXIT
        return Event(token, code, None, disruption, named, implied=True, ooms=oomed, peer=peer)
    (first, code), rest = named[0], named[1:]
    return Event(token, code, first, False, rest, ooms=oomed)


def _categorized(
    token: str,
    category: str,
    unnamed: list[int],
    named: tuple[tuple[str, int], ...],
    ooms: tuple[str, ...],
    disruption: bool,
    where: str,
) -> Event:
    """A pod the controller wrote ``category`` on: its main container's exit as given,
    else what the category implies (``CATEGORY_EXITS``: -1, none)."""
    if not unnamed and not named:
        implied = CATEGORY_EXITS.get(category, PEER_EXIT)
        code = -1 if implied is None else implied
        oomed = ("",) if category == "OOMKilled" else ooms
        return Event(token, code, None, disruption, (), ooms=oomed, category=category)
    if unnamed:
        return Event(token, unnamed[0], None, disruption, named, ooms=ooms, category=category)
    (first, code), rest = named[0], named[1:]
    return Event(token, code, first, disruption, rest, ooms=ooms, category=category)


# --- what a simulation returns ------------------------------------------------------


@dataclass(frozen=True)
class InPlaceRestart:
    """One restart in place in a simulation: ``container`` exited ``exit_code`` and
    restarted (with the whole pod when ``whole_pod``), by ``rule`` of its
    restartPolicyRules (1-based; ``None``: its own restartPolicy), after ``delay_seconds``
    of the kubelet's back-off; ``restart`` counts this container's restarts in its pod."""

    container: str
    exit_code: int
    whole_pod: bool
    rule: int | None
    origin: str
    restart: int
    delay_seconds: int


@dataclass(frozen=True)
class InPlaceSummary:
    restarts: int
    backoff_seconds: int
    text: str


@dataclass(frozen=True)
class PodFacts:
    """What one simulated pod is admitted with, as the pod webhook would give it.

    With the restarts in place of its steps, these are the per-attempt facts that
    ``retry-webhook test`` asserts (``webhook.policytest.facts``): a new fact is a field
    here, set where the simulator starts a pod (``JobSimulator.pod_facts``), and a row of
    that module's table.
    """

    #: Placed on non-spot nodes only (non-spot-attempts).
    non_spot: bool = False
    #: Each container that sets memory, as this pod gets it (oom-memory-factor raises
    #: it after the container's OOM kills in earlier pods).
    memory: tuple[ContainerMemory, ...] = ()
    #: Nodes this pod keeps off (avoid-failed-nodes): one per earlier pod that failed on
    #: its node (not disrupted), the most recent, at most guardRails.maxAvoidedNodes. Two
    #: failures on one node make one fewer: this is the most there can be.
    avoided_nodes: int = 0
    #: Seconds it is held back after the failure before it (retry-delay's scheduling
    #: gate; the Job controller's own back-off counts from the same failure).
    delay_seconds: int = 0


@dataclass(frozen=True)
class NextPod:
    """The pod that runs after the last event, while the workload is still running."""

    pod: int
    attempt: int
    facts: PodFacts
    #: JobSets: the run it belongs to.
    run: int | None = None


@dataclass(frozen=True)
class Step:
    pod: int
    attempt: int
    nodes: str
    event: str
    what: str
    rule: int | None
    action: str | None
    counted: bool
    counted_failures: int
    result: str
    #: JobSets: the run the pod belonged to (1-based), and the JobSet's status.restarts
    #: after this failure (its pods' restart-attempt label from then on).
    run: int | None = None
    restarts: int | None = None
    #: Restarts in place: the pod did not fail (empty when it did).
    in_place: tuple[InPlaceRestart, ...] = ()
    #: What the pod was admitted with (``None``: not known, e.g. restartPolicy OnFailure,
    #: where no new pod is made).
    facts: PodFacts | None = None
    #: The restarts in place reached max-in-place-restarts: the controller replaced the
    #: pod, a failure (``in_place`` holds its last restarts).
    replaced: bool = False


@dataclass(frozen=True)
class Ending:
    state: str  # Failed, Running, IndexFailed
    reason: str | None
    message: str


@dataclass
class Simulation:
    events: list[str]
    steps: list[Step]
    ending: Ending
    unused: list[str] = field(default_factory=list)
    #: What one event fails: a "pod", a whole "attempt" (a RayJob's RayCluster run), or
    #: "exit": a bare Pod's container exits.
    unit: str = "pod"
    #: Where the failure shows: "condition Failed", or a RayJob's "jobDeploymentStatus Failed".
    failed_as: str = "condition Failed"
    #: What the restarts in place among the events added up to (``None``: there were none).
    in_place: InPlaceSummary | None = None
    #: The pod that runs next when the workload is still running and the last event
    #: was not a restart in place (that pod goes on).
    next: NextPod | None = None


class Simulator(Protocol):
    """Walks failure events through a plan; one per kind of retry semantics (a Job's pods,
    a JobSet's restarts, a RayJob's retries)."""

    #: Container names events may name (the first is the one bare exit codes mean).
    containers: Sequence[str]

    def run(self, events: Sequence[Event]) -> Simulation: ...


def walk(
    events: Sequence[Event], step: Callable[[int, Event], tuple[Step, Ending | None]]
) -> tuple[list[Step], Ending | None, list[str]]:
    """Each event in turn (numbered from 1) until one ends the workload; the events after
    that are returned as unused."""
    steps: list[Step] = []
    unused: list[str] = []
    ending: Ending | None = None
    for number, event in enumerate(events, 1):
        if ending is not None:
            unused.append(event.token)
            continue
        made, ending = step(number, event)
        steps.append(made)
    return steps, ending, unused
