"""What the audited defaults would have done to a workload that ran without them, and what
they would have saved: its real failures, as its record keeps them
(``webhook.cluster.tries``), judged again in order as the Job controller would have judged
them under the audited rules and budget (``webhook.plan.audit``).

The Job controller's judgement, as ``syncJob`` makes it (pkg/controller/job/
job_controller.go): each failed pod is matched against the ``podFailurePolicy`` rules, the
first match wins (``getMatchingPodFailurePolicyRule`` /``matchPodFailurePolicy`` in
pod_failure_policy.go: ``webhook.kube.failurepolicy.evaluate``); ``FailJob`` fails the Job
at once; ``Ignore`` does not count the failure; any other outcome counts, and the Job fails
once the counted failures exceed ``backoffLimit`` (``exceedsBackoffLimit``: ``failed >
backoffLimit``). Attempts are taken in the order they finished.

What it tells:

- the audited plan **ends the workload earlier** (a ``FailJob`` rule, or a smaller budget):
  the failed attempts after that one would not have run, and their run time and what they
  held (``webhook.cluster.waste``: requests times run time) are saved; a workload that in
  fact completed would have failed instead, and the sentence says so;
- it **retries longer** (an ``Ignore`` rule, a bigger budget, no ``FailJob``): what the
  extra attempts would have cost, and whether one would have succeeded, cannot be known;
- **nothing differs**.

What cannot be known is said, never guessed: attempts the record does not hold (failed
before the recorder saw them, or past ``MAX_TRIES``) are not replayed; an Indexed Job with
``backoffLimitPerIndex`` and a Job whose pods restart in place (``restartPolicy:
OnFailure``: ``pastBackoffLimitOnFailure`` counts restarts, which no failed pod records)
are not replayed at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.cluster.record import Record
from webhook.cluster.tries import Try
from webhook.kube import failurepolicy as fp
from webhook.kube.objects import items, mapping
from webhook.plan.audit import AuditedPart

#: ``SetDefaults_Job`` (pkg/apis/batch/v1/defaults.go): backoffLimit when unset.
DEFAULT_BACKOFF_LIMIT = 6
COMPLETE, FAILED = "Complete", "Failed"
#: Where a CronJob's audit record keeps its Jobs' part (``webhook.plan.audit``).
CRONJOB_PART = "spec.jobTemplate.spec"
#: The Job controller's reasons for a Job failed by its pods' failures.
BY_PODS = ("BackoffLimitExceeded", "PodFailurePolicy")


@dataclass(frozen=True)
class Replay:
    """The audited plan against a workload's real failures."""

    outcome: str  # how it really ended: Complete or Failed
    reason: str  # the condition's reason
    attempts: int  # failed attempts replayed
    ended_at: int | None = None  # the failed attempt the audited plan would have ended it at
    why: str = ""  # how, in words ("at once on exit 42 (fail-non-retriable)")
    longer: int | None = None  # attempts more the audited plan would have allowed
    saved_seconds: float = 0.0
    saved: Mapping[str, float] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    #: Why nothing could be replayed (then the rest says nothing).
    not_replayed: str = ""

    @property
    def saved_attempts(self) -> int:
        return self.attempts - self.ended_at if self.ended_at is not None else 0

    @property
    def differed(self) -> bool:
        if self.not_replayed:
            return False
        earlier = self.ended_at is not None and (
            self.ended_at < self.attempts or self.outcome == COMPLETE
        )
        return earlier or self.longer is not None

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
            return (
                f"the defaults would have retried longer: {self.why}, up to {self.longer} "
                f"more attempt{_s(self.longer)} after attempt {self.attempts} of "
                f"{self.attempts}; what they would have cost, and whether one would have "
                f"succeeded, cannot be known{tail}"
            )
        if not self.differed:
            how = "completed" if self.outcome == COMPLETE else "failed"
            return (
                f"nothing would have differed under the defaults: it {how} after "
                f"{self.attempts} failed attempt{_s(self.attempts)} either way{tail}"
            )
        total = self.attempts + (1 if self.outcome == COMPLETE else 0)
        said = (
            f"the defaults would have failed it {self.why} after attempt {self.ended_at} of {total}"
        )
        if self.outcome == COMPLETE:
            said += f", though it completed at attempt {total}"
        return f"{said}: {self.savings()} saved{tail}"

    def savings(self) -> str:
        n = self.saved_attempts
        parts = [
            f"{n} failed attempt{_s(n)}" if self.outcome == COMPLETE else f"{n} attempt{_s(n)}"
        ]
        parts.append(f"{_amount(self.saved_seconds)} s")
        parts += [f"{_amount(v)} {unit(k)}" for k, v in sorted(self.saved.items(), key=_order)]
        return ", ".join(parts[:-1]) + f" and {parts[-1]}"


def replay(
    job: Mapping[str, Any],
    audited: AuditedPart,
    record: Record | None,
    settings: Mapping[str, str] = {},
) -> Replay | None:
    """The audited part ``audited`` (its rules and budget) against the failures ``record``
    holds of ``job`` (a Job as stored); ``None`` while the Job has not ended."""
    outcome, reason = ended(job)
    if not outcome:
        return None
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
    if spec.get("backoffLimitPerIndex") is not None or audited.backoff_limit_per_index is not None:
        return Replay(
            outcome,
            reason,
            len(tries),
            not_replayed="backoffLimitPerIndex is "
            "judged per index, which this version does not replay",
        )
    limit = audited.backoff_limit
    if limit is None:
        limit = _int(spec.get("backoffLimit"), DEFAULT_BACKOFF_LIMIT)
    return _judge(base, tries, list(audited.rules), limit, settings)


def _judge(
    base: Replay, tries: list[Try], rules: list[Any], limit: int, settings: Mapping[str, str]
) -> Replay:
    """Each failed attempt judged in order (``syncJob``: FailJob first, then the budget)."""
    counted = 0
    for number, attempt in enumerate(tries, 1):
        match = fp.evaluate(rules, attempt.failure)
        if match is not None and match.action == "FailJob":
            return _ended(base, tries, number, _failjob_words(match, settings))
        counted += fp.counts(match)
        if counted > limit:  # exceedsBackoffLimit
            return _ended(base, tries, number, _budget_words(limit, settings))
    if base.unknown:
        n = len(tries)
        return replace(
            base,
            not_replayed=f"they would not have ended it within the {n} failed attempt{_s(n)} "
            f"recorded, and {'; '.join(base.unknown)}",
        )
    if base.outcome == FAILED and base.reason in BY_PODS:
        more = limit - counted + 1
        why = _budget_words(limit, settings).replace("past", "within")
        if base.reason == "PodFailurePolicy":
            why = "no rule of the defaults fails it on these failures"
        return replace(base, longer=max(more, 1), why=why)
    return base


def _ended(base: Replay, tries: list[Try], number: int, why: str) -> Replay:
    after = tries[number:]
    saved: dict[str, float] = {}
    for attempt in after:
        for resource, amount in attempt.held.items():
            saved[resource] = saved.get(resource, 0.0) + amount
    seconds = sum(t.seconds for t in after)
    return replace(base, ended_at=number, why=why, saved_seconds=seconds, saved=saved)


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
