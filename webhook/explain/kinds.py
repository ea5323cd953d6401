"""Explainers for the kinds whose retry budget is not a plain Job's: CronJob, JobSet,
RayJob and PyTorchJob (the model, the Job and Pod explainers and rendering live in
``webhook.explain``).

Each explains the object the webhook would store, with the policy its mutator recorded
(``Outcome.policies``, keyed by spec path), and walks ``--simulate`` events through the
counting of the controller that owns the kind:

- CronJob: each Job it creates carries ``spec.jobTemplate.spec``, explained and simulated
  as that Job; the CronJob itself never fails.
- JobSet (jobset.x-k8s.io/v1alpha2; ``executeFailurePolicy`` in JobSet's
  pkg/controllers/failure_policy.go, and KEP-262 for the RestartJob actions): the events are
  failures of the pods of one Job of one replicated Job. The child Job counts them as any
  Job does; when it fails, no ``failurePolicy`` at all fails the set (reason FailedJobs);
  otherwise the first rule whose reasons, message patterns and target replicated Jobs all
  match decides, and no match means RestartJobSet. RestartJobSet fails the set once
  ``restartsCountTowardsMax`` has reached maxRestarts (ReachedMaxRestarts), else bumps
  ``status.restarts`` and that count and recreates every Job (their ``status.failed``
  starts at 0 again); RestartJobSetAndIgnoreMaxRestarts bumps ``status.restarts`` only;
  FailJobSet fails the set (FailJobSetFailurePolicyAction). Pods carry
  ``jobset.sigs.k8s.io/restart-attempt`` = ``status.restarts``, which the pod webhook
  places them by.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.admission import engine
from webhook.admission.engine import json_copy

# --- batch/v1 CronJob ----------------------------------------------------------------
from webhook.cluster.version import GivenVersion, UnknownVersion
from webhook.explain import inplace
from webhook.explain.inplace import Backoff
from webhook.explain.jobs import (
    JobSimulator,
    JobState,
    between_notes,
    explain_job_spec,
    failure_aware,
    job_budget,
    job_simulator,
    lead,
    no_match,
    part_plan,
    part_rule_lines,
    restarts_in_place,
    unmanaged_policy,
    walk,
    workload_keys,
)
from webhook.explain.model import (
    WORKLOAD_KEYS,
    Ending,
    Event,
    Explanation,
    NextPod,
    RuleLine,
    Simulation,
    Step,
    Subject,
    explainer,
)
from webhook.explain.words import (
    build_plan,
    count_of,
    join_words,
    on_nodes,
    setting_lines,
    source_text,
)
from webhook.kinds import planner
from webhook.kinds.jobset.mutate import (
    JOBSET_DEFAULT_RESTART_POLICY,
    in_place_restart,
    initializers,
)
from webhook.kinds.jobset.rules import ACTIONS as JOBSET_ACTIONS
from webhook.kinds.jobset.rules import MAX_RESTARTS, RULE_NAME, pattern_applies
from webhook.kinds.pytorchjob import mutate as pytorchjob
from webhook.kinds.rayjob import mutate as rayjob
from webhook.kinds.trainjob import mutate as trainjob
from webhook.kinds.workload import WRITTEN_SOURCES, get_path
from webhook.kube.goregexp import Piece, Wild
from webhook.kube.objects import items, mapping
from webhook.kube.wellknown import JOBSET_GROUP, KUBEFLOW_GROUP, RAY_GROUP, TRAINER_GROUP
from webhook.plan.model import LimitField, PartPlan
from webhook.plan.outcome import Outcome
from webhook.plan.policies import workload_policy
from webhook.plan.record import rule_id
from webhook.policy.model import INT32_MAX, Policy, Source


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


# --- helpers for custom resources -------------------------------------------------------


def _start(
    subject: Subject, budget: LimitField, keys: Sequence[str], default: str
) -> tuple[Explanation, Policy]:
    """The explanation of the object itself, with its settings: the policy the mutator
    recorded, or (when it did not run) the one it would have resolved against ``budget``,
    the kind's budget field. ``default`` names whose default an unset budget is."""
    item = subject.header()
    policy = subject.policy("spec") or unmanaged_policy(subject, budget)
    item.settings = setting_lines(policy, keys, default=default)
    return item, policy


