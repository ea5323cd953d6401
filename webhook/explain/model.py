"""The explanation model: --simulate events, the plain values an explanation is made of,
and the registry of per-kind explainers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from webhook.kube import failurepolicy
from webhook.kube.failurepolicy import ContainerExit, PodFailure
from webhook.kube.objects import mapping
from webhook.plan.failureaware import ContainerMemory, MemoryPlan
from webhook.plan.outcome import Context, Outcome, PlannedPart
from webhook.policy import categories as cats
from webhook.policy.categories import condition_type
from webhook.policy.model import (
    Policy,
    format_value,
)

WIDTH = 80
MAX_EVENTS = 1000
#: Plans longer than this show their first and last rows and the non-spot boundary.
MAX_ATTEMPT_ROWS = 12
#: Rows per container at most in a memory table (a small factor takes many steps to
#: reach the limit).
MEMORY_ROWS = 8

SIGTERM, SIGKILL = 143, 137

WORKLOAD_KEYS = (
    "backoff-limit",
    "fail-non-retriable",
    "retriable-exit-codes",
    "ignore-disruptions",
    "non-spot-attempts",
    "error-propagation",
)
#: Shown when one is set (budgets per cause, ``webhook.plan.causes``).
BUDGET_KEYS = ("max-disruptions", "peer-disruptions", "max-in-place-restarts")
#: Shown when one is set (failure categories, ``webhook.plan.verdicts``).
VERDICT_KEYS = ("free-categories", "max-free-failures", "fail-categories", "start-deadline")
POD_KEYS = ("backoff-limit", "non-spot-attempts", "error-propagation", "attempt")
#: Shown when either is set (``webhook.plan.delays``).
BETWEEN_KEYS = ("attempt-env", "retry-delay", "retry-delay-factor", "retry-delay-max")
#: Shown when any of them is set (failure-aware retries, ``webhook.plan.failureaware``).
FAILURE_AWARE_KEYS = ("oom-memory-factor", "oom-memory-limit", "avoid-failed-nodes")
#: Shown when in-place restarts are asked for (``webhook.plan.inplace``).
IN_PLACE_KEYS = ("in-place-exit-codes", "in-place-scope")


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
        restarts on success (``explain.inplace.restarted``)."""
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


# --- the explanation model (plain values: rendered as text or JSON) ----------------


@dataclass(frozen=True)
class SettingLine:
    name: str
    value: str
    source: str
    detail: str
    text: str


@dataclass(frozen=True)
class RuleLine:
    number: int
    action: str
    when: str
    then: str
    origin: str
    counts: bool | None


@dataclass(frozen=True)
class AttemptRow:
    attempt: int
    failures_before: int
    nodes: str
    if_fails: str
    retries_left: int | None
    #: What the attempt's pod waits after the failure before it (``retry-delay``): a
    #: duration, "-" for none; "" when the table has no delays.
    waits: str = ""


@dataclass(frozen=True)
class AttemptGap:
    """Attempts left out of a long table; all like the row before them."""

    first: int
    last: int


@dataclass
class AttemptTable:
    """What each attempt runs on and what its failure does, from the first to the one
    past the budget (shown as "Attempt plan"; JSON ``plan``)."""

    limit_field: str
    limit: int
    non_spot_attempts: int
    rows: list[AttemptRow | AttemptGap]
    #: What one row is: an "attempt" (a pod), or a "run" of a JobSet (every Job recreated).
    unit: str = "attempt"
    #: Whether the rows say what each attempt waits (``retry-delay``).
    delays: bool = False


@dataclass(frozen=True)
class MemoryRow:
    """A container's memory in an attempt after ``kills`` OOM kills of it (``last``: and
    in every attempt after more, the value being at the limit)."""

    container: str
    kills: int
    request: str
    limit: str
    last: bool = False


@dataclass
class MemoryTable:
    factor: str
    limit: str
    rows: list[MemoryRow]


def memory_table(plan: MemoryPlan) -> MemoryTable:
    """What each container's memory becomes after its OOM kills, one attempt after another,
    until it reaches the limit (at most ``MEMORY_ROWS`` rows a container)."""
    rows = []
    for name in plan.containers:
        for kills in range(MEMORY_ROWS + 1):
            request, limit = plan.at(name, kills)
            final = kills > 0 and (request, limit) == plan.at(name, kills + 1)
            rows.append(MemoryRow(name, kills, request, limit, final))
            if final:
                break
    factor = format_value("oom-memory-factor", plan.factor)
    return MemoryTable(factor, str(plan.cap), rows)


