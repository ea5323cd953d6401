"""batch/v1 JobSpecs (a Job's and every kind built on one) and Pods: the plan, and the
simulation of failures the Job controller would judge."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.explain import inplace
from webhook.explain.inplace import Backoff
from webhook.explain.model import (
    BETWEEN_KEYS,
    BUDGET_KEYS,
    FAILURE_AWARE_KEYS,
    IN_PLACE_KEYS,
    POD_KEYS,
    SIGKILL,
    SIGTERM,
    WORKLOAD_KEYS,
    Ending,
    Event,
    ExplainError,
    Explanation,
    InPlaceRestart,
    InPlaceSummary,
    NextPod,
    PodFacts,
    RuleLine,
    Simulation,
    Step,
    Subject,
    explainer,
    memory_table,
    memory_words,
)
from webhook.explain.words import (
    build_plan,
    count_of,
    describe_then,
    nodes_text,
    on_nodes,
    rule_lines,
    setting_lines,
    source_text,
)
from webhook.kinds import planner
from webhook.kinds.workload import resolve_limit
from webhook.kube import failurepolicy, jobcontroller, restartrules
from webhook.kube.failurepolicy import Match
from webhook.kube.objects import items, mapping
from webhook.kube.restartrules import PodRestarts
from webhook.kube.wellknown import INDEX_FAILURE_COUNT
from webhook.plan import causes
from webhook.plan.failureaware import ContainerMemory, MemoryPlan
from webhook.plan.inplace import InPlaceEnds
from webhook.plan.model import (
    LimitField,
    PartPlan,
    first_non_spot,
    job_limit_field,
    non_spot,
)
from webhook.plan.outcome import Outcome
from webhook.plan.policies import workload_policy
from webhook.policy.model import (
    INT32_MAX,
    PREFIX,
    BadValue,
    Delays,
    Policy,
    format_duration,
    parse_count,
)

# --- batch/v1 JobSpec ------------------------------------------------------------------


def _unmanaged_policy(
    subject: Subject, path: Sequence[str], spec: Mapping[str, Any], defaulted: bool = True
) -> Policy:
    """The policy of a JobSpec the mutator did not touch (no annotations, no defaults):
    resolved the same way, so provenance still says where backoffLimit came from."""
    return unmanaged_policy(subject, job_limit_field(tuple(path), spec, defaulted))


def unmanaged_policy(subject: Subject, field: LimitField) -> Policy:
    """The policy of an object the mutator did not touch, resolved against ``field`` (the
    kind's budget) the way the mutator would have."""
    policy, _ = workload_policy(subject.final.get("metadata"), subject.ctx)
    return resolve_limit(subject.final, field, policy, Outcome())


def part_rule_lines(view: PartPlan) -> list[RuleLine]:
    return rule_lines(view.rules, view.user_rules, view.policy, view.scope, view.origins)


def no_match(view: PartPlan) -> str:
    if view.on_failure:
        return (
            "with restartPolicy OnFailure, a failed container restarts inside the same pod "
            "and every restart counts (a podFailurePolicy needs restartPolicy Never)"
        )
    if view.rules:
        return f"anything else (no rule matches): retried, counts against {view.scope}"
    return f"there are no podFailurePolicy rules: every failure counts against {view.scope}"


def job_simulator(view: PartPlan) -> JobSimulator:
    """The Job controller's counting of one JobSpec part's pods."""
    return JobSimulator(
        rules=view.rules,
        backoff_limit=view.limit,
        per_index=view.per_index,
        max_failed_indexes=view.max_failed,
        placement_limit=view.placement_limit,
        non_spot_attempts=view.pods.non_spot_attempts,
        containers=view.containers,
        on_failure=view.on_failure,
        init=view.init,
        sidecars=view.sidecars,
        memory=view.memory,
        restarts=view.restarts,
        bound=view.bound,
        template_memory=view.template_memory,
        avoided_nodes=view.avoided_nodes,
        delays=view.delays,
        max_disruptions=view.causes.max_disruptions,
        max_in_place_restarts=view.causes.max_in_place_restarts,
    )


def part_plan(subject: Subject, path: Sequence[str], defaulted: bool = True) -> PartPlan | None:
    """The plan of the JobSpec at ``path`` of the reviewed object (``None`` when there is
    none): the planner's, from what admission recorded for it (``Outcome.plans``), or,
    for a part admission did not write, with the policy it would have resolved
    (``defaulted`` says whether the API server defaults this spec, a Job's own, or not,
    a template in a CronJob or JobSet)."""
    planned = subject.planned(".".join(path))
    if planned is not None:
        return planner.part_plan(
            planned.policy, planned.path, subject.original, subject.final, subject.ctx
        )
    spec = planner.at_path(subject.final, path)
    if not isinstance(spec, dict):
        return None
    policy = _unmanaged_policy(subject, path, spec, defaulted)
    return planner.part_plan(policy, path, subject.original, subject.final, subject.ctx)


def explain_job_spec(
    subject: Subject, path: Sequence[str] = ("spec",), part: str = "", defaulted: bool = True
) -> Explanation:
    """Explain the batch/v1 JobSpec at ``path`` of the reviewed object."""
    item = subject.header(part)
    view = part_plan(subject, path, defaulted)
    if view is None:
        item.notes.append(f"{'.'.join(path)} is missing: nothing to explain")
        return item
    policy = view.policy
    item.settings = setting_lines(policy, workload_keys(policy))
    origin = "from " + source_text("backoff-limit", policy.setting("backoff-limit"), long=True)
    item.budget = job_budget(view.limit, origin, view.per_index, view.max_failed, view.on_failure)
    item.rules = part_rule_lines(view)
    item.no_match = no_match(view)
    simulator = job_simulator(view)
    item.simulator = simulator
    item.examples = simulator.examples()
    restarts_in_place(item, view, simulator)
    if view.on_failure:
        item.notes.append(
            "non-spot placement applies to new pods only; a container restarting in "
            "place stays on its node"
        )
    else:
        final = (
            "the index fails"
            if view.per_index is not None
            else "the Job fails (BackoffLimitExceeded)"
        )
        item.plan = build_plan(
            f"{view.path}.{view.scope}",
            view.budget,
            view.placement_limit,
            view.pods.non_spot_attempts,
            final,
            delays=view.delays,
        )
    item.notes.extend(_job_notes(view))
    item.notes.extend(budget_notes(view))
    failure_aware(item, view, subject)
    between_notes(item, view)
    return item


def between_notes(item: Explanation, view: PartPlan) -> None:
    """What ``attempt-env`` tells each pod, and what ``retry-delay`` holds it back for."""
    unit = "run of the JobSet" if not view.placed_by_job else "attempt"
    if view.pods.attempt_env:
        per = (
            "its index's failures"
            if view.per_index is not None
            else "the JobSet's restarts"
            if not view.placed_by_job
            else "the Job's counted failures, or in an Indexed Job its index's"
        )
        item.notes.append(
            f"attempt-env: every container learns its {unit} from RETRY_POLICY_ATTEMPT "
            f"({per} before it), its budget from RETRY_POLICY_MAX_ATTEMPTS where it is "
            "known, and the previous failure from "
            "RETRY_POLICY_LAST_FAILURE (oom-killed:<container>, "
            "exit-code:<code>:<container>, disruption, or empty)"
        )
    if view.delays is not None:
        item.notes.append(
            f"retry-delay: each retry is held back (a scheduling gate) for the time in the "
            f"plan's waits column after the failure before it, at most "
            f"{format_duration(view.delays.cap)}; a controller removes the gate, and while "
            "none leads retries are not held back"
        )


def _facts_delay(delays: Delays | None, failures: int) -> int:
    return delays.seconds(failures) if delays is not None else 0


def budget_notes(view: PartPlan, unit: str = "") -> list[str]:
    """What the budgets per cause do, and what only a controller can (they act through
    it: ``webhook.controller.disruptions``, ``webhook.controller.restarts``)."""
    notes = []
    scope = unit or ("each index" if view.per_index is not None else "this Job")
    n = view.causes.max_disruptions
    if n is not None:
        free = {
            0: f"no disruption of {scope} is free",
            1: f"the first disruption of {scope} is free",
        }
        notes.append(
            f"max-disruptions {n}: "
            + free.get(n, f"the first {n} disruptions of {scope} are free")
            + f"; from disruption {n + 1} on, the controller marks each disrupted pod "
            f"{failurepolicy.DISRUPTION_BUDGET_EXHAUSTED} and it counts against {view.scope}"
        )
    peers = view.causes.peer_disruptions
    if peers is not None:
        does = "are ignored" if peers == "ignore" else f"count against {view.scope}"
        notes.append(
            f"peer-disruptions {peers}: when a pod is disrupted, the controller "
            f"marks its running peers {failurepolicy.PEER_DISRUPTED}; their failures {does}, "
            "whatever their exit codes (simulate one with the event peer)"
        )
    return notes


def workload_keys(policy: Policy) -> tuple[str, ...]:
    """The settings to list: failure-aware, in-place and between-attempts ones only when
    one is set."""
    keys = WORKLOAD_KEYS
    if any(policy.explicit(name) for name in FAILURE_AWARE_KEYS):
        keys += FAILURE_AWARE_KEYS
    keys += in_place_keys(policy) + between_keys(policy)
    if any(policy.explicit(name) for name in BUDGET_KEYS):
        keys += BUDGET_KEYS
    return keys


def between_keys(policy: Policy) -> tuple[str, ...]:
    if any(policy.explicit(name) for name in BETWEEN_KEYS):
        return BETWEEN_KEYS
    return ()


def in_place_keys(policy: Policy) -> tuple[str, ...]:
    if policy.in_place_exit_codes or any(policy.explicit(name) for name in IN_PLACE_KEYS):
        return IN_PLACE_KEYS
    return ()


def restarts_in_place(item: Explanation, view: PartPlan, simulator: JobSimulator) -> None:
    """Each container's exit codes, when some restart in place, and what that means for
    placement: non-spot-attempts counts pods, and a restart in place makes none."""
    item.notes.extend(view.dropped)
    if view.restarts is None:
        return
    item.in_place = inplace.plan(view.restarts, simulator.judge_exit, view.bound)
    if view.pods.non_spot_attempts:
        counted = (
            ("attempts", "counts pods", "Job")
            if view.placed_by_job
            else ("runs", "counts runs of the set", "JobSet")
        )
        unit, counts, owner = counted
        item.notes.append(
            f"restarts in place are not {unit}: non-spot-attempts {counts}, and a container "
            "restarting in place stays in its pod, on its node, so it does not move the "
            f"{owner} toward its last non-spot {unit}"
        )


def failure_aware(item: Explanation, view: PartPlan, subject: Subject) -> None:
    """The memory each attempt gets after OOM kills, and where failed nodes go."""
    if view.memory is not None:
        item.memory = memory_table(view.memory)
        if not view.memory.containers:
            item.notes.append(
                "oom-memory-factor: no container sets a memory request or limit, so none "
                "can be raised"
            )
    if view.pods.avoid_failed_nodes:
        scope = "of its index" if view.per_index is not None else "of this Job"
        most = subject.ctx.config.rails(subject.ctx.namespace).max_avoided_nodes
        item.notes.append(
            f"avoid-failed-nodes: each new attempt keeps off the nodes where the last "
            f"{count_of(most, 'failed attempt')} {scope} ran (guardRails.maxAvoidedNodes)"
        )


def job_budget(
    limit: int, origin: str, per_index: int | None, max_failed: int | None, on_failure: bool
) -> str:
    if on_failure:
        runs = "the first restart fails it" if limit == 0 else f"restart number {limit} fails it"
        return (
            f"backoffLimit is {limit} ({origin}). With restartPolicy OnFailure, Kubernetes "
            f"counts container restarts: {runs} (BackoffLimitExceeded)."
        )
    if per_index is not None:
        text = (
            f"backoffLimitPerIndex is {per_index}: each index may fail {per_index} "
            f"time{'s' if per_index != 1 else ''} and is retried; failure number "
            f"{per_index + 1} of an index fails that index, and the Job ends with reason "
            "FailedIndexes once the other indexes are done."
        )
        if max_failed is not None:
            text += (
                f" More than {max_failed} failed index{'es' if max_failed != 1 else ''} "
                "fail the Job at once (MaxFailedIndexesExceeded)."
            )
        return text + f" backoffLimit ({limit}, {origin}) still caps all counted failures."
    if limit == 0:
        return (
            f"backoffLimit is 0 ({origin}): the first counted failure fails the Job "
            "(BackoffLimitExceeded). Ignored failures do not count."
        )
    return (
        f"backoffLimit is {limit} ({origin}): the Job is retried after up to {limit} "
        f"counted failure{'s' if limit != 1 else ''}, so it gets up to {limit + 1} attempts; "
        f"counted failure number {limit + 1} fails it (BackoffLimitExceeded). "
        "Failures an Ignore rule matches do not count and do not use up an attempt, "
        "however many there are."
    )


def _job_notes(view: PartPlan) -> list[str]:
    notes = []
    limit, per_index, pod_policy = view.limit, view.per_index, view.pods
    parallelism, completions = view.parallelism, view.completions
    if per_index is None and (
        (isinstance(parallelism, int) and parallelism > 1)
        or (isinstance(completions, int) and completions > 1)
    ):
        notes.append(
            f"this Job runs {completions} completions, {parallelism} pods at a time; "
            "all its pods share one budget, and the attempt number is the Job's count "
            "of counted failures so far"
        )
    n, placement_limit = pod_policy.non_spot_attempts, pod_policy.backoff_limit
    if per_index is not None and n > 0 and placement_limit is not None:
        boundary = first_non_spot(placement_limit, n)
        if boundary > per_index:
            notes.append(
                f"non-spot-attempts counts against backoffLimit ({placement_limit}), not "
                f"backoffLimitPerIndex ({per_index}): an index fails before its attempt "
                f"reaches {boundary}, so no attempt runs on non-spot nodes"
            )
    if placement_limit is not None and n > 0 and per_index is None and placement_limit != limit:
        notes.append(
            f"the pod template's backoff-limit annotation is {placement_limit}, but pods "
            f"place themselves by the Job's backoffLimit ({limit}), read when each is created"
        )
    if n > 0 and per_index is None and view.placed_by_job and not view.on_failure:
        notes.append(
            "spec.backoffLimit may be changed while the Job runs: pods created after the "
            "change place the last attempts by the new value"
        )
    return notes


@dataclass
class JobState:
    """The Job controller's counters for one Job; a JobSet restart starts a fresh one."""

    #: Counted failures (``status.failed`` without the pods an Ignore rule matched).
    counted: int = 0
    #: The same, for the one simulated index (Jobs with ``backoffLimitPerIndex``).
    index_counted: int = 0
    #: restartPolicy OnFailure: container restarts of the running pod.
    restarts: int = 0
    #: restartPolicy OnFailure: the pod running now (a disrupted pod is replaced).
    pod: int = 1
    #: OOM kills so far per container (for oom-memory-factor; a JobSet's run keeps them).
    ooms: dict[str, int] = field(default_factory=dict)
    #: Failed pods that leave a node to avoid (avoid-failed-nodes; a JobSet's run keeps
    #: them): a disrupted pod was being deleted, and its node did not fail it.
    failed_nodes: int = 0
    #: Disruptions counted against max-disruptions (a JobSet's budget is the set's: a run
    #: keeps them).
    disruptions: int = 0


@dataclass(frozen=True)
class PodOutcome:
    """What one failed pod does to its Job."""

    match: Match | None
    counted: bool
    #: The attempt the failed pod was (1-based), and allowed failures used after it.
    attempt: int
    used: int
    #: "rule 2 (FailJob)", "no rule matches", or "" when the kind has no rules at all.
    verdict: str
    #: The sentence after the verdict: what the Job does now.
    result: str
    #: Set when the Job (or, with a per-index budget, its index) has failed.
    ending: Ending | None = None
    #: The condition message the Job controller writes (JobSet rules may match it).
    message: str = ""
    #: The memory the next attempt's OOM-killed containers get ("" when none was).
    memory: str = ""


class JobSimulator:
    """The Job controller's bookkeeping for a sequence of failed pods.

    A failure an Ignore rule matches is not counted; any other (Count, FailJob, FailIndex,
    no match) is. FailJob fails the Job at once (reason PodFailurePolicy); otherwise the Job
    fails when counted failures exceed backoffLimit (BackoffLimitExceeded), checked in that
    order as in ``syncJob``. With backoffLimitPerIndex the events are one index's pods: a
    FailIndex match, or counted failures of the index exceeding the per-index limit, fail
    the index. With restartPolicy OnFailure, failed containers restart in place and the Job
    fails when restarts reach backoffLimit (``pastBackoffLimitOnFailure``).

    Controllers that count the same way under other names reuse it: ``owner`` is the kind
    that fails, ``fail_reason`` and ``limit_reason`` the reasons it then reports (a
    PyTorchJob reports PyTorchJobFailed for both), ``action_names`` renames rule actions
    for kinds whose rules are not a podFailurePolicy, ``unit`` is what one event fails
    ("pod", or "attempt" for a RayJob) and ``retry_where`` where the next attempt runs when
    placement does not apply ("on a new RayCluster"). ``replaced_pods_count`` False: with
    restartPolicy OnFailure, a pod that fails as a whole is replaced without counting (the
    training operator counts only restarts of running pods, unless the limit is 0).
    """

    def __init__(
        self,
        rules: Sequence[Any],
        backoff_limit: int,
        per_index: int | None,
        max_failed_indexes: int | None,
        placement_limit: int | None,
        non_spot_attempts: int,
        containers: Sequence[str],
        on_failure: bool = False,
        *,
        owner: str = "Job",
        fail_reason: str = "PodFailurePolicy",
        limit_reason: str = "BackoffLimitExceeded",
        action_names: Mapping[str, str] | None = None,
        unit: str = "pod",
        retry_where: str | None = None,
        failed_as: str = "condition Failed",
        limit_field: str | None = None,
        init: Sequence[str] = (),
        sidecars: Sequence[str] = (),
        memory: MemoryPlan | None = None,
        replaced_pods_count: bool = True,
        restarts: PodRestarts | None = None,
        bound: InPlaceEnds | None = None,
        template_memory: Sequence[ContainerMemory] = (),
        avoided_nodes: int | None = None,
        delays: Delays | None = None,
        max_disruptions: int | None = None,
        max_in_place_restarts: int | None = None,
    ):
        self.rules = list(rules)
        self.backoff_limit = backoff_limit
        self.per_index = per_index
        self.max_failed_indexes = max_failed_indexes
        self.placement_limit = placement_limit
        self.non_spot_attempts = non_spot_attempts
        self.containers = list(containers) or ["main"]
        self.on_failure = on_failure
        self.owner = owner
        self.fail_reason = fail_reason
        self.limit_reason = limit_reason
        self.action_names = dict(action_names or {})
        self.unit = unit
        self.retry_where = retry_where
        self.failed_as = failed_as
        self.limit_field = limit_field
        #: The pod's init containers (the controller reads their statuses last), and those
        #: of them that are native sidecars (stopped at pod shutdown).
        self.init = list(init)
        self.sidecars = list(sidecars)
        self.replaced_pods_count = replaced_pods_count
        #: What OOM-killed containers get in later attempts (``oom-memory-factor``).
        self.memory = memory
        #: The containers' restart rules (restarts in place), and what ends them.
        self.restarts = restarts
        self.bound = bound or InPlaceEnds()
        #: For each pod's facts: its containers' memory as written, and the most failed
        #: nodes a pod keeps off (``None``: it keeps off none).
        self.template_memory = tuple(template_memory)
        self.avoided_nodes = avoided_nodes
        #: What each new pod waits after the failure before it (``retry-delay``).
        self.delays = delays
        #: Budgets per cause: the disruptions that are free, and the restarts in place a
        #: pod makes before the controller replaces it (``webhook.plan.causes``).
        self.max_disruptions = max_disruptions
        self.max_in_place_restarts = max_in_place_restarts

    def pod_facts(self, state: JobState, placed_by: int) -> PodFacts | None:
        """What the next pod is admitted with, after the failures in ``state``;
        ``placed_by`` is the count its placement reads (counted failures, or a JobSet's
        restarts). ``None`` under restartPolicy OnFailure: no new pod is made."""
        if self.on_failure:
            return None
        plan = self.memory
        memory = tuple(
            ContainerMemory(m.container, *plan.at(m.container, state.ooms.get(m.container, 0)))
            if plan is not None
            else m
            for m in self.template_memory
        )
        avoided = min(state.failed_nodes, self.avoided_nodes or 0)
        delay = _facts_delay(self.delays, placed_by)
        return PodFacts(self.placement(placed_by) == nodes_text(True), memory, avoided, delay)

    def oom(self, state: JobState, event: Event) -> str:
        """Count the event's OOM kills; say the memory the next attempt's containers get."""
        if self.memory is None:
            return ""
        raised = []
        for name in event.oom_killed(self.main):
            state.ooms[name] = state.ooms.get(name, 0) + 1
            if name in self.memory.containers:
                raised.append(memory_words(self.memory, name, state.ooms[name]))
        return ", ".join(raised)

    @property
    def main(self) -> str:
        return self.containers[0]

    @property
    def scope(self) -> str:
        if self.limit_field:
            return self.limit_field
        return "backoffLimitPerIndex" if self.per_index is not None else "backoffLimit"

    @property
    def limit(self) -> int:
        return self.per_index if self.per_index is not None else self.backoff_limit

    def action(self, match: Match) -> str:
        return self.action_names.get(match.action, match.action)

    def judge(self, event: Event, extra: Sequence[str] = ()) -> tuple[Match | None, bool]:
        """The rule a failure matches and whether it counts (the one shared evaluation);
        ``extra``: conditions the controller added to this pod."""
        if self.on_failure and not event.disruption:
            return None, True
        failure = event.failure(self.main, self.init, extra)
        match = failurepolicy.evaluate(self.rules, failure)
        return match, failurepolicy.counts(match)

    def disruption_budget(self, state: JobState, event: Event) -> tuple[tuple[str, ...], str]:
        """A disrupted pod against max-disruptions: the condition the controller adds to
        it past the budget (``webhook.controller.disruptions``), and what to say."""
        if not event.disruption or self.max_disruptions is None:
            return (), ""
        state.disruptions += 1
        n, budget = state.disruptions, self.max_disruptions
        if causes.disruption(n, budget) == "free":
            return (), f"disruption {n} of {budget} free"
        over = f"disruption {n}, over max-disruptions {budget}"
        return (failurepolicy.DISRUPTION_BUDGET_EXHAUSTED,), over

    def replacement(self, backoff: Backoff, event: Event) -> tuple[Event | None, str]:
        """After restarts in place: the pod the controller replaces once they reach
        max-in-place-restarts (marked, ended by its deadline: SIGTERM), and what to say."""
        n = self.max_in_place_restarts
        if not causes.replaced(backoff.pod_restarts, n):
            return None, ""
        replaced = Event(event.token, SIGTERM, None, replaced=True)
        said = (
            f"restart {backoff.pod_restarts} of max-in-place-restarts {n} in this pod: the "
            "controller replaces the pod"
        )
        return replaced, said

    def judge_exit(self, container: str, code: int) -> tuple[str, str]:
        """What a pod that failed with ``container``'s exit ``code`` does: (outcome,
        words), for the table of each container's exit codes."""
        event = Event(f"{container}:{code}", code, None if container == self.main else container)
        match, _ = self.judge(event)
        if match is None:
            rule = "no rule matches" if self.rules else "no podFailurePolicy"
            return "Count", f"a new pod, counts against {self.scope} ({rule})"
        rule = f"{self.action(match)}, rule {match.index + 1}"
        if match.action in ("Ignore", "Count"):
            counts = "not counted" if match.action == "Ignore" else f"counts against {self.scope}"
            return match.action, f"a new pod, {counts} ({rule})"
        then = describe_then(match.action, self.scope).replace("the Job", f"the {self.owner}")
        return match.action, f"{then} ({rule})"

    def restart_in_place(self, backoff: Backoff, event: Event) -> tuple[InPlaceRestart, ...]:
        """The restarts in place ``event`` is (none: the pod fails with it)."""
        done, problem = inplace.restarted(self.restarts, backoff, event, self.main)
        if problem:
            raise ExplainError(problem)
        return done

    def in_place_step(
        self,
        pod: int,
        used: int,
        nodes: str,
        event: Event,
        done: Sequence[InPlaceRestart],
        **run: Any,
    ) -> Step:
        """The step of an event the pod survives: its containers restarted in place."""
        return Step(
            pod=pod,
            attempt=used + 1,
            nodes=nodes,
            event=event.token,
            what=event.describe(self.main),
            rule=None,
            action=None,
            counted=False,
            counted_failures=run.pop("counted", used),
            result=inplace.restart_text(done),
            in_place=tuple(done),
            **run,
        )

    def verdict(self, event: Event) -> str:
        done, _ = inplace.restarted(self.restarts, Backoff(), event, self.main)
        if done:
            return inplace.example_text(done)
        match, _ = self.judge(event)
        if self.on_failure and not event.disruption:
            return "the container restarts in place, counts"
        if match is None:
            rule = "no rule matches; " if self.rules else ""
            return f"{rule}retried, counts against {self.scope}"
        then = describe_then(match.action, self.scope).replace("the Job", f"the {self.owner}")
        return f"rule {match.index + 1} matches; {then} ({self.action(match)})"

    def example_events(self) -> list[Event]:
        """Common failures, and the first codes of the rules' ``In`` lists."""
        events = [
            Event("1", 1),
            Event("oom", SIGKILL),
            Event(str(SIGTERM), SIGTERM),
            Event("disruption", SIGTERM, disruption=True),
            # SIGKILL once the grace period is over: exit-code rules see 137.
            Event(f"disruption+{self.main}:{SIGKILL}", SIGKILL, self.main, disruption=True),
        ]
        for sidecar in self.sidecars[:1]:
            # A native sidecar stopped at shutdown: SIGKILL if it ignores SIGTERM.
            events.append(
                Event(f"{SIGTERM}+{sidecar}:{SIGKILL}", SIGTERM, None, False, ((sidecar, SIGKILL),))
            )
        seen = {(None, 1), (None, SIGKILL), (None, SIGTERM)}
        restarting = inplace.first_codes(self.restarts, self.containers) if self.restarts else []
        for name, code in restarting[:2]:
            key = (None if name == self.main else name, code)
            if key not in seen:
                seen.add(key)
                events.append(Event(f"{name}:{code}" if key[0] else str(code), code, key[0]))
        for rule in self.rules:
            codes = rule.get("onExitCodes") if isinstance(rule, dict) else None
            if not isinstance(codes, dict) or codes.get("operator") != "In":
                continue
            container = codes.get("containerName")
            container = container if container in self.containers else None
            for code in items(codes.get("values"))[:2]:
                if isinstance(code, int) and 0 < code < 256:
                    key = (container if container != self.main else None, code)
                    if key not in seen and len(events) < 9:
                        seen.add(key)
                        events.append(Event(str(code), code, key[0]))
        return events

    def examples(self) -> list[str]:
        """What common failures do, each judged like a real one."""
        return [f"{e.describe(self.main)}: {self.verdict(e)}" for e in self.example_events()]

    def placement(self, failures: int) -> str:
        return nodes_text(non_spot(failures, self.placement_limit, self.non_spot_attempts))

    def _where(self, failures: int) -> str:
        return self.retry_where or on_nodes(self.placement(failures))

    def fail(
        self, state: JobState, event: Event, number: int, where: str | None = None
    ) -> PodOutcome:
        """One failed pod (event ``number``, 1-based): update ``state`` and say what the
        Job does; ``where`` says where the next attempt runs, when the Job's own placement
        does not decide it (a JobSet's pods are placed by run)."""
        if self.on_failure:
            return self._fail_on_failure(state, event)
        attempt = state.index_counted if self.per_index is not None else state.counted
        extra, budget = self.disruption_budget(state, event)
        match, counts = self.judge(event, extra)
        memory = self.oom(state, event)
        if not event.disruption:
            state.failed_nodes += 1
        if counts:
            state.counted += 1
            state.index_counted += 1
        used = state.index_counted if self.per_index is not None else state.counted
        verdict = (
            f"rule {match.index + 1} ({self.action(match)})"
            if match
            else ("no rule matches" if self.rules else "")
        )
        if budget:
            verdict = f"{budget}, {verdict}" if verdict else budget
        ending, message, result = None, "", ""
        if match is not None and match.action == "FailJob":
            result = f"the {self.owner} fails at once"
            message = failjob_message(match)
            ending = Ending(
                "Failed",
                self.fail_reason,
                f"{self.unit} {number} matched {self.action(match)} rule {match.index + 1}",
            )
        elif state.counted > self.backoff_limit:
            result = f"counted, more than backoffLimit {self.backoff_limit}"
            message = "Job has reached the specified backoff limit"
            noun = "failed attempt" if self.unit == "attempt" else "counted failure"
            ending = Ending(
                "Failed",
                self.limit_reason,
                f"{count_of(state.counted, noun)}, more than backoffLimit {self.backoff_limit}",
            )
        elif self.per_index is not None and (
            (match is not None and match.action == "FailIndex") or state.index_counted > self.limit
        ):
            why = "FailIndex" if match and match.action == "FailIndex" else "per-index limit"
            result = f"the index fails ({why})"
            ending = self._index_failed(number, why)
            message = (
                "Job has exceeded the specified maximal number of failed indexes"
                if ending.state == "Failed"
                else "Job has failed indexes"
            )
        else:
            again = " again" if not counts else ""
            status = "counted (" if counts else "not counted (still "
            # With nothing allowed, only an ignored failure gets here: no tally to show.
            tally = f"{status}{self._tally(used)})" if self.limit else "not counted"
            result = f"{tally}; next: attempt {used + 1}{again}, {where or self._where(used)}"
            if memory:
                result += f", with {memory}"
        return PodOutcome(
            match, counts, attempt + 1, used, verdict, result, ending, message, memory
        )

    def _fail_on_failure(self, state: JobState, event: Event) -> PodOutcome:
        """restartPolicy OnFailure: restarts of the running pod count (>= backoffLimit, or
        > 0 when it is 0); a disrupted pod fails as a whole and its replacement starts
        with no restarts, while the failed pod counts in status.failed (> backoffLimit)."""
        limit = self.backoff_limit
        ending = None
        if event.disruption and not self.replaced_pods_count and limit > 0:
            state.restarts = 0
            state.pod += 1
            result = "the pod fails; not counted, its restarts are forgotten; next: a new pod"
        elif event.disruption:
            state.counted += 1
            state.restarts = 0
            state.pod += 1
            failed = count_of(state.counted, "failed pod")
            result = f"the pod fails; counted ({failed}); next: a new pod"
            if state.counted > limit:
                ending = Ending(
                    "Failed", self.limit_reason, f"{failed}, more than backoffLimit {limit}"
                )
        else:
            state.restarts += 1
            result = f"the container restarts in place ({count_of(state.restarts, 'restart')})"
            if state.restarts >= max(limit, 1):
                ending = Ending(
                    "Failed",
                    self.limit_reason,
                    f"{state.restarts} restarts reach backoffLimit {limit}",
                )
        message = "Job has reached the specified backoff limit" if ending else ""
        return PodOutcome(None, True, state.pod, state.restarts, "", result, ending, message)

    def run(self, events: Sequence[Event]) -> Simulation:
        state = JobState()
        backoff = Backoff()

        def step(number: int, event: Event) -> tuple[Step, Ending | None]:
            before = state.index_counted if self.per_index is not None else state.counted
            pod = state.pod if self.on_failure else number - backoff.events
            done = self.restart_in_place(backoff, event)
            facts = self.pod_facts(state, before)
            replaced, said = self.replacement(backoff, event) if done else (None, "")
            if done and replaced is None:
                made = self.in_place_step(pod, before, self.placement(before), event, done)
                return dataclasses.replace(made, facts=facts), None
            outcome = self.fail(state, replaced or event, pod)
            if replaced is not None:
                backoff.events -= 1  # (a restart, and the pod's failure: a new pod follows)
            backoff.new_pod()
            result = lead(outcome.verdict, outcome.result)
            if replaced is not None:
                result = f"{inplace.restart_text(done, going_on=False)}; {said}: {result}"
            made = Step(
                pod=pod,
                attempt=number if self.on_failure else outcome.attempt,
                nodes="same pod" if self.on_failure else self.placement(before),
                event=event.token,
                what=event.describe(self.main),
                rule=outcome.match.index + 1 if outcome.match else None,
                action=outcome.match.action if outcome.match else None,
                counted=outcome.counted,
                counted_failures=outcome.used,
                result=result,
                in_place=tuple(done) if replaced is not None else (),
                facts=facts,
                replaced=replaced is not None,
            )
            return made, outcome.ending

        steps, ending, unused = walk(events, step)
        going_on = bool(steps and steps[-1].in_place)
        used = state.index_counted if self.per_index is not None else state.counted
        facts = self.pod_facts(state, used)
        following = None
        if ending is None and not going_on and facts is not None:
            following = NextPod(len(events) - backoff.events + 1, used + 1, facts)
        return Simulation(
            [e.token for e in events],
            steps,
            ending or self._running(state, going_on),
            unused,
            self.unit,
            self.failed_as,
            self.summary(backoff),
            following,
        )

    def summary(self, backoff: Backoff) -> InPlaceSummary | None:
        return inplace.summary(backoff, self.bound, self.owner)

    def _tally(self, used: int) -> str:
        if self.limit >= INT32_MAX:  # no limit (a PyTorchJob without runPolicy.backoffLimit)
            return f"{count_of(used, 'failure')} so far, no limit"
        return f"{used} of {self.limit} allowed failures used"

    def _running(self, state: JobState, going_on: bool = False) -> Ending:
        if self.on_failure:
            return Ending(
                "Running", None, f"the pod keeps running ({count_of(state.restarts, 'restart')})"
            )
        used = state.index_counted if self.per_index is not None else state.counted
        left = self.limit - used
        if self.limit >= INT32_MAX:
            allowed = "there is no limit"
        elif left:
            allowed = f"{left} more counted failure{'s are' if left != 1 else ' is'} allowed"
        else:
            allowed = "its failure, if counted, ends it"
        runs = "goes on in the same pod" if going_on else "runs next"
        return Ending("Running", None, f"attempt {used + 1} {runs}, {self._where(used)}; {allowed}")

    def _index_failed(self, pod: int, why: str) -> Ending:
        if self.max_failed_indexes is not None and 1 > self.max_failed_indexes:
            return Ending(
                "Failed",
                "MaxFailedIndexesExceeded",
                f"pod {pod} failed its index ({why}); maxFailedIndexes is "
                f"{self.max_failed_indexes}",
            )
        return Ending(
            "IndexFailed",
            "FailedIndexes",
            f"pod {pod} failed its index ({why}); the other indexes go on, and the Job "
            "fails with reason FailedIndexes when they are done",
        )


def walk(
    events: Sequence[Event], step: Callable[[int, Event], tuple[Step, Ending | None]]
) -> tuple[list[Step], Ending | None, list[str]]:
    """Each event in turn (numbered from 1) until one ends the workload; the events after
    that are returned as unused."""
    steps: list[Step] = []
    unused: list[str] = []
    ending: Ending | None = None
    for number, event in enumerate(events, 1):
        if ending is not None:
            unused.append(event.token)
            continue
        made, ending = step(number, event)
        steps.append(made)
    return steps, ending, unused


def lead(verdict: str, result: str) -> str:
    return f"{verdict}: {result}" if verdict else result


def failjob_message(match: Match) -> str:
    """The Job condition message the controller writes for a FailJob match (the text a
    JobSet's ``onJobFailureMessagePatterns`` are matched against); the pod's name is not
    known offline and is shown as ``<pod>``."""
    if match.container is not None:
        exit_ = match.container
        return jobcontroller.failjob_message(
            "<namespace>", "<pod>", match.index, container=exit_.name, code=exit_.exit_code
        )
    return jobcontroller.failjob_message(
        "<namespace>", "<pod>", match.index, condition=match.condition
    )


@explainer("batch", "Job")
def explain_job(subject: Subject) -> list[Explanation]:
    return [explain_job_spec(subject, ("spec",))]


# --- v1 Pod ------------------------------------------------------------------------------


@explainer("", "Pod")
def explain_pod(subject: Subject) -> list[Explanation]:
    """A Pod is not retried by Kubernetes: explain its own policy and where it runs."""
    item = subject.header()
    metadata = mapping(subject.final.get("metadata"))
    annotations = mapping(metadata.get("annotations"))
    policy = subject.policy("spec") or planner.template_pod_policy(annotations)
    item.settings = setting_lines(policy, POD_KEYS + in_place_keys(policy) + between_keys(policy))
    limit, n = policy.backoff_limit, policy.non_spot_attempts
    attempt, source = _pod_attempt(policy, annotations)
    item.budget = (
        "Kubernetes does not retry a Pod: whoever creates the next attempt (a Job, an "
        "orchestrator) decides. This pod places itself by its attempt number"
        + (f" ({attempt}, from {source})." if attempt is not None else f" ({source}).")
    )
    if limit is not None and n > 0:
        item.plan = build_plan(
            f"annotation {PREFIX}backoff-limit", limit, limit, n, "no retry left"
        )
        if attempt is not None:
            where = "non-spot nodes only" if non_spot(attempt, limit, n) else "any node"
            item.notes.append(f"this pod is attempt {attempt + 1}: it runs on {where}")
    delays = planner.pod_delays(policy, subject.ctx)
    if delays is not None and attempt is not None:
        wait = delays.seconds(attempt)
        item.notes.append(
            f"retry-delay: this pod is attempt {attempt + 1}: "
            + (
                f"it is held back for {format_duration(wait)} from its admission (a bare "
                "Pod's previous failure is not known), while a controller leads"
                if wait
                else "the first attempt is not held back"
            )
        )
    _pod_in_place(item, subject)
    return [item]


def _pod_in_place(item: Explanation, subject: Subject) -> None:
    """A bare Pod's restarts in place: its containers' exit codes, and ``--simulate``."""
    pod_spec = subject.spec
    version = subject.ctx.kubernetes_version
    item.notes.extend(planner.dropped_note(pod_spec, version))
    restarts = restartrules.pod_restarts(pod_spec, subject.original.get("spec"), version)
    if restarts is None:
        return
    bound = planner.bound_of(
        planner.deadline_of(pod_spec, subject.original.get("spec"), "spec"),
        None,
        subject.ctx.config.rails(subject.ctx.namespace),
        owner="Pod",
    )
    simulator = PodSimulator(planner.container_names(pod_spec), restarts, bound)
    item.in_place = inplace.plan(restarts, simulator.judge_exit, bound)
    item.simulator = simulator


class PodSimulator:
    """A bare Pod's containers through ``--simulate``: exits its restart rules match
    restart them in place; any other fails the pod, which nothing retries."""

    def __init__(self, containers: Sequence[str], restarts: PodRestarts, bound: InPlaceEnds):
        self.containers = list(containers) or ["main"]
        self.restarts = restarts
        self.bound = bound

    @staticmethod
    def judge_exit(container: str, code: int) -> tuple[str, str]:
        return "pod-fails", "the pod fails; nothing retries a Pod"

    def run(self, events: Sequence[Event]) -> Simulation:
        backoff = Backoff()
        main = self.containers[0]

        def step(number: int, event: Event) -> tuple[Step, Ending | None]:
            done, problem = inplace.restarted(self.restarts, backoff, event, main)
            if problem:
                raise ExplainError(problem)
            what = event.describe(main)
            made = Step(1, 1, "", event.token, what, None, None, False, 0, "")
            if done:
                result = inplace.restart_text(done)
                return dataclasses.replace(made, result=result, in_place=done), None
            result = "the pod fails; nothing retries a Pod"
            ending = Ending("Failed", None, f"event {number} fails it")
            return dataclasses.replace(made, result=result), ending

        steps, ending, unused = walk(events, step)
        still = Ending("Running", None, "the pod goes on")
        summary = inplace.summary(backoff, self.bound, "Pod")
        return Simulation(
            [e.token for e in events],
            steps,
            ending or still,
            unused,
            "exit",
            "phase Failed",
            summary,
        )


def _pod_attempt(policy: Policy, annotations: Mapping[str, Any]) -> tuple[int | None, str]:
    if policy.attempt is not None:
        return policy.attempt, f"annotation {PREFIX}attempt"
    raw = annotations.get(INDEX_FAILURE_COUNT)
    if isinstance(raw, str):
        try:
            return parse_count(raw), f"annotation {INDEX_FAILURE_COUNT}"
        except BadValue:
            pass
    return None, "unknown offline: at admission it comes from the owning Job's failure count"
