"""What the audited defaults would have done to a workload that ran without them, and what
they would have saved: its real failures, as its record keeps them
(``webhook.cluster.tries``), judged again in order as the Job controller would have judged
them under the audited rules and budget (``webhook.plan.audit``).

The Job controller's judgement, as ``syncJob`` makes it (pkg/controller/job/
job_controller.go): each failed pod is matched against the ``podFailurePolicy`` rules, the
first match wins (``getMatchingPodFailurePolicyRule`` /``matchPodFailurePolicy`` in
pod_failure_policy.go: ``webhook.kube.failurepolicy.evaluate``); ``FailJob`` fails the Job
at once; ``Ignore`` does not count the failure; any other outcome counts, and the Job fails
once the counted failures exceed ``backoffLimit`` (``syncJob``'s ``exceedsBackoffLimit``:
``failed > backoffLimit``). Attempts are taken in the order they finished, each with the
conditions our controller would have written on it under the audited plan, and those the
kubelet would have restarted in place are no failures (``webhook.plan.marks``).

What it tells:

- the audited plan **ends the workload earlier** (a ``FailJob`` rule, or a smaller budget):
  the failed attempts after that one would not have run, and their run time and what they
  held (``webhook.cluster.waste``: requests times run time) are saved; a workload that in
  fact completed would have failed instead, and the sentence says so;
- it **retries longer** (an ``Ignore`` rule, a bigger budget, no ``FailJob``): what the
  extra attempts would have cost, and whether one would have succeeded, cannot be known;
- **nothing differs**.

An Indexed Job with ``backoffLimitPerIndex`` is judged per index (``per_index_judge``):
what the audited plan saves there is the later attempts of the indexes it would have
failed earlier.

What cannot be known is said, never guessed: attempts the record does not hold (failed
before the recorder saw them, or past ``MAX_TRIES``) are not replayed; a Job whose pods
restart in place (``restartPolicy: OnFailure``: ``pastBackoffLimitOnFailure`` counts
restarts, which no failed pod records) is not replayed at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.cluster.record import Record
from webhook.cluster.tries import LIFECYCLE, Try
from webhook.kube import failurepolicy as fp
from webhook.kube.defaulting import default_backoff_limit
from webhook.kube.jobcontroller import (
    BACKOFF_LIMIT_EXCEEDED,
    BUDGET_MESSAGES,
    FAIL_INDEX,
    POD_FAILURE_POLICY,
    FailureCounter,
    exceeds_max_failed_indexes,
    failjob_message,
)
from webhook.kube.objects import items, mapping
from webhook.plan import marks
from webhook.plan.audit import AuditedPart
from webhook.plan.marks import Judged, settled

COMPLETE, FAILED = "Complete", "Failed"
#: Where a CronJob's audit record keeps its Jobs' part (``webhook.plan.audit``).
CRONJOB_PART = "spec.jobTemplate.spec"
#: At most this many indexes are named in a sentence (an Event's note is 1 KiB at most).
MAX_INDEXES_NAMED = 5
#: The Job controller's reasons for a Job failed by its pods' failures.
BY_PODS = (BACKOFF_LIMIT_EXCEEDED, POD_FAILURE_POLICY)


@dataclass(frozen=True)
class Replay:
    """The audited plan against a workload's real failures."""

    outcome: str  # how it really ended: Complete or Failed
    reason: str  # the condition's reason
    attempts: int  # failed attempts replayed
    ended_at: int | None = None  # the failed attempt the audited plan would have ended it at
    why: str = ""  # how, in words ("at once on exit 42 (fail-non-retriable)")
    #: backoffLimitPerIndex: the indexes it would have failed earlier, in words.
    indexes: tuple[str, ...] = ()
    saved_count: int = 0  # failed attempts that would not have run
    longer: int | None = None  # attempts more the audited plan would have allowed
    saved_seconds: float = 0.0
    saved: Mapping[str, float] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    #: Why nothing could be replayed (then the rest says nothing).
    not_replayed: str = ""

    @property
    def saved_attempts(self) -> int:
        return self.saved_count

    @property
    def differed(self) -> bool:
        if self.not_replayed:
            return False
        failed_instead = self.outcome == COMPLETE and (self.ended_at is not None or self.indexes)
        return self.saved_count > 0 or failed_instead or self.longer is not None

    @property
    def verdict(self) -> str:
        """Whether it differed, as the metric's ``differed`` says it: true, false, or
        unknown (nothing could be replayed)."""
        if self.not_replayed:
            return "unknown"
        return "true" if self.differed else "false"

    def sentence(self) -> str:
        """The ``RetryPolicyAudit`` Event's note, and what ``status`` shows."""
        if self.not_replayed:
            return f"what the defaults would have done is not known: {self.not_replayed}"
        tail = "".join(f"; {u}" for u in self.unknown)
        if self.longer is not None:
            more = (
                f", up to {self.longer} more attempt{_s(self.longer)} after attempt "
                f"{self.attempts} of {self.attempts}"
                if self.longer
                else ""
            )
            return (
                f"the defaults would have retried longer: {self.why}{more}; what they would "
                f"have cost, and whether one would have succeeded, cannot be known{tail}"
            )
        if not self.differed:
            how = "completed" if self.outcome == COMPLETE else "failed"
            return (
                f"nothing would have differed under the defaults: it {how} after "
                f"{self.attempts} failed attempt{_s(self.attempts)} either way{tail}"
            )
        if self.indexes and self.ended_at is None:
            named = list(self.indexes[:MAX_INDEXES_NAMED])
            if len(self.indexes) > MAX_INDEXES_NAMED:
                named.append(f"{len(self.indexes) - MAX_INDEXES_NAMED} more indexes")
            said = f"the defaults would have failed {' and '.join(named)}"
            said += ", though it completed" if self.outcome == COMPLETE else ""
            return f"{said}: {self.savings()} saved{tail}"
        total = self.attempts + (1 if self.outcome == COMPLETE else 0)
        said = (
            f"the defaults would have failed it {self.why} after attempt {self.ended_at} of {total}"
        )
        if self.outcome == COMPLETE:
            said += f", though it completed at attempt {total}"
        return f"{said}: {self.savings()} saved{tail}"

    def savings(self) -> str:
        return savings(
            self.saved_attempts, self.saved_seconds, self.saved, self.outcome == COMPLETE
        )