def _origin(policy: Policy, default: str) -> str:
    """Where the budget came from, as the parenthesis after its value says it."""
    setting = policy.setting("backoff-limit")
    return "from " + source_text("backoff-limit", setting, long=True, default=default)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- jobset.x-k8s.io/v1alpha2 JobSet -----------------------------------------------------

JOBSET_DEFAULT = "JobSet default"
#: What a child Job's failure reason means, for rules that name one reason.
REASON_WORDS = {
    "PodFailurePolicy": "a FailJob rule of its podFailurePolicy matched",
    "BackoffLimitExceeded": "its pods failed more often than its backoffLimit allows",
    "DeadlineExceeded": "it ran longer than its activeDeadlineSeconds",
    "FailedIndexes": "some of its indexes failed",
    "MaxFailedIndexesExceeded": "more indexes failed than its maxFailedIndexes",
}
#: JobSet's failure condition reasons (pkg/constants).
FAILED_JOBS, FAIL_ACTION, MAX_REACHED = (
    "FailedJobs",
    "FailJobSetFailurePolicyAction",
    "ReachedMaxRestarts",
)
RESTART_ACTIONS = ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
JOB_RESTART_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")


@explainer(JOBSET_GROUP, "JobSet")
def explain_jobset(subject: Subject) -> list[Explanation]:
    """The set's restart budget and rules, then each replicated Job: its pods' rules, the
    plan of runs its pods are placed by, and a simulation of its pods failing."""
    subject, defaulted = _as_jobset_stores(subject)
    spec = subject.spec
    failure_policy = spec.get("failurePolicy")
    failure_policy = failure_policy if isinstance(failure_policy, dict) else None
    replicated = spec.get("replicatedJobs") if isinstance(spec.get("replicatedJobs"), list) else []
    overview, policy = _start(subject, MAX_RESTARTS, WORKLOAD_KEYS, JOBSET_DEFAULT)
    overview.settings = setting_lines(policy, workload_keys(policy), default=JOBSET_DEFAULT)
    views = [
        (index, rjob, part_plan(subject, _child_path(index), defaulted=False))
        for index, rjob in enumerate(replicated)
        if isinstance(rjob, dict)
    ]
    _jobset_overview(subject, overview, policy, failure_policy, views)
    children = [
        _replicated_job(subject, index, rjob, view, failure_policy, policy, index in defaulted)
        for index, rjob, view in views
        if view is not None
    ]
    return [overview, *children]


def _child_path(index: int) -> tuple[str, ...]:
    return ("spec", f"replicatedJobs[{index}]", "template", "spec")


def _as_jobset_stores(subject: Subject) -> tuple[Subject, set[int]]:
    """JobSet's own webhook sets an unset restartPolicy in a replicated Job's pod template
    to OnFailure: explain the templates with it, as their Jobs will run. Also returns the
    indexes of the replicated Jobs whose restartPolicy this defaulted."""
    final = json_copy(subject.final)
    defaulted = set()
    for index, rjob in enumerate(items(get_path(final, ("spec", "replicatedJobs")))):
        pod_spec = get_path(rjob, ("template", "spec", "template", "spec"))
        if isinstance(pod_spec, dict) and not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = JOBSET_DEFAULT_RESTART_POLICY
            defaulted.add(index)
    return Subject(
        subject.original, final, subject.outcome, subject.ctx, subject.changes
    ), defaulted


