"""The JobSpec logic every batch kind reuses: a policy checked against one JobSpec and
written into it (rules, labels, pod annotations, placement, memory, in-place restarts).

``apply_job_spec`` works on any JobSpec (a Job's, a CronJob's jobTemplate, a JobSet's
replicated Job template) so the same annotation means the same thing on all of them;
its ``path`` names the spec's real location, so messages and the written-or-defaulted
lookups point at the field the user actually wrote (``spec.jobTemplate.spec.backoffLimit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.kinds import inplace as in_place_rules
from webhook.kinds.ruleplan import our_rules, write_rules
from webhook.kinds.workload import (
    add_error_propagation,
    enforce_rail,
    resolve_limit,
    write_limit,
)
from webhook.kube import failurepolicy as fp
from webhook.kube import intent, jobcontroller, podspec
from webhook.kube.objects import mapping
from webhook.kube.owned import ALL, Owned
from webhook.plan import causes, delays, failureaware, inplace, queued, verdicts
from webhook.plan.model import BudgetPlan, job_limit_field
from webhook.plan.outcome import Context, Outcome, PlannedPart
from webhook.policy.grammar import format_duration
from webhook.policy.model import (
    PREFIX,
    Policy,
    Scope,
    Setting,
    Source,
    format_value,
    parse_annotations,
    retry_delays,
    with_setting,
)
from webhook.problems import Problem

#: Pod-level keys copied onto the pod template so pod admission needs no lookup.
POD_KEYS = (
    "backoff-limit",
    "non-spot-attempts",
    "error-propagation",
    "oom-memory-factor",
    "oom-memory-limit",
    "avoid-failed-nodes",
    "attempt-env",
    "retry-delay",
    "retry-delay-factor",
    "retry-delay-max",
)


#: The settings that add podFailurePolicy rules of their own (so need what one needs).
RULE_KEYS = (
    "fail-non-retriable",
    "ignore-disruptions",
    "peer-disruptions",
    "max-in-place-restarts",
    *verdicts.RULE_KEYS,
)


#: The fields of a Job's spec whose intent (written, or defaulted?) ``apply_job_spec`` asks
#: ``webhook.kube.intent`` about: the retry budget's field and podReplacementPolicy. A Job's
#: view (``webhook.kinds.view``) keeps only these of its records of intent.
INTENT_FIELDS = ("backoffLimit", "backoffLimitPerIndex", "podReplacementPolicy")


#: All ``apply_job_spec`` and ``finish`` write in a Job (``webhook.kube.owned``): the copy it
#: edits shares the rest (the containers' other fields, volumes, managedFields...).
JOB_SPEC_OWNED: dict[str, Owned] = {
    "podFailurePolicy": ALL,
    "template": {"metadata": podspec.METADATA_OWNED, "spec": podspec.POD_SPEC_OWNED},
}


JOB_OWNED: Owned = {"metadata": podspec.METADATA_OWNED, "spec": JOB_SPEC_OWNED}

#: ``JOB_OWNED`` but the pod template's spec, which in a Job only restarts in place write
#: (``kinds.inplace``; error-propagation is refused for a Job before anything is written):
#: what a Job whose policy cannot ask for them owns (``JobMutator.owned``).
JOB_OWNED_WITHOUT_RESTARTS: Owned = {
    "metadata": podspec.METADATA_OWNED,
    "spec": {"podFailurePolicy": ALL, "template": {"metadata": podspec.METADATA_OWNED}},
}


def placement_text(budget: BudgetPlan, n: int) -> str:
    """The warning for ``non-spot-attempts: n`` on pods that count ``budget``."""
    if not budget.runs:
        each = " of each index" if budget.unit == "index" else ""
        return (
            f"retry-policy: the last {n} of {budget.total} attempts{each} "
            "will run on non-spot nodes"
        )
    text = (
        f"retry-policy: the last {budget.pod_steps(n)} of {budget.steps} JobSet runs "
        "will run on non-spot nodes"
    )
    if budget.per_step > 1:
        text += f" (at least the last {n} of {budget.total} attempts)"
    return text


def apply_job_spec(
    obj: Mapping[str, Any],
    path: tuple[str | int, ...],
    spec: dict[str, Any],
    policy: Policy,
    ctx: Context,
    out: Outcome,
    *,
    restarts: int | None = None,
    defaulted: bool = True,
    outer_bound: str | None = None,
    in_place_bound: inplace.Bound | None = None,
) -> Policy:
    """Check and apply ``policy`` to one JobSpec; return the policy with backoff resolved.

    ``obj`` is the admitted object and ``path`` the location of ``spec`` in it (keys and
    list indexes). ``restarts`` is set when a parent recreates the Jobs made from this
    spec as a whole (a JobSet's ``maxRestarts``): pods then count runs (see ``BudgetPlan``).
    ``defaulted`` says whether the API server defaulted this JobSpec, as it does a Job's
    own spec but not a CronJob's or JobSet's template: there every value was written.
    ``outer_bound`` names a
    deadline outside this JobSpec that ends in-place restarts too ("" when there is none
    to name, but they are bounded); ``in_place_bound``, when given, is what ends them
    instead of this JobSpec's deadlines (a JobSet's rules may make those end nothing).
    Problems and changes go to ``out``; the spec is only changed when there is no problem.
    """
    where = intent.dotted(path)
    limit = job_limit_field(path, spec, defaulted)
    policy = resolve_limit(obj, limit, policy, out)
    policy = enforce_rail(policy, limit, ctx, out)
    template = spec.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        out.problems.append(Problem(f"{where}.template.spec", "a Job needs a pod template"))
        return policy
    budget = BudgetPlan.of(policy, limit, restarts)
    part = Settling(obj, path, spec, template["spec"], policy, ctx, out, budget, defaulted)
    _check_template(part)
    bound = in_place_bound or inplace.Bound(
        outer_bound is not None or inplace.job_spec_bounded(spec),
        f"{where}.activeDeadlineSeconds (or the pod template's)",
    )
    bound = inplace.with_budget(bound, part.policy)
    part.policy, deadline = inplace.check(
        part.policy, part.pod_spec, ctx, out, f"{where}.template", bound, part.user_rules
    )
    part.policy = causes.check(part.policy, out)  # (in-place restarts turned off here)
    policy = part.policy
    if out.problems:
        return policy
    write_limit(obj, limit, policy, out)
    if deadline is not None:
        in_place_rules.write_deadline(
            spec, "activeDeadlineSeconds", deadline, f"{where}.activeDeadlineSeconds", out
        )
    _apply(spec, template, part.pod_spec, policy, out, where, budget, ctx)
    out.wrote_part(part.plan(), where)
    return policy


@dataclass
class Settling:
    """One JobSpec being settled against its policy: what the checks read (the object and
    the JobSpec's path in it, the JobSpec, its pod template's spec, the context, the
    budget) and what they decide (the policy they go on with, and the outcome). The
    checks take it whole instead of loose arguments; ``skip`` records a conflict and turns
    the setting off in one call; ``plan`` is what admission records of the part."""

    obj: Mapping[str, Any]
    path: tuple[str | int, ...]
    spec: dict[str, Any]
    pod_spec: dict[str, Any]
    policy: Policy
    ctx: Context
    out: Outcome
    budget: BudgetPlan
    #: Whether the API server defaulted this JobSpec (``apply_job_spec``).
    defaulted: bool = True
    #: The JobSpec's dotted path, for messages, and the rules the user wrote in it.
    where: str = field(init=False)
    user_rules: list[Any] = field(init=False)

    def __post_init__(self) -> None:
        self.where = intent.dotted(self.path)
        self.user_rules = _rules(self.spec)

    def skip(self, name: str, message: str, reason: str) -> Policy:
        """A setting that cannot be honoured here (``Outcome.refuse``): denied and kept on
        when annotated, so its other checks still run; a default turned off and said."""
        self.policy = self.out.refuse(self.policy, name, message, reason)
        return self.policy

    def deny(self, subject: str, message: str, reason: str) -> None:
        """A problem no default can be skipped for: the request is denied."""
        self.out.problems.append(Problem(subject, message, reason))

    def plan(self) -> PlannedPart:
        """What admission records of this part: where it is, and the policy it was written
        with (``Outcome.plans``)."""
        return PlannedPart(self.path, self.policy)


def _check_template(part: Settling) -> None:
    """Contradictions between the policy and the user's own spec, found before any change."""
    _check_on_failure(part)
    _check_on_non_retriable(part)
    _check_replacement(part)
    _check_failure_aware(part)
    if part.policy.fail_non_retriable and part.user_rules:
        _check_retriable_codes(part)
    if part.policy.ignore_disruptions and part.user_rules:
        _check_disruptions(part)
    part.policy = verdicts.check(part.policy, part.ctx, part.out)
    part.policy = causes.check(part.policy, part.out)
    part.policy = resolve_count(part.policy, part.user_rules)
    _check_rule_count(part)
    part.policy = causes.check(part.policy, part.out)  # (a default skipped for the rule limit)
    _check_non_spot(part)
    _check_between(part)
    _check_pod_annotations(part)


