"""What every mutator shares: the context it runs in, the outcome it reports, and the
policy it resolves from an object's annotations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.cluster.facts import ClusterFacts, NoCluster
from webhook.cluster.leadership import Clock
from webhook.cluster.runtimes import NoRuntimes, RuntimeSource
from webhook.kube.objects import controller_of
from webhook.kube.versions import KubeVersion
from webhook.policy.config import Config
from webhook.policy.model import (
    APPLIED,
    CARRIED_SOURCES,
    KEYS,
    PREFIX,
    Layer,
    Policy,
    Scope,
    Setting,
    Source,
    format_value,
    parse_annotations,
    resolve,
)
from webhook.problems import Problem


@dataclass
class Context:
    """What a mutator may consult besides the object: config, the cluster's facts (a Job's
    counted failures, failure history, LimitRanges, Nodes: ``ClusterFacts``) and the
    Kubeflow Trainer runtimes (a TrainJob's JobSet is made from one)."""

    config: Config
    cluster: ClusterFacts = field(default_factory=NoCluster)
    namespace: str | None = None
    operation: str = "CREATE"
    runtimes: RuntimeSource = field(default_factory=NoRuntimes)
    #: The cluster's version (the config's pin, else the API server's): what decides
    #: whether feature-gated fields may be written (``mutators.inplace``).
    kubernetes_version: KubeVersion | None = None
    #: A deadline outside the object that ends its in-place restarts, named: a TrainJob's,
    #: for the JobSet its controller makes (``mutators.trainjob`` checks it there).
    outer_bound: str | None = None
    #: Leadership and time, as a pod's retry-delay gate asks them
    #: (``webhook.cluster.leadership.Clock``; the engine records the answers).
    clock: Any = field(default_factory=Clock)

    def __post_init__(self) -> None:
        # Callers without a cluster may pass None for either source.
        if self.cluster is None:
            self.cluster = NoCluster()
        if self.runtimes is None:
            self.runtimes = NoRuntimes()


@dataclass(frozen=True)
class Change:
    """One change made to the object, with the setting that caused it."""

    text: str
    setting: Setting | None = None


@dataclass(frozen=True)
class Decision:
    """A decision that shapes a new pod of a workload, for the user: it becomes one Event
    regarding the workload (``webhook.cluster.events``; ``reason`` is one of its
    ``REASONS``), with a plain ``note`` naming the attempt."""

    reason: str
    note: str


@dataclass
class Outcome:
    problems: list[Problem] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The policy each spec was mutated with, after the spec was consulted (backoff limit
    #: resolved, settings a conflict skipped turned off), keyed by the spec's field path
    #: ("spec", "spec.jobTemplate.spec"). Not used by admission: ``explain`` reads it so
    #: that it shows the policy the webhook applied, not a second resolution of its own.
    policies: dict[str, Policy] = field(default_factory=dict)
    #: What failure-aware retries did, for metrics and the decision log: containers whose
    #: memory was raised (``memory_raised``), nodes avoided (``nodes_avoided``).
    actions: dict[str, int] = field(default_factory=dict)
    #: What a user should read on the workload (an Event each), in the order decided.
    decisions: list[Decision] = field(default_factory=list)

    def decided(self, reason: str, note: str) -> None:
        self.decisions.append(Decision(reason, note))

    def changed(self, text: str, setting: Setting | None = None) -> None:
        self.changes.append(Change(text, setting))

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def warnings(self) -> list[str]:
        return [c.text for c in self.changes] + self.notes

    def conflict(self, policy: Policy, name: str, message: str, reason: str) -> None:
        """A setting that cannot be honoured: deny it when the user asked for it by
        annotation; skip it with a warning when it came from an admin default (a
        default must never make an otherwise valid object fail)."""
        setting = policy.setting(name)
        if setting.source is Source.ANNOTATION:
            self.problems.append(Problem(f"annotation {PREFIX}{name}", message, reason))
        else:
            self.note(f"retry-policy: {name} ({setting.describe(name)}) skipped: {message}")


def policy_keys(metadata: Any) -> tuple[str, ...]:
    """The known keys of our annotations on an object, by short name, but ``applied``
    (what metrics count mutations by: never a user's string)."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return ()
    cut = len(PREFIX)
    return tuple(
        k[cut:]
        for k in annotations
        if isinstance(k, str) and k.startswith(PREFIX) and k[cut:] in KEYS and k != APPLIED
    )


def default_layers(metadata: Any, ctx: Context) -> list[Layer]:
    """The admin's layers (namespace override, cluster defaults) under an object's own
    annotations: none for an object a controller made (KubeRay's submitter Job, an MPI
    launcher Job, a Trainer TrainJob's JobSet). Such a controller chose that object's
    retry behaviour (KubeRay tries ``ray job submit`` three times), and a default written
    for what people submit would silently change it; the workload the person submitted
    got the defaults at its own admission (a TrainJob's JobSet takes those its TrainJob
    was admitted with, carried by annotation: ``carried_layers``). Annotations on the
    object itself still count."""
    return [] if controller_of(metadata) is not None else ctx.config.layers(ctx.namespace)


def affected_unannotated(metadata: Any, ctx: Context) -> bool:
    """Whether the admin's config changes or denies this object without annotations of
    its own: only when it has defaults or guard rails, and only for objects no
    controller made (``default_layers``)."""
    return ctx.config.affects_unannotated(ctx.namespace) and controller_of(metadata) is None


def has_policy_annotations(metadata: Any) -> bool:
    """The cheap test that lets the common case (no annotations of ours) skip all work."""
    if not isinstance(metadata, dict):
        return False
    annotations = metadata.get("annotations")
    return isinstance(annotations, dict) and any(
        isinstance(k, str) and k.startswith(PREFIX) for k in annotations
    )


#: Resolved policies: a workload's by (config, namespace, our annotations), a pod's by its
#: annotations. Jobs made from one template
#: (a CronJob, a pipeline) carry the same annotations, so resolution is done once; the
#: results are immutable (frozen Policy, Problems only read), hence safe to share.
_POLICIES: dict[tuple, tuple[Any, Policy, list[Problem]]] = {}
_POLICIES_MAX = 1024


def workload_policy(metadata: Any, ctx: Context) -> tuple[Policy, list[Problem]]:
    """Resolve a workload's policy: its annotations over namespace and cluster defaults."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    ours = _policy_items(annotations)

    controlled = controller_of(metadata) is not None

    def compute() -> tuple[Policy, list[Problem]]:
        values, problems = parse_annotations(annotations, Scope.WORKLOAD)
        if controlled:
            below = carried_layers(values, ctx.namespace)
        else:
            below = default_layers(metadata, ctx)
        return resolve([Layer(Source.ANNOTATION, values), *below]), problems

    key = (
        ("workload", id(ctx.config), ctx.namespace, controlled, ours) if ours is not None else None
    )
    return _cached(key, ctx.config, compute)


def carried_layers(values: dict[str, Any], namespace: str | None) -> list[Layer]:
    """The admin defaults an object's creator was admitted with (``retry-policy.dev/
    defaults``, written by the webhook: a TrainJob's, on the JobSet the trainer makes),
    as layers like the config's own (``Config.layers``). Only a controller-made object
    takes them, in place of the live config's, which do not apply to it
    (``default_layers``)."""
    carried = values.get("defaults")
    if not isinstance(carried, dict):
        return []
    sources = {"namespace": Source.NAMESPACE, "cluster": Source.CLUSTER}
    details = {"namespace": f"({namespace})", "cluster": ""}
    return [
        Layer(sources[name], carried[name], details[name])
        for name in CARRIED_SOURCES
        if carried.get(name)
    ]


def pod_policy(annotations: Any) -> tuple[Policy, list[Problem]]:
    """A pod's policy: its own annotations only (copied there from its workload's
    template), resolved once per distinct set, as ``workload_policy`` does."""
    ours = _policy_items(annotations)

    def compute() -> tuple[Policy, list[Problem]]:
        values, problems = parse_annotations(annotations, Scope.POD)
        return resolve([Layer(Source.ANNOTATION, values)]), problems

    return _cached(("pod", ours) if ours is not None else None, None, compute)


def _cached(
    key: tuple | None, pin: Any, compute: Callable[[], tuple[Policy, list[Problem]]]
) -> tuple[Policy, list[Problem]]:
    """``compute()``, once per key. ``pin`` is kept in the entry (the config whose id is in
    the key, so the id cannot be reused while cached) and must be the same on a hit."""
    hit = _POLICIES.get(key) if key is not None else None
    if hit is not None and hit[0] is pin:
        return hit[1], list(hit[2])
    policy, problems = compute()
    if key is not None:
        if len(_POLICIES) >= _POLICIES_MAX:
            _POLICIES.clear()
        _POLICIES[key] = (pin, policy, list(problems))
    return policy, problems


def _policy_items(annotations: Any) -> tuple | None:
    """Our annotations as a hashable key (``None``: not cacheable, e.g. odd value types)."""
    if not isinstance(annotations, dict):
        return ()
    items = tuple(
        sorted(
            (k, v) for k, v in annotations.items() if isinstance(k, str) and k.startswith(PREFIX)
        )
    )
    if all(isinstance(v, str) for _, v in items):
        return items
    return None


def applied_record(policy: Policy) -> str:
    """The compact, deterministic record written to ``retry-policy.dev/applied``."""
    record: dict[str, Any] = {}
    if policy.backoff_limit is not None:
        record["backoffLimit"] = policy.backoff_limit
    if policy.fail_non_retriable:
        record["failNonRetriable"] = list(policy.retriable_exit_codes)
        if policy.on_non_retriable != "fail-job":
            record["onNonRetriable"] = policy.on_non_retriable
        if policy.count_disruptions:
            record["countDisruptions"] = True
    if policy.ignore_disruptions:
        record["ignoreDisruptions"] = True
    if policy.non_spot_attempts:
        record["nonSpotAttempts"] = policy.non_spot_attempts
    if policy.error_propagation:
        record["errorPropagation"] = policy.error_propagation
    factor, limit = policy.oom_memory_factor, policy.oom_memory_limit
    if factor is not None and limit is not None:
        record["oomMemoryFactor"] = format_value("oom-memory-factor", factor)
        record["oomMemoryLimit"] = str(limit)
    if policy.avoid_failed_nodes:
        record["avoidFailedNodes"] = True
    if policy.in_place_exit_codes:
        record["inPlaceExitCodes"] = list(policy.in_place_exit_codes)
        record["inPlaceScope"] = policy.in_place_scope
        if policy.max_in_place_restarts is not None:
            record["maxInPlaceRestarts"] = policy.max_in_place_restarts
    if policy.ignore_disruptions and policy.max_disruptions is not None:
        record["maxDisruptions"] = policy.max_disruptions
    if policy.peer_disruptions is not None:
        record["peerDisruptions"] = policy.peer_disruptions
    if policy.attempt_env:
        record["attemptEnv"] = True
    if policy.retry_delay is not None:
        record["retryDelay"] = format_value("retry-delay", policy.retry_delay)
        if policy.retry_delay_factor != 1:
            record["retryDelayFactor"] = format_value(
                "retry-delay-factor", policy.retry_delay_factor
            )
        if policy.retry_delay_max is not None:
            record["retryDelayMax"] = format_value("retry-delay-max", policy.retry_delay_max)
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()