def _jobset_overview(
    subject: Subject,
    item: Explanation,
    policy: Policy,
    failure_policy: Mapping[str, Any] | None,
    views: Sequence[tuple[int, Any, PartPlan | None]],
) -> None:
    """The set as a whole: its restart budget and its failurePolicy rules."""
    children = ", ".join(
        f"{_name(rjob, index)} {view.budget}" + (" (restarts in place)" if view.on_failure else "")
        for index, rjob, view in views
        if view is not None
    )
    inside = (
        f" Inside one run, each Job retries its own pods up to its backoffLimit: {children}."
        if children
        else ""
    )
    item.simulate_note = (
        "--simulate walks failures of one replicated Job's pods: see each replicated Job below"
    )
    if failure_policy is None:
        item.budget = (
            "This JobSet has no spec.failurePolicy: the first of its Jobs to fail fails the "
            f"whole JobSet (reason {FAILED_JOBS}); nothing is restarted." + inside
        )
        return
    limit = _int(failure_policy.get("maxRestarts")) or 0
    origin = _origin(policy, JOBSET_DEFAULT)
    item.budget = (
        f"maxRestarts is {limit} ({origin}): when one of its Jobs fails, JobSet restarts "
        "the whole set (every Job is recreated and counts its failures from 0 again) up to "
        f"{count_of(limit, 'time')}, so the set gets up to {count_of(limit + 1, 'run')}; a "
        f"Job that fails in the last run fails the JobSet (reason {MAX_REACHED}). Restarts "
        "by a rule with an ...AndIgnoreMaxRestarts action do not count." + inside
    )
    if in_place_restart(subject.final):
        item.budget += (
            " restartStrategy InPlaceRestart: a pod that fails does not fail its Job "
            "(backoffLimit 2147483647); JobSet restarts the whole set in place instead, and "
            "each such restart counts against maxRestarts, as does any container's restart "
            "count above it. Only a Job that fails (its podFailurePolicy) goes through the "
            "rules below, and the set is then recreated."
        )
    rules = failure_policy.get("rules") if isinstance(failure_policy.get("rules"), list) else []
    item.notes.extend(unread_patterns(rules))
    user_fp = get_path(subject.original, ("spec", "failurePolicy", "rules"))
    item.rules = jobset_rule_lines(
        rules, user_fp if isinstance(user_fp, list) else [], planner.recorded_origins(subject.final)
    )
    item.rules_intro = (
        "When one of its Jobs fails, JobSet checks these rules in order; the first match wins:"
    )
    item.no_match = (
        "anything else (no rule matches): the JobSet restarts (RestartJobSet), counts "
        "against maxRestarts"
    )
    uses_job_restarts = any(
        isinstance(r, dict) and r.get("action") in JOB_RESTART_ACTIONS for r in rules
    )
    if uses_job_restarts and policy.non_spot_attempts:
        item.notes.append(
            "a RestartJob restart recreates only the failed Job and leaves the pods' "
            "jobset.sigs.k8s.io/restart-attempt label as it was, so non-spot placement "
            "does not advance for it"
        )


def _name(rjob: Mapping[str, Any], index: int) -> str:
    name = rjob.get("name")
    return name if isinstance(name, str) and name else f"replicatedJobs[{index}]"


def describe_job_failure(rule: Mapping[str, Any]) -> str:
    """The condition of one JobSet rule, as a phrase: "a Job of workers fails with ..."."""
    targets = [str(t) for t in items(rule.get("targetReplicatedJobs"))]
    reasons = [str(r) for r in items(rule.get("onJobFailureReasons"))]
    patterns = [str(p) for p in items(rule.get("onJobFailureMessagePatterns"))]
    text = f"a Job of {join_words(targets)} fails" if targets else "a Job fails"
    if len(reasons) == 1 and reasons[0] in REASON_WORDS:
        text += f" with reason {reasons[0]} ({REASON_WORDS[reasons[0]]})"
    elif reasons:
        text += f" with reason {join_words(reasons)}"
    if patterns:
        quoted = [f"/{p}/" for p in patterns]
        text += f", its failure message matching {join_words(quoted)}"
    return text


def describe_jobset_then(action: str) -> str:
    return {
        "FailJobSet": "the JobSet fails at once",
        "RestartJobSet": "the JobSet restarts, counts against maxRestarts",
        "RestartJobSetAndIgnoreMaxRestarts": "the JobSet restarts, does not count",
        "RestartJob": "only that Job is recreated, counts against maxRestarts",
        "RestartJobAndIgnoreMaxRestarts": "only that Job is recreated, does not count",
    }.get(action, f"JobSet does not know the action {action!r}")


