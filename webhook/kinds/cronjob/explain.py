"""The CronJob explainer (batch/v1): each Job it creates carries ``spec.jobTemplate.spec``,
explained and simulated as that Job; the CronJob itself never fails."""

from __future__ import annotations

from webhook.kinds.explaining import explain_job_spec
from webhook.plan.explained import Explanation, Subject


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
