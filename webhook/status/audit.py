"""What audited defaults would have done, in ``retry-webhook status``: for each ended Job of
an audited workload (``retry-policy.dev/audit``), the sentence its ``RetryPolicyAudit``
Event says (``webhook.plan.replay``, the same replay the controller runs), from the Job and
its record as read. A Job that runs is told nothing yet. A kind whose story facts replay it
whole (``StoryFacts.replay``: a JobSet, from its own record once it has ended) is told as
a whole: its child Jobs are its runs' parts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.cluster.record import Record
from webhook.kinds import registry
from webhook.kinds.story import Replayed
from webhook.kube.objects import mapping
from webhook.plan.audit import AuditRecord
from webhook.plan.replay import CRONJOB_PART, replay


@dataclass(frozen=True)
class AuditLine:
    job: str | None  # None: the workload, told as a whole
    sentence: str
    differed: str  # true, false, unknown (as the metric's label)
    saved: Mapping[str, float] = field(default_factory=dict)


def audit_lines(workload: Mapping[str, Any], jobs: list[dict[str, Any]]) -> list[AuditLine]:
    """The sentence for each ended Job of ``workload`` (a Job, or a CronJob's Jobs), or
    for ``workload`` itself when its kind replays it whole (a JobSet)."""
    kind = registry.kind_of(workload)
    facts = kind.story.load() if kind is not None and kind.story is not None else None
    if facts is not None and facts.replay is not None:
        return _whole_line(facts.replay(workload))
    out = []
    for job in jobs:
        own = AuditRecord.of(job)
        audit, path = (own, "spec") if own is not None else (AuditRecord.of(workload), "")
        if audit is None:
            continue
        part = audit.part(path or CRONJOB_PART)
        if part is None:
            continue
        result = replay(job, part, Record.of(job), audit.settings)
        if result is None:
            continue
        name = str(mapping(job.get("metadata")).get("name") or "")
        out.append(AuditLine(name, result.sentence(), result.verdict, dict(result.saved)))
    return out


def _whole_line(result: Replayed | None) -> list[AuditLine]:
    if result is None:
        return []
    return [AuditLine(None, result.sentence(), result.verdict, result.saved)]


def render_text(lines: list[AuditLine], several: bool) -> list[str]:
    """The ``Audited defaults:`` block (nothing when there is nothing to tell)."""
    if not lines:
        return []
    out = ["", "Audited defaults (not enforced), replayed against the real failures:"]
    for line in lines:
        out.append(f"  - {f'Job {line.job}: ' if several and line.job else ''}{line.sentence}")
    return out


def to_json(lines: list[AuditLine]) -> list[dict[str, Any]]:
    return [
        {"job": a.job, "sentence": a.sentence, "differed": a.differed, "saved": dict(a.saved)}
        for a in lines
    ]