def jobset_rule_lines(
    rules: Sequence[Any], user_rules: Sequence[Any], origins: Mapping[str, str] | None = None
) -> list[RuleLine]:
    """Every ``failurePolicy`` rule of the final spec, with who wrote it: the user, or this
    webhook for the annotation its applied record names (``origins``, by rule id)."""
    lines = []
    for number, rule in enumerate(rules, 1):
        if not isinstance(rule, dict):
            continue
        name = rule.get("name") or f"failurePolicyRule{number - 1}"
        recorded = origins.get(rule_id(rule)) if origins is not None else None
        if recorded:
            origin = f"added by retry-policy for {recorded} ({name})"
        elif rule in user_rules:
            origin = f"your rule {name}"
        elif origins is None and name == RULE_NAME:
            # A version-1 record names no rule: ours is known by its name.
            origin = f"added by retry-policy for fail-non-retriable ({name})"
        else:
            origin = f"rule {name}"
        action = str(rule.get("action"))
        lines.append(
            RuleLine(
                number=number,
                action=action,
                when=describe_job_failure(rule),
                then=describe_jobset_then(action),
                origin=origin,
                counts=action in ("RestartJobSet", "RestartJob")
                if action in JOBSET_ACTIONS
                else None,
            )
        )
    return lines


def jobset_rule_matches(
    rule: Mapping[str, Any],
    reason: str,
    message: str,
    replicated: str,
    pod: Sequence[Piece] = (Wild(),),
) -> bool:
    """JobSet's ``ruleIsApplicable``: every list the rule has must match (an empty list
    matches anything); message patterns are Go regexps searched for (``webhook.kube.goregexp``),
    with the pod's name in ``message`` (``<namespace>/<pod>``) standing for ``pod``: a
    pattern matches when it does for some such pod. A pattern that cannot be read as Go
    reads it is taken to match, as admission takes it (``unread_patterns`` says which)."""
    reasons = items(rule.get("onJobFailureReasons"))
    targets = items(rule.get("targetReplicatedJobs"))
    patterns = items(rule.get("onJobFailureMessagePatterns"))
    if reasons and reason not in reasons:
        return False
    if targets and replicated not in targets:
        return False
    pieces = message_pieces(message, pod)
    return not patterns or any(pattern_applies(p, pieces)[0] for p in patterns)


#: How ``failjob_message`` shows the failed pod, which is known only at run time.
POD_PLACEHOLDER = "<namespace>/<pod>"


def message_pieces(message: str, pod: Sequence[Piece]) -> list[Piece]:
    if POD_PLACEHOLDER not in message:
        return [message]
    before, after = message.split(POD_PLACEHOLDER, 1)
    return [before, *pod, after]


def unread_patterns(rules: Sequence[Any]) -> list[str]:
    """One note per message pattern explain cannot read as JobSet's Go regexp does."""
    notes = []
    for number, rule in enumerate(rules, 1):
        for pattern in (
            items(rule.get("onJobFailureMessagePatterns")) if isinstance(rule, dict) else []
        ):
            _, why = pattern_applies(pattern, [""])
            if why:
                notes.append(
                    f"rule {number}'s message pattern /{pattern}/ cannot be read as JobSet's Go "
                    f"regexp reads it ({why}): taken to match, as admission takes it"
                )
    return notes


