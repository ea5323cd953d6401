"""The simulation of batch/v1 JobSpecs: the Job controller's counting of failed pods
(``JobSimulator``, which the JobSet simulator and the RayJob and PyTorchJob explainers
reuse)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.history import NODE_CATEGORIES
from webhook.kinds import inplacewords
from webhook.kinds.inplacewords import Backoff
from webhook.kube import failurepolicy, jobcontroller
from webhook.kube.defaulting import INT32_MAX
from webhook.kube.failurepolicy import Match, PodFailure
from webhook.kube.jobcontroller import (
    BACKOFF_LIMIT_EXCEEDED,
    FAIL_INDEX,
    POD_FAILURE_POLICY,
    FailureCounter,
    exceeds_max_failed_indexes,
    past_backoff_limit_on_failure,
)
from webhook.kube.objects import items
from webhook.kube.restartrules import PodRestarts
from webhook.plan import causes
from webhook.plan.explained import memory_words
from webhook.plan.failureaware import ContainerMemory, MemoryPlan
from webhook.plan.inplace import InPlaceEnds
from webhook.plan.model import non_spot
from webhook.plan.simulation import (
    SIGKILL,
    SIGTERM,
    Ending,
    Event,
    ExplainError,
    InPlaceRestart,
    InPlaceSummary,
    NextPod,
    PodFacts,
    Simulation,
    Step,
    walk,
)
from webhook.plan.words import count_of, describe_then, nodes_text, on_nodes
from webhook.policy.categories import condition_type
from webhook.policy.model import Delays


def _facts_delay(delays: Delays | None, failures: int) -> int:
    return delays.seconds(failures) if delays is not None else 0


@dataclass
class JobState:
    """The Job controller's counters for one Job; a JobSet restart starts a fresh one."""

    #: Counted failures (``status.failed`` without the pods an Ignore rule matched), in all
    #: and of the one simulated index (Jobs with ``backoffLimitPerIndex``): the Job
    #: controller's own count (``webhook.kube.jobcontroller``).
    counter: FailureCounter
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
    #: Free failures counted against max-free-failures (likewise).
    free: int = 0

    @property
    def counted(self) -> int:
        return self.counter.failed

    @property
    def index_counted(self) -> int:
        return self.counter.counted()

    @property
    def used(self) -> int:
        """The counted failures the limit is told against: the simulated index's with
        ``backoffLimitPerIndex``, else the Job's."""
        return self.index_counted if self.counter.per_index is not None else self.counted


