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
  restarting it. A TrainJob's initializer Jobs get none of the policy (``initializers``);
  the rule then targets the other Jobs.
- ``non-spot-attempts``: JobSet pods carry ``jobset.sigs.k8s.io/restart-attempt``; pods
  count runs against maxRestarts (see ``job.Budget`` and ``pod.attempt_of``).
- ``error-propagation`` is denied: no Flyte plugin reads the error files it would
  make a JobSet's pods write (``podspec.NOT_A_PYTORCHJOB``).

The child Jobs are admitted on their own, but the Job mutator leaves them alone (their
policy was applied here, where ``backoff-limit`` means restarts), which is why
retry-policy annotations on a replicated Job's template are denied: they would be ignored.

A user's rule applies, as JobSet decides (``ruleIsApplicable`` in
pkg/controllers/failure_policy.go), when the failed Job's reason is one of its reasons, its
message matches one of its ``onJobFailureMessagePatterns`` (Go regexps), and its
replicated Job is a target; empty lists match anything. Our FailJob rule fails a Job with
reason PodFailurePolicy and the Job controller's message ``Container <name> for pod
<namespace>/<pod> failed with exit code <code> matching FailJob rule at index <i>``
(``matchPodFailurePolicy``): ``_check_rules`` asks ``webhook.kube.goregexp`` whether a pattern
can match that message for some pod name, and takes a pattern it cannot read as Go does
to match.

``restartStrategy: InPlaceRestart`` (alpha gate, JobSet >= 0.11): JobSet's webhook requires
every child ``backoffLimit`` to be 2147483647, and every failure of a pod restarts the whole
set in place (the failed pod is recreated), counted against maxRestarts through the pods'
in-place-restart-attempt (``exceededMaxRestarts`` in pkg/controllers/in_place_restart.go).
So ``backoff-limit: B`` is still maxRestarts B (B + 1 runs), the children get 2147483647
instead of 0 (not a retry budget there: guard rails do not apply to it), and
``ignore-disruptions`` (a disrupted pod still restarts the set, counted) and
``non-spot-attempts`` (pods restart on their nodes and keep their restart-attempt) cannot
be honoured.

A user's rule with an ...AndIgnoreMaxRestarts action on the reasons a child Job fails with
when its pods run out of retries (BackoffLimitExceeded, FailedIndexes,
MaxFailedIndexesExceeded) restarts the set without counting: then no ``backoff-limit``
bounds it, and one we would write is denied (skipped when a default).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.kube import failurepolicy as fp
from webhook.kube import intent, jobcontroller, jobsetplacement
from webhook.kube.goregexp import Piece, Unsupported, Wild, compile_go
from webhook.kube.owned import deep_copy
from webhook.kube.wellknown import ANCESTOR_LABEL, JOBSET_GROUP, TRAINER_GROUP
from webhook.mutators import (
    Context,
    Outcome,
    controller_of,
    has_policy_annotations,
    items,
    mapping,
    register,
)
from webhook.mutators.job import (
    WRITTEN_SOURCES,
    WorkloadMutator,
    apply_job_spec,
    check_error_propagation,
    concurrent_pods,
    enforce_rail,
    get_path,
    keep_spec_limit,
    not_applicable,
    note_peers,
    our_rules,
    pod_count,
    resolve_count,
    resolve_limit,
    write_limit,
)
from webhook.plan import failureaware, inplace
from webhook.plan.model import LimitField, job_limit_field
from webhook.plan.record import AppliedRecord
from webhook.policy.config import GuardRails
from webhook.policy.model import APPLIED, INT32_MAX, PREFIX, Policy, Setting, Source, with_setting
from webhook.problems import Problem

