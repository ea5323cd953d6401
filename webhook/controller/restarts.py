"""The leader replaces a pod whose containers restarted in place ``max-in-place-restarts``
times in all (``webhook.plan.causes``).

A restart in place is not a pod failure: the Job controller counts none of them under a
pod ``restartPolicy: Never`` (``pastBackoffLimitOnFailure`` counts restarts only under
OnFailure), and upstream gives no cap (KEP-3322's ``maxRestartTimes`` was abandoned;
KEP-5307 lists it as a non-goal). So the controller watches the pods labelled
``retry-policy.dev/max-in-place-restarts`` and, when one's restarts reach N, adds
``retry-policy.dev/InPlaceBudgetExhausted`` (only if the pod is still as it saw it: a
``resourceVersion`` precondition, so a pod that failed on its own meanwhile is judged by
its own exit), then ends the pod by its own deadline: ``spec.activeDeadlineSeconds: 1``
(a pod's deadline may be set, or lowered, on a running pod: ``ValidatePodUpdate`` in
pkg/apis/core/validation; at least 1, ``ValidatePodSpec``). Past it the kubelet stops the
containers with the pod's grace period and fails the pod, reason ``DeadlineExceeded``,
whatever they exit with (``activeDeadlineHandler.ShouldEvict`` in
pkg/kubelet/active_deadline.go, which ``generateAPIPodStatus`` applies after ``getPhase``).
The Job's first rule counts it (Count on that condition): the Job controller replaces it
while the retry budget lasts, so in-place restarts end after N x (retries + 1) at most,
with no deadline of the user's.

Not a deletion: the kubelet's ``getPhase`` (pkg/kubelet/kubelet_pods.go) makes a deleted
pod whose containers all exit 0 ``Succeeded``, so an application that handles SIGTERM
and exits 0 would complete the Job (or its index) and no rule would look at the
condition. Past its deadline the pod is ``Failed`` in every update the kubelet sends
(``ShouldEvict`` overrides the phase), the condition already on it; and it stays, as
every failed pod of a Job does, its logs and exit codes with it.

Restarts "in all", as ``webhook.kube.restartrules.restarts`` counts them: the sum of the
regular containers' ``restartCount``; for a pod whose rules restart the whole pod
(``RestartAllContainers``, in-place-scope pod), the most of one container's.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from webhook.cluster.conditions import (
    add_condition,
    condition,
    label_value,
    pod_name,
    pod_uid,
    read_pod,
    status_patch,
    terminal,
    terminating,
)
from webhook.cluster.events import Event
from webhook.cluster.informer import Informer
from webhook.controller.budgetstate import Metrics
from webhook.controller.disruptions import MOST
from webhook.controller.records import MERGE_PATCH, workload_of
from webhook.controller.writes import CONFLICT, REFUSED, Writes, outcome
from webhook.kube.failurepolicy import IN_PLACE_BUDGET_EXHAUSTED
from webhook.kube.objects import mapping
from webhook.kube.restartrules import restarts
from webhook.plan.causes import MAX_RESTARTS_LABEL, replaced
from webhook.policy.grammar import parse_restart_budget

log = logging.getLogger(__name__)

REASON = "RetryInPlaceBudgetExhausted"
TRIES = 5
#: The deadline that ends a replaced pod: the least the API takes, and past already for a
#: pod that has restarted in place (its ``status.startTime`` is its first start).
DEADLINE = 1
TAKEN_BACK = (
    "its deadline was refused (an admission policy): the pod is not replaced, and its own "
    "rules decide its failure"
)


class InPlaceBudget:
    """A reconciler (``webhook.controller.manager.Reconciler``)."""

    name = "in-place-budget"

    def __init__(
        self,
        api_client: Any,
        events: Any,
        metrics: Any = None,
        clock: Callable[[], float] = time.time,
    ):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.events = events
        self.metrics = metrics or Metrics()
        self.clock = clock
        self._queue: queue.Queue[Mapping[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._done: OrderedDict[str, None] = OrderedDict()
        self.counters = {"replaced": 0, "conflicts": 0}
        #: Failed replacements: tried again after their back-off (``_later``, when due), or
        #: given up when refused (``webhook.controller.writes``).
        self.writes = Writes("in_place", events, self.metrics)
        self._later: list[tuple[float, int, Mapping[str, Any]]] = []

    def run(self, stop: threading.Event) -> None:
        informer = Informer(
            "in-place-budget",
            self.core.list_pod_for_all_namespaces,
            lambda: None,
            self._event,
            {"label_selector": MAX_RESTARTS_LABEL},
            stop,
            "controller",
        )
        self.watches = [informer]
        threading.Thread(target=informer.run, name=informer.name, daemon=True).start()
        while not stop.is_set():
            while self._later and self._later[0][0] <= self.writes.clock():
                self._queue.put(heapq.heappop(self._later)[2])
            try:
                pod = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                if self.replace(pod):
                    self.writes.landed(pod_uid(pod))
            except Exception as err:  # the loop must outlive any one pod
                self._failed(pod, err)

    def _failed(self, pod: Mapping[str, Any], err: Exception) -> None:
        """A replacement the API failed: again after its back-off; refused: told."""
        uid = pod_uid(pod)
        what = f"the replacement of pod {pod_name(pod)} (max-in-place-restarts)"
        if self.writes.failed(uid, err, workload_of(pod), what):
            heapq.heappush(self._later, (self.writes.due(uid), id(pod), pod))

    def _event(self, kind: str, pod: Mapping[str, Any]) -> None:
        if kind == "DELETED" or terminal(pod) or terminating(pod):
            return
        budget = _budget_of(pod)
        if not replaced(restarts(pod), budget):
            return
        with self._lock:
            if pod_uid(pod) in self._done:
                return
        self._queue.put(pod)

    def replace(self, pod: Mapping[str, Any]) -> bool:
        """Mark one pod that used its budget and end it by its deadline; whether it did."""
        with self._lock:
            if pod_uid(pod) in self._done:
                return False  # (queued twice: once more after its mark)
        budget = _budget_of(pod)
        for _ in range(TRIES):
            if budget is None or terminal(pod) or terminating(pod):
                return False
            used = restarts(pod)
            if not replaced(used, budget):
                return False
            marked = condition(pod, IN_PLACE_BUDGET_EXHAUSTED) is not None
            if not marked:
                found = self._mark(pod, used, budget)
                if found is None:
                    return False
                if found is not pod:
                    pod = found  # changed since (a restart, its failure): again
                    continue
            try:
                expired = self._expire(pod)
            except Exception as err:
                if outcome(err) == REFUSED:  # (another admission policy; never half-done)
                    self._take_back(pod)
                raise
            self._remember(pod_uid(pod))
            if marked and not expired:
                return False  # (replaced before a restart of the controller: said then)
            self.counters["replaced"] += 1
            regarding = workload_of(pod)
            if regarding is not None:
                note = (
                    f"pod {pod_name(pod)}: {used} restarts in place reach max-in-place-restarts "
                    f"{budget}: ended by its deadline (activeDeadlineSeconds {DEADLINE}), it "
                    "fails and is replaced; its failure counts against the retry budget"
                )
                self.events.emit(Event(regarding, "Warning", REASON, note, action="Replace"))
            return True
        return False

    def _mark(self, pod: Mapping[str, Any], used: int, budget: int) -> Mapping[str, Any] | None:
        """Add the condition if the pod is still at the version seen: ``pod`` when added,
        the pod as it is now when it changed since (409), ``None`` when it is gone."""
        message = (
            f"{used} restarts in place, max-in-place-restarts {budget}: the pod is "
            "replaced, and its failure counts against the retry budget"
        )
        version = str(mapping(pod.get("metadata")).get("resourceVersion") or "")
        body = status_patch(
            IN_PLACE_BUDGET_EXHAUSTED, "MaxInPlaceRestartsReached", message, self.clock()
        )
        try:
            add_condition(self.core, pod, body, version or None)
        except Exception as err:
            status = getattr(err, "status", None)
            if status == 404:
                return None
            if status != 409:
                raise
            self.counters["conflicts"] += 1
            return read_pod(self.core, pod)
        self.metrics.condition(IN_PLACE_BUDGET_EXHAUSTED, "added")
        return pod

    def _take_back(self, pod: Mapping[str, Any]) -> None:
        """The deadline was refused (an admission policy of the cluster's own): the pod
        runs on, restarting in place, and must not keep the condition whose Count rule
        would count its later failure instead of its own rules deciding it. The condition
        goes back to False, with the resourceVersion of a version seen not ``Failed`` (a
        pod that failed meanwhile had used its budget: it counts); the pod is not marked
        again, and the refusal is told (``RetryPolicyWriteFailed``, by the caller)."""
        self._remember(pod_uid(pod))
        for _ in range(TRIES):
            found = read_pod(self.core, pod)  # (with the mark: ``pod`` may be from before)
            if found is None:
                return
            pod = found
            if terminal(pod) or condition(pod, IN_PLACE_BUDGET_EXHAUSTED) is None:
                return
            version = str(mapping(pod.get("metadata")).get("resourceVersion") or "")
            body = status_patch(
                IN_PLACE_BUDGET_EXHAUSTED, "DeadlineRefused", TAKEN_BACK, self.clock()
            )
            body["status"]["conditions"][0]["status"] = "False"
            try:
                add_condition(self.core, pod, body, version or None)
            except Exception as err:
                if outcome(err) != CONFLICT:
                    log.warning("condition not taken back from pod %s: %s", pod_name(pod), err)
                    return
                continue
            self.metrics.condition(IN_PLACE_BUDGET_EXHAUSTED, "taken_back")
            return

    def _expire(self, pod: Mapping[str, Any]) -> bool:
        """Set the pod's ``activeDeadlineSeconds`` to ``DEADLINE`` (a merge patch of that one
        field of its spec), unless it is that low already; whether it wrote. Only after
        the condition: the pod fails past it, and must carry the condition when it does."""
        meta = mapping(pod.get("metadata"))
        current = mapping(pod.get("spec")).get("activeDeadlineSeconds")
        if isinstance(current, int) and not isinstance(current, bool) and current <= DEADLINE:
            return False
        try:
            self.core.patch_namespaced_pod(
                meta.get("name"),
                meta.get("namespace"),
                {"spec": {"activeDeadlineSeconds": DEADLINE}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        except Exception as err:
            if getattr(err, "status", None) != 404:
                raise
            return False
        return True

    def _remember(self, uid: str) -> None:
        with self._lock:
            self._done[uid] = None
            while len(self._done) > MOST:
                self._done.popitem(last=False)

    def stats(self) -> dict[str, int]:
        return dict(self.counters)


def _budget_of(pod: Mapping[str, Any]) -> int | None:
    return label_value(pod, MAX_RESTARTS_LABEL, parse_restart_budget)
