"""An object's policy, resolved from its annotations over the admins' defaults: what
admission, ``explain`` and ``status`` read a workload's or a pod's settings with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.kube.objects import controller_of
from webhook.plan.outcome import Context
from webhook.policy.model import (
    APPLIED,
    CARRIED_SOURCES,
    KEYS,
    PREFIX,
    Layer,
    Policy,
    Scope,
    Source,
    parse_annotations,
    resolve,
)
from webhook.problems import Problem


def policy_keys(metadata: Any) -> tuple[str, ...]:
    """The known keys of our annotations on an object, by short name, but ``applied``
    (what metrics count mutations by: never a user's string)."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return ()
    return tuple([_SHORT[k] for k in annotations if k in _SHORT])


#: Each known key of ours but ``applied``, by its full name: its short name.
_SHORT = {PREFIX + name: name for name in KEYS if PREFIX + name != APPLIED}


#: Our annotations that the webhook (or its controller) writes: no author opts in with them.
WRITTEN_KEYS = frozenset({"applied", "audit", "history", "defaults", "not-before", "jobset-uid"})


def asks_for_policy(metadata: Any) -> bool:
    """Whether the object's author opted in: a ``retry-policy.dev/`` annotation other
    than those the webhook writes (an audited workload's record does not make it one)."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return False
    cut = len(PREFIX)
    return any(
        isinstance(k, str) and k.startswith(PREFIX) and k[cut:] not in WRITTEN_KEYS
        for k in annotations
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
    if not isinstance(annotations, dict):
        return False
    for k in annotations:
        if isinstance(k, str) and k.startswith(PREFIX):
            return True
    return False


#: Resolved policies: a workload's by (config, namespace, our annotations), a pod's by its
#: annotations. Jobs made from one template
#: (a CronJob, a pipeline) carry the same annotations, so resolution is done once; the
#: results are immutable (frozen Policy, Problems only read), hence safe to share.
_POLICIES: dict[tuple, tuple[Any, Policy, list[Problem]]] = {}
_POLICIES_MAX = 1024


def workload_policy(
    metadata: Any, ctx: Context, live: bool = False
) -> tuple[Policy, list[Problem]]:
    """Resolve a workload's policy: its annotations over namespace and cluster defaults
    (``live``: the config's even for an object a controller made, which carried none:
    an audited TrainJob's JobSet, ``kinds.jobset.mutate.owner_audited``)."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    ours = _policy_items(annotations)

    controlled = controller_of(metadata) is not None and not live

    def compute() -> tuple[Policy, list[Problem]]:
        values, problems = parse_annotations(annotations, Scope.WORKLOAD)
        if controlled:
            below = carried_layers(values, ctx.namespace)
        else:
            below = ctx.config.layers(ctx.namespace) if live else default_layers(metadata, ctx)
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
    items = sorted(
        [(k, v) for k, v in annotations.items() if isinstance(k, str) and k.startswith(PREFIX)]
    )
    for _, v in items:
        if not isinstance(v, str):
            return None
    return tuple(items)
