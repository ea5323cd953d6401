"""The JobSet explainer (jobset.x-k8s.io/v1alpha2): the set's restart budget and failure
policy rules in words, then each replicated Job's plan (``kinds.planner``) and its
simulation (``kinds.jobset.simulate``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.kinds import planner
from webhook.kinds.explaining import (
    as_int,
    between_notes,
    budget_origin,
    failure_aware,
    job_budget,
    job_simulator,
    kind_start,
    no_match,
    part_plan,
    part_rule_lines,
    restarts_in_place,
    workload_keys,
)
from webhook.kinds.jobset import failurepolicy as jsp
from webhook.kinds.jobset.failurepolicy import FAILED_JOBS, MAX_REACHED, SINGLE_JOB_RESTARTS
from webhook.kinds.jobset.mutate import (
    JOBSET_DEFAULT_RESTART_POLICY,
    in_place_restart,
    initializers,
    owner_of,
)
from webhook.kinds.jobset.rules import ACTIONS as JOBSET_ACTIONS
from webhook.kinds.jobset.rules import MAX_RESTARTS, RULE_NAME, in_place_bound, pattern_applies
from webhook.kinds.jobset.simulate import JobSetSimulator
from webhook.kinds.workload import WRITTEN_SOURCES, get_path
from webhook.kube.goregexp import Piece, Wild
from webhook.kube.objects import items, mapping
from webhook.kube.owned import deep_copy
from webhook.plan.explained import WORKLOAD_KEYS, Explanation, RuleLine, Subject
from webhook.plan.model import PartPlan
from webhook.plan.record import rule_id
from webhook.plan.words import attempt_table, count_of, join_words, setting_lines, source_text
from webhook.policy.model import Policy, Source

# --- jobset.x-k8s.io/v1alpha2 JobSet -----------------------------------------------------

JOBSET_DEFAULT = "JobSet default"
#: What a child Job's failure reason means, for rules that name one reason.
REASON_WORDS = {
    "PodFailurePolicy": "a FailJob rule of its podFailurePolicy matched",
    "BackoffLimitExceeded": "its pods failed more often than its backoffLimit allows",
    "DeadlineExceeded": "it ran longer than its activeDeadlineSeconds",
    "FailedIndexes": "some of its indexes failed",
    "MaxFailedIndexesExceeded": "more indexes failed than its maxFailedIndexes",
}


#: JobSet's failure condition reasons (pkg/constants).
def explain_jobset(subject: Subject) -> list[Explanation]:
    """The set's restart budget and rules, then each replicated Job: its pods' rules, the
    plan of runs its pods are placed by, and a simulation of its pods failing."""
    subject, defaulted = _as_jobset_stores(subject)
    spec = subject.spec
    failure_policy = spec.get("failurePolicy")
    failure_policy = failure_policy if isinstance(failure_policy, dict) else None
    replicated = spec.get("replicatedJobs") if isinstance(spec.get("replicatedJobs"), list) else []
    overview, policy = kind_start(subject, MAX_RESTARTS, WORKLOAD_KEYS, JOBSET_DEFAULT)
    overview.settings = setting_lines(policy, workload_keys(policy), default=JOBSET_DEFAULT)
    plans = [
        (index, rjob, _part_plan(subject, index))
        for index, rjob in enumerate(replicated)
        if isinstance(rjob, dict)
    ]
    _jobset_overview(subject, overview, policy, failure_policy, plans)
    children = [
        _replicated_job(subject, index, rjob, plan, failure_policy, policy, index in defaulted)
        for index, rjob, plan in plans
        if plan is not None
    ]
    return [overview, *children]


def _child_path(index: int) -> tuple[str, ...]:
    return ("spec", f"replicatedJobs[{index}]", "template", "spec")


def _part_plan(subject: Subject, index: int) -> PartPlan | None:
    """Replicated Job ``index``'s plan, with what the JobSet says of its restarts in place
    (``planner.Parent``): what its rules make of the Job's deadlines (``in_place_bound``),
    that its failure policy decides after them, that ``max-in-place-restarts`` bounds them
    per run of the set, and a TrainJob's deadline over its JobSet's."""
    path = planner.steps(_child_path(index))
    spec = planner.at_path(subject.final, path)
    parent = planner.Parent(
        in_place_bound(subject.final, path, spec, None) if isinstance(spec, dict) else None,
        then="; then the JobSet's failure policy decides",
        per="per run of the JobSet",
        outer=_owner_bound(subject.final),
    )
    return part_plan(subject, _child_path(index), defaulted=False, parent=parent)


def _owner_bound(jobset: Mapping[str, Any]) -> str | None:
    """What ends the in-place restarts of a JobSet its owner made (a TrainJob's) besides
    its own deadlines, as the owner declares it."""
    found = owner_of(jobset)
    return found[0].bound_explained if found is not None else None


def _as_jobset_stores(subject: Subject) -> tuple[Subject, set[int]]:
    """JobSet's own webhook sets an unset restartPolicy in a replicated Job's pod template
    to OnFailure: explain the templates with it, as their Jobs will run. Also returns the
    indexes of the replicated Jobs whose restartPolicy this defaulted."""
    final = deep_copy(subject.final)
    defaulted = set()
    for index, rjob in enumerate(items(get_path(final, ("spec", "replicatedJobs")))):
        pod_spec = get_path(rjob, ("template", "spec", "template", "spec"))
        if isinstance(pod_spec, dict) and not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = JOBSET_DEFAULT_RESTART_POLICY
            defaulted.add(index)
    return dataclasses.replace(subject, final=final), defaulted


def _jobset_overview(
    subject: Subject,
    item: Explanation,
    policy: Policy,
    failure_policy: Mapping[str, Any] | None,
    plans: Sequence[tuple[int, Any, PartPlan | None]],
) -> None:
    """The set as a whole: its restart budget and its failurePolicy rules."""
    children = ", ".join(
        f"{_name(rjob, index)} {plan.budget}" + (" (restarts in place)" if plan.on_failure else "")
        for index, rjob, plan in plans
        if plan is not None
    )
    inside = (
        f" Inside one run, each Job retries its own pods up to its backoffLimit: {children}."
        if children
        else ""
    )
    item.simulate_note = (
        "--simulate walks failures of one replicated Job's pods: see each replicated Job below"
    )
    if failure_policy is None:
        item.budget = (
            "This JobSet has no spec.failurePolicy: the first of its Jobs to fail fails the "
            f"whole JobSet (reason {FAILED_JOBS}); nothing is restarted." + inside
        )
        return
    limit = as_int(failure_policy.get("maxRestarts")) or 0
    origin = budget_origin(policy, JOBSET_DEFAULT)
    item.budget = (
        f"maxRestarts is {limit} ({origin}): when one of its Jobs fails, JobSet restarts "
        "the whole set (every Job is recreated and counts its failures from 0 again) up to "
        f"{count_of(limit, 'time')}, so the set gets up to {count_of(limit + 1, 'run')}; a "
        f"Job that fails in the last run fails the JobSet (reason {MAX_REACHED}). Restarts "
        "by a rule with an ...AndIgnoreMaxRestarts action do not count." + inside
    )
    if in_place_restart(subject.final):
        item.budget += (
            " restartStrategy InPlaceRestart: a pod that fails does not fail its Job "
            "(backoffLimit 2147483647); JobSet restarts the whole set in place instead, and "
            "each such restart counts against maxRestarts, as does any container's restart "
            "count above it. Only a Job that fails (its podFailurePolicy) goes through the "
            "rules below, and the set is then recreated."
        )
    rules = failure_policy.get("rules") if isinstance(failure_policy.get("rules"), list) else []
    item.notes.extend(unread_patterns(rules))
    user_fp = get_path(subject.original, ("spec", "failurePolicy", "rules"))
    item.rules = jobset_rule_lines(
        rules, user_fp if isinstance(user_fp, list) else [], planner.recorded_origins(subject.final)
    )
    item.rules_intro = (
        "When one of its Jobs fails, JobSet checks these rules in order; the first match wins:"
    )
    item.no_match = (
        "anything else (no rule matches): the JobSet restarts (RestartJobSet), counts "
        "against maxRestarts"
    )
    uses_job_restarts = any(
        isinstance(r, dict) and r.get("action") in SINGLE_JOB_RESTARTS for r in rules
    )
    if uses_job_restarts and policy.non_spot_attempts:
        item.notes.append(
            "a RestartJob restart recreates only the failed Job and leaves the pods' "
            "jobset.sigs.k8s.io/restart-attempt label as it was, so non-spot placement "
            "does not advance for it"
        )


def _name(rjob: Mapping[str, Any], index: int) -> str:
    name = rjob.get("name")
    return name if isinstance(name, str) and name else f"replicatedJobs[{index}]"


def describe_job_failure(rule: Mapping[str, Any]) -> str:
    """The condition of one JobSet rule, as a phrase: "a Job of workers fails with ..."."""
    if jsp.peer_rule_of({"spec": {"failurePolicy": {"rules": [rule]}}}):
        return (
            "the controller fails a disrupted pod's Job (peer-disruptions: FailureTarget, "
            f"reason {jsp.PEER_REASON}, message "
            f"{jsp.PEER_MESSAGE_PREFIX.strip()} ...); the peers stop with the restart"
        )
    targets = [str(t) for t in items(rule.get("targetReplicatedJobs"))]
    reasons = [str(r) for r in items(rule.get("onJobFailureReasons"))]
    patterns = [str(p) for p in items(rule.get("onJobFailureMessagePatterns"))]
    text = f"a Job of {join_words(targets)} fails" if targets else "a Job fails"
    if len(reasons) == 1 and reasons[0] in REASON_WORDS:
        text += f" with reason {reasons[0]} ({REASON_WORDS[reasons[0]]})"
    elif reasons:
        text += f" with reason {join_words(reasons)}"
    if patterns:
        quoted = [f"/{p}/" for p in patterns]
        text += f", its failure message matching {join_words(quoted)}"
    return text


def describe_jobset_then(action: str) -> str:
    return {
        "FailJobSet": "the JobSet fails at once",
        "RestartJobSet": "the JobSet restarts, counts against maxRestarts",
        "RestartJobSetAndIgnoreMaxRestarts": "the JobSet restarts, does not count",
        "RestartJob": "only that Job is recreated, counts against maxRestarts",
        "RestartJobAndIgnoreMaxRestarts": "only that Job is recreated, does not count",
    }.get(action, f"JobSet does not know the action {action!r}")


def jobset_rule_lines(
    rules: Sequence[Any], user_rules: Sequence[Any], origins: Mapping[str, str] | None = None
) -> list[RuleLine]:
    """Every ``failurePolicy`` rule of the final spec, with who wrote it: the user, or this
    webhook for the annotation its applied record names (``origins``, by rule id)."""
    lines = []
    for number, rule in enumerate(rules, 1):
        if not isinstance(rule, dict):
            continue
        name = rule.get("name") or f"failurePolicyRule{number - 1}"
        recorded = origins.get(rule_id(rule)) if origins is not None else None
        if recorded:
            origin = f"added by retry-policy for {recorded} ({name})"
        elif rule in user_rules:
            origin = f"your rule {name}"
        elif origins is None and name == RULE_NAME:
            # A version-1 record names no rule: ours is known by its name.
            origin = f"added by retry-policy for fail-non-retriable ({name})"
        else:
            origin = f"rule {name}"
        action = str(rule.get("action"))
        lines.append(
            RuleLine(
                number=number,
                action=action,
                when=describe_job_failure(rule),
                then=describe_jobset_then(action),
                origin=origin,
                counts=action in ("RestartJobSet", "RestartJob")
                if action in JOBSET_ACTIONS
                else None,
            )
        )
    return lines


def unread_patterns(rules: Sequence[Any]) -> list[str]:
    """One note per message pattern explain cannot read as JobSet's Go regexp does."""
    notes = []
    for number, rule in enumerate(rules, 1):
        for pattern in (
            items(rule.get("onJobFailureMessagePatterns")) if isinstance(rule, dict) else []
        ):
            _, why = pattern_applies(pattern, [""])
            if why:
                notes.append(
                    f"rule {number}'s message pattern /{pattern}/ cannot be read as JobSet's Go "
                    f"regexp reads it ({why}): taken to match, as admission takes it"
                )
    return notes


def _replicated_job(
    subject: Subject,
    index: int,
    rjob: Mapping[str, Any],
    plan: PartPlan,
    failure_policy: Mapping[str, Any] | None,
    set_policy: Policy,
    defaulted_restart: bool,
) -> Explanation:
    name = _name(rjob, index)
    item = subject.header(f"replicatedJob {name}")
    item.changes = []  # listed once, with the JobSet
    in_place = in_place_restart(subject.final)
    item.budget = _child_budget(
        plan, set_policy, failure_policy is not None, in_place, _own_steps(subject.final, index)
    )
    item.rules = part_rule_lines(plan)
    item.no_match = no_match(plan)
    max_restarts = as_int(mapping(failure_policy).get("maxRestarts")) or 0
    rules = mapping(failure_policy).get("rules")
    metadata = mapping(subject.final.get("metadata"))
    namespace = metadata.get("namespace") or subject.ctx.namespace
    jobset_name = metadata.get("name")
    # Pods of this replicated Job: <namespace>/<jobset>-<replicatedJob>-<job>-<index>-<random>.
    pod: list[Piece] = [namespace if isinstance(namespace, str) and namespace else Wild(), "/"]
    if isinstance(jobset_name, str) and jobset_name:
        pod.append(f"{jobset_name}-{name}-")
    pod.append(Wild())
    simulator = JobSetSimulator(
        job_simulator(plan),
        rules=(rules if isinstance(rules, list) else []) if failure_policy is not None else None,
        max_restarts=max_restarts,
        replicated=name,
        pod=pod,
        in_place=in_place,
    )
    item.simulator = simulator
    item.examples = simulator.examples()
    restarts_in_place(item, plan, simulator.job, runs_of="JobSet")
    if failure_policy is None:
        item.attempts = attempt_table(
            "no failurePolicy: maxRestarts",
            0,
            plan.pods.backoff_limit,
            plan.pods.non_spot_attempts,
            f"the JobSet fails ({FAILED_JOBS})",
            unit="run",
            delays=plan.delays,
        )
    else:
        item.attempts = attempt_table(
            "spec.failurePolicy.maxRestarts",
            max_restarts,
            plan.pods.backoff_limit,
            plan.pods.non_spot_attempts,
            f"the JobSet fails ({MAX_REACHED})",
            unit="run",
            delays=plan.delays,
        )
    item.notes.extend(_child_notes(rjob, plan, defaulted_restart, in_place))
    failure_aware(item, plan, subject)
    between_notes(item, plan, runs_of="JobSet")
    return item


def _own_steps(jobset: Mapping[str, Any], index: int) -> str | None:
    """Why replicated Job ``index`` keeps its own retries, in its owner's words (a
    TrainJob's initializer: ``initializers``); ``None``: the policy is its own."""
    found = owner_of(jobset)
    return found[0].own_steps_origin if found and index in initializers(jobset) else None


def _child_budget(
    plan: PartPlan,
    set_policy: Policy,
    restarts: bool,
    in_place: bool = False,
    initializer: str | None = None,
) -> str:
    """The child Job's own budget, and what its failure does to the set (``initializer``:
    why it keeps its own, when its owner keeps it out of the policy)."""
    setting = plan.policy.setting("backoff-limit")
    asked = set_policy.setting("backoff-limit")
    if in_place and restarts and not initializer:
        return (
            f"backoffLimit is {plan.limit}, as JobSet's restartStrategy InPlaceRestart "
            "requires: when a pod fails, the Job recreates it and JobSet restarts every other "
            "pod of the set in place, on the same nodes; each such restart counts against "
            "maxRestarts. The Job itself fails only through its podFailurePolicy (or its "
            "deadline), and then the JobSet's failure policy (above) decides."
        )
    if initializer:
        # Left out of the policy (``jobset.initializers``): its budget is its own.
        written = (
            "written in its template" if setting.source is Source.SPEC else "Kubernetes' default"
        )
        origin = f"{written}: {initializer}"
    elif (
        plan.per_index is None
        and plan.limit == 0
        and setting.source in WRITTEN_SOURCES
        and asked.source in WRITTEN_SOURCES
    ):
        origin = (
            "set by retry-policy: backoff-limit counts runs of the JobSet, so every counted "
            "pod failure restarts the set"
        )
    else:
        origin = "from " + source_text("backoff-limit", setting, long=True)
    text = job_budget(plan.limit, origin, plan.per_index, plan.max_failed, plan.on_failure)
    if not restarts:
        return f"{text} A Job that fails fails the whole JobSet: it has no failurePolicy."
    return (
        f"{text} A Job that fails does not end the JobSet by itself: the JobSet's failure "
        "policy (above) decides."
    )


def _child_notes(
    rjob: Mapping[str, Any], plan: PartPlan, defaulted_restart: bool, in_place: bool = False
) -> list[str]:
    notes = []
    replicas = as_int(rjob.get("replicas"))
    if replicas is not None and replicas > 1:
        notes.append(
            f"{replicas} Jobs are made from this template; the simulation follows the pods of "
            "one of them, and a failure in any of them counts the same"
        )
    if defaulted_restart:
        notes.append(
            "restartPolicy is not set: JobSet's own webhook sets it to OnFailure, so failed "
            "containers restart in place and no podFailurePolicy can apply"
        )
    if plan.pods.non_spot_attempts:
        notes.append(
            "pods are placed by run, not by attempt: each run's pods carry the label "
            "jobset.sigs.k8s.io/restart-attempt (the JobSet's status.restarts), and "
            f"annotations backoff-limit {plan.pods.backoff_limit} and non-spot-attempts "
            f"{plan.pods.non_spot_attempts}; restarts that do not count against maxRestarts "
            "raise that label too, so placement can start early, never late"
        )
    if not plan.on_failure and plan.limit > 0 and plan.per_index is None and not in_place:
        notes.append(
            f"inside each run this Job's pods may fail {count_of(plan.limit, 'time')} "
            "(counted) before the Job fails"
        )
    return notes
