"""What every workload kind's mutator shares: ``WorkloadMutator`` (skip what the policy
cannot touch, resolve the policy, record what was applied), and the retry budget field of
any kind.

The ``LimitField`` helpers map ``backoff-limit`` onto whichever field holds a kind's
retry budget (``backoffLimit``, ``backoffLimitPerIndex``, a JobSet's ``maxRestarts``, a
RayJob's ``backoffLimit``, a PyTorchJob's ``runPolicy.backoffLimit``) with one rule for
all of them: an annotation wins and contradicting an explicit spec value is denied, a
value the user wrote beats admin defaults, a value the API server defaulted does not,
and the guard rail applies to the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.kinds import audit
from webhook.kinds.base import JobSpecs, UpdateCheck
from webhook.kube import intent, podspec
from webhook.kube.objects import get_path, mapping
from webhook.kube.owned import ALL, Owned
from webhook.plan.audit import AuditRecord
from webhook.plan.model import LimitField
from webhook.plan.outcome import Context, Outcome
from webhook.plan.policies import affected_unannotated, has_policy_annotations, workload_policy
from webhook.plan.record import AppliedRecord
from webhook.policy.model import (
    BUILTIN,
    PREFIX,
    Policy,
    Scope,
    Setting,
    Source,
    parse_annotations,
    with_setting,
)
from webhook.problems import Problem

#: Sources whose values the webhook writes into the spec (the user's own spec is kept).
WRITTEN_SOURCES = (Source.ANNOTATION, Source.NAMESPACE, Source.CLUSTER)


class WorkloadMutator:
    """What every workload mutator does around its kind's own part (``apply``): skip
    objects the policy cannot touch, resolve the policy (annotations over admin defaults),
    and record what was applied. Subclasses set ``group`` and ``kind`` and are registered
    in their kind's ``KindSpec`` (``kinds.registry``); ``applies`` and ``mutate`` are the
    interface the engine calls."""

    group = ""
    kind = ""
    enforce_applied = True
    #: What ``mutate`` may write (``webhook.kube.owned``); ``ALL``: anything, a full copy.
    owns: Owned = ALL
    remember = True
    reevaluate_on_update: tuple[tuple[str, ...], ...] = ()
    #: Whether MultiKueue copies this kind to workers, where its copy is left alone
    #: (``kinds.audit.multikueue_copy``): Kueue's Job and JobSet adapters.
    multikueue = False

    def applies(self, obj: Mapping[str, Any], ctx: Context) -> bool:
        metadata = obj.get("metadata")
        return has_policy_annotations(metadata) or affected_unannotated(metadata, ctx)

    def mutate(self, obj: dict[str, Any], ctx: Context) -> Outcome:
        out = Outcome()
        if not self.applies(obj, ctx):
            return out
        origin = audit.multikueue_copy(obj) if self.multikueue else None
        if origin is not None:
            out.note(audit.multikueue_note(self.kind, origin))
            return out
        policy = self.policy(obj, ctx, out)
        trial = audit.Trial.start(obj, policy, ctx)
        run = ctx
        if trial is not None:
            policy = audit.without_defaults(policy)
            run = trial.context(ctx)
        policy = self.apply(obj, policy, run, out)
        # (An earlier admission's record counts: a reinvocation may have nothing to add.)
        applied = finish(obj, policy, out) or AppliedRecord.of(obj) is not None
        if out.problems:
            return out
        record = trial.record(self, obj, ctx, out) if trial is not None else None
        out.audited = record
        if record is not None:
            out.changed(audit.audit_text(record, audit.rollout_where(ctx)))
        self.label(obj, record, applied, out)
        return out

    def label(
        self, obj: dict[str, Any], record: AuditRecord | None, applied: bool, out: Outcome
    ) -> None:
        """The audit record and the ``managed`` label (``kinds.audit.write``)."""
        audit.write(obj.get("metadata"), record, applied, out)

    def job_specs(self, obj: Mapping[str, Any]) -> JobSpecs:
        """The JobSpecs of ``obj`` an audit record describes (none: a kind without)."""
        return []

    def policy(self, obj: Mapping[str, Any], ctx: Context, out: Outcome) -> Policy:
        """The object's annotations over namespace and cluster defaults."""
        policy, problems = workload_policy(obj.get("metadata"), ctx)
        out.problems.extend(problems)
        return policy

    def apply(self, obj: dict[str, Any], policy: Policy, ctx: Context, out: Outcome) -> Policy:
        """Check and apply ``policy`` to this kind; return it as resolved against the spec."""
        raise NotImplementedError

    def budget_field(self, obj: Mapping[str, Any]) -> LimitField | None:
        """Where this kind keeps a retry budget that may be changed after creation (its
        UPDATE is checked: ``check_update``); ``None`` when there is none."""
        return None

    def check_update(self, obj: Mapping[str, Any], old: Mapping[str, Any]) -> UpdateCheck:
        """On UPDATE: a changed retry budget must still agree with the object's own
        ``backoff-limit`` annotation, as it must at creation."""
        field = self.budget_field(obj)
        if field is None:
            return [], [], set()
        return check_budget_update(obj, old, field)


