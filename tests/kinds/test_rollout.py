"""``rollout: audit``: the defaults held back and recorded (``retry-policy.dev/audit``),
what the workload's own annotations ask enforced, the ``retry-policy.dev/managed`` label,
and the config that says so (``webhook.kinds.audit``, ``webhook.policy.config``)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from testkit import trainer
from testkit.builders import P, apply, decode_patch, job, review
from testkit.cli import run
from testkit.explain import assert_text_and_json_agree, doc_block, manifest, one, setting
from testkit.kinds import cronjob, job_from, jobset, pytorchjob, rayjob
from testkit.servers import start, stop
from testkit.trainer import carried
from testkit.workloads import (
    assert_idempotent,
    kubectl_patch,
    mutate,
    validate,
    validate_schema,
)
from webhook import explain
from webhook.admission import engine
from webhook.kinds.trainjob.mutate import jobset_for
from webhook.kinds.trainjob.runtimes import GivenRuntimes
from webhook.kube.failurepolicy import count_disruptions_rule, non_retriable_rule
from webhook.plan.audit import AUDIT, AuditRecord, managed
from webhook.policy.config import ConfigError, parse_config

AUDITED_NS = """
defaults:
  fail-non-retriable: true
  backoff-limit: 2
namespaces:
  ml:
    rollout: audit
