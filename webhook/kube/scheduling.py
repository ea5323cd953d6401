"""Where the scheduler may put a pod, as far as its placement rules go: node selector,
required node affinity, taints and tolerations, and cordoned nodes.

``avoid-failed-nodes`` keeps a new attempt off the nodes where earlier ones failed, as a
requirement only while another node remains that the pod may use (``webhook.kinds.pod``).
Whether one remains is decided here, node by node, the way the scheduler's filters decide
it (a node that passes these may still lack room: resources are left out, since an
autoscaler or a finished pod can make room, while a rule never changes by itself):

- ``nodeSelector`` and ``requiredDuringSchedulingIgnoredDuringExecution``, evaluated as
  ``RequiredNodeAffinity.Match`` does (k8s.io/component-helpers
  scheduling/corev1/nodeaffinity/nodeaffinity.go): every selector label equal; node
  selector terms ORed, an empty term matching nothing, a term with an invalid requirement
  matching nothing; a term's requirements ANDed, ``matchFields`` on ``metadata.name``;
- taints with effect ``NoSchedule`` or ``NoExecute`` must each be tolerated
  (``FindMatchingUntoleratedTaint`` with ``DoNotScheduleTaintsFilterFunc``, in
  k8s.io/component-helpers scheduling/corev1/helpers.go and the scheduler's
  plugins/helper/taint.go; ``Toleration.ToleratesTaint`` in k8s.io/api core/v1). A
  ``Lt``/``Gt`` toleration (behind an alpha gate) is taken as tolerating nothing;
- a cordoned node (``spec.unschedulable``) only for a pod tolerating the
  ``node.kubernetes.io/unschedulable:NoSchedule`` taint (the NodeUnschedulable plugin);
- and only a node whose ``Ready`` condition is ``True`` counts as a place to run: a node
  that is not ready gets a ``not-ready`` NoSchedule taint a moment later anyway.

Every judgement that cannot be made counts against the node, so an answer of "some node
remains" is never wrong for these rules; the price of a wrong "none" is only a preference
instead of a requirement.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.kube import podspec
from webhook.kube.wellknown import UNSCHEDULABLE_TAINT

NODE_NAME_FIELD = "metadata.name"
#: The taint effects the scheduler filters on (``DoNotScheduleTaintsFilterFunc``).
FILTERED_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Node:
    """What placement reads of a Node, kept small: a cache holds every node."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    #: (key, value, effect) of its NoSchedule and NoExecute taints.
    taints: tuple[tuple[str, str, str], ...] = ()
    unschedulable: bool = False
    ready: bool = True
    #: ``labels`` as a mapping, made once (placement reads it for every question).
    label_map: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.label_map and self.labels:
            object.__setattr__(self, "label_map", dict(self.labels))


