"""kubeflow.org/v1 PyTorchJob: the budget is ``spec.runPolicy.backoffLimit``;
``fail-non-retriable`` becomes the replicas' ``restartPolicy: ExitCode``.

The Kubeflow training operator has no podFailurePolicy. Its own exit-code rule, used with
``restartPolicy: ExitCode``, reads the exit code of the container named ``pytorch`` and
retries the pod when the code is >= 128 (a signal: SIGTERM 143, SIGKILL 137...), while
1-127 fail the whole job at once (``IsRetryableExitCode`` in pkg/util/train/train_util.go,
used in pkg/controller.v1/common/pod.go). So ``fail-non-retriable`` maps onto it when every
retriable exit code is >= 128, and is denied otherwise; the codes 128-255 the user did
not list are retried too, which a warning says. ``restartPolicy`` defaults to OnFailure
in the operator (not in the API), so an unset one is ours to set.

But under ExitCode the operator (release-1.9) never enforces ``runPolicy.backoffLimit``
>= 1: ``ReconcileJobs`` compares it with its work queue's ``NumRequeues``, always 0 (the
PyTorchJob controller passes a ``FakeWorkQueue``), and ``PastBackoffLimit`` sums the
container restart counts of running pods, which stay 0 because ExitCode pods run with
``restartPolicy: Never`` and are replaced instead (kubeflow/trainer#2045). Only 0 is
enforced (``1 > 0``: the first failed pod fails the job). With the operator's default
OnFailure the limit does hold, through those restart counts. So ``fail-non-retriable``
with a limit >= 1 would trade a cap for retries without end: it is denied (skipped, with
a warning, when it comes from an admin default), and so is a ``backoff-limit`` >= 1 we
would write beside an ExitCode the user wrote (``_check_cap``).

``ignore-disruptions`` and ``non-spot-attempts`` cannot be honoured (every failed pod counts,
and pods carry no attempt number): denied when annotated, skipped with a warning when they
come from an admin default. ``error-propagation`` goes into every replica (Master and
Worker): the one kind whose Flyte plugin can read the per-worker error files it makes
flytekit write (``error_propagation_note``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kinds.workload import (
    WRITTEN_SOURCES,
    WorkloadMutator,
    add_error_propagation,
    check_not_applicable,
    enforce_rail,
    get_path,
    keep_spec_limit,
    note_peers,
    pod_count,
    resolve_limit,
    write_limit,
)
from webhook.kube.objects import mapping
from webhook.kube.wellknown import KUBEFLOW_GROUP
from webhook.plan.model import LimitField
from webhook.plan.outcome import Context, Outcome
from webhook.policy.model import Policy, Setting, Source, format_value, with_setting
from webhook.problems import Problem

KIND = "PyTorchJob"
BACKOFF = LimitField(("spec", "runPolicy", "backoffLimit"), None, None)
#: The container whose exit code the training operator reads.
DEFAULT_CONTAINER = "pytorch"
#: The training operator retries exit codes from here up, and fails on those below.
RETRIED_FROM = 128
#: Exit codes of the usual fatal signals (128 + signal number), for examples in warnings.
SIGNALS = {139: "SIGSEGV", 134: "SIGABRT", 137: "SIGKILL", 143: "SIGTERM"}
NOT_APPLICABLE = {
    "ignore-disruptions": "the training operator has no podFailurePolicy and counts every "
    "failed pod against runPolicy.backoffLimit, disruptions included",
    "non-spot-attempts": "its pods carry no attempt number (the training operator recreates "
    "a failed pod under the same name)",
    "oom-memory-factor": "its pods belong to no Job (the training operator recreates a "
    "failed pod under the same name), so the OOM kills of earlier attempts cannot be found",
    "avoid-failed-nodes": "its pods belong to no Job (the training operator recreates a "
    "failed pod under the same name), so the nodes of earlier attempts cannot be found",
    "attempt-env": "its pods carry no attempt number (the training operator recreates a "
    "failed pod under the same name)",
    "retry-delay": "its pods carry no attempt number (the training operator recreates a "
    "failed pod under the same name), so a retry cannot be told from the first attempt",
    "in-place-exit-codes": "the training operator sets its replicas' restart policy and "
    "restarts or recreates their pods itself (restartPolicy ExitCode, OnFailure)",
    "max-disruptions": "the training operator has no podFailurePolicy and counts every "
    "failed pod against runPolicy.backoffLimit, disruptions included",
    "max-in-place-restarts": "the training operator sets its replicas' restart policy and "
    "restarts or recreates their pods itself",
    "peer-disruptions": "the training operator has no podFailurePolicy: no rule decides a "
    "failed pod, a disrupted pod's peer or not",
    "free-categories": "the training operator has no podFailurePolicy and counts every "
    "failed pod against runPolicy.backoffLimit, whatever its category",
    "max-free-failures": "the training operator has no podFailurePolicy: no failure is free "
    "(free-categories)",
    "fail-categories": "the training operator has no podFailurePolicy: no rule decides a "
    "failed pod by its category",
    "start-deadline": "the training operator recreates a failed pod under the same name: a "
    "pod ended for its start deadline would be made again, never counted",
}
#: What a PyTorchJob's peers warning asks (``note_peers``): peer-disruptions needs a
#: podFailurePolicy, and ExitCode retries the codes from 128 up.
PEERS_EXIT_CODE = (
    f"list the code they exit with then ({RETRIED_FROM}-255: ExitCode retries) in "
    "retriable-exit-codes"
)
#: Where kubeflow/trainer#2045 (runPolicy.backoffLimit not enforced under ExitCode) is told.
UNENFORCED = "kubeflow/trainer#2045"


class PyTorchJobMutator(WorkloadMutator):
    group = KUBEFLOW_GROUP
    kind = KIND

    def budget_field(self, obj: Mapping[str, Any]) -> LimitField | None:
        return BACKOFF

    def apply(self, job: dict[str, Any], policy: Policy, ctx: Context, out: Outcome) -> Policy:
        replicas = get_path(job, ("spec", "pytorchReplicaSpecs"))
        if not isinstance(replicas, dict) or not replicas:
            out.problems.append(
                Problem("spec.pytorchReplicaSpecs", "a PyTorchJob needs replica specs")
            )
            return policy
        policy = check_not_applicable(policy, KIND, NOT_APPLICABLE, out)
        policy = resolve_limit(job, BACKOFF, policy, out)
        policy = enforce_rail(policy, BACKOFF, ctx, out)
        policy, capped = _check_cap(job, replicas, policy, out)
        if policy.fail_non_retriable:
            policy = _check_exit_code(replicas, policy, out, capped)
        if out.problems:
            return policy
        write_limit(job, BACKOFF, policy, out)
        if policy.fail_non_retriable:
            _set_exit_code(job, replicas, policy, out)
        for rtype in sorted(replicas):
            pod_spec = get_path(replicas[rtype], ("template", "spec"))
            add_error_propagation(pod_spec, f"{rtype} containers", policy, out)
        if policy.error_propagation:
            # What the change assumes, said with it (no setting: validation does not
            # expect it gone, as ``failureaware.OOM_SIGNAL``): not a fault of the object.
            out.changed(error_propagation_note())
        note_peers(policy, _pods(replicas), out, PEERS_EXIT_CODE)
        out.policies["spec"] = policy
        return policy


def _pods(replicas: Mapping[str, Any]) -> int:
    """Pods of all replica types, which run together (``replicas`` defaults to 1)."""
    return sum(pod_count(mapping(spec).get("replicas"), 1) for spec in replicas.values())


def error_propagation_note() -> str:
    """What error-propagation needs from Flyte, said whenever it is applied."""
    return (
        "retry-policy: error-propagation needs Flyte's PyTorch plugin with "
        "enable-distributed-error-aggregation: true (propeller's k8s plugin config); without "
        "it the task's error is lost"
    )


def exit_code_replicas(replicas: Mapping[str, Any]) -> list[str]:
    """The replicas whose written restartPolicy is ExitCode."""
    return [
        rtype
        for rtype in sorted(replicas)
        if isinstance(replicas[rtype], dict) and replicas[rtype].get("restartPolicy") == "ExitCode"
    ]


def _check_cap(
    job: Mapping[str, Any], replicas: Mapping[str, Any], policy: Policy, out: Outcome
) -> tuple[Policy, bool]:
    """A runPolicy.backoffLimit >= 1 means nothing under ExitCode (see the module doc):
    never trade a cap for ExitCode, never write a cap ExitCode would ignore. Also returns
    whether ``fail-non-retriable`` was denied for the cap (it stays on, so that its other
    problems are said too: ``_check_exit_code``)."""
    limit = policy.backoff_limit
    capped = False
    if limit is None or limit < 1:
        return policy, capped
    setting = policy.setting("backoff-limit")
    shown = f"runPolicy.backoffLimit {limit} ({setting.describe('backoff-limit')})"
    if policy.fail_non_retriable:
        deadline = get_path(job, ("spec", "runPolicy", "activeDeadlineSeconds"))
        bound = (
            "runPolicy.activeDeadlineSeconds then bounds the run"
            if deadline is not None
            else "bound the run with runPolicy.activeDeadlineSeconds"
        )
        policy = out.refuse(
            policy,
            "fail-non-retriable",
            "it needs restartPolicy ExitCode, under which the training operator never "
            f"enforces {shown}: it replaces failed pods and counts only container restarts, "
            f"so retriable failures would be retried forever ({UNENFORCED}): the two can "
            f"never be admitted together on a PyTorchJob; accepted: backoff-limit 0 (the "
            f"first failure ends the job), or no backoff limit at all ({bound}), or no "
            "fail-non-retriable",
            "unenforced-limit",
        )
        capped = policy.fail_non_retriable
    written = exit_code_replicas(replicas)
    if written and setting.source in WRITTEN_SOURCES:
        where = ", ".join(f"spec.pytorchReplicaSpecs.{r}.restartPolicy" for r in written)
        out.conflict(
            policy,
            "backoff-limit",
            f"{limit} would not be enforced: your {where}: ExitCode replaces failed pods, "
            f"whose failures the training operator never counts ({UNENFORCED}); accepted: 0, "
            "or remove restartPolicy ExitCode",
            "unenforced-limit",
        )
        policy = keep_spec_limit(job, BACKOFF, policy)
    return policy, capped


def _check_exit_code(
    replicas: Mapping[str, Any], policy: Policy, out: Outcome, capped: bool = False
) -> Policy:
    """Whether ``restartPolicy: ExitCode`` can express the policy for every replica. When
    ``capped`` (``_check_cap``), ExitCode is no fix for a replica's other restartPolicy
    unless the backoff limit goes: said so instead of advising it."""
    codes = policy.retriable_exit_codes
    failing = [code for code in codes if code < RETRIED_FROM]
    problems = []
    if failing:
        problems.append(
            f"on a PyTorchJob, the training operator's restartPolicy ExitCode retries exit codes "
            f"{RETRIED_FROM}-255 and fails on 1-{RETRIED_FROM - 1}, so retriable-exit-codes "
            f"{format_value('retriable-exit-codes', codes)} cannot be honoured "
            f"({format_value('retriable-exit-codes', failing)} would fail the job); accepted: "
            f"retriable-exit-codes from {RETRIED_FROM} up"
        )
    written: dict[str, list[str]] = {}  # a restartPolicy that is not ExitCode -> its replicas
    unnamed: list[str] = []
    for rtype in sorted(replicas):
        where = f"spec.pytorchReplicaSpecs.{rtype}"
        rspec = replicas[rtype] if isinstance(replicas[rtype], dict) else {}
        restart = rspec.get("restartPolicy")
        if restart not in (None, "ExitCode"):
            written.setdefault(str(restart), []).append(f"{where}.restartPolicy")
        containers = get_path(rspec, ("template", "spec", "containers"))
        containers = containers if isinstance(containers, list) else []
        names = {c.get("name") for c in containers if isinstance(c, dict)}
        if DEFAULT_CONTAINER not in names:
            unnamed.append(
                f"the training operator reads the exit code of the container named "
                f"{DEFAULT_CONTAINER}, and {where}.template has none"
            )
    fix = (
        "ExitCode, which does, is accepted only with backoff-limit 0 or none (above)"
        if capped
        else "use ExitCode or remove it"
    )
    for restart, fields in written.items():
        problems.append(
            f"your {', '.join(fields)}: {restart} does not tell exit codes apart; {fix}"
        )
    problems.extend(unnamed)
    for message in problems:
        out.conflict(policy, "fail-non-retriable", message, "not-applicable")
    source = policy.setting("fail-non-retriable").source
    if problems and source is not Source.ANNOTATION:
        return with_setting(policy, "fail-non-retriable", Setting(False, source))
    return policy


def _set_exit_code(
    job: Mapping[str, Any], replicas: dict[str, Any], policy: Policy, out: Outcome
) -> None:
    changed = []
    for rtype in sorted(replicas):
        rspec = replicas[rtype]
        if isinstance(rspec, dict) and rspec.get("restartPolicy") is None:
            rspec["restartPolicy"] = "ExitCode"
            changed.append(rtype)
    if not changed:
        return
    out.changed(
        f"retry-policy: spec.pytorchReplicaSpecs.{{{','.join(changed)}}}.restartPolicy -> "
        "ExitCode (fail-non-retriable)",
        policy.setting("fail-non-retriable"),
    )
    if policy.backoff_limit == 0:
        return  # the first failed pod fails the job: nothing is retried
    also = [c for c in SIGNALS if c not in policy.retriable_exit_codes]
    if len(policy.retriable_exit_codes) < 256 - RETRIED_FROM:
        example = f", e.g. {also[0]} ({SIGNALS[also[0]]})" if also else ""
        out.changed(
            f"retry-policy: ExitCode also retries exit codes {RETRIED_FROM}-255 outside "
            f"retriable-exit-codes{example}"
        )
    if get_path(job, ("spec", "runPolicy", "activeDeadlineSeconds")) is None:
        out.note(
            "retry-policy: runPolicy.backoffLimit is not set: failed pods are retried "
            "without limit; bound the run with runPolicy.activeDeadlineSeconds"
        )
