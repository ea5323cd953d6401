"""What a failed attempt cost: its pod's requests for as long as it ran, by cause
(``retry_webhook_wasted_resource_seconds_total{namespace, cause, resource}``).

- **Requests**: the pod's effective requests as the scheduler reserved them
  (``webhook.kube.podresources.pod_requests``): ``cpu`` in core-seconds, ``memory`` in
  GiB-seconds (bytes / 2^30), and every extended resource (``nvidia.com/gpu``: device
  seconds). Other native resources (``ephemeral-storage``, ``hugepages-*``) are not counted.
- **Run time**: from ``status.startTime`` (the kubelet's, once it accepted the pod; else
  the earliest ``startedAt`` of its containers) to the latest ``finishedAt`` of its
  containers, init containers included (else the ``DisruptionTarget`` condition's time:
  a pod PodGC failed when its node went keeps its containers ``running``). A pod with
  either end unknown (one the kubelet rejected before any container ran) counts nothing.
- **Cause**: the attempt's failure category (``webhook.policy.categories``): the one the
  controller wrote on the pod (``retry-policy.dev/<Category>``: ``webhook.controller.
  verdicts``), else what the classifier makes of the pod alone
  (``webhook.cluster.classify``, with the config's categories; without its Events, so an
  Xid told only in an Event is not seen, and a taint manager's eviction is taken for a
  lost node). A pod the controller ended because it used up ``max-in-place-restarts``
  (``webhook.controller.restarts``) fails by its deadline, but its time went to the exits
  it restarted on: ``OOMKilled`` when one of them was an OOM kill, else ``AppError``. The
  label's values are the categories there are: the built-in ones and the config's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from webhook.cluster.classify import classify, of_conditions
from webhook.cluster.history import OOM_KILLED, failure_cause, parse_time
from webhook.kube.failurepolicy import IN_PLACE_BUDGET_EXHAUSTED
from webhook.kube.objects import items, mapping
from webhook.kube.podresources import is_extended, pod_requests
from webhook.policy import categories as cats
from webhook.policy.categories import Category

GIB = 2**30


def cause(pod: Mapping[str, Any], configured: Sequence[Category] = ()) -> str:
    """Why the attempt failed: its category (see the module's doc)."""
    status = mapping(pod.get("status"))
    if _in_place_budget_used(status):
        earlier = _terminations(pod, ("state", "lastState"))
        oom = any(t.get("reason") == OOM_KILLED for t in earlier)
        return cats.OOM_KILLED if oom else cats.APP_ERROR
    known = of_conditions(pod)
    if known is not None:
        return known[0]
    return classify(pod, configured).category


def run_seconds(pod: Mapping[str, Any]) -> float:
    """How long the attempt held its node (see the module's doc); 0 when unknown."""
    status = mapping(pod.get("status"))
    started = parse_time(status.get("startTime"))
    if started is None:
        begun = [
            parse_time(mapping(state.get(s)).get("startedAt"))
            for state in _states(pod, ("state", "lastState"))
            for s in ("terminated", "running")
        ]
        started = min((b for b in begun if b is not None), default=None)
    _, ended = failure_cause(pod)  # the last finishedAt, else DisruptionTarget's time
    if started is None or ended is None:
        return 0.0
    return max(0.0, ended - started)


def wasted(pod: Mapping[str, Any]) -> dict[str, float]:
    """Resource -> what the attempt held of it for its run time (memory in GiB-seconds);
    resources it held none of are left out."""
    seconds = Fraction(run_seconds(pod))
    if seconds <= 0:
        return {}
    out = {}
    for name, value in sorted(pod_requests(pod).items()):
        if name == "memory":
            value = value / GIB
        elif name != "cpu" and not is_extended(name):
            continue
        if value > 0:
            out[name] = float(value * seconds)
    return out


def _states(pod: Mapping[str, Any], which: tuple[str, ...]) -> list[Mapping[str, Any]]:
    status = mapping(pod.get("status"))
    return [
        mapping(mapping(cs).get(w))
        for group in ("containerStatuses", "initContainerStatuses")
        for cs in items(status.get(group))
        for w in which
    ]


def _terminations(pod: Mapping[str, Any], which: tuple[str, ...]) -> list[Mapping[str, Any]]:
    return [t for state in _states(pod, which) if (t := mapping(state.get("terminated")))]


def _in_place_budget_used(status: Mapping[str, Any]) -> bool:
    return any(
        mapping(c).get("type") == IN_PLACE_BUDGET_EXHAUSTED and mapping(c).get("status") == "True"
        for c in items(status.get("conditions"))
    )
