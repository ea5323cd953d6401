"""A stored workload explained: its retry plan as ``explain`` tells it, from the settings
its ``retry-policy.dev/applied`` record says were applied and which rules are the
webhook's (``ours``)."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from webhook import explain
from webhook.kinds import registry
from webhook.kube import failurepolicy
from webhook.kube.objects import get_path, items, mapping
from webhook.plan.outcome import Outcome
from webhook.plan.record import AppliedRecord, settings_as_annotations
from webhook.policy.config import Config, ConfigError, parse_config
from webhook.policy.model import APPLIED, PREFIX

#: The rules on our controller's conditions (``webhook.plan.causes.rules``): the
#: record key that says the webhook wrote one, its annotation, and the condition.
_CONDITION_RULES = (
    ("maxInPlaceRestarts", "max-in-place-restarts", failurepolicy.IN_PLACE_BUDGET_EXHAUSTED),
    ("maxDisruptions", "max-disruptions", failurepolicy.DISRUPTION_BUDGET_EXHAUSTED),
    ("peerDisruptions", "peer-disruptions", failurepolicy.PEER_DISRUPTED),
)

# --- the record ---------------------------------------------------------------------------


def applied_record(obj: Mapping[str, Any]) -> AppliedRecord:
    """The ``retry-policy.dev/applied`` record on ``obj`` (empty: none, or unreadable)."""
    return AppliedRecord.of(obj) or AppliedRecord({}, {}, 1)


def recorded_config(obj: Mapping[str, Any]) -> Config:
    """A config whose cluster defaults are the settings of the object's applied record
    that none of its annotations made (the admins' defaults at its admission)."""
    record = applied_record(obj)
    annotations = mapping(mapping(obj.get("metadata")).get("annotations"))
    written = {k.removeprefix(PREFIX) for k in annotations if isinstance(k, str)}
    defaults = settings_as_annotations(record)
    chosen = {k: v for k, v in defaults.items() if k not in written}
    if not chosen:
        return Config()
    try:
        return parse_config(json.dumps({"defaults": chosen}), "<the applied record>")
    except ConfigError:
        return Config()


def origin_of(rule: Any, record: AppliedRecord) -> str | None:
    """The annotation for which this webhook wrote ``rule`` (a podFailurePolicy rule, or a
    JobSet failure policy rule), as the applied record says; ``None``: not ours. A record
    that keeps the rules' origins says so itself; an older one (version 1) by the shape of
    the rules its settings write."""
    if not isinstance(rule, dict):
        return None
    if record.version >= 2:
        return record.origin(rule)
    if "failNonRetriable" in record and (
        rule.get("name") in _fail_non_retriable_names()
        or failurepolicy.is_non_retriable_rule(rule)
        or failurepolicy.rule_key(rule)
        == failurepolicy.rule_key(failurepolicy.count_disruptions_rule())
    ):
        return "fail-non-retriable"
    ignore = failurepolicy.rule_key(failurepolicy.ignore_disruptions_rule())
    if record.get("ignoreDisruptions") is True and failurepolicy.rule_key(rule) == ignore:
        return "ignore-disruptions"
    for key, name, kind in _CONDITION_RULES:
        if key not in record:
            continue
        action = "Ignore" if record.get(key) == "ignore" else "Count"
        if failurepolicy.rule_key(rule) == failurepolicy.rule_key(
            failurepolicy.condition_rule(kind, action)
        ):
            return name
    return None


def _fail_non_retriable_names() -> tuple[str, ...]:
    """The names of the rules the webhook writes for fail-non-retriable in a kind's own
    policy (``StoryFacts.rule_names``: a JobSet's); a tuple, as a rule's name read from a
    file may be of any JSON type."""
    return tuple(
        name
        for kind in registry.KINDS
        if kind.story is not None
        for name in kind.story.load().rule_names
    )


#: Set by the API server or the controllers, not by whoever wrote the manifest.
_SYSTEM_METADATA = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "finalizers",
)


