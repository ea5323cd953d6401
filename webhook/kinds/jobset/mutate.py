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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.kinds import audit
from webhook.kinds.base import JobSpecs
from webhook.kinds.jobset.rules import (
    MAX_RESTARTS,
    add_peer_rule,
    add_rule,
    check_oom_restarts,
    check_rules,
    check_single_job_restarts,
    check_uncounted_restarts,
    failjob_messages,
    in_place_bound,
    validate_rules,
)
from webhook.kinds.jobspec import apply_job_spec
from webhook.kinds.workload import (
    PEERS_ADVICE,
    PEERS_CODE_ONLY,
    WRITTEN_SOURCES,
    WorkloadMutator,
    check_error_propagation,
    concurrent_pods,
    enforce_rail,
    get_path,
    not_applicable,
    note_peers,
    pod_count,
    resolve_limit,
    write_limit,
)
from webhook.kube import intent, jobsetplacement
from webhook.kube.defaulting import INT32_MAX
from webhook.kube.objects import controller_of, items, mapping
from webhook.kube.owned import deep_copy
from webhook.kube.wellknown import JOBSET_GROUP
from webhook.plan.audit import AUDITED
from webhook.plan.model import job_limit_field
from webhook.plan.outcome import Context, Outcome
from webhook.plan.policies import asks_for_policy, has_policy_annotations, workload_policy
from webhook.plan.record import AppliedRecord
from webhook.policy.model import APPLIED, PREFIX, Policy, Setting, Source, with_setting
from webhook.problems import Problem

#: What JobSet's own webhook writes into a replicated Job's pod template when it is unset.
JOBSET_DEFAULT_RESTART_POLICY = "OnFailure"


IN_PLACE_RESTART = "InPlaceRestart"


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
    "free-categories": "with restartStrategy InPlaceRestart any pod that fails restarts the "
    "whole set in place, and JobSet counts that against maxRestarts: no rule of a Job "
    "decides it, whatever its category",
    "fail-categories": "with restartStrategy InPlaceRestart any pod that fails restarts the "
    "whole set in place: no rule of a Job decides it, whatever its category",
    "max-free-failures": "with restartStrategy InPlaceRestart no failure is free (free-categories)",
}


@dataclass(frozen=True)
class Owner:
    """What a JobSet's controller owner of another kind (its maker: a TrainJob's trainer)
    changes about it, as that kind declares it (``owned_by``), so that this folder names
    no owner."""

    #: The owner's API group (its kind is the key it is declared under).
    group: str
    #: Replicated Jobs whose template's ``steps_label`` is one of ``own_steps`` keep their
    #: own retries (``initializers``), and why, in ``explain``'s words.
    steps_label: str
    own_steps: tuple[str, ...]
    own_steps_origin: str
    #: What ends in-place restarts besides the JobSet's own deadlines: as admission says
    #: it, and as ``explain`` does.
    bound: str
    bound_explained: str
    #: Whether an owner admitted as written in a namespace that audits (nobody opted in)
    #: has its JobSet audited at the JobSet's admission too (``owner_audited``).
    audited_with_it: bool = False


#: The kinds that own a JobSet and what they change about it, by kind (``owned_by``).
OWNERS: dict[str, Owner] = {}


def owned_by(kind: str, owner: Owner) -> None:
    """Declare what a JobSet whose controller owner is a ``kind`` gets (that kind's folder
    declares it, as it is loaded with the kinds' list)."""
    OWNERS[kind] = owner


def owner_of(jobset: Mapping[str, Any]) -> tuple[Owner, str] | None:
    """The declared owner of ``jobset`` by its controller owner's kind, with the
    ``apiVersion`` that reference names (the group is checked where it matters)."""
    ref = controller_of(mapping(jobset.get("metadata")))
    owner = OWNERS.get(str(ref.get("kind"))) if ref is not None else None
    if ref is None or owner is None:
        return None
    return owner, str(ref.get("apiVersion") or "")


def initializers(jobset: Mapping[str, Any]) -> list[int]:
    """Indexes of the replicated Jobs of a JobSet whose owner keeps them out of the policy
    (a TrainJob's that initialize its dataset or model: their template's
    ``trainjob-ancestor-step`` label). They keep their own retries: the annotated policy
    speaks of the training (its exit codes, its budget of whole runs), and an
    initializer's download error should be retried by its own Job (by default 6 times),
    not fail the TrainJob at once nor cost a run with backoffLimit 0."""
    found = owner_of(jobset)
    if found is None or found[1].rpartition("/")[0] != found[0].group:
        return []
    owner = found[0]
    return [
        index
        for index, rjob in enumerate(items(get_path(jobset, ("spec", "replicatedJobs"))))
        if mapping(get_path(rjob, ("template", "metadata", "labels"))).get(owner.steps_label)
        in owner.own_steps
    ]


def _initializers_note(names: Sequence[str]) -> str:
    return (
        f"retry-policy: initializers {', '.join(names)} keep their own retries; the policy "
        "is the trainer's"
    )


