"""Audited workloads as admission under ``rollout: audit`` leaves them (``webhook.plan.audit``),
for the tests of the audit's replay, Event and metrics (``tests/controller/test_audits.py``) and the
operations pack's scrape (``tests/chart/test_ops.py``), made by the real admission
engine under ``rollout: audit``."""

from __future__ import annotations

import copy
import datetime as dt
import json

from testkit.builders import job, stored
from testkit.fakeapi import FakeAPI
from testkit.jobsim import T0, JobRun
from testkit.kinds import cronjob, jobset, replicated
from testkit.waste import MAIN
from testkit.workloads import mutate
from webhook.kube.wellknown import (
    JOBSET_API_VERSION,
    JOBSET_JOB_INDEX,
    JOBSET_NAME,
    JOBSET_UID,
    REPLICATED_JOB,
    RESTART_ATTEMPT,
)
from webhook.plan.audit import AUDIT, AUDITED, AuditRecord, managed
from webhook.policy.config import Config, parse_config

ENDED = "retry_webhook_audited_workloads_total"
SAVED = "retry_webhook_audit_saved_resource_seconds_total"
#: What a namespace's defaults would apply: exit codes other than 1 and 143 fail the Job
#: at once (``fail-non-retriable``). Namespace ``ml`` (the builders') is in audit.
SETTINGS = {"fail-non-retriable": "true", "retriable-exit-codes": "1,143"}
CONFIG = parse_config(
    json.dumps({"namespaces": {"ml": {"rollout": AUDITED, "defaults": SETTINGS}}}),
    "<audit in namespace ml>",
)


def audit_config(defaults: dict[str, str]) -> Config:
    """Namespace ``ml`` in audit with ``defaults``, on Kubernetes 1.36 (restart rules on:
    ``in-place-exit-codes`` is written only where they are)."""
    doc = {
        "kubernetesVersion": "1.36",
        "namespaces": {"ml": {"rollout": AUDITED, "defaults": defaults}},
    }
    return parse_config(json.dumps(doc), "<audit in namespace ml>")


def under_audit(manifest: dict, config: Config = CONFIG) -> dict:
    """``manifest`` as admission leaves it under ``config`` (the real engine: its real spec
    without the audited settings, the record of what they would have been, the label)."""
    verdict, out = mutate(manifest, config)
    assert verdict.allowed, verdict.message
    assert AuditRecord.of(out) is not None and managed(out) == AUDITED, out["metadata"]
    return out


def audit_of(part: str = "spec") -> str:
    """The audit record admission writes on a Job (``spec``) or a CronJob's job template
    (``spec.jobTemplate.spec``), as text."""
    if part == "spec":
        return under_audit(job(containers=[MAIN]))["metadata"]["annotations"][AUDIT]
    cron = cronjob()  # (as the API server defaults a CronJob: its template is not a Job's)
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"] = [copy.deepcopy(MAIN)]
    text = under_audit(cron)["metadata"]["annotations"][AUDIT]
    assert AuditRecord.of(under_audit(cron)).part(part) is not None, text
    return text


def audited_job(
    name: str = "train", backoff_limit: int = 2, parallelism: int = 1, config: Config = CONFIG
) -> dict:
    """A Job admitted under audit (``config``) and stored: its own backoffLimit and
    ``parallelism`` (pods at once, and as many completions; from the manifest), an hour's
    deadline, no rules, and what the namespace's defaults would have written."""
    manifest = job(name=name, containers=[MAIN])
    manifest["spec"].update(backoffLimit=backoff_limit, activeDeadlineSeconds=3600)
    if parallelism != 1:
        manifest["spec"].update(parallelism=parallelism, completions=parallelism)
    return stored(under_audit(manifest, config), uid=f"uid-{name}")


def stamp(minutes: float) -> str:
    """A time ``minutes`` after jobsim's ``T0``, as the API writes it."""
    return clock(minutes, minutes)[0]


def fail_until_ended(run: JobRun, code: int) -> dict:
    """Pods fail with ``code`` one after another, each a minute (attempt n from minute 2n:
    a replacement is made after its pod failed), until the Job controller ends the Job;
    then its end."""
    attempt = 0
    while not run.ended:
        run.clock = clock(2 * attempt, 2 * attempt + 1)
        run.fail(run.new_pod(), code=code)
        run.sync()
        attempt += 1
    return run.conclude()


