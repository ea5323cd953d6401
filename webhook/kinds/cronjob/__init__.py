"""batch/v1 CronJob: the policy goes into the Jobs it creates (``spec.jobTemplate``)."""

from webhook.kinds.base import KindSpec, Named
from webhook.kinds.cronjob.mutate import JOB_SPEC, CronJobMutator
from webhook.kinds.job.mutate import makes_jobs_from_template
from webhook.kube.defaulting import DEFAULT_BACKOFF_LIMIT, default_cronjob
from webhook.plan.model import LimitField

SPEC = KindSpec(
    "batch",
    "v1",
    "CronJob",
    "cronjobs",
    ("cronjob", "cronjobs", "cj", "cronjob.batch", "cronjobs.batch"),
    CronJobMutator(),
    LimitField((*JOB_SPEC, "backoffLimit"), None, DEFAULT_BACKOFF_LIMIT),
    default_cronjob,
    story=Named("webhook.kinds.cronjob.story", "STORY"),
    explainer=Named("webhook.kinds.cronjob.explain", "explain_cronjob"),
    simulator=Named("webhook.kinds.job.simulate", "JobSimulator"),
)

# Its Jobs are made from its ``jobTemplate``, which its admission applied the policy to.
makes_jobs_from_template(SPEC.group, SPEC.kind)
