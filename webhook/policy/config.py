"""Cluster defaults and guard rails set by admins, loaded from one YAML file.

The file is parsed once (at start, and again on reload), never per request: the
admission hot path only reads the frozen ``Config``. Every problem in the file is
collected and reported together, and the loader never constructs arbitrary objects
(``yaml.safe_load`` only).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from webhook.kube import quantity
from webhook.kube.versions import KubeVersion
from webhook.policy import categories as cats
from webhook.policy import kueue as kq
from webhook.policy.grammar import BadValue, format_duration, parse_duration, parse_memory
from webhook.policy.model import KEYS, Layer, Source, did_you_mean
from webhook.problems import Problem

#: Spot/preemptible node labels by provider, as each one's source gives them: GKE's
#: (``hasPreemptiblePricing``, kubernetes/autoscaler
#: cluster-autoscaler/cloudprovider/gce/gce_price_model.go), EKS managed node groups'
#: (awsdocs/amazon-eks-user-guide doc_source/managed-node-groups.md, "capacity types"),
#: Karpenter's (``CapacityTypeLabelKey``, ``CapacityTypeSpot``: kubernetes-sigs/karpenter
#: pkg/apis/v1/labels.go), AKS spot node pools' (MicrosoftDocs/azure-aks-docs
#: articles/aks/spot-node-pool.md). A node without the label is not spot, which is why
#: non-spot placement uses ``NotIn`` rather than ``In``.
DEFAULT_SPOT_NODE_LABELS: dict[str, tuple[str, ...]] = {
    "cloud.google.com/gke-spot": ("true",),
    "cloud.google.com/gke-preemptible": ("true",),
    "eks.amazonaws.com/capacityType": ("SPOT",),
    "karpenter.sh/capacity-type": ("spot",),
    "kubernetes.azure.com/scalesetpriority": ("spot",),
}

#: Whose pod deletions are disruptions (``disruptors``): the users and groups that
#: delete pods to reclaim or drain nodes without the Eviction API, so that the pod gets
#: no ``DisruptionTarget`` condition (Karpenter's forced termination: kubernetes#141316,
#: karpenter#3218). Karpenter's Helm chart names its ServiceAccount after the release
#: (``karpenter.serviceAccountName``: the fullname, ``karpenter`` for the release its docs
#: install) in the release's namespace, ``kube-system`` in its current docs and
#: ``karpenter`` in older ones; its ClusterRole grants ``pods`` ``delete``. The cluster
#: autoscaler's example manifests (cloudprovider/aws/examples in kubernetes/autoscaler)
#: run it as ``cluster-autoscaler`` in ``kube-system``; it drains by eviction, so only a
#: deletion it is granted (none in those manifests) counts.
DEFAULT_DISRUPTOR_USERS: tuple[str, ...] = (
    "system:serviceaccount:kube-system:karpenter",
    "system:serviceaccount:karpenter:karpenter",
    "system:serviceaccount:kube-system:cluster-autoscaler",
)

_TOP_KEYS = (
    "defaults",
    "guardRails",
    "spotNodeLabels",
    "namespaces",
    "kubernetesVersion",
    "disruptors",
    "kueue",
    "rollout",
    "categories",
    "categoryConditions",
)
_DISRUPTOR_KEYS = ("users", "groups")
_NS_KEYS = ("defaults", "guardRails", "rollout")
#: ``rollout``: whether the admin defaults are applied (``enforce``), or only recorded on
#: the workloads they would have changed (``audit``: ``webhook.plan.audit``).
ENFORCE, AUDITED = "enforce", "audit"
ROLLOUTS = (ENFORCE, AUDITED)
#: ``categoryConditions``: which failed pods carry their category as a condition. One
#: ``pods/status`` write a failed pod is a third of the controller's budget of writes
#: (docs/SCALE.md), so by default only where a rule reads the condition (``WhenRead``);
#: ``Always`` writes it on every failed pod of a workload with a plan, for other tools.
WHEN_READ, ALWAYS = "WhenRead", "Always"
CATEGORY_CONDITIONS = (WHEN_READ, ALWAYS)
_GUARD_KEYS = (
    "maxBackoffLimit",
    "maxOomMemoryLimit",
    "maxAvoidedNodes",
    "inPlaceDeadlineSeconds",
    "allowUnboundedInPlace",
    "maxRetryDelay",
)
#: How many of the nodes where a Job's attempts failed its next pod avoids, unless the
#: config says otherwise (``guardRails.maxAvoidedNodes``); the failure history keeps at
#: most ``MAX_AVOIDED_NODES`` per Job (or index).
DEFAULT_AVOIDED_NODES = 3
MAX_AVOIDED_NODES = 16
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


@dataclass(frozen=True)
class Disruptors:
    """Users and groups whose pod deletions are disruptions (``disruptors``)."""

    users: frozenset[str] = frozenset(DEFAULT_DISRUPTOR_USERS)
    groups: frozenset[str] = frozenset()

    def deleted_by(self, user: str | None, groups: tuple[str, ...] = ()) -> bool:
        return (user is not None and user in self.users) or any(g in self.groups for g in groups)


class ConfigError(Exception):
    """An invalid config file; ``problems`` lists every issue found."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid config {source}: {len(problems)} problem(s)\n{lines}")


