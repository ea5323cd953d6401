"""The ``retry-policy.dev/audit`` record: one writer, one parser (``webhook.plan.audit``)."""

from __future__ import annotations

import orjson

from webhook.plan.audit import AUDIT, AuditedPart, AuditRecord, managed

RULE = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}


def _record() -> AuditRecord:
    return AuditRecord(
        {"retries": "3", "fail-non-retriable": "42"},
        {"retries": "cluster", "fail-non-retriable": "namespace"},
        (AuditedPart("spec", backoff_limit=3, rules=(RULE,)),),
    )


def _on(text: str) -> dict:
    return {"metadata": {"annotations": {AUDIT: text}}}


def test_the_record_reads_back_what_was_written():
    record = _record()
    again = AuditRecord.of(_on(record.to_annotation()))
    assert again == record
    assert again.part("spec").rules == (RULE,)
    assert again.part("spec.jobTemplate.spec") is None


def test_the_record_is_compact_json_with_sorted_keys_and_a_version():
    text = _record().to_annotation()
    assert " " not in text
    doc = orjson.loads(text)
    assert doc["v"] == 1 and doc["rev"] == 2
    assert list(doc) == sorted(doc)
    assert doc["parts"]["spec"] == {"backoffLimit": 3, "rules": [RULE]}


def test_a_record_this_version_cannot_read_is_none_not_a_guess():
    assert AuditRecord.of({}) is None
    assert AuditRecord.of(_on("{not json")) is None
    assert AuditRecord.of(_on('{"v":2,"settings":{},"by":{},"parts":{}}')) is None
    assert AuditRecord.of(_on('{"v":1,"settings":[],"by":{},"parts":{}}')) is None


def test_the_managed_label_is_enforce_audit_or_nothing():
    assert managed({"metadata": {"labels": {"retry-policy.dev/managed": "audit"}}}) == "audit"
    assert managed({"metadata": {"labels": {"retry-policy.dev/managed": "enforce"}}}) == "enforce"
    assert managed({"metadata": {"labels": {"retry-policy.dev/managed": "yes"}}}) is None
    assert managed({}) is None


def test_a_jobsets_audited_failure_policy_reads_back_and_an_older_record_says_it_has_none():
    policy = {"maxRestarts": 3, "rules": [{"name": "r", "action": "FailJobSet"}]}
    record = AuditRecord({"backoff-limit": "3"}, {"backoff-limit": "cluster"}, (), policy)
    again = AuditRecord.of(_on(record.to_annotation()))
    assert again == record and again.failure_policy == policy and again.revision == 2
    older = AuditRecord.of(_on('{"v":1,"settings":{},"by":{},"parts":{}}'))
    assert older.revision == 1 and older.failure_policy is None