@dataclass(frozen=True)
class Taken:
    """What one event does to a pod: its containers restarted in place (``done``), and
    unless the pod survives them (``outcome`` ``None``), its failure through the Job's
    counting; ``replaced`` when the controller replaces the pod after those restarts
    (max-in-place-restarts); ``result``: the words of the failure."""

    done: tuple[InPlaceRestart, ...]
    outcome: PodOutcome | None = None
    replaced: bool = False
    result: str = ""


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
        max_free_failures: int | None = None,
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
        #: The free failures (``free-categories``) that are free (``webhook.plan.verdicts``).
        self.max_free_failures = max_free_failures

    def new_state(self, **kept: Any) -> JobState:
        """A Job's counters from none counted (``kept``: what a JobSet's run keeps)."""
        return JobState(FailureCounter(self.backoff_limit, self.per_index), **kept)

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
    def limit_name(self) -> str:
        if self.limit_field:
            return self.limit_field
        return "backoffLimitPerIndex" if self.per_index is not None else "backoffLimit"

    @property
    def limit(self) -> int:
        return self.per_index if self.per_index is not None else self.backoff_limit

    @property
    def counts(self) -> str:
        """How a counted failure is told: against its limit, or with none to count against
        (a PyTorchJob without runPolicy.backoffLimit)."""
        if self.limit >= INT32_MAX:
            return "counts (no limit)"
        return f"counts against {self.limit_name}"

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

    def free_budget(self, state: JobState, event: Event) -> tuple[tuple[str, ...], str]:
        """A free failure (its category is one the rules Ignore) against
        max-free-failures: the condition the controller adds with the category past the
        budget (``webhook.controller.verdicts``), and what to say."""
        if event.category is None or self.max_free_failures is None:
            return (), ""
        alone = PodFailure((), ((condition_type(event.category), "True"),))
        match = failurepolicy.evaluate(self.rules, alone)
        if match is None or match.action != "Ignore":
            return (), ""
        state.free += 1
        n, budget = state.free, self.max_free_failures
        if n <= budget:
            return (), f"free failure {n} of {budget}"
        over = f"free failure {n}, over max-free-failures {budget}"
        return (failurepolicy.FREE_BUDGET_EXHAUSTED,), over

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
            return "Count", f"a new pod, {self.counts} ({rule})"
        rule = f"{self.action(match)}, rule {match.index + 1}"
        if match.action in ("Ignore", "Count"):
            counts = "not counted" if match.action == "Ignore" else self.counts
            return match.action, f"a new pod, {counts} ({rule})"
        then = describe_then(match.action, self.limit_name).replace("the Job", f"the {self.owner}")
        return match.action, f"{then} ({rule})"

    def restart_in_place(self, backoff: Backoff, event: Event) -> tuple[InPlaceRestart, ...]:
        """The restarts in place ``event`` is (none: the pod fails with it)."""
        done, problem = inplacewords.restarted(self.restarts, backoff, event, self.main)
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
            result=inplacewords.restart_text(done),
            in_place=tuple(done),
            **run,
        )

    def verdict(self, event: Event) -> str:
        done, _ = inplacewords.restarted(self.restarts, Backoff(), event, self.main)
        if done:
            return inplacewords.example_text(done)
        match, _ = self.judge(event)
        if self.on_failure and not event.disruption:
            return "the container restarts in place, counts"
        if match is None:
            rule = "no rule matches; " if self.rules else ""
            return f"{rule}retried, {self.counts}"
        then = describe_then(match.action, self.limit_name).replace("the Job", f"the {self.owner}")
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
        restarting = (
            inplacewords.first_codes(self.restarts, self.containers) if self.restarts else []
        )
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
        attempt = state.used
        extra, budget = self.disruption_budget(state, event)
        free, told = self.free_budget(state, event)
        extra, budget = (*extra, *free), ", ".join(filter(None, (budget, told)))
        match, counts = self.judge(event, extra)
        memory = self.oom(state, event)
        if not event.disruption or event.category in NODE_CATEGORIES:
            state.failed_nodes += 1
        ends = state.counter.step(match.action if match else None, counts)
        used = state.used
        verdict = (
            f"rule {match.index + 1} ({self.action(match)})"
            if match
            else ("no rule matches" if self.rules else "")
        )
        if budget:
            verdict = f"{budget}, {verdict}" if verdict else budget
        ending, message, result = None, "", ""
        if ends.job == POD_FAILURE_POLICY and match is not None:
            result = f"the {self.owner} fails at once"
            message = failjob_message(match)
            ending = Ending(
                "Failed",
                self.fail_reason,
                f"{self.unit} {number} matched {self.action(match)} rule {match.index + 1}",
            )
        elif ends.job == BACKOFF_LIMIT_EXCEEDED:
            result = f"counted, more than backoffLimit {self.backoff_limit}"
            message = "Job has reached the specified backoff limit"
            noun = "failed attempt" if self.unit == "attempt" else "counted failure"
            ending = Ending(
                "Failed",
                self.limit_reason,
                f"{count_of(state.counted, noun)}, more than backoffLimit {self.backoff_limit}",
            )
        elif ends.index is not None:
            why = "FailIndex" if ends.index == FAIL_INDEX else "per-index limit"
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
            ends = state.counter.step(None, True)
            state.restarts = 0
            state.pod += 1
            failed = count_of(state.counted, "failed pod")
            result = f"the pod fails; counted ({failed}); next: a new pod"
            if ends.job == BACKOFF_LIMIT_EXCEEDED:
                ending = Ending(
                    "Failed", self.limit_reason, f"{failed}, more than backoffLimit {limit}"
                )
        else:
            state.restarts += 1
            result = f"the container restarts in place ({count_of(state.restarts, 'restart')})"
            if past_backoff_limit_on_failure(state.restarts, limit):
                ending = Ending(
                    "Failed",
                    self.limit_reason,
                    f"{state.restarts} restarts reach backoffLimit {limit}",
                )
        message = "Job has reached the specified backoff limit" if ending else ""
        return PodOutcome(None, True, state.pod, state.restarts, "", result, ending, message)

    def take(
        self, state: JobState, backoff: Backoff, event: Event, pod: int, where: str | None = None
    ) -> Taken:
        """One event of pod ``pod``: the restarts in place it is first; then, unless the pod
        survives them, its failure (``fail``; after restarts, when the controller replaces
        the pod, the replaced pod's), and a new pod follows."""
        done = self.restart_in_place(backoff, event)
        replaced, said = self.replacement(backoff, event) if done else (None, "")
        if done and replaced is None:
            return Taken(tuple(done))
        outcome = self.fail(state, replaced or event, pod, where)
        if replaced is not None:
            backoff.events -= 1  # (a restart, and the pod's failure: a new pod follows)
        backoff.new_pod()
        result = lead(outcome.verdict, outcome.result)
        if replaced is not None:
            result = f"{inplacewords.restart_text(done, going_on=False)}; {said}: {result}"
        return Taken(tuple(done), outcome, replaced is not None, result)

    def run(self, events: Sequence[Event]) -> Simulation:
        state = self.new_state()
        backoff = Backoff()

        def step(number: int, event: Event) -> tuple[Step, Ending | None]:
            before = state.used
            pod = state.pod if self.on_failure else number - backoff.events
            facts = self.pod_facts(state, before)
            taken = self.take(state, backoff, event, pod)
            outcome = taken.outcome
            if outcome is None:
                made = self.in_place_step(pod, before, self.placement(before), event, taken.done)
                return dataclasses.replace(made, facts=facts), None
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
                result=taken.result,
                in_place=taken.done if taken.replaced else (),
                facts=facts,
                replaced=taken.replaced,
            )
            return made, outcome.ending

        steps, ending, unused = walk(events, step)
        going_on = bool(steps and steps[-1].in_place)
        used = state.used
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
        return inplacewords.summary(backoff, self.bound, self.owner)

    def _tally(self, used: int) -> str:
        if self.limit >= INT32_MAX:  # no limit (a PyTorchJob without runPolicy.backoffLimit)
            return f"{count_of(used, 'failure')} so far, no limit"
        return f"{used} of {self.limit} allowed failures used"

    def _running(self, state: JobState, going_on: bool = False) -> Ending:
        if self.on_failure:
            return Ending(
                "Running", None, f"the pod keeps running ({count_of(state.restarts, 'restart')})"
            )
        used = state.used
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
        if exceeds_max_failed_indexes(1, self.max_failed_indexes):
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
