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
the part of each that ran after it) is saved, and whether the JobSet then restarts is its
``failurePolicy``'s decision, as it was. When it would not have failed the child Job
where the real plan did, the run would have gone on: what that costs cannot be known.

What cannot be known is said: a run whose failures the record does not hold (never seen,
or past ``MAX_TRIES``), a JobSet that restarts in place or single Jobs, child Jobs whose
pods restart in place or that fail per index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.record import Record
from webhook.cluster.tries import Try
from webhook.kube.objects import items, mapping
from webhook.plan.audit import AuditRecord
from webhook.plan.replay import after_end, backoff_limit, first_end, savings, unseen

#: ``JobSetCompleted``, ``JobSetFailed`` (api/jobset/v1alpha2/jobset_types.go).
COMPLETED, FAILED = "Completed", "Failed"
#: ``FailurePolicyAction``s that recreate one child Job without a new run.
RESTART_ONE = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
#: At most this many runs are told in a sentence (an Event's note is 1 KiB at most).
MAX_RUNS_NAMED = 2
EARLIER, INSTEAD, LONGER, SAME, UNKNOWN = "earlier", "instead", "longer", "same", "unknown"


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
    #: The child Job's ``Failed`` reason under the audited plan, and the real one ("":
    #: none recorded), which the JobSet's failurePolicy rules may match on.
    reason: str = ""
    real_reason: str = ""

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
    #: Whether the JobSet's failurePolicy rules match on the child Job's failure reason
    #: (``onJobFailureReasons``: ``ruleIsApplicable``).
    by_reason: bool = False

    @property
    def saved(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for run in self.runs:
            for resource, amount in run.saved.items():
                out[resource] = out.get(resource, 0.0) + amount
        return out

    @property
    def differed(self) -> bool:
        return not self.not_replayed and any(
            r.kind in (EARLIER, INSTEAD, LONGER) for r in self.runs
        )

    @property
    def verdict(self) -> str:
        """As the metric's ``differed`` label: true, false, or unknown."""
        if self.differed:
            return "true"
        if self.not_replayed or any(r.kind == UNKNOWN for r in self.runs):
            return "unknown"
        return "false"

    def sentence(self) -> str:
        """The ``RetryPolicyAudit`` Event's note on the JobSet, and what ``status`` shows."""
        if self.not_replayed:
            return f"what the defaults would have done is not known: {self.not_replayed}"
        told = [r for r in self.runs if r.kind != SAME]
        unknown = [r.words() for r in told if r.kind == UNKNOWN]
        if not self.differed:
            n, runs = self.attempts, len(self.runs)
            if unknown:
                return (
                    "nothing would have differed under the defaults in the runs recorded; "
                    + "; ".join(unknown)
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
        ended = [r for r in self.runs if r.kind in (EARLIER, INSTEAD)]
        if len(ended) > 1:
            count = sum(r.saved_count for r in ended)
            seconds = sum(r.saved_seconds for r in ended)
            said.append(f"in all {savings(count, seconds, self.saved)} saved")
        if ended:
            tail = (
                "whether the JobSet then restarts is its failurePolicy's decision, which the "
                "defaults do not change"
            )
            other = [r.reason for r in ended if r.reason != r.real_reason]
            if self.by_reason and other:
                tail += f" (its rules would see the child Job failed with reason {other[0]})"
            said.append(tail)
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
    if why:
        return JobSetReplay(outcome, len(tries), not_replayed=why)
    last = _int(mapping(jobset.get("status")).get("restarts"), 0)
    last = max([last, *(t.run or 0 for t in tries)])
    # Tries are kept in the order they were recorded: past MAX_TRIES, the latest run kept
    # and those after it may miss failures.
    cut = max((t.run or 0 for t in tries), default=0) if record.more_tries else last + 1
    runs = []
    for run in range(last + 1):
        these = [t for t in tries if t.run == run]
        if run >= cut:
            n = record.more_tries
            what = f"{n} later failed attempt{_s(n)} not kept in the record"
            runs.append(RunReplay(run, UNKNOWN, why=what))
            continue
        final_completed = run == last and outcome == COMPLETED
        runs.append(_run(jobset, audit, run, these, final_completed))
    rules = items(mapping(mapping(jobset.get("spec")).get("failurePolicy")).get("rules"))
    by_reason = any(rule.get("onJobFailureReasons") for rule in rules)
    return JobSetReplay(outcome, len(tries), tuple(runs), by_reason=by_reason)


def _not_replayed(jobset: Mapping[str, Any], audit: AuditRecord, tries: list[Try]) -> str:
    spec = mapping(jobset.get("spec"))
    policy = mapping(spec.get("failurePolicy"))
    if policy.get("restartStrategy") == "InPlaceRestart":
        return "it restarts in place (failurePolicy restartStrategy InPlaceRestart)"
    if any(r.get("action") in RESTART_ONE for r in items(policy.get("rules"))):
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


def _run(
    jobset: Mapping[str, Any], audit: AuditRecord, run: int, tries: list[Try], completed: bool
) -> RunReplay:
    """One run: where the real plan ended it (its first child Job to fail), and where the
    audited one would have."""
    name = str(mapping(jobset.get("metadata")).get("name") or "")
    templates = _templates(jobset)
    # (position in the run, Job, attempt, why, reason)
    real: list[tuple[int, str, int, str, str]] = []
    audited: list[tuple[int, str, int, str, str]] = []
    for child, positions in _children(tries).items():
        rjob, index = child
        template = templates.get(rjob, {})
        part = audit.part(part_path(rjob))
        mine = [tries[p] for p in positions]
        job = f"{name}-{rjob}-{index}"
        rules = list(items(mapping(template.get("podFailurePolicy")).get("rules")))
        end = first_end(mine, rules, backoff_limit(template))
        if end is not None:
            real.append((positions[end[0] - 1], job, *end))
        if part is not None:
            rules, limit = list(part.rules), backoff_limit(template, part)
            end = first_end(mine, rules, limit, audit.settings)
        if end is not None:
            audited.append((positions[end[0] - 1], job, *end))
    first_real, first_audited = min(real, default=None), min(audited, default=None)
    if first_audited is not None and (first_real is None or first_audited[0] < first_real[0]):
        position, job, attempt, why, reason = first_audited
        kind = INSTEAD if completed else EARLIER
        count, seconds, saved = after_end(tries, position)
        real_reason = first_real[4] if first_real is not None else ""
        return RunReplay(run, kind, job, attempt, why, count, seconds, saved, reason, real_reason)
    if first_real is not None and (first_audited is None or first_audited[0] > first_real[0]):
        _, job, attempt, why, _ = first_real
        return RunReplay(run, LONGER, job, attempt, why)
    if first_real is None and not completed:
        what = "the failure that ended it is not in the record"
        if not tries:
            what = "none of its failures is in the record"
        return RunReplay(run, UNKNOWN, why=what)
    return RunReplay(run, SAME)


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
