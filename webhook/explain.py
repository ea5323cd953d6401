"""``retry-webhook explain``: a workload's retry plan, in plain words, before it runs.

Retry behaviour is opaque from the outside: which failures consume the budget, which end
the workload at once, where each attempt runs. This module answers those questions for
the object the webhook would store, so the answer cannot drift from what happens:

- the object goes through the same engine as admission (``engine.review``: mutate, then
  validate), and the mutator's resolved policy (``Outcome.policies``) supplies the
  provenance of every setting;
- failures are judged by the one podFailurePolicy evaluation (``failurepolicy.evaluate``)
  that validation and the attempt cache use;
- placement follows the pod webhook's rule: attempt ``a`` (counted failures so far) runs
  on non-spot nodes when ``a >= B + 1 - N``.

Each kind plugs in with one function registered by ``@explainer(group, kind)`` that turns
a reviewed object into ``Explanation`` values; ``explain_job_spec`` explains any batch/v1
JobSpec (a Job's, a CronJob's job template, a JobSet's replicated Job), so most kinds
are a one-line call to it. Rendering (``render_text``, ``to_json``) is shared by all kinds.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from webhook import engine, failurepolicy, podspec
from webhook.config import Config
from webhook.failurepolicy import ContainerExit, Match, PodFailure, named_containers
from webhook.mutators import Context, Outcome, controller_of, items, mapping, workload_policy
from webhook.mutators.job import (
    API_DEFAULT_BACKOFF_LIMIT,
    LimitField,
    job_limit_field,
    resolve_limit,
)
from webhook.policy import (
    INT32_MAX,
    PREFIX,
    BadValue,
    Layer,
    Policy,
    Scope,
    Setting,
    Source,
    format_value,
    parse_annotations,
    parse_count,
    resolve,
)
from webhook.quantity import Quantity
from webhook.runtimes import NoRuntimes, RuntimeSource

WIDTH = 80
MAX_EVENTS = 1000
#: Plans longer than this show their first and last rows and the non-spot boundary.
MAX_PLAN_ROWS = 12

INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
SIGTERM, SIGKILL = 143, 137

WORKLOAD_KEYS = (
    "backoff-limit",
    "fail-non-retriable",
    "retriable-exit-codes",
    "ignore-disruptions",
    "non-spot-attempts",
    "error-propagation",
)
POD_KEYS = ("backoff-limit", "non-spot-attempts", "error-propagation", "attempt")
#: Shown when any of them is set (failure-aware retries, ``webhook.failureaware``).
FAILURE_AWARE_KEYS = ("oom-memory-factor", "oom-memory-limit", "avoid-failed-nodes")


class ExplainError(ValueError):
    """Input explain cannot use (a bad ``--simulate`` event, a manifest whose metadata or
    spec is not a mapping); the text says what is accepted."""


# --- --simulate: the event grammar -------------------------------------------------

_CONTAINER = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_PART = re.compile(
    rf"(?:(?P<container>{_CONTAINER}):)?(?P<what>[0-9]{{1,3}}|oom)|disruption"
    rf"|oom:(?P<oomed>{_CONTAINER})"
)
ACCEPTED_EVENTS = (
    "accepted: an exit code 1-255 (e.g. 143), container:code (e.g. main:1), "
    "oom (an OOM kill, exit code 137), container:oom or oom:container, "
    "or disruption (preemption, eviction, drain), "
    "several in one pod joined by + (e.g. 143+proxy:137, disruption+main:137), "
    "events separated by commas"
)


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

    def oom_killed(self, main: str) -> list[str]:
        return [name or main for name in self.ooms]

    def named(self) -> list[str]:
        """The containers the event names (unnamed, an exit is the main container's)."""
        first = [self.container] if self.container is not None else []
        return first + [name for name, _ in self.others]

    def exits(self, main: str) -> list[tuple[str, int]]:
        """(container, exit code) of every container the event stops."""
        if self.implied and any(name == main for name, _ in self.others):
            return list(self.others)
        return [(self.container or main, self.exit_code), *self.others]

    def failure(self, main: str, init: Iterable[str] = ()) -> PodFailure:
        """The failed pod as the Job controller sees it; ``init`` names the pod's init
        containers (their statuses are read after the regular containers')."""
        init = set(init)
        exits = tuple(ContainerExit(n, code, n in init) for n, code in self.exits(main))
        conditions = ((failurepolicy.DISRUPTION_TARGET, "True"),) if self.disruption else ()
        return PodFailure(exits, conditions)

    def describe(self, main: str) -> str:
        if self.disruption:
            stopped = ", ".join(f"{n} exits {code}" for n, code in self.exits(main))
            return f"pod disrupted (preemption, eviction, drain; {stopped})"
        return ", ".join(f"{_code_name(code)} in container {n}" for n, code in self.exits(main))


def _code_name(code: int) -> str:
    known = {1: "application error", SIGKILL: "OOM kill or SIGKILL", SIGTERM: "SIGTERM"}
    return f"exit code {code}" + (f" ({known[code]})" if code in known else "")


def parse_events(text: str) -> list[Event]:
    """Parse ``143,disruption,main:1,143+proxy:137``; a bad token is named with its position."""
    tokens = [token.strip() for token in text.split(",")]
    if not text.strip():
        raise ExplainError(f"--simulate: no events given; {ACCEPTED_EVENTS}")
    if len(tokens) > MAX_EVENTS:
        raise ExplainError(f"--simulate: {len(tokens)} events; at most {MAX_EVENTS}")
    return [
        _parse_event(token, f"--simulate: event {n} {token!r}") for n, token in enumerate(tokens, 1)
    ]


def _parse_event(token: str, where: str) -> Event:
    disruption = False
    exits: list[tuple[str | None, int]] = []
    ooms: list[str] = []
    for part in token.split("+"):
        match = _PART.fullmatch(part)
        if match is None:
            raise ExplainError(f"{where} is not an event; {ACCEPTED_EVENTS}")
        if match.group("what") is None and match.group("oomed") is None:  # disruption
            if disruption:
                raise ExplainError(f"{where} names disruption twice; {ACCEPTED_EVENTS}")
            disruption = True
            continue
        what = match.group("what")
        if match.group("oomed") is not None:  # oom:container, as container:oom
            what, container = "oom", match.group("oomed")
        else:
            container = match.group("container")
        code = SIGKILL if what == "oom" else int(what)
        if code == 0:
            raise ExplainError(
                f"{where}: exit code 0 is a success, not a failure; {ACCEPTED_EVENTS}"
            )
        if code > 255:
            raise ExplainError(f"{where}: exit codes go from 1 to 255; {ACCEPTED_EVENTS}")
        if what == "oom":
            ooms.append(container or "")
        if any(name == container for name, _ in exits):
            who = f"container {container}" if container else "the main container"
            raise ExplainError(f"{where} gives {who} two exit codes; {ACCEPTED_EVENTS}")
        exits.append((container, code))
    unnamed = [code for name, code in exits if name is None]
    named = tuple((name, code) for name, code in exits if name is not None)
    oomed = tuple(ooms)
    if unnamed:
        return Event(token, unnamed[0], None, disruption, named, ooms=oomed)
    if disruption:
        return Event(token, SIGTERM, None, True, named, implied=True, ooms=oomed)
    (first, code), rest = named[0], named[1:]
    return Event(token, code, first, False, rest, ooms=oomed)


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
class PlanRow:
    attempt: int
    failures_before: int
    nodes: str
    if_fails: str
    retries_left: int | None


@dataclass(frozen=True)
class PlanGap:
    """Attempts left out of a long plan; all like the row before them."""

    first: int
    last: int


@dataclass
class Plan:
    limit_field: str
    limit: int
    non_spot_attempts: int
    rows: list[PlanRow | PlanGap]
    #: What one row is: an "attempt" (a pod), or a "run" of a JobSet (every Job recreated).
    unit: str = "attempt"


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


class MemoryPlan:
    """What ``oom-memory-factor`` gives each container of a pod template after its OOM
    kills: the pod webhook's own arithmetic (``podspec.raise_memory``) on a copy."""

    #: Rows per container at most (a small factor takes many steps to reach the limit).
    MOST = 8

    def __init__(self, pod_spec: Mapping[str, Any], factor: Fraction, cap: Quantity):
        self.factor = factor
        self.cap = cap
        self.containers = {
            name: engine.json_copy(c)
            for c in podspec.containers(pod_spec)
            if isinstance(name := c.get("name"), str)
            and (podspec.memory_of(c, "requests") or podspec.memory_of(c, "limits"))
        }

    def at(self, name: str, kills: int) -> tuple[str, str]:
        """(request, limit) of container ``name`` after ``kills`` OOM kills ("-": unset)."""
        container = self.containers.get(name)
        if container is None:
            return "-", "-"
        container = engine.json_copy(container)
        if kills:
            podspec.raise_memory(container, self.factor, kills, self.cap)
        request, limit = (podspec.memory_of(container, k) for k in ("requests", "limits"))
        return (str(request) if request else "-", str(limit) if limit else "-")

    def table(self) -> MemoryTable:
        rows = []
        for name in self.containers:
            for kills in range(self.MOST + 1):
                request, limit = self.at(name, kills)
                final = kills > 0 and (request, limit) == self.at(name, kills + 1)
                rows.append(MemoryRow(name, kills, request, limit, final))
                if final:
                    break
        factor = format_value("oom-memory-factor", self.factor)
        return MemoryTable(factor, str(self.cap), rows)

    def text(self, name: str, kills: int) -> str:
        request, limit = self.at(name, kills)
        return f"{name}'s memory {request}" + (f"/{limit}" if limit != "-" else "")


def memory_plan(pod_spec: Mapping[str, Any], pods: Policy) -> MemoryPlan | None:
    """The plan of a template whose pods raise memory (its annotations say so)."""
    factor, cap = pods.oom_memory_factor, pods.oom_memory_limit
    if factor is None or cap is None:
        return None
    return MemoryPlan(pod_spec, factor, cap)


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
    #: What one event fails: a "pod", or a whole "attempt" (a RayJob's RayCluster run).
    unit: str = "pod"
    #: Where the failure shows: "condition Failed", or a RayJob's "jobDeploymentStatus Failed".
    failed_as: str = "condition Failed"


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
    plan: Plan | None = None
    notes: list[str] = field(default_factory=list)
    simulation: Simulation | None = None
    #: The memory of each container by its OOM kills before (``oom-memory-factor``).
    memory: MemoryTable | None = None
    simulator: Simulator | None = field(default=None, repr=False)
    #: The kind a simulated failure ends (a CronJob's Jobs fail, not the CronJob).
    owner: str = ""
    #: The sentence that introduces ``rules``.
    rules_intro: str = (
        "When a pod fails, Kubernetes checks these rules in order; the first match wins:"
    )
    #: Said instead of the generic note when ``--simulate`` is given and there is no simulator.
    simulate_note: str = ""


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


# --- entry point -----------------------------------------------------------------------


def explain(
    obj: dict[str, Any],
    config: Config,
    namespace: str | None = None,
    events: Sequence[Event] | None = None,
    runtimes: RuntimeSource | None = None,
) -> list[Explanation] | Denial | None:
    """Review ``obj`` as admission would and explain the result.

    ``obj`` must be prepared as the API server would see it (defaults applied, intent
    recorded: ``cli.prepare``). Returns a ``Denial`` when the webhook would deny it,
    ``None`` for a kind explain does not cover, else one ``Explanation`` per part.
    ``runtimes`` are the Kubeflow Trainer runtimes a TrainJob may name (given in the same
    input). Raises ``ExplainError`` when an event names a container the workload does not
    have.
    """
    group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    kind = str(obj.get("kind") or "")
    for part in ("metadata", "spec"):
        if not isinstance(obj.get(part) or {}, dict):
            raise ExplainError(f"{kind or 'object'}: {part} must be a mapping of fields")
    runtimes = runtimes if runtimes is not None else NoRuntimes()
    reviewed = engine.review(obj, config, namespace, runtimes=runtimes)
    changes = [w.removeprefix("retry-policy: ") for w in reviewed.verdict.warnings]
    changes = [c for c in changes if c != engine.EXPLAIN_HINT.removeprefix("retry-policy: ")]
    metadata = mapping(obj.get("metadata"))
    if not reviewed.verdict.allowed:
        problems = [str(p) for p in (reviewed.outcome.problems if reviewed.outcome else [])]
        return Denial(
            kind,
            str(obj.get("apiVersion")),
            str(metadata.get("namespace") or ""),
            str(metadata.get("name") or metadata.get("generateName") or "<unnamed>"),
            problems or [reviewed.verdict.message.removeprefix("retry-policy: ")],
            changes,
        )
    function = _EXPLAINERS.get((group, kind))
    if function is None:
        return None
    ns = namespace or metadata.get("namespace")
    ctx = Context(config, namespace=ns, runtimes=runtimes)
    subject = Subject(obj, reviewed.result, reviewed.outcome, ctx, changes)
    explanations = function(subject)
    owner = controller_of(metadata)
    if owner is not None and explanations and config.affects_unannotated(ns):
        explanations[0].notes.append(
            f"this {kind} is managed by {owner.get('kind')} {owner.get('name')}: the "
            "cluster's defaults and guard rails do not apply to it (its controller chose "
            "its retry behaviour); only annotations on the object itself do"
        )
    if events is not None:
        for item in explanations:
            if item.simulator is None:
                item.notes.append(
                    item.simulate_note
                    or f"--simulate does not apply to a {item.kind}: Kubernetes does not "
                    "retry it; simulate the workload that creates it"
                )
                continue
            _check_containers(item, events)
            item.simulation = item.simulator.run(events)
    return explanations


def _check_containers(item: Explanation, events: Sequence[Event]) -> None:
    known = list(item.simulator.containers) if item.simulator else []
    label = f"{item.kind}/{item.name}" + (f" ({item.part})" if item.part else "")
    for position, event in enumerate(events, 1):
        where = f"--simulate: event {position} {event.token!r}"
        for name in event.named():
            if name not in known:
                raise ExplainError(
                    f"{where} names container {name!r}, which {label} does not have; "
                    "its containers: " + ", ".join(known)
                )
        main = known[0] if known else "main"
        if not event.implied and event.container is None and main in event.named():
            raise ExplainError(
                f"{where} gives container {main} (the main one, which a bare exit code "
                f"means) two exit codes; {ACCEPTED_EVENTS}"
            )


# --- settings and their provenance -------------------------------------------------------


def setting_lines(
    policy: Policy, names: Iterable[str], default: str = Source.KUBERNETES.value
) -> list[SettingLine]:
    """One line per setting; ``default`` names the API whose default a value is when it
    came from no one (a RayJob's ``backoffLimit`` is its CRD's default, not Kubernetes')."""
    lines = []
    for name in names:
        setting = policy.setting(name)
        lines.append(
            SettingLine(
                name=name,
                value=_value_text(name, setting.value),
                source=setting.source.value,
                detail=setting.detail,
                text=source_text(name, setting, default=default),
            )
        )
    return lines


def _value_text(name: str, value: Any) -> str:
    if value is None and name != "error-propagation":
        return "-"
    if name == "retriable-exit-codes":
        return ",".join(_ranges(value))
    return format_value(name, value)


def _ranges(values: Iterable[Any]) -> list[str]:
    """Exit codes with runs of three or more folded: [1, 2, 3, 42] -> ["1-3", "42"]."""
    codes = sorted({v for v in values if isinstance(v, int)})
    out: list[str] = []
    start = previous = None
    for code in [*codes, None]:
        if start is not None and code is not None and code == previous + 1:
            previous = code
            continue
        if start is not None and previous - start >= 2:
            out.append(f"{start}-{previous}")
        elif start is not None:
            out.extend(str(c) for c in range(start, previous + 1))
        start = previous = code
    return out


def source_text(
    name: str, setting: Setting, long: bool = False, default: str = Source.KUBERNETES.value
) -> str:
    """Where a value came from, in words; ``long`` names the annotation key too."""
    detail = setting.detail.strip("()")
    if setting.source is Source.ANNOTATION:
        return f"your annotation {PREFIX}{name}" if long else "your annotation"
    if setting.source is Source.SPEC:
        return f"your own {detail}" if detail else "your own spec"
    if setting.source is Source.NAMESPACE:
        return f"namespace default for {detail}" if detail else "namespace default"
    if setting.source is Source.CLUSTER and detail:
        return f"cluster guard rail {detail}" if "guardRails" in detail else "cluster default"
    if setting.source is Source.BUILTIN:
        # The retriable codes have a value even when nobody set them (143, SIGTERM).
        return "built-in default" if name == "retriable-exit-codes" else "not set"
    if setting.source is Source.KUBERNETES:
        return f"the {default}" if long else default
    return setting.source.value


# --- podFailurePolicy rules in words -----------------------------------------------------


def join_words(values: Sequence[Any], word: str = "or", limit: int = 8) -> str:
    items = [str(v) for v in values]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f" {word} {len(items) - limit} more"
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {word} {items[-1]}"


def describe_when(rule: Mapping[str, Any]) -> str:
    """The condition of one rule, as a phrase: "exit code 42 in container main"."""
    codes = rule.get("onExitCodes")
    if isinstance(codes, dict):
        values = _ranges(items(codes.get("values")))
        where = (
            f"in container {codes['containerName']}"
            if codes.get("containerName")
            else "in any container"
        )
        plural = "s" if len(values) > 1 or "-" in "".join(values) else ""
        if codes.get("operator") == "NotIn":
            return f"a non-zero exit code other than {join_words(values)} {where}"
        if codes.get("operator") == "In":
            return f"exit code{plural} {join_words(values)} {where}"
        return f"exit codes with operator {codes.get('operator')!r} (never matches)"
    conditions = rule.get("onPodConditions")
    if isinstance(conditions, list):
        phrases = []
        for pattern in conditions:
            if not isinstance(pattern, dict):
                continue
            kind, status = str(pattern.get("type")), str(pattern.get("status") or "True")
            if kind == failurepolicy.DISRUPTION_TARGET and status == "True":
                phrases.append(
                    "the pod was disrupted (preemption, eviction, node drain, or the kubelet's "
                    "node-pressure eviction)"
                )
            elif status == "True":
                phrases.append(f"the pod has condition {kind}")
            else:
                phrases.append(f"the pod's condition {kind} is {status}")
        return join_words(phrases) if phrases else "no condition (never matches)"
    return "nothing (the rule has neither onExitCodes nor onPodConditions)"


def describe_then(action: str, scope: str = "backoffLimit") -> str:
    return {
        "FailJob": "the Job fails at once",
        "FailIndex": "its index fails at once and is not retried",
        "Ignore": "retried, does not count",
        "Count": f"retried, counts against {scope}",
    }.get(action, f"skipped: Kubernetes does not know the action {action!r}")


def rule_lines(
    rules: Sequence[Any], user_rules: Sequence[Any], policy: Policy, scope: str
) -> list[RuleLine]:
    """Every rule of the final spec, with who wrote it: the user, or this webhook."""
    yours = {failurepolicy.rule_key(rule) for rule in user_rules}
    ignore = failurepolicy.rule_key(failurepolicy.ignore_disruptions_rule())
    count = failurepolicy.rule_key(failurepolicy.count_disruptions_rule())
    lines = []
    for number, rule in enumerate(rules, 1):
        if not isinstance(rule, dict):
            continue
        key = failurepolicy.rule_key(rule)
        if key in yours:
            origin = "your rule"
        elif key == ignore:
            origin = "added by retry-policy for ignore-disruptions"
        elif key == count or failurepolicy.is_non_retriable_rule(rule, policy.retriable_exit_codes):
            origin = "added by retry-policy for fail-non-retriable"
        else:
            origin = "added by retry-policy"
        action = str(rule.get("action"))
        known = action in failurepolicy.ACTIONS
        lines.append(
            RuleLine(
                number=number,
                action=action,
                when=describe_when(rule),
                then=describe_then(action, scope),
                origin=origin,
                counts=(action != "Ignore") if known else None,
            )
        )
    return lines


# --- placement -------------------------------------------------------------------------


def runs_non_spot(failures: int, backoff_limit: int | None, non_spot_attempts: int) -> bool:
    """The pod webhook's rule: attempt ``a`` goes to non-spot nodes when a >= B + 1 - N."""
    if backoff_limit is None or non_spot_attempts <= 0:
        return False
    return failures >= backoff_limit + 1 - non_spot_attempts


def nodes_text(non_spot: bool) -> str:
    return "non-spot only" if non_spot else "any node"


def count_of(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def on_nodes(nodes: str) -> str:
    return "on non-spot nodes only" if nodes == nodes_text(True) else "on any node"


def _retries(n: int) -> str:
    return f"{n} retr{'y' if n == 1 else 'ies'} left"


def build_plan(
    limit_field: str,
    limit: int,
    placement_limit: int | None,
    non_spot_attempts: int,
    final: str,
    unit: str = "attempt",
) -> Plan:
    """One row per attempt ``a`` = 0..limit (counted failures before it); long plans keep
    their first and last rows and the rows around the non-spot boundary. With ``unit``
    "run" a row is one run of a JobSet and ``a`` the restarts before it."""
    keep = set(range(min(3, limit + 1))) | set(range(max(0, limit - 2), limit + 1))
    if non_spot_attempts > 0 and placement_limit is not None:
        boundary = placement_limit + 1 - non_spot_attempts
        keep |= {a for a in (boundary - 1, boundary) if 0 <= a <= limit}
    if limit + 1 <= MAX_PLAN_ROWS:
        keep = set(range(limit + 1))
    rows: list[PlanRow | PlanGap] = []
    previous = -1
    for a in sorted(keep):
        if a > previous + 1:
            rows.append(PlanGap(previous + 2, a))
        left = limit - a
        rows.append(
            PlanRow(
                attempt=a + 1,
                failures_before=a,
                nodes=nodes_text(runs_non_spot(a, placement_limit, non_spot_attempts)),
                if_fails=_again(unit, left) if left else final,
                retries_left=left or None,
            )
        )
        previous = a
    return Plan(limit_field, limit, non_spot_attempts, rows, unit)


def _again(unit: str, left: int) -> str:
    if unit == "run":
        return f"the set restarts, {left} restart{'' if left == 1 else 's'} left"
    return f"retried, {_retries(left)}"


# --- batch/v1 JobSpec ------------------------------------------------------------------


def at_path(obj: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The value at a field path; list items as "3" or "replicatedJobs[3]"."""
    node: Any = obj
    for part in path:
        indexed = re.fullmatch(r"(.*)\[([0-9]+)\]", part)
        steps = [indexed.group(1), indexed.group(2)] if indexed else [part]
        for step in filter(None, steps):
            if isinstance(node, list) and step.isdigit() and int(step) < len(node):
                node = node[int(step)]
            elif isinstance(node, dict):
                node = node.get(step)
            else:
                return None
    return node


def rules_of(spec: Any) -> list[Any]:
    pfp = spec.get("podFailurePolicy") if isinstance(spec, dict) else None
    rules = pfp.get("rules") if isinstance(pfp, dict) else None
    return list(rules) if isinstance(rules, list) else []


def container_names(pod_spec: Mapping[str, Any]) -> list[str]:
    """Regular containers first (the first is the "main" one events default to)."""
    return [
        c["name"]
        for group in ("containers", "initContainers")
        for c in named_containers(pod_spec, group)
    ]


def template_pod_policy(annotations: Any) -> Policy:
    """What a pod created from a template learns from its annotations (as the pod webhook)."""
    values, _ = parse_annotations(annotations if isinstance(annotations, dict) else None, Scope.POD)
    return resolve([Layer(Source.ANNOTATION, values)])


def _unmanaged_policy(
    subject: Subject, path: Sequence[str], spec: Mapping[str, Any], defaulted: bool = True
) -> Policy:
    """The policy of a JobSpec the mutator did not touch (no annotations, no defaults):
    resolved the same way, so provenance still says where backoffLimit came from."""
    return unmanaged_policy(subject, job_limit_field(tuple(path), spec, defaulted))


def unmanaged_policy(subject: Subject, field: LimitField) -> Policy:
    """The policy of an object the mutator did not touch, resolved against ``field`` (the
    kind's budget) the way the mutator would have."""
    policy, _ = workload_policy(subject.final.get("metadata"), subject.ctx)
    return resolve_limit(subject.final, field, policy, Outcome())


@dataclass
class JobSpecView:
    """The retry facts of one batch/v1 JobSpec, as the Job controller will read them."""

    where: str
    policy: Policy
    #: The template's pod policy (what its pods learn from their annotations).
    pods: Policy
    containers: list[str]
    limit: int
    per_index: int | None
    max_failed: int | None
    rules: list[Any]
    user_rules: list[Any]
    on_failure: bool
    parallelism: Any = None
    completions: Any = None
    init: list[str] = field(default_factory=list)
    sidecars: list[str] = field(default_factory=list)
    #: Whether its pods take their attempt number from the Job's count of failures (a
    #: Job's, a CronJob's Jobs'), and then the budget from the Job's backoffLimit too.
    placed_by_job: bool = True
    #: What its pods' memory becomes after OOM kills (``oom-memory-factor``).
    memory: MemoryPlan | None = None

    @property
    def placement_limit(self) -> int | None:
        """The budget pods place themselves by (``mutators.pod``): a Job's pods read the
        Job's backoffLimit when they are created; an index's pods (per-index budget) and
        a JobSet's (runs) go by their template's backoff-limit."""
        if self.pods.backoff_limit is None:
            return None
        if self.placed_by_job and self.per_index is None:
            return self.limit
        return self.pods.backoff_limit

    @property
    def scope(self) -> str:
        return "backoffLimitPerIndex" if self.per_index is not None else "backoffLimit"

    @property
    def budget(self) -> int:
        return self.per_index if self.per_index is not None else self.limit

    def rule_lines(self) -> list[RuleLine]:
        return rule_lines(self.rules, self.user_rules, self.policy, self.scope)

    def no_match(self) -> str:
        if self.on_failure:
            return (
                "with restartPolicy OnFailure, a failed container restarts inside the same pod "
                "and every restart counts (a podFailurePolicy needs restartPolicy Never)"
            )
        if self.rules:
            return f"anything else (no rule matches): retried, counts against {self.scope}"
        return f"there are no podFailurePolicy rules: every failure counts against {self.scope}"

    def simulator(self) -> JobSimulator:
        return JobSimulator(
            rules=self.rules,
            backoff_limit=self.limit,
            per_index=self.per_index,
            max_failed_indexes=self.max_failed,
            placement_limit=self.placement_limit,
            non_spot_attempts=self.pods.non_spot_attempts,
            containers=self.containers,
            on_failure=self.on_failure,
            init=self.init,
            sidecars=self.sidecars,
            memory=self.memory,
        )


def job_spec_view(
    subject: Subject, path: Sequence[str], defaulted: bool = True
) -> JobSpecView | None:
    """The JobSpec at ``path`` of the reviewed object (``None`` when there is none), with
    the policy the mutator recorded for it. ``defaulted`` says whether the API server
    defaults this spec (a Job's own) or not (a template in a CronJob or JobSet)."""
    where = ".".join(path)
    spec = at_path(subject.final, path)
    if not isinstance(spec, dict):
        return None
    policy = subject.policy(where) or _unmanaged_policy(subject, path, spec, defaulted)
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    pod_spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    limit = spec.get("backoffLimit")
    per_index = spec.get("backoffLimitPerIndex")
    max_failed = spec.get("maxFailedIndexes")
    pods = template_pod_policy(mapping(template.get("metadata")).get("annotations"))
    return JobSpecView(
        where=where,
        policy=policy,
        pods=pods,
        containers=container_names(pod_spec),
        limit=limit if isinstance(limit, int) else API_DEFAULT_BACKOFF_LIMIT,
        per_index=per_index if isinstance(per_index, int) else None,
        max_failed=max_failed if isinstance(max_failed, int) else None,
        rules=rules_of(spec),
        user_rules=rules_of(at_path(subject.original, path)),
        on_failure=pod_spec.get("restartPolicy") == "OnFailure",
        parallelism=spec.get("parallelism"),
        completions=spec.get("completions"),
        init=[c["name"] for c in named_containers(pod_spec, "initContainers")],
        sidecars=failurepolicy.sidecar_containers(pod_spec),
        placed_by_job=str(subject.final.get("kind")) in ("Job", "CronJob"),
        memory=memory_plan(pod_spec, pods),
    )


def explain_job_spec(
    subject: Subject, path: Sequence[str] = ("spec",), part: str = "", defaulted: bool = True
) -> Explanation:
    """Explain the batch/v1 JobSpec at ``path`` of the reviewed object."""
    item = subject.header(part)
    view = job_spec_view(subject, path, defaulted)
    if view is None:
        item.notes.append(f"{'.'.join(path)} is missing: nothing to explain")
        return item
    policy = view.policy
    item.settings = setting_lines(policy, workload_keys(policy))
    origin = "from " + source_text("backoff-limit", policy.setting("backoff-limit"), long=True)
    item.budget = job_budget(view.limit, origin, view.per_index, view.max_failed, view.on_failure)
    item.rules = view.rule_lines()
    item.no_match = view.no_match()
    simulator = view.simulator()
    item.simulator = simulator
    item.examples = simulator.examples()
    if view.on_failure:
        item.notes.append(
            "non-spot placement applies to new pods only; a container restarting in "
            "place stays on its node"
        )
    else:
        final = (
            "the index fails"
            if view.per_index is not None
            else "the Job fails (BackoffLimitExceeded)"
        )
        item.plan = build_plan(
            f"{view.where}.{view.scope}",
            view.budget,
            view.placement_limit,
            view.pods.non_spot_attempts,
            final,
        )
    item.notes.extend(_job_notes(view))
    failure_aware(item, view, subject)
    return item


def workload_keys(policy: Policy) -> tuple[str, ...]:
    """The settings to list: failure-aware ones only when one of them is set."""
    if any(policy.explicit(name) for name in FAILURE_AWARE_KEYS):
        return WORKLOAD_KEYS + FAILURE_AWARE_KEYS
    return WORKLOAD_KEYS


def failure_aware(item: Explanation, view: JobSpecView, subject: Subject) -> None:
    """The memory each attempt gets after OOM kills, and where failed nodes go."""
    if view.memory is not None:
        item.memory = view.memory.table()
        if not view.memory.containers:
            item.notes.append(
                "oom-memory-factor: no container sets a memory request or limit, so none "
                "can be raised"
            )
    if view.pods.avoid_failed_nodes:
        scope = "of its index" if view.per_index is not None else "of this Job"
        most = subject.ctx.config.rails(subject.ctx.namespace).max_avoided_nodes
        item.notes.append(
            f"avoid-failed-nodes: each new attempt keeps off the nodes where the last "
            f"{count_of(most, 'failed attempt')} {scope} ran (guardRails.maxAvoidedNodes)"
        )


def job_budget(
    limit: int, origin: str, per_index: int | None, max_failed: int | None, on_failure: bool
) -> str:
    if on_failure:
        runs = "the first restart fails it" if limit == 0 else f"restart number {limit} fails it"
        return (
            f"backoffLimit is {limit} ({origin}). With restartPolicy OnFailure, Kubernetes "
            f"counts container restarts: {runs} (BackoffLimitExceeded)."
        )
    if per_index is not None:
        text = (
            f"backoffLimitPerIndex is {per_index}: each index may fail {per_index} "
            f"time{'s' if per_index != 1 else ''} and is retried; failure number "
            f"{per_index + 1} of an index fails that index, and the Job ends with reason "
            "FailedIndexes once the other indexes are done."
        )
        if max_failed is not None:
            text += (
                f" More than {max_failed} failed index{'es' if max_failed != 1 else ''} "
                "fail the Job at once (MaxFailedIndexesExceeded)."
            )
        return text + f" backoffLimit ({limit}, {origin}) still caps all counted failures."
    if limit == 0:
        return (
            f"backoffLimit is 0 ({origin}): the first counted failure fails the Job "
            "(BackoffLimitExceeded). Ignored failures do not count."
        )
    return (
        f"backoffLimit is {limit} ({origin}): the Job is retried after up to {limit} "
        f"counted failure{'s' if limit != 1 else ''}, so it gets up to {limit + 1} attempts; "
        f"counted failure number {limit + 1} fails it (BackoffLimitExceeded). "
        "Failures an Ignore rule matches do not count and do not use up an attempt, "
        "however many there are."
    )


def _job_notes(view: JobSpecView) -> list[str]:
    notes = []
    limit, per_index, pod_policy = view.limit, view.per_index, view.pods
    parallelism, completions = view.parallelism, view.completions
    if per_index is None and (
        (isinstance(parallelism, int) and parallelism > 1)
        or (isinstance(completions, int) and completions > 1)
    ):
        notes.append(
            f"this Job runs {completions} completions, {parallelism} pods at a time; "
            "all its pods share one budget, and the attempt number is the Job's count "
            "of counted failures so far"
        )
    n, placement_limit = pod_policy.non_spot_attempts, pod_policy.backoff_limit
    if per_index is not None and n > 0 and placement_limit is not None:
        boundary = placement_limit + 1 - n
        if boundary > per_index:
            notes.append(
                f"non-spot-attempts counts against backoffLimit ({placement_limit}), not "
                f"backoffLimitPerIndex ({per_index}): an index fails before its attempt "
                f"reaches {boundary}, so no attempt runs on non-spot nodes"
            )
    if placement_limit is not None and n > 0 and per_index is None and placement_limit != limit:
        notes.append(
            f"the pod template's backoff-limit annotation is {placement_limit}, but pods "
            f"place themselves by the Job's backoffLimit ({limit}), read when each is created"
        )
    if n > 0 and per_index is None and view.placed_by_job and not view.on_failure:
        notes.append(
            "spec.backoffLimit may be changed while the Job runs: pods created after the "
            "change place the last attempts by the new value"
        )
    return notes


@dataclass
class JobState:
    """The Job controller's counters for one Job; a JobSet restart starts a fresh one."""

    #: Counted failures (``status.failed`` without the pods an Ignore rule matched).
    counted: int = 0
    #: The same, for the one simulated index (Jobs with ``backoffLimitPerIndex``).
    index_counted: int = 0
    #: restartPolicy OnFailure: container restarts of the running pod.
    restarts: int = 0
    #: restartPolicy OnFailure: the pod running now (a disrupted pod is replaced).
    pod: int = 1
    #: OOM kills so far per container (for oom-memory-factor; a JobSet's run keeps them).
    ooms: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PodOutcome:
    """What one failed pod does to its Job."""

    match: Match | None
    counted: bool
    #: The attempt the failed pod was (1-based), and allowed failures used after it.
    attempt: int
    used: int
    #: "rule 2 (FailJob)", "no rule matches", or "" when the kind has no rules at all.
    verdict: str
    #: The sentence after the verdict: what the Job does now.
    result: str
    #: Set when the Job (or, with a per-index budget, its index) has failed.
    ending: Ending | None = None
    #: The condition message the Job controller writes (JobSet rules may match it).
    message: str = ""
    #: The memory the next attempt's OOM-killed containers get ("" when none was).
    memory: str = ""


class JobSimulator:
    """The Job controller's bookkeeping for a sequence of failed pods.

    A failure an Ignore rule matches is not counted; any other (Count, FailJob, FailIndex,
    no match) is. FailJob fails the Job at once (reason PodFailurePolicy); otherwise the Job
    fails when counted failures exceed backoffLimit (BackoffLimitExceeded), checked in that
    order as in ``syncJob``. With backoffLimitPerIndex the events are one index's pods: a
    FailIndex match, or counted failures of the index exceeding the per-index limit, fail
    the index. With restartPolicy OnFailure, failed containers restart in place and the Job
    fails when restarts reach backoffLimit (``pastBackoffLimitOnFailure``).

    Controllers that count the same way under other names reuse it: ``owner`` is the kind
    that fails, ``fail_reason`` and ``limit_reason`` the reasons it then reports (a
    PyTorchJob reports PyTorchJobFailed for both), ``action_names`` renames rule actions
    for kinds whose rules are not a podFailurePolicy, ``unit`` is what one event fails
    ("pod", or "attempt" for a RayJob) and ``retry_where`` where the next attempt runs when
    placement does not apply ("on a new RayCluster"). ``replaced_pods_count`` False: with
    restartPolicy OnFailure, a pod that fails as a whole is replaced without counting (the
    training operator counts only restarts of running pods, unless the limit is 0).
    """

    def __init__(
        self,
        rules: Sequence[Any],
        backoff_limit: int,
        per_index: int | None,
        max_failed_indexes: int | None,
        placement_limit: int | None,
        non_spot_attempts: int,
        containers: Sequence[str],
        on_failure: bool = False,
        *,
        owner: str = "Job",
        fail_reason: str = "PodFailurePolicy",
        limit_reason: str = "BackoffLimitExceeded",
        action_names: Mapping[str, str] | None = None,
        unit: str = "pod",
        retry_where: str | None = None,
        failed_as: str = "condition Failed",
        limit_field: str | None = None,
        init: Sequence[str] = (),
        sidecars: Sequence[str] = (),
        memory: MemoryPlan | None = None,
        replaced_pods_count: bool = True,
    ):
        self.rules = list(rules)
        self.backoff_limit = backoff_limit
        self.per_index = per_index
        self.max_failed_indexes = max_failed_indexes
        self.placement_limit = placement_limit
        self.non_spot_attempts = non_spot_attempts
        self.containers = list(containers) or ["main"]
        self.on_failure = on_failure
        self.owner = owner
        self.fail_reason = fail_reason
        self.limit_reason = limit_reason
        self.action_names = dict(action_names or {})
        self.unit = unit
        self.retry_where = retry_where
        self.failed_as = failed_as
        self.limit_field = limit_field
        #: The pod's init containers (the controller reads their statuses last), and those
        #: of them that are native sidecars (stopped at pod shutdown).
        self.init = list(init)
        self.sidecars = list(sidecars)
        self.replaced_pods_count = replaced_pods_count
        #: What OOM-killed containers get in later attempts (``oom-memory-factor``).
        self.memory = memory

    def oom(self, state: JobState, event: Event) -> str:
        """Count the event's OOM kills; say the memory the next attempt's containers get."""
        if self.memory is None:
            return ""
        raised = []
        for name in event.oom_killed(self.main):
            state.ooms[name] = state.ooms.get(name, 0) + 1
            if name in self.memory.containers:
                raised.append(self.memory.text(name, state.ooms[name]))
        return ", ".join(raised)

    @property
    def main(self) -> str:
        return self.containers[0]

    @property
    def scope(self) -> str:
        if self.limit_field:
            return self.limit_field
        return "backoffLimitPerIndex" if self.per_index is not None else "backoffLimit"

    @property
    def limit(self) -> int:
        return self.per_index if self.per_index is not None else self.backoff_limit

    def action(self, match: Match) -> str:
        return self.action_names.get(match.action, match.action)

    def judge(self, event: Event) -> tuple[Match | None, bool]:
        """The rule a failure matches and whether it counts (the one shared evaluation)."""
        if self.on_failure and not event.disruption:
            return None, True
        match = failurepolicy.evaluate(self.rules, event.failure(self.main, self.init))
        return match, failurepolicy.counts(match)

    def verdict(self, event: Event) -> str:
        match, _ = self.judge(event)
        if self.on_failure and not event.disruption:
            return "the container restarts in place, counts"
        if match is None:
            rule = "no rule matches; " if self.rules else ""
            return f"{rule}retried, counts against {self.scope}"
        then = describe_then(match.action, self.scope).replace("the Job", f"the {self.owner}")
        return f"rule {match.index + 1} matches; {then} ({self.action(match)})"

    def example_events(self) -> list[Event]:
        """Common failures, and the first codes of the rules' ``In`` lists."""
        events = [
            Event("1", 1),
            Event("oom", SIGKILL),
            Event(str(SIGTERM), SIGTERM),
            Event("disruption", SIGTERM, disruption=True),
            # SIGKILL once the grace period is over: exit-code rules see 137.
            Event(f"disruption+{self.main}:{SIGKILL}", SIGKILL, self.main, disruption=True),
        ]
        for sidecar in self.sidecars[:1]:
            # A native sidecar stopped at shutdown: SIGKILL if it ignores SIGTERM.
            events.append(
                Event(f"{SIGTERM}+{sidecar}:{SIGKILL}", SIGTERM, None, False, ((sidecar, SIGKILL),))
            )
        seen = {(None, 1), (None, SIGKILL), (None, SIGTERM)}
        for rule in self.rules:
            codes = rule.get("onExitCodes") if isinstance(rule, dict) else None
            if not isinstance(codes, dict) or codes.get("operator") != "In":
                continue
            container = codes.get("containerName")
            container = container if container in self.containers else None
            for code in items(codes.get("values"))[:2]:
                if isinstance(code, int) and 0 < code < 256:
                    key = (container if container != self.main else None, code)
                    if key not in seen and len(events) < 9:
                        seen.add(key)
                        events.append(Event(str(code), code, key[0]))
        return events

    def examples(self) -> list[str]:
        """What common failures do, each judged like a real one."""
        return [f"{e.describe(self.main)}: {self.verdict(e)}" for e in self.example_events()]

    def placement(self, failures: int) -> str:
        return nodes_text(runs_non_spot(failures, self.placement_limit, self.non_spot_attempts))

    def _where(self, failures: int) -> str:
        return self.retry_where or on_nodes(self.placement(failures))

    def fail(
        self, state: JobState, event: Event, number: int, where: str | None = None
    ) -> PodOutcome:
        """One failed pod (event ``number``, 1-based): update ``state`` and say what the
        Job does; ``where`` says where the next attempt runs, when the Job's own placement
        does not decide it (a JobSet's pods are placed by run)."""
        if self.on_failure:
            return self._fail_on_failure(state, event)
        attempt = state.index_counted if self.per_index is not None else state.counted
        match, counts = self.judge(event)
        memory = self.oom(state, event)
        if counts:
            state.counted += 1
            state.index_counted += 1
        used = state.index_counted if self.per_index is not None else state.counted
        verdict = (
            f"rule {match.index + 1} ({self.action(match)})"
            if match
            else ("no rule matches" if self.rules else "")
        )
        ending, message, result = None, "", ""
        if match is not None and match.action == "FailJob":
            result = f"the {self.owner} fails at once"
            message = failjob_message(match)
            ending = Ending(
                "Failed",
                self.fail_reason,
                f"{self.unit} {number} matched {self.action(match)} rule {match.index + 1}",
            )
        elif state.counted > self.backoff_limit:
            result = f"counted, more than backoffLimit {self.backoff_limit}"
            message = "Job has reached the specified backoff limit"
            noun = "failed attempt" if self.unit == "attempt" else "counted failure"
            ending = Ending(
                "Failed",
                self.limit_reason,
                f"{count_of(state.counted, noun)}, more than backoffLimit {self.backoff_limit}",
            )
        elif self.per_index is not None and (
            (match is not None and match.action == "FailIndex") or state.index_counted > self.limit
        ):
            why = "FailIndex" if match and match.action == "FailIndex" else "per-index limit"
            result = f"the index fails ({why})"
            ending = self._index_failed(number, why)
            message = (
                "Job has exceeded the specified maximal number of failed indexes"
                if ending.state == "Failed"
                else "Job has failed indexes"
            )
        else:
            again = " again" if not counts else ""
            status = "counted (" if counts else "not counted (still "
            # With nothing allowed, only an ignored failure gets here: no tally to show.
            tally = f"{status}{self._tally(used)})" if self.limit else "not counted"
            result = f"{tally}; next: attempt {used + 1}{again}, {where or self._where(used)}"
            if memory:
                result += f", with {memory}"
        return PodOutcome(
            match, counts, attempt + 1, used, verdict, result, ending, message, memory
        )

    def _fail_on_failure(self, state: JobState, event: Event) -> PodOutcome:
        """restartPolicy OnFailure: restarts of the running pod count (>= backoffLimit, or
        > 0 when it is 0); a disrupted pod fails as a whole and its replacement starts
        with no restarts, while the failed pod counts in status.failed (> backoffLimit)."""
        limit = self.backoff_limit
        ending = None
        if event.disruption and not self.replaced_pods_count and limit > 0:
            state.restarts = 0
            state.pod += 1
            result = "the pod fails; not counted, its restarts are forgotten; next: a new pod"
        elif event.disruption:
            state.counted += 1
            state.restarts = 0
            state.pod += 1
            failed = count_of(state.counted, "failed pod")
            result = f"the pod fails; counted ({failed}); next: a new pod"
            if state.counted > limit:
                ending = Ending(
                    "Failed", self.limit_reason, f"{failed}, more than backoffLimit {limit}"
                )
        else:
            state.restarts += 1
            result = f"the container restarts in place ({count_of(state.restarts, 'restart')})"
            if state.restarts >= max(limit, 1):
                ending = Ending(
                    "Failed",
                    self.limit_reason,
                    f"{state.restarts} restarts reach backoffLimit {limit}",
                )
        message = "Job has reached the specified backoff limit" if ending else ""
        return PodOutcome(None, True, state.pod, state.restarts, "", result, ending, message)

    def run(self, events: Sequence[Event]) -> Simulation:
        state = JobState()

        def step(number: int, event: Event) -> tuple[Step, Ending | None]:
            before = state.index_counted if self.per_index is not None else state.counted
            pod = state.pod
            outcome = self.fail(state, event, number)
            made = Step(
                pod=pod if self.on_failure else number,
                attempt=number if self.on_failure else outcome.attempt,
                nodes="same pod" if self.on_failure else self.placement(before),
                event=event.token,
                what=event.describe(self.main),
                rule=outcome.match.index + 1 if outcome.match else None,
                action=outcome.match.action if outcome.match else None,
                counted=outcome.counted,
                counted_failures=outcome.used,
                result=lead(outcome.verdict, outcome.result),
            )
            return made, outcome.ending

        steps, ending, unused = walk(events, step)
        return Simulation(
            [e.token for e in events],
            steps,
            ending or self._running(state),
            unused,
            self.unit,
            self.failed_as,
        )

    def _tally(self, used: int) -> str:
        if self.limit >= INT32_MAX:  # no limit (a PyTorchJob without runPolicy.backoffLimit)
            return f"{count_of(used, 'failure')} so far, no limit"
        return f"{used} of {self.limit} allowed failures used"

    def _running(self, state: JobState) -> Ending:
        if self.on_failure:
            return Ending(
                "Running", None, f"the pod keeps running ({count_of(state.restarts, 'restart')})"
            )
        used = state.index_counted if self.per_index is not None else state.counted
        left = self.limit - used
        if self.limit >= INT32_MAX:
            allowed = "there is no limit"
        elif left:
            allowed = f"{left} more counted failure{'s are' if left != 1 else ' is'} allowed"
        else:
            allowed = "its failure, if counted, ends it"
        return Ending(
            "Running", None, f"attempt {used + 1} runs next, {self._where(used)}; {allowed}"
        )

    def _index_failed(self, pod: int, why: str) -> Ending:
        if self.max_failed_indexes is not None and 1 > self.max_failed_indexes:
            return Ending(
                "Failed",
                "MaxFailedIndexesExceeded",
                f"pod {pod} failed its index ({why}); maxFailedIndexes is "
                f"{self.max_failed_indexes}",
            )
        return Ending(
            "IndexFailed",
            "FailedIndexes",
            f"pod {pod} failed its index ({why}); the other indexes go on, and the Job "
            "fails with reason FailedIndexes when they are done",
        )


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


def lead(verdict: str, result: str) -> str:
    return f"{verdict}: {result}" if verdict else result


def failjob_message(match: Match) -> str:
    """The Job condition message the controller writes for a FailJob match (the text a
    JobSet's ``onJobFailureMessagePatterns`` are matched against); the pod's name is not
    known offline and is shown as ``<pod>``."""
    where = "<namespace>/<pod>"
    if match.container is not None:
        return (
            f"Container {match.container.name} for pod {where} failed with exit code "
            f"{match.container.exit_code} matching FailJob rule at index {match.index}"
        )
    return (
        f"Pod {where} has condition {match.condition} matching FailJob rule at index {match.index}"
    )


@explainer("batch", "Job")
def explain_job(subject: Subject) -> list[Explanation]:
    return [explain_job_spec(subject, ("spec",))]


# --- v1 Pod ------------------------------------------------------------------------------


@explainer("", "Pod")
def explain_pod(subject: Subject) -> list[Explanation]:
    """A Pod is not retried by Kubernetes: explain its own policy and where it runs."""
    item = subject.header()
    metadata = mapping(subject.final.get("metadata"))
    annotations = mapping(metadata.get("annotations"))
    policy = subject.policy("spec") or template_pod_policy(annotations)
    item.settings = setting_lines(policy, POD_KEYS)
    limit, n = policy.backoff_limit, policy.non_spot_attempts
    attempt, source = _pod_attempt(policy, annotations)
    item.budget = (
        "Kubernetes does not retry a Pod: whoever creates the next attempt (a Job, an "
        "orchestrator) decides. This pod places itself by its attempt number"
        + (f" ({attempt}, from {source})." if attempt is not None else f" ({source}).")
    )
    if limit is not None and n > 0:
        item.plan = build_plan(
            f"annotation {PREFIX}backoff-limit", limit, limit, n, "no retry left"
        )
        if attempt is not None:
            where = "non-spot nodes only" if runs_non_spot(attempt, limit, n) else "any node"
            item.notes.append(f"this pod is attempt {attempt + 1}: it runs on {where}")
    return [item]


def _pod_attempt(policy: Policy, annotations: Mapping[str, Any]) -> tuple[int | None, str]:
    if policy.attempt is not None:
        return policy.attempt, f"annotation {PREFIX}attempt"
    raw = annotations.get(INDEX_FAILURE_COUNT)
    if isinstance(raw, str):
        try:
            return parse_count(raw), f"annotation {INDEX_FAILURE_COUNT}"
        except BadValue:
            pass
    return None, "unknown offline: at admission it comes from the owning Job's failure count"


# --- rendering ---------------------------------------------------------------------------


def _fill(text: str, first: str = "", rest: str | None = None) -> list[str]:
    """Wrap to ``WIDTH``: ``first`` starts the first line, ``rest`` (default: as many
    spaces) the others."""
    rest = " " * len(first) if rest is None else rest
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence(text: str) -> str:
    return _cap(text) if text.endswith(".") else _cap(text) + "."


def render_text(items: Sequence[Explanation | Denial]) -> str:
    """Every line fits an 80-column terminal; sections read top to bottom as a story."""
    out: list[str] = []
    for item in items:
        if out:
            out.append("")
        if isinstance(item, Denial):
            out.extend(_render_denial(item))
        else:
            out.extend(_render(item))
    return "\n".join(out) + "\n"


def _title(item: Explanation | Denial) -> str:
    name = f"{item.namespace}/{item.name}" if item.namespace else item.name
    part = f" ({item.part})" if isinstance(item, Explanation) and item.part else ""
    return f"{item.kind} {name}{part}"


def _render_denial(item: Denial) -> list[str]:
    lines = _fill(f"{_title(item)}: retry-policy would deny it; fix these and run explain again:")
    for problem in item.problems:
        lines.extend(_fill(problem, "  - "))
    return lines


def _render(item: Explanation) -> list[str]:
    title = _title(item)
    lines = [*_fill(title), "=" * min(len(title), WIDTH)]
    if item.changes:
        lines += ["", "What the webhook changes:"]
        for change in item.changes:
            lines.extend(_fill(change, "  - "))
    if item.settings:
        lines += ["", "Retry settings and where each came from:"]
        for s in item.settings:
            lines.extend(_fill(f"{s.name:<21} {s.value:<9} {s.text}", "  ", " " * 34))
    if item.budget:
        lines += ["", *_fill(item.budget)]
    if item.rules or item.no_match:
        lines += [""]
        if item.rules:
            lines.extend(_fill(item.rules_intro))
        for rule in item.rules:
            text = f"{_cap(rule.when)}: {rule.then} ({rule.action}); {rule.origin}."
            lines.extend(_fill(text, f"  {rule.number}. "))
        if item.no_match:
            lines.extend(_fill(_sentence(item.no_match), "  -  " if item.rules else ""))
    if item.examples:
        lines += ["", "What common failures do:"]
        for example in item.examples:
            lines.extend(_fill(example, "  - "))
    if item.plan is not None:
        lines += ["", *_render_plan(item.plan)]
    if item.memory is not None:
        lines += ["", *_render_memory(item.memory)]
    if item.simulation is not None:
        lines += ["", *_render_simulation(item)]
    if item.notes:
        lines += ["", "Notes:"]
        for note in item.notes:
            lines.extend(_fill(note, "  - "))
    return lines


def _render_plan(plan: Plan) -> list[str]:
    head = f"Attempt plan ({plan.limit_field} {plan.limit}"
    head += (
        f", last {plan.non_spot_attempts} on non-spot nodes):" if plan.non_spot_attempts else "):"
    )
    lines = _fill(head)
    before = "restarts so far" if plan.unit == "run" else "failures so far"
    lines.append(f"  {plan.unit:<9}{before:<17}{'runs on':<15}if it fails (counted)")
    for row in plan.rows:
        if isinstance(row, PlanGap):
            lines.append(
                f"  {'...':<9}({plan.unit}s {row.first} to {row.last}: like the one above)"
            )
            continue
        lines.extend(
            _fill(
                f"{row.attempt:<9}{row.failures_before:<17}{row.nodes:<15}{row.if_fails}",
                "  ",
                " " * 43,
            )
        )
    return lines


def _render_memory(table: MemoryTable) -> list[str]:
    lines = _fill(
        f"Memory after OOM kills (oom-memory-factor {table.factor}, at most {table.limit}): "
        "the attempts after a container was OOM-killed N times get"
    )
    lines.append(f"  {'container':<20}{'N':<12}{'request':<12}limit")
    previous = None
    for row in table.rows:
        name = row.container if row.container != previous else ""
        previous = row.container
        kills = f"{row.kills} or more" if row.last else str(row.kills)
        lines.append(f"  {name:<20}{kills:<12}{row.request:<12}{row.limit}".rstrip())
    return lines


def _render_simulation(item: Explanation) -> list[str]:
    sim = item.simulation
    assert sim is not None
    owner = item.owner or item.kind
    lines = _fill(f"Simulation of {','.join(sim.events)}:")
    for step in sim.steps:
        lines.extend(
            _fill(f"{_step_label(sim, step)}: {step.what}. {_sentence(step.result)}", "  ", "    ")
        )
    if sim.unused:
        lines.extend(
            _fill(f"Not used (the {owner} had already ended): {','.join(sim.unused)}", "  ")
        )
    end = sim.ending
    if end.state == "Failed":
        text = f"Outcome: the {owner} fails; {sim.failed_as}, reason {end.reason} ({end.message})."
    elif end.state == "IndexFailed":
        text = f"Outcome: the index fails; {end.message}."
    else:
        text = f"Outcome: the {owner} is still running; {end.message}."
    return [*lines, *_fill(text)]


def _step_label(sim: Simulation, step: Step) -> str:
    if sim.unit == "attempt":
        return f"attempt {step.attempt}"
    if step.run is not None:
        return f"pod {step.pod} (run {step.run}, {step.nodes})"
    return f"pod {step.pod} (attempt {step.attempt}, {step.nodes})"


def to_json(items: Sequence[Explanation | Denial]) -> dict[str, Any]:
    """The same facts as the text, for tools."""
    return {"items": [_item_json(item) for item in items]}


def _item_json(item: Explanation | Denial) -> dict[str, Any]:
    base = {
        "kind": item.kind,
        "apiVersion": item.api_version,
        "namespace": item.namespace,
        "name": item.name,
    }
    if isinstance(item, Denial):
        return {**base, "allowed": False, "problems": item.problems, "changes": item.changes}
    plan = None
    if item.plan is not None:
        plan = {
            "limitField": item.plan.limit_field,
            "limit": item.plan.limit,
            "nonSpotAttempts": item.plan.non_spot_attempts,
            "rows": [
                _camel(dataclasses.asdict(r)) for r in item.plan.rows if isinstance(r, PlanRow)
            ],
            "omitted": [
                {"first": r.first, "last": r.last} for r in item.plan.rows if isinstance(r, PlanGap)
            ],
            "unit": item.plan.unit,
        }
    simulation = None
    if item.simulation is not None:
        sim = item.simulation
        simulation = {
            "events": sim.events,
            "steps": [_camel(dataclasses.asdict(s)) for s in sim.steps],
            "outcome": dataclasses.asdict(sim.ending),
            "unused": sim.unused,
            "unit": sim.unit,
            "failedAs": sim.failed_as,
        }
    memory = None
    if item.memory is not None:
        memory = {
            "factor": item.memory.factor,
            "limit": item.memory.limit,
            "rows": [_camel(dataclasses.asdict(r)) for r in item.memory.rows],
        }
    return {
        **base,
        "part": item.part,
        "owner": item.owner or item.kind,
        "memory": memory,
        "allowed": True,
        "changes": item.changes,
        "settings": [dataclasses.asdict(s) for s in item.settings],
        "budget": item.budget,
        "rulesIntro": item.rules_intro if item.rules else "",
        "rules": [dataclasses.asdict(r) for r in item.rules],
        "noMatch": item.no_match,
        "examples": item.examples,
        "plan": plan,
        "simulation": simulation,
        "notes": item.notes,
    }


def _camel(data: dict[str, Any]) -> dict[str, Any]:
    def convert(key: str) -> str:
        head, *rest = key.split("_")
        return head + "".join(part.title() for part in rest)

    return {convert(k): v for k, v in data.items()}


def _load_kinds() -> None:
    # Imported for their ``explainer`` side effect; kept last to avoid an import cycle.
    from webhook import explain_kinds  # noqa: F401


_load_kinds()
