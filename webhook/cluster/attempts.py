"""How many counted failures a Job has had: the attempt number of its next pod.

Pod admission is on the hot path of every Job retry, so the answer comes from a
watch-backed in-memory cache (one list, then a watch stream), never from a request per
pod. Only on a cache miss (a Job created a moment ago, before its watch event arrived)
is there one bounded GET; when the API cannot answer, the caller admits the pod
unchanged with a warning. A short circuit breaker keeps an unreachable API server from
adding its timeout to every admission.

Counting follows the Job controller (``syncJob``, pkg/controller/job/job_controller.go:
``status.failed`` plus the failures not yet counted in it, ``uncountedTerminatedPods``, and
new failed pods that no ``Ignore`` rule matched): ``max(status.failed +
len(status.uncountedTerminatedPods.failed), the Job's own Failed pods that matched no
Ignore rule)``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.cluster.events import WorkloadKind
from webhook.cluster.history import (
    FailureHistory,
    HistoryKey,
    HistoryLookup,
    scoped,
    wants_history,
)
from webhook.cluster.informer import Informer, Informers, short_error
from webhook.cluster.record import KindRecords, Record, lineage_of, merge, parsed, text_of
from webhook.kube.failurepolicy import PodFailure, counts, evaluate
from webhook.kube.wellknown import JOB_UID_LABEL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttemptLookup:
    """Counted failures so far (``None``: unknown) and where the number came from; for a
    Job's pods, also the Job's current ``spec.backoffLimit`` (``budget``), which may have
    been changed since the pod template was written (the field is mutable)."""

    failures: int | None
    source: str
    reason: str = ""
    budget: int | None = None
    #: For a Job whose pods learn from earlier attempts: its pods still terminating
    #: (``status.terminating``). Unless only Failed pods are replaced, the Job controller
    #: counts such a pod as failed before it is (``isPodFailed`` in
    #: pkg/controller/job/job_controller.go): a failure whose pod is not Failed yet.
    terminating: int = 0


def job_failed_count(job: Mapping[str, Any]) -> int:
    status = job.get("status") or {}
    failed = status.get("failed") or 0
    uncounted = (status.get("uncountedTerminatedPods") or {}).get("failed") or []
    return int(failed) + len(uncounted)


NON_SPOT_ANNOTATION = "retry-policy.dev/non-spot-attempts"


def placement_budget(job: Mapping[str, Any]) -> int | None:
    """The Job's ``backoffLimit``, kept for Jobs whose pods are placed by it (a template
    with ``non-spot-attempts``) or learn from earlier attempts (the attempts their
    Events count: "attempt 3 of 4"), without a per-index budget (pods of those count
    their index's failures, against ``backoffLimitPerIndex``, which is immutable)."""
    spec = job.get("spec") or {}
    if not isinstance(spec, dict) or spec.get("backoffLimitPerIndex") is not None:
        return None
    meta = (spec.get("template") or {}).get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict) or (
        NON_SPOT_ANNOTATION not in annotations and not wants_history(meta)
    ):
        return None
    limit = spec.get("backoffLimit")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def terminating_pods(job: Mapping[str, Any]) -> int:
    """``status.terminating`` of a Job whose template learns from earlier attempts (0 for
    any other, so that a change of it does not make their pods' answers differ)."""
    spec = job.get("spec") or {}
    template = spec.get("template") if isinstance(spec, dict) else None
    meta = template.get("metadata") if isinstance(template, dict) else None
    if not isinstance(meta, dict) or not wants_history(meta):
        return 0
    count = (job.get("status") or {}).get("terminating")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def _ignore_rules(job: Mapping[str, Any]) -> tuple | None:
    """The Job's rules, kept only when an Ignore rule exists (else no pod can be ignored)."""
    policy = (job.get("spec") or {}).get("podFailurePolicy") or {}
    rules = policy.get("rules") or []
    if any(isinstance(r, dict) and r.get("action") == "Ignore" for r in rules):
        return tuple(rules)
    return None