def savings(count: int, seconds: float, saved: Mapping[str, float], failed: bool = False) -> str:
    """``2 attempts, 120 s and 240 core-seconds``: what would not have run (``failed``:
    they were failed attempts of a workload that completed)."""
    if count == 0 and not seconds:
        return "no attempt"
    parts = [f"{count} failed attempt{_s(count)}" if failed else f"{count} attempt{_s(count)}"]
    parts.append(f"{_amount(seconds)} s")
    parts += [f"{_amount(v)} {unit(k)}" for k, v in sorted(saved.items(), key=_order)]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}"


def replay(
    job: Mapping[str, Any],
    audited: AuditedPart,
    record: Record | None,
    settings: Mapping[str, str] | None = None,
) -> Replay | None:
    """The audited part ``audited`` (its rules and budget) against the failures ``record``
    holds of ``job`` (a Job as stored); ``None`` while the Job has not ended."""
    outcome, reason = ended(job)
    if not outcome:
        return None
    settings = settings or {}
    spec = mapping(job.get("spec"))
    record = record or Record()
    tries = sorted(record.tries, key=lambda t: (t.finished is None, t.finished or 0.0))
    base = Replay(outcome, reason, len(tries), unknown=_unknown(job, record))
    restart = mapping(mapping(mapping(spec.get("template")).get("spec"))).get("restartPolicy")
    if restart == "OnFailure":
        return Replay(
            outcome,
            reason,
            len(tries),
            not_replayed="its pods restart in place "
            "(restartPolicy OnFailure: the Job controller counts restarts)",
        )
    why = unseen(tries, audited.rules)
    if why:
        return replace(base, not_replayed=why)
    per_index = audited.backoff_limit_per_index
    if per_index is None:
        per_index = _int(spec.get("backoffLimitPerIndex"), -1)
    limit = backoff_limit(spec, audited)
    causes = marks.part_causes(audited, mapping(spec.get("template")), settings)
    if isinstance(causes, str):
        return replace(base, not_replayed=causes)
    lowers = None if per_index >= 0 else limit
    places = [
        marks.Place(
            *causes, scope=t.lineage if per_index >= 0 else "", chain=t.lineage, limit=lowers
        )
        for t in tries
    ]
    judged, why = marks.mark(tries, places)
    if why:
        return replace(base, not_replayed=why)
    if per_index >= 0:
        budget = (per_index, _int(spec.get("maxFailedIndexes"), -1), limit)
        return per_index_judge(base, judged, list(audited.rules), budget, settings, job)
    return _judge(base, judged, list(audited.rules), limit, settings)


