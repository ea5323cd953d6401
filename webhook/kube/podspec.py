"""Helpers that change a pod spec or pod template: shared by every workload mutator.

Each helper edits in place and returns what it changed, so callers can explain every
change in a warning, and each is idempotent: run twice, the second run changes nothing
(the API server may reinvoke a mutating webhook).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

from webhook.kube import quantity
from webhook.kube.owned import ALL, SHALLOW, Each, Owned
from webhook.kube.wellknown import HOSTNAME_LABEL

WORKER_NAME = "FLYTE_INTERNAL_WORKER_NAME"
ERROR_STRATEGY = "FLYTE_INTERNAL_DIST_ERROR_STRATEGY"
#: flytekit also accepts these short names; a user's own value under either is kept.
ALIASES = {WORKER_NAME: "_F_WN", ERROR_STRATEGY: "_F_DES"}
#: Why the error-propagation env vars belong only in a PyTorchJob's pods: with the strategy
#: set (any value), flytekit names its error file error-<uuid>.pb instead of error.pb
#: (``_build_error_file_name`` in flytekit/bin/entrypoint.py) and exits 0; Flyte looks for
#: those only with the PyTorch plugin's enable-distributed-error-aggregation (the
#: earliest-file reader in flyteplugins ioutils/remote_file_output_reader.go), every other
#: plugin for error.pb alone, so the task would pass for succeeded or lack its outputs.
NOT_A_PYTORCHJOB = (
    "flytekit would write its error to error-<uuid>.pb instead of error.pb, which Flyte reads "
    "only for PyTorch tasks (a PyTorchJob) with enable-distributed-error-aggregation: the "
    "task's error would be lost"
)


#: What the functions below may write in a pod spec (``webhook.kube.owned``): each container's
#: env list, appended to but its entries never edited (``add_error_propagation``), its
#: memory request and limit (``raise_memory``), and the affinity (``add_non_spot_affinity``,
#: ``avoid_nodes``).
_CONTAINER_OWNED: Owned = {"env": SHALLOW, "resources": {"requests": SHALLOW, "limits": SHALLOW}}
POD_SPEC_OWNED: dict[str, Owned] = {
    "initContainers": Each(_CONTAINER_OWNED),
    "containers": Each(_CONTAINER_OWNED),
    "affinity": ALL,
}
#: ``set_annotation``'s and ``set_label``'s part of an object's metadata: the annotations'
#: and the labels' own keys.
METADATA_OWNED: dict[str, Owned] = {"annotations": SHALLOW, "labels": SHALLOW}


def containers(pod_spec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container and init container of a pod spec (skipping malformed entries)."""
    for group in ("initContainers", "containers"):
        items = pod_spec.get(group)
        if isinstance(items, list):
            for container in items:
                if isinstance(container, dict):
                    yield container


def envs(pod_spec: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], list[Any]]]:
    """Every container and init container with its env vars (none: an empty list, not
    the container's); one whose env is not a list is skipped (the API would refuse it)."""
    for container in containers(pod_spec):
        env = container.get("env")
        env = [] if env is None else env
        if isinstance(env, list):
            yield container, env


def add_error_propagation(pod_spec: dict[str, Any], strategy: str) -> list[str]:
    """Give every container the worker name and error strategy env vars; return changed names.

    A container that already defines a variable (under its long or short name) keeps its
    own value: users who set it know something we do not.
    """
    changed = []
    wanted: dict[str, dict[str, Any]] = {
        WORKER_NAME: {
            "name": WORKER_NAME,
            # apiVersion is what the API server defaults; writing it keeps reinvocation a no-op.
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
        },
        ERROR_STRATEGY: {"name": ERROR_STRATEGY, "value": strategy},
    }
    for container, env in envs(pod_spec):
        present = {e.get("name") for e in env if isinstance(e, dict)}
        added = False
        for name, entry in wanted.items():
            if name in present or ALIASES[name] in present:
                continue
            env.append(dict(entry))
            added = True
        if added:
            container["env"] = env
            changed.append(str(container.get("name", "?")))
    return changed


