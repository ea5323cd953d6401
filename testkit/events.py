"""Jobs our rules failed, as the Job controller writes them (``FailureTarget`` then
``Failed``, the FailJob message), for the controller's ``RetryPolicyFailedJob`` Events, and
the Events the HTTP test API stored.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

from testkit.builders import P, stored
from testkit.fakeapi import FakeAPI
from testkit.workloads import admitted_job
from webhook.cluster.attempts import JOB_UID_LABEL
from webhook.kube.jobcontroller import pod_from_template

NS = "ml"
JOBSET = "jobset.x-k8s.io/v1alpha2"
TRAINER = "trainer.kubeflow.org/v1alpha1"


def owner(api_version: str, kind: str, name: str, uid: str) -> dict:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def a_jobset(name: str, uid: str, trainjob: tuple[str, str] | None = None, **annotations) -> dict:
    """A JobSet as stored; a TrainJob's as the trainer builds it: named after the
    TrainJob, which is its controller owner."""
    meta: dict = {"name": name, "namespace": NS, "uid": uid, "annotations": dict(annotations)}
    if trainjob is not None:
        meta["ownerReferences"] = [owner(TRAINER, "TrainJob", *trainjob)]
    return {"apiVersion": JOBSET, "kind": "JobSet", "metadata": meta, "spec": {}}


def stored_events(fake: FakeAPI, namespace: str = NS) -> list[dict]:
    with fake.lock:
        return [copy.deepcopy(v) for (ns, _), v in fake.named["events"].items() if ns == namespace]


def now_stamp(ago: float = 0.0) -> str:
    when = datetime.now(timezone.utc) - timedelta(seconds=ago)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def failed_by_policy(job_: dict, message: str, ago: float = 5.0) -> dict:
    """``job_`` failed as the Job controller writes it: the interim ``FailureTarget``
    condition, then ``Failed`` with the same reason and message."""
    # upstream: syncJob (pkg/controller/job/job_controller.go): getFailJobMessage ->
    # FailureTarget (reason PodFailurePolicy), then newFailedConditionForFailureTarget.
    out = copy.deepcopy(job_)
    conditions = [
        {
            "type": kind,
            "status": "True",
            "reason": "PodFailurePolicy",
            "message": message,
            "lastProbeTime": now_stamp(ago),
            "lastTransitionTime": now_stamp(ago),
        }
        for kind in ("FailureTarget", "Failed")
    ]
    out["status"] = {"failed": 1, "conditions": conditions, "startTime": now_stamp(60)}
    return out


FAIL_NON_RETRIABLE = {P + "fail-non-retriable": "true", P + "retriable-exit-codes": "143"}


def message_for(job_: dict, container: str = "main", code: int = 42, index: int = 1) -> str:
    # upstream: matchPodFailurePolicy (pkg/controller/job/pod_failure_policy.go).
    pod_name = job_["metadata"]["name"] + "-x7k2p"
    return (
        f"Container {container} for pod {NS}/{pod_name} failed with exit code {code} "
        f"matching FailJob rule at index {index}"
    )


def put_trainjob_child(api: FakeAPI) -> None:
    """A TrainJob's JobSet, and its child Job failed by the rule the JobSet's admission
    wrote (JobSet copies its template's annotations to its Jobs: the record stays on the
    JobSet)."""
    record = json.dumps({"failNonRetriable": [143], "countDisruptions": True})
    api.store(
        "jobsets",
        a_jobset("llama", "set-1", trainjob=("llama", "tj-uid"), **{P + "applied": record}),
    )
    child = admitted_job(FAIL_NON_RETRIABLE, name="llama-node-0")
    del child["metadata"]["annotations"]
    child["metadata"]["ownerReferences"] = [owner(JOBSET, "JobSet", "llama", "set-1")]
    api.put("jobs", failed_by_policy(child, message_for(child, container="main", code=1)))


def put_cronjob_child(api: FakeAPI) -> None:
    """A CronJob (its record of what the webhook applied) and its Job failed by our rule."""
    record = json.dumps({"failNonRetriable": [137, 143]})
    api.store(
        "cronjobs",
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {
                "name": "nightly",
                "namespace": NS,
                "annotations": {P + "applied": record},
            },
        },
    )
    made = admitted_job({**FAIL_NON_RETRIABLE, P + "retriable-exit-codes": "137,143"}, "nightly-1")
    del made["metadata"]["annotations"]
    made["metadata"]["ownerReferences"] = [owner("batch/v1", "CronJob", "nightly", "cj-uid")]
    api.put("jobs", failed_by_policy(made, message_for(made, code=2)))


def put_failed_indexes(api: FakeAPI) -> None:
    """An Indexed Job (``on-non-retriable: fail-index``) that failed with reason
    FailedIndexes, whose message names no pod, and its failed pods: index 2 by our
    FailIndex rule (exit 42), index 0 retriably (143, retried)."""
    # upstream: syncJob (pkg/controller/job/job_controller.go): "Job has failed indexes".
    annotations = {**FAIL_NON_RETRIABLE, P + "on-non-retriable": "fail-index"}
    indexed = admitted_job(
        annotations,
        name="indexed",
        completionMode="Indexed",
        completions=3,
        backoffLimitPerIndex=1,
    )
    uid = indexed["metadata"]["uid"]
    ended = failed_by_policy(indexed, "Job has failed indexes")
    for condition in ended["status"]["conditions"]:
        condition["reason"] = "FailedIndexes"
    for index, code in ((2, 42), (0, 143)):
        failed_pod = stored(pod_from_template(indexed, index))
        failed_pod["metadata"]["labels"][JOB_UID_LABEL] = uid
        failed_pod["status"] = {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}
            ],
        }
        api.put("pods", failed_pod)
    api.put("jobs", ended)


def put_failed_jobs(api: FakeAPI) -> int:
    """Every kind of Job our rules fail, in one API; how many Warnings they make."""
    train = admitted_job({**FAIL_NON_RETRIABLE, P + "backoff-limit": "3"})
    api.put("jobs", failed_by_policy(train, message_for(train, index=1)))
    put_trainjob_child(api)
    put_cronjob_child(api)
    put_failed_indexes(api)
    return 4
