"""jobset.x-k8s.io/v1alpha2 JobSet: restarts of the whole set are the retry budget."""

from webhook.cluster.events import Workload
from webhook.kinds.base import KindSpec, Named
from webhook.kinds.job.mutate import makes_jobs_from_template
from webhook.kinds.jobset.mutate import JobSetMutator
from webhook.kinds.jobset.rules import MAX_RESTARTS
from webhook.kube.wellknown import JOBSET_GROUP, JOBSET_NAME, JOBSET_UID, JOBSET_VERSION

SPEC = KindSpec(
    JOBSET_GROUP,
    JOBSET_VERSION,
    "JobSet",
    "jobsets",
    ("jobset", "jobsets", "js", "jobset.jobset.x-k8s.io", "jobsets.jobset.x-k8s.io"),
    JobSetMutator(),
    MAX_RESTARTS,
    story=Named("webhook.kinds.jobset.story", "STORY"),
    explainer=Named("webhook.kinds.jobset.explain", "explain_jobset"),
    simulator=Named("webhook.kinds.jobset.simulate", "JobSetSimulator"),
    peers=Named("webhook.kinds.jobset.peers", "JobSetPeers"),
    whole_audit=Named("webhook.kinds.jobset.audits", "JobSetAudit"),
    # Its child Jobs and their pods regard it (JobSet labels every pod with its name and,
    # since v0.9.0, UID: ``labelAndAnnotateObject``); read for its owner, or its UID. Its
    # record counts its runs: its pods (and a TrainJob's) read it at their admission.
    workload=Workload(
        regards_jobs=True, pod_labels=(JOBSET_NAME, JOBSET_UID), read=True, pod_records=True
    ),
)

# Its child Jobs are made from its replicated Jobs' templates, which its admission applied
# the policy to (``backoff-limit`` there means restarts of the set): theirs leaves them be.
makes_jobs_from_template(JOBSET_GROUP, SPEC.kind)