def _replicated_job(
    subject: Subject,
    index: int,
    rjob: Mapping[str, Any],
    view: PartPlan,
    failure_policy: Mapping[str, Any] | None,
    set_policy: Policy,
    defaulted_restart: bool,
) -> Explanation:
    name = _name(rjob, index)
    item = subject.header(f"replicatedJob {name}")
    item.changes = []  # listed once, with the JobSet
    in_place = in_place_restart(subject.final)
    item.budget = _child_budget(
        view, set_policy, failure_policy is not None, in_place, index in initializers(subject.final)
    )
    item.rules = part_rule_lines(view)
    item.no_match = no_match(view)
    max_restarts = _int(mapping(failure_policy).get("maxRestarts")) or 0
    rules = mapping(failure_policy).get("rules")
    metadata = mapping(subject.final.get("metadata"))
    namespace = metadata.get("namespace") or subject.ctx.namespace
    jobset_name = metadata.get("name")
    # Pods of this replicated Job: <namespace>/<jobset>-<replicatedJob>-<job>-<index>-<random>.
    pod: list[Piece] = [namespace if isinstance(namespace, str) and namespace else Wild(), "/"]
    if isinstance(jobset_name, str) and jobset_name:
        pod.append(f"{jobset_name}-{name}-")
    pod.append(Wild())
    simulator = JobSetSimulator(
        job_simulator(view),
        rules=(rules if isinstance(rules, list) else []) if failure_policy is not None else None,
        max_restarts=max_restarts,
        replicated=name,
        pod=pod,
        in_place=in_place,
    )
    item.simulator = simulator
    item.examples = simulator.examples()
    restarts_in_place(item, view, simulator.job)
    if failure_policy is None:
        item.plan = build_plan(
            "no failurePolicy: maxRestarts",
            0,
            view.pods.backoff_limit,
            view.pods.non_spot_attempts,
            f"the JobSet fails ({FAILED_JOBS})",
            unit="run",
            delays=view.delays,
        )
    else:
        item.plan = build_plan(
            "spec.failurePolicy.maxRestarts",
            max_restarts,
            view.pods.backoff_limit,
            view.pods.non_spot_attempts,
            f"the JobSet fails ({MAX_REACHED})",
            unit="run",
            delays=view.delays,
        )
    item.notes.extend(_child_notes(rjob, view, defaulted_restart, in_place))
    failure_aware(item, view, subject)
    between_notes(item, view)
    return item


def _child_budget(
    view: PartPlan,
    set_policy: Policy,
    restarts: bool,
    in_place: bool = False,
    initializer: bool = False,
) -> str:
    """The child Job's own budget, and what its failure does to the set."""
    setting = view.policy.setting("backoff-limit")
    asked = set_policy.setting("backoff-limit")
    if in_place and restarts and not initializer:
        return (
            f"backoffLimit is {view.limit}, as JobSet's restartStrategy InPlaceRestart "
            "requires: when a pod fails, the Job recreates it and JobSet restarts every other "
            "pod of the set in place, on the same nodes; each such restart counts against "
            "maxRestarts. The Job itself fails only through its podFailurePolicy (or its "
            "deadline), and then the JobSet's failure policy (above) decides."
        )
    if initializer:
        # Left out of the policy (``jobset.initializers``): its budget is its own.
        written = (
            "written in its template" if setting.source is Source.SPEC else "Kubernetes' default"
        )
        origin = (
            f"{written}: a TrainJob's initializers keep their own retries, the retry "
            "policy is the trainer's"
        )
    elif (
        view.per_index is None
        and view.limit == 0
        and setting.source in WRITTEN_SOURCES
        and asked.source in WRITTEN_SOURCES
    ):
        origin = (
            "set by retry-policy: backoff-limit counts runs of the JobSet, so every counted "
            "pod failure restarts the set"
        )
    else:
        origin = "from " + source_text("backoff-limit", setting, long=True)
    text = job_budget(view.limit, origin, view.per_index, view.max_failed, view.on_failure)
    if not restarts:
        return f"{text} A Job that fails fails the whole JobSet: it has no failurePolicy."
    return (
        f"{text} A Job that fails does not end the JobSet by itself: the JobSet's failure "
        "policy (above) decides."
    )


