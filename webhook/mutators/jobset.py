"""jobset.x-k8s.io/v1alpha2 JobSet: restarts of the whole set are the retry budget.

A JobSet runs its replicated Jobs together and, when one fails, recreates all of them
(a restart) up to ``spec.failurePolicy.maxRestarts`` times. So here:

- ``backoff-limit: B`` is ``maxRestarts: B``. Each child Job's own ``backoffLimit`` (pod
  retries inside one run) is set to 0 when you did not write one, so that every counted
  pod failure is one restart and the JobSet has B + 1 attempts, as a Job with
  ``backoffLimit: B`` has. A child ``backoffLimit`` b you wrote is kept: then a pod slot
  has (B + 1) x (b + 1) attempts.
- ``fail-non-retriable`` / ``ignore-disruptions`` put the podFailurePolicy rules into every
  replicated Job template (``apply_job_spec``), and ``fail-non-retriable`` adds the JobSet
  rule ``retryPolicyFailNonRetriable`` (``FailJobSet`` on ``PodFailurePolicy``) after the
  user's own rules, so a non-retriable exit fails the whole JobSet at once instead of
  restarting it.
- ``non-spot-attempts``: JobSet pods carry ``jobset.sigs.k8s.io/restart-attempt``; pods
  count runs against maxRestarts (see ``job.Budget`` and ``pod.attempt_of``).
- ``error-propagation``: the env vars in every replicated Job's pods.

The child Jobs are admitted on their own, but the Job mutator leaves them alone (their
policy was applied here, where ``backoff-limit`` means restarts), which is why
retry-policy annotations on a replicated Job's template are denied: they would be ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from webhook import failureaware, intent
from webhook.mutators import Context, Outcome, has_policy_annotations, register
from webhook.mutators.job import (
    JOBSET_GROUP,
    WRITTEN_SOURCES,
    LimitField,
    WorkloadMutator,
    apply_job_spec,
    enforce_rail,
    get_path,
    job_limit_field,
    not_applicable,
    resolve_limit,
    write_limit,
)
from webhook.policy import PREFIX, Policy, Setting, Source, with_setting
from webhook.problems import Problem

MAX_RESTARTS = LimitField(("spec", "failurePolicy", "maxRestarts"), None, 0)
RULE_NAME = "retryPolicyFailNonRetriable"
POD_FAILURE_POLICY = "PodFailurePolicy"
ACTIONS = (
    "FailJobSet",
    "RestartJobSet",
    "RestartJobSetAndIgnoreMaxRestarts",
    "RestartJob",
    "RestartJobAndIgnoreMaxRestarts",
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
#: What JobSet's own webhook writes into a replicated Job's pod template when it is unset.
JOBSET_DEFAULT_RESTART_POLICY = "OnFailure"


def our_rule() -> dict[str, Any]:
    return {"name": RULE_NAME, "action": "FailJobSet", "onJobFailureReasons": [POD_FAILURE_POLICY]}


@register
class JobSetMutator(WorkloadMutator):
    group = JOBSET_GROUP
    kind = "JobSet"

    def applies(self, jobset: Mapping[str, Any], ctx: Context) -> bool:
        replicated = get_path(jobset, ("spec", "replicatedJobs"))
        return super().applies(jobset, ctx) or any(
            # To deny them: the child Jobs would ignore policy annotated there.
            has_policy_annotations(get_path(rjob, ("template", "metadata")))
            for rjob in (replicated if isinstance(replicated, list) else [])
        )

    def apply(self, jobset: dict[str, Any], policy: Policy, ctx: Context, out: Outcome) -> Policy:
        replicated = get_path(jobset, ("spec", "replicatedJobs"))
        if not isinstance(replicated, list) or not replicated:
            out.problems.append(
                Problem("spec.replicatedJobs", "a JobSet needs at least one replicated Job")
            )
            return policy
        _check_child_annotations(replicated, out)
        if policy.fail_non_retriable and policy.on_non_retriable == "fail-index":
            policy = not_applicable(
                policy,
                "on-non-retriable",
                "JobSet",
                "fail-index would fail only the index, but its Job then fails as a whole "
                "(reason FailedIndexes, shared with retriable failures) and the JobSet "
                "restarts it; use fail-job",
                out,
            )
        rules = get_path(jobset, ("spec", "failurePolicy", "rules"))
        if policy.fail_non_retriable:
            policy = _check_rules(rules if isinstance(rules, list) else [], policy, out)
        if policy.non_spot_attempts:
            policy = _check_single_job_restarts(
                rules if isinstance(rules, list) else [], policy, out
            )
        if policy.oom_memory_factor is not None:
            policy = _check_oom_restarts(
                rules if isinstance(rules, list) else [], replicated, policy, out
            )
        policy = resolve_limit(jobset, MAX_RESTARTS, policy, out)
        policy = enforce_rail(policy, MAX_RESTARTS, ctx, out)
        if not out.problems:
            write_limit(jobset, MAX_RESTARTS, policy, out)
        restarts = policy.backoff_limit or 0
        children = [
            _apply_replicated_job(jobset, index, policy, restarts, ctx, out)
            for index in range(len(replicated))
        ]
        if not out.problems and any(c is not None and c.fail_non_retriable for c in children):
            names = [r.get("name") for r in replicated if isinstance(r, dict)]
            _add_rule(jobset, policy, names, out)
        _say_once(out)
        out.policies["spec"] = policy
        return policy


def _say_once(out: Outcome) -> None:
    """Each replicated Job reports the same rule and placement lines: keep the first."""
    seen: set[str] = set()
    unique = []
    for change in out.changes:
        if change.text not in seen:
            seen.add(change.text)
            unique.append(change)
    out.changes[:] = unique


def _check_child_annotations(replicated: list[Any], out: Outcome) -> None:
    for index, rjob in enumerate(replicated):
        annotations = get_path(rjob, ("template", "metadata", "annotations"))
        if not isinstance(annotations, dict):
            continue
        for key in annotations:
            if isinstance(key, str) and key.startswith(PREFIX):
                out.problems.append(
                    Problem(
                        f"spec.replicatedJobs[{index}].template.metadata annotation {key}",
                        "a JobSet's Jobs follow the JobSet's policy and would ignore it; "
                        "annotate the JobSet itself",
                        "wrong-scope",
                    )
                )


def _apply_replicated_job(
    jobset: dict[str, Any],
    index: int,
    policy: Policy,
    restarts: int,
    ctx: Context,
    out: Outcome,
) -> Policy | None:
    """Apply the policy to one replicated Job template; return its resolved policy."""
    path = ("spec", "replicatedJobs", index, "template", "spec")
    job_spec = get_path(jobset, path)
    if not isinstance(job_spec, dict):
        out.problems.append(Problem(intent.dotted(path), "a replicated Job needs a Job spec"))
        return None
    child = _child_policy(jobset, path, job_spec, policy)
    reverted = _restart_never(jobset, path, job_spec, child)
    uid = get_path(jobset, ("metadata", "uid"))
    resolved = apply_job_spec(
        jobset,
        path,
        job_spec,
        child,
        ctx,
        out,
        restarts=restarts,
        defaulted=False,
        lineage=uid if isinstance(uid, str) and uid else None,
    )
    if reverted is None:
        return resolved
    rp_path = intent.dotted((*path, "template", "spec", "restartPolicy"))
    if resolved.fail_non_retriable or resolved.ignore_disruptions:
        name = "fail-non-retriable" if resolved.fail_non_retriable else "ignore-disruptions"
        shown = f" {reverted}" if reverted else ""
        out.changed(
            f"retry-policy: {rp_path}{shown} -> Never (for the podFailurePolicy)",
            resolved.setting(name),
        )
    else:
        # Nothing needs it after all (an admin default was skipped): leave it as it was.
        pod_spec = job_spec["template"]["spec"]
        if reverted:
            pod_spec["restartPolicy"] = reverted
        else:
            pod_spec.pop("restartPolicy", None)
    return resolved


def _child_policy(
    jobset: Mapping[str, Any],
    path: tuple[str | int, ...],
    job_spec: Mapping[str, Any],
    policy: Policy,
) -> Policy:
    """The policy of one replicated Job: the JobSet's, with the child's own budget.

    A budget the user wrote in the template is kept; otherwise, when the JobSet's
    ``backoff-limit`` was asked for, the child gets 0 so that every counted failure is one
    JobSet restart; otherwise the child keeps the Kubernetes default.
    """
    field = job_limit_field(path, job_spec, defaulted=False)
    current = get_path(jobset, field.path)
    if intent.explicit(jobset, field.path, current, field.api_default):
        setting = Setting(current, Source.SPEC, field.name)
    elif policy.setting("backoff-limit").source in WRITTEN_SOURCES:
        asked = policy.setting("backoff-limit")
        setting = Setting(0, asked.source, asked.detail)
    else:
        setting = Setting(None, Source.BUILTIN)
    return with_setting(policy, "backoff-limit", setting)


def _restart_never(
    jobset: Mapping[str, Any], path: tuple[str | int, ...], job_spec: dict[str, Any], policy: Policy
) -> str | None:
    """Set the pod template's ``restartPolicy: Never`` (required by a podFailurePolicy) when
    the user did not write one; JobSet's own webhook would default it to OnFailure.

    Returns the previous value ("" when unset), or ``None`` when nothing was changed.
    """
    if not (policy.fail_non_retriable or policy.ignore_disruptions):
        return None
    pod_spec = get_path(job_spec, ("template", "spec"))
    if not isinstance(pod_spec, dict):
        return None
    current = pod_spec.get("restartPolicy")
    rp_path = (*path, "template", "spec", "restartPolicy")
    if current == "Never" or intent.explicit(
        jobset, rp_path, current, JOBSET_DEFAULT_RESTART_POLICY
    ):
        return None
    pod_spec["restartPolicy"] = "Never"
    return current or ""


def _matches_pod_failure_policy(rule: Mapping[str, Any]) -> bool:
    """Whether a JobSet rule matches every Job that failed through its podFailurePolicy."""
    reasons = rule.get("onJobFailureReasons") or []
    if not isinstance(reasons, list):
        return False
    return (not reasons or POD_FAILURE_POLICY in reasons) and not rule.get(
        "onJobFailureMessagePatterns"
    )


def _covers(rule: Any) -> bool:
    """A rule that already fails the whole JobSet on any podFailurePolicy failure."""
    return (
        isinstance(rule, dict)
        and rule.get("action") == "FailJobSet"
        and _matches_pod_failure_policy(rule)
        and not rule.get("targetReplicatedJobs")
    )


def _check_rules(rules: list[Any], policy: Policy, out: Outcome) -> Policy:
    """The user's rules come first (first match wins): one that restarts on a
    podFailurePolicy failure would keep ours from ever firing."""
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        if rule.get("name") == RULE_NAME and not _covers(rule):
            out.problems.append(
                Problem(
                    f"spec.failurePolicy.rules[{index}].name",
                    f"{RULE_NAME} is the name of the rule this webhook adds; rename your rule",
                    "contradiction",
                )
            )
            return policy
        if _covers(rule):
            return policy
        if _matches_pod_failure_policy(rule) and rule.get("action") != "FailJobSet":
            out.conflict(
                policy,
                "fail-non-retriable",
                f"your spec.failurePolicy.rules[{index}] ({rule.get('action')}) matches Jobs "
                "failed by their podFailurePolicy first, so a non-retriable exit would not "
                "fail the JobSet",
                "contradiction",
            )
            return with_setting(
                policy,
                "fail-non-retriable",
                Setting(False, policy.setting("fail-non-retriable").source),
            )
    return policy


#: Actions that recreate one Job without a new ``restart-attempt`` number on its pods.
SINGLE_JOB_RESTARTS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")


def _check_single_job_restarts(rules: list[Any], policy: Policy, out: Outcome) -> Policy:
    """Pods know their attempt from the JobSet's ``restart-attempt`` label, which a
    RestartJob action leaves unchanged: after one, the last attempts would look like
    earlier ones and run on spot nodes, the opposite of what was asked."""
    for index, rule in enumerate(rules):
        if isinstance(rule, dict) and rule.get("action") in SINGLE_JOB_RESTARTS:
            out.conflict(
                policy,
                "non-spot-attempts",
                f"your spec.failurePolicy.rules[{index}] ({rule['action']}) recreates a Job "
                "without a new jobset.sigs.k8s.io/restart-attempt, so its last attempts could "
                "not be told apart and would run on spot nodes; drop the rule or this setting",
                "contradiction",
            )
            return with_setting(
                policy, "non-spot-attempts", Setting(0, policy.setting("non-spot-attempts").source)
            )
    return policy


#: The reason and condition message of a child Job that used up its budget (per index:
#: ``FailedIndexes``), as JobSet's rules see them (``ruleIsApplicable``).
BUDGET_FAILURES = {
    False: ("BackoffLimitExceeded", "Job has reached the specified backoff limit"),
    True: ("FailedIndexes", "Job has failed indexes"),
}


def _check_oom_restarts(
    rules: list[Any], replicated: list[Any], policy: Policy, out: Outcome
) -> Policy:
    """After an OOM kill the child Job fails once its budget is used (by default 0 here:
    at once), and the JobSet must restart it for the next run to get more memory: the
    first of your rules that applies to that failure (reason, target, message patterns,
    as ``ruleIsApplicable`` checks them) must not be FailJobSet."""
    for rjob in replicated:
        name = rjob.get("name") if isinstance(rjob, dict) else None
        spec = get_path(rjob, ("template", "spec"))
        per_index = isinstance(spec, dict) and spec.get("backoffLimitPerIndex") is not None
        reason, message = BUDGET_FAILURES[per_index]
        for index, rule in enumerate(rules):
            if not isinstance(rule, dict) or not _applies(rule, name, reason, message):
                continue
            if rule.get("action") == "FailJobSet":
                out.conflict(
                    policy,
                    "oom-memory-factor",
                    f"your spec.failurePolicy.rules[{index}] (FailJobSet) applies when "
                    f"replicated Job {name} fails with {reason}, which is how an OOM kill "
                    "ends it: the JobSet would fail instead of restarting with more memory",
                    "contradiction",
                )
                return failureaware.off(policy, "oom-memory-factor")
            break
    return policy


def _applies(rule: Mapping[str, Any], rjob: Any, reason: str, message: str) -> bool:
    reasons = rule.get("onJobFailureReasons") or []
    targets = rule.get("targetReplicatedJobs") or []
    if not isinstance(reasons, list) or not isinstance(targets, list):
        return False
    if (reasons and reason not in reasons) or (targets and rjob not in targets):
        return False
    patterns = rule.get("onJobFailureMessagePatterns") or []
    if not isinstance(patterns, list) or not patterns:
        return True
    return any(_search(p, message) for p in patterns)


def _search(pattern: Any, text: str) -> bool:
    """Go's ``regexp.MatchString`` (a match anywhere), with Python's engine: the same on
    the patterns JobSet's examples use; a pattern Python cannot compile matches nothing."""
    try:
        return isinstance(pattern, str) and re.search(pattern, text) is not None
    except re.error:
        return False