def _check_replacement(part: Settling) -> None:
    """``podReplacementPolicy: TerminatingOrFailed``, written by the user, is not allowed
    with a podFailurePolicy (``validateJobSpec``); one the API server defaulted is ours to
    change (``ruleplan``)."""
    policy, spec = part.policy, part.spec
    if not any(policy.asks(name) for name in RULE_KEYS):
        return
    replacement = spec.get("podReplacementPolicy")
    default = "TerminatingOrFailed" if part.defaulted else None  # without a podFailurePolicy
    if replacement != "TerminatingOrFailed" or not intent.explicit(
        part.obj, (*part.path, "podReplacementPolicy"), replacement, default
    ):
        return
    for name in RULE_KEYS:
        if part.policy.asks(name):
            part.skip(
                name,
                f"your {part.where}.podReplacementPolicy: TerminatingOrFailed is not allowed "
                "with a podFailurePolicy; use Failed or remove the field",
                "contradiction",
            )


#: The settings a pod template's ``restartPolicy: OnFailure`` defeats, and why: a
#: podFailurePolicy is allowed only under Never (``ValidateJobSpec``,
#: pkg/apis/batch/validation), and the rest act on the new pod of a later attempt, which
#: OnFailure never makes (a JobSet's every run makes new pods: fine there).
NEEDS_NEVER = RULE_KEYS
NEEDS_NEW_POD = (
    "non-spot-attempts",
    "oom-memory-factor",
    "avoid-failed-nodes",
    "attempt-env",
    "retry-delay",
)