def _child_notes(
    rjob: Mapping[str, Any], view: PartPlan, defaulted_restart: bool, in_place: bool = False
) -> list[str]:
    notes = []
    replicas = _int(rjob.get("replicas"))
    if replicas is not None and replicas > 1:
        notes.append(
            f"{replicas} Jobs are made from this template; the simulation follows the pods of "
            "one of them, and a failure in any of them counts the same"
        )
    if defaulted_restart:
        notes.append(
            "restartPolicy is not set: JobSet's own webhook sets it to OnFailure, so failed "
            "containers restart in place and no podFailurePolicy can apply"
        )
    if view.pods.non_spot_attempts:
        notes.append(
            "pods are placed by run, not by attempt: each run's pods carry the label "
            "jobset.sigs.k8s.io/restart-attempt (the JobSet's status.restarts), and "
            f"annotations backoff-limit {view.pods.backoff_limit} and non-spot-attempts "
            f"{view.pods.non_spot_attempts}; restarts that do not count against maxRestarts "
            "raise that label too, so placement can start early, never late"
        )
    if not view.on_failure and view.limit > 0 and view.per_index is None and not in_place:
        notes.append(
            f"inside each run this Job's pods may fail {count_of(view.limit, 'time')} "
            "(counted) before the Job fails"
        )
    return notes


@dataclass
class JobSetState:
    """JobSet's counters: ``status.restarts`` (the restart-attempt label),
    ``status.restartsCountTowardsMax``, and the simulated Job's own restarts that count
    (KEP-262 tracks those per Job for the RestartJob actions)."""

    restarts: int = 0
    toward: int = 0
    job_toward: int = 0
    #: The simulated Job's own counters; a restart recreates the Job and starts them again.
    job: JobState = field(default_factory=JobState)


