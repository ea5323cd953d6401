"""The PyTorchJob explainer (kubeflow.org/v1; the training operator's release-1.9
``ReconcileJobs`` and ``PastBackoffLimit``): ``restartPolicy: ExitCode`` fails the job on
exit codes 1-127 of the container named ``pytorch`` and replaces the pod otherwise, with no
limit unless ``runPolicy.backoffLimit`` is 0 (kubeflow/trainer#2045); OnFailure and Always
restart containers in place and count the restarts of running pods, while a pod that fails
as a whole is replaced uncounted (unless the limit is 0); Never fails the job at the first
failed pod. Every way to fail reports PyTorchJobFailed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kinds import planner
from webhook.kinds.explaining import as_int, budget_origin, kind_start
from webhook.kinds.job.simulate import JobSimulator
from webhook.kinds.pytorchjob import mutate as pytorchjob
from webhook.kinds.workload import get_path
from webhook.kube.defaulting import INT32_MAX
from webhook.kube.objects import mapping
from webhook.plan.explained import Explanation, RuleLine, Subject
from webhook.plan.words import attempt_table, count_of
from webhook.policy.model import Policy

PYTORCH_DEFAULT = "PyTorchJob default"
#: The training operator's default restartPolicy for a replica that sets none.
OPERATOR_DEFAULT_RESTART_POLICY = "OnFailure"
PYTORCH_FAILED = "PyTorchJobFailed"


def explain_pytorchjob(subject: Subject) -> list[Explanation]:
    spec = subject.spec
    keys = ("backoff-limit", "fail-non-retriable", "retriable-exit-codes", "error-propagation")
    item, policy = kind_start(subject, pytorchjob.BACKOFF, keys, PYTORCH_DEFAULT)
    replicas = spec.get("pytorchReplicaSpecs")
    replicas = replicas if isinstance(replicas, dict) else {}
    original = mapping(get_path(subject.original, ("spec", "pytorchReplicaSpecs")))
    restart = {
        rtype: str(get_path(rspec, ("restartPolicy",)) or OPERATOR_DEFAULT_RESTART_POLICY)
        for rtype, rspec in sorted(replicas.items())
    }
    primary = "Master" if "Master" in restart else next(iter(restart), "Master")
    policy_name = restart.get(primary, OPERATOR_DEFAULT_RESTART_POLICY)
    limit = as_int(get_path(spec, ("runPolicy", "backoffLimit")))
    origin = budget_origin(policy, PYTORCH_DEFAULT)
    who = _restart_origin(replicas, original, restart, primary)
    item.budget = _pytorch_budget(limit, origin, policy_name, who)
    pod_spec = mapping(get_path(replicas.get(primary), ("template", "spec")))
    names = planner.container_names(pod_spec)
    containers = sorted(names, key=lambda n: n != pytorchjob.DEFAULT_CONTAINER)
    # Under ExitCode only a limit of 0 is enforced (kubeflow/trainer#2045).
    enforced = limit if policy_name != "ExitCode" or limit == 0 else None
    budget = enforced if enforced is not None else INT32_MAX
    rules, label = _pytorch_rules(policy_name)
    if rules:
        line = RuleLine(
            1, label, _pytorch_when(policy_name), "the PyTorchJob fails at once", who, True
        )
        item.rules = [line]
    item.rules_intro = (
        "When a pod fails, the training operator checks its replica's restartPolicy "
        f"({primary}: {policy_name}):"
    )
    item.no_match = _pytorch_no_match(policy_name, enforced)
    item.simulator = JobSimulator(
        rules,
        budget,
        None,
        None,
        None,
        0,
        containers,
        on_failure=policy_name in ("OnFailure", "Always"),
        owner="PyTorchJob",
        fail_reason=PYTORCH_FAILED,
        limit_reason=PYTORCH_FAILED,
        action_names={"FailJob": label},
        limit_field="runPolicy.backoffLimit",
        replaced_pods_count=False,
    )
    item.examples = item.simulator.examples()[:4]  # the common ones, not the rule's own codes
    if enforced is not None and policy_name in ("ExitCode", "Never"):
        item.attempts = attempt_table(
            "spec.runPolicy.backoffLimit",
            0 if policy_name == "Never" else limit,
            None,
            0,
            f"the PyTorchJob fails ({PYTORCH_FAILED})",
        )
    item.notes.extend(_pytorch_notes(restart, primary, policy))
    return [item]


def _restart_origin(
    replicas: Mapping[str, Any], original: Any, restart: Mapping[str, str], primary: str
) -> str:
    written = get_path(original, (primary, "restartPolicy")) if isinstance(original, dict) else None
    final = get_path(replicas.get(primary), ("restartPolicy",))
    if written:
        return "your restartPolicy"
    if final:
        return "set by retry-policy for fail-non-retriable"
    return "the training operator's default"


def _pytorch_rules(policy_name: str) -> tuple[list[dict[str, Any]], str]:
    """The restartPolicy as podFailurePolicy rules the shared evaluation understands."""
    if policy_name == "ExitCode":
        codes = list(range(1, pytorchjob.RETRIED_FROM))
        rule = {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": pytorchjob.DEFAULT_CONTAINER,
                "operator": "In",
                "values": codes,
            },
        }
        return [rule], "ExitCode"
    if policy_name == "Never":
        return [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}}], (
            "Never"
        )
    return [], policy_name


def _pytorch_when(policy_name: str) -> str:
    if policy_name == "ExitCode":
        return (
            f"exit codes 1-{pytorchjob.RETRIED_FROM - 1} in container "
            f"{pytorchjob.DEFAULT_CONTAINER} (an error of the program, not a signal)"
        )
    return "any failed pod (restartPolicy Never: the pod is not replaced)"


def _pytorch_no_match(policy_name: str, limit: int | None) -> str:
    counts = "counts against runPolicy.backoffLimit" if limit is not None else "counts (no limit)"
    if policy_name == "ExitCode":
        return (
            f"anything else (exit codes {pytorchjob.RETRIED_FROM}-255, or a pod that failed "
            f"before container {pytorchjob.DEFAULT_CONTAINER} exited): the pod is replaced, "
            f"{counts}"
        )
    if policy_name == "Never":
        return ""
    whole = (
        "fails the PyTorchJob"
        if limit == 0
        else "is replaced without counting, and its restarts are forgotten"
    )
    return (
        f"with restartPolicy {policy_name}, a failed container restarts inside its pod and "
        f"every restart {counts}; a pod that fails as a whole (evicted, preempted) {whole}"
    )


def _pytorch_budget(limit: int | None, origin: str, policy_name: str, who: str) -> str:
    rp = f"restartPolicy is {policy_name} ({who})"
    if policy_name == "Never":
        return (
            f"The {rp}: a failed pod is not replaced, and the first failure fails the "
            f"PyTorchJob (reason {PYTORCH_FAILED})."
        )
    if limit is None:
        return (
            f"The {rp}, and runPolicy.backoffLimit is not set ({origin}): the training "
            "operator retries failed pods without limit."
        )
    if policy_name == "ExitCode" and limit == 0:
        return (
            f"runPolicy.backoffLimit is 0 ({origin}), and the {rp}: the first failed pod "
            f"fails the PyTorchJob (reason {PYTORCH_FAILED}), whatever its exit code."
        )
    if policy_name == "ExitCode":
        return (
            f"runPolicy.backoffLimit is {limit} ({origin}), but the {rp}, under which the "
            "training operator never enforces it (kubeflow/trainer#2045: it counts only "
            "container restarts, and ExitCode replaces failed pods instead): failed pods "
            "are retried without limit; only runPolicy.activeDeadlineSeconds stops them."
        )
    if policy_name in ("OnFailure", "Always"):
        if limit == 0:
            return (
                f"runPolicy.backoffLimit is 0 ({origin}), and the {rp}: the first restart of "
                f"a container, or the first pod to fail, fails the PyTorchJob (reason "
                f"{PYTORCH_FAILED})."
            )
        return (
            f"runPolicy.backoffLimit is {limit} ({origin}), and the {rp}: a failed container "
            "restarts inside its pod, and the training operator counts the restarts of all "
            f"running pods together: restart number {limit} fails it (reason "
            f"{PYTORCH_FAILED}). A pod that fails as a whole is replaced, uncounted, and "
            "its restarts are no longer counted."
        )
    return (
        f"runPolicy.backoffLimit is {limit} ({origin}), and the {rp}: the training operator "
        f"replaces a failed pod up to {count_of(limit, 'time')} (failures of every replica "
        f"count together), so the job gets up to {count_of(limit + 1, 'attempt')}; failure "
        f"number {limit + 1} fails it (reason {PYTORCH_FAILED})."
    )


def _pytorch_notes(restart: Mapping[str, str], primary: str, policy: Policy) -> list[str]:
    notes = []
    if len(set(restart.values())) > 1:
        shown = ", ".join(f"{rtype} {value}" for rtype, value in restart.items())
        notes.append(
            f"the replicas restart differently ({shown}); the rules and the simulation "
            f"follow {primary}"
        )
    if restart.get(primary) == "ExitCode" and policy.fail_non_retriable:
        notes.append(
            f"ExitCode also retries exit codes {pytorchjob.RETRIED_FROM}-255 that "
            "retriable-exit-codes does not list"
        )
    if policy.error_propagation:
        notes.append(
            "error-propagation needs Flyte's PyTorch plugin with "
            "enable-distributed-error-aggregation: true; without it the task's error is lost"
        )
    notes.append(
        "ignore-disruptions and non-spot-attempts cannot apply to a PyTorchJob: the training "
        "operator has no podFailurePolicy, and its pods carry no attempt number"
    )
    return notes