def _check_on_failure(part: Settling) -> None:
    """Every setting ``restartPolicy: OnFailure`` defeats, in one problem that says what to
    change (Never) and what that changes; a default among them is skipped on its own. The
    settings you annotated stay on (``Outcome.refuse``): their other checks still run."""
    restart = part.pod_spec.get("restartPolicy")
    if restart == "Never":
        return
    policy = part.policy
    field = f"{part.where}.template.spec.restartPolicy"
    rules = [n for n in NEEDS_NEVER if policy.asks(n)]
    new_pod = [] if part.budget.runs or restart != "OnFailure" else NEEDS_NEW_POD
    pods = [n for n in new_pod if policy.asks(n)]
    if not rules and not pods:
        return
    why = []
    if rules:
        why.append(
            f"{_names(rules)} need{'s' if len(rules) == 1 else ''} a podFailurePolicy, which "
            "Kubernetes allows only under Never"
        )
    if pods:
        why.append(
            f"{_names(pods)} act{'s' if len(pods) == 1 else ''} on the new pod of a later "
            "attempt, and under OnFailure a failed container restarts in the same pod"
        )
    accepted = (
        jobcontroller.never_instead(field)
        if restart == "OnFailure"
        else f"accepted: {field}: Never"
    )
    shown = restart if isinstance(restart, str) else "not set"
    message = f"{field} is {shown}: {'; '.join(why)}; {accepted}"
    asked = [n for n in (*rules, *pods) if policy.setting(n).source is Source.ANNOTATION]
    if asked:
        subject = " and ".join(f"annotation {PREFIX}{n}" for n in asked)
        part.deny(subject, message, "restart-policy")
    for name in (*rules, *pods):
        if name not in asked:
            part.skip(name, message, "restart-policy")