def finish(obj: dict[str, Any], policy: Policy, out: Outcome) -> bool:
    """Record what was applied, unless the object is denied anyway; whether any setting
    was (the ``managed`` label's ``enforce``)."""
    if out.problems:
        return False
    if out.changes or policy.active:
        # Bookkeeping, not a change worth a warning of its own.
        previous = AppliedRecord.of(obj)
        record = AppliedRecord.of_policy(policy, out.origins(previous))
        record.write(obj.get("metadata"), previous)
        return True
    return False


#: What an UPDATE check finds: problems (the update is denied), warnings, and the names
#: of changed annotations that now describe this object (not only objects made later).


def check_budget_update(
    obj: Mapping[str, Any], old: Mapping[str, Any], field: LimitField
) -> UpdateCheck:
    """A budget field changed by an UPDATE against the object's ``backoff-limit``
    annotation: they must agree (change both, or remove the annotation), or the
    annotation and ``retry-policy.dev/applied`` would promise a budget the controller no
    longer enforces."""
    new, before = get_path(obj, field.path), get_path(old, field.path)
    if new == before:
        return [], [], set()
    values, _ = parse_annotations(mapping(obj.get("metadata")).get("annotations"), Scope.WORKLOAD)
    if "backoff-limit" not in values:
        return [], [], set()
    effective = new if isinstance(new, int) else field.absent
    if values["backoff-limit"] == effective:
        return [], [], {"backoff-limit"}
    problem = Problem(
        f"annotation {PREFIX}backoff-limit",
        f"{values['backoff-limit']} contradicts {field.name}: {new} (changed from {before}); "
        "change the annotation with it, or remove the annotation",
        "contradiction",
    )
    return [problem], [], set()


def set_path(obj: dict[str, Any], path: Sequence[str | int], value: Any) -> bool:
    """Set a value, creating missing (or null) parent mappings on the way; ``False`` when
    a parent is of another type (a value there is the user's, never replaced)."""
    *parents, last = path
    node: Any = obj
    for part in parents:
        if not _holds(node, part):
            return False
        child = node[part] if isinstance(part, int) else node.get(part)
        if child is None:
            child = node[part] = {}
        node = child
    if not _holds(node, last):
        return False
    node[last] = value
    return True


def _holds(node: Any, part: str | int) -> bool:
    if isinstance(part, int):
        return isinstance(node, list) and 0 <= part < len(node)
    return isinstance(node, dict)


def resolve_limit(
    obj: Mapping[str, Any], field: LimitField, policy: Policy, out: Outcome
) -> Policy:
    """Settle ``backoff-limit`` against ``field``, telling written values from defaulted ones."""
    current = get_path(obj, field.path)
    if current is not None and type(current) is not int:  # (a bool is not a count either)
        # Only a file can say this (the API server refuses it before admission): dry-run.
        out.problems.append(
            Problem(
                intent.dotted(field.path),
                f"{current!r} is not a whole number; accepted: a count such as 3",
                "invalid-spec",
            )
        )
        return policy
    wrote = intent.explicit(obj, field.path, current, field.api_default)
    layered = policy.setting("backoff-limit")
    if layered.source is Source.ANNOTATION:
        if wrote and current != layered.value:
            out.problems.append(
                Problem(
                    f"annotation {PREFIX}backoff-limit",
                    f"{layered.value} contradicts {field.name}: {current} in your spec; "
                    "remove one of them or make them equal",
                    "contradiction",
                )
            )
        return policy
    if wrote and current != layered.value:
        return with_setting(policy, "backoff-limit", Setting(current, Source.SPEC, field.name))
    if layered.value is not None:
        return policy
    value = current if isinstance(current, int) else field.absent
    return with_setting(policy, "backoff-limit", Setting(value, Source.KUBERNETES))


