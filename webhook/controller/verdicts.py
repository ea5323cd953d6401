"""The leader classifies every failed pod of a managed workload, and every pod it ends past
its ``start-deadline``, into one category (``webhook.cluster.classify``), writes it on the
pod as the condition ``retry-policy.dev/<Category>`` and tells the user
(``webhook.plan.verdicts``: the rules that act on it).

Two watches:

- the pods labelled ``retry-policy.dev/categories`` (their workload's rules read a
  category, or it has a ``start-deadline``), from before they fail, so that the condition
  lands before the Job controller judges the pod, as the budgets' do
  (``webhook.controller.disruptions``; docs/disruptions.md): a pod being deleted with
  ``DisruptionTarget`` (preempted, evicted, its node or device tainted) is classified
  while it terminates, its condition written with the ``resourceVersion`` of a version seen
  not ``Failed``, and so on every ``Failed`` version of it; a pod past its start deadline
  is classified and then ended (``webhook.controller.startdeadline``). A pod that fails by
  itself (its application's exit, an OOM kill, the kubelet's node-pressure eviction and
  PodGC, which fail it in the very update that adds ``DisruptionTarget``) can only be
  classified once it is ``Failed``: its condition is written then, and counted ``late``
  (``retry_webhook_controller_conditions_total{condition="category"}``): the Job
  controller, which judges a pod at its next sync (``syncJobBatchPeriod``, 1 s), may have
  judged it without; one it had already judged (its tracking finalizer gone, or listed in
  ``uncountedTerminatedPods``) is ``missed``, and nothing is written. The Event says so.
- every failed pod of a Job (``status.phase=Failed``), whose workload has a plan: no rule
  of ours reads its category. It is classified and told (the Event, the metric); its
  condition is written only where a rule of the Job's own reads one (a user's), or the
  config says ``categoryConditions: Always``: one ``pods/status`` write a failed pod that
  nothing of ours reads is a third of the controller's budget (docs/SCALE.md).

``max-free-failures``: a free failure (its category is one the Job's rules Ignore) is
counted in the workload's record (``webhook.controller.freebudget``); past the first N it
gets ``retry-policy.dev/FreeBudgetExhausted`` beside its category, in the same patch, which
the Count rule before the Ignore one takes. Both land together, in time or late: a late
pair the Job controller missed counts the failure anyway (no Ignore matched), so a failure
over the budget always counts.

Each classified pod is told once, when it is ``Failed``: an Event ``RetryFailureClassified``
on its workload, named by what it says (not the pod: repeats aggregate), and
``retry_webhook_failures_total{namespace, category, verdict}``, the verdict being what the
Job's rules make of the pod as it carries its conditions (``matchPodFailurePolicy``):
``failed`` (FailJob, FailIndex), ``free`` (Ignore), ``counted`` (Count, or no rule).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from webhook.cluster import classify as cl
from webhook.cluster.conditions import (
    STRATEGIC,
    add_condition,
    judged,
    label,
    label_value,
    now_rfc3339,
    pod_name,
    pod_uid,
    read_pod,
    terminal,
    terminating,
    uncounted_of,
)
from webhook.cluster.events import Event, Regarding
from webhook.cluster.informer import Informer, short_error
from webhook.controller import startdeadline as sd
from webhook.controller.freebudget import FreeBudgets
from webhook.controller.interning import RuleSets
from webhook.controller.jobwatch import SharedJobs
from webhook.controller.ratelimit import Moot, unless
from webhook.controller.recorder import HistoryRecorder, planned
from webhook.controller.records import MERGE_PATCH, Workloads, workload_of
from webhook.controller.writes import CONFLICT, GONE, REFUSED, Writes, outcome, persist
from webhook.kube import failurepolicy as fp
from webhook.kube import podsignals as ps
from webhook.kube.objects import controller_of, items, mapping
from webhook.kube.wellknown import JOB_UID_LABEL, JOBSET_NAME, JOBSET_UID
from webhook.plan.verdicts import CATEGORIES_LABEL, MAX_FREE_LABEL
from webhook.policy.categories import condition_type, named_by
from webhook.policy.config import ALWAYS, Config
from webhook.policy.grammar import format_duration, parse_count

log = logging.getLogger(__name__)

REASON = "RetryFailureClassified"
#: The metric's verdicts.
VERDICTS = ("counted", "free", "failed")
#: Pods remembered (told, handled) at most; Jobs' rules and nodes kept at most.
MOST = 10_000
NODE_SECONDS = 10.0
TRIES = 20
#: How long a condition the API fails is tried again (past that the pod has been judged:
#: ``webhook.controller.disruptions``' 5 s), and a category on a pod no rule reads of it.
PATIENCE = 5.0
RECORD_PATIENCE = 30.0
#: The conditions metric's label for every category's condition (their names are many).
CATEGORY = "category"
TAKEN_BACK = (
    "its deadline was refused (an admission policy): the pod is not ended, and its own "
    "failure decides its category"
)


class Metrics:
    """What this reconciler reports (``webhook.serving.metrics.ControllerMetrics``)."""

    def condition(self, kind: str, result: str) -> None:
        pass

    def failure(self, namespace: str, category: str, verdict: str) -> None:
        pass


def verdict_of(rules: Sequence[Any], pod: Mapping[str, Any]) -> str:
    """What the Job's rules make of the pod as it is (``matchPodFailurePolicy``)."""
    match = fp.evaluate(rules, fp.PodFailure.from_pod(pod))
    if match is None or match.action == "Count":
        return "counted"
    return "free" if match.action == "Ignore" else "failed"