MAX_RESTARTS = LimitField(("spec", "failurePolicy", "maxRestarts"), None, 0)
RULE_NAME = "retryPolicyFailNonRetriable"
POD_FAILURE_POLICY = "PodFailurePolicy"
#: The message a FailJob rule on exit codes fails a Job with, in words.
FAILJOB_SHAPE = jobcontroller.failjob_message(
    "<namespace>", "<pod>", "<i>", container="<name>", code="<code>"
)
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
IN_PLACE_RESTART = "InPlaceRestart"
#: The Job controller's condition messages for the reasons a child Job fails with when its
#: pods run out of retries (pkg/controller/job/job_controller.go).
BUDGET_MESSAGES = {
    "BackoffLimitExceeded": "Job has reached the specified backoff limit",
    "FailedIndexes": "Job has failed indexes",
    "MaxFailedIndexesExceeded": "Job has exceeded the specified maximal number of failed indexes",
}
IGNORING_ACTIONS = ("RestartJobSetAndIgnoreMaxRestarts", "RestartJobAndIgnoreMaxRestarts")
NOT_IN_PLACE = {
    "in-place-exit-codes": "with restartStrategy InPlaceRestart JobSet's own agent restarts "
    "its pods in place, and a container rule of ours would restart a container before the "
    "agent sees it fail",
    "ignore-disruptions": "with restartStrategy InPlaceRestart any pod that fails, a disrupted "
    "one too, restarts the whole set in place, and JobSet counts that against maxRestarts",
    "non-spot-attempts": "with restartStrategy InPlaceRestart its pods restart in place on their "
    "nodes and keep their jobset.sigs.k8s.io/restart-attempt, so the last attempts cannot be "
    "placed elsewhere",
    "attempt-env": "with restartStrategy InPlaceRestart its pods restart in place and keep "
    "the environment they were created with",
    "retry-delay": "with restartStrategy InPlaceRestart its pods restart in place, already "
    "scheduled: no new pod is made that a delay could hold back",
    "peer-disruptions": "with restartStrategy InPlaceRestart any pod that fails, a peer of a "
    "disrupted one too, restarts the whole set in place, and JobSet counts that against "
    "maxRestarts: no rule of a Job decides it",
}


#: Steps that fetch a TrainJob's data and model before the trainer runs (``dependsOn``):
#: the policy, written for the training, is not theirs.
INITIALIZER_STEPS = ("dataset-initializer", "model-initializer")


def our_rule(targets: Sequence[str] = ()) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "name": RULE_NAME,
        "action": "FailJobSet",
        "onJobFailureReasons": [POD_FAILURE_POLICY],
    }
    if targets:
        rule["targetReplicatedJobs"] = list(targets)
    return rule


def initializers(jobset: Mapping[str, Any]) -> list[int]:
    """Indexes of the replicated Jobs of a TrainJob's JobSet that initialize its dataset or
    model (their template's ``trainjob-ancestor-step`` label). They keep their own retries:
    the annotated policy speaks of the training (its exit codes, its budget of whole
    runs), and an initializer's download error should be retried by its own Job (by
    default 6 times), not fail the TrainJob at once nor cost a run with backoffLimit 0."""
    owner = controller_of(jobset.get("metadata"))
    group = str(mapping(owner).get("apiVersion") or "").rpartition("/")[0]
    if owner is None or owner.get("kind") != "TrainJob" or group != TRAINER_GROUP:
        return []
    return [
        index
        for index, rjob in enumerate(items(get_path(jobset, ("spec", "replicatedJobs"))))
        if mapping(get_path(rjob, ("template", "metadata", "labels"))).get(ANCESTOR_LABEL)
        in INITIALIZER_STEPS
    ]


def _initializers_note(names: Sequence[str]) -> str:
    return (
        f"retry-policy: initializers {', '.join(names)} keep their own retries; the policy "
        "is the trainer's"
    )