@dataclass(frozen=True)
class GuardRails:
    """Limits admins enforce whatever users annotate. ``None`` means no limit."""

    max_backoff_limit: int | None = None
    #: The most memory ``oom-memory-limit`` may allow, whoever set it.
    max_oom_memory_limit: quantity.Quantity | None = None
    #: ``avoid-failed-nodes``: how many nodes (the most recent failures) a pod avoids.
    max_avoided_nodes: int = DEFAULT_AVOIDED_NODES
    #: In-place restarts need a deadline: this one is written where none is set.
    in_place_deadline_seconds: int | None = None
    #: Or they may run without one (every admission then warns).
    allow_unbounded_in_place: bool = False
    #: The longest a pod may be held back by ``retry-delay`` (seconds), whoever set it.
    max_retry_delay: int | None = None


@dataclass(frozen=True)
class NamespaceOverride:
    defaults: Mapping[str, Any] = field(default_factory=dict)
    guard_rails: Mapping[str, Any] = field(default_factory=dict)
    #: ``enforce`` or ``audit``; ``None``: the cluster's ``rollout``.
    rollout: str | None = None


@dataclass(frozen=True)
class Config:
    defaults: Mapping[str, Any] = field(default_factory=dict)
    guard_rails: GuardRails = field(default_factory=GuardRails)
    spot_node_labels: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(DEFAULT_SPOT_NODE_LABELS)
    )
    namespaces: Mapping[str, NamespaceOverride] = field(default_factory=dict)
    source: str = "<built-in defaults>"
    #: Pinned by the admin for a cluster whose feature gates differ from its version's
    #: defaults; otherwise the server asks the API server (``webhook.cluster.version``).
    kubernetes_version: KubeVersion | None = None
    disruptors: Disruptors = field(default_factory=Disruptors)
    #: The cluster's Kueue, as the admin states it (``webhook.policy.kueue``).
    kueue: kq.Kueue = field(default_factory=kq.Kueue)
    #: Whether the defaults are applied (``enforce``) or audited (``audit``), unless a
    #: namespace says otherwise (``rollout_of``).
    rollout: str = ENFORCE
    #: The admins' own failure categories, tried in order before the built-in ones
    #: (``webhook.policy.categories``).
    categories: tuple[cats.Category, ...] = ()
    #: Which failed pods carry their category as a condition (``CATEGORY_CONDITIONS``).
    category_conditions: str = WHEN_READ

    def rollout_of(self, namespace: str | None) -> str:
        """The effective rollout of the defaults in ``namespace``."""
        override = self.namespaces.get(namespace or "")
        if override is not None and override.rollout is not None:
            return override.rollout
        return self.rollout

    def layers(self, namespace: str | None) -> list[Layer]:
        """Default layers below the object's own annotations, highest precedence first."""
        layers = []
        override = self.namespaces.get(namespace or "")
        if override is not None and override.defaults:
            layers.append(Layer(Source.NAMESPACE, override.defaults, f"({namespace})"))
        if self.defaults:
            layers.append(Layer(Source.CLUSTER, self.defaults))
        return layers

    def has_default(self, name: str) -> bool:
        """Whether any default, the cluster's or a namespace's, sets ``name``."""
        return name in self._default_names

    @functools.cached_property
    def _default_names(self) -> frozenset[str]:
        """(Once per config: asked for every Job's view.)"""
        names = set(self.defaults)
        for override in self.namespaces.values():
            names.update(override.defaults)
        return frozenset(names)

    def affects_unannotated(self, namespace: str | None) -> bool:
        """Whether objects without our annotations can still be changed or denied here."""
        override = self.namespaces.get(namespace or "")
        return bool(
            self.defaults
            or (override is not None and override.defaults)
            or self.rails(namespace).max_backoff_limit is not None
        )

    def rails(self, namespace: str | None) -> GuardRails:
        override = self.namespaces.get(namespace or "")
        if override is None or not override.guard_rails:
            return self.guard_rails
        return dataclasses.replace(self.guard_rails, **override.guard_rails)


