"""What a JobSet's audited defaults would have done: its real failures, as its record keeps
them (``webhook.cluster.tries``, each with its run), judged again per run and per child
Job under the audited parts (``spec.replicatedJobs[<name>].template.spec``:
``webhook.plan.audit``).

What the JobSet controller does, read in kubernetes-sigs/jobset
(pkg/controllers/jobset_controller.go, failure_policy.go):

- a child Job is made from its replicated Job's template (``constructJob``), named
  ``<jobset>-<replicatedJob>-<index>`` (``GenJobName``, pkg/util/placement), labelled with
  the run it belongs to (``restart-attempt``: ``status.restarts`` when it was made,
  ``labelAndAnnotateObject``); it fails by its own podFailurePolicy and backoffLimit,
  judged by the Job controller (``webhook.plan.replay.first_end``);
- once a child Job of the current run has failed, ``executeFailurePolicy`` acts on the
  first one to fail: without a ``failurePolicy`` the JobSet fails (``FailedJobs``); with
  one, its rules (on the child's failure reason, message and replicated Job) restart it
  (``RestartJobSet``: ``status.restarts`` + 1, every child Job recreated for a new run;
  ``ReachedMaxRestarts`` past ``maxRestarts``) or fail it. A run ends at its first child
  Job failure, whichever way the JobSet then goes.

The audited parts change only the child Jobs' rules and backoffLimit, never the JobSet's
``failurePolicy``. So, per run: the child Jobs' failed attempts are judged in the order
they finished, under the real plan (where the run really ended: the first child to fail)
and under the audited one. When the audited plan fails a child Job earlier, the run would
have ended there: what ran after that point in that run (the failed attempts recorded;
the part of each that ran after it) is saved. When it would not have failed the child Job
where the real plan did, the run would have gone on: what that costs cannot be known.

Then the runs are followed in order as the JobSet would have gone under the audited plan
(``executeFailurePolicy`` on the child Job the audited plan fails first, its reason and
message: ``webhook.kinds.jobset.failurepolicy``), its restarts counted toward ``maxRestarts`` as
it goes: where it would have failed the JobSet in an earlier run than the real one (a
``FailJobSet`` rule on reason ``PodFailurePolicy``, ``maxRestarts`` reached sooner), the
later runs would not have run, and their failed attempts are saved whole; where it would
have restarted the JobSet that really failed, what more runs would cost cannot be known.
The following stops at the first run whose ending under the audited plan is not known.

What cannot be known is said: a run whose failures the record does not hold (never seen,
or past ``MAX_TRIES``), a JobSet that restarts in place or single Jobs, child Jobs whose
pods restart in place or that fail per index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.cluster.record import Record
from webhook.cluster.tries import Try
from webhook.kinds.jobset import failurepolicy as jsp
from webhook.kube.objects import items, mapping
from webhook.plan import marks
from webhook.plan.audit import AuditRecord
from webhook.plan.marks import Causes, Judged
from webhook.plan.replay import End, after_end, backoff_limit, first_end, savings, unseen

#: ``JobSetCompleted``, ``JobSetFailed`` (api/jobset/v1alpha2/jobset_types.go).
COMPLETED, FAILED = "Completed", "Failed"
#: At most this many runs are told in a sentence (an Event's note is 1 KiB at most).
MAX_RUNS_NAMED = 2
EARLIER, INSTEAD, LONGER, SAME, UNKNOWN = "earlier", "instead", "longer", "same", "unknown"
#: A run the JobSet would not have made under the audited plan.
SKIPPED = "skipped"


def part_path(replicated_job: str) -> str:
    """Where the audit record keeps a replicated Job's part (``webhook.plan.audit``)."""
    return f"spec.replicatedJobs[{replicated_job}].template.spec"