@register
class JobSetMutator(WorkloadMutator):
    group = JOBSET_GROUP
    kind = "JobSet"
    #: Whether a TrainJob's initializer Jobs are left out of the policy (``initializers``);
    #: off only to restore a JobSet made before they were (``restore``).
    scope_initializers = True

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
        policy = check_unsupported(policy, out)
        in_place = in_place_restart(jobset)
        for name, why in NOT_IN_PLACE.items():
            if in_place and policy.value(name):
                policy = not_applicable(policy, name, "JobSet", why, out)
        left_out = initializers(jobset) if self.scope_initializers else []
        indexes = [i for i in range(len(replicated)) if i not in left_out]
        scoped = [replicated[i] for i in indexes]
        # Our JobSet rule names the Jobs our rules are in when some are left out.
        targets = [str(r.get("name")) for r in scoped if isinstance(r, dict)] if left_out else []
        rules = get_path(jobset, ("spec", "failurePolicy", "rules"))
        if policy.fail_non_retriable:
            messages = failjob_messages(jobset, scoped, policy, ctx)
            policy = _check_rules(
                rules if isinstance(rules, list) else [], policy, out, messages, targets
            )
        if policy.non_spot_attempts:
            policy = _check_single_job_restarts(
                rules if isinstance(rules, list) else [], policy, out
            )
        if policy.oom_memory_factor is not None and not in_place:
            policy = _check_oom_restarts(
                rules if isinstance(rules, list) else [], scoped, policy, out
            )
        policy = resolve_limit(jobset, MAX_RESTARTS, policy, out)
        policy = enforce_rail(policy, MAX_RESTARTS, ctx, out)
        policy = _check_uncounted_restarts(
            jobset, rules if isinstance(rules, list) else [], policy, out
        )
        if not out.problems:
            write_limit(jobset, MAX_RESTARTS, policy, out)
        restarts = policy.backoff_limit or 0
        child_ctx = _without_rails(ctx) if in_place else ctx
        children = [
            _apply_replicated_job(jobset, index, policy, restarts, child_ctx, out, in_place)
            for index in indexes
        ]
        failing = [c for c in children if c is not None and c.fail_non_retriable]
        if not out.problems and failing:
            names = [r.get("name") for r in replicated if isinstance(r, dict)]
            _add_rule(jobset, policy, names, out, targets)
        if failing:
            note_peers(failing[0], _pods(jobset, indexes), out)
        if left_out:
            out.note(
                _initializers_note([str(mapping(replicated[i]).get("name")) for i in left_out])
            )
        if any(c is not None and c.count_disruptions for c in children):
            # The set's record says whether a Job template got our Count rule (``restore``).
            policy = with_setting(policy, "count-disruptions", Setting(True, Source.BUILTIN))
        _say_once(out)
        out.policies["spec"] = policy
        return policy

    def policy(self, jobset: Mapping[str, Any], ctx: Context, out: Outcome) -> Policy:
        """On UPDATE (only ``restore`` applies a policy then): a JobSet whose record says
        no Job template got the Count rule on DisruptionTarget (``countDisruptions``; made
        before that rule existed) gets none again, so that its rules come back exactly."""
        policy = super().policy(jobset, ctx, out)
        if ctx.operation == "UPDATE" and _made_without_count(jobset):
            policy = with_setting(policy, "count-disruptions", Setting(False, Source.BUILTIN))
        return policy

    def restore(self, jobset: dict[str, Any], old: Mapping[str, Any], ctx: Context) -> list[str]:
        """On UPDATE: what the webhook wrote at creation into the immutable failure policy
        (``failurePolicy``, and each replicated Job's budget, rules and restartPolicy),
        when the update left it out. The trainer server-side applies a TrainJob's JobSet
        again (on resume from suspension); what a mutating webhook adds on CREATE belongs
        to no field manager (managedFields are computed before admission), so it stays,
        except inside a list the applier owns whole: ``failurePolicy.rules`` and a
        ``podFailurePolicy``'s rules (atomic lists) come back as the runtime has them,
        and JobSet refuses any change there ("Value is immutable").

        The policy is applied again, to the update, as at creation (same annotations);
        the result is kept only when those fields then equal the old object's: never a
        new value, and never a denial."""
        if APPLIED not in mapping(mapping(old.get("metadata")).get("annotations")):
            return []
        if _ours(jobset) != _ours(old) or _frozen(jobset) == _frozen(old):
            return []  # a changed policy applies to new objects only; or nothing was reset
        candidate = deep_copy(jobset)
        outcome = self.mutate(candidate, ctx)
        if (outcome.problems or _frozen(candidate) != _frozen(old)) and initializers(jobset):
            # Made before a TrainJob's initializers were left out of the policy.
            candidate = deep_copy(jobset)
            outcome = _UNSCOPED.mutate(candidate, ctx)
        changed = ", ".join(_frozen_paths(jobset, old)) or "spec"
        if outcome.problems or _frozen(candidate) != _frozen(old):
            return [
                f"retry-policy: this update changes {changed} (immutable); the policy the "
                "JobSet was created with does not restore it, nothing was changed"
            ]
        jobset.clear()
        jobset.update(candidate)
        return [
            f"retry-policy: restored {changed} as the JobSet was created (immutable; this "
            "update left out what the webhook had added)"
        ]


