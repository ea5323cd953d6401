"""One Job's story: its attempts, its budgets as the Job controller counts them, what
ended it (the FailJob rule and who wrote it), and its next attempt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.cluster.attempts import job_failed_count
from webhook.kinds.jobset.failurepolicy import PEER_MESSAGE_PREFIX
from webhook.kinds.story import (
    ENDING,
    Budget,
    Decision,
    as_int,
    final_condition,
    job_state,
    retries_left,
)
from webhook.kube.jobcontroller import exceeds_backoff_limit, parse_failjob_message
from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import JOBSET_JOB_INDEX, REPLICATED_JOB, RESTART_ATTEMPT
from webhook.plan.policies import has_policy_annotations
from webhook.plan.record import AppliedRecord
from webhook.policy.config import Config
from webhook.policy.model import PREFIX
from webhook.status.attempts import attempt_from, created_at, index_failures, job_rules
from webhook.status.causes import (
    Causes,
    budget_facts,
    causes_of,
    disruption_budgets,
    in_place_budgets,
    next_disruption,
)
from webhook.status.explained import applied_record, origin_of
from webhook.status.model import Attempt, JobStory
from webhook.status.nextattempt import LiveAttempts, next_attempt
from webhook.status.reader import Tree, facts_of

# --- one Job ----------------------------------------------------------------------------


def next_group(job: Mapping[str, Any]) -> str:
    labels = mapping(mapping(job.get("metadata")).get("labels"))
    return str(labels.get(REPLICATED_JOB) or mapping(job.get("metadata")).get("uid"))


def job_story(
    job: Mapping[str, Any],
    tree: Tree,
    record: AppliedRecord,
    config: Config,
    source: LiveAttempts,
    now: float,
    causes: Causes | None = None,
) -> JobStory:
    meta = mapping(job.get("metadata"))
    spec = mapping(job.get("spec"))
    uid = str(meta.get("uid") or "")
    name = str(meta.get("name") or "")
    pods = tree.pods.get(uid)
    rules = job_rules(job)
    own = causes is None  # a Job's own record, not its JobSet's
    causes = causes if causes is not None else causes_of(job, f"Job {name}")
    attempts = []
    for pod in sorted(pods or (), key=created_at):
        attempt = attempt_from(pod, name, rules, config.categories)
        budget_facts(attempt, pod, rules, causes)
        attempts.append(attempt)
    counted_pods = sum(1 for a in attempts if a.counted)
    counted = max(job_failed_count(job), counted_pods)
    ignored = sum(1 for a in attempts if a.counted is False)
    story = JobStory(name, uid, job_state(job), counted, ignored, attempts=attempts)
    labels = mapping(meta.get("labels"))
    if labels.get(REPLICATED_JOB):
        index = labels.get(JOBSET_JOB_INDEX, "?")
        run = labels.get(RESTART_ATTEMPT, "0")
        rjob = labels[REPLICATED_JOB]
        story.role = f"replicatedJob {rjob}, job index {index}, run {run}"
    elif (role := facts_of(tree.kind).role) is not None:
        story.role = role(job)
    story.budgets = _job_budgets(job, attempts, counted, pods)
    running = story.state in ("Running", "Pending")
    if own:
        disruptions = disruption_budgets(causes, running)
        story.budgets += disruptions
        story.next_disruption = next_disruption(causes, disruptions) if running else []
    story.budgets += in_place_budgets(attempts, name)
    if pods is None:
        story.notes.append("its pods could not be read: failed attempts are not shown")
    if story.state in ("Failed", "Succeeded", "Failing", "Succeeding"):
        story.decision = _job_decision(job, rules, record)
    elif (spent := _budget_spent(spec, counted)) is not None:
        story.notes.append(spent)
    elif pods is not None and has_policy_annotations(
        mapping(mapping(spec.get("template")).get("metadata"))
    ):
        story.next = next_attempt(job, attempts, pods, config, source, now)
    return story


def _budget_spent(spec: Mapping[str, Any], counted: int) -> str | None:
    """A running Job whose counted failures are past its ``backoffLimit``: no attempt
    comes next, whatever its pods' policy says. The Job controller fails it at its next
    sync (upstream: ``syncJob``, pkg/controller/job/job_controller.go: ``exceedsBackoffLimit`` is
    ``failed > backoffLimit`` for restartPolicy Never); until then status has no next
    attempt to tell. Per-index budgets and OnFailure's restarts are counted elsewhere."""
    limit = spec.get("backoffLimit")
    template = mapping(mapping(spec.get("template")).get("spec"))
    if not isinstance(limit, int) or spec.get("backoffLimitPerIndex") is not None:
        return None
    if template.get("restartPolicy") == "OnFailure" or not exceeds_backoff_limit(counted, limit):
        return None
    return (
        f"backoffLimit {limit} is used up ({counted} counted failures): the Job "
        "controller fails the Job at its next sync, and makes no pod again"
    )


