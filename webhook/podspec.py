"""Helpers that change a pod spec or pod template: shared by every workload mutator.

Each helper edits in place and returns what it changed, so callers can explain every
change in a warning, and each is idempotent: run twice, the second run changes nothing
(the API server may reinvoke a mutating webhook).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.owned import ALL, SHALLOW, Each, Owned

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


#: What the functions below may write in a pod spec (``webhook.owned``): each container's
#: env list, appended to but its entries never edited (``add_error_propagation``), and the
#: affinity (``add_non_spot_affinity``).
POD_SPEC_OWNED: dict[str, Owned] = {
    "initContainers": Each({"env": SHALLOW}),
    "containers": Each({"env": SHALLOW}),
    "affinity": ALL,
}
#: ``set_annotation``'s part of an object's metadata: the annotations' own keys.
METADATA_OWNED: dict[str, Owned] = {"annotations": SHALLOW}


def containers(pod_spec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container and init container of a pod spec (skipping malformed entries)."""
    for group in ("initContainers", "containers"):
        items = pod_spec.get(group)
        if isinstance(items, list):
            for container in items:
                if isinstance(container, dict):
                    yield container


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
    for container in containers(pod_spec):
        env = container.get("env")
        if env is None:
            env = []
        if not isinstance(env, list):
            continue
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
    affinity = _child(pod_spec, "affinity")
    node = _child(affinity, "nodeAffinity")
    required = _child(node, "requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        required["nodeSelectorTerms"] = [{"matchExpressions": [dict(r) for r in requirements]}]
        return True
    changed = False
    for term in terms:
        if not isinstance(term, dict) or is_empty_term(term):
            continue
        expressions = term.get("matchExpressions")
        if not isinstance(expressions, list):
            expressions = term["matchExpressions"] = []
        for requirement in requirements:
            if not any(_same_requirement(requirement, e) for e in expressions):
                expressions.append(dict(requirement, values=list(requirement["values"])))
                changed = True
    return changed


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
    affinity = pod_spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = (
        node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node, dict)
        else None
    )
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
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
    if not isinstance(metadata, dict):
        return False
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    if annotations.get(key) == value:
        return False
    annotations[key] = value
    metadata["annotations"] = annotations
    return True