class _Unscoped(JobSetMutator):
    scope_initializers = False


_UNSCOPED = _Unscoped()


def _pods(jobset: Mapping[str, Any], indexes: Sequence[int]) -> int:
    """Pods of these replicated Jobs that run at once: each Job's, times its replicas."""
    replicated = items(get_path(jobset, ("spec", "replicatedJobs")))
    return sum(
        pod_count(mapping(replicated[i]).get("replicas"), 1)
        * concurrent_pods(mapping(get_path(replicated[i], ("template", "spec"))))
        for i in indexes
    )


#: In each replicated Job, the fields the policy writes that JobSet keeps immutable.
FROZEN_JOB_FIELDS = (
    "backoffLimit",
    "backoffLimitPerIndex",
    "podFailurePolicy",
    "podReplacementPolicy",
)


def _made_without_count(jobset: Mapping[str, Any]) -> bool:
    """Whether the ``applied`` record has fail-non-retriable without ``countDisruptions``."""
    record = AppliedRecord.of(jobset)
    if record is None:
        return False
    return "failNonRetriable" in record and "countDisruptions" not in record


def _ours(obj: Mapping[str, Any]) -> dict[str, Any]:
    annotations = mapping(mapping(obj.get("metadata")).get("annotations"))
    return {k: v for k, v in annotations.items() if isinstance(k, str) and k.startswith(PREFIX)}


def _frozen(jobset: Mapping[str, Any]) -> dict[str, Any]:
    """The policy's part of what JobSet keeps immutable (``failurePolicy`` by CEL, the
    replicated Jobs by its webhook's ``ValidateUpdate``), by field path."""
    fields: dict[str, Any] = {"spec.failurePolicy": get_path(jobset, ("spec", "failurePolicy"))}
    for index, rjob in enumerate(items(get_path(jobset, ("spec", "replicatedJobs")))):
        name = mapping(rjob).get("name", index)
        spec = mapping(get_path(rjob, ("template", "spec")))
        where = f"spec.replicatedJobs[{name}].template.spec"
        for field in FROZEN_JOB_FIELDS:
            fields[f"{where}.{field}"] = spec.get(field)
        restart = get_path(spec, ("template", "spec", "restartPolicy"))
        fields[f"{where}.template.spec.restartPolicy"] = restart
    return fields


