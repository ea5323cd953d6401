"""The planner: one JobSpec part's retry plan (``plan.model.PartPlan``), from the policy
admission resolved for it and the JobSpec as written and as stored.

One pure function, ``part_plan``, for every reader: ``explain`` over what admission
recorded (``Outcome.plans``), and over a stored object and its applied record without
admission (``status``). The facts it reads from the object (containers, rules, memory,
restart rules, deadlines) come from the whole stored object, not from the view the
mutator ran on (``kinds.view``), and after what other webhooks default (a JobSet's
restartPolicy): that is what the Job controller will read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.kube import failurepolicy, intent, restartrules
from webhook.kube.defaulting import DEFAULT_BACKOFF_LIMIT
from webhook.kube.failurepolicy import named_containers
from webhook.kube.intent import Path
from webhook.kube.objects import mapping
from webhook.kube.versions import CONTAINER_RESTART_RULES, KubeVersion
from webhook.plan import inplace
from webhook.plan.causes import CauseBudgets
from webhook.plan.failureaware import memory_plan, template_memory
from webhook.plan.inplace import Deadline, InPlaceEnds
from webhook.plan.model import PartPlan
from webhook.plan.outcome import Context
from webhook.plan.record import AppliedRecord
from webhook.policy.config import GuardRails
from webhook.policy.model import (
    Delays,
    Layer,
    Policy,
    Scope,
    Source,
    parse_annotations,
    resolve,
    retry_delays,
)


def steps(path: Path) -> tuple[str | int, ...]:
    """A field path as keys and list indexes: ("spec", "replicatedJobs", 0, ...); an index
    may be given as "0" or "replicatedJobs[0]"."""
    found: list[str | int] = []
    for part in path:
        indexed = re.fullmatch(r"(.*)\[([0-9]+)\]", part) if isinstance(part, str) else None
        pieces = [indexed.group(1), indexed.group(2)] if indexed else [part]
        for piece in pieces:
            if isinstance(piece, str) and piece.isdigit():
                found.append(int(piece))
            elif piece != "":
                found.append(piece)
    return tuple(found)


def at_path(obj: Mapping[str, Any], path: Path) -> Any:
    """The value at a field path (``steps``)."""
    node: Any = obj
    for step in steps(path):
        if isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        elif isinstance(node, dict) and isinstance(step, str):
            node = node.get(step)
        else:
            return None
    return node


def recorded_origins(obj: Mapping[str, Any]) -> Mapping[str, str] | None:
    """Which annotation wrote which of the webhook's rules in ``obj``, by rule id, as its
    applied record says; ``None`` when it has no record or a version-1 one, which
    recorded no origins (readers then recognise the webhook's rules by their shape)."""
    record = AppliedRecord.of(obj)
    return record.origins if record is not None and record.version >= 2 else None


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


def pod_delays(pods: Policy, ctx: Context) -> Delays | None:
    """What a template's pods wait after a failure (their ``retry-delay`` annotations, at
    most the guard rail), as the pod webhook computes it; ``None``: no delay."""
    if pods.retry_delay is None:
        return None
    rails = ctx.config.rails(ctx.namespace)
    return retry_delays(pods, rails.max_retry_delay)


def dropped_note(pod_spec: Mapping[str, Any], version: KubeVersion | None) -> list[str]:
    """Said when the cluster's API server drops the restart rules a pod spec has."""
    if not restartrules.dropped(pod_spec, version):
        return []
    gate = CONTAINER_RESTART_RULES
    return [
        f"restartPolicyRules need Kubernetes {gate.on_since} or newer ({gate.name}); this "
        f"cluster is {version}, whose API server drops them: no container restarts in place"
    ]


def deadline_of(spec: Any, original: Any, where: str) -> Deadline | None:
    """``activeDeadlineSeconds`` of ``spec`` at path ``where``, and who set it: the user,
    or the webhook from the admin's default (``inplace.write_deadline``)."""
    value = mapping(spec).get("activeDeadlineSeconds")
    if not inplace.deadline_set(value):
        return None
    yours = mapping(original).get("activeDeadlineSeconds") == value
    source = "your own" if yours else "set by retry-policy from guardRails.inPlaceDeadlineSeconds"
    return Deadline(f"{where}.activeDeadlineSeconds", value, source)


def bound_of(
    whole: Deadline | None,
    pod: Deadline | None,
    rails: GuardRails,
    outer: str | None = None,
    **words: str,
) -> InPlaceEnds:
    return InPlaceEnds(whole, pod, outer, rails.allow_unbounded_in_place, **words)


@dataclass(frozen=True)
class Parent:
    """What the kind whose object holds a JobSpec part among others says of that part, for
    its restarts in place (a JobSet of a replicated Job: ``kinds.jobset.explain``): what
    its own rules make of the part's deadlines (``bound``, as admission judges it), what
    decides once a deadline fails the part (``then``), what ``max-in-place-restarts``
    bounds them per (``per``), and a deadline outside the object (``outer``, in words)."""

    bound: inplace.Bound | None = None
    then: str = ""
    per: str = ""
    outer: str | None = None


def part_plan(
    policy: Policy,
    path: Path,
    written: Mapping[str, Any],
    final: Mapping[str, Any],
    ctx: Context,
    parent: Parent | None = None,
) -> PartPlan | None:
    """The plan of the JobSpec at ``path`` (``None`` when there is none) of ``final`` (the
    object as stored), mutated with ``policy``; ``written`` is the object as the user
    wrote it (what is theirs: rules, restart rules, deadlines). ``parent``: what the kind
    of an object made of several parts says of this one (``Parent``), handed in by it."""
    where = intent.dotted(path)  # (as given: a user reads "replicatedJobs[0]")
    path = steps(path)
    spec = at_path(final, path)
    if not isinstance(spec, dict):
        return None
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    pod_spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    limit = spec.get("backoffLimit")
    per_index = spec.get("backoffLimitPerIndex")
    max_failed = spec.get("maxFailedIndexes")
    pods = template_pod_policy(mapping(template.get("metadata")).get("annotations"))
    version = ctx.kubernetes_version
    rails = ctx.config.rails(ctx.namespace)
    return PartPlan(
        path=where,
        policy=policy,
        pods=pods,
        containers=container_names(pod_spec),
        limit=limit if isinstance(limit, int) else DEFAULT_BACKOFF_LIMIT,
        per_index=per_index if isinstance(per_index, int) else None,
        max_failed=max_failed if isinstance(max_failed, int) else None,
        rules=rules_of(spec),
        user_rules=rules_of(at_path(written, path)),
        origins=recorded_origins(final),
        on_failure=pod_spec.get("restartPolicy") == "OnFailure",
        parallelism=spec.get("parallelism"),
        completions=spec.get("completions"),
        init=[c["name"] for c in named_containers(pod_spec, "initContainers")],
        sidecars=failurepolicy.sidecar_containers(pod_spec),
        placed_by_job=str(final.get("kind")) in ("Job", "CronJob"),
        memory=memory_plan(pod_spec, pods),
        restarts=restartrules.pod_restarts(
            pod_spec, at_path(written, (*path, "template", "spec")), version
        ),
        bound=job_bound(path, where, spec, pod_spec, written, ctx, parent or Parent()),
        dropped=dropped_note(pod_spec, version),
        template_memory=template_memory(pod_spec),
        avoided_nodes=rails.max_avoided_nodes if pods.avoid_failed_nodes else None,
        delays=pod_delays(pods, ctx),
        causes=CauseBudgets.of(template),
    )


def job_bound(
    path: tuple[str | int, ...],
    where: str,
    spec: Mapping[str, Any],
    pod_spec: Mapping[str, Any],
    written: Mapping[str, Any],
    ctx: Context,
    parent: Parent,
) -> InPlaceEnds:
    """What ends the restarts in place of the JobSpec at ``path``: its deadline, its pod
    template's, or one outside the object (``ctx.outer_bound``, else ``parent.outer``)."""
    original = at_path(written, path)
    outer = ctx.outer_bound if ctx.outer_bound is not None else parent.outer
    ends_nothing = ""
    counted = True
    if outer is None and parent.bound is not None:
        # The parent's rules may restart uncounted once a deadline passes (as admission
        # judges: a JobSet's).
        ends_nothing = "" if parent.bound.present else parent.bound.unbounded
        counted = parent.bound.replaced_counted
    budget = CauseBudgets.of(mapping(spec.get("template"))).max_in_place_restarts
    return bound_of(
        deadline_of(spec, original, where),
        deadline_of(pod_spec, at_path(original, ("template", "spec")), f"{where}.template.spec"),
        ctx.config.rails(ctx.namespace),
        outer,
        then=parent.then,
        missing=f"{where}.activeDeadlineSeconds",
        ends_nothing="" if budget is not None and counted else ends_nothing,
        budget=_budget_text(spec, budget, parent.per) if budget is not None and counted else "",
    )


def _budget_text(spec: Mapping[str, Any], budget: int, per: str) -> str:
    """``max-in-place-restarts`` in words, when it ends restarts in place."""
    per_index = spec.get("backoffLimitPerIndex")
    name, limit = (
        ("backoffLimitPerIndex", per_index)
        if isinstance(per_index, int)
        else ("backoffLimit", spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
    )
    unit = per or ("per index" if name != "backoffLimit" else "")
    return (
        f"max-in-place-restarts {budget}: a pod that restarts in place {budget} times in "
        f"all is replaced, and its failure counted, so {budget} x ({name} {limit} + 1) = "
        f"{budget * (limit + 1)} restarts in place at most{' ' + unit if unit else ''}"
    )
