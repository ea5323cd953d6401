"""Workloads of the kinds beside Job and Pod, as admission sees them on CREATE: CronJob,
JobSet, PyTorchJob and RayJob (TrainJob and its runtimes: ``testkit/trainer.py``), with
the defaults of their CRD schema applied (``testkit.workloads.admitted``).
"""

from __future__ import annotations

import copy

from testkit.workloads import admitted, pod_template


def cronjob(annotations=None, *, job_spec=None, template_annotations=None, applied=False):
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "ml"},
        "spec": {
            "schedule": "0 3 * * *",
            "jobTemplate": {"spec": {"template": pod_template("eval", restart_policy="Never")}},
        },
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    if template_annotations:
        manifest["spec"]["jobTemplate"]["metadata"] = {"annotations": template_annotations}
    if job_spec:
        manifest["spec"]["jobTemplate"]["spec"].update(copy.deepcopy(job_spec))
    return admitted(manifest, applied=applied)


def job_from(cronjob_obj):
    """The Job the CronJob controller creates from the template, as its admission sees it."""
    template = copy.deepcopy(cronjob_obj["spec"]["jobTemplate"])
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "nightly-29000000",
            "namespace": "ml",
            "annotations": (template.get("metadata") or {}).get("annotations", {}),
            # (getJobFromTemplate2 copies the template's labels too)
            "labels": (template.get("metadata") or {}).get("labels", {}),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": "nightly",
                    # the stored CronJob's (its CREATE review had none)
                    "uid": cronjob_obj["metadata"].get("uid", "cronjob-uid"),
                    "controller": True,
                }
            ],
        },
        "spec": template["spec"],
    }
    return admitted(job)


def replicated(name, restart_policy=None, **job_spec):
    return {
        "name": name,
        "replicas": 2,
        "template": {
            "spec": {
                "parallelism": 2,
                "completions": 2,
                **job_spec,
                "template": pod_template("trainer", restart_policy=restart_policy),
            }
        },
    }


def jobset(annotations=None, *, jobs=None, failure_policy=None, applied=False, **spec):
    manifest = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "pretrain", "namespace": "ml"},
        "spec": {"replicatedJobs": jobs or [replicated("leader"), replicated("workers")], **spec},
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    if failure_policy is not None:
        manifest["spec"]["failurePolicy"] = failure_policy
    return admitted(manifest, applied=applied)


def child(obj, index):
    return obj["spec"]["replicatedJobs"][index]["template"]["spec"]


def pytorchjob(
    annotations=None, *, applied=False, restart_policy=None, container="pytorch", **spec
):
    replicas = {}
    for rtype, count in (("Master", 1), ("Worker", 3)):
        replicas[rtype] = {"replicas": count, "template": pod_template(container)}
        if restart_policy:
            replicas[rtype]["restartPolicy"] = restart_policy
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "finetune", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": replicas, **spec},
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    return admitted(manifest, applied=applied)


def rayjob(annotations=None, *, applied=False, **spec):
    manifest = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "tune", "namespace": "ml"},
        "spec": {
            "entrypoint": "python /home/ray/tune.py",
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": pod_template("ray-head")},
                "workerGroupSpecs": [
                    {
                        "groupName": group,
                        "minReplicas": 1,
                        "maxReplicas": 4,
                        "rayStartParams": {},
                        "template": pod_template("ray-worker", "sidecar"),
                    }
                    for group in ("cpu", "gpu")
                ],
            },
            **spec,
        },
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    return admitted(manifest, applied=applied)
