"""batch/v1 Job: backoffLimit, podFailurePolicy, placement and error propagation.

``apply_job_spec`` works on any JobSpec (a Job's, a CronJob's jobTemplate, a JobSet's
replicated Job template) so the same annotation means the same thing on all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook import failurepolicy as fp
from webhook import intent, podspec
from webhook.failurepolicy import ContainerExit, PodFailure
from webhook.mutators import (
    Context,
    Outcome,
    applied_record,
    has_policy_annotations,
    register,
    workload_policy,
)
from webhook.policy import (
    APPLIED,
    INT32_MAX,
    PREFIX,
    Policy,
    Scope,
    Setting,
    Source,
    format_value,
    parse_annotations,
    with_setting,
)
from webhook.problems import Problem

API_DEFAULT_BACKOFF_LIMIT = 6
#: Pod-level keys copied onto the pod template so pod admission needs no lookup.
POD_KEYS = ("backoff-limit", "non-spot-attempts", "error-propagation")


@register
class JobMutator:
    group = "batch"
    kind = "Job"
    enforce_applied = True

    def applies(self, job: Mapping[str, Any], ctx: Context) -> bool:
        return has_policy_annotations(job.get("metadata")) or ctx.config.affects_unannotated(
            ctx.namespace
        )

    def mutate(self, job: dict[str, Any], ctx: Context) -> Outcome:
        out = Outcome()
        metadata = job.get("metadata")
        if not self.applies(job, ctx):
            return out
        policy, problems = workload_policy(metadata, ctx)
        out.problems.extend(problems)
        spec = job.get("spec")
        if not isinstance(spec, dict):
            out.problems.append(Problem("spec", "a Job needs a spec"))
            return out
        policy = apply_job_spec(job, ("spec",), spec, policy, ctx, out)
        if out.problems:
            return out
        if out.changes or policy.active:
            # Bookkeeping, not a change worth a warning of its own.
            podspec.set_annotation(job["metadata"], APPLIED, applied_record(policy))
        return out


def resolve_backoff_limit(
    obj: Mapping[str, Any],
    path: tuple[str, ...],
    spec: Mapping[str, Any],
    policy: Policy,
    out: Outcome,
) -> Policy:
    """Settle ``backoff-limit`` against the spec, telling written values from defaulted ones.

    An annotation wins (and contradicting an explicit spec value is a problem); a value the
    user wrote in the spec beats admin defaults; a value the API server defaulted does not.
    """
    current = spec.get("backoffLimit")
    default = (
        INT32_MAX if spec.get("backoffLimitPerIndex") is not None else API_DEFAULT_BACKOFF_LIMIT
    )
    wrote = intent.explicit(obj, (*path, "backoffLimit"), current, default)
    layered = policy.setting("backoff-limit")
    field = ".".join((*path, "backoffLimit"))
    if layered.source is Source.ANNOTATION:
        if wrote and current != layered.value:
            out.problems.append(
                Problem(
                    f"annotation {PREFIX}backoff-limit",
                    f"{layered.value} contradicts {field}: {current} in your spec; "
                    "remove one of them or make them equal",
                    "contradiction",
                )
            )
        return policy
    if wrote and current != layered.value:
        return with_setting(policy, "backoff-limit", Setting(current, Source.SPEC, field))
    if layered.value is not None:
        return policy
    value = current if isinstance(current, int) else default
    return with_setting(policy, "backoff-limit", Setting(value, Source.KUBERNETES))


def apply_job_spec(
    obj: Mapping[str, Any],
    path: tuple[str, ...],
    spec: dict[str, Any],
    policy: Policy,
    ctx: Context,
    out: Outcome,
) -> Policy:
    """Check and apply ``policy`` to one JobSpec; return the policy with backoff resolved."""
    where = ".".join(path)
    policy = resolve_backoff_limit(obj, path, spec, policy, out)
    rails = ctx.config.rails(ctx.namespace)
    limit = policy.backoff_limit
    if (
        rails.max_backoff_limit is not None
        and limit is not None
        and limit > rails.max_backoff_limit
    ):
        setting = policy.setting("backoff-limit")
        if setting.source in (Source.KUBERNETES, Source.BUILTIN):
            # Nobody asked for the API default: lower it to the guard rail instead of denying.
            policy = with_setting(
                policy,
                "backoff-limit",
                Setting(rails.max_backoff_limit, Source.CLUSTER, "(guardRails.maxBackoffLimit)"),
            )
        else:
            subject = (
                f"annotation {PREFIX}backoff-limit"
                if setting.source is Source.ANNOTATION
                else f"{where}.backoffLimit ({setting.describe()})"
            )
            out.problems.append(
                Problem(
                    subject,
                    f"{limit} is above this cluster's limit; accepted: 0 to "
                    f"{rails.max_backoff_limit} (guardRails.maxBackoffLimit)",
                    "guard-rail",
                )
            )
    template = spec.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        out.problems.append(Problem(f"{where}.template.spec", "a Job needs a pod template"))
        return policy
    pod_spec = template["spec"]
    policy = _check_template(obj, path, spec, pod_spec, policy, ctx, out)
    if out.problems:
        return policy
    _apply(spec, template, pod_spec, policy, ctx, out, where)
    out.policies[where] = policy
    return policy


def _check_template(
    obj: Mapping[str, Any],
    path: tuple[str, ...],
    spec: dict[str, Any],
    pod_spec: dict[str, Any],
    policy: Policy,
    ctx: Context,
    out: Outcome,
) -> Policy:
    """Contradictions between the policy and the user's own spec, found before any change."""
    where = ".".join(path)
    restart = pod_spec.get("restartPolicy")
    for name in ("fail-non-retriable", "ignore-disruptions"):
        if policy.value(name) and restart != "Never":
            out.conflict(
                policy,
                name,
                f"needs {where}.template.spec.restartPolicy: Never (it is {restart!r}); "
                "Kubernetes only applies a podFailurePolicy to Jobs that never restart in place",
                "restart-policy",
            )
            policy = with_setting(policy, name, Setting(False, policy.setting(name).source))
    if policy.fail_non_retriable or policy.ignore_disruptions:
        replacement = spec.get("podReplacementPolicy")
        if replacement == "TerminatingOrFailed" and intent.user_wrote(
            obj, (*path, "podReplacementPolicy")
        ):
            for name in ("fail-non-retriable", "ignore-disruptions"):
                if policy.value(name):
                    out.conflict(
                        policy,
                        name,
                        f"your {where}.podReplacementPolicy: TerminatingOrFailed is not allowed "
                        "with a podFailurePolicy; use Failed or remove the field",
                        "contradiction",
                    )
                    policy = with_setting(policy, name, Setting(False, policy.setting(name).source))
    user_rules = _rules(spec)
    if policy.fail_non_retriable:
        failure = PodFailure(
            tuple(
                ContainerExit(str(c.get("name")), code)
                for code in policy.retriable_exit_codes
                for c in podspec.containers(pod_spec)
            )
        )
        match = fp.evaluate(user_rules, failure)
        if match is not None and match.action in ("FailJob", "FailIndex"):
            code = match.container.exit_code if match.container else "?"
            codes = format_value("retriable-exit-codes", policy.retriable_exit_codes)
            out.conflict(
                policy,
                "fail-non-retriable",
                f"your {where}.podFailurePolicy.rules[{match.index}] fails on exit code {code}, "
                f"which retriable-exit-codes ({codes}) says to retry",
                "contradiction",
            )
    if policy.ignore_disruptions:
        match = fp.evaluate(user_rules, PodFailure(conditions=((fp.DISRUPTION_TARGET, "True"),)))
        if match is not None and match.action != "Ignore":
            out.conflict(
                policy,
                "ignore-disruptions",
                f"your {where}.podFailurePolicy.rules[{match.index}] ({match.action}) matches "
                "disruptions first, so they would still not be ignored",
                "contradiction",
            )
    n = policy.non_spot_attempts
    if n > 0:
        attempts = (policy.backoff_limit or 0) + 1
        spot = ctx.config.spot_node_labels
        pinned = podspec.requires_spot(pod_spec, spot)
        if n > attempts:
            out.conflict(
                policy,
                "non-spot-attempts",
                f"{n} is more than the {attempts} attempts this Job has "
                f"(backoffLimit {policy.backoff_limit} + 1); accepted: 0 to {attempts}",
                "too-many-non-spot",
            )
            policy = with_setting(policy, "non-spot-attempts", Setting(0, Source.BUILTIN))
        elif not spot:
            out.conflict(
                policy,
                "non-spot-attempts",
                "this cluster's config defines no spotNodeLabels, so spot nodes cannot be avoided",
                "no-spot-labels",
            )
            policy = with_setting(policy, "non-spot-attempts", Setting(0, Source.BUILTIN))
        elif pinned:
            out.conflict(
                policy,
                "non-spot-attempts",
                f"the pod template requires spot nodes ({pinned}), so non-spot attempts "
                "could never be scheduled",
                "contradiction",
            )
            policy = with_setting(policy, "non-spot-attempts", Setting(0, Source.BUILTIN))
    template_meta = (spec.get("template") or {}).get("metadata")
    values, problems = parse_annotations(
        template_meta.get("annotations") if isinstance(template_meta, dict) else None,
        Scope.POD,
        where=f"{where}.template annotation",
    )
    out.problems.extend(problems)
    if "attempt" in values:
        out.problems.append(
            Problem(
                f"{where}.template annotation {PREFIX}attempt",
                "every pod of the Job would share it; set attempt on individual Pods only",
                "wrong-scope",
            )
        )
    for name, value in _pod_annotations(policy).items():
        own = values.get(name)
        if name in values and format_value(name, own) != value:
            out.problems.append(
                Problem(
                    f"{where}.template annotation {PREFIX}{name}",
                    f"{format_value(name, own)!r} contradicts the Job's resolved value {value!r}",
                    "contradiction",
                )
            )
    return policy


