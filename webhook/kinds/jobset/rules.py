"""A JobSet's failure policy (``spec.failurePolicy``) as the policy reads and writes it:
its rules checked against ours as JobSet decides (``ruleIsApplicable`` in
pkg/controllers/failure_policy.go), the rule ``fail-non-retriable`` adds, and what ends a
replicated Job's restarts in place once a rule may restart the set uncounted."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.kinds.jobset import failurepolicy as jsp
from webhook.kinds.jobset.failurepolicy import (
    ACTIONS,
    IGNORING_ACTIONS,
    SINGLE_JOB_RESTARTS,
    pattern_applies,
)
from webhook.kinds.jobspec import resolve_count
from webhook.kinds.ruleplan import our_rules
from webhook.kinds.workload import (
    WRITTEN_SOURCES,
    get_path,
    keep_spec_limit,
)
from webhook.kube import failurepolicy as fp
from webhook.kube import intent, jobcontroller
from webhook.kube.goregexp import Piece, Unsupported, Wild, compile_go
from webhook.kube.jobcontroller import BUDGET_MESSAGES, DEADLINE_MESSAGE
from webhook.kube.objects import items, mapping
from webhook.plan import inplace
from webhook.plan.model import LimitField
from webhook.plan.outcome import Context, Outcome
from webhook.policy.model import PREFIX, Policy
from webhook.problems import Problem

MAX_RESTARTS = LimitField(("spec", "failurePolicy", "maxRestarts"), None, 0)


RULE_NAME = "retryPolicyFailNonRetriable"


POD_FAILURE_POLICY = "PodFailurePolicy"


#: The message a FailJob rule on exit codes fails a Job with, in words.
FAILJOB_SHAPE = jobcontroller.failjob_message(
    "<namespace>", "<pod>", "<i>", container="<name>", code="<code>"
)


REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    POD_FAILURE_POLICY,
)


RULE_NAME_PATTERN = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")


MAX_RULE_NAME = 128


def our_rule(targets: Sequence[str] = ()) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "name": RULE_NAME,
        "action": "FailJobSet",
        "onJobFailureReasons": [POD_FAILURE_POLICY],
    }
    if targets:
        rule["targetReplicatedJobs"] = list(targets)
    return rule


def in_place_bound(
    jobset: Mapping[str, Any], path: tuple[str | int, ...], job_spec: Mapping[str, Any], outer: Any
) -> inplace.Bound:
    """What ends the in-place restarts of the replicated Job whose JobSpec is at ``path``.

    Its deadline fails the Job (DeadlineExceeded) and its pod template's fails each pod,
    so that the Job fails once its pods run out of retries (BackoffLimitExceeded, or
    FailedIndexes and MaxFailedIndexesExceeded per index). Either ends them only when
    the JobSet then counts the restart: the first of your rules that applies
    (``findFirstFailedPolicyRuleAndJob``, ``ruleIsApplicable``) must not be one ending in
    AndIgnoreMaxRestarts, which restarts the set and never checks maxRestarts
    (``restartJobSetAndIgnoreMaxRestartsActionApplier``); a rule without reasons applies
    to every reason. (A pod killed at its deadline may also match a FailJob rule:
    ``check_rules`` keeps your JobSet rules from restarting those past ours.)"""
    where = intent.dotted(path)
    fields = f"{where}.activeDeadlineSeconds (or the pod template's)"
    if outer is not None:
        return inplace.Bound(True, fields)
    rules = items(get_path(jobset, ("spec", "failurePolicy", "rules")))
    name = str(mapping(get_path(jobset, path[:3])).get("name"))
    pod_spec = mapping(get_path(job_spec, ("template", "spec")))
    whole = uncounted(rules, name, "DeadlineExceeded", DEADLINE_MESSAGE)
    per_index = job_spec.get("backoffLimitPerIndex") is not None
    reasons = ["FailedIndexes"] if per_index else ["BackoffLimitExceeded"]
    if per_index and job_spec.get("maxFailedIndexes") is not None:
        reasons.append("MaxFailedIndexesExceeded")
    each = next(
        (found for r in reasons if (found := uncounted(rules, name, r, BUDGET_MESSAGES[r]))),
        None,
    )
    # A pod replaced by max-in-place-restarts counts; the set must count its Job's end too.
    counted = each is None
    if (inplace.deadline_set(job_spec.get("activeDeadlineSeconds")) and whole is None) or (
        inplace.deadline_set(pod_spec.get("activeDeadlineSeconds")) and each is None
    ):
        return inplace.Bound(True, fields, replaced_counted=counted)
    job_field = f"{where}.activeDeadlineSeconds"
    pod_field = f"{where}.template.spec.activeDeadlineSeconds"
    if whole is None:
        return inplace.Bound(False, fields if each is None else job_field, replaced_counted=counted)
    why = (
        f"{job_field} bounds nothing: your spec.failurePolicy.rules[{whole[0]}] ({whole[1]}) "
        "restarts the set without counting when a Job fails with DeadlineExceeded"
    )
    if each is None:
        return inplace.Bound(False, pod_field, f"{why}; drop the rule or set {pod_field}", counted)
    if each == whole:
        why += " or when its pods run out of retries"
    else:
        why += f", and rules[{each[0]}] ({each[1]}) when its pods run out of retries"
    why += ", so the pod template's deadline bounds nothing either"
    return inplace.Bound(
        False, f"{job_field} (after dropping those rules)", f"{why}; drop them", counted
    )


def uncounted(rules: Sequence[Any], name: str, reason: str, message: str) -> tuple[int, str] | None:
    """The first of ``rules`` that applies to replicated Job ``name`` failed with ``reason``
    and ``message``, when it restarts without counting: its index and action. A rule
    whose pattern cannot be read is taken to apply, but not to take the failure from the
    rules after it."""
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict) or rule.get("action") not in ACTIONS:
            continue
        applies, _, why = rule_applies(rule, reason, {name: [[message]]})
        if not applies:
            continue
        if rule["action"] in IGNORING_ACTIONS:
            return index, str(rule["action"])
        if not why:
            return None
    return None


def failjob_message(
    containers: Piece, namespace: Piece, pod: Sequence[Piece], codes: Piece, index: int
) -> list[Piece]:
    """The Job controller's condition message for a FailJob match on an exit code
    (``webhook.kube.jobcontroller``), as pieces."""
    fields = {"container": containers, "namespace": namespace, "pod": list(pod), "code": codes}
    return jobcontroller.failjob_pieces({**fields, "action": "FailJob", "index": str(index)})


def failjob_messages(
    jobset: Mapping[str, Any], replicated: list[Any], policy: Policy, ctx: Context
) -> dict[str, list[list[Piece]]]:
    """By replicated Job, every message our FailJob rules can fail one of its Jobs with:
    per rule, its container (one rule per application container) and the index it gets
    after the user's rules and ours before it (``job.our_rules``: a Count or Ignore rule
    on DisruptionTarget first), any exit code outside the rule's NotIn list (a regular
    container's holds the in-place codes too, an init container's not:
    ``fp.non_retriable_rules``), any pod name."""
    namespace = get_path(jobset, ("metadata", "namespace")) or ctx.namespace
    ns: Piece = namespace if isinstance(namespace, str) and namespace else Wild()
    messages: dict[str, list[list[Piece]]] = {}
    for rjob in replicated:
        if not isinstance(rjob, dict):
            continue
        spec = get_path(rjob, ("template", "spec"))
        user_rules = items(get_path(spec, ("podFailurePolicy", "rules")))
        pod_spec = mapping(get_path(spec, ("template", "spec")))
        ours = [rule for rule, _ in our_rules(resolve_count(policy, user_rules), pod_spec)]
        failing = {fp.rule_key(rule) for rule in ours if rule["action"] == "FailJob"}
        merged, _ = fp.merge(user_rules, ours)
        found = []
        for index, rule in enumerate(merged):
            if fp.rule_key(rule) in failing:
                on = mapping(rule.get("onExitCodes"))
                name = on.get("containerName")
                container: Piece = name if isinstance(name, str) else Wild()
                kept = set(items(on.get("values")))
                codes = tuple(str(c) for c in range(1, 256) if c not in kept)
                found.append(failjob_message(container, ns, [Wild()], codes, index))
        messages[str(rjob.get("name"))] = found
    return messages


def rule_applies(
    rule: Mapping[str, Any], reason: str, messages: Mapping[str, Sequence[Sequence[Piece]]]
) -> tuple[bool, str, str]:
    """Whether ``rule`` applies to some Job failed with ``reason`` and one of ``messages``
    (by replicated Job, each a message as pieces), as ``ruleIsApplicable`` decides; with
    the pattern that matched, and why it was taken to match when it could not be read."""
    reasons = rule.get("onJobFailureReasons") or []
    if not isinstance(reasons, list) or (reasons and reason not in reasons):
        return False, "", ""
    targets = rule.get("targetReplicatedJobs") or []
    patterns = rule.get("onJobFailureMessagePatterns") or []
    for name, texts in messages.items():
        if isinstance(targets, list) and targets and name not in targets:
            continue
        if not isinstance(patterns, list) or not patterns:
            return True, "", ""
        for pattern in patterns:
            for message in texts:
                hit, why = pattern_applies(pattern, message)
                if hit:
                    return True, str(pattern), why
    return False, "", ""


def _matches_everything(pattern: Any) -> bool:
    try:
        return compile_go(str(pattern)).matches_everything()
    except Unsupported:
        return False


def covers(rule: Any, targets: Sequence[str] = ()) -> bool:
    """A rule that already fails the whole JobSet on any podFailurePolicy failure of the
    Jobs our rules are in: no targets (or all of ``targets``, when our rule has them), and
    no patterns or one that matches any message (``.*``)."""
    if not isinstance(rule, dict) or rule.get("action") != "FailJobSet":
        return False
    reasons = rule.get("onJobFailureReasons") or []
    patterns = rule.get("onJobFailureMessagePatterns") or []
    theirs = rule.get("targetReplicatedJobs") or []
    return (
        isinstance(reasons, list)
        and (not reasons or POD_FAILURE_POLICY in reasons)
        and (not patterns or any(_matches_everything(p) for p in patterns))
        and (
            not theirs
            or (bool(targets) and isinstance(theirs, list) and set(targets) <= set(theirs))
        )
    )


def check_rules(
    rules: list[Any],
    policy: Policy,
    out: Outcome,
    messages: Mapping[str, Sequence[Sequence[Piece]]],
    targets: Sequence[str] = (),
) -> Policy:
    """The user's rules come first (first match wins): one that restarts on a
    podFailurePolicy failure with our FailJob rule's message would keep ours from firing.
    Every such rule before ours is said in one problem: dropping only the first would let
    the next one take the failure."""
    found: list[tuple[str, str]] = []
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        if rule.get("name") == RULE_NAME and not covers(rule, targets):
            out.problems.append(
                Problem(
                    f"spec.failurePolicy.rules[{index}].name",
                    f"{RULE_NAME} is the name of the rule this webhook adds; rename your rule",
                    "contradiction",
                )
            )
            return policy
        if covers(rule, targets):
            break
        if rule.get("action") == "FailJobSet":
            continue
        applies, pattern, why = rule_applies(rule, POD_FAILURE_POLICY, messages)
        if applies:
            how = ""
            if pattern and why:
                how = f" (its pattern /{pattern}/ is taken to match: {why})"
            elif pattern:
                how = f" (its pattern /{pattern}/ matches the Job's message: {FAILJOB_SHAPE})"
            found.append((f"rules[{index}] ({rule.get('action')})", how))
    if not found:
        return policy
    if len(found) == 1:
        ((rule_said, how),) = found
        said = f"{rule_said} matches Jobs failed by their podFailurePolicy first{how}"
    else:
        said = _and([r + how for r, how in found]) + " match Jobs failed by their "
        said += "podFailurePolicy first (JobSet takes the first that applies: drop or narrow each)"
    return out.refuse(
        policy,
        "fail-non-retriable",
        f"your spec.failurePolicy.{said}, so a non-retriable exit would not fail the JobSet",
        "contradiction",
    )


def _and(said: Sequence[str]) -> str:
    return ", ".join(said[:-1]) + f" and {said[-1]}" if len(said) > 1 else said[0]


def check_uncounted_restarts(
    jobset: Mapping[str, Any], rules: list[Any], policy: Policy, out: Outcome
) -> Policy:
    """A rule of the user's that restarts, uncounted, a Job whose pods ran out of retries
    would leave the ``backoff-limit`` we write (maxRestarts) nothing to bound: every such
    rule that some Job's failure reaches is said, in one problem."""
    if policy.setting("backoff-limit").source not in WRITTEN_SOURCES:
        return policy
    replicated = get_path(jobset, ("spec", "replicatedJobs"))
    names = {str(r.get("name")) for r in replicated or [] if isinstance(r, dict)}
    found: dict[int, tuple[str, list[str]]] = {}  # rule index -> action, reasons
    for reason, message in BUDGET_MESSAGES.items():
        left = set(names)  # replicated Jobs whose such failures no earlier rule has taken
        for index, rule in enumerate(rules):
            if not left:
                break
            if not isinstance(rule, dict) or rule.get("action") not in ACTIONS:
                continue
            applies, _, why = rule_applies(rule, reason, {name: [[message]] for name in left})
            if not applies:
                continue
            if rule["action"] in IGNORING_ACTIONS:
                found.setdefault(index, (str(rule["action"]), []))[1].append(reason)
            targets = rule.get("targetReplicatedJobs") or list(names)
            if not why and isinstance(targets, list):
                left -= {str(t) for t in targets}
    if not found:
        return policy
    said = _and(
        [
            f"spec.failurePolicy.rules[{index}] ({action}) restarts without counting when a "
            f"Job's pods run out of retries ({' or '.join(reasons)})"
            for index, (action, reasons) in sorted(found.items())
        ]
    )
    out.conflict(
        policy,
        "backoff-limit",
        f"{policy.backoff_limit} (maxRestarts) would bound nothing: your {said}, so the set "
        f"would restart forever; drop the rule{'s' if len(found) > 1 else ''} or backoff-limit",
        "contradiction",
    )
    return keep_spec_limit(jobset, MAX_RESTARTS, policy)


