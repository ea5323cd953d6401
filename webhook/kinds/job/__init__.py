"""batch/v1 Job (Indexed Jobs included)."""

from webhook.kinds.base import KindSpec, Named
from webhook.kinds.job.mutate import JobMutator
from webhook.kinds.view import job_view
from webhook.kube.defaulting import DEFAULT_BACKOFF_LIMIT, default_job
from webhook.plan.model import LimitField

SPEC = KindSpec(
    "batch",
    "v1",
    "Job",
    "jobs",
    ("job", "jobs", "job.batch", "jobs.batch"),
    JobMutator(),
    LimitField(("spec", "backoffLimit"), DEFAULT_BACKOFF_LIMIT, DEFAULT_BACKOFF_LIMIT),
    default_job,
    job_view,
    story=Named("webhook.kinds.job.story", "STORY"),
    explainer=Named("webhook.kinds.job.explain", "explain_job"),
    simulator=Named("webhook.kinds.job.simulate", "JobSimulator"),
)