def keep_spec_limit(obj: Mapping[str, Any], field: LimitField, policy: Policy) -> Policy:
    """``policy`` with ``backoff-limit`` back to what the spec holds: a budget the webhook
    must not write after all (a default skipped by a conflict)."""
    current = get_path(obj, field.path)
    value = current if isinstance(current, int) else None
    return with_setting(policy, "backoff-limit", Setting(value, Source.KUBERNETES))


def enforce_rail(policy: Policy, field: LimitField, ctx: Context, out: Outcome) -> Policy:
    """``guardRails.maxBackoffLimit``: deny a budget someone asked for above it; lower one
    that nobody asked for (an API default) to it."""
    rails = ctx.config.rails(ctx.namespace)
    limit = policy.backoff_limit
    if rails.max_backoff_limit is None or limit is None or limit <= rails.max_backoff_limit:
        return policy
    setting = policy.setting("backoff-limit")
    if setting.source in (Source.KUBERNETES, Source.BUILTIN):
        return with_setting(
            policy,
            "backoff-limit",
            Setting(rails.max_backoff_limit, Source.CLUSTER, "(guardRails.maxBackoffLimit)"),
        )
    subject = (
        f"annotation {PREFIX}backoff-limit"
        if setting.source is Source.ANNOTATION
        else f"{field.name} ({setting.describe()})"
    )
    out.problems.append(
        Problem(
            subject,
            f"{limit} is above this cluster's limit; accepted: 0 to "
            f"{rails.max_backoff_limit} (guardRails.maxBackoffLimit)",
            "guard-rail",
        )
    )
    return policy


def write_limit(obj: Any, field: LimitField, policy: Policy, out: Outcome) -> None:
    """Write the resolved budget into the spec when the policy (not the user) set it."""
    setting = policy.setting("backoff-limit")
    if setting.source not in WRITTEN_SOURCES:
        return
    before = get_path(obj, field.path)
    if before == policy.backoff_limit:
        return
    if not set_path(obj, field.path, policy.backoff_limit):
        where = intent.dotted(field.path[:-1])
        out.problems.append(Problem(where, "is not a mapping; cannot hold the retry budget"))
        return
    shown = "" if before is None else f" {before}"
    out.changed(
        f"retry-policy: {field.name}{shown} -> {policy.backoff_limit} "
        f"({setting.describe('backoff-limit')})",
        setting,
    )


def not_applicable(policy: Policy, name: str, kind: str, why: str, out: Outcome) -> Policy:
    """A setting this kind cannot honour: denied when annotated, skipped (with a warning)
    when an admin default asked for it; never silently ignored."""
    out.conflict(policy, name, f"cannot apply to a {kind}: {why}", "not-applicable")
    return with_setting(policy, name, Setting(BUILTIN[name], Source.BUILTIN))


def check_not_applicable(
    policy: Policy, kind: str, reasons: Mapping[str, str], out: Outcome
) -> Policy:
    """Every asked-for setting in ``reasons`` (name -> why not), and ``on-non-retriable:
    fail-index`` (only Indexed Jobs have indexes), through ``not_applicable``."""
    for name, why in reasons.items():
        if policy.asks(name):
            policy = not_applicable(policy, name, kind, why, out)
    if policy.on_non_retriable == "fail-index":
        policy = not_applicable(
            policy, "on-non-retriable", kind, f"a {kind} has no completion indexes", out
        )
    return policy


def check_error_propagation(policy: Policy, kind: str, out: Outcome) -> Policy:
    """``error-propagation`` outside a PyTorchJob would hide the task's errors
    (``podspec.NOT_A_PYTORCHJOB``): denied when annotated, skipped when a default."""
    if policy.error_propagation:
        policy = not_applicable(policy, "error-propagation", kind, podspec.NOT_A_PYTORCHJOB, out)
    return policy