def _rules(spec: Mapping[str, Any]) -> list[Any]:
    policy = spec.get("podFailurePolicy")
    if isinstance(policy, dict) and isinstance(policy.get("rules"), list):
        return list(policy["rules"])
    return []


def _pod_annotations(policy: Policy) -> dict[str, str]:
    """What a pod of this Job needs to know about the policy, in annotation grammar."""
    values: dict[str, str] = {}
    if policy.non_spot_attempts > 0:
        values["backoff-limit"] = format_value("backoff-limit", policy.backoff_limit)
        values["non-spot-attempts"] = format_value("non-spot-attempts", policy.non_spot_attempts)
    if policy.error_propagation:
        values["error-propagation"] = format_value("error-propagation", policy.error_propagation)
    return values


def _apply(
    spec: dict[str, Any],
    template: dict[str, Any],
    pod_spec: dict[str, Any],
    policy: Policy,
    ctx: Context,
    out: Outcome,
    where: str,
) -> None:
    setting = policy.setting("backoff-limit")
    if setting.source in (Source.ANNOTATION, Source.NAMESPACE, Source.CLUSTER):
        before = spec.get("backoffLimit")
        if before != policy.backoff_limit:
            spec["backoffLimit"] = policy.backoff_limit
            out.changed(
                f"retry-policy: {where}.backoffLimit {before} -> {policy.backoff_limit} "
                f"({setting.describe('backoff-limit')})",
                setting,
            )
    ours = []
    if policy.ignore_disruptions:
        # First among ours: a preempted pod may exit 137 after its grace period, and must
        # be ignored before the exit-code rule could fail the Job for it.
        ours.append(
            (fp.ignore_disruptions_rule(), "ignore-disruptions", "Ignore on DisruptionTarget")
        )
    if policy.fail_non_retriable:
        codes = list(policy.retriable_exit_codes)
        ours.append(
            (
                fp.non_retriable_rule(policy.retriable_exit_codes),
                "fail-non-retriable",
                f"FailJob on exit codes NotIn {codes}",
            )
        )
    if ours:
        merged, added = fp.merge(_rules(spec), [rule for rule, _, _ in ours])
        if added:
            pfp = spec.get("podFailurePolicy")
            if not isinstance(pfp, dict):
                pfp = spec["podFailurePolicy"] = {}
            pfp["rules"] = merged
            added_keys = {fp.rule_key(r) for r in added}
            for rule, name, text in ours:
                if fp.rule_key(rule) in added_keys:
                    out.changed(
                        f"retry-policy: added podFailurePolicy rule {text} ({name})",
                        policy.setting(name),
                    )
            if spec.get("podReplacementPolicy") == "TerminatingOrFailed":
                spec["podReplacementPolicy"] = "Failed"
                out.changed(
                    f"retry-policy: {where}.podReplacementPolicy -> Failed "
                    "(required with a podFailurePolicy)"
                )
        out.problems.extend(fp.validate(spec, where))
    if policy.error_propagation:
        names = podspec.add_error_propagation(pod_spec, policy.error_propagation)
        if names:
            out.changed(
                "retry-policy: error-propagation env vars added to containers " + ", ".join(names),
                policy.setting("error-propagation"),
            )
    pod_values = _pod_annotations(policy)
    if pod_values:
        meta = template.get("metadata")
        if not isinstance(meta, dict):
            meta = template["metadata"] = {}
        copied = [podspec.set_annotation(meta, PREFIX + k, v) for k, v in pod_values.items()]
        if any(copied) and policy.non_spot_attempts:
            n, attempts = policy.non_spot_attempts, (policy.backoff_limit or 0) + 1
            out.changed(
                f"retry-policy: the last {n} of {attempts} attempts will run on non-spot nodes",
                policy.setting("non-spot-attempts"),
            )
