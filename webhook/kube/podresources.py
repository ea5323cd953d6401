"""A pod's effective requests, as the scheduler reserves them on a node.

``PodRequests`` in k8s.io/component-helpers/resource/helpers.go (the scheduler's
``NodeResourcesFit`` and the kubelet's admission call it): the regular containers summed;
each restartable init container (a sidecar: ``restartPolicy: Always``) added to that sum,
as it runs beside them; each init container's use while it runs (its own requests plus the
sidecars started before it) taken as a floor, resource by resource; pod-level requests
(``spec.resources.requests``, the PodLevelResources feature) in place of the containers'
for the resources they may set (cpu, memory, hugepages-*); then ``spec.overhead`` added.

The spec's requests, not ``status.containerStatuses[].allocatedResources``: for a pod
that has ended the two differ only after an in-place resize, which the webhook's workloads
do not make. Quantities are exact (``webhook.kube.quantity``); one that cannot be read is
left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from webhook.kube import quantity

Requests = dict[str, Fraction]

#: ``IsSupportedPodLevelResource``: what pod-level resources may set.
POD_LEVEL = ("cpu", "memory")
HUGEPAGES = "hugepages-"
#: ``v1.DefaultResourceRequestsPrefix`` and ``v1.ResourceDefaultNamespacePrefix``.
REQUESTS_PREFIX = "requests."
NATIVE_DOMAIN = "kubernetes.io/"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED = re.compile(
    rf"(?P<prefix>{_DNS_LABEL}(\.{_DNS_LABEL})*)/(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)"
)


def pod_requests(pod: Mapping[str, Any]) -> Requests:
    """``PodRequests(pod, PodResourcesOptions{})``: the pod's requests with its overhead."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    result: Requests = {}
    for container in _list(spec.get("containers")):
        _add(result, container_requests(container))
    sidecars: Requests = {}
    init_floor: Requests = {}
    for container in _list(spec.get("initContainers")):
        own = container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(result, own)
            _add(sidecars, own)
            use = dict(sidecars)
        else:
            use = dict(own)
            _add(use, sidecars)
        _max(init_floor, use)
    _max(result, init_floor)
    pod_level = _requests(spec.get("resources"))
    if any(_pod_level(name) for name in pod_level):
        result.update({k: v for k, v in pod_level.items() if _pod_level(k)})
    _add(result, _quantities(spec.get("overhead")))
    return result


def container_requests(container: Mapping[str, Any]) -> Requests:
    return _requests(container.get("resources"))


def is_extended(name: str) -> bool:
    """``IsExtendedResourceName`` (pkg/apis/core/v1/helper/helpers.go): a resource outside
    the ``kubernetes.io/`` domain (``nvidia.com/gpu``), not a quota's ``requests.`` name,
    that is a qualified name once prefixed with ``requests.``."""
    native = "/" not in name or NATIVE_DOMAIN in name
    if native or name.startswith(REQUESTS_PREFIX):
        return False
    found = _QUALIFIED.fullmatch(REQUESTS_PREFIX + name)
    return found is not None and len(found["prefix"]) <= 253 and len(found["name"]) <= 63


def _pod_level(name: str) -> bool:
    return name in POD_LEVEL or name.startswith(HUGEPAGES)


def _requests(resources: Any) -> Requests:
    return _quantities(resources.get("requests") if isinstance(resources, Mapping) else None)


def _quantities(values: Any) -> Requests:
    out: Requests = {}
    for name, raw in values.items() if isinstance(values, Mapping) else ():
        if not isinstance(name, str) or isinstance(raw, bool):
            continue
        try:
            out[name] = quantity.parse(str(raw)).value
        except quantity.QuantityError:
            continue
    return out


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [c for c in value if isinstance(c, Mapping)] if isinstance(value, list) else []


def _add(into: Requests, more: Requests) -> None:
    for name, value in more.items():
        into[name] = into.get(name, Fraction(0)) + value


def _max(into: Requests, other: Requests) -> None:
    """``maxResourceList``: each resource of ``other`` raised to in ``into``."""
    for name, value in other.items():
        if name not in into or value > into[name]:
            into[name] = value