def load_config(path: str | Path | None) -> Config:
    """Load and validate a config file; ``None`` gives the built-in defaults."""
    if path is None:
        return Config()
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(source, [Problem(source, f"cannot read: {err}")]) from err
    return parse_config(text, source)


#: The key of the chart's ConfigMap that holds the config file.
CONFIGMAP_KEY = "config.yaml"


def parse_config_or_configmap(text: str, source: str) -> Config:
    """A config file, or the Helm chart's rendered ConfigMap holding one (its
    ``config.yaml``), alone or among the chart's other objects, as ``helm template``
    prints them: so a values file is checked as the chart renders it, with no YAML tool
    between."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        return parse_config(text, source)  # says what is wrong with it
    held = [
        d
        for d in documents
        if isinstance(d, dict)
        and d.get("kind") == "ConfigMap"
        and isinstance(d.get("data"), dict)
        and CONFIGMAP_KEY in d["data"]
    ]
    if not held:
        return parse_config(text, source)
    if len(held) > 1:
        names = ", ".join(str((d.get("metadata") or {}).get("name")) for d in held)
        problem = f"holds {len(held)} ConfigMaps with a {CONFIGMAP_KEY}: {names}; give one"
        raise ConfigError(source, [Problem(source, problem)])
    name = (held[0].get("metadata") or {}).get("name")
    return parse_config(str(held[0]["data"][CONFIGMAP_KEY]), f"{source}: ConfigMap {name}")


def parse_config(text: str, source: str = "<config>") -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(source, [Problem(source, f"not valid YAML: {err}")]) from err
    if data is None:
        data = {}
    problems: list[Problem] = []
    if not isinstance(data, dict):
        raise ConfigError(source, [Problem(source, "the top level must be a mapping")])
    _unknown_keys(data, _TOP_KEYS, "", problems)
    defaults = _defaults(data.get("defaults"), "defaults", problems)
    rails = _guard_rails(data.get("guardRails"), "guardRails", problems)
    spot = _spot_labels(data.get("spotNodeLabels", None), problems)
    namespaces: dict[str, NamespaceOverride] = {}
    raw_ns = data.get("namespaces") or {}
    if not isinstance(raw_ns, dict):
        problems.append(Problem("namespaces", "must be a mapping of namespace name to overrides"))
        raw_ns = {}
    for name, body in raw_ns.items():
        where = f"namespaces.{name}"
        if not isinstance(name, str) or _DNS_LABEL.fullmatch(name) is None:
            problems.append(Problem(where, "is not a valid namespace name (RFC 1123 label)"))
            continue
        if not isinstance(body, dict):
            problems.append(
                Problem(where, "must be a mapping with defaults, guardRails and/or rollout")
            )
            continue
        _unknown_keys(body, _NS_KEYS, where + ".", problems)
        ns_defaults = _defaults(body.get("defaults"), where + ".defaults", problems)
        ns_rails = _guard_rails(body.get("guardRails"), where + ".guardRails", problems)
        ns_rollout = _rollout(body.get("rollout"), where + ".rollout", problems)
        namespaces[name] = NamespaceOverride(ns_defaults, ns_rails, ns_rollout)
    config = Config(
        defaults=defaults,
        guard_rails=GuardRails(**rails),
        spot_node_labels=spot,
        namespaces=namespaces,
        source=source,
        kubernetes_version=_kubernetes_version(data.get("kubernetesVersion"), problems),
        disruptors=_disruptors(data.get("disruptors", None), problems),
        kueue=_kueue(data.get("kueue"), problems),
        rollout=_rollout(data.get("rollout"), "rollout", problems) or ENFORCE,
        categories=cats.parse(data.get("categories"), problems),
        category_conditions=_category_conditions(data.get("categoryConditions"), problems),
    )
    problems.extend(_consistency(config))
    if problems:
        raise ConfigError(source, problems)
    return config


def _unknown_keys(data: dict, allowed: tuple[str, ...], where: str, problems: list[Problem]):
    for key in data:
        if key not in allowed:
            hint = did_you_mean(str(key), list(allowed)) or "allowed: " + ", ".join(allowed)
            problems.append(Problem(f"{where}{key}", f"unknown key; {hint}"))


def _defaults(raw: Any, where: str, problems: list[Problem]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(Problem(where, "must be a mapping of annotation name to value"))
        return {}
    allowed = [name for name, spec in KEYS.items() if spec.settable_default]
    values: dict[str, Any] = {}
    for name, value in raw.items():
        spec = KEYS.get(name) if isinstance(name, str) else None
        if spec is None or not spec.settable_default:
            hint = did_you_mean(str(name), allowed) or "allowed: " + ", ".join(allowed)
            problems.append(Problem(f"{where}.{name}", f"unknown default; {hint}"))
            continue
        if value is None:
            continue
        text = _as_text(value)
        if text is None:
            problems.append(Problem(f"{where}.{name}", f"unsupported value {value!r}"))
            continue
        try:
            values[name] = spec.parse(text)
        except BadValue as err:
            problems.append(Problem(f"{where}.{name}", f"{value!r} is not valid; {err}"))
    return values


def _as_text(value: Any) -> str | None:
    """YAML gives native types; map them onto the annotation grammar so both agree."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # (1.5 for oom-memory-factor; the key's grammar decides)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return ",".join(str(v) for v in value)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return ",".join(value)  # (free-categories: [DeviceFault, NodeFailure])
    return None


