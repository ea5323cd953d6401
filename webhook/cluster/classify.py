"""Why a pod failed, or why it never started: exactly one category
(``webhook.policy.categories``) and the signal that decided it.

A pure function of what a pod and its Events say (the controller reads them,
``webhook.controller.verdicts``; ``status`` and the waste metric call it too), tried in
this order, the first that holds deciding:

1. the admins' categories, in their order (``categories:`` in the cluster config);
2. ``DeviceFault``: ``DisruptionTarget`` ``DeletionByDeviceTaintManager`` (a NoExecute taint
   on a DRA device the pod was allocated);
3. ``NodeFailure``: ``DisruptionTarget`` ``DeletionByPodGC`` (its node is gone),
   ``TerminationByKubelet`` (node shutdown, node pressure), or ``DeletionByTaintManager``
   when its node has the unreachable or not-ready taint (``node_lost``: the taint manager
   does not say which taint evicted the pod; unknown, it is taken for a lost node, the
   taint manager's usual work);
4. ``Preempted``: ``PreemptionByScheduler``, ``EvictionByEvictionAPI``, our own
   ``DeletionByDisruptor`` (``webhook.cluster.deletions``), and a taint manager's eviction
   for another NoExecute taint of a node that is not lost (an admin's taint drains it);
5. for a pod that never started (``stuck``: the controller ends it past its
   start-deadline, reason ``StartDeadline``) or failed before it did: ``ImagePull``
   (a container waiting ``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``),
   ``ConfigError`` (``CreateContainerConfigError``, ``CreateContainerError``,
   ``RunContainerError``), ``Unschedulable`` (``PodScheduled=False``, ``Unschedulable``),
   and, stuck, ``StartTimeout`` for anything else;
6. ``DeviceFault``: a container's termination message, or an Event of the pod, naming an
   NVIDIA Xid that NVIDIA documents as a hardware or driver fault (``webhook.kube.xid``);
7. ``OOMKilled``: a container terminated ``OOMKilled``;
8. ``AppError``: everything else.

Events are asked for (``events``, called at most once) only when an admin's category
matches on them or the Xid check needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.kube import podsignals as ps
from webhook.kube import xid
from webhook.kube.objects import items, mapping
from webhook.policy import categories as cat
from webhook.policy.categories import Category

#: The signals a category is decided by: the condition's ``reason``.
EXIT_CODE = "ExitCode"
CONTAINER_REASON = "ContainerReason"
TERMINATION_MESSAGE = "TerminationMessage"
POD_REASON = "PodReason"
DISRUPTION_REASON = "DisruptionReason"
POD_CONDITION = "PodCondition"
EVENT = "Event"
START_DEADLINE = "StartDeadline"
NO_SIGNAL = "NoOtherSignal"
SIGNALS = (
    EXIT_CODE,
    CONTAINER_REASON,
    TERMINATION_MESSAGE,
    POD_REASON,
    DISRUPTION_REASON,
    POD_CONDITION,
    EVENT,
    START_DEADLINE,
    NO_SIGNAL,
)
#: Our own disruption reason (``webhook.cluster.deletions.REASON``).
DELETION_BY_DISRUPTOR = "DeletionByDisruptor"
NODE_REASONS = frozenset({ps.DELETION_BY_POD_GC, ps.TERMINATION_BY_KUBELET})
PREEMPTION_REASONS = frozenset(
    {ps.PREEMPTION_BY_SCHEDULER, ps.EVICTION_BY_API, DELETION_BY_DISRUPTOR}
)


@dataclass(frozen=True)
class PodEvent:
    """What the classifier reads of an Event about the pod."""

    reason: str
    note: str


@dataclass(frozen=True)
class Classification:
    """A pod's category, the signal that decided it (the condition's reason) and what
    that signal said (``detail``, for Events and ``status``)."""

    category: str
    signal: str
    detail: str

    def hint(self, configured: Iterable[Category]) -> str:
        return cat.hint_of(self.category, configured)


Events = Callable[[], Sequence[PodEvent]]


def _no_events() -> Sequence[PodEvent]:
    return ()


def classify(
    pod: Mapping[str, Any],
    configured: Sequence[Category] = (),
    events: Events = _no_events,
    node_lost: bool | None = None,
    stuck: bool = False,
) -> Classification:
    """The pod's one category (see the module's doc for the order)."""
    seen = _Seen(events)
    for category in configured:
        if category.match is not None:
            found = _admin(pod, category, seen)
            if found is not None:
                if stuck:
                    return Classification(category.name, START_DEADLINE, found.detail)
                return found
    reason = ps.disruption_reason(pod)
    if reason is not None and not stuck:
        found = _disrupted(reason, node_lost)
        if found is not None:
            return found
    waiting = _waiting(pod, stuck)
    if waiting is not None:
        return waiting
    if stuck:
        return Classification(cat.START_TIMEOUT, START_DEADLINE, _not_started(pod))
    return _failed(pod, seen)


def _disrupted(reason: str, node_lost: bool | None) -> Classification | None:
    detail = f"DisruptionTarget {reason}"
    if reason == ps.DELETION_BY_DEVICE_TAINT_MANAGER:
        return Classification(cat.DEVICE_FAULT, DISRUPTION_REASON, detail)
    if reason in NODE_REASONS or (
        reason == ps.DELETION_BY_TAINT_MANAGER and node_lost is not False
    ):
        return Classification(cat.NODE_FAILURE, DISRUPTION_REASON, detail)
    if reason in PREEMPTION_REASONS or reason == ps.DELETION_BY_TAINT_MANAGER:
        return Classification(cat.PREEMPTED, DISRUPTION_REASON, detail)
    return None


def _waiting(pod: Mapping[str, Any], stuck: bool) -> Classification | None:
    """``ImagePull``, ``ConfigError`` or ``Unschedulable``: a pod that never started."""
    signal = START_DEADLINE if stuck else CONTAINER_REASON
    for cs in ps.container_statuses(pod):
        waiting = mapping(mapping(cs.get("state")).get("waiting"))
        reason = str(waiting.get("reason") or "")
        detail = f"container {cs.get('name')} waiting: {reason}"
        message = str(waiting.get("message") or "")
        if message:
            detail += f" ({message[:200]})"
        if reason in ps.IMAGE_PULL_REASONS:
            return Classification(cat.IMAGE_PULL, signal, detail)
        if reason in ps.CONFIG_ERROR_REASONS:
            return Classification(cat.CONFIG_ERROR, signal, detail)
    if ps.unschedulable(pod) and not mapping(pod.get("spec")).get("nodeName"):
        condition = mapping(ps.condition_of(pod, ps.POD_SCHEDULED))
        message = str(condition.get("message") or "")[:200]
        detail = "PodScheduled False: Unschedulable" + (f" ({message})" if message else "")
        return Classification(cat.UNSCHEDULABLE, START_DEADLINE if stuck else POD_CONDITION, detail)
    return None


def _not_started(pod: Mapping[str, Any]) -> str:
    if not mapping(pod.get("spec")).get("nodeName"):
        return "not scheduled"
    waiting = [r or "waiting" for r in ps.waiting_reasons(pod)]
    return "containers not started" + (f" ({', '.join(waiting[:4])})" if waiting else "")


def _failed(pod: Mapping[str, Any], seen: _Seen) -> Classification:
    for t in ps.terminations(pod):
        message = str(t.get("message") or "")
        number = xid.device_fault(message) if message else None
        if number is not None:
            return Classification(
                cat.DEVICE_FAULT, TERMINATION_MESSAGE, f"termination message names Xid {number}"
            )
    for event in seen.events():
        number = xid.device_fault(event.note)
        if number is not None:
            return Classification(
                cat.DEVICE_FAULT, EVENT, f"Event {event.reason} names Xid {number}"
            )
    for cs in ps.container_statuses(pod):
        terminated = mapping(mapping(cs.get("state")).get("terminated"))
        if terminated.get("reason") == ps.OOM_KILLED:
            return Classification(
                cat.OOM_KILLED, CONTAINER_REASON, f"container {cs.get('name')} OOMKilled"
            )
    for cs in ps.container_statuses(pod):
        terminated = mapping(mapping(cs.get("state")).get("terminated"))
        code = terminated.get("exitCode")
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            return Classification(
                cat.APP_ERROR, EXIT_CODE, f"container {cs.get('name')} exited {code}"
            )
    reason = mapping(pod.get("status")).get("reason")
    if isinstance(reason, str) and reason:
        return Classification(cat.APP_ERROR, POD_REASON, f"pod {reason}")
    return Classification(cat.APP_ERROR, NO_SIGNAL, "no other signal")


class _Seen:
    """The pod's Events, asked for once, when first needed."""

    def __init__(self, events: Events) -> None:
        self._events = events
        self._got: Sequence[PodEvent] | None = None

    def events(self) -> Sequence[PodEvent]:
        if self._got is None:
            try:
                self._got = tuple(self._events())
            except Exception:
                self._got = ()
        return self._got