def unseen(tries: list[Try], rules: Iterable[Any]) -> str:
    """Why ``rules`` cannot judge an attempt recorded before conditions were kept whole (it
    kept only the ``True`` ones that are not the kubelet's: ``Try.complete``), when a rule
    reads a condition it left out; "" when they can."""
    first = next((n for n, t in enumerate(tries, 1) if not t.complete), None)
    if first is None:
        return ""
    for rule in rules:
        for pattern in items(mapping(rule).get("onPodConditions")):
            kind, status = str(mapping(pattern).get("type")), mapping(pattern).get("status")
            if (status or "True") != "True" or kind in LIFECYCLE:
                return (
                    f"failed attempt {first} was recorded by an earlier version, without the "
                    f"{kind} condition a rule of the defaults reads"
                )
    return ""


def _judge(
    base: Replay, judged: list[Judged], rules: list[Any], limit: int, settings: Mapping[str, str]
) -> Replay:
    """Each failed attempt judged in order (``syncJob``: FailJob first, then the budget)."""
    tries = [j.attempt for j in judged]
    end = first_end(judged, rules, limit, settings)
    if end is not None and end.unsure:
        return replace(base, not_replayed=end.unsure)
    if end is not None:
        return _ended(base, tries, end.number, end.why)
    counted = sum(fp.counts(settled(rules, j)[0]) for j in judged if j.failure is not None)
    if base.unknown:
        return _unknown_end(base, tries)
    if base.outcome == FAILED and base.reason in BY_PODS:
        more = limit - counted + 1
        why = _budget_words(limit, settings).replace("past", "within")
        if base.reason == "PodFailurePolicy":
            why = "no rule of the defaults fails it on these failures"
        restarts = sum(j.failure is None for j in judged)
        if restarts:
            been = "a restart" if restarts == 1 else "restarts"
            why = (
                f"{restarts} of its failed attempts would have been {been} in place "
                f"(in-place-exit-codes); {why}"
            )
        return replace(base, longer=max(more, 1), why=why)
    return base


@dataclass(frozen=True)
class End:
    """Where the Job controller ends a Job: its failed attempt (numbered from 1), how in
    words, its ``Failed`` condition's reason and message."""

    number: int
    why: str
    reason: str
    message: str
    #: Why the judgement of attempt ``number`` is not known (then it is no end).
    unsure: str = ""


def first_end(
    judged: list[Judged],
    rules: list[Any],
    limit: int,
    settings: Mapping[str, str] | None = None,
    namespace: str = "",
) -> End | None:
    """Where the Job controller ends a Job with ``rules`` and ``backoffLimit`` ``limit``;
    ``None``: not within ``judged`` (its attempts under the audited plan,
    ``webhook.plan.marks``: a restart in place is no failure). ``syncJob``: a FailJob match
    ends it at once (``PodFailurePolicy``, with ``matchPodFailurePolicy``'s message: the
    pod of ``namespace``, "" when its name was not recorded); else a counted failure past
    ``backoffLimit`` (``exceedsBackoffLimit``: ``failed > backoffLimit``;
    ``BackoffLimitExceeded``)."""
    settings = settings or {}
    counter = FailureCounter(limit)
    for number, one in enumerate(judged, 1):
        if one.failure is None:
            continue
        attempt = one.attempt
        match, known = settled(rules, one)
        if not known:
            return End(number, "", "", "", unsure=_unsure(number, one))
        ends = counter.step(match.action if match else None, fp.counts(match)).job
        if ends == POD_FAILURE_POLICY and match is not None:
            message = _failjob_message(match, namespace, attempt.name)
            return End(number, _failjob_words(match, settings), ends, message)
        if ends == BACKOFF_LIMIT_EXCEEDED:
            why = _budget_words(limit, settings)
            return End(number, why, ends, BUDGET_MESSAGES[ends])
    return None


def _unsure(number: int, judged: Judged) -> str:
    kinds = " and ".join(judged.maybe)
    return (
        f"whether failed attempt {number} would have been marked {kinds} cannot be told from "
        "the record (it came within seconds of a disruption), and its judgement turns on it"
    )


def _failjob_message(match: fp.Match, namespace: str, pod: str) -> str:
    if not pod:
        return ""
    if match.container is not None:
        exit_ = match.container
        return failjob_message(
            namespace, pod, match.index, container=exit_.name, code=exit_.exit_code
        )
    return failjob_message(namespace, pod, match.index, condition=match.condition)


def backoff_limit(spec: Mapping[str, Any], audited: AuditedPart | None = None) -> int:
    """A Job's ``backoffLimit``: the audited part's, else the spec's, else its default
    (``SetDefaults_Job``: 6; MaxInt32 with ``backoffLimitPerIndex``)."""
    if audited is not None and audited.backoff_limit is not None:
        return audited.backoff_limit
    per_index = _int(spec.get("backoffLimitPerIndex"), -1)
    if audited is not None and audited.backoff_limit_per_index is not None:
        per_index = audited.backoff_limit_per_index
    return _int(spec.get("backoffLimit"), default_backoff_limit(per_index >= 0))


