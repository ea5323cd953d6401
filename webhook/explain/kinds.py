"""Explainers for the kinds whose retry budget is not a plain Job's: CronJob, RayJob,
PyTorchJob and TrainJob (the model, the Job and Pod explainers, the JobSet's and
rendering live beside it in ``webhook.explain``).

Each explains the object the webhook would store, with the policy its mutator recorded
(``Outcome.policies``, and each JobSpec part's in ``Outcome.plans``, keyed by spec path),
and walks ``--simulate`` events through the counting of the controller that owns the
kind:

- CronJob: each Job it creates carries ``spec.jobTemplate.spec``, explained and simulated
  as that Job; the CronJob itself never fails.
- JobSet: ``explain.jobset``, and its simulation ``explain.jobsetsim``; a TrainJob is
  explained through the JobSet its runtime makes.
- RayJob (KubeRay ``checkBackoffLimitAndUpdateStatusIfNeeded``): a failed attempt is
  retried on a new RayCluster while ``status.failed < backoffLimit + 1``, whatever failed,
  but never one that failed with reason DeadlineExceeded or JobStatusCheckTimeoutExceeded;
  the RayJob's own ``status.reason`` (AppFailed when the Ray job itself failed) stays.
- PyTorchJob (Kubeflow training operator, release-1.9 ``ReconcileJobs`` and
  ``PastBackoffLimit``): ``restartPolicy: ExitCode`` fails the job on exit codes 1-127 of
  the container named ``pytorch`` and replaces the pod otherwise, with no limit unless
  ``runPolicy.backoffLimit`` is 0 (kubeflow/trainer#2045); OnFailure and Always restart
  containers in place and count the restarts of running pods, while a pod that fails as a
  whole is replaced uncounted (unless the limit is 0); Never fails the job at the first
  failed pod. Every way to fail reports PyTorchJobFailed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from webhook.admission import engine
from webhook.cluster.version import GivenVersion, UnknownVersion
from webhook.explain.jobs import (
    as_int,
    budget_origin,
    explain_job_spec,
    kind_start,
    workload_keys,
)
from webhook.explain.jobset import JOBSET_DEFAULT, explain_jobset
from webhook.explain.jobsim import JobSimulator
from webhook.explain.model import explainer
from webhook.kinds import planner
from webhook.kinds.pytorchjob import mutate as pytorchjob
from webhook.kinds.rayjob import mutate as rayjob
from webhook.kinds.trainjob import mutate as trainjob
from webhook.kinds.workload import get_path
from webhook.kube.defaulting import INT32_MAX
from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import KUBEFLOW_GROUP, RAY_GROUP, TRAINER_GROUP
from webhook.plan.explained import Explanation, RuleLine, Subject
from webhook.plan.outcome import Outcome
from webhook.plan.policies import workload_policy
from webhook.plan.words import attempt_table, count_of, setting_lines
from webhook.policy.model import Policy

# --- batch/v1 CronJob ----------------------------------------------------------------


@explainer("batch", "CronJob")
def explain_cronjob(subject: Subject) -> list[Explanation]:
    """The policy each created Job carries; the template is not API-defaulted."""
    item = explain_job_spec(
        subject, ("spec", "jobTemplate", "spec"), part="each Job it creates", defaulted=False
    )
    item.owner = "Job"
    item.notes.append(
        "each scheduled run creates a new Job with a fresh budget: a Job that fails does "
        "not stop the CronJob, and the next Job starts again at attempt 1"
    )
    return [item]


# --- ray.io/v1 RayJob -------------------------------------------------------------------

RAYJOB_DEFAULT = "RayJob default"


@explainer(RAY_GROUP, "RayJob")
def explain_rayjob(subject: Subject) -> list[Explanation]:
    spec = subject.spec
    keys = ("backoff-limit", "error-propagation")
    item, policy = kind_start(subject, rayjob.BACKOFF, keys, RAYJOB_DEFAULT)
    limit = as_int(spec.get("backoffLimit")) or 0
    origin = budget_origin(policy, RAYJOB_DEFAULT)
    end = "jobDeploymentStatus Failed, reason AppFailed when the Ray job itself failed"
    if spec.get("clusterSelector"):
        item.budget = (
            f"backoffLimit is {limit} ({origin}), but this RayJob runs on an existing "
            "RayCluster (spec.clusterSelector), which KubeRay cannot recreate: the first "
            f"failed attempt ends it ({end})."
        )
    elif limit == 0:
        item.budget = (
            f"backoffLimit is 0 ({origin}): KubeRay does not retry; the first failed attempt "
            f"ends the RayJob ({end})."
        )
    else:
        item.budget = (
            f"backoffLimit is {limit} ({origin}): when the Ray job fails, KubeRay deletes its "
            "RayCluster and retries the whole RayJob on a new one while status.failed is "
            f"below backoffLimit + 1, so it gets up to {count_of(limit + 1, 'attempt')}; "
            f"failed attempt number {limit + 1} ends it ({end}). An attempt that fails with "
            "reason DeadlineExceeded (it ran past activeDeadlineSeconds, counted from its own "
            "start) or JobStatusCheckTimeoutExceeded ends it too: KubeRay never retries those."
        )
    item.no_match = (
        "a RayJob has no failure rules: KubeRay retries every failed attempt alike, "
        "whatever the exit code, disruptions included"
    )
    item.rules_intro = ""
    runs = 0 if spec.get("clusterSelector") else limit
    item.attempts = attempt_table(
        "spec.backoffLimit", runs, None, 0, "the RayJob fails (AppFailed)"
    )
    cluster = spec.get("rayClusterSpec") if isinstance(spec.get("rayClusterSpec"), dict) else {}
    containers = planner.container_names(
        mapping(get_path(cluster, ("headGroupSpec", "template", "spec")))
    )
    for group in items(cluster.get("workerGroupSpecs")):
        containers += planner.container_names(mapping(get_path(group, ("template", "spec"))))
    item.simulator = JobSimulator(
        [],
        runs,
        None,
        None,
        None,
        0,
        containers,
        owner="RayJob",
        limit_reason="AppFailed",
        unit="attempt",
        retry_where="on a new RayCluster",
        failed_as="jobDeploymentStatus Failed",
    )
    item.notes.append(
        "each event is one failed attempt of the whole RayJob (a bare exit code is the head's "
        "first container); fail-non-retriable, ignore-disruptions and non-spot-attempts "
        "cannot apply to a RayJob: it has no podFailurePolicy and its pods carry no attempt "
        "number"
    )
    return [item]


# --- kubeflow.org/v1 PyTorchJob -----------------------------------------------------------

PYTORCH_DEFAULT = "PyTorchJob default"
#: The training operator's default restartPolicy for a replica that sets none.
OPERATOR_DEFAULT_RESTART_POLICY = "OnFailure"
PYTORCH_FAILED = "PyTorchJobFailed"


@explainer(KUBEFLOW_GROUP, "PyTorchJob")
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


# --- trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2) ------------------------

#: The upstream trap every TrainJob plan must state (verified in Trainer v2.2.0 to v2.3.0:
#: ``Reconcile`` clears the Failed condition before ``IsTrainJobFinished``).
RECREATED_JOBSET = (
    "Kubeflow Trainer up to v2.3.0 makes a new JobSet for a failed TrainJob whose JobSet "
    "was deleted (by its runtime's ttlSecondsAfterFinished, or by hand): the new one "
    "starts again at 0 restarts, so the budget starts over, and a TrainJob failed by "
    "fail-non-retriable runs again (kubeflow/trainer#3779, #3737; fixed on master by "
    "#3891, after v2.3.0): until a release has it, give the runtimes of such TrainJobs no "
    "ttlSecondsAfterFinished"
)


@explainer(TRAINER_GROUP, trainjob.KIND)
def explain_trainjob(subject: Subject) -> list[Explanation]:
    """The TrainJob's settings, then the JobSet the trainer makes from its runtime (when
    the runtime is given) explained as any JobSet: its admission applies the policy."""
    item = subject.header()
    # What the JobSet gets is shown below; warnings that change nothing are notes.
    said = [n.removeprefix("retry-policy: ") for n in (subject.outcome or Outcome()).notes]
    item.changes = [c for c in item.changes if not c.startswith("JobSet: ") and c not in said]
    item.notes.extend(said)
    policy = subject.policy("spec")
    if policy is None:  # nothing to carry (no annotations, no defaults)
        policy = workload_policy(subject.final.get("metadata"), subject.ctx)[0]
    item.settings = setting_lines(policy, workload_keys(policy), default=JOBSET_DEFAULT)
    label, found = trainjob.find_runtime(subject.final, subject.ctx)
    runtime = found.runtime
    ttl = get_path(runtime, ("spec", "template", "spec", "ttlSecondsAfterFinished"))
    trap = RECREATED_JOBSET + (
        f" ({label} sets ttlSecondsAfterFinished: {ttl})" if ttl is not None else ""
    )
    patches = items(get_path(subject.final, ("spec", "runtimePatches")))
    carried = trainjob.find_our_patch(patches) is not None
    if runtime is None:
        item.budget = (
            f"The trainer makes a JobSet from {label}, which carries these settings "
            "(spec.runtimePatches) and gets the policy at its own admission; its budget, "
            f"rules and placement depend on the runtime's template, not known here "
            f"({found.reason})."
        )
        if not carried and subject.outcome is not None and subject.outcome.audited:
            item.budget = (
                f"Audited, nothing is carried to the JobSet the trainer makes from {label}: "
                "its own admission records what the defaults would do there; its budget, "
                f"rules and placement depend on the runtime's template, not known here "
                f"({found.reason})."
            )
        item.simulate_note = "--simulate needs the runtime: give it in the same input"
        item.notes.append(trap)
        return [item]
    # As the Trainer's release builds it (the newest's, when not known: the TrainJob's
    # notes say what the other would deny).
    merged = trainjob.resource_modes(found.trainer)[-1]
    jobset = trainjob.jobset_for(subject.final, runtime, merged)
    ctx = dataclasses.replace(subject.ctx, outer_bound=_trainjob_deadline(subject))
    version = ctx.kubernetes_version
    reviewed = engine.review(
        jobset,
        ctx.config,
        ctx.namespace,
        runtimes=ctx.runtimes,
        version=GivenVersion(version) if version is not None else UnknownVersion(),
    )
    # Only its changes: its notes are the TrainJob's (above), and its deadline hint is
    # replaced by the TrainJob's own.
    changes = [
        c.text.removeprefix("retry-policy: ") for c in (reviewed.outcome or Outcome()).changes
    ]
    made = Subject(jobset, reviewed.result, reviewed.outcome, ctx, changes)
    parts = explain_jobset(made)
    parts[0].part = f"made by the trainer from {label}"
    item.budget = (
        f"The trainer makes the JobSet below from {label}; these settings reach it in "
        f"spec.runtimePatches ({trainjob.MANAGER}), and its admission applies the policy: "
        "the budget, rules and placement are the JobSet's."
    )
    if not carried and reviewed.outcome is not None and reviewed.outcome.audited:
        item.budget = (
            f"The trainer makes the JobSet below from {label}; audited, nothing is carried "
            "to it, and its admission records what the defaults would do there."
        )
    item.simulate_note = "--simulate walks failures of the JobSet's pods: see its replicated Jobs"
    item.notes.append(trap)
    return [item, *parts]


def _trainjob_deadline(subject: Subject) -> str:
    """The TrainJob's deadline, which ends its JobSet's restarts in place too ("": none)."""
    original = mapping(subject.original.get("spec"))
    deadline = planner.deadline_of(subject.spec, original, "the TrainJob's spec")
    if deadline is None:
        return ""
    return (
        f"{deadline}: the trainer fails the TrainJob and deletes its JobSet once it has run "
        "that long"
    )
