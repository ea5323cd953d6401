"""batch/v1 CronJob: the policy goes into ``spec.jobTemplate``, so every Job it creates
carries it.

A CronJob is a template, so it is checked when it is created and again whenever its
jobTemplate or its retry-policy annotations change (``reevaluate_on_update``): a user
learns about a bad policy when writing it, not at 3 a.m. when the first Job fails. The
Jobs it creates are still admitted on their own, and the Job mutator leaves them alone
(``job.made_from_template``): their spec already carries the policy that was validated
here. Annotations on ``spec.jobTemplate.metadata`` (which the Jobs inherit) count as the
CronJob's own; the two places may not disagree.

When the policy changes, what the previous admission wrote into the template (recorded
in ``retry-policy.dev/applied``) is taken out before the new policy is applied, so an
old ``backoffLimit`` or an old exit-code rule is not mistaken for something the user wrote
and the new policy does not contradict the old one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from webhook.kinds import audit
from webhook.kinds.base import JobSpecs
from webhook.kinds.jobspec import POD_KEYS, apply_job_spec
from webhook.kinds.workload import (
    WorkloadMutator,
    check_error_propagation,
    get_path,
    note_peers,
    run_together,
)
from webhook.kube import failurepolicy as fp
from webhook.kube import intent
from webhook.kube.objects import items, mapping
from webhook.kube.restartrules import RESTART
from webhook.kube.wellknown import LAST_APPLIED
from webhook.plan import inplace
from webhook.plan.audit import AuditRecord
from webhook.plan.model import job_limit_field
from webhook.plan.outcome import Context, Outcome
from webhook.plan.policies import default_layers, has_policy_annotations
from webhook.plan.record import AppliedRecord
from webhook.policy.model import (
    PREFIX,
    Layer,
    Policy,
    Scope,
    Source,
    format_value,
    parse_annotations,
    resolve,
)
from webhook.problems import Problem

JOB_TEMPLATE = ("spec", "jobTemplate")
JOB_SPEC = (*JOB_TEMPLATE, "spec")


class CronJobMutator(WorkloadMutator):
    group = "batch"
    kind = "CronJob"
    #: Jobs are created from the template long after the CronJob: re-check it on update.
    reevaluate_on_update = (JOB_TEMPLATE,)

    def applies(self, cronjob: Mapping[str, Any], ctx: Context) -> bool:
        return super().applies(cronjob, ctx) or has_policy_annotations(
            get_path(cronjob, (*JOB_TEMPLATE, "metadata"))
        )

    def job_specs(self, cronjob: Mapping[str, Any]) -> JobSpecs:
        return [("spec.jobTemplate.spec", JOB_SPEC)]

    def label(
        self, cronjob: dict[str, Any], record: AuditRecord | None, applied: bool, out: Outcome
    ) -> None:
        """On the CronJob, and on its jobTemplate's metadata, which the CronJob controller
        copies onto every Job it makes (``getJobFromTemplate2`` in
        pkg/controller/cronjob/utils.go): each Job is then found by the label too, and
        carries the record of its own spec (``spec``: the Job's admission leaves a
        CronJob's Job alone, ``kinds.job.mutate.made_from_template``)."""
        super().label(cronjob, record, applied, out)
        template = get_path(cronjob, JOB_TEMPLATE)
        if not isinstance(template, dict):
            return
        meta = template.get("metadata")
        if meta is None and (applied or record is not None):
            meta = template["metadata"] = {}
        if record is not None:
            part = record.part("spec.jobTemplate.spec")
            parts = (dataclasses.replace(part, path="spec"),) if part is not None else ()
            record = dataclasses.replace(record, parts=parts)
        audit.write(meta, record, applied, out, "spec.jobTemplate: ")

    def policy(self, cronjob: Mapping[str, Any], ctx: Context, out: Outcome) -> Policy:
        values = _annotations(cronjob, out)
        layers = default_layers(cronjob.get("metadata"), ctx)
        return resolve([Layer(Source.ANNOTATION, values), *layers])

    def apply(self, cronjob: dict[str, Any], policy: Policy, ctx: Context, out: Outcome) -> Policy:
        job_spec = get_path(cronjob, JOB_SPEC)
        if not isinstance(job_spec, dict):
            out.problems.append(Problem("spec.jobTemplate.spec", "a CronJob needs a Job template"))
            return policy
        before = copy.deepcopy(job_spec)
        _forget_previous(cronjob, job_spec)
        policy = check_error_propagation(policy, self.kind, out)
        policy = apply_job_spec(cronjob, JOB_SPEC, job_spec, policy, ctx, out, defaulted=False)
        note_peers(policy, run_together(job_spec), out)
        if job_spec == before:
            # What was taken out came back as it was: nothing changed, nothing to report
            # (and nothing for validation to find missing).
            out.changes.clear()
        return policy


def _annotations(cronjob: Mapping[str, Any], out: Outcome) -> dict[str, Any]:
    """The CronJob's policy annotations and its jobTemplate's, which must agree."""
    metadata = mapping(cronjob.get("metadata"))
    own, problems = parse_annotations(metadata.get("annotations"), Scope.WORKLOAD)
    out.problems.extend(problems)
    inherited, problems = parse_annotations(
        get_path(cronjob, (*JOB_TEMPLATE, "metadata", "annotations")),
        Scope.WORKLOAD,
        where="spec.jobTemplate.metadata annotation",
    )
    out.problems.extend(problems)
    # (The jobTemplate's record is of a Job's spec, the CronJob's of its jobTemplate.)
    for name in sorted(own.keys() & inherited.keys() - {"applied", "audit"}):
        mine, theirs = format_value(name, own[name]), format_value(name, inherited[name])
        if mine != theirs:
            out.problems.append(
                Problem(
                    f"spec.jobTemplate.metadata annotation {PREFIX}{name}",
                    f"{theirs!r} contradicts the CronJob's annotation {mine!r}; "
                    "remove one of them or make them equal",
                    "contradiction",
                )
            )
    return {**inherited, **own}


def _forget_previous(cronjob: Mapping[str, Any], job_spec: dict[str, Any]) -> None:
    """Take out of the jobTemplate what the previous admission wrote (its ``applied``
    record says what), unless the user's own manifest has it too."""
    applied = AppliedRecord.of(cronjob)
    if applied is None:
        return
    record = dict(applied.settings)
    field = job_limit_field(JOB_SPEC, job_spec, defaulted=False)
    if (
        field.path[-1] == "backoffLimit"  # a per-index budget is always the user's own
        and "backoffLimit" in record
        and job_spec.get("backoffLimit") == record["backoffLimit"]
        and not intent.user_wrote(cronjob, field.path)
    ):
        del job_spec["backoffLimit"]
    _forget_rules(cronjob, job_spec, record)
    _forget_restart_rules(cronjob, job_spec, record)
    pod_annotations = get_path(job_spec, ("template", "metadata", "annotations"))
    if isinstance(pod_annotations, dict):
        for key in [PREFIX + name for name in POD_KEYS]:
            path = (*JOB_SPEC, "template", "metadata", "annotations", key)
            if key in pod_annotations and not intent.user_wrote(cronjob, path):
                del pod_annotations[key]


def _forget_rules(cronjob: Mapping[str, Any], job_spec: dict[str, Any], record: dict) -> None:
    rules = get_path(job_spec, ("podFailurePolicy", "rules"))
    if not isinstance(rules, list):
        return
    codes = _codes(record.get("failNonRetriable"))
    # A regular container's exit-code rule retries the in-place codes too, an init
    # container's not (``inplace.retriable``); earlier versions gave both the first.
    both = sorted(set(codes or ()) | set(_codes(record.get("inPlaceExitCodes")) or ()))
    action = "FailIndex" if record.get("onNonRetriable") == "fail-index" else "FailJob"
    ignore = fp.rule_key(fp.ignore_disruptions_rule())
    count = fp.rule_key(fp.count_disruptions_rule())
    written = get_path(_manifest(cronjob), (*JOB_SPEC, "podFailurePolicy", "rules")) or []
    yours = {fp.rule_key(r) for r in written} if isinstance(written, list) else set()

    def ours(rule: Any) -> bool:
        """One of the previous policy's rules: its Ignore rule, its Count rule on
        DisruptionTarget, or an exit-code rule for its codes (one per container, whatever
        their names were then)."""
        if fp.rule_key(rule) in yours:
            return False
        if record.get("ignoreDisruptions") and fp.rule_key(rule) == ignore:
            return True
        if record.get("countDisruptions") and fp.rule_key(rule) == count:
            return True
        return (
            codes is not None
            and (fp.is_non_retriable_rule(rule, codes) or fp.is_non_retriable_rule(rule, both))
            and rule.get("action") == action
        )

    kept = [rule for rule in rules if not ours(rule)]
    if len(kept) == len(rules):
        return
    if kept:
        job_spec["podFailurePolicy"]["rules"] = kept
    else:
        del job_spec["podFailurePolicy"]


def _codes(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(isinstance(c, int) for c in value):
        return value
    return None


def _forget_restart_rules(
    cronjob: Mapping[str, Any], job_spec: dict[str, Any], record: dict
) -> None:
    """The previous policy's container restart rule (``plan.inplace``), and the
    container ``restartPolicy: Never`` it came with, where the manifest has neither."""
    codes = _codes(record.get("inPlaceExitCodes"))
    if codes is None:
        return
    action = inplace.ACTIONS.get(str(record.get("inPlaceScope")), RESTART)
    previous = {"action": action, "exitCodes": {"operator": "In", "values": codes}}
    template = (*JOB_SPEC, "template", "spec", "containers")
    written = {
        c.get("name"): c
        for c in items(get_path(_manifest(cronjob), template))
        if isinstance(c, dict)
    }
    for container in items(get_path(job_spec, ("template", "spec", "containers"))):
        if not isinstance(container, dict):
            continue
        rules = items(container.get("restartPolicyRules"))
        own = mapping(written.get(container.get("name")))
        if previous not in rules or previous in items(own.get("restartPolicyRules")):
            continue
        kept = [rule for rule in rules if rule != previous]
        if kept:
            container["restartPolicyRules"] = kept
            continue
        del container["restartPolicyRules"]
        if "restartPolicy" not in own:
            container.pop("restartPolicy", None)


def _manifest(cronjob: Mapping[str, Any]) -> Any:
    """The manifest ``kubectl apply`` recorded, if any."""
    annotations = mapping(mapping(cronjob.get("metadata")).get("annotations"))
    try:
        return json.loads(annotations.get(LAST_APPLIED) or "{}")
    except ValueError:
        return {}