"""


def test_rollout_is_enforce_unless_said_and_a_namespace_overrides_it():
    config = parse_config(AUDITED_NS)
    assert config.rollout == "enforce"
    assert config.rollout_of("ml") == "audit" and config.rollout_of("web") == "enforce"
    everywhere = parse_config("rollout: audit\nnamespaces: {prod: {rollout: enforce}}\n")
    assert everywhere.rollout_of("dev") == "audit" and everywhere.rollout_of("prod") == "enforce"


def test_a_bad_rollout_names_the_key_the_value_and_what_is_accepted():
    with pytest.raises(ConfigError) as caught:
        parse_config("rollout: dry-run\nnamespaces: {ml: {rollout: Audit}}\n")
    said = [str(p) for p in caught.value.problems]
    assert any(
        "rollout" in p and "'dry-run' is not valid; accepted: enforce or audit" in p for p in said
    )
    assert any("namespaces.ml.rollout" in p and "'Audit' is not valid" in p for p in said)


def test_check_config_shows_the_effective_rollout_of_each_namespace(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "rollout: audit\nnamespaces:\n  prod: {rollout: enforce}\n"
        "  ml: {defaults: {backoff-limit: 1}}\n"
    )
    code, out, _ = run(["check-config", str(path)])
    assert code == 0
    assert "rollout in namespace prod: enforce\n" in out
    assert "rollout in namespace ml: audit\n" in out
    assert "rollout in every other namespace: audit\n" in out


def test_a_job_in_an_audited_namespace_gets_no_default_and_their_record():
    config = parse_config(AUDITED_NS)
    obj = job()
    verdict, out = mutate(obj, config)
    assert verdict.allowed, verdict.message
    # Nothing the defaults say is in the spec: no rules, the API's backoffLimit.
    assert out["spec"] == obj["spec"]
    assert managed(out) == "audit"
    assert P + "applied" not in out["metadata"]["annotations"]
    record = AuditRecord.of(out)
    assert record.settings == {"backoff-limit": "2", "fail-non-retriable": "true"}
    assert record.by == {"backoff-limit": "cluster", "fail-non-retriable": "cluster"}
    part = record.part("spec")
    # What enforcing would have written, read from the same mutator's run.
    _, enforced = mutate(obj, parse_config(AUDITED_NS.replace("rollout: audit", "{}")))
    assert part.backoff_limit == enforced["spec"]["backoffLimit"] == 2
    assert part.backoff_limit_per_index is None
    assert list(part.rules) == enforced["spec"]["podFailurePolicy"]["rules"]
    assert part.rules[0] == count_disruptions_rule()
    assert part.rules[1] == non_retriable_rule([143], "FailJob", "main")
    said = "\n".join(verdict.warnings)
    assert "audited, not applied (rollout: audit in namespace ml)" in said
    assert "fail-non-retriable true (cluster default)" in said
    assert validate(out, config).allowed
    assert_idempotent(obj, config)


def test_enforced_elsewhere_and_labelled_enforce():
    config = parse_config(AUDITED_NS)
    verdict, out = mutate(job(namespace="web"), config)
    assert verdict.allowed
    assert out["spec"]["backoffLimit"] == 2 and out["spec"]["podFailurePolicy"]["rules"]
    assert managed(out) == "enforce"
    assert AUDIT not in out["metadata"]["annotations"]


def test_what_its_own_annotations_ask_is_enforced_beside_the_audited_defaults():
    config = parse_config(AUDITED_NS)
    obj = job({P + "backoff-limit": "4"})
    verdict, out = mutate(obj, config)
    assert verdict.allowed, verdict.message
    assert out["spec"]["backoffLimit"] == 4  # the annotation's
    assert "podFailurePolicy" not in out["spec"]  # the default's rules: audited
    assert managed(out) == "enforce"
    record = AuditRecord.of(out)
    assert record.settings == {"fail-non-retriable": "true"}  # backoff-limit: annotated
    # The record's Job is the whole Job as enforced: the annotated budget, the rules added.
    assert record.part("spec").backoff_limit == 4
    assert [r["action"] for r in record.part("spec").rules] == ["Count", "FailJob"]
    assert validate(out, config).allowed
    assert_idempotent(obj, config)


def test_guard_rails_still_deny_an_annotated_workload_under_audit():
    """A workload whose annotations ask for a policy keeps today's behaviour: the rails
    deny what it asks above them, and lower an API default it did not write."""
    config = parse_config(AUDITED_NS + "guardRails: {maxBackoffLimit: 5}\n")
    verdict, _ = mutate(job({P + "backoff-limit": "9"}), config)
    assert not verdict.allowed and "guardRails.maxBackoffLimit" in verdict.message
    verdict, out = mutate(job({P + "fail-non-retriable": "true"}), config)
    assert out["spec"]["backoffLimit"] == 5 and managed(out) == "enforce"


RAILS_ONLY = "rollout: audit\nguardRails:\n  maxBackoffLimit: 4\n"


def test_an_unannotated_workload_is_audited_under_the_rails_too():
    """Under audit a workload with no retry-policy.dev/ annotation is nobody's opt-in:
    admitted unchanged, never denied by the admin's config; what the rails would do is
    in its record, and it is labelled audit, so the ROLLOUT.md query finds it."""
    config = parse_config(RAILS_ONLY)
    obj = job()
    verdict, out = mutate(obj, config)
    assert verdict.allowed and out["spec"] == obj["spec"]
    assert managed(out) == "audit"
    record = AuditRecord.of(out)
    assert record.settings == {"backoff-limit": "4"} and record.by == {
        "backoff-limit": "guardRails"
    }
    assert record.part("spec").backoff_limit == 4
    assert validate(out, config).allowed
    assert_idempotent(obj, config)
    # Enforcing would deny its own backoffLimit 10: audited, it is admitted unchanged.
    written = job(spec={"backoffLimit": 10}, applied=True)
    verdict, out = mutate(written, config)
    assert verdict.allowed, verdict.message
    assert out["spec"] == written["spec"] and managed(out) == "audit"
    denied = AuditRecord.of(out).denied
    assert "10 is above this cluster's limit; accepted: 0 to 4" in denied
    assert any(w.startswith("retry-policy: audit: enforcing would deny") for w in verdict.warnings)
    assert validate(out, config).allowed
    # The same config enforced denies it, as before.
    enforced = parse_config("guardRails:\n  maxBackoffLimit: 4\n")
    assert not mutate(written, enforced)[0].allowed


def test_defaults_that_would_change_nothing_leave_no_record_and_no_label():
    config = parse_config("defaults: {backoff-limit: 6}\nrollout: audit\n")
    obj = job(spec={"backoffLimit": 6})
    verdict, out = mutate(obj, config)
    assert verdict.allowed and verdict.patch == []
    assert managed(out) is None and AuditRecord.of(out) is None


def test_the_label_is_the_webhooks_own_and_a_wrong_value_is_replaced_with_a_warning():
    config = parse_config(AUDITED_NS)
    obj = job()
    obj["metadata"]["labels"] = {"app": "train", P + "managed": "yes"}
    verdict, out = mutate(obj, config)
    assert out["metadata"]["labels"] == {"app": "train", P + "managed": "audit"}
    assert "retry-policy: label retry-policy.dev/managed: 'yes' -> 'audit'" in "\n".join(
        verdict.warnings
    )
    # A stale record and label (a manifest exported from another cluster) go when no
    # policy applies here.
    verdict, out = mutate(out, parse_config("{}"))
    assert managed(out) is None and AUDIT not in out["metadata"]["annotations"]
    assert out["metadata"]["labels"] == {"app": "train"}
    assert "label retry-policy.dev/managed=audit removed" in "\n".join(verdict.warnings)


def test_a_cronjob_records_its_template_and_its_jobs_carry_their_own_record():
    config = parse_config(AUDITED_NS)
    obj = cronjob()
    verdict, out = mutate(obj, config)
    assert verdict.allowed, verdict.message
    assert out["spec"]["jobTemplate"]["spec"] == obj["spec"]["jobTemplate"]["spec"]
    record = AuditRecord.of(out)
    assert [p.path for p in record.parts] == ["spec.jobTemplate.spec"]
    assert managed(out) == "audit"
    # The Job the CronJob controller makes: its admission leaves it alone, with the label
    # and a record of its own spec, so the controller can replay its failures.
    # upstream: getJobFromTemplate2 (pkg/controller/cronjob/utils.go) copies the
    # jobTemplate's labels and annotations onto the Job (copyLabels, copyAnnotations).
    made = job_from(out)
    verdict, job_out = mutate(made, config)
    assert verdict.allowed and verdict.patch == []
    assert managed(job_out) == "audit"
    own = AuditRecord.of(job_out)
    assert own.settings == record.settings
    assert own.part("spec") == dataclasses.replace(record.parts[0], path="spec")
    assert validate(out, config).allowed
    assert_idempotent(obj, config)


def test_a_jobset_records_each_replicated_job_by_name():
    config = parse_config(AUDITED_NS)
    obj = jobset()
    verdict, out = mutate(obj, config)
    assert verdict.allowed, verdict.message
    assert out["spec"] == obj["spec"]
    record = AuditRecord.of(out)
    assert [p.path for p in record.parts] == [
        "spec.replicatedJobs[leader].template.spec",
        "spec.replicatedJobs[workers].template.spec",
    ]
    assert all(p.rules for p in record.parts)
    assert managed(out) == "audit"
    assert_idempotent(obj, config)


def test_review_as_the_api_server_admits_it_and_validates_the_result():
    config = parse_config(AUDITED_NS)
    reviewed = engine.review(job(), config)
    assert reviewed.verdict.allowed
    assert managed(reviewed.result) == "audit"
    assert reviewed.outcome.audited == AuditRecord.of(reviewed.result)


def test_a_patch_the_api_server_applies(tmp_path):
    config = parse_config(AUDITED_NS)
    obj = job()
    obj["metadata"]["labels"] = {"app": "train"}
    verdict, out = mutate(obj, config)
    assert kubectl_patch(obj, verdict.patch, tmp_path) == out
    validate_schema(out)


def test_explain_shows_the_audited_settings_in_text_and_json():
    config = parse_config(
        AUDITED_NS.replace("rollout: audit", "rollout: audit\n    defaults: {retry-delay: 30s}")
    )
    item = one(manifest({P + "backoff-limit": "4"}, namespace="ml"), config)
    assert [(s.name, s.value, s.text) for s in item.audited] == [
        ("fail-non-retriable", "true", "cluster default: audited, not applied"),
        ("retry-delay", "30s", "namespace default (ml): audited, not applied"),
    ]
    # What applies is what the workload's own annotations asked.
    assert setting(item, "backoff-limit").value == "4"
    assert setting(item, "fail-non-retriable").value == "false"
    text = explain.render_text([item])
    assert "Audited, not applied (rollout: audit): what the defaults say:" in text
    assert re.search(r"^  retry-delay +30s +namespace default \(ml\): audited", text, re.M)
    (data,) = explain.to_json([item])["items"]
    assert [a["name"] for a in data["audited"]] == ["fail-non-retriable", "retry-delay"]
    assert_text_and_json_agree(item)
    # Enforced elsewhere: nothing audited.
    assert one(manifest(namespace="web"), config).audited == []


def test_the_server_audits_the_namespace_its_config_file_says(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(AUDITED_NS)
    server = start(tmp_path / "certs", "--config", str(config))
    try:
        obj = job()
        body = server.review("/mutate", review(obj))["response"]
        assert body["allowed"]
        out = apply(obj, decode_patch({"response": body}))
        assert managed(out) == "audit" and out["spec"] == obj["spec"]
        assert AuditRecord.of(out).part("spec").backoff_limit == 2
        assert " change made: " in body["warnings"][0]  # the audit record and label
        checked = server.review("/validate", review(out))["response"]
        assert checked["allowed"]
        again = server.review("/mutate", review(out))["response"]
        assert decode_patch({"response": again}) == []
        # Another namespace: enforced.
        other = job(namespace="web")
        body = server.review("/mutate", review(other))["response"]
        assert managed(apply(other, decode_patch({"response": body}))) == "enforce"
    finally:
        stop(server)


def test_an_unannotated_trainjob_is_admitted_as_written_and_its_jobset_audited():
    """A TrainJob nobody annotated: its spec as written (no runtime patch carrying the
    defaults to its JobSet: a GitOps tool would show it as drift), labelled audit, with the
    record its JobSet would get enforced. The JobSet its trainer makes from it, in the same
    audited namespace, records the same at its own admission (spec unchanged), so the
    controller replays its runs as any audited JobSet's."""
    config = parse_config(AUDITED_NS)
    runtimes = GivenRuntimes([trainer.runtime()])
    obj = trainer.trainjob()
    verdict, out = trainer.mutate(obj, runtimes, config)
    assert verdict.allowed, verdict.message
    assert out["spec"] == obj["spec"] and managed(out) == "audit"
    record = AuditRecord.of(out)
    assert record.by == {"backoff-limit": "cluster", "fail-non-retriable": "cluster"}
    assert [p.path for p in record.parts] == ["spec.replicatedJobs[node].template.spec"]
    assert all(p.rules for p in record.parts) and record.failure_policy["maxRestarts"] == 2
    (said,) = verdict.warnings
    assert said.startswith("retry-policy: audited, not applied (rollout: audit in namespace ml)")
    assert trainer.mutate(out, runtimes, config)[0].patch == []
    assert trainer.validate(out, runtimes, config).allowed
    reviewed = engine.review(jobset_for(out, trainer.runtime()), config, "ml")
    assert reviewed.verdict.allowed, reviewed.verdict.message
    made = reviewed.result
    assert made["spec"] == jobset_for(out, trainer.runtime())["spec"]
    assert managed(made) == "audit" and AuditRecord.of(made) == record
    # explain: nothing applies to the TrainJob; what the defaults say is audited.
    item = one(obj, config)
    assert setting(item, "fail-non-retriable").value == "false"
    assert [s.name for s in item.audited] == ["backoff-limit", "fail-non-retriable"]
    assert item.budget.startswith("Audited, nothing is carried to the JobSet")
    # Enforced, the same TrainJob carries the defaults to its JobSet, as before.
    enforced = parse_config(AUDITED_NS.replace("rollout: audit", "{}"))
    verdict, out = trainer.mutate(obj, runtimes, enforced)
    assert verdict.allowed and carried(out)[P + "defaults"]
    assert managed(out) == "enforce" and AUDIT not in out["metadata"].get("annotations", {})