def spot_requirements(spot_labels: Mapping[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    return [
        {"key": key, "operator": "NotIn", "values": list(values)}
        for key, values in sorted(spot_labels.items())
    ]


def add_non_spot_affinity(
    pod_spec: dict[str, Any], spot_labels: Mapping[str, tuple[str, ...]]
) -> bool:
    """AND a ``NotIn`` requirement per spot label into every required node selector term.

    Terms stay ORed, so each one must exclude spot nodes; a user's own terms and
    expressions are kept as they are. With no required terms, one new term is made. A
    term with no requirements at all matches no node (``isEmptyNodeSelectorTerm`` in
    k8s.io/component-helpers' nodeaffinity): it is left as it is, since adding
    requirements would widen it to every non-spot node.
    """
    requirements = spot_requirements(spot_labels)
    if not requirements:
        return False
    return and_into_terms(pod_spec, "matchExpressions", requirements)


def and_into_terms(pod_spec: dict[str, Any], part: str, requirements: list[dict[str, Any]]) -> bool:
    """AND ``requirements`` into ``part`` (matchExpressions or matchFields) of every
    required node selector term that has any requirement (terms stay ORed; an empty term
    matches no node and is left so); one new term when there is none. ``True`` when
    anything was added (a requirement already there is not added twice)."""
    affinity = _child(pod_spec, "affinity")
    node = _child(affinity, "nodeAffinity")
    required = _child(node, "requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        required["nodeSelectorTerms"] = [{part: [_copy(r) for r in requirements]}]
        return True
    changed = False
    for term in terms:
        if not isinstance(term, dict) or is_empty_term(term):
            continue
        listed = term.get(part)
        if not isinstance(listed, list):
            listed = term[part] = []
        for requirement in requirements:
            if not any(_same_requirement(requirement, e) for e in listed):
                listed.append(_copy(requirement))
                changed = True
    return changed


def _copy(requirement: Mapping[str, Any]) -> dict[str, Any]:
    return dict(requirement, values=list(requirement["values"]))


def is_empty_term(term: Mapping[str, Any]) -> bool:
    """A node selector term without matchExpressions and without matchFields: it selects
    no node at all (the scheduler skips it)."""
    return not term.get("matchExpressions") and not term.get("matchFields")


def _child(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """The mapping at ``parent[key]``, created when absent (or null)."""
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return value


def _same_requirement(wanted: Mapping[str, Any], existing: Any) -> bool:
    return (
        isinstance(existing, dict)
        and existing.get("key") == wanted["key"]
        and existing.get("operator") == wanted["operator"]
        and isinstance(existing.get("values"), list)
        and sorted(map(str, existing["values"])) == sorted(wanted["values"])
    )


def requires_spot(
    pod_spec: Mapping[str, Any], spot_labels: Mapping[str, tuple[str, ...]]
) -> str | None:
    """Describe how the pod spec pins itself to spot nodes, if it does (else ``None``).

    Adding a non-spot requirement to such a pod would leave it unschedulable, so this is
    a contradiction to report rather than a change to make.
    """
    selector = pod_spec.get("nodeSelector")
    if isinstance(selector, dict):
        for key, value in selector.items():
            if value in spot_labels.get(key, ()):
                return f"nodeSelector {key}={value}"
    terms = required_terms(pod_spec)
    if not isinstance(terms, list) or not terms:
        return None
    pinned = []
    for term in terms:
        if isinstance(term, dict) and is_empty_term(term):
            continue  # it matches no node, spot or not
        expressions = (term or {}).get("matchExpressions") or [] if isinstance(term, dict) else []
        reason = next((r for e in expressions if (r := _pins_spot(e, spot_labels))), None)
        if reason is None:
            return None  # this term admits non-spot nodes, and terms are ORed
        pinned.append(reason)
    return "required node affinity " + pinned[0] if pinned else None


def required_terms(pod_spec: Mapping[str, Any]) -> Any:
    """``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
    .nodeSelectorTerms`` (``None`` when a part of the way is missing or not a mapping)."""
    affinity = pod_spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = (
        node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node, dict)
        else None
    )
    return required.get("nodeSelectorTerms") if isinstance(required, dict) else None


def _pins_spot(expression: Any, spot_labels: Mapping[str, tuple[str, ...]]) -> str | None:
    if not isinstance(expression, dict):
        return None
    key = expression.get("key")
    values = expression.get("values") or []
    spot_values = spot_labels.get(key) if isinstance(key, str) else None
    if not spot_values or expression.get("operator") != "In" or not isinstance(values, list):
        return None
    if values and all(v in spot_values for v in values):
        return f"{key} In {values}"
    return None


def set_annotation(metadata: Any, key: str, value: str) -> bool:
    """Set one annotation; ``False`` when it was already so, or there is no metadata
    mapping to hold it (a malformed object, refused by the API server anyway)."""
    return _set_in(metadata, "annotations", key, value)


def set_label(metadata: Any, key: str, value: str) -> bool:
    """Set one label (as ``set_annotation``); a pod made from a template carries it."""
    return _set_in(metadata, "labels", key, value)


def _set_in(metadata: Any, field: str, key: str, value: str) -> bool:
    if not isinstance(metadata, dict):
        return False
    values = metadata.get(field)
    if not isinstance(values, dict):
        values = {}
    if values.get(key) == value:
        return False
    values[key] = value
    metadata[field] = values
    return True


# --- failure-aware retries: another node, more memory ----------------------------------

NODE_NAME_FIELD = "metadata.name"


def node_requirements(nodes: list[str]) -> list[dict[str, Any]]:
    """Keep off ``nodes``: one ``matchFields`` requirement per node, since a node field
    requirement takes exactly one value (``ValidateNodeFieldSelectorRequirement``). A
    node's name is what ``spec.nodeName`` of the failed pod names; the
    ``kubernetes.io/hostname`` label usually equals it but need not."""
    return [{"key": NODE_NAME_FIELD, "operator": "NotIn", "values": [n]} for n in nodes]


def avoid_nodes(pod_spec: dict[str, Any], nodes: list[str]) -> bool:
    """AND ``node_requirements`` into every required node selector term."""
    return bool(nodes) and and_into_terms(pod_spec, "matchFields", node_requirements(nodes))


#: The weight of the preference to keep off failed nodes (the most a term may have): a
#: failure is strong evidence against a node, stronger than most placement tastes.
AVOID_WEIGHT = 100


def prefer_off_nodes(pod_spec: dict[str, Any], nodes: list[str]) -> bool:
    """Keep off ``nodes`` by preference: one preferred term (weight ``AVOID_WEIGHT``) whose
    ``matchFields`` every other node satisfies; ``True`` when it was added (the same term
    already there is not added twice). A user's own preferred terms are kept."""
    if not nodes:
        return False
    affinity = _child(pod_spec, "affinity")
    node = _child(affinity, "nodeAffinity")
    preferred = node.get("preferredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(preferred, list):
        preferred = node["preferredDuringSchedulingIgnoredDuringExecution"] = []
    term = {"weight": AVOID_WEIGHT, "preference": {"matchFields": node_requirements(nodes)}}
    if term in preferred:
        return False
    preferred.append(term)
    return True


def pinned_to(pod_spec: Mapping[str, Any], nodes: list[str]) -> str | None:
    """How the pod spec allows only nodes among ``nodes``, if it does: then keeping it off
    them would leave it nowhere to run. Looks at ``spec.nodeName``, a hostname
    ``nodeSelector``, and required terms that each name only such nodes (by
    ``metadata.name`` or hostname, which is taken for the node's name here: when in
    doubt, the pod is left schedulable)."""
    avoided = set(nodes)
    name = pod_spec.get("nodeName")
    if isinstance(name, str) and name:
        return f"spec.nodeName {name}"
    selector = pod_spec.get("nodeSelector")
    if isinstance(selector, dict) and selector.get(HOSTNAME_LABEL) in avoided:
        return f"nodeSelector {HOSTNAME_LABEL}={selector[HOSTNAME_LABEL]}"
    terms = required_terms(pod_spec)
    live = [t for t in terms if isinstance(t, dict) and not is_empty_term(t)] if terms else []
    if not live or not all(_names_only(t, avoided) for t in live):
        return None
    return "required node affinity terms that name only those nodes"


def _names_only(term: Mapping[str, Any], avoided: set[str]) -> bool:
    """Whether a term admits no node outside ``avoided`` (an ``In`` on the node name)."""
    for part, key in (("matchFields", NODE_NAME_FIELD), ("matchExpressions", HOSTNAME_LABEL)):
        listed = term.get(part)
        for requirement in listed if isinstance(listed, list) else ():
            values = requirement.get("values") if isinstance(requirement, dict) else None
            if (
                isinstance(values, list)
                and values
                and requirement.get("key") == key
                and requirement.get("operator") == "In"
                and set(values) <= avoided
            ):
                return True
    return False


def memory_of(container: Mapping[str, Any], kind: str) -> quantity.Quantity | None:
    """A container's memory request or limit (``kind``: requests, limits), if it has a
    valid one."""
    resources = container.get("resources")
    values = resources.get(kind) if isinstance(resources, dict) else None
    raw = values.get("memory") if isinstance(values, dict) else None
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        return quantity.parse(str(raw))
    except quantity.QuantityError:
        return None


def memory_target(
    container: Mapping[str, Any],
    factor: Fraction,
    cap: quantity.Quantity,
    at: tuple[int | None, int | None] | None = None,
) -> dict[str, tuple[quantity.Quantity, quantity.Quantity]]:
    """What a raise gives a container: for its memory request and limit (``kind``:
    requests, limits; those it has), (before, after). ``after`` is ``factor`` times the
    memory the container was OOM-killed at (``at``: request, limit in bytes; its present
    value where unknown), rounded up (``quantity.scaled``), at most ``cap`` and never
    below ``before``; the request at most the limit. A value that is absent stays absent
    (a container without a limit keeps none)."""
    out: dict[str, tuple[quantity.Quantity, quantity.Quantity]] = {}
    for kind, killed in zip(("requests", "limits"), at or (None, None), strict=True):
        before = memory_of(container, kind)
        if before is None:
            continue
        base = before if killed is None else before.with_value(Fraction(killed))
        wanted = quantity.scaled(base, factor)
        after = before if wanted <= before.value else before.with_value(wanted)
        if after.value > cap.value:
            after = cap if cap.value > before.value else before
        out[kind] = (before, after)
    if "requests" in out and "limits" in out:
        (request, raised), (_, limit) = out["requests"], out["limits"]
        if raised.value > limit.value:  # (the API server refuses a request above the limit)
            out["requests"] = (request, limit if limit.value > request.value else request)
    return out


def set_memory(container: dict[str, Any], kind: str, value: quantity.Quantity) -> str | None:
    """Write a container's memory request or limit (``kind``); the value it replaced, as
    written, or ``None`` when it was already ``value`` (or there is no such value)."""
    resources = container.get("resources")
    values = resources.get(kind) if isinstance(resources, dict) else None
    if not isinstance(values, dict) or "memory" not in values:
        return None
    before = memory_of(container, kind)
    if before is not None and before.value == value.value:
        return None
    shown = str(values["memory"])
    values["memory"] = str(value)
    return shown


def raise_memory(
    container: dict[str, Any],
    factor: Fraction,
    cap: quantity.Quantity,
    at: tuple[int | None, int | None] | None = None,
) -> list[tuple[str, str, str]]:
    """Raise a container's memory as ``memory_target`` says; (kind, before, after) for
    each value changed."""
    changed = []
    for kind, (_, after) in memory_target(container, factor, cap, at).items():
        shown = set_memory(container, kind, after)
        if shown is not None:
            changed.append((kind, shown, str(after)))
    return changed
