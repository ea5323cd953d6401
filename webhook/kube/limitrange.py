"""A namespace's LimitRanges, as far as memory goes: what LimitRanger would refuse.

LimitRanger is an admission plugin of the API server. Its defaulting half runs before the
mutating webhooks, so a pod reaches the webhook with the LimitRange's default request and
limit already filled in; its validating half runs after them, on the pod the webhooks
made (``AllOrderedPlugins`` in pkg/kubeapiserver/options/plugins.go). A pod it refuses
is never created: the Job controller records ``FailedCreate`` and tries again, with
back-off, until the Job's deadline. So a memory raise must stay within what it checks
(``PodValidateLimitFunc`` in plugin/pkg/admission/limitranger/admission.go), for memory:

- ``type: Container``: every container and init container: ``max`` bounds the limit (which
  must exist) and the request; ``maxLimitRequestRatio`` bounds limit / request (both must
  exist and be above 0);
- ``type: Pod``: the same on the pod's totals, ``podRequests`` and ``podLimits``: regular
  containers and sidecars (init containers with ``restartPolicy: Always``) add up; each
  other init container counts with the sidecars started before it, and the pod's total
  is the largest of those sums; pod-level ``spec.resources`` replaces the total.

Every LimitRange of the namespace is checked, so the bounds are the tightest of them.
``min`` is left out: a raise never lowers memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from webhook.kube import podspec, quantity

KINDS = ("requests", "limits")


@dataclass(frozen=True)
class Bound:
    """One bound: its value and the LimitRange that sets it (``namespace/name``)."""

    value: Fraction
    text: str
    source: str


@dataclass(frozen=True)
class MemoryLimits:
    """The tightest memory bounds of a namespace's LimitRanges (``None``: no bound)."""

    container_max: Bound | None = None
    container_ratio: Bound | None = None
    pod_max: Bound | None = None
    pod_ratio: Bound | None = None

    @property
    def any(self) -> bool:
        return any((self.container_max, self.container_ratio, self.pod_max, self.pod_ratio))


NONE = MemoryLimits()


def memory_limits(limit_ranges: Iterable[Mapping[str, Any]]) -> MemoryLimits:
    """The memory bounds of these LimitRange objects together."""
    found: dict[str, Bound] = {}
    for obj in limit_ranges:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        source = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        items = spec.get("limits") if isinstance(spec, Mapping) else None
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, Mapping) or item.get("type") not in ("Container", "Pod"):
                continue
            scope = "container" if item["type"] == "Container" else "pod"
            for field, what in (("max", "max"), ("maxLimitRequestRatio", "ratio")):
                values = item.get(field)
                raw = values.get("memory") if isinstance(values, Mapping) else None
                try:
                    parsed = quantity.parse(str(raw)) if raw is not None else None
                except quantity.QuantityError:
                    parsed = None
                if parsed is None:
                    continue
                key = f"{scope}_{what}"
                if key not in found or parsed.value < found[key].value:
                    found[key] = Bound(parsed.value, str(parsed), source)
    return MemoryLimits(
        found.get("container_max"),
        found.get("container_ratio"),
        found.get("pod_max"),
        found.get("pod_ratio"),
    )


# --- the pod's totals, as LimitRanger computes them ------------------------------------


