"""The Job explainer (batch/v1): its JobSpec's plan in words (``kinds.explaining``)."""

from __future__ import annotations

from webhook.kinds.explaining import explain_job_spec
from webhook.plan.explained import Explanation, Subject


def explain_job(subject: Subject) -> list[Explanation]:
    return [explain_job_spec(subject, ("spec",))]
