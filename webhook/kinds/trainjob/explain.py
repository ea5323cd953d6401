"""The TrainJob explainer (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2): its
settings, then the JobSet the trainer makes from its runtime, admitted (``Subject.admit``)
and explained as any JobSet (``kinds.jobset.explain``)."""

from __future__ import annotations

import dataclasses

from webhook.kinds import planner
from webhook.kinds.explaining import workload_keys
from webhook.kinds.jobset.explain import JOBSET_DEFAULT, explain_jobset
from webhook.kinds.trainjob import mutate as trainjob
from webhook.kinds.workload import get_path
from webhook.kube.objects import items, mapping
from webhook.plan.explained import Explanation, Subject
from webhook.plan.outcome import Outcome
from webhook.plan.policies import workload_policy
from webhook.plan.words import setting_lines

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
    if subject.admit is None:
        raise ValueError("a TrainJob is explained through its JobSet's admission: no admit")
    stored, outcome = subject.admit(jobset, ctx)
    # Only its changes: its notes are the TrainJob's (above), and its deadline hint is
    # replaced by the TrainJob's own.
    changes = [c.text.removeprefix("retry-policy: ") for c in (outcome or Outcome()).changes]
    made = Subject(jobset, stored, outcome, ctx, changes, subject.admit)
    parts = explain_jobset(made)
    parts[0].part = f"made by the trainer from {label}"
    item.budget = (
        f"The trainer makes the JobSet below from {label}; these settings reach it in "
        f"spec.runtimePatches ({trainjob.MANAGER}), and its admission applies the policy: "
        "the budget, rules and placement are the JobSet's."
    )
    if not carried and outcome is not None and outcome.audited:
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
