"""Audited workloads as admission under ``rollout: audit`` leaves them (``webhook.plan.audit``),
for the tests of the audit's replay, Event and metrics (``tests/test_audits.py``) and the
operations pack's scrape (``tests/test_chart_ops.py``): the workload's real spec without
the audited settings, the record of what they would have been, and the label."""

from __future__ import annotations

from testkit.builders import job, stored
from testkit.jobsim import JobRun
from testkit.waste import MAIN
from webhook.kube import failurepolicy as fp
from webhook.plan.audit import AUDIT, AUDITED, MANAGED, AuditedPart, AuditRecord

ENDED = "retry_webhook_audited_workloads_total"
SAVED = "retry_webhook_audit_saved_resource_seconds_total"
#: What a namespace's defaults would have applied: exit codes other than 1 and 143 fail
#: the Job at once (``fail-non-retriable``), as the rule the webhook writes says it.
SETTINGS = {"fail-non-retriable": "true", "retriable-exit-codes": "1,143"}
RULES = (fp.non_retriable_rule([1, 143], "FailJob", "main"),)


def audit_of(part: str = "spec", backoff_limit: int = 2) -> str:
    record = AuditRecord(
        SETTINGS,
        {k: "namespace" for k in SETTINGS},
        (AuditedPart(part, backoff_limit=backoff_limit, rules=RULES),),
    )
    return record.to_annotation()


def audited_job(name: str = "train", backoff_limit: int = 2, part: str = "spec") -> dict:
    """A Job as admission under ``rollout: audit`` leaves it: its own spec (backoffLimit
    from the manifest, no rules), the record of what the namespace's defaults would have
    written, and the label."""
    manifest = job(name=name, containers=[MAIN])
    manifest["spec"]["backoffLimit"] = backoff_limit
    manifest["metadata"].setdefault("annotations", {})[AUDIT] = audit_of(part, backoff_limit)
    manifest["metadata"].setdefault("labels", {})[MANAGED] = AUDITED
    return stored(manifest, uid=f"uid-{name}")


def fail_until_ended(run: JobRun, code: int) -> dict:
    """Pods fail with ``code`` until the Job controller ends the Job; then its end."""
    while not run.ended:
        run.fail(run.new_pod(), code=code)
        run.sync()
    return run.conclude()