def as_stored(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without its status and system fields: the spec as the controllers read
    it, with the metadata a manifest has."""
    out = copy.deepcopy(dict(obj))
    out.pop("status", None)
    meta = mapping(out.get("metadata"))
    for key in _SYSTEM_METADATA:
        meta.pop(key, None)
    return out


def job_specs(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``obj``'s JobSpecs, where its kind says they are (``KindSpec.job_specs``)."""
    kind = registry.kind_of(obj)
    if kind is None:
        return []
    found = (get_path(obj, path) for _, path in kind.job_specs(obj))
    return [spec for spec in found if isinstance(spec, dict)]


def without_ours(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with the rules the applied record says this webhook wrote taken out: what
    the re-admission adds back is then told as the webhook's, not the user's."""
    out = copy.deepcopy(dict(obj))
    record = applied_record(out)
    if not record.settings:
        return out
    for spec in job_specs(out):
        policy = mapping(spec.get("podFailurePolicy"))
        rules = items(policy.get("rules"))
        kept = [r for r in rules if origin_of(r, record) is None]
        if rules and not kept:
            spec.pop("podFailurePolicy", None)
        elif rules:
            policy["rules"] = kept
    for policy in _own_policies(out):
        rules = items(policy.get("rules"))
        if rules:
            policy["rules"] = [r for r in rules if origin_of(r, record) is None]
    return out


def _own_policies(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The policy holding ``obj``'s own rules, besides its JobSpecs' (``StoryFacts.rules_at``:
    a JobSet's failure policy), as the rules are found in it (empty when absent)."""
    kind = registry.kind_of(obj)
    facts = kind.story.load() if kind is not None and kind.story is not None else None
    if facts is None or not facts.rules_at:
        return []
    *path, last = facts.rules_at
    return [mapping(mapping(get_path(obj, path)).get(last))]


#: What ``status`` tells a version-1 record's plan with (``readmit``, given by the layer
#: above, ``webhook.cli``: status itself admits nothing): ``obj`` admitted again with
#: ``config`` in ``namespace``, as it would be stored (``None``: denied).
Readmit = Callable[[dict[str, Any], Config, str], "dict[str, Any] | None"]

#: What ``explain`` tells of a stored workload: its explanations, or its denial.
Explained = list[explain.Explanation | explain.Denial]


def source_of(config: Config, given: bool) -> str:
    """What the plan is judged with, in words."""
    if given:
        return f"judged with {config.source}"
    return (
        f"from the workload's annotations and its {APPLIED} record (what the webhook "
        "applied at admission); an admin can give the cluster's defaults file with --config"
    )


def explained_of(
    obj: Mapping[str, Any],
    config: Config,
    namespace: str,
    given: bool,
    readmit: Readmit | None = None,
) -> tuple[Explained, str, list[str]]:
    """The plan of the object as stored, with notes. The object is what the webhook
    wrote, and its applied record (version 2) says which settings were applied and
    which rules are the webhook's: the plan is told from them, admitting nothing
    (``explained_stored``). A version-1 record keeps no rules' origins: with ``readmit`` the
    plan is found by admitting the object again (``explained_readmitted``); without, it is
    told from the stored object, the webhook's rules recognised by their shape."""
    record = AppliedRecord.of(obj)
    if record is not None and record.version < 2 and readmit is not None:
        return explained_readmitted(obj, config, namespace, given, readmit)
    judge = recorded_under(config, obj, namespace) if given else config
    notes: list[str] = []
    return explained_stored(obj, judge, namespace, notes), source_of(config, given), notes


def recorded_under(config: Config, obj: Mapping[str, Any], namespace: str) -> Config:
    """An admin's ``config`` with the defaults the object's record says were applied in
    place of its own (its defaults may have changed since: what was applied is what the
    object holds). The file still says which layer each came from (its namespace's
    override when that sets the same value, else the cluster's) and its guard rails."""
    recorded = dict(recorded_config(obj).defaults)
    override = config.namespaces.get(namespace)
    mine = {} if override is None else dict(override.defaults)
    local = {k: v for k, v in recorded.items() if k in mine and mine[k] == v}
    namespaces = dict(config.namespaces)
    if override is not None:
        namespaces[namespace] = dataclasses.replace(override, defaults=local)
    cluster = {k: v for k, v in recorded.items() if k not in local}
    return dataclasses.replace(config, defaults=cluster, namespaces=namespaces)


def explained_stored(
    obj: Mapping[str, Any], config: Config, namespace: str, notes: list[str]
) -> Explained:
    """The plan told from the stored object itself, without admission: the object as the
    webhook wrote it, and as the user wrote it (without the rules the record says are
    the webhook's, which are then told as its own); what keeps it from being told goes
    in ``notes``."""
    stored = as_stored(obj)
    record = applied_record(stored)
    rules = [(rule, name, False) for rule, name in our_rules(stored, record)]
    return _told(
        lambda: explain.explain_stored(
            without_ours(stored), stored, Outcome(rules=rules), config, namespace
        ),
        obj,
        notes,
    )


def our_rules(obj: Mapping[str, Any], record: AppliedRecord) -> list[tuple[Any, str]]:
    """The rules in ``obj`` the webhook wrote, each with the annotation it wrote it for."""
    found = []
    policies = [mapping(spec.get("podFailurePolicy")) for spec in job_specs(obj)]
    policies += _own_policies(obj)
    for policy in policies:
        for rule in items(policy.get("rules")):
            name = origin_of(rule, record)
            if name is not None:
                found.append((rule, name))
    return found


def explained_readmitted(
    obj: Mapping[str, Any], config: Config, namespace: str, given: bool, readmit: Readmit
) -> tuple[Explained, str, list[str]]:
    """A version-1 record's plan (no rules' origins). ``explain`` admits its input again,
    so the input is the first of these whose admission gives back exactly the stored spec
    (what the controllers read: ``podFailurePolicy`` is immutable): the object without the
    rules the webhook wrote (they are then told as the webhook's); as stored (every rule
    told as yours); without its retry-policy annotations, judged by the built-in defaults
    (the webhook would change it today: its settings are not shown)."""
    stored = as_stored(obj)
    bare = copy.deepcopy(stored)
    annotations = mapping(mapping(bare.get("metadata")).get("annotations"))
    labels = mapping(mapping(bare.get("metadata")).get("labels"))
    for held in (annotations, labels):  # (the managed label is the webhook's too)
        for key in [k for k in held if isinstance(k, str) and k.startswith(PREFIX)]:
            del held[key]
    candidates = [
        (without_ours(stored), config, ""),
        (
            stored,
            config,
            "the plan reads the stored rules and cannot tell which of them the webhook wrote",
        ),
        (
            bare,
            Config(),
            "admitting this workload again would change it (its annotations, the defaults or "
            "the webhook changed since): the plan reads its stored spec as it is, without "
            "its retry-policy settings",
        ),
    ]
    chosen, judge, note = candidates[-1]
    for candidate, by, said in candidates:
        again = readmit(copy.deepcopy(candidate), by, namespace)
        if again is not None and again.get("spec") == stored.get("spec"):
            chosen, judge, note = candidate, by, said
            break
    notes = [note] if note else []
    told = _told(lambda: explain.explain(copy.deepcopy(chosen), judge, namespace), obj, notes)
    return told, source_of(config, given), notes


def _told(
    explained: Callable[[], list[explain.Explanation] | explain.Denial | None],
    obj: Mapping[str, Any],
    notes: list[str],
) -> Explained:
    """The plan ``explained`` gives; what keeps it from giving one goes in ``notes``."""
    try:
        result = explained()
    except explain.ExplainError as err:
        notes.append(f"no plan: {err}")
        return []
    if result is None:
        notes.append(f"explain does not cover a {obj.get('kind')}")
        return []
    if isinstance(result, explain.Denial):
        return [result]
    return list(result)
