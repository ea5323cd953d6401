"""Audited workloads as admission under ``rollout: audit`` leaves them (``webhook.plan.audit``),
for the tests of the audit's replay, Event and metrics (``tests/test_audits.py``) and the
operations pack's scrape (``tests/test_chart_ops.py``), made by the real admission
engine under ``rollout: audit``."""

from __future__ import annotations

import copy
import json

from testkit.builders import job, stored
from testkit.jobsim import JobRun
from testkit.kinds import cronjob
from testkit.waste import MAIN
from testkit.workloads import mutate
from webhook.plan.audit import AUDIT, AUDITED, AuditRecord, managed
from webhook.policy.config import parse_config

ENDED = "retry_webhook_audited_workloads_total"
SAVED = "retry_webhook_audit_saved_resource_seconds_total"
#: What a namespace's defaults would apply: exit codes other than 1 and 143 fail the Job
#: at once (``fail-non-retriable``). Namespace ``ml`` (the builders') is in audit.
SETTINGS = {"fail-non-retriable": "true", "retriable-exit-codes": "1,143"}
CONFIG = parse_config(
    json.dumps({"namespaces": {"ml": {"rollout": AUDITED, "defaults": SETTINGS}}}),
    "<audit in namespace ml>",
)


def under_audit(manifest: dict) -> dict:
    """``manifest`` as admission leaves it under ``CONFIG`` (the real engine: its real spec
    without the audited settings, the record of what they would have been, the label)."""
    verdict, out = mutate(manifest, CONFIG)
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


def audited_job(name: str = "train", backoff_limit: int = 2) -> dict:
    """A Job admitted under audit and stored: its own backoffLimit (from the manifest), no
    rules, and what the namespace's defaults would have written."""
    manifest = job(name=name, containers=[MAIN])
    manifest["spec"]["backoffLimit"] = backoff_limit
    return stored(under_audit(manifest), uid=f"uid-{name}")


def fail_until_ended(run: JobRun, code: int) -> dict:
    """Pods fail with ``code`` until the Job controller ends the Job; then its end."""
    while not run.ended:
        run.fail(run.new_pod(), code=code)
        run.sync()
    return run.conclude()