def _guard_rails(raw: Any, where: str, problems: list[Problem]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(Problem(where, "must be a mapping"))
        return {}
    _unknown_keys(raw, _GUARD_KEYS, where + ".", problems)
    rails: dict[str, Any] = {}
    if "maxBackoffLimit" in raw:
        value = raw["maxBackoffLimit"]
        if value is None:
            rails["max_backoff_limit"] = None
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            rails["max_backoff_limit"] = value
        else:
            problems.append(
                Problem(f"{where}.maxBackoffLimit", f"{value!r} is not a whole number >= 0")
            )
    if "maxOomMemoryLimit" in raw:
        value = raw["maxOomMemoryLimit"]
        if value is None:
            rails["max_oom_memory_limit"] = None
        else:
            text = _as_text(value) if not isinstance(value, bool) else None
            try:
                rails["max_oom_memory_limit"] = parse_memory(text or "")
            except BadValue as err:
                problems.append(
                    Problem(f"{where}.maxOomMemoryLimit", f"{value!r} is not valid; {err}")
                )
    if "maxAvoidedNodes" in raw:
        value = raw["maxAvoidedNodes"]
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and 1 <= value <= MAX_AVOIDED_NODES
        ):
            rails["max_avoided_nodes"] = value
        elif value is not None:
            problems.append(
                Problem(
                    f"{where}.maxAvoidedNodes",
                    f"{value!r} is not valid; accepted: a whole number from 1 to "
                    f"{MAX_AVOIDED_NODES}",
                )
            )
    if "inPlaceDeadlineSeconds" in raw:
        value = raw["inPlaceDeadlineSeconds"]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            rails["in_place_deadline_seconds"] = value
        elif value is not None:
            problems.append(
                Problem(
                    f"{where}.inPlaceDeadlineSeconds",
                    f"{value!r} is not valid; accepted: a whole number of seconds >= 1",
                )
            )
    if "allowUnboundedInPlace" in raw:
        value = raw["allowUnboundedInPlace"]
        if isinstance(value, bool):
            rails["allow_unbounded_in_place"] = value
        elif value is not None:
            problems.append(
                Problem(
                    f"{where}.allowUnboundedInPlace",
                    f"{value!r} is not valid; accepted: true or false",
                )
            )
    if "maxRetryDelay" in raw:
        value = raw["maxRetryDelay"]
        try:
            if value is not None:
                if not isinstance(value, str) or value == "none":
                    raise BadValue("accepted: a duration such as 30m or 1h (quote it)")
                rails["max_retry_delay"] = parse_duration(value)
            else:
                rails["max_retry_delay"] = None
        except BadValue as err:
            message = str(err).replace(", or none to turn off a default", "")
            problems.append(Problem(f"{where}.maxRetryDelay", f"{value!r} is not valid; {message}"))
    return rails


