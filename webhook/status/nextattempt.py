"""What a pod the Job creates now gets from the webhook: its attempt, placement, memory,
nodes kept off and delay."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.cluster.attempts import (
    AttemptLookup,
    job_failed_count,
    placement_budget,
    terminating_pods,
)
from webhook.cluster.history import FailureHistory, HistoryKey, HistoryLookup
from webhook.cluster.limits import LimitLookup
from webhook.cluster.nodes import NodeAnswer
from webhook.kinds.registry import lookup
from webhook.kube import failurepolicy, podspec
from webhook.kube.failurepolicy import PodFailure
from webhook.kube.gates import GATE as RETRY_DELAY_GATE
from webhook.kube.gates import NOT_BEFORE
from webhook.kube.jobcontroller import pod_from_template
from webhook.kube.objects import items, mapping
from webhook.kube.scheduling import Placement
from webhook.kube.wellknown import JOB_UID_LABEL
from webhook.plan.outcome import Context
from webhook.policy.config import Config
from webhook.status.attempts import index_failures, job_rules
from webhook.status.explained import applied_record
from webhook.status.model import Attempt, Delay, Lookups, MemoryChange, NextAttempt
from webhook.status.reader import KINDS, Tree, facts_of

# --- the next attempt -------------------------------------------------------------------


class LiveAttempts:
    """The attempt source of the next attempt's planner: the Jobs and pods as read,
    counted as the webhook's attempt cache counts them, and its failure history recorded
    from the failed pods as its pod watch records them."""

    def __init__(self, tree: Tree, lookups: Lookups):
        self.lookups = lookups
        self.jobs = {
            str(mapping(j.get("metadata")).get("uid")): j
            for j in tree.jobs
            if mapping(j.get("metadata")).get("uid")
        }
        self.history = FailureHistory(lookups.core_api, JOB_UID_LABEL, self._counted)
        self.counted_pods: dict[str, int] = {}
        for uid, pods in tree.pods.items():
            for pod in pods:
                if mapping(pod.get("status")).get("phase") != "Failed":
                    continue
                counted = self._counted(uid, pod)
                self.counted_pods[uid] = self.counted_pods.get(uid, 0) + int(counted)
                self.history.record(pod, uid, counted)
        self.last: HistoryLookup | None = None

    def _counted(self, job_uid: str, pod: Mapping[str, Any]) -> bool:
        rules = job_rules(self.jobs.get(job_uid) or {})
        return failurepolicy.counts(failurepolicy.evaluate(rules, PodFailure.from_pod(pod)))

    def job_failures(self, namespace: str, name: str, uid: str) -> AttemptLookup:
        job = self.jobs.get(uid)
        if job is None:
            return AttemptLookup(None, "none", f"Job {namespace}/{name} was not read")
        return AttemptLookup(
            max(job_failed_count(job), self.counted_pods.get(uid, 0)),
            "Job status (read now)",
            budget=placement_budget(job),
            terminating=terminating_pods(job),
        )

    def job_history(self, key: HistoryKey) -> HistoryLookup:
        answer = self.history.lookup(key)
        if answer is None:  # counted failures whose pods were not among those read
            answer = self.history.fetch(key)
        self.last = answer
        return answer

    def limit_ranges(self, namespace: str) -> LimitLookup:
        return self.lookups.limit_ranges(namespace)

    def placement(self, question: Placement) -> NodeAnswer:
        return self.lookups.placement(question)

    def stats(self) -> dict[str, Any]:
        return {}


def next_attempt(
    job: Mapping[str, Any],
    attempts: Sequence[Attempt],
    pods: Sequence[Mapping[str, Any]],
    config: Config,
    source: LiveAttempts,
    now: float,
) -> NextAttempt:
    meta = mapping(job.get("metadata"))
    spec = mapping(job.get("spec"))
    indexed = spec.get("completionMode") == "Indexed"
    index = None
    if indexed:
        failed = [a for a in attempts if a.phase == "Failed" and a.index is not None]
        index = failed[-1].index if failed else 0
    pod = pod_from_template(job, index, index_failures(attempts).get(index or 0, 0))
    source.last = None
    result, warnings = planned_pod(pod, config, str(meta.get("namespace") or ""), source)
    record = applied_record(result)
    out = NextAttempt(
        job=str(meta.get("name")),
        attempt=record.get("attempt") + 1 if isinstance(record.get("attempt"), int) else None,
        attempts=record.get("attempts") if isinstance(record.get("attempts"), int) else None,
        non_spot=record.get("nonSpot") if isinstance(record.get("nonSpot"), bool) else None,
        changes=[w.removeprefix("retry-policy: ") for w in warnings],
    )
    runs = _runs_of(mapping(mapping(pod.get("metadata")).get("labels")))
    if runs is not None:
        out.unit = f"{runs} run"  # its pods place themselves by the set's runs
    if out.attempt is None:
        counted = source.job_failures("", "", str(meta.get("uid"))).failures
        out.attempt = counted + 1 if isinstance(counted, int) else None
    out.memory = _memory_changes(pod, result)
    avoided = record.get("avoidedNodes")
    if isinstance(avoided, int) and avoided > 0 and source.last is not None:
        out.avoided_nodes = list(source.last.nodes[-avoided:])
        out.avoided_by = "preference" if record.get("avoidedBy") == "preference" else "requirement"
    out.delay = delay_of(pods, now) or _planned_delay(result, now)
    return out


def _runs_of(labels: Mapping[str, Any]) -> str | None:
    """The kind whose runs a pod with these labels counts its attempts by
    (``StoryFacts.run_label``: a JobSet's, restarted whole); ``None``: its Job's."""
    for kind in KINDS:
        label = facts_of(kind).run_label
        if label and labels.get(label):
            return kind.kind
    return None


def planned_pod(
    pod: Mapping[str, Any], config: Config, namespace: str, source: LiveAttempts
) -> tuple[dict[str, Any], list[str]]:
    """The pod as the pod kind's own planner (``webhook.kinds.pod``) makes it, from its
    template's annotations and the failures recorded (``source``: the Jobs and pods read),
    and the warnings it gives (what kubectl would show). It runs here on a copy, not
    through admission: nothing is stored, and a pod it would refuse is shown as it is."""
    made = copy.deepcopy(dict(pod))
    mutator = lookup("", "v1", "Pod")
    ctx = Context(config, source, namespace, kubernetes_version=config.kubernetes_version)
    if mutator is None or not mutator.applies(made, ctx):
        return made, []
    out = mutator.mutate(made, ctx)
    if out.problems:
        return dict(pod), out.warnings
    return made, out.warnings if made != pod else out.notes


def _memory_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[MemoryChange]:
    changes = []
    old = {c.get("name"): c for c in podspec.containers(mapping(before.get("spec")))}
    for container in podspec.containers(mapping(after.get("spec"))):
        name = container.get("name")
        was = mapping(old.get(name))
        for kind in ("requests", "limits"):
            a = mapping(mapping(was.get("resources")).get(kind)).get("memory")
            b = mapping(mapping(container.get("resources")).get(kind)).get("memory")
            if a != b:
                changes.append(MemoryChange(str(name), kind[:-1], a, b))
    return changes


def delay_of(pods: Sequence[Mapping[str, Any]], now: float) -> Delay | None:
    """A pod of the Job held back by a retry delay: gated (``retry-policy.dev/retry-delay``)
    with the time it may start (``retry-policy.dev/not-before``), and what is left of it."""
    for pod in pods:
        spec = mapping(pod.get("spec"))
        gates = {mapping(g).get("name") for g in items(spec.get("schedulingGates"))}
        if RETRY_DELAY_GATE not in gates:
            continue
        delay = _delay(mapping(pod.get("metadata")), now)
        if delay is not None:
            delay.pod = str(mapping(pod.get("metadata")).get("name") or "") or None
            return delay
    return None


def _planned_delay(pod: Mapping[str, Any], now: float) -> Delay | None:
    """The delay the next pod's planner gives it (the webhook's retry delays write
    ``not-before`` on the pod): the hook by which ``status`` shows it once they do."""
    return _delay(mapping(pod.get("metadata")), now)


def _delay(meta: Mapping[str, Any], now: float) -> Delay | None:
    raw = mapping(meta.get("annotations")).get(NOT_BEFORE)
    if not isinstance(raw, str):
        return None
    try:
        when = dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return Delay(None, raw, max(0, int(when - now + 0.999)))