def check_single_job_restarts(rules: list[Any], policy: Policy, out: Outcome) -> Policy:
    """Pods know their attempt from the JobSet's ``restart-attempt`` label, which a
    RestartJob action leaves unchanged: after one, the last attempts would look like
    earlier ones and run on spot nodes, the opposite of what was asked."""
    for index, rule in enumerate(rules):
        if isinstance(rule, dict) and rule.get("action") in SINGLE_JOB_RESTARTS:
            policy = out.refuse(
                policy,
                "non-spot-attempts",
                f"your spec.failurePolicy.rules[{index}] ({rule['action']}) recreates a Job "
                "without a new jobset.sigs.k8s.io/restart-attempt, so its last attempts could "
                "not be told apart and would run on spot nodes; drop the rule or this setting",
                "contradiction",
            )
            if policy.non_spot_attempts <= 0:
                return policy  # a default, skipped
    return policy


def check_oom_restarts(
    rules: list[Any], replicated: list[Any], policy: Policy, out: Outcome
) -> Policy:
    """After an OOM kill the child Job fails once its budget is used (by default 0 here:
    at once; reason FailedIndexes with a per-index budget), and the JobSet must restart
    it for the next run to get more memory: the first of your rules that applies to that
    failure (``applies``, as ``ruleIsApplicable`` decides) must not be FailJobSet. Every
    replicated Job one fails is said, in one problem."""
    found: list[str] = []
    for rjob in replicated:
        name = rjob.get("name") if isinstance(rjob, dict) else None
        spec = get_path(rjob, ("template", "spec"))
        per_index = isinstance(spec, dict) and spec.get("backoffLimitPerIndex") is not None
        reason = "FailedIndexes" if per_index else "BackoffLimitExceeded"
        messages: dict[str, list[list[Piece]]] = {str(name): [[BUDGET_MESSAGES[reason]]]}
        for index, rule in enumerate(rules):
            if not isinstance(rule, dict) or not rule_applies(rule, reason, messages)[0]:
                continue
            if rule.get("action") == "FailJobSet":
                found.append(
                    f"spec.failurePolicy.rules[{index}] (FailJobSet) applies when replicated "
                    f"Job {name} fails with {reason}"
                )
            break
    if not found:
        return policy
    return out.refuse(
        policy,
        "oom-memory-factor",
        f"your {_and(found)}, which is how an OOM kill ends "
        f"{'it' if len(found) == 1 else 'them'}: the JobSet would fail instead of restarting "
        "with more memory",
        "contradiction",
    )


