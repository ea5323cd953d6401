"""trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2): the policy goes to the
JobSet the trainer makes from its runtime."""

from webhook.cluster.events import Workload
from webhook.kinds.base import KindSpec, Named
from webhook.kinds.jobset.mutate import owned_by
from webhook.kinds.trainjob.mutate import JOBSET_OWNER, KIND, TrainJobMutator
from webhook.kube.wellknown import TRAINER_GROUP

SPEC = KindSpec(
    TRAINER_GROUP,
    "v1alpha1",
    KIND,
    "trainjobs",
    (
        "trainjob",
        "trainjobs",
        "trainjob.trainer.kubeflow.org",
        "trainjobs.trainer.kubeflow.org",
    ),
    TrainJobMutator(),
    story=Named("webhook.kinds.trainjob.story", "STORY"),
    explainer=Named("webhook.kinds.trainjob.explain", "explain_trainjob"),
    # The trainer makes its JobSet its controller owner and labels neither the JobSet's
    # pods nor its Jobs with it (``JobSet.Build``): its Events are found through the JobSet.
    workload=Workload(stands_for_owned=True),
)

# The JobSet its trainer makes, owned by it: what that changes there (``jobset.mutate.Owner``).
owned_by(KIND, JOBSET_OWNER)