def memory_words(plan: MemoryPlan, name: str, kills: int) -> str:
    """A container's memory after ``kills`` OOM kills, in words."""
    request, limit = plan.at(name, kills)
    return f"{name}'s memory {request}" + (f"/{limit}" if limit != "-" else "")


@dataclass(frozen=True)
class CodeGroup:
    """Exit codes of one container that do the same thing: ``outcome`` is "restart" (the
    container restarts in place), "restart-pod" (the whole pod does), or what a pod that
    failed with them does ("FailJob", "FailIndex", "Ignore", "Count", "pod-fails")."""

    outcome: str
    codes: list[int]
    text: str


@dataclass(frozen=True)
class ContainerCodes:
    container: str
    groups: list[CodeGroup]
    #: A native sidecar (an init container with restartPolicy Always) with rules of its own.
    sidecar: bool = False


@dataclass(frozen=True)
class InPlaceTable:
    """What each regular container's exit codes do when its restart rules can restart it
    in place, what ends those restarts, and the kubelet's back-off before each."""

    containers: list[ContainerCodes]
    bound: str
    bounded: bool
    backoff: str


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


@dataclass
class Explanation:
    kind: str
    api_version: str
    namespace: str
    name: str
    #: Which part of the object this explains ("" for the object itself).
    part: str = ""
    changes: list[str] = field(default_factory=list)
    settings: list[SettingLine] = field(default_factory=list)
    budget: str = ""
    rules: list[RuleLine] = field(default_factory=list)
    no_match: str = ""
    examples: list[str] = field(default_factory=list)
    attempts: AttemptTable | None = None
    notes: list[str] = field(default_factory=list)
    simulation: Simulation | None = None
    #: The memory of each container by its OOM kills before (``oom-memory-factor``).
    memory: MemoryTable | None = None
    #: What each container's exit codes do when some restart it in place.
    in_place: InPlaceTable | None = None
    simulator: Simulator | None = field(default=None, repr=False)
    #: The kind a simulated failure ends (a CronJob's Jobs fail, not the CronJob).
    owner: str = ""
    #: The sentence that introduces ``rules``.
    rules_intro: str = (
        "When a pod fails, Kubernetes checks these rules in order; the first match wins:"
    )
    #: Said instead of the generic note when ``--simulate`` is given and there is no simulator.
    simulate_note: str = ""
    #: Under ``rollout: audit``: the defaults' settings held back (``Outcome.audited``).
    audited: list[SettingLine] = field(default_factory=list)


@dataclass
class Denial:
    kind: str
    api_version: str
    namespace: str
    name: str
    problems: list[str]
    changes: list[str] = field(default_factory=list)


# --- the per-kind registry -----------------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """What an explainer gets: the object before and after the webhook, and its review."""

    original: Mapping[str, Any]
    final: Mapping[str, Any]
    outcome: Outcome | None
    ctx: Context
    changes: list[str]

    def policy(self, where: str) -> Policy | None:
        return self.outcome.policies.get(where) if self.outcome is not None else None

    def planned(self, where: str) -> PlannedPart | None:
        """What admission recorded for the JobSpec part at ``where`` (``None``: it wrote no
        such part, or this subject was not admitted: ``status`` reads a stored object)."""
        return self.outcome.plans.get(where) if self.outcome is not None else None

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.final.get("spec")
        return spec if isinstance(spec, dict) else {}

    def header(self, part: str = "") -> Explanation:
        metadata = mapping(self.final.get("metadata"))
        return Explanation(
            kind=str(self.final.get("kind")),
            api_version=str(self.final.get("apiVersion")),
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or metadata.get("generateName") or "<unnamed>"),
            part=part,
            changes=list(self.changes),
        )


Explainer = Callable[[Subject], list[Explanation]]
_EXPLAINERS: dict[tuple[str, str], Explainer] = {}


def explainer(group: str, kind: str) -> Callable[[Explainer], Explainer]:
    """Register the function that explains one kind (``group`` is "" for the core API)."""

    def register(function: Explainer) -> Explainer:
        _EXPLAINERS[(group, kind)] = function
        return function

    return register


def explained_kinds() -> list[tuple[str, str]]:
    return sorted(_EXPLAINERS)
