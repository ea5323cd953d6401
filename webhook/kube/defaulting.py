"""API-server defaulting, reproduced for the dry-run CLI.

Webhooks see objects after defaulting, so the dry-run applies the same defaults first:
otherwise it would show a different result than ``kubectl apply``. This mirrors
``SetDefaults_Job`` and the pod-spec defaults of the Kubernetes API (batch/v1 and
core/v1 ``defaults.go``) for the fields that affect retry policy and the common ones
users see in ``kubectl get -o yaml``; defaults are only ever added, never changed. A
field of the wrong JSON type is left alone (the API server would refuse the object: the
engine then says what is wrong, the defaults do not guess).
"""

from __future__ import annotations

from typing import Any

from webhook.kube.objects import items, mapping

INT32_MAX = 2_147_483_647
#: ``SetDefaults_Job`` (pkg/apis/batch/v1/defaults.go): a Job's ``backoffLimit`` when unset
#: and it has no ``backoffLimitPerIndex`` (with one, ``INT32_MAX``: ``default_backoff_limit``).
DEFAULT_BACKOFF_LIMIT = 6


def default_backoff_limit(per_index: bool) -> int:
    """``SetDefaults_Job`` (pkg/apis/batch/v1/defaults.go): an unset ``backoffLimit`` is 6,
    or MaxInt32 when the Job has ``backoffLimitPerIndex`` (``per_index``): there the
    per-index limits bound the retries, not the Job-wide one."""
    return INT32_MAX if per_index else DEFAULT_BACKOFF_LIMIT


def default_job_spec(spec: dict[str, Any]) -> None:
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    if spec.get("backoffLimit") is None:
        spec["backoffLimit"] = default_backoff_limit(spec.get("backoffLimitPerIndex") is not None)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if spec.get("podReplacementPolicy") is None:
        has_policy = spec.get("podFailurePolicy") is not None
        spec["podReplacementPolicy"] = "Failed" if has_policy else "TerminatingOrFailed"
    spec.setdefault("manualSelector", False)
    policy = spec.get("podFailurePolicy")
    if isinstance(policy, dict):
        for rule in items(policy.get("rules")):
            for pattern in items(rule.get("onPodConditions") if isinstance(rule, dict) else None):
                if isinstance(pattern, dict) and not pattern.get("status"):
                    pattern["status"] = "True"
    template = spec.get("template")
    if isinstance(template, dict):
        default_pod_template(template)


def default_job(job: dict[str, Any]) -> None:
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return
    default_job_spec(spec)
    metadata = job.setdefault("metadata", {})
    template_labels = mapping(mapping(spec.get("template")).get("metadata")).get("labels")
    if (
        isinstance(metadata, dict)
        and isinstance(template_labels, dict)
        and template_labels
        and not metadata.get("labels")
    ):
        metadata["labels"] = dict(template_labels)


def default_pod_template(template: dict[str, Any]) -> None:
    spec = template.get("spec")
    if isinstance(spec, dict):
        default_pod_spec(spec)


def default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for group in ("initContainers", "containers"):
        for container in items(spec.get(group)):
            if isinstance(container, dict):
                _default_container(container)


def _default_container(container: dict[str, Any]) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    if "imagePullPolicy" not in container:
        image = str(container.get("image") or "")
        name = image.rsplit("/", 1)[-1]
        tag = name.split("@", 1)[0].partition(":")[2]
        pinned = "@" in name or (tag and tag != "latest")
        container["imagePullPolicy"] = "IfNotPresent" if pinned else "Always"
    container.setdefault("resources", {})
    for env in items(container.get("env")):
        field_ref = mapping(mapping(env).get("valueFrom")).get("fieldRef")
        if isinstance(field_ref, dict):
            field_ref.setdefault("apiVersion", "v1")


def default_pod(pod: dict[str, Any]) -> None:
    spec = pod.get("spec")
    if isinstance(spec, dict):
        default_pod_spec(spec)
        # ``SetDefaults_Pod``: a container with a limit and no request for a resource gets
        # the limit as request; a Pod only, not a pod template.
        for group in ("initContainers", "containers"):
            for container in items(spec.get(group)):
                resources = mapping(mapping(container).get("resources"))
                limits = resources.get("limits")
                if isinstance(limits, dict) and limits:
                    requests = resources.setdefault("requests", {})
                    if isinstance(requests, dict):
                        for name, value in limits.items():
                            requests.setdefault(name, value)


def default_cronjob(cronjob: dict[str, Any]) -> None:
    """``SetObjectDefaults_CronJob``: the CronJob's own fields and the pod template inside
    its jobTemplate. The JobSpec in between is *not* defaulted (``SetDefaults_Job`` takes a
    Job): ``backoffLimit`` and friends are filled in when each Job is created, so a
    CronJob reaches admission with them unset."""
    spec = cronjob.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("concurrencyPolicy", "Allow")
    spec.setdefault("suspend", False)
    spec.setdefault("successfulJobsHistoryLimit", 3)
    spec.setdefault("failedJobsHistoryLimit", 1)
    template = mapping(mapping(spec.get("jobTemplate")).get("spec")).get("template")
    if isinstance(template, dict):
        default_pod_template(template)