def _add_rule(jobset: dict[str, Any], policy: Policy, names: list[Any], out: Outcome) -> None:
    spec = jobset["spec"]
    failure_policy = spec.get("failurePolicy")
    if not isinstance(failure_policy, dict):
        failure_policy = spec["failurePolicy"] = {}
    rules = failure_policy.get("rules")
    if not isinstance(rules, list):
        rules = []
    if any(_covers(rule) for rule in rules):
        return
    failure_policy["rules"] = [*rules, our_rule()]
    out.changed(
        f"retry-policy: added failurePolicy rule {RULE_NAME} (FailJobSet on {POD_FAILURE_POLICY})",
        policy.setting("fail-non-retriable"),
    )
    out.problems.extend(validate_rules(failure_policy["rules"], names))


def validate_rules(rules: list[Any], replicated: list[Any]) -> list[Problem]:
    """JobSet's own checks of ``failurePolicy.rules`` (its webhook and CRD), as problems.

    Unnamed rules are checked under the name JobSet gives them (``failurePolicyRule<i>``).
    """
    problems = []
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
            if not isinstance(target, str) or target not in replicated:
                problems.append(
                    Problem(
                        f"{where}.targetReplicatedJobs",
                        f"{target!r} is not the name of a replicated Job of this JobSet",
                    )
                )
    return problems
