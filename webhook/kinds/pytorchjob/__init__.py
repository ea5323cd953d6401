"""kubeflow.org/v1 PyTorchJob: the budget is ``spec.runPolicy.backoffLimit``."""

from webhook.kinds.base import KindSpec, Named
from webhook.kinds.pytorchjob.mutate import BACKOFF, KIND, PyTorchJobMutator
from webhook.kube.wellknown import KUBEFLOW_GROUP

SPEC = KindSpec(
    KUBEFLOW_GROUP,
    "v1",
    KIND,
    "pytorchjobs",
    ("pytorchjob", "pytorchjobs", "pytorchjob.kubeflow.org", "pytorchjobs.kubeflow.org"),
    PyTorchJobMutator(),
    BACKOFF,
    explainer=Named("webhook.kinds.pytorchjob.explain", "explain_pytorchjob"),
    simulator=Named("webhook.kinds.job.simulate", "JobSimulator"),
)