def _condition(kind: str, reason: str, message: str, when: float) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": now_rfc3339(when),
    }


class Verdicts:
    """A reconciler (``webhook.controller.manager.Reconciler``)."""

    name = "verdicts"

    def __init__(
        self,
        api_client: Any,
        events: Any,
        metrics: Any = None,
        jobs: SharedJobs | None = None,
        config: Callable[[], Config] = Config,
        clock: Callable[[], float] = time.time,
        window: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
        history: HistoryRecorder | None = None,
    ):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.event_api = client.EventsV1Api(api_client)
        self.workloads = Workloads(api_client)
        self.events = events
        self.metrics = metrics if hasattr(metrics, "failure") else Metrics()
        self.config = config
        self.clock = clock
        self.window = window
        self.sleep = sleep
        self.writes = Writes("verdicts", events, metrics)
        self.free = FreeBudgets(self.workloads, Writes("free_budget", events, metrics), history)
        self.timers = sd.Timers(clock)
        self._urgent: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._bulk: queue.Queue[Mapping[str, Any]] = queue.Queue(maxsize=MOST)
        self._lock = threading.Lock()
        self._told: OrderedDict[str, None] = OrderedDict()
        self._late: OrderedDict[str, str] = OrderedDict()
        #: Pods whose deletion a watch has seen: no condition is written on them (it
        #: would be answered 404, at the cost of a critical token and an API answer).
        self._deleted: OrderedDict[str, None] = OrderedDict()
        #: Job UID -> (whether it has a plan, its podFailurePolicy rules).
        self._jobs: OrderedDict[str, tuple[bool, tuple]] = OrderedDict()
        self._rule_sets = RuleSets()
        self._jobsets: OrderedDict[str, bool] = OrderedDict()
        self._nodes: dict[str, tuple[float, bool]] = {}
        self.counters = {
            "classified": 0,
            "added": 0,
            "late": 0,
            "missed": 0,
            "gone": 0,
            "ended": 0,
            "told": 0,
            "dropped": 0,
        }
        self._own_jobs = jobs is None
        self.jobs = jobs if jobs is not None else SharedJobs(client.BatchV1Api(api_client))
        self.jobs.subscribe(self._reset_jobs, self._apply_job)

    # --- the watches --------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        listing = self.core.list_pod_for_all_namespaces
        watches = [
            Informer(
                "verdict-pods",
                listing,
                lambda: None,  # a relist delivers every pod again: conditions make it a no-op
                self._labelled_event,
                {"label_selector": CATEGORIES_LABEL},
                stop,
                "controller",
            ),
            Informer(
                "verdict-failed-pods",
                listing,
                lambda: None,
                self._failed_event,
                {"label_selector": JOB_UID_LABEL, "field_selector": "status.phase=Failed"},
                stop,
                "controller",
            ),
        ]
        self.watches = watches
        if self._own_jobs:
            self.jobs.start(stop)
        for informer in watches:
            threading.Thread(target=informer.run, name=informer.name, daemon=True).start()
        flushed = time.monotonic()
        self.free.running = True
        try:
            while not stop.is_set():
                self.step(0.05)
                if time.monotonic() - flushed >= self.window:
                    self.free.flush()
                    flushed = time.monotonic()
        finally:
            self.free.running = False  # what the history still holds, it writes itself
        self.free.flush()

    def step(self, wait: float = 0.0) -> bool:
        """One piece of work: a due start deadline, a labelled pod, else a failed pod of a
        managed workload. Whether there was any."""
        for namespace, name, uid in self.timers.ready():
            self._urgent.put(("deadline", (namespace, name, uid)))
        try:
            what, item = self._urgent.get(timeout=wait) if wait else self._urgent.get_nowait()
        except queue.Empty:
            try:
                pod = self._bulk.get_nowait()
            except queue.Empty:
                return False
            self._guarded(self.record_failed, pod)
            return True
        if what == "pod":
            self._guarded(self.handle, item)
        else:
            self._guarded(self.deadline, *item)
        return True

    def _guarded(self, act: Callable[..., Any], *args: Any) -> None:
        try:
            act(*args)
        except Exception as err:  # the loop must outlive any one pod
            log.warning("verdict not made (%s): %s", act.__name__, short_error(err))

    def _labelled_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.timers.forget(pod_uid(pod))
            self._was_deleted(pod)
            return
        self._urgent.put(("pod", pod))

    def _failed_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self._was_deleted(pod)
            return
        if label(pod, CATEGORIES_LABEL) is not None:
            return  # (the labelled watch has it)
        if self._was_told(pod_uid(pod)):
            return
        try:
            self._bulk.put_nowait(pod)
        except queue.Full:
            self.counters["dropped"] += 1

    def _was_deleted(self, pod: Mapping[str, Any]) -> None:
        with self._lock:
            self._deleted[pod_uid(pod)] = None
            while len(self._deleted) > MOST:
                self._deleted.popitem(last=False)

    def _deleted_already(self, pod: Mapping[str, Any]) -> bool:
        with self._lock:
            return pod_uid(pod) in self._deleted

    # --- the Jobs' rules and plans ------------------------------------------------------
    def _reset_jobs(self) -> None:
        with self._lock:
            self._jobs.clear()

    def _apply_job(self, kind: str, job: Mapping[str, Any]) -> None:
        uid = mapping(job.get("metadata")).get("uid")
        if not isinstance(uid, str):
            return
        with self._lock:
            if kind == "DELETED":
                self._jobs.pop(uid, None)
                return
            managed, rules = _job_facts(job)
            self._jobs[uid] = (managed, self._rule_sets.shared(rules))
            self._jobs.move_to_end(uid)
            while len(self._jobs) > MOST:
                self._jobs.popitem(last=False)

    def _job(self, pod: Mapping[str, Any]) -> tuple[bool, tuple] | None:
        """The pod's Job: whether it has a plan, and its rules (``None``: no Job)."""
        owner = controller_of(mapping(pod.get("metadata")))
        if owner is None or owner.get("kind") != "Job":
            return None
        uid = str(owner.get("uid") or "")
        with self._lock:
            known = self._jobs.get(uid)
        if known is not None:
            return known
        namespace = str(mapping(pod.get("metadata")).get("namespace") or "")
        job = self.workloads.read("job", namespace, str(owner.get("name") or ""))
        if job is None or mapping(job.get("metadata")).get("uid") != uid:
            return None
        self._apply_job("ADDED", job)
        return _job_facts(job)

    def _managed(self, pod: Mapping[str, Any], job: tuple[bool, tuple] | None) -> bool:
        """Whether the pod's workload has a plan: its Job, or its JobSet."""
        if job is not None and job[0]:
            return True
        labels = mapping(mapping(pod.get("metadata")).get("labels"))
        name, uid = labels.get(JOBSET_NAME), labels.get(JOBSET_UID)
        if not (isinstance(name, str) and isinstance(uid, str) and name and uid):
            return False
        with self._lock:
            known = self._jobsets.get(uid)
        if known is None:
            namespace = str(mapping(pod.get("metadata")).get("namespace") or "")
            jobset = self.workloads.read("jobset", namespace, name)
            meta = mapping((jobset or {}).get("metadata"))
            known = jobset is not None and meta.get("uid") == uid and _planned(meta)
            with self._lock:
                self._jobsets[uid] = known
                while len(self._jobsets) > MOST:
                    self._jobsets.popitem(last=False)
        return known

    # --- what the classifier reads besides the pod ----------------------------------------
    def _events(self, pod: Mapping[str, Any]) -> Callable[[], list[cl.PodEvent]]:
        meta = mapping(pod.get("metadata"))

        def read() -> list[cl.PodEvent]:
            resp = self.event_api.list_namespaced_event(
                meta.get("namespace"),
                field_selector=f"regarding.uid={meta.get('uid')}",
                limit=100,
                _preload_content=False,
            )
            return list(cl.events_of(items(json.loads(resp.data).get("items"))))

        return read

    def _node_lost(self, pod: Mapping[str, Any]) -> bool | None:
        """Whether the pod's node is lost (gone, or tainted unreachable or not ready), for a
        taint manager's eviction; ``None`` when it cannot be told."""
        if ps.disruption_reason(pod) != ps.DELETION_BY_TAINT_MANAGER:
            return None
        name = mapping(pod.get("spec")).get("nodeName")
        if not isinstance(name, str) or not name:
            return None
        now = self.clock()
        known = self._nodes.get(name)
        if known is not None and now - known[0] < NODE_SECONDS:
            return known[1]
        try:
            resp = self.core.read_node(name, _preload_content=False)
        except Exception as err:
            if getattr(err, "status", None) == 404:
                self._nodes[name] = (now, True)
                return True
            return None
        node = json.loads(resp.data)
        taints = {mapping(t).get("key") for t in items(mapping(node.get("spec")).get("taints"))}
        lost = bool(taints & ps.NODE_LOST_TAINTS)
        if len(self._nodes) > MOST:
            self._nodes.clear()
        self._nodes[name] = (now, lost)
        return lost

    def classify(self, pod: Mapping[str, Any], stuck: bool = False) -> cl.Classification:
        categories = self.config().categories
        found = cl.classify(pod, categories, self._events(pod), self._node_lost(pod), stuck)
        self.counters["classified"] += 1
        return found

    # --- labelled pods: in time where it can be ----------------------------------------
    def handle(self, pod: Mapping[str, Any]) -> None:
        """One version of a labelled pod (see the module's doc)."""
        phase = mapping(pod.get("status")).get("phase")
        if phase == "Succeeded":
            self.timers.forget(pod_uid(pod))
            return
        if cl.of_conditions(pod) is not None:
            if phase == "Failed":
                self.tell(pod)
            return
        self.timers.watch(pod)
        if not _a_failure(pod):
            return
        if phase == "Failed" or terminating(pod):
            found = self.classify(pod)
            if self.mark(pod, found) in ("missed", "gone"):
                self.tell(pod, found)

    def mark(self, pod: Mapping[str, Any], found: cl.Classification) -> str:
        """Write the pod's category (and its free-budget condition) with the
        resourceVersion of a version seen not ``Failed``; a pod ``Failed`` first is written
        late, one the Job controller judged is not written, nor one deleted: "added",
        "late", "missed", "gone" or "error"."""
        conditions = self._conditions(pod, found)
        uid, deadline = pod_uid(pod), self.writes.clock() + PATIENCE
        for _ in range(TRIES):
            if cl.of_conditions(pod) is not None:
                return "added"  # (an earlier write whose answer was lost)
            if self._deleted_already(pod):
                return self._gone(pod)
            late = terminal(pod)
            if late and judged(pod, self._uncounted(pod)):
                self._result(pod, "missed")
                return "missed"
            version = None if late else str(mapping(pod.get("metadata")).get("resourceVersion"))
            try:
                with unless(lambda pod=pod: self._deleted_already(pod)):
                    add_condition(self.core, pod, {"status": {"conditions": conditions}}, version)
            except Moot:
                return self._gone(pod)
            except Exception as err:
                kind = outcome(err)
                if kind == GONE:
                    return self._gone(pod)
                if kind != CONFLICT:
                    # Failed (429, 5xx): again after its back-off, while the pod may still
                    # be judged with it; refused: given up and told (``writes``).
                    what = f"condition {found.category} on pod {pod_name(pod)}"
                    again = self.writes.failed(uid, err, workload_of(pod), what)
                    if not again or self.writes.due(uid) > deadline:
                        self.writes.forget(uid)
                        return "error"
                    self.sleep(max(0.0, self.writes.due(uid) - self.writes.clock()))
                    continue
                found_pod = read_pod(self.core, pod)
                if found_pod is None:
                    return self._gone(pod)
                pod = found_pod
                continue
            self.writes.landed(pod_uid(pod))
            result = "late" if late else "added"
            self._result(pod, result)
            if late:
                self.tell({**pod, "status": _with(pod, conditions)})
            return result
        return "error"

    def _gone(self, pod: Mapping[str, Any]) -> str:
        """The pod was deleted before its condition was written (PodGC, a lost node's,
        deletes a pod it has just failed): nothing to write on; the category is still
        told."""
        self._result(pod, "gone")
        return "gone"

    def _result(self, pod: Mapping[str, Any], result: str) -> None:
        self.counters[result] += 1
        self.metrics.condition(CATEGORY, result)
        if result in ("late", "missed", "gone"):
            with self._lock:
                self._late[pod_uid(pod)] = result
                while len(self._late) > MOST:
                    self._late.popitem(last=False)

    def _uncounted(self, pod: Mapping[str, Any]) -> frozenset[str]:
        """The pod's Job's ``uncountedTerminatedPods`` (read: the watch may lag)."""
        owner = controller_of(mapping(pod.get("metadata")))
        if owner is None or owner.get("kind") != "Job":
            return frozenset()
        namespace = str(mapping(pod.get("metadata")).get("namespace") or "")
        return uncounted_of(self.workloads.read("job", namespace, str(owner.get("name") or "")))

    def _conditions(self, pod: Mapping[str, Any], found: cl.Classification) -> list[dict]:
        """The category's condition, and ``FreeBudgetExhausted`` when the failure is free
        and over its workload's ``max-free-failures``."""
        hint = found.hint(self.config().categories)
        out = [_condition(condition_type(found.category), found.signal, hint, self.clock())]
        budget = label_value(pod, MAX_FREE_LABEL, parse_count)
        job = self._job(pod)
        regarding = workload_of(pod)
        if budget is None or job is None or regarding is None:
            return out
        alone = {**pod, "status": {"conditions": out}}
        if verdict_of(job[1], alone) != "free":
            return out
        decision = self.free.decide(pod, regarding, budget)
        if decision is not None and decision.over:
            message = (
                f"free failure {decision.number}{decision.where}, over max-free-failures "
                f"{budget}: counted against the retry budget"
            )
            if decision.again:
                message = f"over max-free-failures {budget}: counted against the retry budget"
            reason = "MaxFreeFailuresExceeded"
            out.append(_condition(fp.FREE_BUDGET_EXHAUSTED, reason, message, self.clock()))
        return out

    # --- start deadlines --------------------------------------------------------------------
    def deadline(self, namespace: str, name: str, uid: str) -> str:
        """End one pod due to have started, if it still has not: "ended", "started",
        "gone", "refused" or "error"."""
        ref = {"metadata": {"namespace": namespace, "name": name, "uid": uid}}
        for _ in range(TRIES):
            pod = read_pod(self.core, ref)
            if pod is None:
                return "gone"
            when = sd.due(pod)
            known = cl.of_conditions(pod)
            if when is not None and known is not None and sd.scheduled(pod):
                if known[1].get("reason") == cl.START_DEADLINE:  # (its deadline not set yet)
                    return "ended" if self._expire(pod, [dict(known[1])]) else "error"
            if when is None or known is not None:
                return "started"
            if when > self.clock():
                self.timers.watch(pod)
                return "started"
            found = self.classify(pod, stuck=True)
            conditions = self._conditions(pod, found)
            version = str(mapping(pod.get("metadata")).get("resourceVersion") or "")
            try:
                if sd.scheduled(pod):
                    add_condition(self.core, pod, {"status": {"conditions": conditions}}, version)
                else:
                    self._fail_unscheduled(pod, conditions, version)
            except Exception as err:
                kind = outcome(err)
                if kind == CONFLICT:
                    continue  # changed since (bound, started): read again
                if kind == GONE:
                    return "gone"
                what = f"the end of pod {pod_name(pod)} (start-deadline)"
                if self.writes.failed(uid, err, workload_of(pod), what):
                    # Failed (429, 5xx): the pod is due again after its back-off.
                    self.timers.at(pod, self.clock() + self.writes.due(uid) - self.writes.clock())
                return "error"
            if sd.scheduled(pod) and not self._expire(pod, conditions):
                return "refused"
            self.counters["ended"] += 1
            self._result(pod, "added")
            self._ended(pod, found)
            return "ended"
        return "error"

    def _fail_unscheduled(self, pod: Mapping[str, Any], conditions: list, version: str) -> None:
        meta = mapping(pod.get("metadata"))
        self.core.patch_namespaced_pod_status(
            meta.get("name"),
            meta.get("namespace"),
            sd.failed_status(conditions, version),
            _content_type=STRATEGIC,
            _preload_content=False,
        )

    def _expire(self, pod: Mapping[str, Any], conditions: list) -> bool:
        """End a scheduled pod by its deadline, after its condition; a deadline refused
        takes the condition back (``False``), never half-done."""
        meta = mapping(pod.get("metadata"))
        try:
            self.core.patch_namespaced_pod(
                meta.get("name"),
                meta.get("namespace"),
                {"spec": {"activeDeadlineSeconds": sd.DEADLINE}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        except Exception as err:
            if outcome(err) == GONE:
                return True
            if outcome(err) == REFUSED:
                back = [
                    {**c, "status": "False", "reason": "DeadlineRefused", "message": TAKEN_BACK}
                    for c in conditions
                ]
                try:
                    add_condition(self.core, pod, {"status": {"conditions": back}})
                except Exception as again:
                    log.warning("condition not taken back from %s: %s", pod_name(pod), again)
            uid = pod_uid(pod)
            if self.writes.failed(uid, err, workload_of(pod), "a start deadline's end"):
                # Failed (429, 5xx): again after its back-off (its condition is there).
                self.timers.at(pod, self.clock() + self.writes.due(uid) - self.writes.clock())
            return False
        self.writes.landed(pod_uid(pod))
        return True

    def _ended(self, pod: Mapping[str, Any], found: cl.Classification) -> None:
        regarding = workload_of(pod)
        seconds = sd.deadline_of(pod) or 0
        how = "ended by its deadline" if sd.scheduled(pod) else "failed (never scheduled)"
        if regarding is not None:
            note = (
                f"a pod did not start within its start-deadline {format_duration(seconds)}: "
                f"{found.category} ({found.detail}); {how}"
            )
            self.events.emit(Event(regarding, "Warning", REASON, note[:1024], action="End"))

    # --- failed pods of managed workloads -------------------------------------------------
    def record_failed(self, pod: Mapping[str, Any]) -> None:
        """A failed pod not labelled as read of its category, if its workload has a plan:
        classified and told; its condition written where the Job's own rules read one
        (a user's rule), or the config says ``Always``."""
        if self._was_told(pod_uid(pod)) or not _a_failure(pod):
            return
        job = self._job(pod)
        if not self._managed(pod, job):
            return
        known = cl.of_conditions(pod)
        if known is None:
            found = self.classify(pod)
            if not self._written(job):
                self.tell(pod, found)
                return
            conditions = [
                _condition(
                    condition_type(found.category),
                    found.signal,
                    found.hint(self.config().categories),
                    self.clock(),
                )
            ]
            body = {"status": {"conditions": conditions}}
            what = f"condition {found.category} on pod {pod_name(pod)}"
            if self._deleted_already(pod):
                self._gone(pod)
                self.tell(pod, found)
                return
            try:
                persist(
                    self.writes,
                    pod_uid(pod),
                    lambda: add_condition(self.core, pod, body),
                    workload_of(pod),
                    what,
                    RECORD_PATIENCE,
                    self.sleep,
                )
            except Exception as err:  # given up (refused, gone, out of patience): said
                log.info("%s not written: %s", what, short_error(err))
                if outcome(err) == GONE:
                    self._gone(pod)
                    self.tell(pod, found)
                return
            pod = {**pod, "status": _with(pod, conditions)}
        self.tell(pod)

    def _written(self, job: tuple[bool, tuple] | None) -> bool:
        """Whether an unlabelled pod's category is written on it: one ``pods/status`` write
        a failed pod, which nothing of ours reads (``categoryConditions``)."""
        if self.config().category_conditions == ALWAYS:
            return True
        return any(named_by(r) for r in (job or (0, ()))[1])

    # --- telling ----------------------------------------------------------------------------
    def _was_told(self, uid: str) -> bool:
        with self._lock:
            return uid in self._told

    def tell(self, pod: Mapping[str, Any], found: cl.Classification | None = None) -> None:
        """The Event and the metric of one classified, failed pod, once (``found``: its
        category, when it was not written: the Job controller had judged the pod)."""
        uid = pod_uid(pod)
        known = cl.of_conditions(pod)
        if known is None and found is not None:
            hint = found.hint(self.config().categories)
            known = (found.category, {"reason": found.signal, "message": hint})
        if known is None or self._was_told(uid):
            return
        with self._lock:
            self._told[uid] = None
            while len(self._told) > MOST:
                self._told.popitem(last=False)
            late = self._late.pop(uid, None)
        name, condition = known
        job = self._job(pod)
        verdict = verdict_of(job[1] if job is not None else (), pod)
        meta = mapping(pod.get("metadata"))
        self.metrics.failure(str(meta.get("namespace") or ""), name, verdict)
        self.counters["told"] += 1
        regarding = workload_of(pod)
        if regarding is not None:
            self.events.emit(_event(regarding, name, condition, verdict, late, job))

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "waiting": len(self.timers), "free": self.free.stats()}


def _event(
    regarding: Regarding,
    name: str,
    condition: Mapping[str, Any],
    verdict: str,
    late: str | None,
    job: tuple[bool, tuple] | None,
) -> Event:
    """``RetryFailureClassified``: the category, the signal, the hint and what it did (no
    pod name: the same failure again is a repeat, counted into the Event's series)."""
    said = {
        "failed": "it fails the workload (fail-categories)",
        "free": "not counted against the retry budget",
        "counted": "counted against the retry budget",
    }[verdict]
    if verdict == "failed" and not any(
        fp.on_our_conditions(r) and r.get("action") in ("FailJob", "FailIndex")
        for r in (job or (0, ()))[1]
    ):
        said = "its rules fail the workload"
    note = f"a pod failed: {name} ({condition.get('reason')}): {condition.get('message')}; {said}"
    if late == "late":
        note += (
            "; its condition landed after the pod failed: the Job controller may have judged "
            "it without (then by its exit code)"
        )
    elif late == "missed":
        note += "; the Job controller had judged it before its category was known"
    elif late == "gone":
        note += "; the pod was deleted before its category could be written on it"
    reads = any(fp.on_our_conditions(r) for r in (job or (0, ()))[1])
    kind = "Warning" if verdict == "failed" or late in ("late", "missed") else "Normal"
    if late == "gone" and reads:  # its rules read the category: judged without it
        kind = "Warning"
    return Event(regarding, kind, REASON, note[:1024], action="Classify")


def _with(pod: Mapping[str, Any], conditions: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod's status with ``conditions`` merged in by type (as the API merges them)."""
    status = dict(mapping(pod.get("status")))
    kinds = {c["type"] for c in conditions}
    kept = [c for c in items(status.get("conditions")) if mapping(c).get("type") not in kinds]
    status["conditions"] = [*kept, *conditions]
    return status


def _a_failure(pod: Mapping[str, Any]) -> bool:
    """Whether a failed or terminating pod is a failure to classify: not one deleted without
    a disruption condition (its Job or JobSet ending it, a person), unless classified."""
    if not terminating(pod) or cl.of_conditions(pod) is not None:
        return True
    return ps.disruption_reason(pod) is not None


def _job_facts(job: Mapping[str, Any]) -> tuple[bool, tuple]:
    meta = mapping(job.get("metadata"))
    template = mapping(mapping(mapping(job.get("spec")).get("template")).get("metadata"))
    rules = tuple(items(mapping(mapping(job.get("spec")).get("podFailurePolicy")).get("rules")))
    return planned(meta, template), rules


def _planned(meta: Mapping[str, Any]) -> bool:
    return planned(meta)