def _frozen_paths(jobset: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    new, before = _frozen(jobset), _frozen(old)
    paths = [*new, *(path for path in before if path not in new)]
    return [path for path in paths if new.get(path) != before.get(path)]


def check_unsupported(policy: Policy, out: Outcome) -> Policy:
    """What no JobSet can honour, whatever its spec (also checked on a TrainJob whose
    runtime is not known: its JobSet could not either)."""
    policy = check_error_propagation(policy, "JobSet", out)
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


def _outer_bound(jobset: Mapping[str, Any], ctx: Context) -> str | None:
    """What ends in-place restarts besides each replicated Job's deadline: a TrainJob's
    JobSet was checked at the TrainJob's admission, where its own deadline counts."""
    if ctx.outer_bound is not None:
        return ctx.outer_bound
    owner = controller_of(jobset.get("metadata"))
    if owner is not None and owner.get("kind") == "TrainJob":
        return "its TrainJob"
    return None


#: The Job controller's condition message for a Job past its activeDeadlineSeconds
#: (reason DeadlineExceeded; pkg/controller/job/job_controller.go).
DEADLINE_MESSAGE = "Job was active longer than specified deadline"


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
    ``_check_rules`` keeps your JobSet rules from restarting those past ours.)"""
    where = intent.dotted(path)
    fields = f"{where}.activeDeadlineSeconds (or the pod template's)"
    if outer is not None:
        return inplace.Bound(True, fields)
    rules = items(get_path(jobset, ("spec", "failurePolicy", "rules")))
    name = str(mapping(get_path(jobset, path[:3])).get("name"))
    pod_spec = mapping(get_path(job_spec, ("template", "spec")))
    whole = _uncounted(rules, name, "DeadlineExceeded", DEADLINE_MESSAGE)
    per_index = job_spec.get("backoffLimitPerIndex") is not None
    reasons = ["FailedIndexes"] if per_index else ["BackoffLimitExceeded"]
    if per_index and job_spec.get("maxFailedIndexes") is not None:
        reasons.append("MaxFailedIndexesExceeded")
    each = next(
        (found for r in reasons if (found := _uncounted(rules, name, r, BUDGET_MESSAGES[r]))),
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


def _uncounted(
    rules: Sequence[Any], name: str, reason: str, message: str
) -> tuple[int, str] | None:
    """The first of ``rules`` that applies to replicated Job ``name`` failed with ``reason``
    and ``message``, when it restarts without counting: its index and action. A rule
    whose pattern cannot be read is taken to apply, but not to take the failure from the
    rules after it."""
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict) or rule.get("action") not in ACTIONS:
            continue
        applies, _, why = _applies(rule, reason, {name: [[message]]})
        if not applies:
            continue
        if rule["action"] in IGNORING_ACTIONS:
            return index, str(rule["action"])
        if not why:
            return None
    return None


def in_place_restart(jobset: Mapping[str, Any]) -> bool:
    return get_path(jobset, ("spec", "failurePolicy", "restartStrategy")) == IN_PLACE_RESTART


def _without_rails(ctx: Context) -> Context:
    """``ctx`` without guard rails: under InPlaceRestart a child's backoffLimit must be
    2147483647 and is no retry budget (maxRestarts is, and was checked against them)."""
    namespaces = {
        ns: dataclasses.replace(o, guard_rails={}) for ns, o in ctx.config.namespaces.items()
    }
    config = dataclasses.replace(ctx.config, guard_rails=GuardRails(), namespaces=namespaces)
    return dataclasses.replace(ctx, config=config)


def _apply_replicated_job(
    jobset: dict[str, Any],
    index: int,
    policy: Policy,
    restarts: int,
    ctx: Context,
    out: Outcome,
    in_place: bool = False,
) -> Policy | None:
    """Apply the policy to one replicated Job template; return its resolved policy."""
    path = ("spec", "replicatedJobs", index, "template", "spec")
    job_spec = get_path(jobset, path)
    if not isinstance(job_spec, dict):
        out.problems.append(Problem(intent.dotted(path), "a replicated Job needs a Job spec"))
        return None
    child = _child_policy(jobset, path, job_spec, policy, INT32_MAX if in_place else 0)
    reverted = _restart_never(jobset, path, job_spec, child)
    outer = _outer_bound(jobset, ctx)
    resolved = apply_job_spec(
        jobset,
        path,
        job_spec,
        child,
        ctx,
        out,
        restarts=restarts,
        defaulted=False,
        outer_bound=outer,
        in_place_bound=in_place_bound(jobset, path, job_spec, outer),
    )
    _note_leader_first(jobset, index, resolved, out)
    if reverted is None:
        return resolved
    rp_path = intent.dotted((*path, "template", "spec", "restartPolicy"))
    shown = f" {reverted}" if reverted else ""
    if resolved.fail_non_retriable or resolved.ignore_disruptions:
        name = "fail-non-retriable" if resolved.fail_non_retriable else "ignore-disruptions"
        out.changed(
            f"retry-policy: {rp_path}{shown} -> Never (for the podFailurePolicy)",
            resolved.setting(name),
        )
    elif resolved.in_place_exit_codes:
        out.changed(
            f"retry-policy: {rp_path}{shown} -> Never (for in-place restarts)",
            resolved.setting("in-place-exit-codes"),
        )
    else:
        # Nothing needs it after all (an admin default was skipped): leave it as it was.
        pod_spec = job_spec["template"]["spec"]
        if reverted:
            pod_spec["restartPolicy"] = reverted
        else:
            pod_spec.pop("restartPolicy", None)
    return resolved


def _note_leader_first(jobset: Mapping[str, Any], index: int, policy: Policy, out: Outcome):
    """Under JobSet's exclusive placement a gated leader keeps its Job's followers from
    being created (``webhook.kube.jobsetplacement``): say so where retry-delay is asked."""
    template = mapping(get_path(jobset, ("spec", "replicatedJobs", index, "template")))
    topology = jobsetplacement.exclusive_of(jobset, template)
    if topology is None or policy.retry_delay is None or out.problems:
        return
    name = get_path(jobset, ("spec", "replicatedJobs", index, "name"))
    out.note(
        f"retry-policy: replicated Job {name} is placed exclusively per {topology} "
        f"({jobsetplacement.EXCLUSIVE}): JobSet creates a Job's other pods only once its "
        "leader (index 0) is scheduled, so while retry-delay holds a leader back they are "
        "refused (FailedCreate, tried again up to a minute apart) and start after it"
    )


def _child_policy(
    jobset: Mapping[str, Any],
    path: tuple[str | int, ...],
    job_spec: Mapping[str, Any],
    policy: Policy,
    ours: int = 0,
) -> Policy:
    """The policy of one replicated Job: the JobSet's, with the child's own budget.

    A budget the user wrote in the template is kept; otherwise, when the JobSet's
    ``backoff-limit`` was asked for, the child gets ``ours``: 0 so that every counted
    failure is one JobSet restart (2147483647 under InPlaceRestart, where JobSet requires
    it and every pod failure restarts the set anyway); otherwise the child keeps the
    Kubernetes default.
    """
    field = job_limit_field(path, job_spec, defaulted=False)
    current = get_path(jobset, field.path)
    if intent.explicit(jobset, field.path, current, field.api_default):
        setting = Setting(current, Source.SPEC, field.name)
    elif policy.setting("backoff-limit").source in WRITTEN_SOURCES:
        asked = policy.setting("backoff-limit")
        setting = Setting(ours, asked.source, asked.detail)
    else:
        setting = Setting(None, Source.BUILTIN)
    return with_setting(policy, "backoff-limit", setting)


def _restart_never(
    jobset: Mapping[str, Any], path: tuple[str | int, ...], job_spec: dict[str, Any], policy: Policy
) -> str | None:
    """Set the pod template's ``restartPolicy: Never`` (required by a podFailurePolicy and
    by in-place restart rules) when the user did not write one; JobSet's own webhook would
    default it to OnFailure.

    Returns the previous value ("" when unset), or ``None`` when nothing was changed.
    """
    if not (policy.fail_non_retriable or policy.ignore_disruptions or policy.in_place_exit_codes):
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


def pattern_applies(pattern: Any, message: Sequence[Piece]) -> tuple[bool, str]:
    """Whether a message pattern can match ``message`` (``anyMatchFound``), and, when it
    cannot be read as Go's regexp reads it, why (it is then taken to match)."""
    try:
        return compile_go(str(pattern)).search(message), ""
    except Unsupported as err:
        return True, str(err)