def add_error_propagation(pod_spec: Any, label: str, policy: Policy, out: Outcome) -> None:
    """The error-propagation env vars in every container of one pod template."""
    if not policy.error_propagation or not isinstance(pod_spec, dict):
        return
    names = podspec.add_error_propagation(pod_spec, policy.error_propagation)
    if names:
        out.changed(
            f"retry-policy: error-propagation env vars added to {label} " + ", ".join(names),
            policy.setting("error-propagation"),
        )


def pod_count(value: Any, default: int) -> int:
    """A pod count field: a whole number >= 0, else ``default`` (absent or malformed)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return default
    return value


def concurrent_pods(spec: Mapping[str, Any]) -> int:
    """How many pods of one JobSpec run at once: ``parallelism`` (1 when unset), at most
    ``completions`` when set (``SetDefaults_Job`` leaves completions unset for a work
    queue, where parallelism alone says how many run)."""
    parallelism = pod_count(spec.get("parallelism"), 1)
    completions = spec.get("completions")
    if completions is None:
        return parallelism
    return min(parallelism, pod_count(completions, 1))


def run_together(spec: Mapping[str, Any]) -> int:
    """How many pods of one JobSpec work as one, each needing the others (1: none do):
    all of its completions running at once (``parallelism`` >= ``completions``: a
    distributed training's ranks), or an Indexed Job's pods finding each other by name
    (the template's ``subdomain``, a headless Service: Kubernetes' pattern for pod-to-pod
    communication). A work queue's pods (no ``completions``) and shards run a few at a
    time run beside each other: a preempted one's peers do not notice it."""
    completions = spec.get("completions")
    if completions is None:
        return 1
    template = spec.get("template")
    pod_spec = template.get("spec") if isinstance(template, dict) else None
    named = isinstance(pod_spec, dict) and bool(pod_spec.get("subdomain"))
    indexed = spec.get("completionMode") == "Indexed"
    if (indexed and named) or pod_count(spec.get("parallelism"), 1) >= pod_count(completions, 1):
        return concurrent_pods(spec)
    return 1


#: The exit codes a stopped pod's own containers report (SIGTERM, then SIGKILL after the
#: grace period). A retriable code beyond them is the user's own, such as the one their
#: training exits with when it loses a peer: then peers are retried, not failed.
STOP_CODES = frozenset({137, 143})

#: What ``peers_note`` asks for: on a kind with podFailurePolicy rules, and on one
#: where ``peer-disruptions`` cannot apply (its advice is then the exit code alone).
PEERS_ADVICE = "set peer-disruptions: ignore"
PEERS_CODE_ONLY = "list the code they exit with then in retriable-exit-codes"


def peers_note(pods: int, advice: str = PEERS_ADVICE) -> str:
    """Said when non-retriable exits would fail a workload of pods that work as one."""
    return (
        f"retry-policy: {pods} pods run as one: a preempted pod's peers may exit and fail the "
        f"workload; {advice}"
    )


def note_peers(policy: Policy, pods: int, out: Outcome, advice: str = PEERS_ADVICE) -> None:
    """With ``fail-non-retriable``, only the pod that was disrupted carries
    ``DisruptionTarget`` (the rule that ignores or counts it matches that pod alone,
    ``matchPodFailurePolicy``): the peers it worked with (a distributed training's other
    ranks) lose it and exit with codes of their own (1, a timeout's), which the FailJob
    rule matches, so one preemption fails the whole workload, unless ``peer-disruptions``
    marks those peers (``plan.causes``) or the code they exit with is retriable. Said
    once per object, only where ``pods`` (that work as one) can fail the workload
    together: not with ``fail-index``, where a peer fails only its own index."""
    if (
        policy.fail_non_retriable
        and pods > 1
        and policy.peer_disruptions is None
        and policy.on_non_retriable != "fail-index"
        and set(policy.retriable_exit_codes) <= STOP_CODES
    ):
        note = peers_note(pods, advice)
        if note not in out.notes:
            out.note(note)