class JobSetMutator(WorkloadMutator):
    group = JOBSET_GROUP
    kind = "JobSet"
    multikueue = True
    #: Whether a TrainJob's initializer Jobs are left out of the policy (``initializers``);
    #: off only to restore a JobSet made before they were (``restore``).
    scope_initializers = True

    def applies(self, jobset: Mapping[str, Any], ctx: Context) -> bool:
        replicated = get_path(jobset, ("spec", "replicatedJobs"))
        return (
            super().applies(jobset, ctx)
            or owner_audited(jobset, ctx)
            or any(
                # To deny them: the child Jobs would ignore policy annotated there.
                has_policy_annotations(get_path(rjob, ("template", "metadata")))
                for rjob in (replicated if isinstance(replicated, list) else [])
            )
        )

    def apply(self, jobset: dict[str, Any], policy: Policy, ctx: Context, out: Outcome) -> Policy:
        replicated = get_path(jobset, ("spec", "replicatedJobs"))
        if not isinstance(replicated, list) or not replicated:
            out.problems.append(
                Problem("spec.replicatedJobs", "a JobSet needs at least one replicated Job")
            )
            return policy
        _check_child_annotations(replicated, out)
        rules = get_path(jobset, ("spec", "failurePolicy", "rules"))
        # JobSet's webhook refuses these whatever we write: said here, with every problem.
        out.problems.extend(validate_rules(rules if isinstance(rules, list) else [], replicated))
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
        if policy.fail_non_retriable:
            messages = failjob_messages(jobset, scoped, policy, ctx)
            policy = check_rules(
                rules if isinstance(rules, list) else [], policy, out, messages, targets
            )
        if policy.non_spot_attempts:
            policy = check_single_job_restarts(
                rules if isinstance(rules, list) else [], policy, out
            )
        if policy.oom_memory_factor is not None and not in_place:
            policy = check_oom_restarts(
                rules if isinstance(rules, list) else [], scoped, policy, out
            )
        policy = resolve_limit(jobset, MAX_RESTARTS, policy, out)
        policy = enforce_rail(policy, MAX_RESTARTS, ctx, out)
        policy = check_uncounted_restarts(
            jobset, rules if isinstance(rules, list) else [], policy, out
        )
        if not out.problems:
            write_limit(jobset, MAX_RESTARTS, policy, out)
        restarts = policy.backoff_limit or 0
        child_ctx = audit.without_rails(ctx) if in_place else ctx
        children = [
            _apply_replicated_job(jobset, index, policy, restarts, child_ctx, out, in_place)
            for index in indexes
        ]
        failing = [c for c in children if c is not None and c.fail_non_retriable]
        categories = [c for c in children if c is not None and c.fail_categories]
        if not out.problems and (failing or categories):
            name = "fail-non-retriable" if failing else "fail-categories"
            add_rule(jobset, policy, replicated, out, targets, name)
        peers = next((c.peer_disruptions for c in children if c and c.peer_disruptions), None)
        if not out.problems and peers is not None and not in_place:
            add_peer_rule(jobset, policy, peers, replicated, out)
        if failing:
            advice = PEERS_CODE_ONLY if in_place else PEERS_ADVICE
            note_peers(failing[0], _pods(jobset, indexes), out, advice)
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

    def job_specs(self, jobset: Mapping[str, Any]) -> JobSpecs:
        replicated = get_path(jobset, ("spec", "replicatedJobs"))
        return [
            (
                f"spec.replicatedJobs[{rjob.get('name')}].template.spec",
                ("spec", "replicatedJobs", i, "template", "spec"),
            )
            for i, rjob in enumerate(replicated if isinstance(replicated, list) else [])
            if isinstance(rjob, dict)
        ]

    def policy(self, jobset: Mapping[str, Any], ctx: Context, out: Outcome) -> Policy:
        """On UPDATE (only ``restore`` applies a policy then): a JobSet whose record says
        no Job template got the Count rule on DisruptionTarget (``countDisruptions``; made
        before that rule existed) gets none again, so that its rules come back exactly."""
        if owner_audited(jobset, ctx):
            policy, problems = workload_policy(jobset.get("metadata"), ctx, live=True)
            out.problems.extend(problems)
            return policy
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
        if _our_annotations(jobset) != _our_annotations(old) or _frozen(jobset) == _frozen(old):
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


def owner_audited(jobset: Mapping[str, Any], ctx: Context) -> bool:
    """Whether ``jobset`` is one a trainer made for a TrainJob nobody opted in, in a
    namespace that audits: the TrainJob was admitted as written, carrying no defaults
    (``TrainJobMutator._audit``), so this admission audits the namespace's config, as
    the TrainJob's did, on the JobSet's metadata only (its record and label, which the
    controller's replay reads), never denying it. Not when its runtime's template asks
    for a policy: that is an opt-in, judged as always."""
    meta = mapping(jobset.get("metadata"))
    found = owner_of(jobset)
    return (
        found is not None
        and found[0].audited_with_it
        and found[1].startswith(found[0].group + "/")
        and not asks_for_policy(meta)
        and ctx.config.rollout_of(ctx.namespace) == AUDITED
        and ctx.config.affects_unannotated(ctx.namespace)
    )


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


def _our_annotations(obj: Mapping[str, Any]) -> dict[str, Any]:
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
    fails = policy.fail_non_retriable or policy.fail_categories
    if fails and policy.on_non_retriable == "fail-index":
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
    found = owner_of(jobset)
    return found[0].bound if found is not None else None


def in_place_restart(jobset: Mapping[str, Any]) -> bool:
    return get_path(jobset, ("spec", "failurePolicy", "restartStrategy")) == IN_PLACE_RESTART


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
    rule_keys = ("fail-non-retriable", "ignore-disruptions", "fail-categories", "free-categories")
    asked = [key for key in rule_keys if resolved.asks(key)]
    if asked:
        name = asked[0]
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
    rules = policy.fail_non_retriable or policy.ignore_disruptions or policy.in_place_exit_codes
    if not (rules or policy.free_categories or policy.fail_categories):
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