def _admin(pod: Mapping[str, Any], category: Category, seen: _Seen) -> Classification | None:
    match = category.match
    assert match is not None
    name = category.name
    for cs in ps.container_statuses(pod):
        state = mapping(cs.get("state"))
        terminated = mapping(state.get("terminated"))
        code = terminated.get("exitCode")
        label = f"container {cs.get('name')}"
        if code in match.exit_codes:
            return Classification(name, EXIT_CODE, f"{label} exited {code}")
        for kind in ("terminated", "waiting"):
            reason = mapping(state.get(kind)).get("reason")
            if reason in match.container_reasons:
                return Classification(name, CONTAINER_REASON, f"{label} {kind}: {reason}")
        message = terminated.get("message")
        if match.termination_message is not None and isinstance(message, str) and message:
            if match.termination_message.search(message):
                return Classification(
                    name,
                    TERMINATION_MESSAGE,
                    f"{label} termination message matches {match.termination_message.source!r}",
                )
    reason = mapping(pod.get("status")).get("reason")
    if isinstance(reason, str) and reason in match.pod_reasons:
        return Classification(name, POD_REASON, f"pod {reason}")
    disruption = ps.disruption_reason(pod)
    if disruption is not None and disruption in match.disruption_reasons:
        return Classification(name, DISRUPTION_REASON, f"DisruptionTarget {disruption}")
    if match.needs_events:
        for event in seen.events():
            if match.event_reasons and event.reason not in match.event_reasons:
                continue
            if match.event_message is not None and not match.event_message.search(event.note):
                continue
            return Classification(name, EVENT, f"Event {event.reason}")
    return None


def needs_events(configured: Sequence[Category]) -> bool:
    """Whether an admin's category matches on Events (else only the Xid check reads them)."""
    return any(c.match is not None and c.match.needs_events for c in configured)


def of_conditions(pod: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The category the controller wrote on the pod, and its condition (``None``: none)."""
    for found in items(mapping(pod.get("status")).get("conditions")):
        if not isinstance(found, dict) or found.get("status") != "True":
            continue
        name = cat.category_of(str(found.get("type") or ""))
        if name is not None:
            return name, found
    return None


def events_of(raw: Iterable[Mapping[str, Any]]) -> tuple[PodEvent, ...]:
    """Core or events.k8s.io Events, as the classifier reads them (the newest last)."""
    out = []
    for event in raw:
        event = mapping(event)
        note = event.get("note", event.get("message"))
        out.append(PodEvent(str(event.get("reason") or ""), str(note or "")))
    return tuple(out)