def _sidecar(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def _listed(pod_spec: Mapping[str, Any]) -> list[tuple[bool, dict[str, Any]]]:
    """(is an init container, container), in ``podspec.containers``' order."""
    out = []
    for group in ("initContainers", "containers"):
        items = pod_spec.get(group)
        for c in items if isinstance(items, list) else ():
            if isinstance(c, dict):
                out.append((group == "initContainers", c))
    return out


def terms(
    pod_spec: Mapping[str, Any], values: list[Fraction | None]
) -> list[tuple[Fraction, frozenset[int]]]:
    """The sums whose largest is the pod's total of one resource (``podRequests`` /
    ``podLimits`` in LimitRanger), each with the positions (in ``podspec.containers``'
    order) of the containers it adds up; ``values`` are theirs (``None``: unset, 0)."""
    listed = _listed(pod_spec)
    main: set[int] = set()
    total = Fraction(0)
    sidecars: set[int] = set()
    sidecar_total = Fraction(0)
    out = []
    for position, (init, container) in enumerate(listed):
        value = values[position] or Fraction(0)
        if not init or _sidecar(container):
            main.add(position)
            total += value
            if init:
                sidecars.add(position)
                sidecar_total += value
        else:
            out.append((value + sidecar_total, frozenset({position, *sidecars})))
    return [(total, frozenset(main)), *out]


def pod_total(pod_spec: Mapping[str, Any], kind: str) -> Fraction | None:
    """The pod's memory request or limit total as LimitRanger reads it (``None``: no
    container sets it)."""
    own = podspec.memory_of(pod_spec, kind)
    if own is not None:
        return own.value
    values = [_value(c, kind) for _, c in _listed(pod_spec)]
    if all(v is None for v in values):
        return None
    return max(value for value, _ in terms(pod_spec, values))


def _value(container: Mapping[str, Any], kind: str) -> Fraction | None:
    found = podspec.memory_of(container, kind)
    return found.value if found is not None else None


def violations(pod_spec: Mapping[str, Any], limits: MemoryLimits) -> set[str]:
    """What LimitRanger would refuse in this pod, for memory (one text each)."""
    out: set[str] = set()
    for _, container in _listed(pod_spec):
        name = container.get("name")
        request, limit = _value(container, "requests"), _value(container, "limits")
        out |= _check(f"container {name}", request, limit, limits.container_max)
        out |= _ratio(f"container {name}", request, limit, limits.container_ratio)
    request, limit = pod_total(pod_spec, "requests"), pod_total(pod_spec, "limits")
    out |= _check("pod", request, limit, limits.pod_max)
    out |= _ratio("pod", request, limit, limits.pod_ratio)
    return out


def _check(
    where: str, request: Fraction | None, limit: Fraction | None, bound: Bound | None
) -> set[str]:
    """``maxConstraint``: a limit must exist and neither may exceed the bound."""
    if bound is None:
        return set()
    if limit is None:
        return {f"{where}: no memory limit (max {bound.text})"}
    out = set()
    if limit > bound.value or (request is not None and request > bound.value):
        out.add(f"{where}: memory above max {bound.text}")
    return out


def _ratio(
    where: str, request: Fraction | None, limit: Fraction | None, bound: Bound | None
) -> set[str]:
    """``limitRequestRatioConstraint``: both exist, above 0, limit <= request x ratio."""
    if bound is None:
        return set()
    if not request or not limit:
        return {f"{where}: no memory request or limit (ratio {bound.text})"}
    return {f"{where}: memory ratio above {bound.text}"} if limit > request * bound.value else set()


# --- a raise within the bounds ------------------------------------------------------------

#: A raise: container position -> kind (requests, limits) -> (before, wanted).
Raise = dict[int, dict[str, tuple[quantity.Quantity, quantity.Quantity]]]


@dataclass
class Fitted:
    """A raise after the bounds: the values (position -> kind -> after), what held each
    value back from what was wanted (position -> text), and ``refused``: what LimitRanger
    would still refuse that it would not refuse without the raise (then nothing is
    raised)."""

    values: dict[int, dict[str, quantity.Quantity]]
    held: dict[int, str]
    refused: set[str]


def fit(pod_spec: Mapping[str, Any], wanted: Raise, limits: MemoryLimits) -> Fitted:
    """The most of ``wanted`` that LimitRanger lets through: each value at most the
    container ``max``; the limit at most request x ``maxLimitRequestRatio``; the pod's
    totals at most the pod ``max``, containers raised in order until it is reached (the
    first gets the most); never below what a container had. Checked at the end against
    every memory rule (``violations``): a raise that would still be refused, where the
    pod as it came would not, is given up whole."""
    values = {p: {k: after for k, (_, after) in kinds.items()} for p, kinds in wanted.items()}
    held: dict[int, str] = {}

    def bound(position: int, kind: str, most: Fraction, why: str) -> None:
        before = wanted[position][kind][0]
        after = values[position][kind]
        if after.value <= most:
            return
        lowered = _floored(before, most)
        if lowered.value < after.value:
            values[position][kind] = lowered
            held[position] = why

    for position, kinds in wanted.items():
        for kind in kinds:
            if limits.container_max is not None:
                b = limits.container_max
                bound(position, kind, b.value, f"LimitRange {b.source} container max {b.text}")
        if limits.container_ratio is not None and {"requests", "limits"} <= set(kinds):
            b = limits.container_ratio
            most = values[position]["requests"].value * b.value
            bound(position, "limits", most, f"LimitRange {b.source} maxLimitRequestRatio {b.text}")
    if limits.pod_max is not None:
        for kind in KINDS:
            if podspec.memory_of(pod_spec, kind) is None:  # (pod-level memory: the total)
                _fit_pod(pod_spec, wanted, values, held, kind, limits.pod_max)
    for kinds in values.values():  # the request at most the limit
        if "requests" in kinds and "limits" in kinds:
            if kinds["requests"].value > kinds["limits"].value:
                kinds["requests"] = kinds["limits"]
    after = _applied(pod_spec, values)
    refused = violations(after, limits) - violations(pod_spec, limits)
    return Fitted(values, held, refused)


def _fit_pod(
    pod_spec: Mapping[str, Any],
    wanted: Raise,
    values: dict[int, dict[str, quantity.Quantity]],
    held: dict[int, str],
    kind: str,
    pod_max: Bound,
) -> None:
    listed = _listed(pod_spec)
    current = [_value(c, kind) for _, c in listed]
    raised = sorted(p for p in wanted if kind in wanted[p])
    for position in raised:  # the raise starts from what each container had
        current[position] = wanted[position][kind][0].value
    for position in raised:
        before = wanted[position][kind][0]
        room = min(
            (
                pod_max.value - total
                for total, members in terms(pod_spec, current)
                if position in members
            ),
            default=pod_max.value,
        )
        most = before.value + max(room, Fraction(0))
        after = values[position][kind]
        if after.value > most:
            lowered = _floored(before, most)
            values[position][kind] = lowered
            held[position] = f"LimitRange {pod_max.source} pod max {pod_max.text}"
        current[position] = values[position][kind].value


def _floored(before: quantity.Quantity, most: Fraction) -> quantity.Quantity:
    """The largest value up to ``most`` in the raise's steps (a whole Mi or M, once that
    large), never below ``before``."""
    unit = Fraction(2**20) if before.format == quantity.BINARY else Fraction(10**6)
    step = unit if most >= unit else Fraction(1)
    value = Fraction(math.floor(most / step)) * step
    return before.with_value(value) if value > before.value else before


def _applied(
    pod_spec: Mapping[str, Any], values: dict[int, dict[str, quantity.Quantity]]
) -> dict[str, Any]:
    """A copy of the pod spec's containers with ``values`` written in (for the check)."""
    copied = dict(pod_spec)
    listed = iter(range(len(_listed(pod_spec))))
    for group in ("initContainers", "containers"):
        items = pod_spec.get(group)
        if not isinstance(items, list):
            continue
        out = []
        for c in items:
            if not isinstance(c, dict):
                out.append(c)
                continue
            position = next(listed)
            kinds = values.get(position)
            if kinds:
                resources = dict(c.get("resources") or {})
                for kind, value in kinds.items():
                    resources[kind] = {**(resources.get(kind) or {}), "memory": str(value)}
                c = {**c, "resources": resources}
            out.append(c)
        copied[group] = out
    return copied
