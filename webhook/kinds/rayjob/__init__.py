"""ray.io/v1 RayJob: the budget is ``spec.backoffLimit``, retries on a new RayCluster."""

from webhook.kinds.base import KindSpec, Named
from webhook.kinds.rayjob.mutate import BACKOFF, KIND, RayJobMutator
from webhook.kube.wellknown import RAY_GROUP

SPEC = KindSpec(
    RAY_GROUP,
    "v1",
    KIND,
    "rayjobs",
    ("rayjob", "rayjobs", "rayjob.ray.io", "rayjobs.ray.io"),
    RayJobMutator(),
    BACKOFF,
    story=Named("webhook.kinds.rayjob.story", "STORY"),
    explainer=Named("webhook.kinds.rayjob.explain", "explain_rayjob"),
    simulator=Named("webhook.kinds.job.simulate", "JobSimulator"),
)
