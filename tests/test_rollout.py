"""``rollout: audit``: the defaults held back and recorded (``retry-policy.dev/audit``),
what the workload's own annotations ask enforced, the ``retry-policy.dev/managed`` label,
and the config that says so (``webhook.kinds.audit``, ``webhook.policy.config``)."""

from __future__ import annotations

import pytest

from testkit.builders import P, job
from testkit.cli import run
from testkit.workloads import assert_idempotent, mutate, validate
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
