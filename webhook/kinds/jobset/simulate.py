"""The simulation of a JobSet (jobset.x-k8s.io/v1alpha2; ``executeFailurePolicy`` in
JobSet's pkg/controllers/failure_policy.go, and KEP-262 for the RestartJob actions): the
events are failures of the pods of one Job of one replicated Job. The child Job counts
them as any Job does (``kinds.job.simulate``); when it fails, no ``failurePolicy`` at all fails
the set (reason FailedJobs); otherwise the first rule whose reasons, message patterns and
target replicated Jobs all match decides, and no match means RestartJobSet. RestartJobSet
fails the set once ``restartsCountTowardsMax`` has reached maxRestarts
(ReachedMaxRestarts), else bumps ``status.restarts`` and that count and recreates every
Job (their ``status.failed`` starts at 0 again); RestartJobSetAndIgnoreMaxRestarts bumps
``status.restarts`` only; FailJobSet fails the set (FailJobSetFailurePolicyAction). Pods
carry ``jobset.sigs.k8s.io/restart-attempt`` = ``status.restarts``, which the pod webhook
places them by."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.kinds.inplacewords import Backoff
from webhook.kinds.job.simulate import JobSimulator, JobState, lead
from webhook.kinds.jobset import failurepolicy as jsp
from webhook.kinds.jobset.failurepolicy import (
    FAIL_ACTION,
    FAILED_JOBS,
    MAX_REACHED,
    RESTART_ACTIONS,
    first_rule,
    rule_is_applicable,
)
from webhook.kube.goregexp import Piece, Wild
from webhook.plan.simulation import Ending, Event, NextPod, Simulation, Step, walk
from webhook.plan.words import count_of, on_nodes


def jobset_rule_matches(
    rule: Mapping[str, Any],
    reason: str,
    message: str,
    replicated: str,
    pod: Sequence[Piece] = (Wild(),),
) -> bool:
    """JobSet's ``ruleIsApplicable`` (``kinds.jobset.failurepolicy``), with the pod's name in
    ``message`` (``<namespace>/<pod>``) standing for ``pod``: a pattern matches when it
    does for some such pod. A pattern that cannot be read as Go reads it is taken to
    match, as admission takes it (``unread_patterns`` says which)."""
    return rule_is_applicable(rule, reason, message_pieces(message, pod), replicated)[0]


#: How ``failjob_message`` shows the failed pod, which is known only at run time.
POD_PLACEHOLDER = "<namespace>/<pod>"


def message_pieces(message: str, pod: Sequence[Piece]) -> list[Piece]:
    if POD_PLACEHOLDER not in message:
        return [message]
    before, after = message.split(POD_PLACEHOLDER, 1)
    return [before, *pod, after]


@dataclass
class JobSetState:
    """JobSet's counters: ``status.restarts`` (the restart-attempt label),
    ``status.restartsCountTowardsMax``, and the simulated Job's own restarts that count
    (KEP-262 tracks those per Job for the RestartJob actions)."""

    #: The simulated Job's own counters; a restart recreates the Job and starts them again.
    job: JobState
    restarts: int = 0
    toward: int = 0
    job_toward: int = 0


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
        pieces = message_pieces(message, self.pod)
        index, action, _ = first_rule(self.rules or [], reason, pieces, self.replicated)
        return index, action

    def examples(self) -> list[str]:
        """What common failures do in the first run, each walked like a real one."""
        out = []
        for event in self.job.example_events():
            (step,) = self.run([event]).steps
            out.append(f"{step.what}: {step.result}")
        return out

    def run(self, events: Sequence[Event]) -> Simulation:
        counters = JobSetState(self.job.new_state())
        backoff = Backoff()

        def step(number: int, event: Event) -> tuple[Step, Ending | None]:
            run = (counters.toward if self.in_place else counters.restarts) + 1
            placed = self.job.placement(counters.restarts)
            pod = number - backoff.events
            facts = self.job.pod_facts(counters.job, counters.restarts)
            where = f"in run {run}, {on_nodes(placed)}"
            taken = self.job.take(counters.job, backoff, event, pod, where)
            outcome, result = taken.outcome, taken.result
            if outcome is None:
                made = self.job.in_place_step(
                    pod,
                    counters.job.used,
                    placed,
                    event,
                    taken.done,
                    counted=counters.toward,
                    run=run,
                    restarts=counters.restarts,
                    facts=facts,
                )
                return made, None
            ending = None
            how = self._peer_restart(event, outcome)
            if how is not None:
                text, ending = self._job_failed(jsp.PEER_REASON, jsp.PEER_MESSAGE_PREFIX, counters)
                counted = "counted" if outcome.counted else "not counted"
                result = (
                    f"{lead(outcome.verdict, counted)}; the controller fails the Job "
                    f"(peer-disruptions {how}: {jsp.FAILURE_TARGET}, reason "
                    f"{jsp.PEER_REASON}); {text}"
                )
            elif outcome.ending is None and self.in_place and self.rules is not None:
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
                in_place=taken.done if taken.replaced else (),
                facts=facts,
                replaced=taken.replaced,
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

    def _peer_restart(self, event: Event, outcome: Any) -> str | None:
        """``peer-disruptions`` (its rule first in the set's rules): the value, when the
        controller fails a disrupted pod's Job that goes on (``webhook.kinds.jobset.
        peers``: under ``ignore`` only when the pod's own disruption is not counted),
        and the set restarts on that rule; else ``None``."""
        if not event.disruption or outcome.ending is not None or self.in_place:
            return None
        how = jsp.peer_rule_of({"spec": {"failurePolicy": {"rules": self.rules or []}}})
        return how if how == "count" or (how == "ignore" and not outcome.counted) else None

    def _next(
        self, counters: JobSetState, pod: int, steps: Sequence[Step], ending: Ending | None
    ) -> NextPod | None:
        """The pod that runs next, when the JobSet still runs and no pod goes on."""
        facts = self.job.pod_facts(counters.job, counters.restarts)
        if ending is not None or (steps and steps[-1].in_place) or facts is None:
            return None
        used = counters.job.used
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
        counters.job = self.job.new_state(
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