def add_rule(
    jobset: dict[str, Any],
    policy: Policy,
    replicated: list[Any],
    out: Outcome,
    targets: Sequence[str] = (),
    name: str = "fail-non-retriable",
) -> None:
    """Our FailJobSet rule: a child Job our rules failed (``fail-non-retriable``'s exit
    codes, ``fail-categories``' categories: reason PodFailurePolicy) fails the set."""
    spec = jobset["spec"]
    failure_policy = spec.get("failurePolicy")
    if not isinstance(failure_policy, dict):
        failure_policy = spec["failurePolicy"] = {}
    rules = failure_policy.get("rules")
    if not isinstance(rules, list):
        rules = []
    ours = our_rule(targets)
    if any(covers(rule, targets) for rule in rules):
        out.wrote(ours, name, added=False)  # (ours, when an earlier run's)
        return
    out.wrote(ours, name)
    failure_policy["rules"] = [*rules, ours]
    on = f" of {', '.join(targets)}" if targets else ""
    out.changed(
        f"retry-policy: added failurePolicy rule {RULE_NAME} (FailJobSet on "
        f"{POD_FAILURE_POLICY}{on})",
        policy.setting(name),
    )
    out.problems.extend(validate_rules(failure_policy["rules"], replicated))


def add_peer_rule(
    jobset: dict[str, Any], policy: Policy, how: str, replicated: list[Any], out: Outcome
) -> None:
    """``peer-disruptions``: our rule first in the set's rules, on the ``FailureTarget``
    the controller adds to a disrupted pod's child Job (``failurepolicy.peer_rule``): the
    set restarts as a whole, uncounted for ``ignore``, counted for ``count``. First, since
    JobSet takes the first rule that applies to any failed Job
    (``findFirstFailedPolicyRuleAndJob``): peers failed meanwhile by their exit codes (a
    FailJob: reason PodFailurePolicy) would otherwise meet our FailJobSet rule."""
    failure_policy = jobset["spec"].setdefault("failurePolicy", {})
    rules = failure_policy.get("rules")
    rules = rules if isinstance(rules, list) else []
    ours = jsp.peer_rule(how)
    if rules and rules[0] == ours:
        out.wrote(ours, "peer-disruptions", added=False)
        return
    for index, rule in enumerate(rules):
        if isinstance(rule, dict) and rule.get("name") == jsp.PEER_RULE_NAME:
            pruned = {k: v for k, v in ours.items() if k != "onJobFailureMessagePatterns"}
            why = (
                "the JobSet API dropped its onJobFailureMessagePatterns: this cluster's "
                "JobSet is older than v0.10, which added the field, and without it the "
                "rule would restart the set on every PodFailurePolicy failure. "
                "peer-disruptions on a JobSet needs JobSet v0.10 or later: upgrade "
                f"JobSet, or remove peer-disruptions (the annotation {PREFIX}"
                "peer-disruptions, or its default in the webhook's config)"
                if rule == pruned
                else "it is the name of the rule this webhook adds for peer-disruptions; "
                "rename your rule"
            )
            out.problems.append(
                Problem(f"spec.failurePolicy.rules[{index}].name", why, "contradiction")
            )
            return
    out.wrote(ours, "peer-disruptions")
    failure_policy["rules"] = [ours, *rules]
    counted = "not counted against maxRestarts" if how == "ignore" else "counted"
    out.changed(
        f"retry-policy: added failurePolicy rule {jsp.PEER_RULE_NAME} first "
        f"({ours['action']} when the controller fails a disrupted pod's Job with "
        f"{jsp.PEER_MESSAGE_PREFIX.strip()} ...: the set restarts, {counted})",
        policy.setting("peer-disruptions"),
    )
    out.problems.extend(validate_rules(failure_policy["rules"], replicated))