@dataclass(frozen=True)
class RunReplay:
    """One run, under the audited plan."""

    run: int
    kind: str  # EARLIER, INSTEAD, LONGER, SAME or UNKNOWN
    job: str = ""  # the child Job the audited plan fails (or would not have)
    attempt: int = 0  # its failed attempt it would have ended at
    why: str = ""
    saved_count: int = 0
    saved_seconds: float = 0.0
    saved: Mapping[str, float] = field(default_factory=dict)
    #: How the audited plan fails the run's first child Job to fail: its replicated Job,
    #: its ``Failed`` reason and message ("": the run goes on, or completes), which the
    #: JobSet's failurePolicy rules match on.
    replicated: str = ""
    reason: str = ""
    message: str = ""

    def words(self) -> str:
        if self.kind == UNKNOWN:
            return f"run {self.run} is not known ({self.why})"
        if self.kind == LONGER:
            return (
                f"in run {self.run} they would have retried Job {self.job} past its attempt "
                f"{self.attempt}, where it failed ({self.why}): what the longer run would "
                "have cost cannot be known"
            )
        said = f"in run {self.run} they would have failed Job {self.job} {self.why} after its "
        said += f"attempt {self.attempt}"
        said += (
            ", though that run completed" if self.kind == INSTEAD else ", ending the run earlier"
        )
        found = savings(self.saved_count, self.saved_seconds, self.saved, self.kind == INSTEAD)
        return f"{said}: {found} saved"


