"""Audited defaults (``rollout: audit``), the ``retry-policy.dev/managed`` label, and the
MultiKueue worker's copies left alone: what ``WorkloadMutator.mutate`` does around any
kind's own part.

Under audit a workload is admitted with the settings its own annotations ask for, and the
settings only the cluster's or its namespace's defaults give (``Source.CLUSTER``,
``Source.NAMESPACE``) are not applied. The same kind's ``apply`` runs a second time, on
a copy, with the defaults as they would be enforced (``Trial``): the JobSpecs of that copy
are what the record says (``webhook.plan.audit``), so ``explain``, the controller's replay
and admission can never disagree on what enforcing would do. Guard rails are enforced in
both runs alike for a workload whose annotations ask for a policy; one with no
``retry-policy.dev/`` annotation is nobody's opt-in, so audit spares it the rails too:
admitted unchanged, never denied by the admin's config, what the rails would do (lower its
budget, or deny it) recorded beside the defaults.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.kube.failurepolicy import named_containers
from webhook.kube.objects import get_path, mapping
from webhook.kube.wellknown import MULTIKUEUE_ORIGIN
from webhook.plan.audit import (
    AUDIT,
    AUDITED,
    BY_RAIL,
    ENFORCE,
    MANAGED,
    AuditedPart,
    AuditRecord,
    by_words,
)
from webhook.plan.causes import LABEL_KEYS
from webhook.plan.outcome import Context, Outcome
from webhook.plan.policies import asks_for_policy
from webhook.policy.config import GuardRails
from webhook.policy.model import BUILTIN, PREFIX, Policy, Setting, Source, format_value
from webhook.problems import summarize

#: The sources of the settings audit holds back.
DEFAULT_SOURCES = (Source.CLUSTER, Source.NAMESPACE)
_BY = {Source.CLUSTER: "cluster", Source.NAMESPACE: "namespace"}


def multikueue_copy(obj: Mapping[str, Any]) -> str | None:
    """The origin when ``obj`` is a MultiKueue worker's copy of a manager's object:
    Kueue's ``SyncJob`` creates it with the label ``kueue.x-k8s.io/multikueue-origin``
    (``MultiKueueOriginLabel``)."""
    labels = mapping(mapping(obj.get("metadata")).get("labels"))
    origin = labels.get(MULTIKUEUE_ORIGIN)
    return origin if isinstance(origin, str) else None


def multikueue_note(kind: str, origin: str) -> str:
    return (
        f"retry-policy: this {kind} is MultiKueue's copy of a manager's (label "
        f"{MULTIKUEUE_ORIGIN}={origin}): its spec is left as the manager's admission made "
        "it, since a worker's change strands the manager's workload (kueue#13046); its "
        "pods still get the settings its pod template carries"
    )


def audited(policy: Policy) -> dict[str, Setting]:
    """The settings only the admin's defaults give."""
    return {n: s for n, s in policy.settings.items() if s.source in DEFAULT_SOURCES}


def without_defaults(policy: Policy) -> Policy:
    """``policy`` as enforced under audit: every default-given setting back to off."""
    held = audited(policy)
    if not held:
        return policy
    settings = dict(policy.settings)
    for name in held:
        settings[name] = Setting(BUILTIN[name], Source.BUILTIN)
    return Policy(settings)


def held_back(policy: Policy) -> tuple[dict[str, str], dict[str, str]]:
    """The record's ``settings`` and ``by`` of the defaults ``policy`` holds back."""
    held = audited(policy)
    settings = {name: format_value(name, s.value) for name, s in sorted(held.items())}
    return settings, {name: _BY[s.source] for name, s in sorted(held.items())}


def enforcing(ctx: Context) -> Context:
    """``ctx`` with its namespace's defaults enforced: what enforcing would do, where a
    kind's run judges another object's admission too (a TrainJob's JobSet)."""
    namespaces = dict(ctx.config.namespaces)
    override = namespaces.get(ctx.namespace or "")
    if override is not None:
        namespaces[ctx.namespace or ""] = dataclasses.replace(override, rollout=None)
    config = dataclasses.replace(ctx.config, rollout=ENFORCE, namespaces=namespaces)
    return dataclasses.replace(ctx, config=config)