def _job_budgets(
    job: Mapping[str, Any],
    attempts: Sequence[Attempt],
    counted: int,
    pods: Sequence[Mapping[str, Any]] | None,
) -> list[Budget]:
    spec = mapping(job.get("spec"))
    status = mapping(job.get("status"))
    name = f"Job {mapping(job.get('metadata')).get('name')}"
    limit = spec.get("backoffLimit")
    limit = limit if isinstance(limit, int) else None
    per_index = spec.get("backoffLimitPerIndex")
    on_failure = (
        mapping(mapping(spec.get("template")).get("spec")).get("restartPolicy") == "OnFailure"
    )
    if on_failure and limit is not None:
        restarts = _restarts(pods or ())
        text = (
            f"backoffLimit {limit}: {restarts} container restart(s) in running pods "
            "(restartPolicy OnFailure: the Job fails when they reach it)"
        )
        return [Budget(name, "spec.backoffLimit", limit, restarts, text)]
    if isinstance(per_index, int):
        budgets = []
        for index, used in sorted(index_failures(attempts).items()):
            text = f"backoffLimitPerIndex {per_index}, index {index}: " + retries_left(
                used, per_index
            )
            budgets.append(Budget(name, f"index {index}", per_index, used, text))
        failed = status.get("failedIndexes")
        most = spec.get("maxFailedIndexes")
        if isinstance(most, int):
            count = _index_count(failed if isinstance(failed, str) else "")
            budgets.append(
                Budget(
                    name,
                    "spec.maxFailedIndexes",
                    most,
                    count,
                    f"maxFailedIndexes {most}: {count} index(es) failed"
                    + (f" ({failed})" if failed else ""),
                )
            )
        return budgets
    if limit is None:
        return []
    return [
        Budget(
            name,
            "spec.backoffLimit",
            limit,
            counted,
            f"backoffLimit {limit}: " + retries_left(counted, limit),
        )
    ]


def _restarts(pods: Sequence[Mapping[str, Any]]) -> int:
    """Container restarts of running and pending pods, as ``pastBackoffLimitOnFailure``
    (pkg/controller/job/job_controller.go) sums them."""
    total = 0
    for pod in pods:
        status = mapping(pod.get("status"))
        if status.get("phase") not in ("Running", "Pending"):
            continue
        for group in ("initContainerStatuses", "containerStatuses"):
            for cs in items(status.get(group)):
                total += as_int(mapping(cs).get("restartCount"))
    return total


def _index_count(intervals: str) -> int:
    """How many indexes ``1,3-5`` names (``status.failedIndexes``)."""
    total = 0
    for part in filter(None, intervals.split(",")):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            total += int(last or first) - int(first) + 1
    return total


def _job_decision(
    job: Mapping[str, Any], rules: Sequence[Any], record: AppliedRecord
) -> Decision | None:
    name = f"Job {mapping(job.get('metadata')).get('name')}"
    decision = final_condition(job, name, ("Complete",))
    if decision is None:
        for condition in items(mapping(job.get("status")).get("conditions")):
            condition = mapping(condition)
            if condition.get("status") == "True" and condition.get("type") in ENDING:
                decision = Decision(
                    name,
                    str(condition["type"]),
                    str(condition.get("reason") or ""),
                    str(condition.get("message") or ""),
                    condition.get("lastTransitionTime"),
                )
                break
    if decision is None or decision.reason != "PodFailurePolicy":
        return decision
    if decision.message.startswith(PEER_MESSAGE_PREFIX):
        # Failed by the controller for its disrupted pod (webhook.kinds.jobset.peers):
        # the JobSet's rule retryPolicyPeerDisruptions restarts the set.
        decision.origin = "failed by retry-policy's controller for peer-disruptions"
        decision.annotation = PREFIX + "peer-disruptions"
        return decision
    found = parse_failjob_message(decision.message)
    if found is None:
        return decision
    decision.rule = found.index
    decision.action = found.action
    decision.pod = found.pod
    decision.container = found.container
    decision.exit_code = found.exit_code
    decision.pod_condition = found.condition
    rule = rules[decision.rule] if decision.rule < len(rules) else None
    own = record if record.settings else applied_record(job)
    key = origin_of(rule, own)
    decision.origin = (
        f"added by retry-policy for {key}" if key else ("your rule" if rule else "unknown rule")
    )
    decision.annotation = PREFIX + key if key else None
    return decision