def _applies(
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


def _covers(rule: Any, targets: Sequence[str] = ()) -> bool:
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


def _check_rules(
    rules: list[Any],
    policy: Policy,
    out: Outcome,
    messages: Mapping[str, Sequence[Sequence[Piece]]],
    targets: Sequence[str] = (),
) -> Policy:
    """The user's rules come first (first match wins): one that restarts on a
    podFailurePolicy failure with our FailJob rule's message would keep ours from firing."""
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        if rule.get("name") == RULE_NAME and not _covers(rule, targets):
            out.problems.append(
                Problem(
                    f"spec.failurePolicy.rules[{index}].name",
                    f"{RULE_NAME} is the name of the rule this webhook adds; rename your rule",
                    "contradiction",
                )
            )
            return policy
        if _covers(rule, targets):
            return policy
        if rule.get("action") == "FailJobSet":
            continue
        applies, pattern, why = _applies(rule, POD_FAILURE_POLICY, messages)
        if applies:
            how = ""
            if pattern and why:
                how = f" (its pattern /{pattern}/ is taken to match: {why})"
            elif pattern:
                how = f" (its pattern /{pattern}/ matches the Job's message: {FAILJOB_SHAPE})"
            out.conflict(
                policy,
                "fail-non-retriable",
                f"your spec.failurePolicy.rules[{index}] ({rule.get('action')}) matches Jobs "
                f"failed by their podFailurePolicy first{how}, so a non-retriable exit would "
                "not fail the JobSet",
                "contradiction",
            )
            return with_setting(
                policy,
                "fail-non-retriable",
                Setting(False, policy.setting("fail-non-retriable").source),
            )
    return policy


def _check_uncounted_restarts(
    jobset: Mapping[str, Any], rules: list[Any], policy: Policy, out: Outcome
) -> Policy:
    """A rule of the user's that restarts, uncounted, a Job whose pods ran out of retries
    would leave the ``backoff-limit`` we write (maxRestarts) nothing to bound."""
    if policy.setting("backoff-limit").source not in WRITTEN_SOURCES:
        return policy
    replicated = get_path(jobset, ("spec", "replicatedJobs"))
    names = {str(r.get("name")) for r in replicated or [] if isinstance(r, dict)}
    for reason, message in BUDGET_MESSAGES.items():
        left = set(names)  # replicated Jobs whose such failures no earlier rule has taken
        for index, rule in enumerate(rules):
            if not left:
                break
            if not isinstance(rule, dict) or rule.get("action") not in ACTIONS:
                continue
            applies, _, why = _applies(rule, reason, {name: [[message]] for name in left})
            if not applies:
                continue
            if rule["action"] in IGNORING_ACTIONS:
                out.conflict(
                    policy,
                    "backoff-limit",
                    f"{policy.backoff_limit} (maxRestarts) would bound nothing: your "
                    f"spec.failurePolicy.rules[{index}] ({rule['action']}) restarts without "
                    f"counting when a Job's pods run out of retries ({reason}), so the set "
                    "would restart forever; drop the rule or backoff-limit",
                    "contradiction",
                )
                return keep_spec_limit(jobset, MAX_RESTARTS, policy)
            targets = rule.get("targetReplicatedJobs") or list(names)
            if not why and isinstance(targets, list):
                left -= {str(t) for t in targets}
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


def _check_oom_restarts(
    rules: list[Any], replicated: list[Any], policy: Policy, out: Outcome
) -> Policy:
    """After an OOM kill the child Job fails once its budget is used (by default 0 here:
    at once; reason FailedIndexes with a per-index budget), and the JobSet must restart
    it for the next run to get more memory: the first of your rules that applies to that
    failure (``_applies``, as ``ruleIsApplicable`` decides) must not be FailJobSet."""
    for rjob in replicated:
        name = rjob.get("name") if isinstance(rjob, dict) else None
        spec = get_path(rjob, ("template", "spec"))
        per_index = isinstance(spec, dict) and spec.get("backoffLimitPerIndex") is not None
        reason = "FailedIndexes" if per_index else "BackoffLimitExceeded"
        messages: dict[str, list[list[Piece]]] = {str(name): [[BUDGET_MESSAGES[reason]]]}
        for index, rule in enumerate(rules):
            if not isinstance(rule, dict) or not _applies(rule, reason, messages)[0]:
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


def _add_rule(
    jobset: dict[str, Any],
    policy: Policy,
    names: list[Any],
    out: Outcome,
    targets: Sequence[str] = (),
) -> None:
    spec = jobset["spec"]
    failure_policy = spec.get("failurePolicy")
    if not isinstance(failure_policy, dict):
        failure_policy = spec["failurePolicy"] = {}
    rules = failure_policy.get("rules")
    if not isinstance(rules, list):
        rules = []
    ours = our_rule(targets)
    if any(_covers(rule, targets) for rule in rules):
        out.wrote(ours, "fail-non-retriable", added=False)  # (ours, when an earlier run's)
        return
    out.wrote(ours, "fail-non-retriable")
    failure_policy["rules"] = [*rules, ours]
    on = f" of {', '.join(targets)}" if targets else ""
    out.changed(
        f"retry-policy: added failurePolicy rule {RULE_NAME} (FailJobSet on "
        f"{POD_FAILURE_POLICY}{on})",
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
