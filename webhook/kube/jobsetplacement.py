"""JobSet's exclusive placement (``alpha.jobset.sigs.k8s.io/exclusive-topology``), as its
pod webhooks carry it out, and what that means for a retry-delay gate.

The JobSet controller copies the annotation, from the JobSet or from a replicated Job's
template, onto each child Job's pod template (``labelAndAnnotateObject`` in
pkg/controllers/jobset_controller.go), with ``alpha.jobset.sigs.k8s.io/node-selector``
when the nodes were labelled beforehand instead. Without that second annotation JobSet's
pod webhooks (pkg/webhooks/pod_webhook.go) place each child Job's pods after its leader,
the pod of completion index 0: the mutating one (``Default``, ``setNodeSelector``) gives a
follower a nodeSelector on the leader's topology domain once the leader is scheduled, and
the validating one (``ValidateCreate``) refuses a follower while its leader has no
``nodeName`` ("leader pod not yet scheduled, not creating follower pod. this is an
expected, transient error"). The Job controller records ``FailedCreate`` and tries again
with its back-off (1 s doubling to a minute: ``DefaultJobApiBackOff``,
``MaxJobApiBackOff`` in pkg/controller/job/job_controller.go).

So while our gate holds a leader back, its Job's followers cannot even be created: the
leader's gate holds the whole Job, and a follower created afterwards has had its wait.
A follower is gated on its own only when its delay counts from the failure (the same
failure as its leader's, whose time has then passed), never from its own admission,
which would add a second wait after the leader's (``plan.delays.ungateable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kube.wellknown import COMPLETION_INDEX, JOBSET_NAME, NODE_SELECTOR_STRATEGY
from webhook.kube.wellknown import EXCLUSIVE_TOPOLOGY as EXCLUSIVE


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else {}


def leader_first(annotations: Mapping[str, Any]) -> str | None:
    """The topology key when these annotations (a JobSet's, a replicated Job template's)
    ask for exclusive placement by JobSet's pod webhooks (leader first), else ``None``."""
    topology = annotations.get(EXCLUSIVE)
    if not isinstance(topology, str) or NODE_SELECTOR_STRATEGY in annotations:
        return None
    return topology


def follower(pod: Mapping[str, Any]) -> bool:
    """Whether JobSet's pod webhooks admit this pod only after its leader is scheduled
    (``ValidateCreate``: a JobSet pod with exclusive placement, not the node-selector
    strategy, whose completion index is not 0: ``IsLeaderPod`` in
    pkg/util/placement/placement.go)."""
    annotations = _annotations(pod)
    return (
        JOBSET_NAME in annotations
        and leader_first(annotations) is not None
        and annotations.get(COMPLETION_INDEX) != "0"
    )


def exclusive_of(jobset: Mapping[str, Any], job_template: Mapping[str, Any]) -> str | None:
    """The topology key a replicated Job's pods are placed by, leader first, else
    ``None``: its pod template's annotations, then the JobSet's two keys, then the Job
    template's, as ``labelAndAnnotateObject`` writes them on the pods."""
    spec = job_template.get("spec")
    pod_template = spec.get("template") if isinstance(spec, dict) else None
    merged = dict(_annotations(pod_template if isinstance(pod_template, dict) else {}))
    for source in (_annotations(jobset), _annotations(job_template)):
        if EXCLUSIVE in source:
            merged[EXCLUSIVE] = source[EXCLUSIVE]
            if NODE_SELECTOR_STRATEGY in source:
                merged[NODE_SELECTOR_STRATEGY] = source[NODE_SELECTOR_STRATEGY]
    return leader_first(merged)
