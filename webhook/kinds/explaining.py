"""What the explainers share: a batch/v1 JobSpec's plan (made by ``kinds.planner``) in
words, for a Job's own and every kind built on one (a CronJob's template, a JobSet's
replicated Jobs), and the start of a custom resource's explanation. Each kind's explainer
is ``kinds/<kind>/explain.py``; the Job controller's counting is ``kinds.job.simulate``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.kinds import inplacewords, planner
from webhook.kinds.job.simulate import JobSimulator
from webhook.kinds.workload import resolve_limit
from webhook.kube import failurepolicy
from webhook.plan.explained import (
    BETWEEN_KEYS,
    BUDGET_KEYS,
    FAILURE_AWARE_KEYS,
    IN_PLACE_KEYS,
    VERDICT_KEYS,
    WORKLOAD_KEYS,
    Explanation,
    RuleLine,
    Subject,
    memory_table,
)
from webhook.plan.model import LimitField, PartPlan, first_non_spot, job_limit_field
from webhook.plan.outcome import Outcome
from webhook.plan.policies import workload_policy
from webhook.plan.words import attempt_table, count_of, rule_lines, setting_lines, source_text
from webhook.policy import categories as cats
from webhook.policy.grammar import format_duration
from webhook.policy.model import Policy

# --- batch/v1 JobSpec ------------------------------------------------------------------


def _unmanaged_policy(
    subject: Subject, path: Sequence[str], spec: Mapping[str, Any], defaulted: bool = True
) -> Policy:
    """The policy of a JobSpec the mutator did not touch (no annotations, no defaults):
    resolved the same way, so provenance still says where backoffLimit came from."""
    return unmanaged_policy(subject, job_limit_field(tuple(path), spec, defaulted))


def unmanaged_policy(subject: Subject, field: LimitField) -> Policy:
    """The policy of an object the mutator did not touch, resolved against ``field`` (the
    kind's budget) the way the mutator would have."""
    policy, _ = workload_policy(subject.final.get("metadata"), subject.ctx)
    return resolve_limit(subject.final, field, policy, Outcome())


def part_rule_lines(plan: PartPlan) -> list[RuleLine]:
    return rule_lines(plan.rules, plan.user_rules, plan.policy, plan.limit_name, plan.origins)


def no_match(plan: PartPlan) -> str:
    if plan.on_failure:
        return (
            "with restartPolicy OnFailure, a failed container restarts inside the same pod "
            "and every restart counts (a podFailurePolicy needs restartPolicy Never)"
        )
    if plan.rules:
        return f"anything else (no rule matches): retried, counts against {plan.limit_name}"
    return f"there are no podFailurePolicy rules: every failure counts against {plan.limit_name}"


def job_simulator(plan: PartPlan) -> JobSimulator:
    """The Job controller's counting of one JobSpec part's pods."""
    return JobSimulator(
        rules=plan.rules,
        backoff_limit=plan.limit,
        per_index=plan.per_index,
        max_failed_indexes=plan.max_failed,
        placement_limit=plan.placement_limit,
        non_spot_attempts=plan.pods.non_spot_attempts,
        containers=plan.containers,
        on_failure=plan.on_failure,
        init=plan.init,
        sidecars=plan.sidecars,
        memory=plan.memory,
        restarts=plan.restarts,
        bound=plan.bound,
        template_memory=plan.template_memory,
        avoided_nodes=plan.avoided_nodes,
        delays=plan.delays,
        max_disruptions=plan.causes.max_disruptions,
        max_in_place_restarts=plan.causes.max_in_place_restarts,
        max_free_failures=plan.causes.max_free_failures,
    )


def part_plan(
    subject: Subject,
    path: Sequence[str],
    defaulted: bool = True,
    parent: planner.Parent | None = None,
) -> PartPlan | None:
    """The plan of the JobSpec at ``path`` of the reviewed object (``None`` when there is
    none): the planner's, from what admission recorded for it (``Outcome.plans``), or,
    for a part admission did not write, with the policy it would have resolved
    (``defaulted`` says whether the API server defaults this spec, a Job's own, or not,
    a template in a CronJob or JobSet); ``parent``: what the object's kind says of
    this part (``planner.Parent``)."""
    planned = subject.planned(".".join(path))
    if planned is not None:
        return planner.part_plan(
            planned.policy, planned.path, subject.original, subject.final, subject.ctx, parent
        )
    spec = planner.at_path(subject.final, path)
    if not isinstance(spec, dict):
        return None
    policy = _unmanaged_policy(subject, path, spec, defaulted)
    return planner.part_plan(policy, path, subject.original, subject.final, subject.ctx, parent)


def explain_job_spec(
    subject: Subject, path: Sequence[str] = ("spec",), part: str = "", defaulted: bool = True
) -> Explanation:
    """Explain the batch/v1 JobSpec at ``path`` of the reviewed object."""
    item = subject.header(part)
    plan = part_plan(subject, path, defaulted)
    if plan is None:
        item.notes.append(f"{'.'.join(path)} is missing: nothing to explain")
        return item
    policy = plan.policy
    item.settings = setting_lines(policy, workload_keys(policy))
    origin = "from " + source_text("backoff-limit", policy.setting("backoff-limit"), long=True)
    item.budget = job_budget(plan.limit, origin, plan.per_index, plan.max_failed, plan.on_failure)
    item.rules = part_rule_lines(plan)
    item.no_match = no_match(plan)
    simulator = job_simulator(plan)
    item.simulator = simulator
    item.examples = simulator.examples()
    restarts_in_place(item, plan, simulator)
    if plan.on_failure:
        item.notes.append(
            "non-spot placement applies to new pods only; a container restarting in "
            "place stays on its node"
        )
    else:
        final = (
            "the index fails"
            if plan.per_index is not None
            else "the Job fails (BackoffLimitExceeded)"
        )
        item.attempts = attempt_table(
            f"{plan.path}.{plan.limit_name}",
            plan.budget,
            plan.placement_limit,
            plan.pods.non_spot_attempts,
            final,
            delays=plan.delays,
        )
    item.notes.extend(_job_notes(plan))
    item.notes.extend(budget_notes(plan))
    failure_aware(item, plan, subject)
    between_notes(item, plan)
    return item


def between_notes(item: Explanation, plan: PartPlan, runs_of: str = "") -> None:
    """What ``attempt-env`` tells each pod, and what ``retry-delay`` holds it back for;
    ``runs_of``: the kind whose runs place a part not placed by its Job's failures (a
    JobSet's replicated Jobs, ``kinds.jobset.explain``)."""
    unit = f"run of the {runs_of}" if not plan.placed_by_job else "attempt"
    if plan.pods.attempt_env:
        per = (
            "its index's failures"
            if plan.per_index is not None
            else f"the {runs_of}'s restarts"
            if not plan.placed_by_job
            else "the Job's counted failures, or in an Indexed Job its index's"
        )
        item.notes.append(
            f"attempt-env: every container learns its {unit} from RETRY_POLICY_ATTEMPT "
            f"({per} before it), its budget from RETRY_POLICY_MAX_ATTEMPTS where it is "
            "known, and the previous failure from "
            "RETRY_POLICY_LAST_FAILURE (oom-killed:<container>, "
            "exit-code:<code>:<container>, disruption, or empty)"
        )
    if plan.delays is not None:
        item.notes.append(
            f"retry-delay: each retry is held back (a scheduling gate) for the time in the "
            f"plan's waits column after the failure before it, at most "
            f"{format_duration(plan.delays.cap)}; a controller removes the gate, and while "
            "none leads retries are not held back"
        )


def budget_notes(plan: PartPlan, unit: str = "") -> list[str]:
    """What the budgets per cause do, and what only a controller can (they act through
    it: ``webhook.controller.disruptions``, ``webhook.controller.restarts``)."""
    notes = []
    scope = unit or ("each index" if plan.per_index is not None else "this Job")
    n = plan.causes.max_disruptions
    if n is not None:
        free = {
            0: f"no disruption of {scope} is free",
            1: f"the first disruption of {scope} is free",
        }
        notes.append(
            f"max-disruptions {n}: "
            + free.get(n, f"the first {n} disruptions of {scope} are free")
            + f"; from disruption {n + 1} on, the controller marks each disrupted pod "
            f"{failurepolicy.DISRUPTION_BUDGET_EXHAUSTED} and it counts against {plan.limit_name}"
        )
    peers = plan.causes.peer_disruptions
    if peers is not None:
        does = "are ignored" if peers == "ignore" else f"count against {plan.limit_name}"
        notes.append(
            f"peer-disruptions {peers}: when a pod is disrupted, the controller "
            f"marks its running peers {failurepolicy.PEER_DISRUPTED}; their failures {does}, "
            "whatever their exit codes (simulate one with the event peer)"
        )
    return notes + category_notes(plan, scope)


def category_notes(plan: PartPlan, scope: str) -> list[str]:
    """What each failure category does to the workload: the categories its rules name
    (free, or failing it), and the start deadline (``webhook.plan.verdicts``)."""
    notes = []
    named: dict[str, list[str]] = {}
    for rule in plan.rules:
        if not failurepolicy.on_our_conditions(rule):
            continue
        if names := cats.named_by(rule):
            named.setdefault(str(rule.get("action")), []).extend(names)
    fails = named.get("FailJob", []) + named.get("FailIndex", [])
    if fails:
        what = "its index" if "FailIndex" in named else f"the {scope.removeprefix('this ')}"
        notes.append(
            f"failure categories {', '.join(fails)}: the controller writes the pod's "
            f"category (retry-policy.dev/<Category>) and a failure of these fails {what} at "
            "once (fail-categories; simulate one with its name, e.g. ImagePull)"
        )
    free = named.get("Ignore", [])
    if free:
        n = plan.causes.max_free_failures
        cap = (
            f"max-free-failures {n}: {count_of(n, 'free failure')} of {scope} free, each one "
            f"after them marked {failurepolicy.FREE_BUDGET_EXHAUSTED} by the controller, and "
            f"counted against {plan.limit_name}"
            if n is not None
            else f"uncapped: they never count against {plan.limit_name}"
        )
        notes.append(f"failure categories {', '.join(free)}: free (free-categories); {cap}")
    if fails or free:
        rest = [c for c in cats.BUILTIN if c not in fails and c not in free]
        notes.append(
            f"every other category ({', '.join(rest)}, and the cluster's own) is decided "
            "by the rules below it, as its exit code says"
        )
    seconds = plan.causes.start_deadline
    if seconds is not None:
        notes.append(
            f"start-deadline {format_duration(seconds)}: a pod whose containers have not all "
            "started by then is ended by the controller and classified ImagePull, "
            "ConfigError, Unschedulable or StartTimeout; its failure counts unless free"
        )
    return notes


def workload_keys(policy: Policy) -> tuple[str, ...]:
    """The settings to list: failure-aware, in-place and between-attempts ones only when
    one is set."""
    keys = WORKLOAD_KEYS
    if any(policy.explicit(name) for name in FAILURE_AWARE_KEYS):
        keys += FAILURE_AWARE_KEYS
    keys += in_place_keys(policy) + between_keys(policy)
    if any(policy.explicit(name) for name in BUDGET_KEYS):
        keys += BUDGET_KEYS
    if any(policy.explicit(name) for name in VERDICT_KEYS):
        keys += VERDICT_KEYS
    return keys


def between_keys(policy: Policy) -> tuple[str, ...]:
    if any(policy.explicit(name) for name in BETWEEN_KEYS):
        return BETWEEN_KEYS
    return ()


def in_place_keys(policy: Policy) -> tuple[str, ...]:
    if policy.in_place_exit_codes or any(policy.explicit(name) for name in IN_PLACE_KEYS):
        return IN_PLACE_KEYS
    return ()


def restarts_in_place(
    item: Explanation, plan: PartPlan, simulator: JobSimulator, runs_of: str = ""
) -> None:
    """Each container's exit codes, when some restart in place, and what that means for
    placement: non-spot-attempts counts pods, and a restart in place makes none (``runs_of``
    as ``between_notes`` takes it)."""
    item.notes.extend(plan.dropped)
    if plan.restarts is None:
        return
    item.in_place = inplacewords.table(plan.restarts, simulator.judge_exit, plan.bound)
    if plan.pods.non_spot_attempts:
        counted = (
            ("attempts", "counts pods", "Job")
            if plan.placed_by_job
            else ("runs", "counts runs of the set", runs_of)
        )
        unit, counts, owner = counted
        item.notes.append(
            f"restarts in place are not {unit}: non-spot-attempts {counts}, and a container "
            "restarting in place stays in its pod, on its node, so it does not move the "
            f"{owner} toward its last non-spot {unit}"
        )


def failure_aware(item: Explanation, plan: PartPlan, subject: Subject) -> None:
    """The memory each attempt gets after OOM kills, and where failed nodes go."""
    if plan.memory is not None:
        item.memory = memory_table(plan.memory)
        if not plan.memory.containers:
            item.notes.append(
                "oom-memory-factor: no container sets a memory request or limit, so none "
                "can be raised"
            )
    if plan.pods.avoid_failed_nodes:
        scope = "of its index" if plan.per_index is not None else "of this Job"
        most = subject.ctx.config.rails(subject.ctx.namespace).max_avoided_nodes
        item.notes.append(
            f"avoid-failed-nodes: each new attempt keeps off the nodes where the last "
            f"{count_of(most, 'failed attempt')} {scope} ran (guardRails.maxAvoidedNodes)"
        )


def job_budget(
    limit: int, origin: str, per_index: int | None, max_failed: int | None, on_failure: bool
) -> str:
    if on_failure:
        runs = "the first restart fails it" if limit == 0 else f"restart number {limit} fails it"
        return (
            f"backoffLimit is {limit} ({origin}). With restartPolicy OnFailure, Kubernetes "
            f"counts container restarts: {runs} (BackoffLimitExceeded)."
        )
    if per_index is not None:
        text = (
            f"backoffLimitPerIndex is {per_index}: each index may fail {per_index} "
            f"time{'s' if per_index != 1 else ''} and is retried; failure number "
            f"{per_index + 1} of an index fails that index, and the Job ends with reason "
            "FailedIndexes once the other indexes are done."
        )
        if max_failed is not None:
            text += (
                f" More than {max_failed} failed index{'es' if max_failed != 1 else ''} "
                "fail the Job at once (MaxFailedIndexesExceeded)."
            )
        return text + f" backoffLimit ({limit}, {origin}) still caps all counted failures."
    if limit == 0:
        return (
            f"backoffLimit is 0 ({origin}): the first counted failure fails the Job "
            "(BackoffLimitExceeded). Ignored failures do not count."
        )
    return (
        f"backoffLimit is {limit} ({origin}): the Job is retried after up to {limit} "
        f"counted failure{'s' if limit != 1 else ''}, so it gets up to {limit + 1} attempts; "
        f"counted failure number {limit + 1} fails it (BackoffLimitExceeded). "
        "Failures an Ignore rule matches do not count and do not use up an attempt, "
        "however many there are."
    )


def _job_notes(plan: PartPlan) -> list[str]:
    notes = []
    limit, per_index, pod_policy = plan.limit, plan.per_index, plan.pods
    parallelism, completions = plan.parallelism, plan.completions
    if per_index is None and (
        (isinstance(parallelism, int) and parallelism > 1)
        or (isinstance(completions, int) and completions > 1)
    ):
        notes.append(
            f"this Job runs {completions} completions, {parallelism} pods at a time; "
            "all its pods share one budget, and the attempt number is the Job's count "
            "of counted failures so far"
        )
    n, placement_limit = pod_policy.non_spot_attempts, pod_policy.backoff_limit
    if per_index is not None and n > 0 and placement_limit is not None:
        boundary = first_non_spot(placement_limit, n)
        if boundary > per_index:
            notes.append(
                f"non-spot-attempts counts against backoffLimit ({placement_limit}), not "
                f"backoffLimitPerIndex ({per_index}): an index fails before its attempt "
                f"reaches {boundary}, so no attempt runs on non-spot nodes"
            )
    if placement_limit is not None and n > 0 and per_index is None and placement_limit != limit:
        notes.append(
            f"the pod template's backoff-limit annotation is {placement_limit}, but pods "
            f"place themselves by the Job's backoffLimit ({limit}), read when each is created"
        )
    if n > 0 and per_index is None and plan.placed_by_job and not plan.on_failure:
        notes.append(
            "spec.backoffLimit may be changed while the Job runs: pods created after the "
            "change place the last attempts by the new value"
        )
    return notes


# --- what the explainers of custom resources share ---------------------------------------


def kind_start(
    subject: Subject, budget: LimitField, keys: Sequence[str], default: str
) -> tuple[Explanation, Policy]:
    """The explanation of the object itself, with its settings: the policy the mutator
    recorded, or (when it did not run) the one it would have resolved against ``budget``,
    the kind's budget field. ``default`` names whose default an unset budget is."""
    item = subject.header()
    policy = subject.policy("spec") or unmanaged_policy(subject, budget)
    item.settings = setting_lines(policy, keys, default=default)
    return item, policy


def budget_origin(policy: Policy, default: str) -> str:
    """Where the budget came from, as the parenthesis after its value says it."""
    setting = policy.setting("backoff-limit")
    return "from " + source_text("backoff-limit", setting, long=True, default=default)


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