class JobCache(Informers):
    """Watch-backed counts of failed attempts per Job UID."""

    def __init__(
        self,
        batch_api: Any,
        core_api: Any,
        lookup_timeout: float = 0.5,
        breaker_seconds: float = 10.0,
        watch_pods: bool = True,
        set_records: WorkloadKind | None = None,
    ):
        super().__init__()
        self.batch_api = batch_api
        self.core_api = core_api
        self.lookup_timeout = lookup_timeout
        self.breaker_seconds = breaker_seconds
        self._lock = threading.Lock()
        self._jobs: dict[str, int] = {}
        #: ``placement_budget`` of the Jobs that have one.
        self._budgets: dict[str, int] = {}
        #: ``terminating_pods`` of the Jobs that have any.
        self._terminating: dict[str, int] = {}
        self._rules: dict[str, tuple] = {}
        self._rule_sets: dict[bytes, tuple] = {}
        #: Failed pods -> (their Job, counted), and Jobs -> their counted failed pods, the
        #: Jobs as "namespace/UID" (``scoped``): a pod in another namespace naming a Job's
        #: UID counts nothing for that Job.
        self._pod_job: dict[str, tuple[str, bool]] = {}
        self._pod_counts: dict[str, int] = {}
        #: The controller's records on Jobs (``webhook.cluster.record``), and on the sets
        #: of the kind declared to keep them (``set_records``: a JobSet, by the set UID of
        #: a pod's question; a watch of its own, started by the first such pod that asks).
        self._records: dict[str, str] = {}
        self.jobsets = (
            KindRecords(_custom_api(batch_api), set_records)
            if watch_pods and set_records is not None
            else None
        )
        self._open_until = 0.0
        self._counters = {"hits": 0, "misses": 0, "fallback_errors": 0, "breaker_skips": 0}
        self._informers = [
            Informer(
                "jobs",
                batch_api.list_job_for_all_namespaces,
                self._reset_jobs,
                self._apply_job,
                {},
                self._stop,
            )
        ]
        if watch_pods:
            self._informers.append(
                Informer(
                    "failed-pods",
                    core_api.list_pod_for_all_namespaces,
                    self._reset_pods,
                    self._apply_pod,
                    {"label_selector": JOB_UID_LABEL, "field_selector": "status.phase=Failed"},
                    self._stop,
                )
            )
        #: What the failed pods of Jobs went through (``webhook.cluster.history``), fed by the pod
        #: watch below.
        self.history = FailureHistory(
            core_api,
            JOB_UID_LABEL,
            self._counted,
            lookup_timeout,
            breaker_seconds,
            recorded=self._recorded,
        )

    # --- store updates (called from informer threads) ---------------------------
    def _reset_jobs(self) -> None:
        with self._lock:
            self._jobs.clear()
            self._records.clear()
            self._budgets.clear()
            self._terminating.clear()
            self._rules.clear()
            self._rule_sets.clear()

    def _intern(self, rules: tuple) -> tuple:
        """Share one copy of each distinct rule list: thousands of Jobs made from the same
        template carry the same rules, and keeping each copy dominated the cache's memory."""
        key = orjson.dumps(rules, option=orjson.OPT_SORT_KEYS)
        shared = self._rule_sets.get(key)
        if shared is not None:
            return shared
        if len(self._rule_sets) < 4096:
            self._rule_sets[key] = rules
        return rules

    def _apply_job(self, kind: str, job: Mapping[str, Any]) -> None:
        uid = (job.get("metadata") or {}).get("uid")
        if not uid:
            return
        with self._lock:
            if kind == "DELETED":
                self._jobs.pop(uid, None)
                self._budgets.pop(uid, None)
                self._rules.pop(uid, None)
                self._terminating.pop(uid, None)
                self._records.pop(uid, None)
                self.history.forget_job(uid, str((job.get("metadata") or {}).get("namespace")))
                return
            self._jobs[uid] = job_failed_count(job)
            record = text_of(job)
            if record is None:
                self._records.pop(uid, None)
            else:
                self._records[uid] = record
            terminating = terminating_pods(job)
            if terminating:
                self._terminating[uid] = terminating
            else:
                self._terminating.pop(uid, None)
            budget = placement_budget(job)
            if budget is None:
                self._budgets.pop(uid, None)
            else:
                self._budgets[uid] = budget
            rules = _ignore_rules(job)
            if rules is None:
                self._rules.pop(uid, None)
            else:
                self._rules[uid] = self._intern(rules)

    def _reset_pods(self) -> None:
        with self._lock:
            self._pod_job.clear()
            self._pod_counts.clear()

    def _apply_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        with self._lock:
            previous = self._pod_job.pop(uid, None)
            if previous is not None and previous[1]:
                self._pod_counts[previous[0]] -= 1
                if not self._pod_counts[previous[0]]:
                    del self._pod_counts[previous[0]]
            phase = (pod.get("status") or {}).get("phase")
            if kind == "DELETED" or phase != "Failed":
                return
            job_uid = _controller_uid(meta)
            if job_uid is None:
                return
            rules = self._rules.get(job_uid)
            counted = counts(evaluate(rules, PodFailure.from_pod(pod))) if rules else True
            job = scoped(str(meta.get("namespace")), job_uid)
            self._pod_job[uid] = (job, counted)
            if counted:
                self._pod_counts[job] = self._pod_counts.get(job, 0) + 1
            self.history.record(pod, job_uid, counted)

    def _counted(self, job_uid: str, pod: Mapping[str, Any]) -> bool:
        """Whether the Job controller counts this failed pod of the Job (as above)."""
        with self._lock:
            rules = self._rules.get(job_uid)
        return counts(evaluate(rules, PodFailure.from_pod(pod))) if rules else True

    # --- lookups (hot path) ------------------------------------------------------
    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        answer = self.answer_at_once(uid, namespace)
        if answer is not None:
            return answer
        return self._fallback(namespace, name, uid)

    def answer_at_once(self, uid: str, namespace: str) -> AttemptLookup | None:
        """The answer when it needs no request to the API (a cache hit, or the breaker
        open after recent errors); ``None`` when it needs the one bounded GET, which
        ``job_failures`` makes. The server answers on its event loop only what this
        answers, and hands the rest to a thread (``webhook/serving/worker.py``)."""
        with self._lock:
            failed = self._jobs.get(uid)
            pods = self._pod_counts.get(scoped(namespace, uid), 0)
            budget = self._budgets.get(uid)
            terminating = self._terminating.get(uid, 0)
        if failed is not None:
            self._counters["hits"] += 1
            return AttemptLookup(
                max(failed, pods), "Job status (cache)", budget=budget, terminating=terminating
            )
        if time.monotonic() < self._open_until:
            self._counters["misses"] += 1
            self._counters["breaker_skips"] += 1
            return AttemptLookup(None, "none", "Kubernetes API unavailable (recent errors)")
        return None

    def _fallback(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        self._counters["misses"] += 1
        with self._lock:
            pods = self._pod_counts.get(scoped(namespace, uid), 0)
        half = self.lookup_timeout / 2
        try:
            resp = self.batch_api.read_namespaced_job(
                name, namespace, _preload_content=False, _request_timeout=(half, half)
            )
            job = json.loads(resp.data)
        except Exception as err:
            self._counters["fallback_errors"] += 1
            if getattr(err, "status", None) != 404:  # a missing Job is an answer, not an outage
                self._open_until = time.monotonic() + self.breaker_seconds
            return AttemptLookup(None, "none", f"Job {namespace}/{name} unreadable: {_short(err)}")
        if (job.get("metadata") or {}).get("uid") != uid:
            return AttemptLookup(None, "none", f"Job {namespace}/{name} was replaced")
        return AttemptLookup(
            max(job_failed_count(job), pods),
            "Job status (API)",
            budget=placement_budget(job),
            terminating=terminating_pods(job),
        )

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        """What earlier attempts of a pod's Job (or index) went through: from the records
        of the pod watch, or after one bounded list of the Job's failed pods when the Job
        counted failures the watch has not delivered yet; with the workload's own record
        (``webhook.cluster.record``), which holds what this replica never saw."""
        return self._with_record(key, self.history.fetch(key))

    def history_at_once(self, key: HistoryKey) -> HistoryLookup | None:
        """``job_history`` when it needs no request to the API; ``None`` when it needs the
        one bounded list (as ``answer_at_once`` for ``job_failures``)."""
        answer = self.history.at_once(key)
        return None if answer is None else self._with_record(key, answer)

    def _record_for(self, key: HistoryKey) -> Record | None:
        if key.jobset is not None:
            return self.jobsets.record(key.jobset) if self.jobsets is not None else None
        with self._lock:
            text = self._records.get(key.uid)
        return parsed(text) if text is not None else None

    def _recorded(self, key: HistoryKey) -> int:
        """Counted failures of the question's Job (or index) in the Job's record; a
        JobSet's record counts earlier runs, not the Job the question counts."""
        if key.jobset is not None:
            return 0
        record = self._record_for(key)
        return record.counted(key.index, key.per_index) if record is not None else 0

    def _with_record(self, key: HistoryKey, answer: HistoryLookup) -> HistoryLookup:
        record = self._record_for(key)
        if record is None or not answer.known:
            return answer
        merged = merge(answer, record.lineages.get(lineage_of(key)))
        if key.jobset is not None and merged.earlier_runs_unseen and record.run >= key.run - 1:
            merged = dataclasses.replace(merged, earlier_runs_unseen=False)
        return merged

    def stats(self) -> dict[str, Any]:
        with self._lock:
            size = len(self._jobs)
            pods = len(self._pod_job)
        return {
            "enabled": True,
            "synced": self.synced,
            "jobs": size,
            "failed_pods": pods,
            "watch_errors": sum(i.errors for i in self._informers),
            **self._counters,
            "history": self.history.stats(),
        }


def _controller_uid(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") == "Job":
            return ref.get("uid")
    return (meta.get("labels") or {}).get(JOB_UID_LABEL)


def _custom_api(batch_api: Any) -> Any:
    """A CustomObjectsApi on the same client (connection pool and credentials)."""
    from kubernetes import client

    return client.CustomObjectsApi(batch_api.api_client)


def _short(err: Exception) -> str:
    return short_error(err)


def connect(mode: str = "auto") -> tuple[Any, Any] | None:
    """API clients for the cache: in-cluster first, then kubeconfig; ``None`` when off."""
    if mode == "off":
        return None
    from kubernetes import client, config

    try:
        if mode in ("auto", "incluster"):
            try:
                config.load_incluster_config()
            except config.ConfigException:
                if mode == "incluster":
                    raise
                config.load_kube_config()
        else:
            config.load_kube_config()
    except Exception as err:
        if mode == "auto":
            log.info("no Kubernetes API configured (%s); attempt lookups disabled", err)
            return None
        raise
    api = client.ApiClient()
    return client.BatchV1Api(api), client.CoreV1Api(api)