class JobSetSimulator:
    """Pod failures of one Job of replicated Job ``replicated``, through the child Job's
    counting (``JobSimulator.fail``) and then, when the Job fails, JobSet's failure policy.

    ``rules`` is ``None`` when the JobSet has no ``failurePolicy``.
    """

    def __init__(
        self,
        job: JobSimulator,
        rules: Sequence[Any] | None,
        max_restarts: int,
        replicated: str,
        pod: Sequence[Piece] = (Wild(),),
        in_place: bool = False,
    ):
        self.job = job
        self.rules = list(rules) if rules is not None else None
        self.max_restarts = max_restarts
        self.replicated = replicated
        self.containers = job.containers
        #: The failed pod's namespace/name as JobSet's message patterns see it.
        self.pod = list(pod)
        #: restartStrategy InPlaceRestart: a pod failure the Job survives restarts the set
        #: in place, counted (``exceededMaxRestarts`` in pkg/controllers/in_place_restart.go).
        self.in_place = in_place

    def decide(self, reason: str, message: str) -> tuple[int | None, str]:
        """The first JobSet rule (0-based) that applies to the failed Job, and its action."""
        for index, rule in enumerate(self.rules or []):
            if (
                isinstance(rule, dict)
                and rule.get("action") in JOBSET_ACTIONS
                and jobset_rule_matches(rule, reason, message, self.replicated, self.pod)
            ):
                return index, str(rule["action"])
        return None, "RestartJobSet"

    def examples(self) -> list[str]:
        """What common failures do in the first run, each walked like a real one."""
        out = []
        for event in self.job.example_events():
            (step,) = self.run([event]).steps
            out.append(f"{step.what}: {step.result}")
        return out

    def run(self, events: Sequence[Event]) -> Simulation:
        counters = JobSetState()
        backoff = Backoff()

        def step(number: int, event: Event) -> tuple[Step, Ending | None]:
            run = (counters.toward if self.in_place else counters.restarts) + 1
            placed = self.job.placement(counters.restarts)
            pod = number - backoff.events
            done = self.job.restart_in_place(backoff, event)
            facts = self.job.pod_facts(counters.job, counters.restarts)
            replaced, said = self.job.replacement(backoff, event) if done else (None, "")
            if done and replaced is None:
                job = counters.job
                used = job.index_counted if self.job.per_index is not None else job.counted
                made = self.job.in_place_step(
                    pod,
                    used,
                    placed,
                    event,
                    done,
                    counted=counters.toward,
                    run=run,
                    restarts=counters.restarts,
                    facts=facts,
                )
                return made, None
            where = f"in run {run}, {on_nodes(placed)}"
            outcome = self.job.fail(counters.job, replaced or event, pod, where)
            if replaced is not None:
                backoff.events -= 1  # (a restart, and the pod's failure: a new pod follows)
            backoff.new_pod()
            result = lead(outcome.verdict, outcome.result)
            if replaced is not None:
                result = f"{inplace.restart_text(done, going_on=False)}; {said}: {result}"
            ending = None
            if outcome.ending is None and self.in_place and self.rules is not None:
                result, ending = self._in_place(outcome.verdict, counters)
            elif outcome.ending is not None:
                reason = str(outcome.ending.reason)
                text, ending = self._job_failed(reason, outcome.message, counters)
                if ending is None and outcome.memory:
                    text += f", with {outcome.memory}"
                result = f"{lead(outcome.verdict, self._job_text(outcome.result, reason))}; {text}"
            made = Step(
                pod=outcome.attempt if self.job.on_failure else pod,
                attempt=number if self.job.on_failure else outcome.attempt,
                nodes="same pod" if self.job.on_failure else placed,
                event=event.token,
                what=event.describe(self.job.main),
                rule=outcome.match.index + 1 if outcome.match else None,
                action=outcome.match.action if outcome.match else None,
                counted=outcome.counted,
                counted_failures=counters.toward,
                result=result,
                run=run,
                restarts=counters.restarts,
                in_place=tuple(done) if replaced is not None else (),
                facts=facts,
                replaced=replaced is not None,
            )
            return made, ending

        steps, ending, unused = walk(events, step)
        return Simulation(
            [e.token for e in events],
            steps,
            ending or self._running(counters),
            unused,
            in_place=self.job.summary(backoff),
            next=self._next(counters, len(events) - backoff.events + 1, steps, ending),
        )

    def _next(
        self, counters: JobSetState, pod: int, steps: Sequence[Step], ending: Ending | None
    ) -> NextPod | None:
        """The pod that runs next, when the JobSet still runs and no pod goes on."""
        facts = self.job.pod_facts(counters.job, counters.restarts)
        if ending is not None or (steps and steps[-1].in_place) or facts is None:
            return None
        job = counters.job
        used = job.index_counted if self.job.per_index is not None else job.counted
        run = (counters.toward if self.in_place else counters.restarts) + 1
        return NextPod(pod, used + 1, facts, run)

    @staticmethod
    def _job_text(result: str, reason: str) -> str:
        if reason == "FailedIndexes":
            return f"{result}; once its other indexes are done the Job fails (FailedIndexes)"
        if result.startswith("the Job fails"):
            return f"{result} ({reason})"
        return f"{result}: the Job fails ({reason})"

    def _job_failed(
        self, reason: str, message: str, counters: JobSetState
    ) -> tuple[str, Ending | None]:
        """JobSet's reaction to its Job failing: the text, and the JobSet's ending (if it
        ends); a recreated Job starts counting again (``counters.job``)."""
        where = f"a Job of {self.replicated} failed with reason {reason}"
        if self.rules is None:
            return (
                f"the JobSet has no failurePolicy: it fails ({FAILED_JOBS})",
                Ending("Failed", FAILED_JOBS, f"{where}, and there is no failurePolicy"),
            )
        index, action = self.decide(reason, message)
        if index is None:
            label = "no JobSet rule matches (RestartJobSet)"
        else:
            rule = self.rules[index]
            name = rule.get("name") or f"failurePolicyRule{index}"
            label = f"JobSet rule {index + 1} {name} ({action})"
        limit = self.max_restarts
        if action == "FailJobSet":
            return (
                f"{label}: the JobSet fails at once",
                Ending("Failed", FAIL_ACTION, f"{where}, and rule {index + 1} {name} says so"),
            )
        counts = action in ("RestartJobSet", "RestartJob")
        if counts and max(counters.toward, counters.job_toward) >= limit:
            used = max(counters.toward, counters.job_toward)
            return (
                f"{label}: {used} of {limit} restarts used, the JobSet fails",
                Ending("Failed", MAX_REACHED, f"{where} after {used} of maxRestarts {limit}"),
            )
        whole = action in RESTART_ACTIONS
        if counts:
            counters.job_toward += 1
            counters.toward += 1 if whole else 0
        if whole:
            counters.restarts += 1
        tally = (
            f"{max(counters.toward, counters.job_toward)} of {limit} restarts used"
            if counts
            else f"not counted, still {counters.toward} of {limit} restarts used"
        )
        what = "the JobSet restarts" if whole else "only this Job is recreated"
        nodes = on_nodes(self.job.placement(counters.restarts))
        again = "" if whole else " again"
        # A new Job; the set's failure history (its lineage) goes on.
        counters.job = JobState(
            ooms=counters.job.ooms,
            failed_nodes=counters.job.failed_nodes,
            disruptions=counters.job.disruptions,
        )
        return (
            f"{label}: {what} ({tally}); next: run {counters.restarts + 1}{again}, {nodes}",
            None,
        )

    def _in_place(self, verdict: str, counters: JobSetState) -> tuple[str, Ending | None]:
        """InPlaceRestart: the failed pod is recreated and every other pod restarts in
        place; JobSet fails once the restarts counted exceed maxRestarts. The pods keep
        their restart-attempt label (status.restarts does not change)."""
        limit = self.max_restarts
        head = lead(verdict, "the Job goes on (its backoffLimit is 2147483647)")
        if counters.toward >= limit:
            return (
                f"{head}; the set would restart in place, but {counters.toward} of {limit} "
                "restarts are used: the JobSet fails",
                Ending(
                    "Failed",
                    MAX_REACHED,
                    f"a pod of {self.replicated} failed after {counters.toward} of maxRestarts "
                    f"{limit} in-place restarts",
                ),
            )
        counters.toward += 1
        return (
            f"{head}; the whole set restarts in place ({counters.toward} of {limit} restarts "
            f"used); next: run {counters.toward + 1}, on the same nodes",
            None,
        )

    def _running(self, counters: JobSetState) -> Ending:
        run = f"run {(counters.toward if self.in_place else counters.restarts) + 1}"
        if self.rules is None:
            return Ending("Running", None, f"{run} goes on; the first Job to fail ends it")
        left = self.max_restarts - counters.toward
        return Ending(
            "Running",
            None,
            f"{run} goes on (restart-attempt {counters.restarts}), "
            f"{on_nodes(self.job.placement(counters.restarts))}; "
            + (
                f"{count_of(left, 'more restart')} can count before the JobSet fails"
                if left > 0
                else "the next Job to fail by a counted restart ends it"
            ),
        )


