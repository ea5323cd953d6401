"""v1 Pod: its placement, memory, nodes and delay by its attempt, at its admission."""

from webhook.kinds.base import KindSpec, Named
from webhook.kinds.pod.mutate import PodMutator
from webhook.kinds.view import pod_view
from webhook.kube.defaulting import default_pod

SPEC = KindSpec(
    "",
    "v1",
    "Pod",
    "pods",
    ("pod", "pods", "po"),
    PodMutator(),
    defaulter=default_pod,
    view=pod_view,
    explainer=Named("webhook.kinds.pod.explain", "explain_pod"),
    simulator=Named("webhook.kinds.pod.simulate", "PodSimulator"),
)
