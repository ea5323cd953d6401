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
- **Cause**, the first that holds:

  1. ``disruption``: ``DisruptionTarget`` True (preempted, evicted, its node lost or under
     pressure): what its containers show is how they were stopped;
  2. ``oom-killed``: a container (or init container) terminated ``OOMKilled``;
  3. ``deadline``: the pod's ``reason: DeadlineExceeded`` (its ``activeDeadlineSeconds``:
     ``activeDeadlineHandler`` in pkg/kubelet/active_deadline.go), which stops its
     containers with non-zero exits. A pod the controller ended because it used up
     ``max-in-place-restarts`` (``webhook.controller.restarts``) fails the same way but
     carries ``retry-policy.dev/InPlaceBudgetExhausted``: its time went to the exits it
     restarted on, so it is ``oom-killed`` when one of them was an OOM kill, else
     ``exit-code``;
  4. ``exit-code``: a container terminated with a non-zero exit code;
  5. ``other``: anything else (a pod the kubelet rejected, deleted before it ran).

  A pod the Job controller deleted at the Job's own ``activeDeadlineSeconds`` carries no
  reason of its own: its containers' SIGTERM exits make it ``exit-code``.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from webhook.cluster.history import OOM_KILLED, disruption, failure_cause, parse_time
from webhook.kube.failurepolicy import IN_PLACE_BUDGET_EXHAUSTED
from webhook.kube.objects import items, mapping
from webhook.kube.podresources import is_extended, pod_requests

CAUSES = ("oom-killed", "exit-code", "disruption", "deadline", "other")
GIB = 2**30
DEADLINE_EXCEEDED = "DeadlineExceeded"


def cause(pod: Mapping[str, Any]) -> str:
    """Why the attempt failed, one of ``CAUSES`` (the precedence in the module's doc)."""
    if disruption(pod) is not None:
        return "disruption"
    states = _terminations(pod, ("state",))
    if any(t.get("reason") == OOM_KILLED for t in states):
        return "oom-killed"
    status = mapping(pod.get("status"))
    if _in_place_budget_used(status):
        earlier = _terminations(pod, ("state", "lastState"))
        return "oom-killed" if any(t.get("reason") == OOM_KILLED for t in earlier) else "exit-code"
    if status.get("reason") == DEADLINE_EXCEEDED:
        return "deadline"
    if any(_nonzero(t.get("exitCode")) for t in states):
        return "exit-code"
    return "other"


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


def _nonzero(code: Any) -> bool:
    return isinstance(code, int) and not isinstance(code, bool) and code != 0