def without_rails(ctx: Context) -> Context:
    """``ctx`` without guard rails, the cluster's or any namespace's."""
    namespaces = {
        ns: dataclasses.replace(o, guard_rails={}) for ns, o in ctx.config.namespaces.items()
    }
    config = dataclasses.replace(ctx.config, guard_rails=GuardRails(), namespaces=namespaces)
    return dataclasses.replace(ctx, config=config)


@dataclass
class Trial:
    """One audited admission: the whole policy, and a copy of the object as it came, to
    apply the defaults to; ``rails`` when the guard rails are audited too (a workload
    without annotations of its own: ``context`` is then the admitted run's)."""

    policy: Policy
    copy: dict[str, Any]
    rails: bool = False

    @classmethod
    def start(cls, obj: Mapping[str, Any], policy: Policy, ctx: Context) -> Trial | None:
        """A trial when the namespace audits and ``policy`` has defaults, or the workload
        asks for nothing itself (then its rails are audited too), else ``None``."""
        if ctx.config.rollout_of(ctx.namespace) != AUDITED:
            return None
        unannotated = not asks_for_policy(obj.get("metadata"))
        if not audited(policy) and not unannotated:
            return None
        return cls(policy, copy.deepcopy(dict(obj)), unannotated)

    def context(self, ctx: Context) -> Context:
        """What the admitted run works in: without the rails when they are audited."""
        return without_rails(ctx) if self.rails else ctx

    def record(
        self, mutator: Any, obj: Mapping[str, Any], ctx: Context, out: Outcome
    ) -> AuditRecord | None:
        """Apply the whole policy to the copy; the record of what it changed that the
        admitted ``obj`` lacks (``None``: the defaults would change nothing)."""
        enforced = Outcome()
        resolved = mutator.apply(self.copy, self.policy, ctx, enforced)
        settings, by = held_back(self.policy)
        denied = say_enforced(enforced, out)
        if denied:
            # Recorded (and labelled) only where the admin's config alone denies it.
            return AuditRecord(settings, by, (), denied=denied) if self.rails else None
        if self.copy.get("spec") == obj.get("spec"):
            return None
        rail = resolved.setting("backoff-limit")
        if self.rails and "guardRails" in rail.detail:
            settings["backoff-limit"] = format_value("backoff-limit", rail.value)
            by["backoff-limit"] = BY_RAIL
        parts = tuple(
            _part(path, spec)
            for path, where in mutator.job_specs(self.copy)
            if (spec := get_path(self.copy, where)) != get_path(obj, where)
            and isinstance(spec, dict)
        )
        # A JobSet's own failurePolicy, which fail-non-retriable and backoff-limit write.
        failure_policy = get_path(self.copy, ("spec", "failurePolicy"))
        if failure_policy == get_path(obj, ("spec", "failurePolicy")):
            failure_policy = None
        return AuditRecord(
            dict(sorted(settings.items())),
            dict(sorted(by.items())),
            parts,
            failure_policy if isinstance(failure_policy, dict) else None,
        )


def say_enforced(enforced: Outcome, out: Outcome) -> str:
    """What a trial run (``enforced``) found that the audited admission says now: why
    enforcing would deny the workload (returned: ``""`` when it would not), or the
    defaults enforcing would skip (said now, not then)."""
    if enforced.problems:
        denied = summarize(enforced.problems)
        out.note(f"retry-policy: audit: enforcing would deny this workload: {denied}")
        return denied
    said = set(out.warnings)
    for text in enforced.skipped:
        if text not in said:
            out.note("retry-policy: audit: enforced, " + text.removeprefix("retry-policy: "))
    return ""


def _part(path: str, spec: Mapping[str, Any]) -> AuditedPart:
    rules = mapping(spec.get("podFailurePolicy")).get("rules")
    return AuditedPart(
        path,
        _count(spec.get("backoffLimit")),
        _count(spec.get("backoffLimitPerIndex")),
        tuple(r for r in rules if isinstance(r, dict)) if isinstance(rules, list) else (),
        _template(mapping(spec.get("template"))),
    )