def _unknown_end(base: Replay, tries: list[Try]) -> Replay:
    n = len(tries)
    return replace(
        base,
        not_replayed=f"they would not have ended it within the {n} failed attempt{_s(n)} "
        f"recorded, and {'; '.join(base.unknown)}",
    )


def _ended(base: Replay, tries: list[Try], number: int, why: str) -> Replay:
    return replace(stopped(base, tries, number - 1), ended_at=number, why=why)


def skipped(base: Replay, after: list[Try]) -> Replay:
    """``base`` with the attempts ``after`` saved whole (none of them would have started):
    their run time and what they held, added to what ``base`` saved."""
    saved = dict(base.saved)
    for attempt in after:
        for resource, amount in attempt.held.items():
            saved[resource] = saved.get(resource, 0.0) + amount
    seconds = base.saved_seconds + sum(t.seconds for t in after)
    count = base.saved_count + len(after)
    return replace(base, saved_count=count, saved_seconds=seconds, saved=saved)


def stopped(base: Replay, tries: list[Try], position: int) -> Replay:
    """``base`` with what the attempts after ``tries[position]`` spent once it finished
    saved, the workload ended there (``tries`` in the order they finished): once it has
    decided a finished condition, ``syncJob`` deletes the Job's active pods
    (``deleteActivePods``, pkg/controller/job/job_controller.go), as JobSet deletes a failed
    run's child Jobs. Those that started then or later are saved whole (and counted), those
    running then from that point on."""
    count, seconds, saved = after_end(tries, position)
    total = dict(base.saved)
    for resource, amount in saved.items():
        total[resource] = total.get(resource, 0.0) + amount
    return replace(
        base,
        saved_count=base.saved_count + count,
        saved_seconds=base.saved_seconds + seconds,
        saved=total,
    )


def after_end(tries: list[Try], position: int) -> tuple[int, float, dict[str, float]]:
    """``stopped``'s count, seconds and resource-seconds of the attempts after
    ``tries[position]`` (one whose times are not known: saved whole)."""
    at = tries[position].finished
    count, seconds, saved = 0, 0.0, {}
    for attempt in tries[position + 1 :]:
        start = attempt.started
        if at is None or start is None:
            share, spent = 1.0, attempt.seconds
        else:
            spent = max(0.0, (attempt.finished or at) - max(start, at))
            share = spent / attempt.seconds if attempt.seconds > 0 else 0.0
        count += at is None or start is None or start >= at
        seconds += spent
        for resource, amount in attempt.held.items():
            saved[resource] = saved.get(resource, 0.0) + amount * share
    return count, seconds, saved


def per_index_judge(
    base: Replay,
    judged: list[Judged],
    rules: list[Any],
    budget: tuple[int, int, int],
    settings: Mapping[str, str],
    job: Mapping[str, Any],
) -> Replay:
    """An Indexed Job with ``backoffLimitPerIndex``, each attempt judged in order
    (``isIndexFailed`` in pkg/controller/job/indexed_job_utils.go: a FailIndex match, or a
    counted failure once the index's earlier counted failures reach the limit, fails the
    index, whose later attempts then do not run); FailJob, counted failures past
    ``backoffLimit`` or more failed indexes than ``maxFailedIndexes`` end the Job, in
    ``syncJob``'s order."""
    per_index, max_failed, limit = budget
    tries = [j.attempt for j in judged]
    counter = FailureCounter(limit, per_index)
    failed: dict[str, str] = {}
    saved: list[Try] = []
    for number, one in enumerate(judged, 1):
        attempt = one.attempt
        index = attempt.lineage
        if index in failed:
            saved.append(attempt)
            continue
        if one.failure is None:
            continue  # (a restart in place)
        match, known = settled(rules, one)
        if not known:
            return replace(base, not_replayed=_unsure(number, one))
        ends = counter.step(match.action if match else None, fp.counts(match), index)
        if ends.job == POD_FAILURE_POLICY and match is not None:
            why = _failjob_words(match, settings)
            return _ended_per_index(base, tries, number, saved, why, failed)
        if ends.index == FAIL_INDEX and match is not None:
            failed[index] = f"index {index} {_failjob_words(match, settings)}"
        elif ends.index is not None:
            failed[index] = f"index {index} past backoffLimitPerIndex {per_index}"
        # ``syncJob`` decides BackoffLimitExceeded before it counts failed indexes
        # (MaxFailedIndexesExceeded): when one pod trips both, the Job ends by the first.
        if ends.job == BACKOFF_LIMIT_EXCEEDED:
            why = _budget_words(limit, settings)
            return _ended_per_index(base, tries, number, saved, why, failed)
        if exceeds_max_failed_indexes(len(failed), max_failed if max_failed >= 0 else None):
            why = f"past maxFailedIndexes {max_failed}"
            return _ended_per_index(base, tries, number, saved, why, failed)
    real = _indexes(mapping(job.get("status")).get("failedIndexes"))
    earlier = {i for i in failed if i not in real} | {t.lineage for t in saved}
    if earlier:
        words = tuple(failed[i] for i in sorted(earlier, key=_index_order))
        return replace(skipped(base, saved), indexes=words)
    if base.unknown:
        return _unknown_end(base, tries)
    if real - set(failed) and base.outcome == FAILED:
        left = ", ".join(sorted(real - set(failed), key=_index_order))
        why = f"index {left} would not have failed within backoffLimitPerIndex {per_index}"
        return replace(base, longer=0, why=why)
    return base


