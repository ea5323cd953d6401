"""One pod of a Job as an attempt: how it ended, and whether the Job controller counts
it (the one podFailurePolicy evaluation, ``failurepolicy.evaluate``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.cluster import classify
from webhook.cluster import history as failures
from webhook.kube import failurepolicy
from webhook.kube.failurepolicy import PodFailure
from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import COMPLETION_INDEX, RESTART_ATTEMPT
from webhook.policy.categories import Category as CategorySpec
from webhook.status.explained import applied_record
from webhook.status.model import Attempt, Category


def job_rules(job: Mapping[str, Any]) -> list[Any]:
    return items(mapping(mapping(job.get("spec")).get("podFailurePolicy")).get("rules"))


def created_at(obj: Mapping[str, Any]) -> str:
    return str(mapping(obj.get("metadata")).get("creationTimestamp") or "")


def attempt_from(
    pod: Mapping[str, Any],
    job: str,
    rules: Sequence[Any],
    configured: Sequence[CategorySpec] = (),
) -> Attempt:
    meta = mapping(pod.get("metadata"))
    spec = mapping(pod.get("spec"))
    status = mapping(pod.get("status"))
    phase = str(status.get("phase") or "Pending")
    annotations = mapping(meta.get("annotations"))
    raw_index = annotations.get(COMPLETION_INDEX)
    labels = mapping(meta.get("labels"))
    run = labels.get(RESTART_ATTEMPT)
    attempt = Attempt(
        pod=str(meta.get("name") or ""),
        job=job,
        phase=phase,
        node=spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None,
        created=created_at(pod),
        index=int(raw_index) if isinstance(raw_index, str) and raw_index.isdigit() else None,
        applied=dict(applied_record(pod).settings),
        run=int(run) if isinstance(run, str) and run.isdigit() else None,
    )
    if meta.get("deletionTimestamp") and phase not in ("Failed", "Succeeded"):
        attempt.phase = "Terminating"
    attempt.disruption = failures.disruption(pod)  # (also of a pod still stopping)
    if phase != "Failed":
        return attempt
    attempt.category = category_of(pod, configured)
    cause, when = failures.failure_cause(pod)
    attempt.cause = cause
    attempt.finished = utc_time(when)
    attempt.node_failed = failures.failed_node(pod) is not None
    what, _, rest = cause.partition(":")
    if what == "oom-killed":
        attempt.container, attempt.exit_code = rest, _exit_code(pod, rest)
    elif what == "exit-code":
        code, _, container = rest.partition(":")
        attempt.container, attempt.exit_code = container, int(code)
    match = failurepolicy.evaluate(rules, PodFailure.from_pod(pod))
    attempt.counted = failurepolicy.counts(match)
    if match is not None:
        attempt.rule, attempt.action = match.index, match.action
        if match.container is not None and attempt.container is None:
            attempt.container, attempt.exit_code = match.container.name, match.container.exit_code
    if attempt.disruption is not None and attempt.container is None:
        # What its first container stopped with (SIGTERM, or SIGKILL after the grace).
        exits = PodFailure.from_pod(pod).exits
        first = next((e for e in exits if e.exit_code != 0), None)
        if first is not None:
            attempt.container, attempt.exit_code = first.name, first.exit_code
    return attempt


def category_of(pod: Mapping[str, Any], configured: Sequence[CategorySpec] = ()) -> Category:
    """The failed pod's category: the controller's condition, else what the classifier
    makes of the pod alone: with the built-in categories, and the admins' own when
    ``status`` was given the config (``--config``); no Events (a pod the controller
    wrote none on: ``categoryConditions: WhenRead``, or no controller led)."""
    known = classify.of_conditions(pod)
    if known is not None:
        name, condition = known
        return Category(
            name,
            str(condition.get("reason") or ""),
            str(condition.get("message") or ""),
            "controller",
        )
    found = classify.classify(pod, configured)
    return Category(found.category, found.signal, found.hint(configured), "status")


def _exit_code(pod: Mapping[str, Any], container: str) -> int | None:
    for exit_ in PodFailure.from_pod(pod).exits:
        if exit_.name == container:
            return exit_.exit_code
    return None


def utc_time(when: float | None) -> str | None:
    if when is None:
        return None
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def index_failures(attempts: Sequence[Attempt]) -> dict[int, int]:
    """Counted failures per index: its failed pods that count (pods are kept after they
    fail, so this is what the controller's per-index count read from them says)."""
    found: dict[int, int] = {}
    for a in attempts:
        if a.index is not None:
            found[a.index] = found.get(a.index, 0) + (1 if a.counted else 0)
    return found