def test_a_trainjobs_own_annotations_keep_its_defaults_audited_on_its_jobset():
    """Annotated, a TrainJob is admitted as before under audit: its annotations and the
    defaults carried to its JobSet (``retry-policy.dev/defaults``), whose admission holds
    the defaults back and records them."""
    config = parse_config(AUDITED_NS)
    runtimes = GivenRuntimes([trainer.runtime()])
    verdict, out = trainer.mutate(trainer.trainjob({P + "backoff-limit": "1"}), runtimes, config)
    assert verdict.allowed, verdict.message
    assert managed(out) == "enforce" and AUDIT not in out["metadata"]["annotations"]
    assert carried(out)[P + "defaults"]
    made = engine.review(jobset_for(out, trainer.runtime()), config, "ml").result
    assert "podFailurePolicy" not in made["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert made["spec"]["failurePolicy"] == {"maxRestarts": 1}
    assert managed(made) == "enforce"
    assert AuditRecord.of(made).settings == {"fail-non-retriable": "true"}


def test_an_unannotated_trainjob_is_never_denied_by_the_rails_under_audit():
    """Enforced, a runtime's maxRestarts above the rail denies the TrainJob; audited, it is
    admitted unchanged, and why enforcing would deny it, in the runtime's words, is its
    record's ``denied``; its JobSet's admission records it too, and admits it."""
    config = parse_config(AUDITED_NS + "guardRails: {maxBackoffLimit: 3}\n")
    rt = trainer.runtime(failure_policy={"maxRestarts": 10})
    obj = trainer.trainjob()
    verdict, out = trainer.mutate(obj, GivenRuntimes([rt]), config)
    assert verdict.allowed, verdict.message
    assert out["spec"] == obj["spec"] and managed(out) == "audit"
    denied = AuditRecord.of(out).denied
    assert denied.startswith("ClusterTrainingRuntime torch-distributed: spec.template.spec.")
    assert "10 is above this cluster's limit; accepted: 0 to 3" in denied
    assert any(w.startswith("retry-policy: audit: enforcing would deny") for w in verdict.warnings)
    assert trainer.validate(out, GivenRuntimes([rt]), config).allowed
    reviewed = engine.review(jobset_for(out, rt), config, "ml")
    assert reviewed.verdict.allowed, reviewed.verdict.message
    assert "10 is above this cluster's limit" in AuditRecord.of(reviewed.result).denied
    # A TrainJob-level denial (no room for the webhook's runtime patch) is spared too.
    full = trainer.trainjob(patches=[{"manager": f"example.com/m{i}"} for i in range(16)])
    verdict, out = trainer.mutate(full, GivenRuntimes([rt]), config)
    assert verdict.allowed and out["spec"] == full["spec"]
    assert "the most Kubeflow Trainer allows" in AuditRecord.of(out).denied


def test_an_unannotated_trainjob_without_its_runtime_records_the_settings():
    """Without the runtime, what its JobSet would get is not known at the TrainJob's
    admission: the TrainJob records the settings (as a RayJob does), its JobSet the rest."""
    config = parse_config(AUDITED_NS)
    obj = trainer.trainjob()
    verdict, out = trainer.mutate(obj, None, config)
    assert verdict.allowed and out["spec"] == obj["spec"]
    assert AuditRecord.of(out) == AuditRecord(
        {"backoff-limit": "2", "fail-non-retriable": "true"},
        {"backoff-limit": "cluster", "fail-non-retriable": "cluster"},
    )
    made = engine.review(jobset_for(out, trainer.runtime()), config, "ml").result
    assert [p.path for p in AuditRecord.of(made).parts] == [
        "spec.replicatedJobs[node].template.spec"
    ]


def test_a_runtime_whose_template_asks_for_a_policy_opts_its_trainjobs_in():
    """A runtime's template annotations reach every JobSet made from it: an opt-in, so its
    TrainJobs are admitted as annotated ones, the defaults carried to the JobSet."""
    config = parse_config(AUDITED_NS)
    rt = trainer.runtime(annotations={P + "ignore-disruptions": "true"})
    verdict, out = trainer.mutate(trainer.trainjob(), GivenRuntimes([rt]), config)
    assert verdict.allowed, verdict.message
    assert carried(out) == {
        P + "defaults": '{"cluster":{"backoff-limit":"2","fail-non-retriable":"true"}}'
    }
    made = engine.review(jobset_for(out, rt), config, "ml").result
    assert managed(made) == "enforce" and AuditRecord.of(made).settings


@pytest.mark.parametrize("build", [rayjob, pytorchjob], ids=["RayJob", "PyTorchJob"])
def test_kinds_without_a_jobspec_get_the_settings_recorded(build):
    config = parse_config("defaults: {backoff-limit: 2}\nrollout: audit\n")
    obj = build()
    verdict, out = mutate(obj, config)
    assert verdict.allowed and out["spec"] == obj["spec"]
    assert managed(out) == "audit"
    assert AuditRecord.of(out) == AuditRecord({"backoff-limit": "2"}, {"backoff-limit": "cluster"})
    assert_idempotent(obj, config)


def test_rollout_md_shows_what_the_commands_print(tmp_path):
    """docs/ROLLOUT.md's config, and what check-config, kubectl (the warning) and explain
    print for a Job in its namespace team-b, unedited."""
    page = "docs/ROLLOUT.md"
    path = tmp_path / "config.yaml"
    path.write_text(doc_block("<!-- rollout-config -->", page))
    code, out, _ = run(["check-config", str(path)])
    assert code == 0 and out.endswith(doc_block("<!-- rollout-check-config -->", page))
    config = parse_config(path.read_text())
    verdict, _ = mutate(job(namespace="team-b"), config)
    (said,) = [w for w in verdict.warnings[: verdict.changed] if "audited" in w]
    assert doc_block("<!-- rollout-warning -->", page) == f"Change: {said}\n"
    text = explain.render_text([one(manifest(namespace="team-b"), config)])
    shown = doc_block("<!-- rollout-explain -->", page)
    assert shown in text


def test_a_default_enforcing_would_skip_is_said_under_audit_too():
    """Enforced, a default that conflicts with the spec is skipped with a warning (never a
    denial); audited, the same warning is said, so the admin learns it before enforcing."""
    # upstream: ValidateJobSpec (pkg/apis/batch/validation/validation.go) refuses a
    # podFailurePolicy beside podReplacementPolicy TerminatingOrFailed.
    obj = cronjob()
    obj["spec"]["jobTemplate"]["spec"]["podReplacementPolicy"] = "TerminatingOrFailed"
    config = parse_config(AUDITED_NS)
    verdict, out = mutate(obj, config)
    template = obj["spec"]["jobTemplate"]["spec"]
    assert verdict.allowed and out["spec"]["jobTemplate"]["spec"] == template
    (part,) = AuditRecord.of(out).parts  # backoff-limit still audited; no rule
    assert part.backoff_limit == 2 and part.rules == ()
    (said,) = [w for w in verdict.warnings if "skipped" in w]
    assert said.startswith("retry-policy: audit: enforced, fail-non-retriable")
    assert "podReplacementPolicy: TerminatingOrFailed" in said
    assert_idempotent(obj, config)