def _template(template: Mapping[str, Any]) -> dict[str, Any]:
    """What of a JobSpec's pod template the replay reads (``AuditedPart.template``): our
    controller's labels, and what restarts its containers in place."""
    labels = mapping(mapping(template.get("metadata")).get("labels"))
    pod = mapping(template.get("spec"))
    containers = [
        {k: c[k] for k in ("name", "restartPolicy", "restartPolicyRules") if k in c}
        for c in named_containers(pod, "containers")
    ]
    spec: dict[str, Any] = {"containers": containers}
    if isinstance(pod.get("restartPolicy"), str):
        spec["restartPolicy"] = pod["restartPolicy"]
    ours = {PREFIX + key for key in LABEL_KEYS}
    return {"metadata": {"labels": {k: v for k, v in labels.items() if k in ours}}, "spec": spec}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def audit_text(record: AuditRecord, rollout_where: str) -> str:
    """The warning of an audited admission."""
    said = [f"{n} {v} ({by_words(record.by.get(n, ''))})" for n, v in record.settings.items()]
    if not said:
        said = ["the guard rails"]  # a rail on a part's own field (a JobSet's Jobs)
    if record.denied:
        said.append("enforcing would deny it")
    return (
        f"retry-policy: audited, not applied ({rollout_where}): {', '.join(said)}; what they "
        f"would have done is in annotation {AUDIT}"
    )


def write(
    meta: Any, record: AuditRecord | None, applied: bool, out: Outcome, where: str = ""
) -> None:
    """The record and the label on one object's ``meta`` (``where``: whose, in a
    warning): ``enforce`` when a setting was applied, ``audit`` when only audited
    defaults touched it, none (and no record) when neither. Both are the webhook's own:
    a value there that says otherwise is replaced, or removed, with a warning."""
    if not isinstance(meta, dict):
        return
    text = record.to_annotation() if record is not None else None
    _put(meta, "annotations", AUDIT, text, out, where)
    value = ENFORCE if applied else (AUDITED if record is not None else None)
    _put(meta, "labels", MANAGED, value, out, where)


def label_carried(meta: Any, policy: Policy, ctx: Context, out: Outcome) -> None:
    """The ``managed`` label of a workload whose policy is carried to the objects its
    controller makes, which apply (or audit) it there (a TrainJob's JobSet): ``enforce``
    when a setting is carried to be applied, ``audit`` when only defaults the namespace
    audits are."""
    if not isinstance(meta, dict):
        return
    auditing = ctx.config.rollout_of(ctx.namespace) == AUDITED
    applied = without_defaults(policy).active if auditing else policy.active
    held = auditing and any(policy.asks(name) for name in audited(policy))
    value = ENFORCE if applied else (AUDITED if held else None)
    _put(meta, "labels", MANAGED, value, out, "")


def _put(
    meta: dict[str, Any],
    field: str,
    key: str,
    value: str | None,
    out: Outcome,
    where: str,
) -> None:
    held = meta.get(field)
    if held is not None and not isinstance(held, dict):
        return  # (not ours to repair: the API server refuses it anyway)
    before = held.get(key) if held is not None else None
    if before == value:
        return
    if value is None:
        del held[key]  # (held is a mapping: ``before`` was found in it)
        if field == "labels":
            out.changed(f"retry-policy: {where}label {key}={before} removed: no policy applies")
        return
    if held is None:
        held = meta[field] = {}
    held[key] = value
    if before is not None and field == "labels":
        out.changed(
            f"retry-policy: {where}{field[:-1]} {key}: {before!r} -> {value!r} (the webhook's "
            f"own {field[:-1]}: it says how the workload is managed)"
        )


def rollout_where(ctx: Context) -> str:
    override = ctx.config.namespaces.get(ctx.namespace or "")
    if override is not None and override.rollout is not None:
        return f"rollout: audit in namespace {ctx.namespace}"
    return "rollout: audit"