def _rollout(raw: Any, where: str, problems: list[Problem]) -> str | None:
    """``enforce`` or ``audit``; ``None`` when not given."""
    if raw is None or raw in ROLLOUTS:
        return raw
    problems.append(
        Problem(where, f"{raw!r} is not valid; accepted: enforce or audit (default enforce)")
    )
    return None


def _category_conditions(raw: Any, problems: list[Problem]) -> str:
    if raw is None or raw in CATEGORY_CONDITIONS:
        return raw or WHEN_READ
    problems.append(
        Problem(
            "categoryConditions",
            f"{raw!r} is not valid; accepted: WhenRead (the default: on the pods a rule "
            "reads it of) or Always (on every failed pod of a workload with a plan)",
        )
    )
    return WHEN_READ


def _kubernetes_version(raw: Any, problems: list[Problem]) -> KubeVersion | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        # YAML reads 1.30 as the number 1.3: only a string says what the admin meant.
        problems.append(Problem("kubernetesVersion", f'{raw!r} is not a string; quote it: "1.35"'))
        return None
    try:
        return KubeVersion.parse(raw)
    except ValueError as err:
        problems.append(Problem("kubernetesVersion", f"{raw!r} is not valid; {err}"))
        return None


def _disruptors(raw: Any, problems: list[Problem]) -> Disruptors:
    """``disruptors: {users: [...], groups: [...]}``; given, it replaces the defaults
    whole (``users: []`` turns them off)."""
    if raw is None:
        return Disruptors()
    if not isinstance(raw, dict):
        problems.append(Problem("disruptors", "must be a mapping with users and/or groups"))
        return Disruptors()
    _unknown_keys(raw, _DISRUPTOR_KEYS, "disruptors.", problems)
    found: dict[str, frozenset[str]] = {}
    for key in _DISRUPTOR_KEYS:
        values = raw.get(key) or []
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            problems.append(
                Problem(
                    f"disruptors.{key}",
                    "must be a list of names as the API server authenticates them, e.g. "
                    "system:serviceaccount:kube-system:karpenter",
                )
            )
            values = []
        found[key] = frozenset(values)
    return Disruptors(found["users"], found["groups"])


def _kueue(raw: Any, problems: list[Problem]) -> kq.Kueue:
    """``kueue: {waitForPodsReady: {enable, timeout, recoveryTimeout}, startupAllowance,
    retryDelay}`` (``webhook.policy.kueue``)."""
    if raw is None:
        return kq.Kueue()
    if not isinstance(raw, dict):
        problems.append(Problem("kueue", "must be a mapping with waitForPodsReady"))
        return kq.Kueue()
    _unknown_keys(raw, kq.KEYS, "kueue.", problems)
    found: dict[str, Any] = {}
    mode = raw.get("retryDelay", "cap")
    if mode in kq.MODES:
        found["retry_delay"] = mode
    else:
        problems.append(
            Problem("kueue.retryDelay", f"{mode!r} is not valid; accepted: cap or deny")
        )
    if "startupAllowance" in raw:
        found["startup_allowance"] = _go_seconds(raw, "startupAllowance", "kueue.", problems)
    wait = raw.get("waitForPodsReady")
    if isinstance(wait, dict):
        where = "kueue.waitForPodsReady."
        _unknown_keys(wait, kq.WAIT_KEYS, where, problems)
        found["stated"] = True
        found["enabled"] = wait.get("enable", True)
        if not isinstance(found["enabled"], bool):
            problems.append(Problem(where + "enable", f"{found['enabled']!r} is not true or false"))
        # Kueue's defaults: a zero or absent timeout is 30m; recoveryTimeout is the timeout.
        found["timeout"] = _go_seconds(wait, "timeout", where, problems) or kq.DEFAULT_TIMEOUT
        found["recovery_timeout"] = found["timeout"]
        if wait.get("recoveryTimeout") is not None:
            found["recovery_timeout"] = _go_seconds(wait, "recoveryTimeout", where, problems)
    elif wait is not None:
        problems.append(Problem("kueue.waitForPodsReady", "must be a mapping"))
    kueue = kq.Kueue(**{k: v for k, v in found.items() if v is not None})
    if kueue.stated and kueue.enabled is True and kueue.longest_wait() < 1:
        bound, name = kueue.bound()
        problems.append(
            Problem(
                "kueue.startupAllowance",
                f"{format_duration(kueue.startup_allowance)} leaves no time to wait within "
                f"Kueue's {name}; accepted: a duration below {format_duration(bound)}",
            )
        )
    return kueue