# --- ray.io/v1 RayJob -------------------------------------------------------------------

RAYJOB_DEFAULT = "RayJob default"


@explainer(RAY_GROUP, "RayJob")
def explain_rayjob(subject: Subject) -> list[Explanation]:
    spec = subject.spec
    keys = ("backoff-limit", "error-propagation")
    item, policy = _start(subject, rayjob.BACKOFF, keys, RAYJOB_DEFAULT)
    limit = _int(spec.get("backoffLimit")) or 0
    origin = _origin(policy, RAYJOB_DEFAULT)
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
    item.plan = build_plan("spec.backoffLimit", runs, None, 0, "the RayJob fails (AppFailed)")
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
    item, policy = _start(subject, pytorchjob.BACKOFF, keys, PYTORCH_DEFAULT)
    replicas = spec.get("pytorchReplicaSpecs")
    replicas = replicas if isinstance(replicas, dict) else {}
    original = mapping(get_path(subject.original, ("spec", "pytorchReplicaSpecs")))
    restart = {
        rtype: str(get_path(rspec, ("restartPolicy",)) or OPERATOR_DEFAULT_RESTART_POLICY)
        for rtype, rspec in sorted(replicas.items())
    }
    primary = "Master" if "Master" in restart else next(iter(restart), "Master")
    policy_name = restart.get(primary, OPERATOR_DEFAULT_RESTART_POLICY)
    limit = _int(get_path(spec, ("runPolicy", "backoffLimit")))
    origin = _origin(policy, PYTORCH_DEFAULT)
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
        item.plan = build_plan(
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
    if runtime is None:
        item.budget = (
            f"The trainer makes a JobSet from {label}, which carries these settings "
            "(spec.runtimePatches) and gets the policy at its own admission; its budget, "
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
