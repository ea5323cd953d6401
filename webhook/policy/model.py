"""The policy model: the annotation vocabulary and resolution.

Annotations are the user interface of this project: each key names one strict grammar
(``policy.grammar``) and where it may be written. Resolution layers the sources in the
documented precedence (annotation > namespace override > cluster default > Kubernetes
default) and keeps the source of every setting, so warnings and ``explain`` can say *why*
a value was chosen.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import Any

from webhook.kube import quantity
from webhook.policy.categories import format_names, parse_names
from webhook.policy.grammar import (
    MAX_DELAY_SECONDS,
    BadValue,
    format_duration,
    format_factor,
    parse_any,
    parse_bool,
    parse_count,
    parse_delay_factor,
    parse_duration,
    parse_exit_codes,
    parse_factor,
    parse_in_place_codes,
    parse_in_place_scope,
    parse_memory,
    parse_on_non_retriable,
    parse_peer_disruptions,
    parse_restart_budget,
    parse_start_deadline,
    parse_strategy,
    parse_time,
)
from webhook.problems import Problem

PREFIX = "retry-policy.dev/"

#: Exit code Kubernetes reports for a container stopped by SIGTERM (128 + 15): what
#: preemption, node maintenance and drains deliver. Retrying it is the safe default.
DEFAULT_RETRIABLE_EXIT_CODES: tuple[int, ...] = (143,)


class Scope(str, Enum):
    """Where a key may be written: on a workload (Job, JobSet...), or on a Pod."""

    WORKLOAD = "workload"
    POD = "pod"


class Source(str, Enum):
    """Where a resolved setting came from, in precedence order (first wins)."""

    ANNOTATION = "annotation"
    SPEC = "your spec"
    NAMESPACE = "namespace default"
    CLUSTER = "cluster default"
    KUBERNETES = "Kubernetes default"
    BUILTIN = "built-in default"


#: Where carried defaults came from (``defaults`` annotation), in precedence order.
CARRIED_SOURCES = ("namespace", "cluster")


def parse_carried_defaults(text: str) -> dict[str, dict[str, Any]]:
    """``{"namespace": {"backoff-limit": "2"}, "cluster": {...}}``: the admin defaults of a
    workload whose controller makes the object carrying this annotation (a TrainJob's
    JobSet), in annotation grammar, so the object is judged with the defaults its creator
    was admitted with, and a default still counts as one (skipped, not denied, when it
    cannot apply)."""
    accepted = (
        'accepted: a JSON object such as {"cluster": {"backoff-limit": "3"}} (namespace and '
        "cluster, each mapping keys that admins may default to their annotation values)"
    )
    try:
        data = json.loads(text)
    except ValueError:
        raise BadValue(accepted) from None
    if not isinstance(data, dict) or not set(data) <= set(CARRIED_SOURCES):
        raise BadValue(accepted)
    carried: dict[str, dict[str, Any]] = {}
    for source, values in data.items():
        if not isinstance(values, dict):
            raise BadValue(accepted)
        parsed: dict[str, Any] = {}
        for name, raw in values.items():
            spec = KEYS.get(name)
            if spec is None or not spec.settable_default or not isinstance(raw, str):
                raise BadValue(f"{name!r} is not a default; {accepted}")
            try:
                parsed[name] = spec.parse(raw)
            except BadValue as err:
                raise BadValue(f"{name}: {_quote(raw)} is not valid; {err}") from None
        carried[source] = parsed
    return carried


@dataclass(frozen=True)
class KeySpec:
    """One annotation key: its grammar, where it may appear, and what it means."""

    name: str
    parse: Callable[[str], Any]
    scopes: frozenset[Scope]
    summary: str
    #: False for keys this webhook writes itself (never taken as a cluster default).
    settable_default: bool = True

    @property
    def annotation(self) -> str:
        return PREFIX + self.name


_BOTH = frozenset({Scope.WORKLOAD, Scope.POD})

KEYS: dict[str, KeySpec] = {
    spec.name: spec
    for spec in (
        KeySpec(
            "fail-non-retriable",
            parse_bool,
            frozenset({Scope.WORKLOAD}),
            "fail the Job at once on an exit code outside the retriable set",
        ),
        KeySpec(
            "retriable-exit-codes",
            parse_exit_codes,
            frozenset({Scope.WORKLOAD}),
            "exit codes that are retried (default 143, SIGTERM)",
        ),
        KeySpec(
            "on-non-retriable",
            parse_on_non_retriable,
            frozenset({Scope.WORKLOAD}),
            "fail-job (default), or fail-index: a non-retriable exit fails only its index",
        ),
        KeySpec("backoff-limit", parse_count, _BOTH, "failed attempts allowed before giving up"),
        KeySpec(
            "ignore-disruptions",
            parse_bool,
            frozenset({Scope.WORKLOAD}),
            "preemptions and drains do not consume the retry budget",
        ),
        KeySpec(
            "max-disruptions",
            parse_count,
            frozenset({Scope.WORKLOAD}),
            "with ignore-disruptions: the first N disruptions are free, later ones count",
        ),
        KeySpec(
            "peer-disruptions",
            parse_peer_disruptions,
            frozenset({Scope.WORKLOAD}),
            "ignore or count: what the failures of a disrupted pod's running peers do",
        ),
        KeySpec(
            "non-spot-attempts", parse_count, _BOTH, "the last N attempts run on non-spot nodes"
        ),
        KeySpec(
            "error-propagation",
            parse_strategy,
            _BOTH,
            "earliest: report the error of the worker that failed first",
        ),
        KeySpec(
            "oom-memory-factor",
            parse_factor,
            _BOTH,
            "after an OOM kill, a container gets factor times the memory it was killed at",
        ),
        KeySpec(
            "oom-memory-limit",
            parse_memory,
            _BOTH,
            "the most memory oom-memory-factor may give a container",
        ),
        KeySpec(
            "avoid-failed-nodes",
            parse_bool,
            _BOTH,
            "each new attempt avoids the nodes where earlier attempts failed",
        ),
        KeySpec(
            "in-place-exit-codes",
            parse_in_place_codes,
            _BOTH,
            "exit codes on which a container restarts where it runs, without a new pod",
        ),
        KeySpec(
            "in-place-scope",
            parse_in_place_scope,
            _BOTH,
            "container (default), or pod: an in-place exit code restarts the whole pod",
        ),
        KeySpec(
            "attempt-env",
            parse_bool,
            _BOTH,
            "every container gets RETRY_POLICY_ATTEMPT, RETRY_POLICY_MAX_ATTEMPTS and "
            "RETRY_POLICY_LAST_FAILURE",
        ),
        KeySpec(
            "retry-delay",
            parse_duration,
            _BOTH,
            "a retry waits this long after the failure before it is scheduled (30s, 5m, 1h)",
        ),
        KeySpec(
            "retry-delay-factor",
            parse_delay_factor,
            _BOTH,
            "each further retry waits this many times longer (default 1: the same)",
        ),
        KeySpec(
            "retry-delay-max",
            parse_duration,
            _BOTH,
            "the longest a retry waits (retry-delay-factor grows the delay up to it)",
        ),
        KeySpec(
            "not-before",
            parse_time,
            frozenset({Scope.POD}),
            "written by the webhook on a pod it holds back (retry-delay): when it may be scheduled",
            settable_default=False,
        ),
        KeySpec(
            "max-in-place-restarts",
            parse_restart_budget,
            frozenset({Scope.WORKLOAD}),
            "with in-place-exit-codes: a pod is replaced after N restarts in place in all",
        ),
        KeySpec(
            "free-categories",
            parse_names,
            frozenset({Scope.WORKLOAD}),
            "failures of these categories do not use up the retry budget (DeviceFault,...)",
        ),
        KeySpec(
            "max-free-failures",
            parse_count,
            frozenset({Scope.WORKLOAD}),
            "with free-categories: the first N free failures are free, later ones count",
        ),
        KeySpec(
            "fail-categories",
            parse_names,
            frozenset({Scope.WORKLOAD}),
            "a failure of these categories fails the Job (or its index) at once",
        ),
        KeySpec(
            "start-deadline",
            parse_start_deadline,
            frozenset({Scope.WORKLOAD}),
            "a pod not started this long after its creation is ended and classified (15m)",
        ),
        KeySpec(
            "jobset-uid",
            parse_any,
            frozenset({Scope.POD}),
            "written by earlier versions on a JobSet's pod templates; ignored (JobSet's own "
            "jobset.sigs.k8s.io/jobset-uid pod label ties a set's pods together)",
            settable_default=False,
        ),
        KeySpec(
            "attempt",
            parse_count,
            frozenset({Scope.POD}),
            "a Pod's attempt number (failures so far), set by an orchestrator",
            settable_default=False,
        ),
        KeySpec(
            "applied",
            parse_any,
            _BOTH,
            "written by the webhook: what it applied",
            settable_default=False,
        ),
        KeySpec(
            "audit",
            parse_any,
            frozenset({Scope.WORKLOAD}),
            "written by the webhook under rollout: audit: what the admin defaults would have "
            "applied (webhook.plan.audit)",
            settable_default=False,
        ),
        KeySpec(
            "history",
            parse_any,
            _BOTH,
            "written by the controller: the workload's failure history (webhook.cluster.record)",
            settable_default=False,
        ),
        KeySpec(
            "defaults",
            parse_carried_defaults,
            frozenset({Scope.WORKLOAD}),
            "written by the webhook: the admin defaults a TrainJob was admitted with, "
            "carried to the JobSet its controller makes",
            settable_default=False,
        ),
    )
}


#: Annotation written by the webhook to record what it applied; users do not set it.
APPLIED = PREFIX + "applied"


def did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else ""


def parse_annotations(
    annotations: Mapping[str, Any] | None, scope: Scope, where: str = "annotation"
) -> tuple[dict[str, Any], list[Problem]]:
    """Parse every ``retry-policy.dev/`` annotation; unknown keys and bad values are problems.

    Returns the parsed values keyed by short name (``backoff-limit``) and the problems.
    """
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    if not annotations or not isinstance(annotations, Mapping):  # none, or not a mapping
        return values, problems
    for key, raw in annotations.items():
        if not isinstance(key, str) or not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX) :]
        spec = KEYS.get(name)
        if spec is None:
            known = [s.name for s in KEYS.values() if scope in s.scopes and s.settable_default]
            if scope is Scope.POD:
                known.append("attempt")
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = (
                f"did you mean {PREFIX}{close[0]}?"
                if close
                else "known keys: " + ", ".join(PREFIX + k for k in known)
            )
            problems.append(Problem(f"{where} {key}", f"unknown key; {hint}", "unknown-key"))
            continue
        if scope not in spec.scopes:
            other = "Pods" if Scope.POD in spec.scopes else "workloads (Job, JobSet, ...)"
            problems.append(Problem(f"{where} {key}", f"applies to {other} only", "wrong-scope"))
            continue
        if not isinstance(raw, str):
            problems.append(Problem(f"{where} {key}", "annotation values must be strings"))
            continue
        try:
            values[name] = spec.parse(raw)
        except BadValue as err:
            problems.append(
                Problem(f"{where} {key}", f"{_quote(raw)} is not valid; {err}", "bad-value")
            )
    return values, problems


def _quote(raw: str, limit: int = 40) -> str:
    """Quote a user value for a message: bounded, and with control characters escaped."""
    shown = raw if len(raw) <= limit else raw[:limit] + "..."
    return repr(shown).replace("\\\\", "\\")


@dataclass(frozen=True)
class Setting:
    """A resolved value and where it came from (for warnings and ``explain``)."""

    value: Any
    source: Source
    detail: str = ""

    def describe(self, name: str = "") -> str:
        """Where the value came from, for messages: ``annotation retry-policy.dev/x``."""
        if self.source is Source.ANNOTATION and name:
            return f"annotation {PREFIX}{name}"
        return f"{self.source.value} {self.detail}".strip()


@dataclass(frozen=True)
class Layer:
    """One source of values (annotations, a namespace override, the cluster defaults)."""

    source: Source
    values: Mapping[str, Any]
    detail: str = ""


#: Every setting's value when nothing sets it, which is also the value that turns it off.
BUILTIN: dict[str, Any] = {
    "fail-non-retriable": False,
    "retriable-exit-codes": DEFAULT_RETRIABLE_EXIT_CODES,
    "on-non-retriable": "fail-job",
    "backoff-limit": None,
    "ignore-disruptions": False,
    "non-spot-attempts": 0,
    "error-propagation": None,
    "oom-memory-factor": None,
    "oom-memory-limit": None,
    "avoid-failed-nodes": False,
    "in-place-exit-codes": None,
    "in-place-scope": "container",
    "max-disruptions": None,
    "max-in-place-restarts": None,
    "peer-disruptions": None,
    "attempt": None,
    "attempt-env": False,
    "retry-delay": None,
    "retry-delay-factor": Fraction(1),
    "retry-delay-max": None,
    "free-categories": None,
    "max-free-failures": None,
    "fail-categories": None,
    "start-deadline": None,
    # Not an annotation: see ``Policy.count_disruptions``.
    "count-disruptions": None,
}


@dataclass(frozen=True)
class Policy:
    """The resolved retry policy of one object, every setting with its provenance.

    ``settings`` holds every key of ``BUILTIN`` (``resolve`` makes them so) and is never
    changed once the policy is made (a change is a new policy: ``with_setting``). The
    values the checks read of it, typed (``fail_non_retriable``, ...), are read from it
    once, as the policy is made: a policy run reads them some hundred times, and a
    property each time cost a twentieth of a worst-case admission (Python 3.11 calls a
    property's getter as a new call from C, at some ten times an attribute's cost)."""

    settings: Mapping[str, Setting] = field(default_factory=lambda: dict(_BUILTIN_SETTINGS))
    fail_non_retriable: bool = field(init=False, repr=False, compare=False)
    retriable_exit_codes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: ``fail-job`` or ``fail-index``: what the non-retriable rule fails.
    on_non_retriable: str = field(init=False, repr=False, compare=False)
    backoff_limit: int | None = field(init=False, repr=False, compare=False)
    ignore_disruptions: bool = field(init=False, repr=False, compare=False)
    #: Whether ``fail-non-retriable`` puts its Count rule on DisruptionTarget before
    #: its exit-code rules (``failurepolicy.count_disruptions_rule``). Not with
    #: ``ignore-disruptions``, whose Ignore rule takes disrupted pods first. The setting
    #: behind it is never an annotation: unset (``None``) until a JobSpec's own rules are
    #: read (``kinds.jobspec.resolve_count``; kinds without a podFailurePolicy never get
    #: it), ``False`` to restore a JobSet made before this rule existed.
    count_disruptions: bool = field(init=False, repr=False, compare=False)
    non_spot_attempts: int = field(init=False, repr=False, compare=False)
    error_propagation: str | None = field(init=False, repr=False, compare=False)
    attempt: int | None = field(init=False, repr=False, compare=False)
    oom_memory_factor: Fraction | None = field(init=False, repr=False, compare=False)
    oom_memory_limit: quantity.Quantity | None = field(init=False, repr=False, compare=False)
    avoid_failed_nodes: bool = field(init=False, repr=False, compare=False)
    #: Exit codes that restart in place (empty: none).
    in_place_exit_codes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    in_place_scope: str = field(init=False, repr=False, compare=False)
    attempt_env: bool = field(init=False, repr=False, compare=False)
    #: Seconds the first retry waits after its failure (``None``: no delay).
    retry_delay: int | None = field(init=False, repr=False, compare=False)
    retry_delay_max: int | None = field(init=False, repr=False, compare=False)
    #: Free disruptions (``None``: every disruption is free with ignore-disruptions).
    max_disruptions: int | None = field(init=False, repr=False, compare=False)
    max_in_place_restarts: int | None = field(init=False, repr=False, compare=False)
    #: ``ignore`` or ``count``: the rule on a disrupted pod's peers (``None``: none).
    peer_disruptions: str | None = field(init=False, repr=False, compare=False)
    #: Categories whose failures are free (``Ignore``; empty: none).
    free_categories: tuple[str, ...] = field(init=False, repr=False, compare=False)
    max_free_failures: int | None = field(init=False, repr=False, compare=False)
    #: Categories whose failures fail the Job or index at once (empty: none).
    fail_categories: tuple[str, ...] = field(init=False, repr=False, compare=False)
    #: Seconds a pod may take to start (``None``: no deadline).
    start_deadline: int | None = field(init=False, repr=False, compare=False)
    #: Whether pods learn from earlier attempts (more memory, other nodes).
    failure_aware: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = self.settings
        fail_non_retriable = bool(s["fail-non-retriable"].value)
        ignore_disruptions = bool(s["ignore-disruptions"].value)
        oom_memory_factor = s["oom-memory-factor"].value
        avoid_failed_nodes = bool(s["avoid-failed-nodes"].value)
        max_disruptions = s["max-disruptions"].value
        max_in_place_restarts = s["max-in-place-restarts"].value
        max_free_failures = s["max-free-failures"].value
        # The instance's dict made at once: a frozen dataclass's ``object.__setattr__``
        # for each would cost more than the properties did.
        object.__setattr__(
            self,
            "__dict__",
            {
                "settings": s,
                "fail_non_retriable": fail_non_retriable,
                "retriable_exit_codes": tuple(s["retriable-exit-codes"].value),
                "on_non_retriable": str(s["on-non-retriable"].value),
                "backoff_limit": s["backoff-limit"].value,
                "ignore_disruptions": ignore_disruptions,
                "count_disruptions": (
                    fail_non_retriable
                    and not ignore_disruptions
                    and s["count-disruptions"].value is True
                ),
                "non_spot_attempts": int(s["non-spot-attempts"].value),
                "error_propagation": s["error-propagation"].value,
                "attempt": s["attempt"].value,
                "oom_memory_factor": oom_memory_factor,
                "oom_memory_limit": s["oom-memory-limit"].value,
                "avoid_failed_nodes": avoid_failed_nodes,
                "in_place_exit_codes": tuple(s["in-place-exit-codes"].value or ()),
                "in_place_scope": str(s["in-place-scope"].value),
                "attempt_env": bool(s["attempt-env"].value),
                "retry_delay": s["retry-delay"].value,
                "retry_delay_max": s["retry-delay-max"].value,
                "max_disruptions": max_disruptions if isinstance(max_disruptions, int) else None,
                "max_in_place_restarts": (
                    max_in_place_restarts if isinstance(max_in_place_restarts, int) else None
                ),
                "peer_disruptions": s["peer-disruptions"].value,
                "free_categories": tuple(s["free-categories"].value or ()),
                "max_free_failures": max_free_failures
                if isinstance(max_free_failures, int)
                else None,
                "fail_categories": tuple(s["fail-categories"].value or ()),
                "start_deadline": s["start-deadline"].value,
                "failure_aware": oom_memory_factor is not None or avoid_failed_nodes,
            },
        )

    def value(self, name: str) -> Any:
        return self.settings[name].value

    def setting(self, name: str) -> Setting:
        return self.settings[name]

    @property
    def retry_delay_factor(self) -> Fraction:
        return Fraction(self.settings["retry-delay-factor"].value)

    def delay_seconds(self, failures: int, rail: int | None = None) -> int:
        """What the pod after ``failures`` counted failures waits (``retry_delays``)."""
        return retry_delays(self, rail).seconds(failures)

    def asks(self, name: str) -> bool:
        """Whether the setting is on: not its off value (``BUILTIN``). A setting whose off
        value is ``None`` is on with any value, 0 included (``max-disruptions: 0``)."""
        value = self.settings[name].value
        return value is not None if BUILTIN[name] is None else bool(value)

    def explicit(self, name: str) -> bool:
        """True when the setting came from somewhere other than a built-in default."""
        return self.settings[name].source is not Source.BUILTIN

    @property
    def active(self) -> bool:
        """Whether this policy asks for any change at all (the common case is: no)."""
        return (
            self.fail_non_retriable
            or self.ignore_disruptions
            or self.settings["backoff-limit"].source
            in (Source.ANNOTATION, Source.NAMESPACE, Source.CLUSTER)
            or self.non_spot_attempts > 0
            or self.error_propagation is not None
            or self.failure_aware
            or bool(self.in_place_exit_codes)
            or self.attempt_env
            or self.retry_delay is not None
            or self.peer_disruptions is not None
            or bool(self.free_categories)
            or bool(self.fail_categories)
            or self.start_deadline is not None
        )


def resolve(layers: list[Layer]) -> Policy:
    """Pick, for every key, the value of the first layer that sets it."""
    # Every key's built-in setting (a copy at C speed), then what the layers set, the
    # last layer first, so that the first one to set a key writes it last. Keys stay in
    # ``BUILTIN``'s order; only the few keys a layer sets are visited (one loop over every
    # key and layer was a fifth of resolving a Job's few annotations).
    settings: dict[str, Setting] = dict(_BUILTIN_SETTINGS)
    for layer in reversed(layers):
        for name, value in layer.values.items():
            if name in settings:
                settings[name] = Setting(value, layer.source, layer.detail)
    return Policy(settings)


#: The setting of every key that no layer sets: made once and shared (a Setting is
#: immutable), where a policy with a few annotations made some 20 on each resolution.
_BUILTIN_SETTINGS = {name: Setting(value, Source.BUILTIN) for name, value in BUILTIN.items()}


def with_setting(policy: Policy, name: str, setting: Setting) -> Policy:
    """A copy of ``policy`` with one setting replaced (used once the spec is consulted)."""
    settings = dict(policy.settings)
    settings[name] = setting
    return Policy(settings)


def format_value(name: str, value: Any) -> str:
    """Render a value back in annotation grammar (the inverse of the key's parser)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if name == "retriable-exit-codes":
        return ",".join(str(code) for code in value)
    if name == "in-place-exit-codes":
        return "none" if not value else ",".join(str(code) for code in value)
    if name == "error-propagation":
        return "none" if value is None else str(value).lower()
    if name == "oom-memory-factor":
        return "none" if value is None else format_factor(value)
    if name == "retry-delay-factor":
        return format_factor(Fraction(value))
    if name in ("retry-delay", "retry-delay-max"):
        return format_duration(value)
    if name == "peer-disruptions":
        return "none" if value is None else str(value)
    if name in ("free-categories", "fail-categories"):
        return format_names(value)
    if name == "start-deadline":
        return format_duration(value)
    return str(value)


@dataclass(frozen=True)
class Delays:
    """``retry-delay`` arithmetic: the pod after n >= 1 counted failures waits
    ``first x factor^(n-1)`` seconds (rounded up), at most ``cap``; the first pod, none."""

    first: int
    factor: Fraction
    cap: int

    def seconds(self, failures: int) -> int:
        if failures <= 0 or self.first <= 0:
            return 0
        if self.factor == 1:
            return min(self.first, self.cap)
        growth = math.log(self.cap / self.first) / math.log(self.factor)
        if failures - 1 > growth + 1:  # past the cap by far: no need to compute it
            return self.cap
        value = self.first * float(self.factor) ** (failures - 1)
        return min(math.ceil(round(value, 6)), self.cap)

    def total(self, failures: int) -> int:
        """What the pods after 1..``failures`` failures wait in all (a Job's deadline runs
        meanwhile)."""
        total, n = 0, 1
        while n <= failures:
            wait = self.seconds(n)
            if wait >= self.cap:  # every later pod waits the cap
                return total + wait * (failures - n + 1)
            total += wait
            n += 1
        return total


def retry_delays(policy: Policy, rail: int | None = None) -> Delays:
    """The delays of ``policy``, capped by ``retry-delay-max``, the guard rail ``rail``
    (``guardRails.maxRetryDelay``) and ``MAX_DELAY_SECONDS``; no delay without
    ``retry-delay``."""
    first = policy.retry_delay or 0
    cap = min(x for x in (policy.retry_delay_max, rail, MAX_DELAY_SECONDS) if x is not None)
    return Delays(min(first, cap), policy.retry_delay_factor, cap)