@dataclass(frozen=True)
class JobSetReplay:
    """The audited plan against a JobSet's real failures, run by run."""

    outcome: str  # Completed or Failed
    attempts: int  # failed attempts replayed
    runs: tuple[RunReplay, ...] = ()
    not_replayed: str = ""
    #: What the JobSet would have done that it did not (``follow``), in words: failed in
    #: an earlier run (``ended``: the later runs are ``SKIPPED``) or where it completed,
    #: or restarted where it failed (``restarted``); or why that is not known (``unsure``).
    ended: str = ""
    restarted: str = ""
    unsure: str = ""
    #: Failed attempts of the skipped runs the record did not keep.
    unkept: int = 0

    @property
    def saved(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for run in self.runs:
            for resource, amount in run.saved.items():
                out[resource] = out.get(resource, 0.0) + amount
        return out

    @property
    def differed(self) -> bool:
        return not self.not_replayed and (
            any(r.kind in (EARLIER, INSTEAD, LONGER) for r in self.runs)
            or bool(self.ended or self.restarted)
        )

    @property
    def verdict(self) -> str:
        """As the metric's ``differed`` label: true, false, or unknown."""
        if self.differed:
            return "true"
        if self.not_replayed or self.unsure or any(r.kind == UNKNOWN for r in self.runs):
            return "unknown"
        return "false"

    def sentence(self) -> str:
        """The ``RetryPolicyAudit`` Event's note on the JobSet, and what ``status`` shows."""
        if self.not_replayed:
            return f"what the defaults would have done is not known: {self.not_replayed}"
        told = [r for r in self.runs if r.kind not in (SAME, SKIPPED)]
        unknown = [r.words() for r in told if r.kind == UNKNOWN]
        unsure = [f"what the JobSet would then have done is not known ({self.unsure})"]
        unsure = unsure if self.unsure else []
        if not self.differed:
            n, runs = self.attempts, len(self.runs)
            if unknown or unsure:
                return (
                    "nothing would have differed under the defaults in the runs recorded; "
                    + "; ".join([*unknown, *unsure])
                )
            how = "completed" if self.outcome == COMPLETED else "failed"
            return (
                f"nothing would have differed under the defaults: it {how} after {n} failed "
                f"attempt{_s(n)} in {runs} run{_s(runs)} either way"
            )
        said = [r.words() for r in told[:MAX_RUNS_NAMED]]
        if len(told) > MAX_RUNS_NAMED:
            more = len(told) - MAX_RUNS_NAMED
            said.append(f"and {more} more run{_s(more)}")
        said += [self.ended] if self.ended else []
        said += [self.restarted] if self.restarted else []
        said += unsure
        saving = [
            r
            for r in self.runs
            if r.kind in (EARLIER, INSTEAD, SKIPPED) and (r.saved_count or r.saved_seconds)
        ]
        if len(saving) > 1 or (self.unkept and self.ended):
            count = sum(r.saved_count for r in saving)
            seconds = sum(r.saved_seconds for r in saving)
            total = f"in all {savings(count, seconds, self.saved)} saved"
            if self.unkept:
                n = self.unkept
                total += f", and {n} failed attempt{_s(n)} the record did not keep"
            said.append(total)
        return "the defaults would have differed: " + "; ".join(said)


def ended(jobset: Mapping[str, Any]) -> str:
    """``Completed`` or ``Failed`` once the JobSet controller ended it; ``""`` before."""
    for condition in items(mapping(jobset.get("status")).get("conditions")):
        kind = condition.get("type")
        if kind in (COMPLETED, FAILED) and condition.get("status") == "True":
            return str(kind)
    return ""


def replay_jobset(
    jobset: Mapping[str, Any], audit: AuditRecord, record: Record | None
) -> JobSetReplay | None:
    """The audit ``audit`` of ``jobset`` (as stored) against the failures ``record`` holds;
    ``None`` while the JobSet has not ended."""
    outcome = ended(jobset)
    if not outcome:
        return None
    record = record or Record()
    tries = sorted(record.tries, key=lambda t: (t.finished is None, t.finished or 0.0))
    why = _not_replayed(jobset, audit, tries)
    judged: list[Judged] = []
    if not why:
        judged, why = _judged(jobset, audit, tries)
    if why:
        return JobSetReplay(outcome, len(tries), not_replayed=why)
    last = _int(mapping(jobset.get("status")).get("restarts"), 0)
    last = max([last, *(t.run or 0 for t in tries)])
    # Tries are kept in the order they were recorded: past MAX_TRIES, the latest run kept
    # and those after it may miss failures.
    cut = max((t.run or 0 for t in tries), default=0) if record.more_tries else last + 1
    runs = []
    for run in range(last + 1):
        these = [j for j in judged if j.attempt.run == run]
        if run >= cut:
            n = record.more_tries
            what = f"{n} later failed attempt{_s(n)} not kept in the record"
            runs.append(RunReplay(run, UNKNOWN, why=what))
            continue
        final_completed = run == last and outcome == COMPLETED
        runs.append(_run(jobset, audit, run, these, final_completed))
    result = JobSetReplay(outcome, len(tries), tuple(runs))
    return follow(result, audited_jobset(jobset, audit), tries, record)


def _not_replayed(jobset: Mapping[str, Any], audit: AuditRecord, tries: list[Try]) -> str:
    spec = mapping(jobset.get("spec"))
    policy = mapping(spec.get("failurePolicy"))
    if policy.get("restartStrategy") == "InPlaceRestart":
        return "it restarts in place (failurePolicy restartStrategy InPlaceRestart)"
    if any(r.get("action") in jsp.SINGLE_JOB_RESTARTS for r in items(policy.get("rules"))):
        return "its failurePolicy recreates single Jobs (RestartJob), not whole runs"
    if any(t.run is None for t in tries):
        return "its failures were recorded without their runs"
    for name, template in _templates(jobset).items():
        part = audit.part(part_path(name))
        if part is None:
            continue
        why = unseen(tries, part.rules)
        if why:
            return why
        pods = mapping(mapping(template.get("template")).get("spec"))
        if pods.get("restartPolicy") == "OnFailure":
            return (
                f"the pods of replicated Job {name} restart in place "
                "(restartPolicy OnFailure: the Job controller counts restarts)"
            )
        if part.backoff_limit_per_index is not None or "backoffLimitPerIndex" in template:
            return (
                f"replicated Job {name} fails per index (backoffLimitPerIndex), and which "
                "indexes failed went with its child Jobs"
            )
    return ""


def _judged(
    jobset: Mapping[str, Any], audit: AuditRecord, tries: list[Try]
) -> tuple[list[Judged], str]:
    """Each attempt under the audited plan, with our controller's conditions
    (``webhook.plan.marks``: a JobSet's disruptions count for the whole set, its peers are
    its run's pods); why that cannot be worked out."""
    causes = {}
    for name, template in _templates(jobset).items():
        real = mapping(template.get("template"))
        found = marks.part_causes(audit.part(part_path(name)), real, audit.settings)
        if isinstance(found, str):
            return [], found
        causes[name] = found
    places = []
    for attempt in tries:
        audited, real = causes.get(attempt.lineage.partition("/")[0], (Causes(), Causes()))
        chain = (attempt.run, attempt.lineage)
        places.append(marks.Place(audited, real, peers=attempt.run, chain=chain))
    return marks.mark(tries, places)


def _run(
    jobset: Mapping[str, Any], audit: AuditRecord, run: int, judged: list[Judged], completed: bool
) -> RunReplay:
    """One run: where the real plan ended it (its first child Job to fail), and where the
    audited one would have (``judged``: its attempts under it)."""
    tries = [j.attempt for j in judged]
    meta = mapping(jobset.get("metadata"))
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    templates = _templates(jobset)
    # (position in the run, replicated Job, Job, how the Job controller ends it)
    real: list[tuple[int, str, str, End]] = []
    audited: list[tuple[int, str, str, End]] = []
    for child, positions in _children(tries).items():
        rjob, index = child
        template = templates.get(rjob, {})
        part = audit.part(part_path(rjob))
        mine = [judged[p] for p in positions]
        job = f"{name}-{rjob}-{index}"
        rules = list(items(mapping(template.get("podFailurePolicy")).get("rules")))
        as_ran = marks.unchanged([j.attempt for j in mine])
        end = first_end(as_ran, rules, backoff_limit(template), namespace=namespace)
        if end is not None:
            real.append((positions[end.number - 1], rjob, job, end))
        if part is not None:
            rules, limit = list(part.rules), backoff_limit(template, part)
            end = first_end(mine, rules, limit, audit.settings, namespace)
        if end is not None:
            audited.append((positions[end.number - 1], rjob, job, end))
    first_real = min(real, default=None, key=lambda e: e[0])
    first_audited = min(audited, default=None, key=lambda e: e[0])
    if first_audited is not None and first_audited[3].unsure:
        return RunReplay(run, UNKNOWN, why=first_audited[3].unsure)
    if first_audited is not None and (first_real is None or first_audited[0] < first_real[0]):
        position, rjob, job, end = first_audited
        kind = INSTEAD if completed else EARLIER
        count, seconds, saved = after_end(tries, position)
        how = (rjob, end.reason, end.message)
        return RunReplay(run, kind, job, end.number, end.why, count, seconds, saved, *how)
    if first_real is not None and (first_audited is None or first_audited[0] > first_real[0]):
        _, _, job, end = first_real
        return RunReplay(run, LONGER, job, end.number, end.why)
    if first_real is None and not completed:
        what = "the failure that ended it is not in the record"
        if not tries:
            what = "none of its failures is in the record"
        return RunReplay(run, UNKNOWN, why=what)
    if first_audited is None:
        return RunReplay(run, SAME)
    _, rjob, job, end = first_audited
    return RunReplay(
        run, SAME, job, end.number, end.why, replicated=rjob, reason=end.reason, message=end.message
    )


#: The settings that change a JobSet's own failurePolicy (``webhook.kinds.jobset``): an
#: audit record of revision 1 did not keep what they would have made of it.
CHANGE_FAILURE_POLICY = ("fail-non-retriable", "backoff-limit", "retries")


def audited_jobset(jobset: Mapping[str, Any], audit: AuditRecord) -> Mapping[str, Any] | None:
    """``jobset`` with the failurePolicy the audited settings would have given it
    (``AuditRecord.failure_policy``; its own when they change nothing); ``None`` when the
    record does not say (written before it kept it, by settings that change it)."""
    if audit.failure_policy is None:
        changes = any(name in audit.settings for name in CHANGE_FAILURE_POLICY)
        return None if audit.revision < 2 and changes else jobset
    spec = {**mapping(jobset.get("spec")), "failurePolicy": dict(audit.failure_policy)}
    return {**jobset, "spec": spec}


def follow(
    result: JobSetReplay, jobset: Mapping[str, Any] | None, tries: list[Try], record: Record
) -> JobSetReplay:
    """``result`` with the runs followed as the JobSet (with its audited failurePolicy)
    would have gone under the audited plan (see the module's doc)."""
    if jobset is None:
        why = "the audit record, of an earlier version, does not keep its audited failurePolicy"
        return replace(result, unsure=why) if any(r.reason for r in result.runs) else result
    runs, toward = list(result.runs), 0
    last = len(runs) - 1
    for at, run in enumerate(runs):
        if run.kind in (UNKNOWN, LONGER) or not run.reason:
            return result  # (its end under the defaults is not known, or it completed)
        message = run.message
        if not message and _reads_messages(jobset):
            why = f"the name of the pod that ended run {run.run} is not in the record"
            return replace(result, unsure=why)
        decision = jsp.execute(jobset, run.reason, [message], run.replicated, toward)
        if decision.unsure:
            return replace(result, unsure=f"in run {run.run}, {decision.unsure}")
        toward += decision.counted
        head = f"on reason {run.reason} of Job {run.job}"
        if decision.failed and at < last:
            later = [_skipped(r, tries) for r in runs[at + 1 :]]
            named = f"run {later[0].run}" if len(later) == 1 else f"runs {later[0].run} to {last}"
            count = sum(r.saved_count for r in later)
            seconds = sum(r.saved_seconds for r in later)
            saved: dict[str, float] = {}
            for r in later:
                for resource, amount in r.saved.items():
                    saved[resource] = saved.get(resource, 0.0) + amount
            instead = ", though it completed" if result.outcome == COMPLETED else ""
            found = (
                f"{savings(count, seconds, saved)} saved"
                if count or seconds
                else f"none of {'its' if len(later) == 1 else 'their'} failed attempts is recorded"
            )
            ended = (
                f"after run {run.run} the JobSet would have failed{instead} "
                f"({decision.failed}: {decision.words} {head}), so {named} would not have "
                f"run: {found}"
            )
            unkept = record.more_tries
            return replace(result, runs=(*runs[: at + 1], *later), ended=ended, unkept=unkept)
        if decision.failed and result.outcome == COMPLETED:
            ended = (
                f"the JobSet would then have failed, though it completed ({decision.failed}: "
                f"{decision.words} {head})"
            )
            return replace(result, ended=ended)
        if decision.failed:
            return result
        if at == last:
            where = "completed" if result.outcome == COMPLETED else "failed"
            restarted = (
                f"after run {run.run} the JobSet would have restarted where it {where} "
                f"({decision.words} {head}): what more runs would have cost cannot be known"
            )
            return replace(result, restarted=restarted)
    return result


def _reads_messages(jobset: Mapping[str, Any]) -> bool:
    """Whether a rule of the JobSet's failurePolicy matches on the failed Job's message."""
    policy = mapping(mapping(jobset.get("spec")).get("failurePolicy"))
    return any(mapping(r).get("onJobFailureMessagePatterns") for r in items(policy.get("rules")))


def _skipped(run: RunReplay, tries: list[Try]) -> RunReplay:
    """A run the JobSet would not have made: its failed attempts saved whole."""
    these = [t for t in tries if t.run == run.run]
    saved: dict[str, float] = {}
    for attempt in these:
        for resource, amount in attempt.held.items():
            saved[resource] = saved.get(resource, 0.0) + amount
    seconds = sum(t.seconds for t in these)
    return RunReplay(run.run, SKIPPED, saved_count=len(these), saved_seconds=seconds, saved=saved)


def _children(tries: list[Try]) -> dict[tuple[str, str], list[int]]:
    """Each child Job's failed attempts (positions in ``tries``): by replicated Job and job
    index, the first two parts of a JobSet pod's lineage (``webhook.cluster.record``)."""
    out: dict[tuple[str, str], list[int]] = {}
    for position, attempt in enumerate(tries):
        rjob, _, rest = attempt.lineage.partition("/")
        out.setdefault((rjob, rest.partition("/")[0]), []).append(position)
    return out


def _templates(jobset: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Each replicated Job's template spec (the child Jobs' spec: ``constructJob``)."""
    out = {}
    for rjob in items(mapping(jobset.get("spec")).get("replicatedJobs")):
        spec = mapping(mapping(rjob.get("template")).get("spec"))
        out[str(rjob.get("name") or "")] = spec
    return out


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _s(n: int) -> str:
    return "" if n == 1 else "s"