def _ended_per_index(
    base: Replay, tries: list[Try], number: int, saved: list[Try], why: str, failed: Any
) -> Replay:
    """Ended at attempt ``number``: the attempts of the indexes ``failed`` before saved
    whole (they would not have started), and what the others ran after that point
    (``stopped``)."""
    later = tries[number:]
    whole = [*saved, *(t for t in later if t.lineage in failed)]
    rest = [tries[number - 1], *(t for t in later if t.lineage not in failed)]
    return replace(stopped(skipped(base, whole), rest, 0), ended_at=number, why=why)


def _indexes(raw: Any) -> set[str]:
    """``status.failedIndexes`` (``1,3-5``) as index strings."""
    out: set[str] = set()
    for part in str(raw or "").split(","):
        low, _, high = part.partition("-")
        if low.strip().isdigit() and (not high or high.strip().isdigit()):
            first, last = int(low), int(high or low)
            out |= {str(i) for i in range(first, min(last, first + 100_000) + 1)}
    return out


def _index_order(index: str) -> tuple[int, str]:
    return (int(index) if index.isdigit() else -1, index)


def ended(job: Mapping[str, Any]) -> tuple[str, str]:
    """How a Job ended (``Complete`` or ``Failed``, and its reason); ``("", "")`` while it
    runs."""
    for condition in items(mapping(job.get("status")).get("conditions")):
        kind = condition.get("type")
        if kind in (COMPLETE, FAILED) and condition.get("status") == "True":
            return str(kind), str(condition.get("reason") or "")
    return "", ""


def _unknown(job: Mapping[str, Any], record: Record) -> tuple[str, ...]:
    """What the replay cannot see: failures the record counted past what it kept, and
    those the Job controller counted that the record never did."""
    out = []
    if record.more_tries:
        n = record.more_tries
        out.append(f"{n} later failed attempt{_s(n)} not kept in the record, not replayed")
    counted = sum(line.counted for line in record.lineages.values())
    missing = _int(mapping(job.get("status")).get("failed"), 0) - counted
    if missing > 0:
        out.append(f"{missing} failed attempt{_s(missing)} never recorded, not replayed")
    return tuple(out)


def _failjob_words(match: fp.Match, settings: Mapping[str, str]) -> str:
    if match.container is not None:
        words = f"at once on exit {match.container.exit_code}"
        if fp.is_non_retriable_rule(match.rule) and "fail-non-retriable" in settings:
            words += " (fail-non-retriable)"
        return words
    return f"at once on the pod condition {match.condition}"


def _budget_words(limit: int, settings: Mapping[str, str]) -> str:
    named = [k for k in ("backoff-limit", "retries") if k in settings]
    return f"past backoffLimit {limit}" + (f" ({named[0]})" if named else "")


def unit(resource: str) -> str:
    """A resource-second in words: core-seconds, GiB-seconds, GPU-seconds."""
    if resource == "cpu":
        return "core-seconds"
    if resource == "memory":
        return "GiB-seconds"
    if resource.rpartition("/")[2] == "gpu":
        return "GPU-seconds"
    return f"{resource}-seconds"


def _order(item: tuple[str, float]) -> tuple[int, str]:
    return ({"cpu": 0, "memory": 1}.get(item[0], 2), item[0])


def _amount(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.2g}"


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _s(n: int) -> str:
    return "" if n == 1 else "s"