def _names(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def _check_between(part: Settling) -> None:
    """``attempt-env`` and ``retry-delay`` (``webhook.plan.delays``): a new pod for
    each attempt (not ``restartPolicy: OnFailure``, except in a JobSet, whose every run
    makes new pods), ``retry-delay-max`` not below ``retry-delay``, the guard rail, no
    ``nodeName`` on the template, Kueue's ``waitForPodsReady`` when the workload is queued
    in a LocalQueue (``webhook.plan.queued``), and a warning when the delays cannot fit in
    the deadline."""
    out = part.out
    if not delays.wanted(part.policy):
        for name in ("retry-delay-factor", "retry-delay-max"):
            if part.policy.setting(name).source is Source.ANNOTATION:
                out.note(f"retry-policy: {name} has no effect without retry-delay")
        return
    for problem in delays.check(part.policy, part.ctx, "annotation"):
        if problem.reason == "guard-rail":
            out.problems.append(problem)
        else:
            part.skip("retry-delay-max", problem.message, problem.reason)
    _check_pinned(part)
    queue = queued.queue_of(part.obj, part.path)
    part.policy = queued.check(part.policy, queue, part.ctx, out, part.budget.steps - 1)
    if part.policy.retry_delay is not None:
        _check_deadline(part)


def _check_pinned(part: Settling) -> None:
    """No ``retry-delay`` on a template that names its node: its gated pods could not be
    created (``delays.pinned``). Denied when annotated, a default skipped."""
    node = delays.pinned(part.pod_spec)
    delay = part.policy.retry_delay
    if node is None or delay is None:
        return
    part.skip(
        "retry-delay",
        delays.pinned_message(node, delay, f"{part.where}.template.spec"),
        "node-name",
    )


def _check_deadline(part: Settling) -> None:
    """A gated pod is active to its Job, whose ``activeDeadlineSeconds`` runs while it
    waits: warn when the delays cannot fit in it. A Job's (an index's) retries wait one
    after the other: their sum; a JobSet's run makes new Jobs, each with the deadline
    anew: the longest one run waits."""
    deadline = part.spec.get("activeDeadlineSeconds")
    if isinstance(deadline, bool) or not isinstance(deadline, int) or deadline <= 0:
        return
    ctx, budget, where = part.ctx, part.budget, part.where
    delays = retry_delays(part.policy, ctx.config.rails(ctx.namespace).max_retry_delay)
    retries = budget.steps - 1
    waits = delays.seconds(retries) if budget.runs else delays.total(retries)
    if waits > deadline:
        what = "a run's pods wait" if budget.runs else f"{retries} retries wait"
        part.out.note(
            f"retry-policy: {what} {format_duration(waits)} (retry-delay), longer than "
            f"{where}.activeDeadlineSeconds {deadline}: the deadline comes first"
        )


def _check_failure_aware(part: Settling) -> None:
    """``oom-memory-factor`` and ``avoid-failed-nodes`` (``webhook.plan.failureaware``): a
    memory limit that can be met, and OOM kills that are retried (pods made anew for later
    attempts: ``_check_on_failure``)."""
    if not part.policy.failure_aware:
        return
    ctx, out, where = part.ctx, part.out, part.where
    policy = failureaware.check_memory(part.pod_spec, part.policy, ctx, out, f"{where}.template")
    failureaware.check_limit_ranges(policy, ctx, out)
    part.policy = failureaware.check_oom_retried(part.user_rules, part.pod_spec, policy, out, where)


def _check_retriable_codes(part: Settling) -> None:
    """A rule of yours must not fail the Job (or index) on a pod whose application
    container exited with a retriable code. Each such pod is judged on its own, as the
    controller judges each failed pod (``matchPodFailurePolicy``: rules in order, the
    first match wins), so an earlier rule that counts one code cannot hide a later one
    that fails on another."""
    seen: set[int] = set()  # each rule said once, at the first pod it fails
    codes = part.policy.retriable_exit_codes
    for exit_, failure in fp.app_failures(part.pod_spec, codes):
        match = fp.evaluate(part.user_rules, failure)
        if match is not None and match.action in ("FailJob", "FailIndex"):
            if match.index in seen:
                continue
            seen.add(match.index)
            part.skip(
                "fail-non-retriable",
                f"your {part.where}.podFailurePolicy.rules[{match.index}] ({match.action}) "
                f"matches a pod whose container {exit_.name} exited {exit_.exit_code}, which "
                f"retriable-exit-codes ({format_value('retriable-exit-codes', codes)}) says "
                "to retry",
                "contradiction",
            )
            if not part.policy.fail_non_retriable:
                return  # a default, skipped


def _check_disruptions(part: Settling) -> None:
    """Your rules come before our Ignore rule, so none of them may match a disrupted pod
    first: such a pod has the DisruptionTarget condition and its containers stopped with
    143 or 137 (``fp.disrupted_pods``), which an exit-code rule of yours may match."""
    for failure in fp.disrupted_pods(part.pod_spec):
        match = fp.evaluate(part.user_rules, failure)
        if match is not None and match.action != "Ignore":
            what = (
                f"container {match.container.name} stopped with {match.container.exit_code}"
                if match.container is not None
                else f"condition {match.condition}"
            )
            part.skip(
                "ignore-disruptions",
                f"your {part.where}.podFailurePolicy.rules[{match.index}] ({match.action}) "
                f"matches a disrupted pod first ({what}): disruptions would not be ignored",
                "contradiction",
            )
            return


def resolve_count(policy: Policy, user_rules: list[Any]) -> Policy:
    """``policy`` with our Count rule on DisruptionTarget (``Policy.count_disruptions``)
    settled against one JobSpec's own rules: not when a rule of the user's already takes
    disrupted pods (``fp.takes_disruptions``; their intent wins, and ours, placed after
    theirs, would never match). Settled even beside ignore-disruptions, which a conflict
    may still turn off; left as it is when already settled."""
    if not policy.fail_non_retriable or policy.value("count-disruptions") is not None:
        return policy
    wanted = not fp.takes_disruptions(user_rules)
    return with_setting(policy, "count-disruptions", Setting(wanted, Source.BUILTIN))


def _check_rule_count(part: Settling) -> None:
    """Kubernetes allows at most 20 podFailurePolicy rules (``validatePodFailurePolicy``).
    When yours and ours together have more, settings from admin defaults are skipped
    first, the last-added first, until the rest fit (a default never breaks a valid
    object); if the rules of settings you annotated still do not fit, they are denied."""
    policy, pod_spec, user_rules = part.policy, part.pod_spec, part.user_rules
    most = int(policy.ignore_disruptions or policy.count_disruptions) + len(causes.rules(policy))
    if policy.fail_non_retriable:
        most += len(fp.app_containers(pod_spec)) or 1
    if len(user_rules) + most <= fp.MAX_RULES:
        return  # (the common case: no merge needed to know)
    while True:
        ours = our_rules(part.policy, pod_spec)
        merged, added = fp.merge(user_rules, [rule for rule, _ in ours])
        if len(merged) <= fp.MAX_RULES or not added:
            return
        added_ids = {id(rule) for rule in added}
        names = list(dict.fromkeys(name for rule, name in ours if id(rule) in added_ids))
        message = (
            f"{part.where}.podFailurePolicy would have {len(merged)} rules ({len(user_rules)} "
            f"yours, {len(added)} added); Kubernetes allows at most {fp.MAX_RULES}"
        )
        defaults = [n for n in names if part.policy.setting(n).source is not Source.ANNOTATION]
        if not defaults:
            subject = " and ".join(f"annotation {PREFIX}{n}" for n in names)
            part.deny(subject, message, "too-many-rules")
            return
        part.skip(defaults[-1], message, "too-many-rules")  # (a default: turned off)


def _check_on_non_retriable(part: Settling) -> None:
    """``on-non-retriable: fail-index`` needs a budget per index. Denied when annotated; the
    checks then go on with fail-job either way (the rules they count are the same)."""
    policy = part.policy
    if policy.on_non_retriable != "fail-index":
        return
    if not policy.fail_non_retriable and not policy.fail_categories:
        if policy.explicit("on-non-retriable"):
            part.out.note(
                "retry-policy: on-non-retriable has no effect without fail-non-retriable "
                "or fail-categories"
            )
        return
    if part.spec.get("backoffLimitPerIndex") is None:
        part.skip(
            "on-non-retriable",
            f"fail-index needs {part.where}.backoffLimitPerIndex (an Indexed Job with a budget "
            "per index); set it, or use fail-job",
            "needs-per-index",
        )
        part.policy = with_setting(
            part.policy, "on-non-retriable", Setting("fail-job", Source.BUILTIN)
        )


def _check_non_spot(part: Settling) -> None:
    """``non-spot-attempts``: no more than the attempts there are, the config's spot node
    labels to keep pods off, and a template that does not require spot nodes. Each is
    checked whatever the others find, but the last needs the labels to read the template
    with (``restartPolicy: OnFailure`` is ``_check_on_failure``'s)."""
    n, budget = part.policy.non_spot_attempts, part.budget
    if n <= 0:
        return
    attempts = budget.total
    if n > attempts:
        part.skip(
            "non-spot-attempts",
            f"{n} is more than the {attempts} attempts {budget.scope} ({budget.text}); "
            f"accepted: 0 to {attempts}",
            "too-many-non-spot",
        )
    spot = part.ctx.config.spot_node_labels
    if part.policy.non_spot_attempts <= 0:
        return  # a default, skipped
    if not spot:
        part.skip(
            "non-spot-attempts",
            "this cluster's config defines no spotNodeLabels, so spot nodes cannot be avoided "
            "(nor told in the pod template); ask the cluster's admin to set them, or remove "
            "non-spot-attempts",
            "no-spot-labels",
        )
        return
    pinned = podspec.requires_spot(part.pod_spec, spot)
    if pinned:
        part.skip(
            "non-spot-attempts",
            f"the pod template requires spot nodes ({pinned}), so non-spot attempts "
            "could never be scheduled; accepted: a template that does not require them",
            "contradiction",
        )


def _check_pod_annotations(part: Settling) -> None:
    """Annotations on the pod template must agree with what the webhook would copy there."""
    policy, where, out, budget = part.policy, part.where, part.out, part.budget
    template_meta = (part.spec.get("template") or {}).get("metadata")
    values, problems = parse_annotations(
        template_meta.get("annotations") if isinstance(template_meta, dict) else None,
        Scope.POD,
        where=f"{where}.template annotation",
    )
    out.problems.extend(problems)
    if not values:
        return
    if "attempt" in values:
        out.problems.append(
            Problem(
                f"{where}.template annotation {PREFIX}attempt",
                "every pod of the Job would share it; set attempt on individual Pods only",
                "wrong-scope",
            )
        )
    for name in ("in-place-exit-codes", "in-place-scope"):
        if name in values:
            out.problems.append(
                Problem(
                    f"{where}.template annotation {PREFIX}{name}",
                    "the Job's pods get their restart rules from its template, checked "
                    "against its whole policy; annotate the Job itself",
                    "wrong-scope",
                )
            )
    for name, value in _pod_annotations(policy, budget).items():
        own = values.get(name)
        if name in values and format_value(name, own) != value:
            out.problems.append(
                Problem(
                    f"{where}.template annotation {PREFIX}{name}",
                    f"{format_value(name, own)!r} contradicts the Job's resolved value {value!r}",
                    "contradiction",
                )
            )


def _copy_to_template(meta: dict[str, Any], name: str, value: str) -> bool:
    """One pod-level setting onto the template (``False``: there already). A value the
    user wrote there that means the same (``20000M`` for ``20G``: ``_check_pod_annotations``
    held it to ours) is theirs, and kept as they spelled it."""
    own = mapping(meta.get("annotations")).get(PREFIX + name)
    if isinstance(own, str) and own != value:
        values, problems = parse_annotations({PREFIX + name: own}, Scope.POD)
        if not problems and name in values and format_value(name, values[name]) == value:
            return False
    return podspec.set_annotation(meta, PREFIX + name, value)


def _rules(spec: Mapping[str, Any]) -> list[Any]:
    policy = spec.get("podFailurePolicy")
    if isinstance(policy, dict) and isinstance(policy.get("rules"), list):
        return list(policy["rules"])
    return []


def _pod_annotations(policy: Policy, budget: BudgetPlan) -> dict[str, str]:
    """What a pod of this Job needs to know about the policy, in annotation grammar."""
    values: dict[str, str] = {}
    if policy.non_spot_attempts > 0 or policy.attempt_env:
        values["backoff-limit"] = str(budget.steps - 1)
    if policy.non_spot_attempts > 0:
        values["non-spot-attempts"] = str(budget.pod_steps(policy.non_spot_attempts))
    if policy.error_propagation:
        values["error-propagation"] = format_value("error-propagation", policy.error_propagation)
    values.update(failureaware.pod_values(policy))
    if policy.attempt_env:
        values["attempt-env"] = "true"
    if policy.retry_delay is not None:
        for name in ("retry-delay", "retry-delay-factor", "retry-delay-max"):
            if name != "retry-delay-factor" or policy.retry_delay_factor != 1:
                if policy.value(name) is not None:
                    values[name] = format_value(name, policy.value(name))
    return values


def delay_text(policy: Policy, ctx: Context, what: str = "retries") -> str:
    """The warning for ``retry-delay``: how long retries wait, and that the Job
    controller's own back-off still comes first when it has one
    (``getRemainingTimeForFailuresCount`` in pkg/controller/job/backoff_utils.go: 10 s
    doubling per failure since the Job's last success, at most 10 minutes, counted from the
    same failure: the longer of the two wins). That back-off is no floor: it is kept in the
    controller-manager's memory only (lost on its restart) and per Job."""
    delays = retry_delays(policy, ctx.config.rails(ctx.namespace).max_retry_delay)
    text = f"retry-policy: {what} wait {format_duration(delays.first)}"
    if policy.retry_delay_factor != 1:
        factor = format_value("retry-delay-factor", policy.retry_delay_factor)
        text += f" x{factor} per failure, at most {format_duration(delays.cap)},"
    return text + " after a failure; the Job controller's back-off still applies"


def _apply(
    spec: dict[str, Any],
    template: dict[str, Any],
    pod_spec: dict[str, Any],
    policy: Policy,
    out: Outcome,
    where: str,
    budget: BudgetPlan,
    ctx: Context,
) -> None:
    most_avoided = ctx.config.rails(ctx.namespace).max_avoided_nodes
    write_rules(spec, pod_spec, policy, out, where)
    causes.apply_labels(template, policy)
    add_error_propagation(pod_spec, "containers", policy, out)
    in_place_rules.apply(pod_spec, policy, out, f"{where}.template")
    pod_values = _pod_annotations(policy, budget)
    if pod_values:
        meta = template.get("metadata")
        if not isinstance(meta, dict):
            meta = template["metadata"] = {}
        copied = {k: _copy_to_template(meta, k, v) for k, v in pod_values.items()}
        if any(copied.values()) and policy.non_spot_attempts:
            out.changed(
                placement_text(budget, policy.non_spot_attempts),
                policy.setting("non-spot-attempts"),
            )
        factor, limit = policy.oom_memory_factor, policy.oom_memory_limit
        if copied.get("oom-memory-factor") and factor is not None:
            out.changed(
                f"retry-policy: a container OOM-killed gets x"
                f"{format_value('oom-memory-factor', factor)} the memory it was killed at "
                "in later attempts"
                f"{' of its index' if budget.unit == 'index' else ''}, "
                f"at most {limit}",
                policy.setting("oom-memory-factor"),
            )
        if copied.get("attempt-env"):
            out.changed(
                "retry-policy: its pods' containers get env RETRY_POLICY_ATTEMPT, "
                "RETRY_POLICY_MAX_ATTEMPTS, RETRY_POLICY_LAST_FAILURE",
                policy.setting("attempt-env"),
            )
        if copied.get("retry-delay"):
            out.changed(
                delay_text(policy, ctx, "runs" if budget.runs else "retries"),
                policy.setting("retry-delay"),
            )
        if copied.get("avoid-failed-nodes"):
            out.changed(
                "retry-policy: each new attempt keeps off the nodes where earlier attempts "
                f"failed (the last {most_avoided} of them)",
                policy.setting("avoid-failed-nodes"),
            )