#: A replicated Job's replicas at most beside a rule that recreates single Jobs
#: (``maxReplicasPerReplicatedJob`` in jobset pkg/webhooks/jobset_webhook.go): JobSet
#: keeps each Job's restarts in a status list of at most that many items.
MAX_REPLICAS_RESTARTING_JOBS = 1024


def validate_rules(rules: list[Any], replicated: list[Any]) -> list[Problem]:
    """JobSet's own checks of ``failurePolicy.rules`` (its webhook, ``validateFailurePolicy``,
    and CRD) against the replicated Jobs ``replicated`` (as written), as problems.

    Unnamed rules are checked under the name JobSet gives them (``failurePolicyRule<i>``).
    """
    names = [r.get("name") for r in replicated if isinstance(r, dict)]
    problems = _replica_limit(rules, replicated)
    seen: dict[str, int] = {}
    for index, rule in enumerate(rules):
        where = f"spec.failurePolicy.rules[{index}]"
        if not isinstance(rule, dict):
            problems.append(Problem(where, "must be an object"))
            continue
        action = rule.get("action")
        if action not in ACTIONS:
            problems.append(
                Problem(f"{where}.action", f"{action!r} is not one of {', '.join(ACTIONS)}")
            )
        name = rule.get("name") or f"failurePolicyRule{index}"
        if not isinstance(name, str) or not (
            len(name) <= MAX_RULE_NAME and RULE_NAME_PATTERN.fullmatch(name)
        ):
            problems.append(
                Problem(
                    f"{where}.name",
                    f"{name!r} is not a valid rule name: 1 to {MAX_RULE_NAME} characters, "
                    "a letter first, then letters, digits or _,: (not ending in , or :)",
                )
            )
        elif name in seen:
            problems.append(
                Problem(f"{where}.name", f"{name!r} is also the name of rules[{seen[name]}]")
            )
        else:
            seen[name] = index
        for field in ("onJobFailureReasons", "targetReplicatedJobs"):
            if not isinstance(rule.get(field) or [], list):
                problems.append(Problem(f"{where}.{field}", "must be a list of names"))
        reasons, targets = rule.get("onJobFailureReasons"), rule.get("targetReplicatedJobs")
        for reason in reasons if isinstance(reasons, list) else []:
            if not isinstance(reason, str) or reason not in REASONS:
                problems.append(
                    Problem(
                        f"{where}.onJobFailureReasons",
                        f"{reason!r} is not a Job failure reason; accepted: {', '.join(REASONS)}",
                    )
                )
        for target in targets if isinstance(targets, list) else []:
            if not isinstance(target, str) or target not in names:
                problems.append(
                    Problem(
                        f"{where}.targetReplicatedJobs",
                        f"{target!r} is not the name of a replicated Job of this JobSet",
                    )
                )
    return problems


def _replica_limit(rules: list[Any], replicated: list[Any]) -> list[Problem]:
    """A RestartJob or RestartJobAndIgnoreMaxRestarts rule is refused beside a replicated
    Job of more than ``MAX_REPLICAS_RESTARTING_JOBS`` replicas (``validateFailurePolicy``):
    each such rule is a problem of its own."""
    over = [
        f"{rjob.get('name')} has {replicas}"
        for rjob in replicated
        if isinstance(rjob, dict)
        and isinstance(replicas := rjob.get("replicas"), int)
        and replicas > MAX_REPLICAS_RESTARTING_JOBS
    ]
    if not over:
        return []
    return [
        Problem(
            f"spec.failurePolicy.rules[{index}].action",
            f"{rule['action']} is refused by JobSet with a replicated Job of more than "
            f"{MAX_REPLICAS_RESTARTING_JOBS} replicas (replicated Job {', '.join(over)}): "
            f"at most {MAX_REPLICAS_RESTARTING_JOBS} replicas, or a rule that restarts the "
            "whole JobSet",
            "jobset-replicas",
        )
        for index, rule in enumerate(rules)
        if isinstance(rule, dict) and rule.get("action") in SINGLE_JOB_RESTARTS
    ]
