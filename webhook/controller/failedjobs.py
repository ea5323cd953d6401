"""``RetryPolicyFailedJob``: a Warning Event when a Job ends ``Failed`` by a rule the webhook
wrote, saying which annotation decided it and why.

A Job that fails at once on a non-retriable exit code (``fail-non-retriable``) is the
webhook's doing, and ``kubectl describe job`` shows the Job controller's own words for it
("Container main for pod ml/train-x failed with exit code 42 matching FailJob rule at
index 1"), which name no annotation. This reconciler lists and watches Jobs and, for a Job
whose ``Failed`` condition came from one of our rules, writes one Event on the workload the
user applied (the Job; a JobSet child Job's JobSet; a TrainJob's), e.g. ``container main
exited 42, not in retriable-exit-codes 143: failed at once as fail-non-retriable asked``.

What the Job controller writes, and how it is read here:

- ``FailJob``: the ``Failed`` condition has reason ``PodFailurePolicy`` and the message
  ``Container <c> for pod <ns>/<pod> failed with exit code <n> matching FailJob rule at
  index <i>`` (``matchPodFailurePolicy`` in pkg/controller/job/pod_failure_policy.go, made
  the condition's message by ``syncJob`` in job_controller.go, through the interim
  ``FailureTarget`` condition; read by ``webhook.kube.jobcontroller``); rule ``i`` of the
  Job's ``podFailurePolicy`` is the one.
- ``FailIndex`` (``on-non-retriable: fail-index``): the index fails, the Job goes on, and
  fails at the end with reason ``FailedIndexes`` ("Job has failed indexes") or
  ``MaxFailedIndexesExceeded``; no message names a pod, so the Job's failed pods are
  listed (once) and judged by its rules as the controller judges them
  (``webhook.kube.failurepolicy.evaluate``).

A rule is ours when it has the shape the webhook writes (``is_non_retriable_rule``) and
the workload's ``retry-policy.dev/applied`` record says ``fail-non-retriable`` with those
codes: the Job's own record, else its CronJob's or JobSet's (the Jobs they make carry the
rules but not the record; one GET, only for a Job that failed so). A rule a user wrote,
or a Job failed by its backoff limit or deadline, gets no Event: the Job controller's
condition already says why.

Once per Job, across controller restarts and replicas: the Event's name is derived from
what it says (``webhook.cluster.events``), so a second controller finds it already there
(409) and adds nothing; and only Jobs that failed within ``window`` (the API server's
default Event TTL, an hour) are judged, so a restart does not write again an Event the
API server has since deleted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.cluster.events import Event, EventSink, WorkloadResolver
from webhook.cluster.history import parse_time as stamp
from webhook.controller.jobwatch import SharedJobs
from webhook.kinds.registry import WORKLOADS
from webhook.kube import failurepolicy as fp
from webhook.kube.jobcontroller import parse_failjob_message
from webhook.kube.objects import controller_of, items, mapping
from webhook.kube.wellknown import COMPLETION_INDEX, JOB_UID_LABEL
from webhook.plan.record import AppliedRecord
from webhook.policy.model import APPLIED

log = logging.getLogger(__name__)

REASON = "RetryPolicyFailedJob"
#: The Job failure reasons our rules can be behind (``batch.JobReason*``).
BY_POLICY = "PodFailurePolicy"
BY_FAILED_INDEXES = ("FailedIndexes", "MaxFailedIndexesExceeded")
#: At most this many failed indexes are named in one note.
MAX_INDEXES_NAMED = 5


@dataclass(frozen=True)
class Exit:
    """A container exit a rule of ours failed the Job (or an index) on."""

    container: str
    code: int
    index: str | None = None


class FailedJobs:
    """Watches Jobs; writes ``RetryPolicyFailedJob`` for each one our rules failed."""

    name = "failed-jobs"

    def __init__(
        self,
        batch_api: Any,
        core_api: Any,
        events: EventSink,
        resolver: WorkloadResolver | None = None,
        window: float = 3600.0,
        clock: Callable[[], float] = time.time,
        timeout: float = 5.0,
        jobs: SharedJobs | None = None,
    ):
        self.batch_api = batch_api
        self.core_api = core_api
        self.events = events
        self.resolver = resolver
        self.window = window
        self.clock = clock
        self.timeout = timeout
        #: Jobs already judged (their UIDs): a failed Job's later updates are not.
        self._done: OrderedDict[str, None] = OrderedDict()
        #: The controller's one watch of Jobs, or one of its own (``webhook.controller.jobwatch``).
        self._own = jobs is None
        self.jobs = jobs if jobs is not None else SharedJobs(batch_api)
        self.jobs.subscribe(lambda: None, lambda kind, job: self._seen(kind, job))
        self.watches = [self.jobs]

    def run(self, stop: threading.Event) -> None:
        if self._own:
            self.jobs.run(stop)
        else:
            stop.wait()  # the shared watch calls ``_seen``

    def _seen(self, kind: str, job: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            return
        try:
            event = self.judge(job)
        except Exception:  # one odd Job must not stop the watch
            log.exception("failed Job not judged")
            return
        if event is not None:
            self.events.emit(event)

    # --- one Job ------------------------------------------------------------------------------
    def judge(self, job: Mapping[str, Any]) -> Event | None:
        """The Event for ``job``, when it failed by a rule of ours within the window."""
        meta = mapping(job.get("metadata"))
        uid = meta.get("uid")
        if not isinstance(uid, str) or uid in self._done:
            return None
        condition = failed_condition(job)
        if condition is None:
            return None
        self._remember(uid)
        reason = condition.get("reason")
        if reason != BY_POLICY and reason not in BY_FAILED_INDEXES:
            return None
        when = stamp(condition.get("lastTransitionTime"))
        if when is None or self.clock() - when > self.window:
            return None
        rules = items(mapping(mapping(job.get("spec")).get("podFailurePolicy")).get("rules"))
        if reason == BY_POLICY:
            exits, action = failed_by_rule(str(condition.get("message") or ""), rules), "FailJob"
        else:
            exits, action = self._failed_indexes(job, rules), "FailIndex"
        if not exits:
            return None
        record = self._record(job)
        retriable = our_retriable_codes(record, action)
        if retriable is None:
            return None
        rule_codes = {
            code
            for rule in rules
            if fp.is_non_retriable_rule(rule) and rule.get("action") == action
            for code in rule["onExitCodes"]["values"]
        }
        regarding = WORKLOADS.of_job(job)
        if regarding is None:
            return None
        note = failed_note(exits, retriable, sorted(rule_codes - set(retriable)), str(reason))
        if regarding.kind != "Job":
            note = f"Job {meta.get('name')}: {note}"
        return Event(regarding, "Warning", REASON, note, action="FailJob", once=True)

    def _failed_indexes(self, job: Mapping[str, Any], rules: list[Any]) -> list[Exit]:
        """The indexes a ``FailIndex`` rule of our shape failed: the Job's failed pods,
        judged by its rules as the Job controller judges them."""
        if not any(fp.is_non_retriable_rule(r) and r.get("action") == "FailIndex" for r in rules):
            return []
        meta = mapping(job.get("metadata"))
        try:
            resp = self.core_api.list_namespaced_pod(
                meta.get("namespace"),
                label_selector=f"{JOB_UID_LABEL}={meta.get('uid')}",
                field_selector="status.phase=Failed",
                _preload_content=False,
                _request_timeout=(self.timeout, self.timeout),
            )
            pods = items(json.loads(resp.data).get("items"))
        except Exception as err:
            log.warning(
                "failed pods of Job %s/%s unlisted: %s",
                meta.get("namespace"),
                meta.get("name"),
                err,
            )
            return []
        exits: dict[str, Exit] = {}
        for pod in pods:
            match = fp.evaluate(rules, fp.PodFailure.from_pod(pod))
            if match is None or match.action != "FailIndex" or match.container is None:
                continue
            if not fp.is_non_retriable_rule(match.rule):
                continue
            annotations = mapping(mapping(pod.get("metadata")).get("annotations"))
            index = annotations.get(COMPLETION_INDEX)
            if isinstance(index, str) and index not in exits:
                exits[index] = Exit(match.container.name, match.container.exit_code, index)
        return sorted(exits.values(), key=lambda e: int(e.index or 0))

    def _record(self, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """What the webhook applied to the workload this Job comes from: the Job's own
        record, else its CronJob's or JobSet's."""
        meta = mapping(job.get("metadata"))
        own = applied(meta)
        if own is not None:
            return own
        owner = controller_of(meta)
        if owner is None:
            return None
        namespace, name = str(meta.get("namespace")), str(owner.get("name"))
        group = str(owner.get("apiVersion") or "").partition("/")[0]
        if owner.get("kind") == "CronJob" and group == "batch":
            try:
                resp = self.batch_api.read_namespaced_cron_job(
                    name,
                    namespace,
                    _preload_content=False,
                    _request_timeout=(self.timeout, self.timeout),
                )
                return applied(mapping(json.loads(resp.data).get("metadata")))
            except Exception as err:
                log.warning("CronJob %s/%s unreadable: %s", namespace, name, err)
                return None
        if self.resolver is not None:  # a JobSet's, read once
            found = self.resolver.read_owner(namespace, owner)
            return applied(mapping((found or {}).get("metadata")))
        return None

    def _remember(self, uid: str) -> None:
        self._done[uid] = None
        while len(self._done) > 10_000:
            self._done.popitem(last=False)


def failed_by_rule(message: str, rules: list[Any]) -> list[Exit]:
    """The exit a ``FailJob`` rule matched, from the condition's message, when that rule
    (by its index) has our shape."""
    found = parse_failjob_message(message)
    if found is None or found.action != "FailJob":
        return []
    if found.container is None or found.exit_code is None:
        return []  # a rule on pod conditions: fail-non-retriable writes exit-code rules
    index = found.index
    if index >= len(rules) or not fp.is_non_retriable_rule(rules[index]):
        return []
    return [Exit(found.container, found.exit_code)]


def failed_condition(job: Mapping[str, Any]) -> dict[str, Any] | None:
    for condition in items(mapping(job.get("status")).get("conditions")):
        if (
            isinstance(condition, dict)
            and condition.get("type") == "Failed"
            and condition.get("status") == "True"
        ):
            return condition
    return None


def applied(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    record = AppliedRecord.parse(mapping(metadata.get("annotations")).get(APPLIED))
    return dict(record.settings) if record is not None else None


def our_retriable_codes(record: Mapping[str, Any] | None, action: str) -> list[int] | None:
    """The retriable exit codes, when ``record`` says the webhook wrote ``fail-non-retriable``
    rules with ``action`` (FailJob, or FailIndex for ``on-non-retriable: fail-index``)."""
    if record is None:
        return None
    codes = record.get("failNonRetriable")
    if not isinstance(codes, list) or not all(isinstance(c, int) for c in codes):
        return None
    wanted = "FailIndex" if record.get("onNonRetriable") == "fail-index" else "FailJob"
    return sorted(codes) if action == wanted else None


def failed_note(exits: list[Exit], retriable: list[int], in_place: list[int], reason: str) -> str:
    """The Event's note: which exit, why it is not retried, which annotation decided."""
    not_in = f"not in retriable-exit-codes {_codes(retriable)}"
    if in_place:
        not_in += f" or in-place-exit-codes {_codes(in_place)}"
    if exits[0].index is None:
        first = exits[0]
        return (
            f"container {first.container} exited {first.code}, {not_in}: "
            "failed at once as fail-non-retriable asked"
        )
    named = [f"index {e.index}: container {e.container} exited {e.code}" for e in exits]
    shown = "; ".join(named[:MAX_INDEXES_NAMED])
    if len(named) > MAX_INDEXES_NAMED:
        shown += f"; and {len(named) - MAX_INDEXES_NAMED} more"
    return (
        f"{shown}, {not_in}: failed at once as fail-non-retriable asked "
        f"(on-non-retriable fail-index); the Job failed: {reason}"
    )


def _codes(codes: list[int]) -> str:
    return ",".join(str(c) for c in codes)