def _go_seconds(raw: dict, key: str, where: str, problems: list[Problem]) -> int | None:
    """``raw[key]``, a Go duration as Kueue reads one, in whole seconds (rounded down)."""
    value = raw.get(key)
    if value is None:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a quoted duration")
        return int(kq.parse_go_duration(value))
    except ValueError as err:
        problems.append(
            Problem(f"{where}{key}", f"{err}; accepted: a Go duration such as 5m, 1h30m or 90s")
        )
        return None


def _spot_labels(raw: Any, problems: list[Problem]) -> dict[str, tuple[str, ...]]:
    if raw is None:
        return dict(DEFAULT_SPOT_NODE_LABELS)
    if not isinstance(raw, dict):
        problems.append(Problem("spotNodeLabels", "must be a mapping of label key to values"))
        return {}
    labels: dict[str, tuple[str, ...]] = {}
    for key, values in raw.items():
        where = f"spotNodeLabels.{key}"
        if not isinstance(key, str) or not _valid_label_key(key):
            problems.append(Problem(where, "is not a valid label key"))
            continue
        if isinstance(values, str):
            values = [values]
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) and _LABEL_VALUE.fullmatch(v) for v in values)
        ):
            problems.append(Problem(where, "must be a label value or a non-empty list of them"))
            continue
        labels[key] = tuple(sorted(set(values)))
    return labels


def _valid_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or _DNS_SUBDOMAIN.fullmatch(prefix) is None):
        return False
    return _LABEL_NAME.fullmatch(name) is not None


def _consistency(config: Config) -> list[Problem]:
    """Cross-field checks: a default must itself pass the guard rails it lives under."""
    problems = []
    scopes = [("defaults", config.defaults, None)] + [
        (f"namespaces.{ns}.defaults", o.defaults, ns) for ns, o in config.namespaces.items()
    ]
    for where, defaults, ns in scopes:
        rails = config.rails(ns)
        limit, limit_where = defaults.get("backoff-limit"), where
        if ns is not None and limit is None:
            limit, limit_where = config.defaults.get("backoff-limit"), "defaults"
        if (
            limit is not None
            and rails.max_backoff_limit is not None
            and limit > rails.max_backoff_limit
        ):
            problems.append(
                Problem(
                    f"{limit_where}.backoff-limit",
                    f"{limit} is above the guard rail maxBackoffLimit={rails.max_backoff_limit}"
                    + (f" of namespace {ns}" if ns else ""),
                )
            )
        memory, memory_where = defaults.get("oom-memory-limit"), where
        if ns is not None and memory is None:
            memory, memory_where = config.defaults.get("oom-memory-limit"), "defaults"
        if (
            memory is not None
            and rails.max_oom_memory_limit is not None
            and memory.value > rails.max_oom_memory_limit.value
        ):
            problems.append(
                Problem(
                    f"{memory_where}.oom-memory-limit",
                    f"{memory} is above the guard rail "
                    f"maxOomMemoryLimit={rails.max_oom_memory_limit}"
                    + (f" of namespace {ns}" if ns else ""),
                )
            )
        for name in ("retry-delay", "retry-delay-max"):
            delay, delay_where = defaults.get(name), where
            if ns is not None and delay is None:
                delay, delay_where = config.defaults.get(name), "defaults"
            rail = rails.max_retry_delay
            if delay is not None and rail is not None and delay > rail:
                problems.append(
                    Problem(
                        f"{delay_where}.{name}",
                        f"{format_duration(delay)} is above the guard rail "
                        f"maxRetryDelay={format_duration(rail)}"
                        + (f" of namespace {ns}" if ns else ""),
                    )
                )
        if defaults.get("non-spot-attempts") and not config.spot_node_labels:
            problems.append(
                Problem(f"{where}.non-spot-attempts", "needs spotNodeLabels, which is empty")
            )
        for name in ("free-categories", "fail-categories"):
            unknown, known = cats.check_names(defaults.get(name) or (), config.categories)
            if unknown:
                problems.append(
                    Problem(
                        f"{where}.{name}",
                        f"{', '.join(unknown)}: no such category; the categories are {known}",
                    )
                )
    return problems