def clock(start: float, stop: float) -> tuple[str, str]:
    """A pod's start and stop (``JobRun.clock``), in minutes after jobsim's ``T0``."""
    t0 = dt.datetime.strptime(T0, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    return tuple(  # type: ignore[return-value]
        (t0 + dt.timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M:%SZ") for m in (start, stop)
    )


#: A JobSet's own failurePolicy in these tests: it may restart 3 times (without one it
#: fails at its first child Job's failure: ``executeFailurePolicy``).
RESTARTS = {"maxRestarts": 3}


def audited_jobset(
    backoff_limit: int = 2, failure_policy: dict | None = RESTARTS, config: Config = CONFIG
) -> dict:
    """A JobSet admitted under audit and stored: replicated Jobs ``leader`` and ``workers``
    (one child Job each, one pod at a time, MAIN's requests), their own backoffLimit and no
    rules, its ``failure_policy``; and what the namespace's defaults would have written into
    each (``spec.replicatedJobs[<name>].template.spec``) and into its failurePolicy (their
    ``fail-non-retriable`` adds a FailJobSet rule on reason PodFailurePolicy)."""
    jobs = []
    for name in ("leader", "workers"):
        rjob = replicated(name, restart_policy="Never", backoffLimit=backoff_limit)
        rjob["replicas"] = 1
        spec = rjob["template"]["spec"]
        spec["parallelism"] = spec["completions"] = 1
        spec["template"]["spec"]["containers"] = [copy.deepcopy(MAIN)]
        jobs.append(rjob)
    policy = copy.deepcopy(failure_policy)
    made = jobset(jobs=jobs, failure_policy=policy)
    out = stored(under_audit(made, config), uid="uid-pretrain")
    out["status"] = {"restarts": 0}
    return out


def child_jobs(api: FakeAPI, stored_jobset: dict, run: int) -> dict[str, JobRun]:
    """The child Jobs of run ``run``, by replicated Job (its first replica's), as the
    JobSet controller makes them (``child_job``), stored."""
    out = {}
    for rjob in stored_jobset["spec"]["replicatedJobs"]:
        child = child_job(stored_jobset, rjob, 0, run)
        out[rjob["name"]] = JobRun.store(
            api, child, uid=f"uid-{child['metadata']['name']}-run{run}"
        )
    return out


def child_job(stored_jobset: dict, rjob: dict, index: int, run: int) -> dict:
    """Replica ``index`` of replicated Job ``rjob`` in run ``run``, as the JobSet controller
    makes it (``constructJob`` and ``labelAndAnnotateObject`` in jobset
    pkg/controllers/jobset_controller.go: the template's spec, the JobSet's labels and
    annotations on the Job and its pod template, the run as ``restart-attempt``; named
    ``<jobset>-<replicatedJob>-<index>`` by ``GenJobName``, pkg/util/placement)."""
    meta = stored_jobset["metadata"]
    labels = {
        JOBSET_NAME: meta["name"],
        JOBSET_UID: meta["uid"],
        REPLICATED_JOB: rjob["name"],
        JOBSET_JOB_INDEX: str(index),
        RESTART_ATTEMPT: str(run),
    }
    child = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{meta['name']}-{rjob['name']}-{index}",
            "namespace": meta["namespace"],
            "labels": dict(labels),
            "annotations": dict(labels),
            "ownerReferences": [
                {
                    "apiVersion": JOBSET_API_VERSION,
                    "kind": "JobSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": copy.deepcopy(rjob["template"]["spec"]),
    }
    template = child["spec"]["template"].setdefault("metadata", {})
    template.setdefault("labels", {}).update(labels)
    template.setdefault("annotations", {}).update(labels)
    return child


def jobset_status(api: FakeAPI, uid: str, change) -> dict:
    """One status write of the JobSet controller (``updateJobSetStatus``)."""
    return api.modify("jobsets", uid, lambda js: change(js.setdefault("status", {})))


def restart(api: FakeAPI, uid: str, children: dict[str, JobRun]) -> int:
    """``RestartJobSet``: ``status.restarts`` + 1 (``failurePolicyRecreateAll``), then the
    previous run's child Jobs deleted (``getChildJobs``: ``previous``). The new run."""

    def change(status: dict) -> None:
        status["restarts"] = status.get("restarts", 0) + 1

    restarts = jobset_status(api, uid, change)["status"]["restarts"]
    for child in children.values():
        api.delete("jobs", child.uid)
    return restarts


def end_jobset(api: FakeAPI, uid: str, kind: str, reason: str) -> dict:
    """The JobSet's end (``setJobSetFailedCondition``, or the success policy's
    ``Completed``), with its ``terminalState``."""

    def change(status: dict) -> None:
        condition = {"type": kind, "status": "True", "reason": reason, "message": reason}
        status.setdefault("conditions", []).append(condition)
        status["terminalState"] = kind

    return jobset_status(api, uid, change)