def node_of(obj: Mapping[str, Any]) -> Node | None:
    """A Node object as ``Node``; ``None`` without a name."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    taints = []
    for taint in spec.get("taints") or ():
        if isinstance(taint, dict) and taint.get("effect") in FILTERED_EFFECTS:
            taints.append(
                (str(taint.get("key") or ""), str(taint.get("value") or ""), taint["effect"])
            )
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    ready = any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    return Node(
        name,
        tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        tuple(sorted(taints)),
        spec.get("unschedulable") is True,
        ready,
    )


@dataclass(frozen=True)
class Placement:
    """A pod's placement rules (canonical JSON, so equal rules are equal questions: its
    node selector, the terms of its required node affinity, its tolerations) and the nodes
    it must keep off: the question whether a node remains for it."""

    selector: str
    required: str
    tolerations: str
    avoided: tuple[str, ...]


def placement(pod_spec: Mapping[str, Any], avoided: Iterable[str]) -> Placement:
    return Placement(
        _canonical(pod_spec.get("nodeSelector")),
        _canonical(podspec.required_terms(pod_spec)),
        _canonical(pod_spec.get("tolerations")),
        tuple(avoided),
    )


def _canonical(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() if value else ""


def fits(node: Node, question: Placement) -> bool:
    """Whether the pod may be placed on ``node`` and ``node`` is not one it avoids."""
    if node.name in question.avoided or not node.ready:
        return False
    selector, terms, tolerations = _parsed(question)
    labels = node.label_map
    if selector is None or any(labels.get(k) != v for k, v in selector.items()):
        return False
    if terms is not None and not _matches_terms(terms, node.name, labels):
        return False
    if tolerations is None:
        return False
    if node.unschedulable and not _tolerated(tolerations, (UNSCHEDULABLE_TAINT, "", "NoSchedule")):
        return False
    return all(_tolerated(tolerations, taint) for taint in node.taints)


@functools.lru_cache(maxsize=256)
def _parsed(question: Placement) -> tuple[dict[str, Any] | None, Any, list[Any] | None]:
    """The question's rules decoded once, not once per node (``None``: malformed)."""
    selector = orjson.loads(question.selector) if question.selector else {}
    terms = orjson.loads(question.required) if question.required else None
    tolerations = orjson.loads(question.tolerations) if question.tolerations else []
    return (
        selector if isinstance(selector, dict) else None,
        terms,
        tolerations if isinstance(tolerations, list) else None,
    )


def _matches_terms(terms: Any, name: str, labels: Mapping[str, str]) -> bool:
    """``LazyErrorNodeSelector.Match``: terms ORed; an empty or invalid term matches no node."""
    for term in terms if isinstance(terms, list) else ():
        if not isinstance(term, dict) or podspec.is_empty_term(term):
            continue
        if _term_matches(term, name, labels):
            return True
    return False


def _term_matches(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list):
        return False
    return all(_label_matches(e, labels) for e in expressions) and all(
        _field_matches(f, name) for f in fields
    )


def _label_matches(requirement: Any, labels: Mapping[str, str]) -> bool:
    """``labels.Requirement.Matches`` for a node selector requirement; an invalid one
    (``NewRequirement`` refuses it) matches nothing."""
    if not isinstance(requirement, dict) or not isinstance(requirement.get("key"), str):
        return False
    key, operator = requirement["key"], requirement.get("operator")
    values = requirement.get("values") or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return False
    present = key in labels
    if operator in ("In", "NotIn"):
        if not values:
            return False
        inside = present and labels[key] in values
        return inside if operator == "In" else not inside
    if operator in ("Exists", "DoesNotExist"):
        return not values and present == (operator == "Exists")
    if operator in ("Gt", "Lt"):
        if len(values) != 1 or not present:
            return False
        wanted, have = _int64(values[0]), _int64(labels[key])
        if wanted is None or have is None:
            return False
        return have > wanted if operator == "Gt" else have < wanted
    return False


def _int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``."""
    body = text[1:] if text[:1] in "+-" else text
    if not body.isascii() or not body.isdigit():
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _field_matches(requirement: Any, name: str) -> bool:
    """``nodeSelectorRequirementsAsFieldSelector``: In or NotIn, exactly one value; a
    node's only field is its name."""
    if not isinstance(requirement, dict):
        return False
    values = requirement.get("values")
    if not isinstance(values, list) or len(values) != 1:
        return False
    have = name if requirement.get("key") == NODE_NAME_FIELD else ""
    if requirement.get("operator") == "In":
        return have == values[0]
    if requirement.get("operator") == "NotIn":
        return have != values[0]
    return False


def _tolerated(tolerations: list[Any], taint: tuple[str, str, str]) -> bool:
    """``TolerationsTolerateTaint`` with comparison operators off."""
    key, value, effect = taint
    for toleration in tolerations:
        if not isinstance(toleration, dict):
            continue
        if toleration.get("effect") and toleration["effect"] != effect:
            continue
        if toleration.get("key") and toleration["key"] != key:
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" or (
            operator == "Equal" and (toleration.get("value") or "") == value
        ):
            return True
    return False
