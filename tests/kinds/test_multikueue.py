"""MultiKueue: a worker cluster's copy of a manager's Job or JobSet (label
``kueue.x-k8s.io/multikueue-origin``) is left as the manager's admission made it; its
pods still get the pod-level settings its template carries (``webhook.kinds.audit``)."""

from __future__ import annotations

import copy

from testkit.builders import P, job, job_owner, pod
from testkit.kinds import jobset
from testkit.workloads import FixedAttempts, mutate, validate
from webhook.kube.podspec import spot_requirements
from webhook.kube.wellknown import MULTIKUEUE_MANAGED_BY, MULTIKUEUE_ORIGIN
from webhook.plan.audit import AuditRecord, managed
from webhook.policy.config import Config, parse_config

ANNOTATED = {
    P + "fail-non-retriable": "true",
    P + "backoff-limit": "3",
    P + "non-spot-attempts": "1",
}
#: The worker's own config: defaults, audited in the namespace, and a rail.
WORKER = parse_config(
    "defaults: {ignore-disruptions: true, backoff-limit: 1}\n"
    "guardRails: {maxBackoffLimit: 2}\n"
    "namespaces: {ml: {rollout: audit}}\n"
)


def worker_copy(manager: dict, origin: str = "multikueue") -> dict:
    """The copy Kueue creates on a worker, as its adapter builds it.

    # upstream: MultiKueueOriginLabel = "kueue.x-k8s.io/multikueue-origin"
    # (apis/kueue/v1beta1/constants.go); the Job adapter's SyncJob
    # (pkg/controller/jobs/job/job_multikueue_adapter.go) creates the remote Job with
    # CloneObjectMetaForCreation (pkg/util/api: name, namespace, labels, annotations), the
    # spec deep-copied, the selector dropped, the prebuilt-workload label and this label
    # added, and spec.managedBy cleared so the worker's Job controller runs it; the JobSet
    # adapter does the same through SetMultiKueueMeta (pkg/controller/jobframework).
    """
    copied = {
        "apiVersion": manager["apiVersion"],
        "kind": manager["kind"],
        "metadata": {
            k: copy.deepcopy(v)
            for k, v in manager["metadata"].items()
            if k in ("name", "namespace", "labels", "annotations")
        },
        "spec": copy.deepcopy(manager["spec"]),
    }
    copied["spec"].pop("selector", None)
    copied["spec"].pop("managedBy", None)
    labels = copied["metadata"].setdefault("labels", {})
    labels["kueue.x-k8s.io/prebuilt-workload-name"] = "job-train-1a2b3"
    labels[MULTIKUEUE_ORIGIN] = origin
    return copied


def test_the_origin_label_is_kueues():
    # upstream: MultiKueueOriginLabel (apis/kueue/v1beta1/constants.go), set by SyncJob
    # (pkg/controller/jobs/job/job_multikueue_adapter.go) on the worker's copy.
    assert MULTIKUEUE_ORIGIN == "kueue.x-k8s.io/multikueue-origin"
    # upstream: MultiKueueControllerName (apis/kueue/v1beta1/constants.go), the manager's
    # spec.managedBy that IsJobManagedByKueue checks.
    assert MULTIKUEUE_MANAGED_BY == "kueue.x-k8s.io/multikueue"


def test_the_managers_job_is_mutated_as_usual():
    # upstream: managedByExternalController (pkg/controller/job/job_controller.go): the
    # manager's Job controller skips a Job managed by MultiKueue; its spec is what the
    # worker receives, so the policy is applied there.
    manager = job(ANNOTATED, spec={"managedBy": MULTIKUEUE_MANAGED_BY})
    verdict, out = mutate(manager, Config())
    assert verdict.allowed, verdict.message
    assert out["spec"]["podFailurePolicy"]["rules"] and out["spec"]["backoffLimit"] == 3
    assert out["spec"]["managedBy"] == MULTIKUEUE_MANAGED_BY and managed(out) == "enforce"


def test_a_workers_copy_of_a_job_is_left_as_the_manager_made_it():
    _, manager = mutate(job(ANNOTATED, spec={"managedBy": MULTIKUEUE_MANAGED_BY}), Config())
    copied = worker_copy(manager)
    # The worker's defaults, rails and audit would each change it; none may.
    verdict, out = mutate(copied, WORKER)
    assert verdict.allowed and verdict.patch == []
    assert out == copied
    assert AuditRecord.of(out) is None and managed(out) == "enforce"  # the manager's label
    said = "\n".join(verdict.warnings)
    assert "MultiKueue's copy of a manager's" in said and "kueue#13046" in said
    assert validate(copied, WORKER).allowed
    # Unannotated, in an audited namespace: no record either.
    bare = worker_copy(job())
    verdict, out = mutate(bare, WORKER)
    assert verdict.patch == [] and AuditRecord.of(out) is None


def test_a_workers_copy_of_a_jobset_is_left_as_the_manager_made_it():
    _, manager = mutate(jobset(ANNOTATED, managedBy=MULTIKUEUE_MANAGED_BY), Config())
    copied = worker_copy(manager)
    verdict, out = mutate(copied, WORKER)
    assert verdict.allowed and verdict.patch == [] and out == copied


def test_the_pods_of_a_workers_copy_still_get_their_templates_settings():
    _, manager = mutate(job(ANNOTATED, spec={"managedBy": MULTIKUEUE_MANAGED_BY}), Config())
    copied = worker_copy(manager)
    template = copied["spec"]["template"]
    made = pod(template["metadata"]["annotations"], owner=job_owner(), spec=template["spec"])
    verdict, out = mutate(made, WORKER, attempts=FixedAttempts(3))  # the last attempt
    assert verdict.allowed, verdict.message
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": spot_requirements(WORKER.spot_node_labels)}
    ]
